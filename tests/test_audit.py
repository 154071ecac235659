"""The audit log is append-only, and the task services write exactly one row per change."""
from __future__ import annotations

from typing import Any

import pytest

from apps.tasks.models import Task
from apps.tasks.services import TransitionError, task_cancel, task_requeue
from trajplatform.audit import ACTIONS, AuditEvent, AuditEventError, audit_events_for, audit_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(make_task: Any, reviewer: Any) -> AuditEvent:
    return audit_record("tasks.task_create", actor=reviewer, target=make_task(), data={"n": 1})


def test_an_existing_row_cannot_be_saved_again(event: AuditEvent) -> None:
    event.action = "tasks.task_cancel"
    with pytest.raises(AuditEventError):
        event.save()
    assert AuditEvent.objects.get(pk=event.pk).action == "tasks.task_create"


def test_a_row_cannot_be_deleted(event: AuditEvent) -> None:
    with pytest.raises(AuditEventError):
        event.delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_querysets_cannot_update_or_delete(event: AuditEvent) -> None:
    with pytest.raises(AuditEventError):
        AuditEvent.objects.filter(pk=event.pk).update(action="tasks.task_cancel")
    with pytest.raises(AuditEventError):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.get(pk=event.pk).action == "tasks.task_create"


def test_an_unregistered_action_raises_and_writes_nothing(make_task: Any) -> None:
    assert "tasks.task_explode" not in ACTIONS
    with pytest.raises(AuditEventError, match="unregistered audit action"):
        audit_record("tasks.task_explode", target=make_task())
    assert not AuditEvent.objects.exists()


def test_audit_record_fills_actor_and_target_fields(event: AuditEvent, reviewer: Any) -> None:
    stored = AuditEvent.objects.get(pk=event.pk)
    task = Task.objects.get()
    assert stored.actor == reviewer
    assert stored.actor_repr == reviewer.username
    assert (stored.target_type, stored.target_id, stored.target_repr) == ("tasks.task", str(task.pk), str(task))
    assert stored.data == {"n": 1}
    assert stored.created_at is not None
    assert list(audit_events_for(task)) == [stored]


def test_without_an_actor_the_row_says_system() -> None:
    stored = audit_record("tasks.batch_import")
    assert (stored.actor, stored.actor_repr, stored.target_type, stored.target_id) == (None, "system", "", "")


def test_actor_repr_survives_the_user_being_deleted(event: AuditEvent, reviewer: Any) -> None:
    username = reviewer.username
    reviewer.delete()
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.actor is None and stored.actor_repr == username


# --- task services --------------------------------------------------------------------------------


def test_cancel_writes_one_row_and_a_repeat_writes_none(make_task: Any, reviewer: Any) -> None:
    task = make_task(status=Task.Status.RUNNING)

    cancelled = task_cancel(task=task, actor=reviewer, reason="wrong prompt")

    assert cancelled.status == Task.Status.CANCELLED and cancelled.cancel_requested
    assert cancelled.finished_at is not None
    events = list(AuditEvent.objects.filter(action="tasks.task_cancel"))
    assert len(events) == 1
    assert (events[0].actor, events[0].target_id) == (reviewer, str(task.pk))
    assert events[0].data == {"from": "running", "reason": "wrong prompt"}

    again = task_cancel(task=task, actor=reviewer)
    assert again.status == Task.Status.CANCELLED
    assert AuditEvent.objects.count() == 1


def test_requeue_writes_one_row(make_task: Any, reviewer: Any) -> None:
    task = make_task(status=Task.Status.FAILED, error="sandbox lost")

    requeued = task_requeue(task=task, actor=reviewer)

    stored = Task.objects.get(pk=task.pk)
    assert requeued.status == stored.status == Task.Status.QUEUED
    assert stored.error == "" and stored.queued_at is not None and stored.finished_at is None
    events = list(AuditEvent.objects.all())
    assert [(e.action, e.data["from"]) for e in events] == [("tasks.task_requeue", "failed")]


@pytest.mark.parametrize("status", [Task.Status.COMPLETED, Task.Status.FAILED])
def test_a_finished_task_cannot_be_cancelled(make_task: Any, reviewer: Any, status: str) -> None:
    task = make_task(status=status)
    with pytest.raises(TransitionError):
        task_cancel(task=task, actor=reviewer)
    assert Task.objects.get(pk=task.pk).status == status
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    "status", [Task.Status.QUEUED, Task.Status.RUNNING, Task.Status.REVIEWING, Task.Status.COMPLETED]
)
def test_only_failed_or_cancelled_tasks_can_be_requeued(make_task: Any, reviewer: Any, status: str) -> None:
    task = make_task(status=status)
    with pytest.raises(TransitionError):
        task_requeue(task=task, actor=reviewer)
    assert Task.objects.get(pk=task.pk).status == status
    assert not AuditEvent.objects.exists()


def test_a_failing_service_leaves_no_partial_row(make_task: Any, reviewer: Any, monkeypatch: Any) -> None:
    """The audit row and the status change commit together or not at all."""
    import apps.tasks.services as services

    def broken(*args: Any, **kwargs: Any) -> None:
        raise AuditEventError("disk full")

    monkeypatch.setattr(services, "audit_record", broken)
    task = make_task()
    with pytest.raises(AuditEventError):
        task_cancel(task=task, actor=reviewer)
    assert Task.objects.get(pk=task.pk).status == Task.Status.QUEUED
