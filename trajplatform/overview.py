"""The operator overview's reads, and the scheduled job that keeps its daily activity.

Every read here costs the same number of queries at any size, and none scans the trajectory
table: the states are grouped counts over the task table and the status index of the live
trajectories, the batches in progress come from the newest batches, the human queue's size is
read from the activity job's last run, and the activity over time from the ActivityDay rows that
`refresh_activity` recomputes on the workers every ACTIVITY_EVERY_MINUTES.

Days are UTC days. "Accepted" is the platform's one definition (apps.reviews.selectors.accepted_q:
a human accept where a human reviewed it, else a success); the cost of a day is what its
trajectories recorded plus the judge's calls on them, so cost per accepted trajectory is the
whole spend of the day's work over what of it was accepted.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from apps.reviews import tallies
from apps.reviews.models import Review
from apps.reviews.selectors import accepted_q, human_queue
from apps.tasks.selectors import NOT_STARTED, TASK_STATES
from apps.tasks.models import Batch, Task, Trajectory
from trajplatform.activity import ActivityDay
from trajplatform.schedules import ensure_schedule

WINDOW_DAYS = 14
# Today and yesterday are recomputed at every run; the window's older days when their row is
# older than STALE_AFTER (a late human verdict still moves a day's acceptance).
RECENT_DAYS = 2
STALE_AFTER = timedelta(hours=1)
ACTIVITY_SCHEDULE = "overview-activity"
ACTIVITY_JOB = "trajplatform.overview.refresh_activity"
ACTIVITY_EVERY_MINUTES = 5
LAST_HOUR_CAP = 1000
BATCHES_SHOWN = 10
ZERO = Decimal(0)


def utc_today(now: datetime | None = None) -> date:
    return (now or timezone.now()).astimezone(UTC).date()


def window(today: date) -> list[date]:
    """The overview's days, oldest first, ending today."""
    return [today - timedelta(days=n) for n in range(WINDOW_DAYS - 1, -1, -1)]


def _midnight(day: date) -> datetime:
    return datetime.combine(day, clock.min, tzinfo=UTC)


# -- the activity job -------------------------------------------------------------------------------


def _day_stats(start: datetime, end: datetime) -> dict[date, dict[str, Any]]:
    """Per UTC day of finished_at in [start, end): counts and costs of the top-level trajectories
    (sub-episodes' costs are in their parent's); two grouped queries."""
    finished = Q(status=Trajectory.Status.FINISHED)
    human = Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.HUMAN, status=Review.Status.DONE)
    rows = (Trajectory.objects.filter(finished_at__gte=start, finished_at__lt=end)
            .annotate(day=TruncDate("finished_at", tzinfo=UTC)).order_by().values("day")
            .annotate(finished=Count("id", filter=finished),
                      succeeded=Count("id", filter=finished & Q(outcome=Trajectory.Outcome.SUCCESS)),
                      accepted=Count("id", filter=finished & accepted_q()),
                      human_reviewed=Count("id", filter=finished & Q(Exists(human))),
                      cost_usd=Sum("cost_usd")))
    stats = {row.pop("day"): {**row, "cost_usd": row["cost_usd"] or ZERO, "judge_usd": ZERO} for row in rows}
    judge = (Review.objects.filter(trajectory__finished_at__gte=start, trajectory__finished_at__lt=end,
                                   trajectory__parent__isnull=True)
             .annotate(day=TruncDate("trajectory__finished_at", tzinfo=UTC)).order_by().values("day")
             .annotate(judge_usd=Sum("cost_usd")))
    for row in judge:
        stats.setdefault(row["day"], {"finished": 0, "succeeded": 0, "accepted": 0, "human_reviewed": 0,
                                      "cost_usd": ZERO})["judge_usd"] = row["judge_usd"] or ZERO
    return stats


