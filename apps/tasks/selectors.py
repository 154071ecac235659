"""Reads of tasks and batches shared by the admin, the API and commands."""
from __future__ import annotations

from django.db.models import Count

from apps.tasks.models import Batch, Task


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
