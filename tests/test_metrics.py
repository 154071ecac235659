"""/metrics through prometheus-client: the metrics of issue 29 read from the database."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from tests.api.test_health_metrics import parse_prometheus

pytestmark = pytest.mark.django_db


def test_metrics_cover_workers_providers_sandboxes_exports_and_spend(client: Any, make_task: Any) -> None:
    from apps.engines.models import SandboxRecord
    from apps.tasks.models import Trajectory

    now = timezone.now()
    task = make_task(status="running", current_iteration=1)
    for i, worker in enumerate(["machine-a:10:t1", "machine-a:11:t2", "machine-b:7:t3"]):
        Trajectory.objects.create(task=task, iteration=1, sample_index=i, status="running", worker=worker)
    Trajectory.objects.create(task=task, iteration=1, sample_index=3, status="queued", queued_at=now - timedelta(seconds=1))
    Trajectory.objects.create(task=task, iteration=1, sample_index=4, status="queued", queued_at=now + timedelta(seconds=60))
    call = {"latency_ms": 300, "attempts": 3, "cached": False, "provider": "deepseek", "model": "m", "usage": {}}
    other = {**call, "latency_ms": 100, "attempts": 1, "provider": "offline"}
    Trajectory.objects.create(task=task, iteration=1, sample_index=5, status="finished", outcome="success",
                              finished_at=now, cost_usd=Decimal("0.25"), steps=[{"llm": call}, {"llm": other}])
    # sandbox rows another test's leftover thread may still write count too: measure from here
    before = parse_prometheus(client.get("/metrics").content.decode())

    def base(name: str, **labels: str) -> float:
        return before.get((name, frozenset(labels.items())), 0.0)

    SandboxRecord.objects.create(backend="local", state="ready")
    SandboxRecord.objects.create(backend="local", state="destroyed", last_error="bwrap: failed")
    SandboxRecord.objects.create(backend="local", state="ready", claimed_at=now)

    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = parse_prometheus(response.content.decode())

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset(labels.items()))]

    assert value("trajplatform_rollouts_in_flight", worker="machine-a") == 2
    assert value("trajplatform_rollouts_in_flight", worker="machine-b") == 1
    assert value("trajplatform_trajectories_queued", state="due") == 1
    assert value("trajplatform_trajectories_queued", state="waiting") == 1
    assert value("trajplatform_llm_provider_latency_seconds_count", provider="deepseek") == 1
    assert value("trajplatform_llm_provider_latency_seconds", provider="deepseek", quantile="0.5") == pytest.approx(0.3)
    assert value("trajplatform_llm_retries", provider="deepseek") == 2
    assert value("trajplatform_llm_retries", provider="offline") == 0
    assert value("trajplatform_sandbox_creates", backend="local") - base("trajplatform_sandbox_creates", backend="local") == 3
    assert value("trajplatform_sandbox_failures", backend="local") - base("trajplatform_sandbox_failures", backend="local") == 1
    assert value("trajplatform_sandbox_pool_hits", backend="local") - base("trajplatform_sandbox_pool_hits", backend="local") == 1
    assert value("trajplatform_sandboxes_alive", backend="local") - base("trajplatform_sandboxes_alive", backend="local") == 2
    assert value("trajplatform_exports", status="queued") == 0
    assert value("trajplatform_llm_spend_usd", scope="all") == pytest.approx(0.25)
    assert value("trajplatform_llm_spend_usd", scope="window") == pytest.approx(0.25)


def test_metrics_are_written_by_prometheus_client(client: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f.type for f in text_string_to_metric_families(client.get("/metrics").content.decode())}
    assert families["trajplatform_llm_latency_seconds"] == "summary"
    assert families["trajplatform_rollouts_in_flight"] == "gauge"
