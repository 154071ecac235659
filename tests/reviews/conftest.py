"""Fixtures of the review tests: the offline model as agent and judge, tasks from the bundled set."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from apps.engines import llm
from apps.engines.llm import reset_limiters
from apps.engines.offline_model import OfflineModelServer, running_offline_model
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)

CODE_TASKS = Path(settings.BASE_DIR) / "examples" / "tasks" / "code_exec.jsonl"


def bundled_task(n: int = 0) -> dict[str, Any]:
    lines = [line for line in CODE_TASKS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(lines[n])


@pytest.fixture
def offline_model(tmp_path: Path) -> Iterator[OfflineModelServer]:
    """The offline scripted model on a free loopback port, as the only LLM (agent and judge)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cache = {"BACKEND": "apps.engines.llm.LLMResponseCache",
             "LOCATION": str(tmp_path / "llm-cache"), "TIMEOUT": None}
    with running_offline_model([CODE_TASKS], port=port) as server, override_settings(
            LLM_BASE_URL="", LLM_API_KEY="", LLM_MODEL="", LLM_PROVIDERS="", LLM_MAX_RETRIES=0,
            OFFLINE_MODEL_URL=server.url, CACHES={**settings.CACHES, "llm": cache}):
        reset_limiters()
        llm._llm_clients.clear()
        yield server
        llm._llm_clients.clear()
    reset_limiters()


@pytest.fixture
def bundled_code_task(make_task: Callable[..., Any]) -> Callable[..., Any]:
    """bundled_code_task(n=0, **fields): a task made from the n-th bundled code task."""
    def _make(n: int = 0, **fields: Any) -> Any:
        spec = bundled_task(n)
        fields.setdefault("external_id", spec["external_id"])
        return make_task(prompt=spec["prompt"], scene_config=spec["config"], **fields)

    return _make