def refresh_activity(*, now: datetime | None = None) -> int:
    """Recompute the ActivityDay rows of the window that may have changed (today, yesterday, any
    day computed over STALE_AFTER ago, and the days between); returns how many it wrote. Derived
    data, so no audit row; running twice at once writes the same numbers twice."""
    now = now or timezone.now()
    today = utc_today(now)
    days = window(today)
    computed = dict(ActivityDay.objects.filter(day__in=days).values_list("day", "computed_at"))
    due = [d for d in days if d not in computed or d > today - timedelta(days=RECENT_DAYS)
           or computed[d] < now - STALE_AFTER]
    if not due:
        return 0
    first = min(due)
    stats = _day_stats(_midnight(first), _midnight(today + timedelta(days=1)))
    # Counted here, not in the page: the queue's count evaluates its rules on every finished
    # trajectory of a current iteration (4.5 s in the request at 100k on PostgreSQL).
    stats.setdefault(today, {})["awaiting_review"] = human_queue().count()
    empty = {"finished": 0, "succeeded": 0, "accepted": 0, "human_reviewed": 0, "cost_usd": ZERO, "judge_usd": ZERO}
    written = 0
    with transaction.atomic():
        for day in days:
            if day >= first:
                ActivityDay.objects.update_or_create(day=day, defaults={**empty, **stats.get(day, {}),
                                                                        "computed_at": now})
                written += 1
    return written


def ensure_activity_schedule(using: str = "default") -> None:
    """Register the every-5-minutes activity refresh and the batch tallies' and the team tally's
    counts (apps.reviews.tallies; idempotent; run after migrate)."""
    ensure_schedule(name=ACTIVITY_SCHEDULE, func=ACTIVITY_JOB, minutes=ACTIVITY_EVERY_MINUTES, using=using)
    ensure_schedule(name=tallies.BATCH_TALLY_SCHEDULE, func=tallies.BATCH_TALLY_JOB,
                    minutes=tallies.BATCH_TALLY_EVERY_MINUTES, using=using)
    ensure_schedule(name=tallies.TEAM_TALLY_SCHEDULE, func=tallies.TEAM_TALLY_JOB,
                    minutes=tallies.TEAM_TALLY_EVERY_MINUTES, using=using)


# -- the page's reads -------------------------------------------------------------------------------


@dataclass
class State:
    key: str
    label: str
    hint: str
    n: int


def task_states() -> list[State]:
    """Tasks by their real state (a not-started task is not 'queued'); two queries: the counts by
    status (COUNT(*), so PostgreSQL may answer from the status index alone) and the not-started
    among the queued ones."""
    by_status = dict(Task.objects.order_by().values_list("status").annotate(n=Count("*")))
    not_started = Task.objects.filter(NOT_STARTED).count()
    counts = {key: by_status.get(key, 0) for key, *_ in TASK_STATES}
    counts["not_started"], counts["queued"] = not_started, by_status.get(Task.Status.QUEUED, 0) - not_started
    return [State(key, label, hint, counts[key]) for key, label, hint, _ in TASK_STATES]


def live_trajectories(now: datetime | None = None) -> dict[str, Any]:
    """Queued and running trajectories (the status index), and those finished in the last hour
    counted up to LAST_HOUR_CAP (the finished_at index; "1,000+" beyond); two queries."""
    now = now or timezone.now()
    live = dict(Trajectory.objects.filter(status__in=[Trajectory.Status.QUEUED, Trajectory.Status.RUNNING])
                .order_by().values_list("status").annotate(n=Count("id")))
    last_hour = Trajectory.objects.filter(finished_at__gte=now - timedelta(hours=1)).order_by()[:LAST_HOUR_CAP + 1]
    n = last_hour.count()
    return {"queued": live.get(Trajectory.Status.QUEUED, 0), "running": live.get(Trajectory.Status.RUNNING, 0),
            "last_hour": min(n, LAST_HOUR_CAP), "last_hour_more": n > LAST_HOUR_CAP}


