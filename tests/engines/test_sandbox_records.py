"""SandboxRecord bookkeeping, the reconciler job, its schedule, the warm pool and the console action."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from apps.engines import jobs
from apps.engines.models import SandboxRecord
from apps.engines import sandbox_records as records
from apps.engines.sandbox_records import fill_pool
from apps.engines.sandboxes import (
    MANAGED_LABEL,
    RECORD_LABEL,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxReporter,
    SandboxSpec,
    acquire,
    set_reporter,
)
from apps.engines.sandboxes.local import LocalBackend
from apps.tasks.models import Trajectory
from tests.conftest import PASSWORD
from trajplatform.audit import AuditEvent, audit_events_for

pytestmark = pytest.mark.usefixtures("sandbox_settings")


def _listed(backend: Any) -> set[str]:
    return {info.id for info in backend.list()}


def _reap_events(record: SandboxRecord) -> list[AuditEvent]:
    return list(audit_events_for(record).filter(action="engines.sandbox_reap"))


class _Recorder(SandboxReporter):
    """A reporter that remembers what the sandbox layer told it (the layer imports no model)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def begin(self, *, backend: str, spec: SandboxSpec, trajectory: Any, pool_key: str) -> int:
        self.events.append(("begin", backend))
        return 7

    def ready(self, *, record_id: int, sandbox: Any, pooled: bool) -> None:
        self.events.append(("ready", record_id))

    def failed(self, *, record_id: int, error: str) -> None:
        self.events.append(("failed", record_id))

    def destroyed(self, *, backend: str, external_id: str, reason: str) -> None:
        self.events.append(("destroyed", reason))

    def error(self, *, backend: str, external_id: str, error: str) -> None:
        self.events.append(("error", error))

    def claim(self, backend: Any, spec: SandboxSpec, trajectory: Any) -> Any:
        self.events.append(("claim", trajectory))
        return None


class _Held(Sandbox):
    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _write_file(self, path: str, data: bytes, mode: int) -> None:
        raise NotImplementedError

    def _read_file(self, path: str, max_bytes: int | None) -> bytes:
        raise NotImplementedError


class _InMemory(SandboxBackend):
    """A backend whose sandboxes are entries of a dict (the reporter calls are what is tested)."""

    name = "memory"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.live: dict[str, Sandbox] = {}

    def _create(self, spec: SandboxSpec, labels: dict[str, str]) -> Sandbox:
        sandbox = _Held(self, f"m{len(self.live)}", spec, labels)
        self.live[sandbox.id] = sandbox
        return sandbox

    def _get(self, sandbox_id: str) -> Sandbox:
        return self.live[sandbox_id]

    def _list(self, labels: dict[str, str]) -> list[Any]:
        return []

    def _destroy(self, sandbox_id: str) -> bool:
        return self.live.pop(sandbox_id, None) is not None


def test_the_sandbox_layer_reports_to_the_installed_reporter_and_refuses_to_create_without_one() -> None:
    recorder = _Recorder()
    backend = _InMemory()
    previous = set_reporter(recorder)
    try:
        sandbox = acquire(SandboxSpec(), trajectory=None, backend=backend)
        assert sandbox.record_id == 7 and sandbox.labels[RECORD_LABEL] == "7"
        sandbox.destroy()
        assert recorder.events == [("claim", None), ("begin", "memory"), ("ready", 7), ("destroyed", "destroyed")]

        set_reporter(None)
        with pytest.raises(SandboxError, match="no sandbox reporter is installed"):
            backend.create(SandboxSpec())
        assert backend.live == {}  # nothing was created unrecorded
        assert _InMemory(records=False).create(SandboxSpec()).record_id is None  # records=False asks no reporter
    finally:
        set_reporter(previous)
    assert isinstance(previous, records.RecordsReporter)  # EnginesConfig.ready installed the row writer


