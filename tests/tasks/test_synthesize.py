"""`manage.py synthesize`: import, start, enqueue; with --wait the real agent loop, the real local
sandbox and the offline scripted model take each task to a finished, successful trajectory."""
from __future__ import annotations

import io
import json
import re
import socket
from pathlib import Path
from typing import Iterator

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django_q.models import OrmQ

from apps.engines.llm import reset_limiters
from apps.engines.models import SandboxRecord
from apps.engines.offline_model import running_offline_model
from apps.reviews.models import Review
from apps.tasks.models import Batch, Task, Trajectory, TrajectoryLog
from apps.tasks.services import ROLLOUT_JOB
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)

CODE_TASKS = Path(settings.BASE_DIR) / "examples" / "tasks" / "code_exec.jsonl"
PROVIDER_ENV_VARS = [f"{p}_{v}" for p in ("GEMINI", "DEEPSEEK", "OPENAI", "VLLM") for v in ("API_KEY", "BASE_URL", "MODEL")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def offline_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """No LLM configured (so the offline model is the one), on a free port, a private LLM cache."""
    for name in PROVIDER_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    url = f"http://127.0.0.1:{free_port()}/v1"
    cache = {"BACKEND": "apps.engines.llm.LLMResponseCache",
             "LOCATION": str(tmp_path / "llm-cache"), "TIMEOUT": None}
    with override_settings(LLM_BASE_URL="", LLM_API_KEY="", LLM_MODEL="", LLM_PROVIDERS="", LLM_MAX_RETRIES=1,
                           OFFLINE_MODEL_URL=url, CACHES={**settings.CACHES, "llm": cache}):
        reset_limiters()
        yield url
    reset_limiters()


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    """Two bundled code tasks, with their reference solutions (which the offline model replays)."""
    lines = [line for line in CODE_TASKS.read_text(encoding="utf-8").splitlines() if line.strip()][:2]
    path = tmp_path / "two-tasks.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def synthesize(*args: str) -> str:
    out = io.StringIO()
    call_command("synthesize", *args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings")
def test_wait_runs_every_task_to_a_successful_trajectory_with_the_real_loop(offline_only, task_file):
    output = synthesize("--tasks", str(task_file), "--batch", "e2e", "--wait", "--start-offline-model",
                        "--concurrency", "2")

    batch = Batch.objects.get(name="e2e")
    ids = [json.loads(line)["external_id"] for line in task_file.read_text().splitlines()]
    assert sorted(Task.objects.filter(batch=batch).values_list("external_id", flat=True)) == sorted(ids)
    assert set(Task.objects.filter(batch=batch).values_list("status", flat=True)) == {Task.Status.COMPLETED}
    for trajectory in Trajectory.objects.filter(task__batch=batch):
        assert (trajectory.status, trajectory.outcome, trajectory.reward) == ("finished", "success", 1.0)
        assert trajectory.model == "scripted-reference" and trajectory.total_tokens > 0
        roles = [m["role"] for m in trajectory.messages]
        assert roles[:2] == ["system", "user"] and "tool" in roles
        assert trajectory.steps and trajectory.tools and trajectory.verifier_output
        assert trajectory.content_sha256 == trajectory.compute_content_sha256()
        kinds = set(TrajectoryLog.objects.filter(trajectory=trajectory).values_list("kind", flat=True))
        assert {"system", "action", "output", "result"} <= kinds
    # every sandbox of this batch's runs destroyed (the PostgreSQL pass's shared database may hold others')
    assert SandboxRecord.objects.filter(trajectory__task__batch=batch).exists()
    assert not SandboxRecord.objects.filter(trajectory__task__batch=batch, state__in=SandboxRecord.LIVE).exists()

    assert "offline scripted model 'scripted-reference'" in output and "started in this process" in output
    assert "2/2 done | 0 running | 0 failed" in output
    assert f"Batch #{batch.pk} 'e2e': 2 task(s): 2 done, 0 failed" in output
    assert "trajectories: 2 (2 success, 0 failure, 0 error, 0 cancelled)" in output
    assert "mean reward:  1.000 (over 2 trajectories with a reward)" in output
    # Each iteration was reviewed in-process; the offline judge is labelled as the stand-in.
    assert "reviews:      2 scored, mean overall 100.0" in output and "proposals:    none" in output
    assert set(Review.objects.filter(trajectory__task__batch=batch).values_list("judge_model", flat=True)) == {
        "scripted-reference"}
    assert re.search(r"tokens: +[\d,]+ \(prompt [\d,]+, completion [\d,]+\)", output)
    assert re.search(r"wall time: +\d+\.\ds", output)
    assert f"/admin/tasks/batch/{batch.pk}/change/" in output


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings")
def test_wait_uses_an_offline_model_that_already_answers_and_once_resumes_the_same_batch(offline_only, task_file):
    port = int(offline_only.rsplit(":", 1)[1].split("/")[0])
    with running_offline_model([task_file], port=port):
        first = synthesize("--tasks", str(task_file), "--batch", "again", "--once", "--wait")
        second = synthesize("--tasks", str(task_file), "--batch", "again", "--once", "--wait")
    assert "started in this process" not in first
    assert Batch.objects.filter(name="again").count() == 1
    assert "already imported as batch" in second and "Started 0 of 2 task(s)" in second
    assert "2 task(s): 2 done, 0 failed" in second
    assert Trajectory.objects.filter(task__batch__name="again").count() == 2  # nothing ran twice


@pytest.mark.django_db
def test_without_a_configured_llm_or_a_running_offline_model_it_says_what_to_do(offline_only, task_file):
    with pytest.raises(CommandError) as excinfo:
        synthesize("--tasks", str(task_file))
    message = str(excinfo.value)
    assert f"does not answer at {offline_only}" in message and "make offline-model" in message
    assert "--start-offline-model" in message
    assert not Batch.objects.exists()  # checked before anything is imported


@pytest.mark.django_db
def test_without_wait_it_imports_starts_and_enqueues_for_the_workers(offline_only, task_file,
                                                                     django_capture_on_commit_callbacks):
    port = int(offline_only.rsplit(":", 1)[1].split("/")[0])
    with running_offline_model([task_file], port=port), django_capture_on_commit_callbacks(execute=True):
        output = synthesize("--tasks", str(task_file), "--scene", "code_exec")
    batch = Batch.objects.get()
    assert set(batch.tasks.values_list("status", flat=True)) == {Task.Status.RUNNING}
    assert set(Trajectory.objects.filter(task__batch=batch).values_list("status", flat=True)) == {"queued"}
    assert {row.task["func"] for row in OrmQ.objects.all()} == {ROLLOUT_JOB}
    assert "Rollout jobs enqueued" in output and f"/admin/tasks/batch/{batch.pk}/change/" in output


@pytest.mark.django_db
def test_an_invalid_file_is_reported_by_line_and_nothing_is_imported(offline_only, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"scene": "code_exec", "prompt": "ok"}\n{"scene": "nope", "prompt": "x"}\n')
    port = int(offline_only.rsplit(":", 1)[1].split("/")[0])
    with running_offline_model(port=port), pytest.raises(CommandError, match="1 error"):
        synthesize("--tasks", str(bad), "--wait")
    assert not Batch.objects.exists() and not Task.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("args, message", [
    (["--start-offline-model"], "--start-offline-model goes with --wait"),
    (["--concurrency", "4"], "--concurrency must be at least 1 and goes with --wait"),
    (["--wait", "--concurrency", "0"], "--concurrency must be at least 1"),
])
def test_option_combinations_that_cannot_work_are_refused(offline_only, task_file, args: list[str], message: str):
    with pytest.raises(CommandError, match=re.escape(message)):
        synthesize("--tasks", str(task_file), *args)
    assert not Batch.objects.exists()

