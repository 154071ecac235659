"""/health reports each part honestly (503 when one is down); /metrics is valid Prometheus text."""
from __future__ import annotations

import math
import re
import socket
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from trajplatform import health

pytestmark = pytest.mark.django_db


@pytest.fixture
def workers_alive() -> None:
    """Periodic schedules due in the future: a cluster has been running them."""
    from django_q.models import Schedule

    from trajplatform.webhooks import ensure_webhook_schedule

    ensure_webhook_schedule()
    Schedule.objects.update(next_run=timezone.now() + timedelta(minutes=1))


@pytest.fixture
def llm_up(settings: Any, receiver: Any) -> Any:
    settings.LLM_PROVIDERS = ""
    settings.LLM_BASE_URL = receiver.url + "/v1"
    settings.LLM_API_KEY = "sk-test-health-key-1234567890"
    return receiver


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_everything_up_is_200_ok(client: Any, workers_alive: None, llm_up: Any) -> None:
    response = client.get("/health")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok" and body["down"] == []
    assert set(body["checks"]) == {"database", "queue", "sandbox", "llm"}
    assert body["checks"]["llm"]["mode"] == "live"
    request = llm_up.requests[-1]
    assert request["method"] == "GET" and request["path"] == "/v1/models"
    assert "sk-test-health-key-1234567890" not in response.content.decode()


def test_an_unreachable_llm_is_503(client: Any, workers_alive: None, settings: Any) -> None:
    settings.LLM_PROVIDERS = ""
    settings.LLM_BASE_URL = f"http://127.0.0.1:{_closed_port()}/v1"
    response = client.get("/health")
    body = response.json()
    assert response.status_code == 503 and body["status"] == "down" and body["down"] == ["llm"]
    assert "Connect" in body["checks"]["llm"]["detail"]


def test_the_offline_model_is_reported_as_a_stand_in(client: Any, workers_alive: None, settings: Any, receiver: Any) -> None:
    settings.LLM_PROVIDERS = settings.LLM_BASE_URL = settings.LLM_API_KEY = settings.LLM_MODEL = ""
    settings.OFFLINE_MODEL_URL = receiver.url + "/v1"
    llm = client.get("/health").json()["checks"]["llm"]
    assert llm["status"] == "ok" and llm["provider"] == "offline" and "stand-in" in llm["mode"]


def test_no_worker_cluster_is_503(client: Any, llm_up: Any) -> None:
    from django_q.models import Schedule

    from trajplatform.webhooks import ensure_webhook_schedule

    ensure_webhook_schedule()
    Schedule.objects.update(next_run=timezone.now() - timedelta(hours=1))
    response = client.get("/health")
    body = response.json()
    assert response.status_code == 503 and "queue" in body["down"]
    assert "no worker cluster" in body["checks"]["queue"]["detail"]


def test_an_unconfigured_sandbox_backend_is_503(client: Any, workers_alive: None, llm_up: Any, settings: Any) -> None:
    settings.SANDBOX_BACKEND = "opensandbox"
    settings.OPENSANDBOX_URL = ""
    body = client.get("/health").json()
    assert body["down"] == ["sandbox"] and "OPENSANDBOX_URL" in body["checks"]["sandbox"]["detail"]


def test_a_failing_database_check_is_reported_not_raised(
    client: Any, workers_alive: None, llm_up: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    def down() -> dict[str, Any]:
        raise OperationalError("could not connect to server")

    monkeypatch.setitem(health.CHECKS, "database", down)
    response = client.get("/health")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == {
        "status": "down", "detail": "OperationalError: could not connect to server",
        "duration_ms": response.json()["checks"]["database"]["duration_ms"],
    }


# --- metrics ----------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')


def parse_prometheus(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A strict reader of the text exposition format: every line is HELP, TYPE or a sample."""
    assert text.endswith("\n")
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "summary", "histogram", "untyped")
            types[name] = kind
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        base = re.sub(r"_(sum|count)$", "", name)
        assert name in types or base in types, f"{name} has no TYPE line"
        pairs = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
        samples[(name, pairs)] = float(value)
    return samples


def test_metrics_parse_and_count(client: Any, make_task: Any) -> None:
    from apps.engines.models import SandboxRecord
    from apps.tasks.models import Trajectory

    task = make_task()
    now = timezone.now()
    llm_a = {"latency_ms": 200, "attempts": 1, "cached": False, "provider": "offline", "model": "m", "usage": {},
             "finish_reason": "tool_calls"}
    llm_b = {**llm_a, "latency_ms": 400}
    Trajectory.objects.create(task=task, iteration=1, sample_index=0, status="finished", outcome="success",
                              finished_at=now, steps=[{"llm": llm_a}, {"llm": llm_a}, {"llm": llm_b}])
    Trajectory.objects.create(task=task, iteration=1, sample_index=1, status="finished", outcome="error",
                              outcome_reason="LLM error: LLMUnavailable: 503", finished_at=now, steps=[])
    Trajectory.objects.create(task=task, iteration=1, sample_index=2, status="queued")
    SandboxRecord.objects.create(backend="local", state="ready")
    SandboxRecord.objects.create(backend="local", state="destroyed")

    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = parse_prometheus(response.content.decode())

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset(labels.items()))]

    assert value("trajplatform_trajectories", status="finished") == 2
    assert value("trajplatform_trajectories", status="queued") == 1
    assert value("trajplatform_trajectories_finished", outcome="error") == 1
    assert value("trajplatform_steps_per_second") == pytest.approx(3 / health.METRICS_WINDOW_S)
    assert value("trajplatform_llm_latency_seconds_count") == 2  # two distinct model calls
    assert value("trajplatform_llm_latency_seconds_sum") == pytest.approx(0.6)
    assert value("trajplatform_llm_latency_seconds", quantile="0.5") == pytest.approx(0.2)
    assert value("trajplatform_llm_errors") == 1
    assert value("trajplatform_sandboxes_alive", backend="local") == 1
    assert value("trajplatform_queue_depth") >= 0
    assert value("trajplatform_tasks", status="queued") == 1


def test_metrics_with_no_data_are_still_valid(client: Any) -> None:
    samples = parse_prometheus(client.get("/metrics").content.decode())
    assert math.isnan(samples[("trajplatform_llm_latency_seconds", frozenset({("quantile", "0.9")}))])
    assert samples[("trajplatform_steps_per_second", frozenset())] == 0
