"""Pipeline jobs (django-q2): run one PipelineRun, and the reaper for runs whose worker died.

`run_pipeline` expects to be delivered twice: it claims the run by compare-and-swap (queued ->
running, with a fresh claim token) and is a no-op when another worker holds it. Between stage
runs it sends a heartbeat and reads the cancel flag; a worker that lost its claim (the reaper
gave the run to another) stops without writing more. The reaper re-queues a running run whose
worker process on this host is gone (trajplatform.workers.holder_alive, as for rollouts) or that sent
no heartbeat for PIPELINE_STALE_S, and re-dispatches queued runs no job seems to serve.
"""
from __future__ import annotations

import logging
import secrets
import socket
import time
from datetime import timedelta
from typing import Any

from django.db.models import F, Q
from django.utils import timezone

from apps.engines.generation import PipelineError
from apps.engines.models import PipelineRun
from apps.engines.pipelines import pipeline_for
from apps.engines.pipelines.runner import Runner, StageFailed, Stopped, run_counts
# The reaper's schedule lives with the services (a run's creation makes sure it ticks;
# EnginesConfig.ready registers services.ensure_pipeline_schedules).
from apps.engines.pipelines.services import (
    enqueue_run,
    pipeline_run_finish,
    pipeline_run_hand_over,
    pipeline_run_requeue,
)
from apps.tasks import jobs as rollout_jobs
from trajplatform.workers import _live_runners, _live_runners_lock, holder_alive, worker_name

logger = logging.getLogger("apps.engines.pipelines")

HEARTBEAT_S = 5.0
# A stage run may be a whole agent episode (Task.timeout_s defaults to 600 s) with no
# heartbeat in between: the stale limit is above that. A dead worker process on this host is
# noticed at once through its pid, without waiting for it.
PIPELINE_STALE_S = 900.0
PIPELINE_MAX_CLAIMS = 5
HANDED_OVER = "handed_over"  # run_pipeline's status when the job's time budget ran out


class _Claim:
    """This job's hold on a run: the heartbeat and cancel check the runner calls between stages."""

    def __init__(self, run: PipelineRun, token: str):
        self.run, self.token, self.last = run, token, time.monotonic()
        # Hand the run over to a follow-up job before django-q2's timeout kills this one (as the
        # rollout jobs do); not before this job started a stage run of its own, so each job
        # makes progress.
        self.deadline, self.beats = self.last + rollout_jobs._job_budget_s(), 0

    def held(self) -> Any:
        return PipelineRun.objects.filter(pk=self.run.pk, claim_token=self.token, status=PipelineRun.Status.RUNNING)

    def beat(self) -> None:
        self.beats += 1
        if self.beats > 1 and time.monotonic() > self.deadline:
            raise Stopped("budget")
        if time.monotonic() - self.last < HEARTBEAT_S:
            return
        self.last = time.monotonic()
        if not self.held().update(heartbeat_at=timezone.now()):
            raise Stopped("lost")
        if self.held().filter(cancel_requested=True).exists():
            raise Stopped("cancel")


def claim_run(run_id: int, worker: str) -> _Claim | None:
    """Take a queued run by compare-and-swap; None if it is not queued (another worker has it)."""
    token, now = secrets.token_hex(16), timezone.now()
    won = PipelineRun.objects.filter(pk=run_id, status=PipelineRun.Status.QUEUED, cancel_requested=False).update(
        status=PipelineRun.Status.RUNNING, worker=worker[:200], claim_token=token, started_at=now,
        heartbeat_at=now, attempts=F("attempts") + 1, updated_at=now,
    )
    return _Claim(PipelineRun.objects.get(pk=run_id), token) if won else None


