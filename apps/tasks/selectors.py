"""Reads of tasks, batches and trajectories shared by the admin, the API, commands and replays."""
from __future__ import annotations

from typing import Any

from django.db.models import Count

from apps.tasks.models import Batch, Task, Trajectory


def batch_status_counts(batch: Batch) -> dict[str, int]:
    """Task count per status for one batch, every status present (0 when none)."""
    counts = dict.fromkeys(Task.Status.values, 0)
    rows = Task.objects.filter(batch=batch).order_by().values_list("status").annotate(n=Count("id"))
    for status, n in rows:
        counts[status] = n
    return counts


def batch_imported_from(*, name: str, source_sha256: str) -> Batch | None:
    """The earliest batch of this name imported from a file with this content, if any."""
    return Batch.objects.filter(name=name, source_sha256=source_sha256).order_by("id").first()


def trajectory_replay_record(trajectory_uuid: str) -> dict[str, Any] | None:
    """A stored trajectory's steps and verifier output by UUID, or None: what a replay of its
    recorded tool and web responses reads (installed as the MCP records' reader)."""
    return Trajectory.objects.filter(uuid=trajectory_uuid).values("steps", "verifier_output").first()
