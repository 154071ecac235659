"""The audit log is append-only, and the task services write exactly one row per change."""
from __future__ import annotations

from typing import Any, Callable

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, models, transaction

from apps.tasks.models import Task
from apps.tasks.services import TransitionError, task_cancel, task_requeue
from trajplatform.audit import (
    ACTIONS,
    AUDIT_TABLE,
    AuditEvent,
    AuditEventError,
    append_only_triggers_installed,
    audit_events_for,
    audit_record,
)

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


def test_deleting_a_user_leaves_their_rows_as_written(event: AuditEvent, reviewer: Any) -> None:
    """The triggers refuse any UPDATE, so deleting a user must not touch the audit table."""
    username, user_id = reviewer.username, reviewer.pk
    reviewer.delete()
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.actor is None and stored.actor_id == user_id and stored.actor_repr == username
    assert AuditEvent.objects.select_related("actor").get(pk=event.pk).actor is None


# --- the database refuses too (migration 0004) ----------------------------------------------------


def _unchanged(event: AuditEvent) -> None:
    stored = models.QuerySet(AuditEvent).get(pk=event.pk)
    assert (stored.action, stored.actor_repr, stored.data) == ("tasks.task_create", event.actor_repr, {"n": 1})


def _refused_by_the_database(write: Callable[[], Any]) -> None:
    # A savepoint per attempt: on PostgreSQL a failed statement aborts the enclosing transaction.
    with pytest.raises(IntegrityError, match="append-only"):
        with transaction.atomic():
            write()


def test_the_triggers_are_installed_after_migrating() -> None:
    assert append_only_triggers_installed(connection)


def test_the_orm_refuses_upserts_and_bulk_updates(event: AuditEvent) -> None:
    twin = AuditEvent(pk=event.pk, actor_repr="mallory", action="tasks.task_cancel", data={})
    with pytest.raises(AuditEventError, match="append-only"):
        AuditEvent.objects.bulk_create([twin], update_conflicts=True, unique_fields=["id"],
                                       update_fields=["actor_repr", "action", "data"])
    with pytest.raises(AuditEventError, match="append-only"):
        AuditEvent.objects.bulk_create([twin], ignore_conflicts=True)
    with pytest.raises(AuditEventError, match="append-only"):
        AuditEvent.objects.bulk_update([twin], ["action"])
    with pytest.raises(AuditEventError, match="append-only"):
        AuditEvent._base_manager.filter(pk=event.pk).update(action="tasks.task_cancel")
    with pytest.raises(AuditEventError, match="append-only"):
        AuditEvent._base_manager.all().delete()
    _unchanged(event)


def test_the_database_refuses_an_upsert_over_an_existing_row(event: AuditEvent) -> None:
    twin = AuditEvent(pk=event.pk, actor_repr="mallory", action="tasks.task_cancel", data={})
    _refused_by_the_database(lambda: models.QuerySet(AuditEvent).bulk_create(
        [twin], update_conflicts=True, unique_fields=["id"], update_fields=["actor_repr", "action", "data"]))
    _unchanged(event)


def test_the_database_refuses_updates_and_deletes_past_the_orm(event: AuditEvent) -> None:
    plain = models.QuerySet(AuditEvent)  # a queryset without the model's refusals
    _refused_by_the_database(lambda: plain.filter(pk=event.pk).update(action="tasks.task_cancel"))
    _refused_by_the_database(lambda: plain.filter(pk=event.pk).delete())
    _refused_by_the_database(lambda: models.Model.delete(event))
    with connection.cursor() as cursor:
        _refused_by_the_database(lambda: cursor.execute(
            f"UPDATE {AUDIT_TABLE} SET action = %s, data = %s WHERE id = %s", ["tasks.task_cancel", "{}", event.pk]))
        _refused_by_the_database(lambda: cursor.execute(f"DELETE FROM {AUDIT_TABLE}"))
        if connection.vendor == "postgresql":
            _refused_by_the_database(lambda: cursor.execute(f"TRUNCATE {AUDIT_TABLE}"))
    _unchanged(event)


def test_rows_can_still_be_added(event: AuditEvent) -> None:
    audit_record("tasks.task_cancel", data={"n": 2})
    AuditEvent.objects.bulk_create([AuditEvent(actor_repr="system", action="tasks.task_requeue")])
    assert AuditEvent.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_flush_empties_the_table_and_leaves_it_guarded(make_task: Any, reviewer: Any) -> None:
    audit_record("tasks.task_create", actor=reviewer, target=make_task())
    call_command("flush", interactive=False, verbosity=0)
    assert not AuditEvent.objects.exists()
    assert append_only_triggers_installed(connection)
    event = audit_record("tasks.task_create")
    with connection.cursor() as cursor:
        _refused_by_the_database(lambda: cursor.execute(f"DELETE FROM {AUDIT_TABLE}"))
    assert AuditEvent.objects.filter(pk=event.pk).exists()


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


def test_requeue_writes_its_row_and_starts_the_next_iteration(make_task: Any, reviewer: Any) -> None:
    task = make_task(status=Task.Status.FAILED, error="sandbox lost")

    requeued = task_requeue(task=task, actor=reviewer)

    stored = Task.objects.get(pk=task.pk)
    # A re-queued task starts at once (it used to stay queued with nothing to run: issue 20.3).
    assert requeued.status == stored.status == Task.Status.RUNNING and stored.current_iteration == 1
    assert stored.error == "" and stored.queued_at is not None and stored.finished_at is None
    events = list(AuditEvent.objects.order_by("pk"))
    assert [(e.action, e.data["from"]) for e in events] == [("tasks.task_requeue", "failed"),
                                                             ("tasks.iteration_start", "queued")]


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