def _started_tasks() -> Any:
    return Task.objects.filter(batch=OuterRef("pk")).exclude(NOT_STARTED)


def batches_in_progress() -> tuple[list[dict[str, Any]], bool, int]:
    """The newest BATCHES_SHOWN batches with a started task and an unfinished one, each with its
    tasks by state; whether there are more; how many batches have not started. Three queries."""
    # The unfinished states by name, not "not final": each is a range of the (batch, status) index,
    # where a NOT IN walks every task of a big finished batch.
    unfinished = Task.objects.filter(batch=OuterRef("pk"),
                                     status__in=[s for s in Task.Status.values if s not in Task.FINAL])
    shown = list(Batch.objects.filter(Exists(unfinished), Exists(_started_tasks()))
                 .order_by("-created_at", "-id")[:BATCHES_SHOWN + 1])
    more = len(shown) > BATCHES_SHOWN
    shown = shown[:BATCHES_SHOWN]
    counts = {b.pk: dict.fromkeys([key for key, *_ in TASK_STATES], 0) for b in shown}
    rows = (Task.objects.filter(batch_id__in=list(counts)).order_by()
            .values("batch_id").annotate(**{key: Count("id", filter=q) for key, _, _, q in TASK_STATES}))
    for row in rows:
        counts[row.pop("batch_id")].update(row)
    labels = {key: label for key, label, *_ in TASK_STATES}
    final = {"completed", "failed", "cancelled"}
    table = []
    for batch in shown:
        by_state = counts[batch.pk]
        total = sum(by_state.values())
        done = sum(by_state[k] for k in final)
        table.append({"batch": batch, "total": total, "final": done,
                      "percent": round(100 * done / total) if total else 0,
                      "states": [(labels[k], n) for k, n in by_state.items() if n]})
    not_started = (Batch.objects.filter(Exists(Task.objects.filter(batch=OuterRef("pk"))))
                   .exclude(Exists(_started_tasks())).count())
    return table, more, not_started


def money(value: Decimal | float | None) -> str:
    """USD as the overview prints it: cents from a dollar up, four decimals below."""
    return "–" if value is None else f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def activity(today: date | None = None) -> dict[str, Any]:
    """The window's days as the charts draw them (None where a day has no row yet, or nothing to
    divide by), the window's totals, and when the rows were computed; one query."""
    today = today or utc_today()
    days = window(today)
    rows = {row.day: row for row in ActivityDay.objects.filter(day__in=days)}
    points = []
    for day in days:
        row = rows.get(day)
        spent = None if row is None else row.cost_usd + row.judge_usd
        points.append({
            "day": day, "label": day.strftime("%m-%d"), "computed": row is not None,
            "finished": None if row is None else row.finished,
            "accepted": None if row is None else row.accepted,
            "not_accepted": None if row is None else row.finished - row.accepted,
            "rate": (100 * row.accepted / row.finished) if row is not None and row.finished else None,
            "spent": spent, "spent_text": money(spent),
            "per_accepted": (spent / row.accepted) if row is not None and row.accepted else None,
            "awaiting": None if row is None else row.awaiting_review,
        })
    for point in points:
        point["per_accepted_text"] = money(point["per_accepted"])
    finished = sum(row.finished for row in rows.values())
    accepted = sum(row.accepted for row in rows.values())
    spent = sum((row.cost_usd + row.judge_usd for row in rows.values()), ZERO)
    stamps = [row.computed_at for row in rows.values()]
    return {
        "points": points, "finished": finished, "accepted": accepted,
        "rate": (100 * accepted / finished) if finished else None, "spent_text": money(spent if rows else None),
        "per_accepted_text": money(spent / accepted if accepted else None),
        "computed_at": max(stamps) if stamps else None, "missing": WINDOW_DAYS - len(rows),
        "awaiting": rows[today].awaiting_review if today in rows else None,
        "every_minutes": ACTIVITY_EVERY_MINUTES,
    }
