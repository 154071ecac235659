"""Embedding jobs: a finished iteration's dedup texts go into the embedding store once, by a worker.

    embed_iteration(task_id, iteration)   enqueued when an iteration finishes (the receiver of
                                           apps.tasks.signals.iteration_finished, sent after commit)
    embed_trajectories(ids)               the same for any trajectories (a backfill, the bench)

Near-duplicate dedup (apps.datasets.dedup) compares a trajectory's task prompt and its action
sequence; both are embedded here, in batches, and kept in TextEmbedding keyed by the text's
SHA-256 and the model's name, so version creation reads them instead of embedding. Running twice
(a redelivered message) stores nothing new: the texts are found stored, and two runs at once
both offer a row and the first stays (the same vector), so no claim is needed.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from django.conf import settings

from apps.datasets import dedup
from apps.engines.embeddings import Embedder, embed_stored
from apps.tasks.models import Trajectory
from trajplatform.schedules import enqueue

EMBED_JOB = "apps.datasets.embedding_jobs.embed_iteration"
READ_CHUNK = 500


def embed_finished_iteration(sender: Any, *, task_id: int, iteration: int, **kwargs: Any) -> None:
    """apps.tasks.signals.iteration_finished (sent after commit): queue the embedding of its dedup texts."""
    if settings.DATASET_EMBED_ON_FINISH:
        enqueue(EMBED_JOB, task_id, iteration, group="embeddings")


def dedup_texts(trajectory_ids: Sequence[int]) -> Iterable[tuple[str, str]]:
    """(task prompt, action sequence) of each trajectory, read READ_CHUNK at a time."""
    for start in range(0, len(trajectory_ids), READ_CHUNK):
        rows = Trajectory.objects.filter(pk__in=trajectory_ids[start:start + READ_CHUNK]).values_list(
            "task__prompt", "messages")
        for prompt, messages in rows.iterator(chunk_size=READ_CHUNK):
            yield prompt or "", dedup.action_sequence(messages)


def embed_trajectories(trajectory_ids: Sequence[int], *, embedder: Embedder | None = None) -> dict[str, int]:
    """Store the dedup embeddings of these trajectories (those already stored are read, not embedded)."""
    ids = sorted(set(trajectory_ids))
    texts: dict[str, None] = {}
    for prompt, actions in dedup_texts(ids):
        texts.setdefault(prompt)
        texts.setdefault(actions)
    embed_stored(list(texts), embedder=embedder)
    return {"trajectories": len(ids), "texts": len(texts)}


def embed_iteration(task_id: int, iteration: int) -> dict[str, int]:
    """Job: store the dedup embeddings of one finished iteration's finished trajectories."""
    ids = list(Trajectory.objects.filter(task_id=task_id, iteration=iteration,
                                         status=Trajectory.Status.FINISHED).values_list("pk", flat=True))
    return embed_trajectories(ids)
