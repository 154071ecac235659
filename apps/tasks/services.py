"""Writes to tasks, batches and trajectories. Every change is one transaction with its audit row."""
from __future__ import annotations

from collections import Counter
from itertools import islice
from typing import Any, Iterable

from django.db import transaction
from django.utils import timezone

from apps.tasks.models import Batch, Task
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


IMPORT_CHUNK_SIZE = 2000


def batch_import(
    *,
    rows: Iterable[dict[str, Any]],
    name: str,
    source_name: str,
    source_sha256: str,
    source_format: str,
    actor: Any,
) -> Batch:
    """Create a batch and its tasks (queued) from validated task field dicts, all or nothing.

    `rows` may be a generator (a file being read); it is consumed in chunks inside the one
    transaction, so an exception from it (or an empty input) leaves nothing written. One
    audit row for the batch, with counts; no per-task rows.
    """
    user = actor if getattr(actor, "is_authenticated", False) else None
    with transaction.atomic():
        batch = Batch.objects.create(
            name=name[:200],
            created_by=user,
            source_name=source_name[:300],
            source_sha256=source_sha256,
            source_format=source_format[:40],
        )
        now = timezone.now()
        by_scene: Counter[str] = Counter()
        iterator = iter(rows)
        while chunk := list(islice(iterator, IMPORT_CHUNK_SIZE)):
            tasks = [
                Task(batch=batch, created_by=user, status=Task.Status.QUEUED, queued_at=now, **fields)
                for fields in chunk
            ]
            Task.objects.bulk_create(tasks, batch_size=IMPORT_CHUNK_SIZE)
            by_scene.update(t.scene for t in tasks)
        total = sum(by_scene.values())
        if total == 0:
            raise ValueError("no tasks to import")
        batch.task_count = total
        batch.save(update_fields=["task_count"])
        audit_record(
            "tasks.batch_import",
            actor=actor,
            target=batch,
            data={
                "task_count": total,
                "by_scene": dict(sorted(by_scene.items())),
                "source_name": batch.source_name,
                "source_sha256": source_sha256,
                "source_format": batch.source_format,
            },
        )
    return batch


def trajectory_group_name(trajectory_id: int) -> str:
    """The channels group that live-log lines of one trajectory are sent to."""
    return f"trajectory-{trajectory_id}"


def trajectory_log_append(
    *, trajectory_id: int, lines: list[tuple[str, str, dict[str, Any]]]
) -> list["TrajectoryLog"]:
    """Append (kind, message, data) lines with the next sequence numbers; broadcast after commit.

    The websocket message is {"type": "log.lines", "trajectory": id, "lines": [line.as_message()]}.
    """
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from apps.tasks.models import Trajectory, TrajectoryLog
    from trajplatform.redaction import redact

    if not lines:
        return []
    with transaction.atomic():
        # Lock the trajectory row: the per-trajectory sequence must not fork under two writers.
        Trajectory.objects.select_for_update().only("id").get(pk=trajectory_id)
        last = TrajectoryLog.objects.filter(trajectory_id=trajectory_id).order_by("-seq").values_list("seq", flat=True).first() or 0
        rows = [
            TrajectoryLog(trajectory_id=trajectory_id, seq=last + i, kind=kind, message=redact(message), data=redact(data))
            for i, (kind, message, data) in enumerate(lines, start=1)
        ]
        created = TrajectoryLog.objects.bulk_create(rows)
        payload = {"type": "log.lines", "trajectory": trajectory_id, "lines": [r.as_message() for r in created]}

        def broadcast() -> None:
            layer = get_channel_layer()
            if layer is not None:
                async_to_sync(layer.group_send)(trajectory_group_name(trajectory_id), payload)

        transaction.on_commit(broadcast)
    return created