def run_pipeline(run_id: int, *, llm: Any = None) -> dict[str, Any]:
    """Run one queued pipeline run to its end; a no-op if it is not queued (double delivery)."""
    worker = f"{worker_name()}:{secrets.token_hex(4)}"
    # holder_alive() knows this process's live claims by name: the reaper of this process must
    # not take a run the job is still running, and must take it once the job is gone.
    with _live_runners_lock:
        _live_runners.add(worker)
    try:
        # A redelivered message for a run whose worker died: take it back now, not at the next reaper tick.
        _reap(PipelineRun.objects.filter(pk=run_id))
        claim = claim_run(run_id, worker)
        if claim is None:
            return {"claimed": False}
        return _execute(claim, llm)
    finally:
        with _live_runners_lock:
            _live_runners.discard(worker)


def _execute(claim: _Claim, llm: Any) -> dict[str, Any]:
    run = claim.run
    status, error = PipelineRun.Status.COMPLETED, ""
    try:
        Runner(run, pipeline_for(run.scene, run.config), llm=llm, beat=claim.beat).execute()
    except Stopped as stop:
        if str(stop) == "lost":
            logger.warning("pipeline run %s: the claim was taken away; stopping", run.pk)
            return {"claimed": True, "status": "lost"}
        if str(stop) == "budget":
            handed = pipeline_run_hand_over(run_id=run.pk, claim_token=claim.token)
            return {"claimed": True, "status": HANDED_OVER if handed else "lost"}
        status, error = PipelineRun.Status.CANCELLED, "cancelled"
    except (StageFailed, PipelineError) as exc:
        status, error = PipelineRun.Status.FAILED, str(exc)
    except Exception as exc:  # a bug or a lost database: the run says so, and can be resumed
        logger.exception("pipeline run %s failed", run.pk)
        status, error = PipelineRun.Status.FAILED, f"{type(exc).__name__}: {exc}"
    counts = {k: v for k, v in run_counts(run).items() if k != "stages_finished"}
    pipeline_run_finish(run_id=run.pk, claim_token=claim.token, status=status, error=error, counts=counts)
    return {"claimed": True, "status": status, "error": error, **{k: str(v) for k, v in counts.items()}}


def reap_pipeline_runs() -> dict[str, int]:
    """Re-queue running runs whose worker on this host is gone or whose heartbeat is stale;
    dispatch queued runs queued longer than PIPELINE_STALE_S (a lost broker message)."""
    report = {"requeued": 0, "failed": 0, "dispatched": 0, **_reap(PipelineRun.objects.all(), dispatch=True)}
    stale_before = timezone.now() - timedelta(seconds=PIPELINE_STALE_S)
    lost = PipelineRun.objects.filter(Q(queued_at__lt=stale_before) | Q(queued_at__isnull=True),
                                      status=PipelineRun.Status.QUEUED, cancel_requested=False)
    for pk in list(lost.values_list("pk", flat=True)):
        enqueue_run(pk)
        report["dispatched"] += 1
    if any(report.values()):
        logger.info("pipeline reaper: %s", report)
    return report


def _reap(runs: Any, *, dispatch: bool = False) -> dict[str, int]:
    """Re-queue (or fail) the running ones of `runs` whose worker is gone or silent; counts by outcome.
    dispatch=False: the caller claims the run itself, no job is enqueued for it."""
    report = {"requeued": 0, "failed": 0}
    stale_before = timezone.now() - timedelta(seconds=PIPELINE_STALE_S)
    host = socket.gethostname()
    running = runs.filter(status=PipelineRun.Status.RUNNING)
    for pk, worker, started_at, heartbeat_at in list(running.values_list("pk", "worker", "started_at", "heartbeat_at")):
        if worker.startswith(f"{host}:") and not holder_alive(worker, started_at):
            reason = f"its worker {worker} is gone"
        elif heartbeat_at is None or heartbeat_at < stale_before:
            reason = f"no heartbeat from {worker} for {PIPELINE_STALE_S:.0f} s"
        else:
            continue
        outcome = pipeline_run_requeue(run_id=pk, reason=reason, max_attempts=PIPELINE_MAX_CLAIMS, dispatch=dispatch)
        if outcome:
            report[outcome] += 1
    return report

