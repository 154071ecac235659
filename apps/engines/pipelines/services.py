"""Writes to pipeline runs. Every change is one transaction with its audit row; the job is enqueued on commit."""
from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from apps.engines.generation import PipelineError
from apps.engines.models import PipelineRun
from apps.engines.pipelines import pipeline_for
from apps.engines.pipelines.runner import Runner
from apps.tasks.models import Batch
from trajplatform.audit import audit_record
from trajplatform.schedules import enqueue, ensure_schedule

# The jobs (apps.engines.pipelines.jobs) by dotted path: the jobs module writes through this one.
JOB_FUNC = "apps.engines.pipelines.jobs.run_pipeline"
REAP_FUNC = "apps.engines.pipelines.jobs.reap_pipeline_runs"
REAP_SCHEDULE_NAME = "engines.reap_pipeline_runs"
REAP_EVERY_MINUTES = 1
MAX_SEEDS = 100_000
MAX_CONCURRENCY = 64  # model calls / episodes of one stage at once


class TransitionError(Exception):
    """A status change that the run's current status does not allow."""


def ensure_pipeline_schedules(*, minutes: int = REAP_EVERY_MINUTES, using: str = "default") -> Any:
    """Register the pipeline reaper's django-q2 Schedule (idempotent); returns it."""
    return ensure_schedule(name=REAP_SCHEDULE_NAME, func=REAP_FUNC, minutes=minutes, using=using)


def _ensure_reaper_schedule() -> None:
    ensure_pipeline_schedules()


def enqueue_run(run_id: int) -> None:
    """Queue the worker job for a run (call on commit); a run already claimed makes it a no-op."""
    enqueue(JOB_FUNC, run_id, task_name=f"pipeline-run-{run_id}")


def _check_batch_name(name: str, user: Any) -> None:
    batch = Batch.objects.filter(name=name).first()
    if batch is not None and (batch.source_format != "pipeline" or batch.created_by_id != getattr(user, "pk", None)):
        raise PipelineError(f"a batch named {name!r} already exists (#{batch.pk}) and is not this user's "
                            "pipeline batch; choose another name")


def pipeline_run_create(
    *, scene: str, seeds: list[Any], actor: Any, batch_name: str = "", config: dict[str, Any] | None = None,
    start: bool = True,
) -> PipelineRun:
    """Check the scene's pipeline and the seeds, create a queued run, audit it, enqueue its job on commit."""
    config = dict(config or {})
    concurrency = config.get("concurrency", 1)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise PipelineError(f"config 'concurrency' must be a whole number from 1 to {MAX_CONCURRENCY}")
    pipeline = pipeline_for(scene, config)
    if not isinstance(seeds, list) or not seeds:
        raise PipelineError("seeds must be a non-empty list")
    if len(seeds) > MAX_SEEDS:
        raise PipelineError(f"{len(seeds)} seeds; at most {MAX_SEEDS} per run")
    user = actor if getattr(actor, "is_authenticated", False) else None
    now = timezone.now()
    batch_name = (batch_name or f"{scene} pipeline {now:%Y-%m-%d %H:%M:%S}").strip()[:200]
    _check_batch_name(batch_name, user)
    with transaction.atomic():
        run = PipelineRun(scene=scene, name=pipeline.name, seeds=seeds, config=config, batch_name=batch_name,
                          created_by=user, item_count=len(seeds), queued_at=now)
        Runner(run, pipeline).items()  # seed keys: unique and usable, or PipelineError before any write
        run.save()
        audit_record("engines.pipeline_start", actor=actor, target=run,
                     data={"scene": scene, "pipeline": pipeline.name, "seeds": len(seeds), "batch_name": batch_name})
        if start:
            transaction.on_commit(lambda: enqueue_run(run.pk))
        # A run exists, so its reaper must tick (idempotent; `make worker`'s migrate does not know it).
        transaction.on_commit(_ensure_reaper_schedule)
    return run


def pipeline_run_start(*, run: PipelineRun, actor: Any) -> PipelineRun:
    """Enqueue the job of a queued run again (a lost message); anything else is a TransitionError."""
    with transaction.atomic():
        run = PipelineRun.objects.select_for_update().get(pk=run.pk)
        if run.status != PipelineRun.Status.QUEUED:
            raise TransitionError(f"pipeline run {run.pk} is {run.status}; only a queued run can be started")
        audit_record("engines.pipeline_start", actor=actor, target=run, data={"redispatch": True})
        transaction.on_commit(lambda: enqueue_run(run.pk))
    return run


