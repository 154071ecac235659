"""Writes to tasks, batches and trajectories. Every change is one transaction with its audit row."""
from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.tasks.models import Task
from trajplatform.audit import audit_record


class TransitionError(Exception):
    """A status change that the object's current status does not allow."""


def task_cancel(*, task: Task, actor: Any, reason: str = "") -> Task:
    """Cancel a task that has not finished; its running trajectory stops at the next step."""
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.status == Task.Status.CANCELLED:
            return task  # repeat click: no-op, no audit row
        if task.status in Task.FINAL:
            raise TransitionError(f"task {task.pk} is {task.status} and cannot be cancelled")
        previous = task.status
        task.status = Task.Status.CANCELLED
        task.cancel_requested = True
        task.finished_at = timezone.now()
        task.save(update_fields=["status", "cancel_requested", "finished_at", "updated_at"])
        audit_record("tasks.task_cancel", actor=actor, target=task, data={"from": previous, "reason": reason})
    return task


def task_requeue(*, task: Task, actor: Any, reason: str = "") -> Task:
    """Queue a failed or cancelled task again from its current config."""
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.status not in (Task.Status.FAILED, Task.Status.CANCELLED):
            raise TransitionError(f"task {task.pk} is {task.status}; only failed or cancelled tasks can be re-queued")
        previous = task.status
        task.status = Task.Status.QUEUED
        task.cancel_requested = False
        task.error = ""
        task.queued_at = timezone.now()
        task.finished_at = None
        task.save(update_fields=["status", "cancel_requested", "error", "queued_at", "finished_at", "updated_at"])
        audit_record("tasks.task_requeue", actor=actor, target=task, data={"from": previous, "reason": reason})
    return task
