"""Reads of tasks, batches and trajectories shared by the admin, the API, commands and replays."""
from __future__ import annotations

from typing import Any

from django.db.models import Count, Q

from apps.tasks.models import Batch, Task, Trajectory

NOT_STARTED = Q(status=Task.Status.QUEUED, current_iteration=0)
# The task states the console counts, in the order work moves through them: (key, label, hint, filter).
# A task imported and never started is "not started", not "queued" (its status is queued). The one
# definition: the batch pages, their live line (services.batch_progress_message), the overview, the admin.
TASK_STATES = (
    ("not_started", "not started", "imported, no iteration run yet (Start it)", NOT_STARTED),
    ("queued", "queued", "queued again after a failure or cancel, not yet running",
     Q(status=Task.Status.QUEUED, current_iteration__gt=0)),
    ("running", "running", "an iteration's rollouts queued for or running on a worker", Q(status=Task.Status.RUNNING)),
    ("reviewing", "reviewing", "the judge is scoring the iteration", Q(status=Task.Status.REVIEWING)),
    ("waiting_approval", "waiting for approval", "a proposal waits for a person",
     Q(status=Task.Status.WAITING_APPROVAL)),
    ("completed", "completed", "", Q(status=Task.Status.COMPLETED)),
    ("failed", "failed", "", Q(status=Task.Status.FAILED)),
    ("cancelled", "cancelled", "", Q(status=Task.Status.CANCELLED)),
)
STATE_LABELS = {key: label for key, label, *_ in TASK_STATES}
STATE_FILTERS = {key: q for key, _label, _hint, q in TASK_STATES}


def batch_state_counts(batch_ids: list[int]) -> dict[int, dict[str, int]]:
    """batch id -> task count per state (TASK_STATES' keys in order, every one present; the not
    started apart from the queued again); two queries: the counts by status (the (batch, status)
    index) and the not started among the queued."""
    progress = {pk: dict.fromkeys(STATE_LABELS, 0) for pk in batch_ids}
    rows = (Task.objects.filter(batch_id__in=list(progress)).order_by()
            .values_list("batch_id", "status").annotate(n=Count("id")))
    for batch_id, status, n in rows:
        progress[batch_id][status] = n
    for batch_id, n in (Task.objects.filter(NOT_STARTED, batch_id__in=list(progress)).order_by()
                        .values_list("batch_id").annotate(n=Count("id"))):
        progress[batch_id]["not_started"], progress[batch_id]["queued"] = n, progress[batch_id]["queued"] - n
    return progress


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