def pipeline_run_cancel(*, run: PipelineRun, actor: Any, reason: str = "") -> PipelineRun:
    """Cancel a queued run at once, or ask a running one to stop between stage runs."""
    with transaction.atomic():
        run = PipelineRun.objects.select_for_update().get(pk=run.pk)
        if run.status in PipelineRun.FINAL or run.cancel_requested:
            return run  # repeat click: no-op, no audit row
        if run.status == PipelineRun.Status.QUEUED:
            run.status, run.finished_at = PipelineRun.Status.CANCELLED, timezone.now()
            run.error = reason or "cancelled before it started"
        run.cancel_requested = True
        run.save(update_fields=["status", "finished_at", "error", "cancel_requested", "updated_at"])
        audit_record("engines.pipeline_cancel", actor=actor, target=run, data={"reason": reason, "status": run.status})
    return run


def pipeline_run_resume(*, run: PipelineRun, actor: Any) -> PipelineRun:
    """Queue a failed or cancelled run again: finished stage runs are reused, the rest run."""
    with transaction.atomic():
        run = PipelineRun.objects.select_for_update().get(pk=run.pk)
        if run.status not in (PipelineRun.Status.FAILED, PipelineRun.Status.CANCELLED):
            raise TransitionError(f"pipeline run {run.pk} is {run.status}; only a failed or cancelled run resumes")
        previous = run.status
        run.status, run.cancel_requested, run.error = PipelineRun.Status.QUEUED, False, ""
        run.queued_at, run.finished_at, run.claim_token = timezone.now(), None, ""
        run.save(update_fields=["status", "cancel_requested", "error", "queued_at", "finished_at", "claim_token",
                                "updated_at"])
        audit_record("engines.pipeline_resume", actor=actor, target=run, data={"from": previous})
        transaction.on_commit(lambda: enqueue_run(run.pk))
    return run


def pipeline_run_finish(*, run_id: int, claim_token: str, status: str, error: str = "",
                        counts: dict[str, Any] | None = None) -> bool:
    """End a claimed run (completed, failed, cancelled) if this claim still holds it; audited."""
    with transaction.atomic():
        done = PipelineRun.objects.filter(pk=run_id, claim_token=claim_token, status=PipelineRun.Status.RUNNING).update(
            status=status, error=error[:10_000], finished_at=timezone.now(), updated_at=timezone.now(),
            **(counts or {}),
        )
        if done:
            run = PipelineRun.objects.get(pk=run_id)
            audit_record("engines.pipeline_finish", actor=None, target=run,
                         data={"status": status, "error": error[:500], **{k: str(v) for k, v in (counts or {}).items()}})
    return bool(done)


def pipeline_run_hand_over(*, run_id: int, claim_token: str) -> bool:
    """A job at its time budget gives its claimed run back to the queue with a follow-up job (on
    commit); a hand-over is not a failed attempt, so the claim it made is not counted."""
    with transaction.atomic():
        done = PipelineRun.objects.filter(pk=run_id, claim_token=claim_token, status=PipelineRun.Status.RUNNING).update(
            status=PipelineRun.Status.QUEUED, claim_token="", queued_at=timezone.now(), updated_at=timezone.now(),
            attempts=Greatest(F("attempts") - 1, 0),
        )
        if done:
            audit_record("engines.pipeline_requeue", actor=None, target=PipelineRun.objects.get(pk=run_id),
                         data={"reason": "the job's time budget ran out", "outcome": "handed over"})
            transaction.on_commit(lambda: enqueue_run(run_id))
    return bool(done)


def pipeline_run_requeue(*, run_id: int, reason: str, max_attempts: int, dispatch: bool = True) -> str:
    """The reaper's: a running run whose worker is gone goes back to the queue (or fails after
    max_attempts claims); returns "requeued", "failed" or "" when the run moved on meanwhile."""
    with transaction.atomic():
        run = PipelineRun.objects.select_for_update().filter(pk=run_id, status=PipelineRun.Status.RUNNING).first()
        if run is None:
            return ""
        if run.attempts >= max_attempts:
            run.status, run.finished_at = PipelineRun.Status.FAILED, timezone.now()
            run.error = f"{reason}; gave up after {run.attempts} attempts (resume it to try again)"
            outcome = "failed"
        else:
            run.status, run.queued_at = PipelineRun.Status.QUEUED, timezone.now()
            outcome = "requeued"
        run.claim_token = ""
        run.save(update_fields=["status", "finished_at", "error", "queued_at", "claim_token", "updated_at"])
        audit_record("engines.pipeline_requeue", actor=None, target=run,
                     data={"reason": reason, "outcome": outcome, "attempts": run.attempts})
        if outcome == "requeued" and dispatch:
            transaction.on_commit(lambda: enqueue_run(run.pk))
    return outcome