def test_the_reconciler_destroys_sandboxes_past_their_ttl_once(local_backend: Any) -> None:
    expired = local_backend.create(SandboxSpec(ttl=600))
    fresh = local_backend.create(SandboxSpec(ttl=600))
    SandboxRecord.objects.filter(external_id=expired.id).update(expires_at=timezone.now() - timedelta(seconds=1))

    first = jobs.reconcile_sandboxes()
    second = jobs.reconcile_sandboxes()  # double delivery

    record = SandboxRecord.objects.get(external_id=expired.id)
    assert (first["expired"], second["expired"]) == (1, 0)
    assert record.state == SandboxRecord.State.DESTROYED and record.destroy_reason == "ttl passed"
    assert len(_reap_events(record)) == 1
    assert _reap_events(record)[0].data["reason"] == "ttl passed"
    assert expired.id not in _listed(local_backend) and fresh.id in _listed(local_backend)
    assert SandboxRecord.objects.get(external_id=fresh.id).state == SandboxRecord.State.READY
    fresh.destroy()


def test_the_reconciler_destroys_sandboxes_whose_trajectory_finished(local_backend: Any, make_task: Any) -> None:
    task = make_task()
    running = Trajectory.objects.create(task=task, iteration=1, status=Trajectory.Status.RUNNING)
    finished = Trajectory.objects.create(task=task, iteration=1, sample_index=1, status=Trajectory.Status.RUNNING)
    kept = local_backend.create(SandboxSpec(), trajectory=running)
    leaked = local_backend.create(SandboxSpec(), trajectory=finished)
    # The worker crashed without destroying its sandbox; the trajectory was then closed.
    Trajectory.objects.filter(pk=finished.pk).update(
        status=Trajectory.Status.FINISHED, outcome=Trajectory.Outcome.ERROR, outcome_reason="worker lost")

    report = jobs.reconcile_sandboxes()

    assert report["owner_finished"] == 1
    record = SandboxRecord.objects.get(external_id=leaked.id)
    assert record.state == SandboxRecord.State.DESTROYED and "is finished" in record.destroy_reason
    assert record.trajectory_id == finished.pk and running.sandboxes.get().external_id == kept.id
    assert _listed(local_backend) >= {kept.id} and leaked.id not in _listed(local_backend)
    kept.destroy()


def test_the_reconciler_destroys_platform_sandboxes_no_row_owns(local_backend: Any) -> None:
    # A worker created the sandbox but its row never committed (crash inside a transaction).
    unrecorded = LocalBackend(records=False).create(SandboxSpec())
    foreign = LocalBackend(records=False)  # not ours: a sandbox without the managed label
    assert unrecorded.labels[MANAGED_LABEL] == "true"

    too_young = jobs.reconcile_sandboxes()
    later = records.reconcile_sandboxes(now=timezone.now() + records.ORPHAN_GRACE + timedelta(minutes=1))

    assert too_young["orphaned"] == 0  # its row may still be in an open transaction
    assert later.orphaned == 1
    assert unrecorded.id not in _listed(local_backend)
    record = SandboxRecord.objects.get(external_id=unrecorded.id)
    assert record.state == SandboxRecord.State.DESTROYED and record.destroy_reason.startswith("orphan")
    assert len(_reap_events(record)) == 1
    assert foreign.list() == []


def test_rows_whose_sandbox_vanished_are_closed(local_backend: Any) -> None:
    sandbox = local_backend.create(SandboxSpec())
    local_backend._destroy(sandbox.id)  # gone behind the platform's back (host wiped, server expiry)

    report = jobs.reconcile_sandboxes()

    assert report["vanished"] == 1
    record = SandboxRecord.objects.get(external_id=sandbox.id)
    assert record.state == SandboxRecord.State.DESTROYED and record.destroy_reason == "vanished from the backend"


def test_rows_stuck_in_creating_are_failed_and_their_sandbox_destroyed(local_backend: Any) -> None:
    # The worker died between asking the backend and recording the answer.
    record = records.record_begin(backend="local", spec=SandboxSpec())
    half_made = LocalBackend(records=False)._create(SandboxSpec(), {MANAGED_LABEL: "true", RECORD_LABEL: str(record.pk)})
    SandboxRecord.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(hours=1))

    report = jobs.reconcile_sandboxes()

    record.refresh_from_db()
    assert report["stuck_creating"] == 1
    assert record.state == SandboxRecord.State.FAILED and record.external_id == half_made.id
    assert half_made.id not in _listed(local_backend)
    assert len(_reap_events(record)) == 1
    with pytest.raises(Exception, match="no longer 'creating'"):
        records.record_ready(record_id=record.pk, sandbox=half_made)


