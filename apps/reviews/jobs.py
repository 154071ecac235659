"""Review jobs (django-q2): review an iteration's trajectories, retry failed judges.

    review_iteration(task_id, iteration)   enqueued on commit when an iteration's last trajectory
                                           ends (apps.tasks.services.on_iteration_finished sends
                                           apps.tasks.signals.iteration_finished):
                                           checks + judge for every finished trajectory without a
                                           scored review, then iteration_conclude
    review_batch(batch_id)                 the same for every reviewing task of a batch (used by
                                           `synthesize --wait`, which runs everything in-process)
    retry_failed_judges()                  scheduled every REVIEW_JUDGE_RETRY_MINUTES: asks the
                                           judge again for `judge_failed` reviews of reviewing
                                           tasks, up to REVIEW_JUDGE_MAX_ATTEMPTS calls each, and
                                           reviews tasks left `reviewing` longer than that with no
                                           job serving them (a lost broker message, a dead worker)

Delivery may be doubled: a review is stored by compare-and-swap on its attempt count and the
iteration is concluded under the task's row lock, so a second run changes nothing. The judge
call happens outside any transaction.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from apps.reviews import review_agent
from apps.reviews.models import Review
from apps.reviews.services import iteration_conclude, review_open, review_store
from apps.tasks.models import Task, Trajectory
from trajplatform.schedules import enqueue, ensure_schedule, schedules_migrated

logger = logging.getLogger(__name__)

REVIEW_JOB = "apps.reviews.jobs.review_iteration"
RETRY_SCHEDULE_NAME = "reviews.retry_failed_judges"
RETRY_FUNC = "apps.reviews.jobs.retry_failed_judges"
ORPHANS_PER_RUN = 50


def enqueue_review(task_id: int, iteration: int) -> None:
    """Queue review_iteration on the broker (call it from transaction.on_commit)."""
    enqueue(REVIEW_JOB, task_id, iteration, group="reviews")


def review_finished_iteration(sender: Any, *, task_id: int, iteration: int, **kwargs: Any) -> None:
    """apps.tasks.signals.iteration_finished (sent after commit): queue the iteration's review."""
    enqueue_review(task_id, iteration)


def register_review_schedules(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """After `migrate`: make sure the judge-retry job is scheduled (idempotent)."""
    if not schedules_migrated(using):
        return  # django_q not migrated on this database
    ensure_review_schedule(using=using)


def review_one(trajectory: Trajectory, *, llm: Any = None) -> Review | None:
    """Checks + judge for one finished trajectory unless it already has a scored review."""
    review = review_open(trajectory=trajectory)
    if review.status == Review.Status.DONE:
        return review
    if review.status == Review.Status.JUDGE_FAILED and review.attempts >= settings.REVIEW_JUDGE_MAX_ATTEMPTS:
        return review
    review.trajectory = trajectory
    checks = review_agent.run_checks(trajectory)
    try:
        result = review_agent.judge(trajectory, checks, attempt=review.attempts + 1, llm=llm)
    except review_agent.JudgeFailed as failure:
        logger.warning("trajectory %s: %s", trajectory.pk, failure)
        return review_store(review=review, checks=checks, failure=failure)
    return review_store(review=review, checks=checks, result=result)


def review_iteration(task_id: int, iteration: int, *, llm: Any = None) -> dict[str, Any]:
    """Review every finished trajectory of the iteration, then conclude it; returns counts."""
    counts = {"reviewed": 0, "judge_failed": 0}
    task = Task.objects.filter(pk=task_id).first()
    if task is None or task.status != Task.Status.REVIEWING or task.current_iteration != iteration:
        return counts
    trajectories = Trajectory.objects.filter(
        task_id=task_id, iteration=iteration, status=Trajectory.Status.FINISHED).select_related("task").order_by("pk")
    for trajectory in trajectories:
        review = review_one(trajectory, llm=llm)
        if review is not None and review.status == Review.Status.JUDGE_FAILED:
            counts["judge_failed"] += 1
        elif review is not None:
            counts["reviewed"] += 1
    iteration_conclude(task_id=task_id, iteration=iteration)
    return counts


def _failed_reviews_of_current_iteration() -> Any:
    return Review.objects.filter(
        trajectory__task=OuterRef("pk"), trajectory__iteration=OuterRef("current_iteration"),
        kind=Review.Kind.AUTO, status=Review.Status.JUDGE_FAILED,
    )


def tasks_awaiting_review(batch_id: int | None = None) -> Any:
    """Reviewing tasks whose current iteration has no failed judge (those wait for the retry job)."""
    tasks = Task.objects.filter(status=Task.Status.REVIEWING).filter(~Exists(_failed_reviews_of_current_iteration()))
    return tasks.filter(batch_id=batch_id) if batch_id is not None else tasks


def review_batch(batch_id: int, *, llm: Any = None) -> dict[str, int]:
    """review_iteration for every reviewing task of the batch whose judge has not failed."""
    totals = {"tasks": 0, "reviewed": 0, "judge_failed": 0}
    for task_id, iteration in list(tasks_awaiting_review(batch_id).values_list("pk", "current_iteration")):
        counts = review_iteration(task_id, iteration, llm=llm)
        totals["tasks"] += 1
        totals["reviewed"] += counts["reviewed"]
        totals["judge_failed"] += counts["judge_failed"]
    return totals


def retry_failed_judges(*, llm: Any = None) -> dict[str, int]:
    """Ask the judge again for failed reviews of reviewing tasks (current iteration only); review
    reviewing tasks that no job has touched for REVIEW_JUDGE_RETRY_MINUTES."""
    report = {"retried": 0, "scored": 0, "concluded": 0, "resumed": 0}
    failed = (Review.objects.filter(kind=Review.Kind.AUTO, status=Review.Status.JUDGE_FAILED,
                                    attempts__lt=settings.REVIEW_JUDGE_MAX_ATTEMPTS,
                                    trajectory__task__status=Task.Status.REVIEWING)
              .select_related("trajectory", "trajectory__task").order_by("pk"))
    touched: set[tuple[int, int]] = set()
    for review in failed[:500]:
        trajectory = review.trajectory
        if trajectory.iteration != trajectory.task.current_iteration:
            continue
        report["retried"] += 1
        stored = review_one(trajectory, llm=llm)
        if stored is not None and stored.status == Review.Status.DONE:
            report["scored"] += 1
        touched.add((trajectory.task_id, trajectory.iteration))
    for task_id, iteration in sorted(touched):
        if iteration_conclude(task_id=task_id, iteration=iteration) is not None:
            report["concluded"] += 1
    idle_since = timezone.now() - timedelta(minutes=max(1, settings.REVIEW_JUDGE_RETRY_MINUTES))
    orphans = tasks_awaiting_review().filter(updated_at__lt=idle_since).order_by("pk")
    for task_id, iteration in list(orphans.values_list("pk", "current_iteration")[:ORPHANS_PER_RUN]):
        review_iteration(task_id, iteration, llm=llm)
        report["resumed"] += 1
    if report["retried"]:
        logger.info("judge retries: %s", report)
    return report


def ensure_review_schedule(*, using: str = "default") -> Any:
    """Register the judge-retry Schedule (idempotent); called after migrate (apps.reviews.apps)."""
    return ensure_schedule(name=RETRY_SCHEDULE_NAME, func=RETRY_FUNC,
                           minutes=max(1, settings.REVIEW_JUDGE_RETRY_MINUTES), using=using)
