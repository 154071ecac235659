"""Cost budgets: per batch, per user (whoever created the task) and a platform-wide daily cap.

    batch_set_budget(batch=, budget_usd=, actor=)   set or clear (None) a batch's budget
    user_set_budget(user=, budget_usd=, actor=)     set or clear (None) a user's budget
    register_spend(model, trajectory_field)         other costs that count (apps.reviews: the judge's)
    snapshot()                                      the process's cached spend (refreshed every BUDGET_REFRESH_S)
    EpisodeBudgets                                  a worker job's check before each model call

Spend is the stored `cost_usd` of top-level trajectories (`Trajectory.objects`: a parent's cost
already includes its sub-episodes', so the children are not counted again) plus the judge's
(`Review.cost_usd`, every attempt). A spent budget stops rollouts, not the judge: it still
reviews what ran (a task must not be left half-reviewed), and its cost counts. A batch's and a
user's budget cover everything ever spent on them; the daily cap (BUDGET_DAILY_USD, 0: none)
what the trajectories finished since 00:00 UTC cost. A budget of 0 lets nothing run.

Two places enforce it, neither with a query of its own on the hot path:

* Claims: `apps.tasks.jobs.claimable()` leaves out the queued trajectories of a batch or user
  whose stored spend reached its budget (all of them when the day's cap is reached), from the
  cached snapshot. They stay queued and are claimed once the budget is raised (the services
  dispatch rollout jobs) or the day turns (the reaper dispatches a job for a queue nobody serves).
* Model calls: the worker sets `apps.engines.agent.budget_check` for each episode; before each
  model call the agent passes the episode's cost so far, and the check adds the cost so far of
  every episode the job runs in the same batch / for the same user / today to the snapshot's
  stored spend. Over budget: the episode ends as an error, reason "budget: ...", error kind
  "budget", not retried. The episode that ended stays an error: its partial record is kept.

The check runs before a call, so a budget can be overshot by at most one model call per episode
running on it, plus what other workers' episodes spent since the last refresh (BUDGET_REFRESH_S).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone as dt_timezone
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Callable

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, Sum

from apps.tasks.models import Batch, Task, Trajectory, UserBudget
from apps.tasks.services import dispatch_rollouts
from trajplatform.audit import audit_record

ZERO = Decimal(0)
MICRO = Decimal("0.000001")  # the budget columns' (and cost_usd's) precision
MAX_BUDGET = Decimal("99999999")  # the columns hold 14 digits, 6 of them decimals


@dataclass(frozen=True)
class Limit:
    """One budget and the stored spend against it."""

    name: str  # "batch 'nightly'", "user alice", "the daily cap"
    budget: Decimal
    spent: Decimal

    def over(self, in_flight: Decimal = ZERO) -> str:
        """The reason the budget is spent ("" while it is not)."""
        total = self.spent + in_flight
        if total < self.budget:
            return ""
        return f"{self.name} spent ${total.quantize(MICRO)} of its ${self.budget.normalize():f} budget"


@dataclass(frozen=True)
class Snapshot:
    """The budgets that matter now (batches and users with running tasks, the day) and their spend."""

    batches: dict[int, Limit] = field(default_factory=dict)
    users: dict[int, Limit] = field(default_factory=dict)
    day: Limit | None = None
    day_cap: Decimal = ZERO
    taken_at: float = 0.0  # time.monotonic()

    def blocked(self) -> Q | None:
        """Trajectories (a Trajectory queryset's terms) that may not be claimed now, or None."""
        if self.day is not None and self.day.over():
            return Q(pk__isnull=False)
        batches = [pk for pk, limit in self.batches.items() if limit.over()]
        users = [pk for pk, limit in self.users.items() if limit.over()]
        terms = [Q(task__batch_id__in=batches)] if batches else []
        terms += [Q(task__created_by_id__in=users)] if users else []
        return _any(terms)


def _any(terms: list[Q]) -> Q | None:
    if not terms:
        return None
    either = terms[0]
    for term in terms[1:]:
        either |= term
    return either


_snapshot = Snapshot()
_lock = threading.Lock()


def _day_start() -> datetime:
    now = datetime.now(dt_timezone.utc)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def _daily_cap() -> Decimal:
    return Decimal(str(getattr(settings, "BUDGET_DAILY_USD", 0) or 0))


# The costs spent on trajectories besides their own, as (model with cost_usd and finished_at, its
# field naming the trajectory): the apps above fill it from their AppConfig.ready (apps.reviews:
# the judge's calls, Review.cost_usd).
_other_spend: list[tuple[Any, str]] = []


def register_spend(model: Any, trajectory_field: str) -> None:
    """Count `model`'s cost_usd (its rows of a trajectory, by `trajectory_field`) against the
    budgets of that trajectory's batch and user, and the day it finished; once per model."""
    if (model, trajectory_field) not in _other_spend:
        _other_spend.append((model, trajectory_field))


def _spent_by(column: str, ids: list[int]) -> dict[int, Decimal]:
    """Spend per batch or user: the trajectories' cost plus the costs registered for them (the
    judge's cost of their reviews)."""
    out: dict[int, Decimal] = {}
    sources = [(Trajectory, column)] + [(model, f"{path}__{column}") for model, path in _other_spend]
    for model, path in sources:
        rows = model.objects.filter(**{f"{path}__in": ids}).order_by().values_list(path).annotate(spent=Sum("cost_usd"))
        for pk, spent in rows:
            out[pk] = out.get(pk, ZERO) + (spent or ZERO)
    return out


def _spent_today() -> Decimal:
    since = _day_start()
    return sum((model.objects.filter(finished_at__gte=since).aggregate(s=Sum("cost_usd"))["s"] or ZERO
                for model in (Trajectory, *(model for model, _ in _other_spend))), ZERO)


def _take_snapshot() -> Snapshot:
    taken_at = time.monotonic()
    running = Task.Status.RUNNING
    budgeted = list(Batch.objects.filter(budget_usd__isnull=False, tasks__status=running).distinct()
                    .values_list("pk", "name", "budget_usd"))
    batches = {pk: budget for pk, _, budget in budgeted}
    names = {pk: name for pk, name, _ in budgeted}
    users = {row.user_id: row for row in UserBudget.objects.filter(user__tasks__status=running).distinct()
             .select_related("user")}
    batch_spend = _spent_by("task__batch_id", list(batches)) if batches else {}
    user_spend = _spent_by("task__created_by_id", list(users)) if users else {}
    cap = _daily_cap()
    day = None
    if cap > 0:
        day = Limit("the daily cap (BUDGET_DAILY_USD)", cap, _spent_today())
    return Snapshot(
        batches={pk: Limit(f"batch {names.get(pk, pk)!r}", budget, batch_spend.get(pk, ZERO))
                 for pk, budget in batches.items()},
        users={pk: Limit(f"user {row.user.get_username()}", row.budget_usd, user_spend.get(pk, ZERO))
               for pk, row in users.items()},
        day=day, day_cap=cap, taken_at=taken_at,
    )


def snapshot(*, max_age_s: float | None = None) -> Snapshot:
    """The process's snapshot, taken again (a few aggregate queries) when older than
    BUDGET_REFRESH_S or when the daily cap setting changed. Synchronous: ORM threads only."""
    global _snapshot
    age = float(settings.BUDGET_REFRESH_S) if max_age_s is None else max_age_s
    current = _snapshot
    if current.taken_at and time.monotonic() - current.taken_at < age and current.day_cap == _daily_cap():
        return current
    with _lock:
        if _snapshot is current:
            _snapshot = _take_snapshot()
        return _snapshot


def cached() -> Snapshot:
    """The last snapshot taken in this process, without I/O (the event loop's read)."""
    return _snapshot


def invalidate() -> None:
    """Forget the snapshot: the next read takes a new one (after a budget changed here)."""
    global _snapshot
    with _lock:
        _snapshot = Snapshot()


def claim_filter() -> Q | None:
    """What `claimable()` leaves out: the queued trajectories whose budgets are spent."""
    return snapshot().blocked()


class EpisodeBudgets:
    """One worker job's budget checks: `check_for(trajectory)` is the agent's `budget_check` for
    that episode. No I/O: the snapshot's stored spend plus the cost so far of this job's episodes
    (an episode that ended counts until a snapshot taken after it has its stored cost). Used on
    the job's event loop only (not thread-safe)."""

    def __init__(self) -> None:
        # pk -> [batch id, user id, cost so far, monotonic time it ended or None]
        self.live: dict[int, list[Any]] = {}

    def check_for(self, trajectory: Trajectory) -> Callable[[Decimal], str]:
        pk, batch_id, user_id = trajectory.pk, trajectory.task.batch_id, trajectory.task.created_by_id
        self.live[pk] = [batch_id, user_id, ZERO, None]

        def check(cost_so_far: Decimal) -> str:
            self.live[pk][2] = Decimal(cost_so_far or 0)
            return self.over(batch_id, user_id)

        return check

    def ended(self, pk: int) -> None:
        if pk in self.live:
            self.live[pk][3] = time.monotonic()

    def _prune(self, snap: Snapshot) -> None:
        for pk in [pk for pk, entry in self.live.items() if entry[3] is not None and entry[3] < snap.taken_at]:
            del self.live[pk]  # its stored cost is in the snapshot now

    def _in_flight(self, index: int | None = None, key: int | None = None) -> Decimal:
        """Cost so far of this job's episodes the snapshot has not stored (of one batch: index 0,
        one user: index 1, or all)."""
        return sum((e[2] for e in self.live.values() if index is None or e[index] == key), ZERO)

    def over(self, batch_id: int | None, user_id: int | None) -> str:
        """Why an episode of this batch and user may not call the model now ("" if it may)."""
        snap = cached()
        self._prune(snap)
        if snap.day is not None and (reason := snap.day.over(self._in_flight())):
            return reason
        if batch_id in snap.batches and (reason := snap.batches[batch_id].over(self._in_flight(0, batch_id))):
            return reason
        if user_id in snap.users and (reason := snap.users[user_id].over(self._in_flight(1, user_id))):
            return reason
        return ""

    def blocked(self) -> Q | None:
        """What this job must not claim although the snapshot may not show it yet: the day, the
        batches and the users its own episodes (running, or ended since the snapshot) spent."""
        snap = cached()
        self._prune(snap)
        if snap.day is not None and snap.day.over(self._in_flight()):
            return Q(pk__isnull=False)
        batches = sorted({e[0] for e in self.live.values() if e[0] in snap.batches
                          and snap.batches[e[0]].over(self._in_flight(0, e[0]))})
        users = sorted({e[1] for e in self.live.values() if e[1] in snap.users
                        and snap.users[e[1]].over(self._in_flight(1, e[1]))})
        terms = [Q(task__batch_id__in=batches)] if batches else []
        terms += [Q(task__created_by_id__in=users)] if users else []
        return _any(terms)


# -- writes ----------------------------------------------------------------------------------


def parse_budget(value: Any, *, field_name: str = "budget_usd") -> Decimal | None:
    """A budget from user input: None / "" (no budget) or a number of dollars >= 0 (a number or a
    decimal string, rounded to a millionth); anything else raises ValidationError naming the field."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValidationError({field_name: ["a budget is a number of US dollars, or null for none"]})
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValidationError({field_name: [f"not a number: {str(value)[:40]!r}"]}) from None
    if not amount.is_finite():
        raise ValidationError({field_name: ["a budget must be a finite number"]})
    if amount < 0:
        raise ValidationError({field_name: ["a budget cannot be negative (null: no budget)"]})
    if amount > MAX_BUDGET:
        raise ValidationError({field_name: [f"at most {MAX_BUDGET}"]})
    return amount.quantize(MICRO, rounding=ROUND_HALF_UP)


def _after_change() -> None:
    invalidate()
    # A raised budget frees queued trajectories: a job now, and one after every process's
    # snapshot has been refreshed (a job elsewhere may still read the old one).
    dispatch_rollouts()
    dispatch_rollouts(delay_s=float(settings.BUDGET_REFRESH_S) + 1)


def batch_set_budget(*, batch: Batch, budget_usd: Any, actor: Any) -> Batch:
    """Set (or with None clear) a batch's cost budget; a repeat of the current value is a no-op."""
    amount = parse_budget(budget_usd)
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch.pk)
        if batch.budget_usd == amount:
            return batch
        before = batch.budget_usd
        batch.budget_usd = amount
        batch.save(update_fields=["budget_usd"])
        audit_record("tasks.batch_budget", actor=actor, target=batch, data={
            "before": None if before is None else str(before), "budget_usd": None if amount is None else str(amount)})
        transaction.on_commit(_after_change)
    return batch


def user_set_budget(*, user: Any, budget_usd: Any, actor: Any) -> UserBudget | None:
    """Set (or with None clear) the cost budget of everything a user's tasks spend."""
    amount = parse_budget(budget_usd)
    with transaction.atomic():
        row = UserBudget.objects.select_for_update().filter(user=user).first()
        before = None if row is None else row.budget_usd
        if before == amount:
            return row
        if amount is None:
            row.delete()
            row = None
        elif row is None:
            row = UserBudget.objects.create(user=user, budget_usd=amount)
        else:
            row.budget_usd = amount
            row.save(update_fields=["budget_usd", "updated_at"])
        audit_record("tasks.user_budget", actor=actor, target=user, data={
            "before": None if before is None else str(before), "budget_usd": None if amount is None else str(amount)})
        transaction.on_commit(_after_change)
    return row