def test_schedule_registration_is_idempotent(db: Any) -> None:
    first = jobs.ensure_sandbox_schedules()
    Schedule.objects.filter(pk=first.pk).update(minutes=30, func="somewhere.else")
    Schedule.objects.create(name=jobs.RECONCILE_SCHEDULE_NAME, func="dup", schedule_type=Schedule.MINUTES, minutes=1)

    second = jobs.ensure_sandbox_schedules()

    schedules = Schedule.objects.filter(name=jobs.RECONCILE_SCHEDULE_NAME)
    assert [s.pk for s in schedules] == [first.pk] == [second.pk]
    only = schedules.get()
    assert (only.func, only.schedule_type, only.minutes, only.repeats) == (
        "apps.engines.jobs.reconcile_sandboxes", Schedule.MINUTES, jobs.RECONCILE_EVERY_MINUTES, -1)


def test_the_warm_pool_hands_out_ready_sandboxes_and_refills(local_backend: Any, settings: Any, make_task: Any) -> None:
    settings.SANDBOX_POOL_SIZE = 2
    assert fill_pool(local_backend) == {"created": 2, "trimmed": 0, "size": 2}
    pooled = set(SandboxRecord.objects.filter(state=SandboxRecord.State.POOLED).values_list("external_id", flat=True))
    trajectory = Trajectory.objects.create(task=make_task(), iteration=1)

    sandbox = acquire(SandboxSpec(labels={"task": "t7"}, env={"X": "1"}), trajectory=trajectory, backend=local_backend)
    other = acquire(SandboxSpec(), backend=local_backend)
    different_shape = acquire(SandboxSpec(memory_mb=300), backend=local_backend)

    assert {sandbox.id, other.id} == pooled  # two claims, two different sandboxes
    assert different_shape.id not in pooled
    record = SandboxRecord.objects.get(external_id=sandbox.id)
    assert record.state == SandboxRecord.State.READY and record.trajectory_id == trajectory.pk
    assert record.claimed_at is not None and record.labels["task"] == "t7"
    assert {"task": "t7", MANAGED_LABEL: "true"}.items() <= local_backend.get(sandbox.id).labels.items()
    assert sandbox.run("echo $X", timeout=30).stdout == "1\n"
    assert fill_pool(local_backend)["created"] == 2
    settings.SANDBOX_POOL_SIZE = 0
    assert fill_pool(local_backend)["trimmed"] == 2
    assert not SandboxRecord.objects.filter(state=SandboxRecord.State.POOLED).exists()
    for handle in (sandbox, other, different_shape):
        handle.destroy()


def test_admin_action_destroys_through_the_service_and_audits(client: Any, local_backend: Any, admin_user_role: Any,
                                                              reviewer: Any) -> None:
    sandbox = local_backend.create(SandboxSpec())
    record = SandboxRecord.objects.get(external_id=sandbox.id)
    url = reverse("admin:engines_sandboxrecord_changelist")
    payload = {"action": "destroy_selected_sandboxes", "_selected_action": [record.pk]}

    client.login(username=reviewer.username, password=PASSWORD)
    assert client.get(url).status_code == 200  # reviewers may look
    client.post(url, payload)
    assert SandboxRecord.objects.get(pk=record.pk).state == SandboxRecord.State.READY  # but not destroy

    client.login(username=admin_user_role.username, password=PASSWORD)
    response = client.post(url, payload, follow=True)

    record.refresh_from_db()
    assert "Destroyed 1" in response.content.decode()
    assert record.state == SandboxRecord.State.DESTROYED
    assert sandbox.id not in _listed(local_backend)
    event = audit_events_for(record).get(action="engines.sandbox_destroy")
    assert event.actor == admin_user_role and event.data["external_id"] == sandbox.id
    change = client.get(reverse("admin:engines_sandboxrecord_change", args=[record.pk]))
    assert change.status_code == 200 and b'name="state"' not in change.content  # read-only
