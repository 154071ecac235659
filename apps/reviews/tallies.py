"""The workers' counts the whole-scope console pages read: every batch's spend, acceptance and
human review progress (BatchTally), and every reviewer's verdicts (ReviewerTally, the team page).

The batch page and the review queue filtered by a batch read the batch's BatchTally row instead of
aggregating its trajectories in the request: at 1M trajectories in one batch on PostgreSQL the
spend and accepted count took 11.7 s and the review progress 19.1 s. `refresh_batch_tallies` runs
on the workers every BATCH_TALLY_EVERY_MINUTES (registered beside the overview's activity job,
trajplatform.overview.ensure_activity_schedule) and counts with the exact selectors
(selectors.batch_sums, selectors.batch_review_progress); the pages say when it counted.

It recounts only the batches that changed since their last count (and batches never counted); a
full recount of every batch is `refresh_batch_tallies(full=True)` (`manage.py refresh_tallies
--full`). What changed is marked by database triggers (reviews migration 0011): every insert and
delete of a trajectory or review, and every update of a column a tally reads (a trajectory's
task, status, iteration, outcome, cost; a review's trajectory, kind, status, score, verdict,
reviewer, cost; a task's batch, current iteration and quality threshold) writes a BatchChange row
naming the batch. Triggers, not timestamps and not marks set by services, because they are the one
that cannot miss a change: trajectories and reviews have no updated_at, the jobs' compare-and-swap
`update()` calls would skip an auto_now column anyway, and a deleted row leaves no timestamp to
compare; a mark set by services would miss the writes made elsewhere -- the tasks app's rollout
jobs (which may not import reviews), the admin's cascading deletes, bulk loads, raw SQL. A trigger
runs inside the writing transaction, so a mark is committed exactly when its change is.

The job reads the marks present, recounts their batches, then deletes exactly the marks it read:
a mark it saw was committed before its counts began, so they include that change; a mark committed
later (whatever its id) stays for the next run. Marks are insert-only (no row two writers contend
for). What no row records needs the full recount: after changing REVIEW_REVIEWERS_PER_ITEM or
REVIEW_AUDIT_SHARE (they change what the review queue routes, not the rows), or a TRUNCATE.

`refresh_team_tally` (every TEAM_TALLY_EVERY_MINUTES) recounts every person's human verdicts
(selectors.team_counts: two grouped queries, 0.3 s at 300k trajectories with 30k verdicts) into
their ReviewerTally row for the team page, which says when; it is not incremental: its per-day and
7-day columns move with the clock, not only with the rows.
"""
from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.reviews import selectors
from apps.reviews.models import BatchChange, BatchTally, ReviewerTally
from apps.tasks.models import Batch

BATCH_TALLY_SCHEDULE = "batch-tallies"
BATCH_TALLY_JOB = "apps.reviews.tallies.refresh_batch_tallies"
BATCH_TALLY_EVERY_MINUTES = 5
TEAM_TALLY_SCHEDULE = "team-tally"
TEAM_TALLY_JOB = "apps.reviews.tallies.refresh_team_tally"
TEAM_TALLY_EVERY_MINUTES = 5


MARKS_CHUNK = 5_000  # marks deleted per statement (SQLite's limit of bound variables)


def refresh_batch_tallies(*, full: bool = False, now: datetime | None = None) -> int:
    """Recount into their BatchTally rows the batches changed since their last count (BatchChange
    marks) and those never counted -- every batch with `full` -- then delete the marks read; returns
    how many batches it recounted. Derived data, so no audit row; two runs at once write the same
    numbers twice. `now` is the time it records."""
    marks = list(BatchChange.objects.order_by("pk").values_list("pk", "batch_id"))
    batches = Batch.objects.order_by("pk")
    if not full:
        changed = {batch_id for _pk, batch_id in marks}
        batches = batches.filter(Q(pk__in=changed) | Q(tally__isnull=True))
    written = 0
    for batch_id in batches.values_list("pk", flat=True):
        spent, judge, accepted = selectors.batch_sums(batch_id)
        review = selectors.batch_review_progress(batch_id)
        BatchTally.objects.update_or_create(batch_id=batch_id, defaults={
            "spent_usd": spent, "judge_usd": judge, "accepted": accepted, "review_total": review["total"],
            "review_done": review["done"], "computed_at": now or timezone.now()})
        written += 1
    for start in range(0, len(marks), MARKS_CHUNK):
        BatchChange.objects.filter(pk__in=[pk for pk, _batch in marks[start:start + MARKS_CHUNK]]).delete()
    return written


def refresh_team_tally(*, now: datetime | None = None) -> int:
    """Recount every person's human verdicts (selectors.team_counts) into their ReviewerTally row,
    all with one computed_at, and drop the rows of people left with none; returns how many it
    wrote. Derived data, so no audit row; two runs at once write the same numbers twice."""
    counts = selectors.team_counts()
    for reviewer_id in selectors.reviewers().values_list("pk", flat=True):  # a row, zeros included, for each
        counts.setdefault(reviewer_id, selectors.ReviewerCounts(per_day=[0] * selectors.TEAM_DAYS))
    now, day = now or timezone.now(), timezone.localdate()
    with transaction.atomic():
        ReviewerTally.objects.exclude(reviewer_id__in=list(counts)).delete()
        for reviewer_id, c in counts.items():
            ReviewerTally.objects.update_or_create(reviewer_id=reviewer_id, defaults={
                **{name: getattr(c, name) for name in selectors.COUNTED}, "per_day": c.per_day, "day": day,
                "computed_at": now})
    return len(counts)
