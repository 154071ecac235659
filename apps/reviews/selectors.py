"""Reads of the review loop shared by the console pages, the admin, commands and the API."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import (Count, Exists, F, FilteredRelation, IntegerField, OuterRef, Q, QuerySet, Subquery, Sum,
                              Value)
from django.db.models.functions import Coalesce, Mod
from django.utils import timezone

from apps.reviews.models import BatchTally, Proposal, Review, ReviewAssignment, ReviewClaim, ReviewerTally
from apps.tasks.budgets import MICRO, ZERO
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.selectors import (  # noqa: F401 (the task states, read here by the pages)
    NOT_STARTED, STATE_FILTERS, STATE_LABELS, TASK_STATES, batch_state_counts,
)


def stale_before() -> Any:
    """Pending proposals created before this are flagged stale (REVIEW_STALE_PROPOSAL_HOURS)."""
    return timezone.now() - timedelta(hours=settings.REVIEW_STALE_PROPOSAL_HOURS)


def pending_proposals(*, tier: str | None = None, scene: str | None = None, batch: int | None = None,
                      older_than_hours: float | None = None, stale: bool = False,
                      task: int | None = None) -> QuerySet[Proposal]:
    """Pending proposals, oldest first, with what the queue shows joined in (no per-row queries)."""
    proposals = (Proposal.objects.filter(status=Proposal.Status.PENDING)
                 .select_related("task", "task__batch", "proposed_by").order_by("created_at", "id"))
    if tier:
        proposals = proposals.filter(tier=tier)
    if scene:
        proposals = proposals.filter(task__scene=scene)
    if batch:
        proposals = proposals.filter(task__batch_id=batch)
    if task:
        proposals = proposals.filter(task_id=task)
    if older_than_hours:
        proposals = proposals.filter(created_at__lt=timezone.now() - timedelta(hours=older_than_hours))
    if stale:
        proposals = proposals.filter(created_at__lt=stale_before())
    return proposals


def latest_auto_review(trajectory: Trajectory) -> Review | None:
    return Review.objects.filter(trajectory=trajectory, kind=Review.Kind.AUTO).first()


def human_reviews(trajectory: Trajectory) -> QuerySet[Review]:
    return Review.objects.filter(trajectory=trajectory, kind=Review.Kind.HUMAN).select_related("reviewer")


def latest_human_verdicts(trajectory_ids: Any) -> dict[int, str]:
    """trajectory id -> the verdict of its latest human review (the datasets app's rule)."""
    latest = (Review.objects.filter(trajectory=OuterRef("trajectory"), kind=Review.Kind.HUMAN)
              .order_by("-created_at", "-id").values("pk")[:1])
    rows = (Review.objects.filter(trajectory_id__in=trajectory_ids, kind=Review.Kind.HUMAN, pk=Subquery(latest))
            .values_list("trajectory_id", "verdict"))
    return dict(rows)


# -- iteration history ------------------------------------------------------------------------------


@dataclass
class Iteration:
    number: int
    config: dict[str, Any]
    trajectories: list[Trajectory] = field(default_factory=list)
    reviews: dict[int, Review] = field(default_factory=dict)
    proposals: list[Proposal] = field(default_factory=list)
    diff: list[tuple[str, Any, Any]] = field(default_factory=list)  # (field, before, after) vs previous

    @property
    def score(self) -> float | None:
        scored = [r.overall for r in self.reviews.values() if r.overall is not None]
        return round(sum(scored) / len(scored), 1) if scored else None


SNAPSHOT_ORDER = ("model", "temperature", "top_p", "max_steps", "step_timeout_s", "timeout_s", "max_tokens",
                  "system_prompt_extra", "prompt", "expected_tools", "scene_config", "quality_threshold",
                  "samples_per_iteration")


def iteration_history(task: Task) -> list[Iteration]:
    """Every iteration of the task: the config snapshot it ran with (and what changed from the
    one before), its trajectories with their automatic reviews, and the proposals its review
    made with their decisions. Three queries, whatever the number of iterations."""
    trajectories = list(
        Trajectory.objects.filter(task=task).order_by("iteration", "sample_index")
        .only("pk", "task_id", "iteration", "sample_index", "status", "outcome", "outcome_reason", "reward",
              "config_snapshot", "model", "total_tokens", "created_at")
    )
    reviews = {r.trajectory_id: r for r in Review.objects.filter(
        trajectory__task=task, kind=Review.Kind.AUTO).only(
        "pk", "trajectory_id", "status", "overall", "error", "judge_model", "scores", "checks")}
    proposals = list(Proposal.objects.filter(task=task).select_related("decided_by").order_by("iteration", "id"))
    iterations: dict[int, Iteration] = {}
    for trajectory in trajectories:
        it = iterations.setdefault(trajectory.iteration, Iteration(trajectory.iteration, trajectory.config_snapshot or {}))
        it.trajectories.append(trajectory)
        if trajectory.pk in reviews:
            it.reviews[trajectory.pk] = reviews[trajectory.pk]
    for proposal in proposals:
        iterations.setdefault(proposal.iteration, Iteration(proposal.iteration, {})).proposals.append(proposal)
    ordered = [iterations[n] for n in sorted(iterations)]
    previous: dict[str, Any] | None = None
    for it in ordered:
        if previous is not None and it.config:
            keys = [k for k in SNAPSHOT_ORDER if k in it.config or k in previous]
            keys += sorted((set(it.config) | set(previous)) - set(keys))
            it.diff = [(k, previous.get(k), it.config.get(k)) for k in keys if previous.get(k) != it.config.get(k)]
        if it.config:
            previous = it.config
    return ordered


# -- batches ----------------------------------------------------------------------------------------


def batch_progress(batches: list[Batch]) -> dict[int, dict[str, int]]:
    """batch id -> task count per state (apps.tasks.selectors.TASK_STATES) for these batches."""
    return batch_state_counts([b.pk for b in batches])


def batch_pending_proposals(batches: list[Batch]) -> dict[int, int]:
    rows = (Proposal.objects.filter(task__batch_id__in=[b.pk for b in batches], status=Proposal.Status.PENDING)
            .order_by().values_list("task__batch_id").annotate(n=Count("id")))
    return dict(rows)


# -- judge-human agreement ------------------------------------------------------------------------------


@dataclass
class Agreement:
    dimension: str
    pairs: int
    agree: int
    rate: float | None
    kappa: float | None
    judge_accepts: int
    human_accepts: int


def cohen_kappa(pairs: list[tuple[bool, bool]]) -> float | None:
    """Cohen's kappa of two raters' binary labels; None when it is undefined (chance agreement 1)."""
    n = len(pairs)
    if not n:
        return None
    observed = sum(a == b for a, b in pairs) / n
    p_a = sum(a for a, _ in pairs) / n
    p_b = sum(b for _, b in pairs) / n
    expected = p_a * p_b + (1 - p_a) * (1 - p_b)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1 - expected)


# The agreement page reads the latest AGREEMENT_WINDOW human verdicts, not every one: a bounded read
# at any size (every judge-human pair took 1.35 s at 100k trajectories, 5.3 s at 1M on PostgreSQL),
# and the page says so. 2,000 verdicts put kappa's standard error near 0.02.
AGREEMENT_WINDOW = 2_000


def review_pairs(trajectories: QuerySet[Trajectory] | None = None, *, window: int = AGREEMENT_WINDOW,
                 ) -> tuple[list[tuple[dict[str, Any], float | None, str]], int]:
    """(judge scores, judge overall, latest human verdict) per trajectory of the latest `window`
    human verdicts that has a scored automatic review, and how many verdicts were read (== window
    when older ones were left out). Two queries: the newest verdicts by the (kind, status,
    created_at) index, then those trajectories' automatic reviews."""
    humans = Review.objects.filter(kind=Review.Kind.HUMAN, status=Review.Status.DONE)
    if trajectories is not None:
        humans = humans.filter(trajectory__in=trajectories)
    recent = list(humans.order_by("-created_at", "-id").values_list("trajectory_id", "verdict")[:window])
    latest: dict[int, str] = {}
    for trajectory_id, verdict in recent:  # newest first: a trajectory's first one is its latest
        latest.setdefault(trajectory_id, verdict)
    autos = Review.objects.filter(kind=Review.Kind.AUTO, status=Review.Status.DONE, trajectory_id__in=list(latest))
    pairs = [(scores or {}, overall, latest[trajectory_id])
             for trajectory_id, scores, overall in autos.values_list("trajectory_id", "scores", "overall")]
    return pairs, len(recent)


def judge_human_agreement(trajectories: QuerySet[Trajectory] | None = None, threshold: float | None = None,
                          *, window: int = AGREEMENT_WINDOW) -> tuple[list[Agreement], int]:
    """Per rubric dimension (and "overall"): how often the judge and the latest human verdict agree
    on accept vs reject. The judge accepts a dimension when its score is >= threshold
    (REVIEW_QUALITY_THRESHOLD); the human accepts on "accept" ("reject" and "needs_fix" are
    not accepts). Agreement rate and Cohen's kappa over the trajectories having both, among those
    of the latest `window` human verdicts; returns the table and how many verdicts it read."""
    threshold = settings.REVIEW_QUALITY_THRESHOLD if threshold is None else threshold
    by_dimension: dict[str, list[tuple[bool, bool]]] = {}
    pairs_read, verdicts = review_pairs(trajectories, window=window)
    for scores, overall, human in pairs_read:
        accepted = human == Review.Verdict.ACCEPT
        if overall is not None:
            by_dimension.setdefault("overall", []).append((overall >= threshold, accepted))
        for name, entry in scores.items():
            score = entry.get("score") if isinstance(entry, dict) else None
            if isinstance(score, (int, float)):
                by_dimension.setdefault(name, []).append((score >= threshold, accepted))
    table = []
    for name in sorted(by_dimension, key=lambda d: (d != "overall", d)):
        pairs = by_dimension[name]
        agree = sum(a == b for a, b in pairs)
        table.append(Agreement(
            dimension=name, pairs=len(pairs), agree=agree, rate=agree / len(pairs) if pairs else None,
            kappa=cohen_kappa(pairs), judge_accepts=sum(a for a, _ in pairs), human_accepts=sum(b for _, b in pairs),
        ))
    return table, verdicts


def queue_counts() -> dict[str, int]:
    """Pending proposals by tier, and how many are stale; one query."""
    return Proposal.objects.filter(status=Proposal.Status.PENDING).aggregate(
        total=Count("id"),
        yellow=Count("id", filter=Q(tier=Proposal.Tier.YELLOW)),
        red=Count("id", filter=Q(tier=Proposal.Tier.RED)),
        stale=Count("id", filter=Q(created_at__lt=stale_before())),
    )


# -- the human review queue -------------------------------------------------------------------------

AUDIT_BUCKETS = 1000
JUDGE_VERDICTS = {"below": "judge: below the threshold", "accepted": "judge: accepted (sampled audit)",
                  "failed": "judge failed"}


def _count(queryset: QuerySet[Any], column: str, *, distinct: bool = False) -> Any:
    rows = queryset.order_by().values("trajectory").annotate(n=Count(column, distinct=distinct)).values("n")
    return Coalesce(Subquery(rows, output_field=IntegerField()), Value(0))


UNASSIGNED = "nobody"  # the assignee facet's "assigned to nobody"
NO_VERDICT = "none"  # the verdict facet's "no human verdict yet"


def human_queue(*, reviewer: Any = None, batch: int | None = None, scene: str | None = None,
                score_min: float | None = None, score_max: float | None = None, check: str | None = None,
                judge: str | None = None, include_done: bool = False, model: str | None = None,
                outcome: str | None = None, verdict: str | None = None, judged_by: Any = None,
                assignee: Any = None, iteration: int | None = None) -> QuerySet[Trajectory]:
    """Trajectories awaiting a human verdict, oldest first, one query (correlated subqueries, no per-row reads).

    In the queue: finished trajectories of their task's current iteration whose automatic review
    is done or failed, and whose judge did not accept (score below the task's threshold, or no
    score) -- plus a sampled audit of the accepted ones (REVIEW_AUDIT_SHARE, by a hash of the id) --
    until they hold REVIEW_REVIEWERS_PER_ITEM distinct human verdicts. Annotated: score, judge_status,
    audit (sampled), verdicts, holds (unexpired claims), open_slots. With `reviewer`, items they
    judged and items they released within the claim time (skipped) are left out; with
    `include_done`, items that hold all their verdicts stay in (progress counts).

    Facets: model, outcome, iteration; `verdict` the latest human verdict (or NO_VERDICT);
    `judged_by` a person who gave a verdict on it; `assignee` a person it is actively assigned to
    (or UNASSIGNED). A verdict value or `judged_by` asks for decided items: those stay in whatever
    their verdict count, and `reviewer` does not hide the ones they judged. An active assignment
    holds a slot as an unexpired claim does (`holds` counts each person once)."""
    now = timezone.now()
    per_item = max(1, settings.REVIEW_REVIEWERS_PER_ITEM)
    audit_buckets = round(min(max(settings.REVIEW_AUDIT_SHARE, 0.0), 1.0) * AUDIT_BUCKETS)
    auto = Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.AUTO)
    humans = Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.HUMAN)
    assignments = ReviewAssignment.objects.filter(trajectory=OuterRef("pk"), status=ReviewAssignment.Status.ACTIVE)
    # an assignee's own claim is the slot their assignment holds: counted once
    holds = ReviewClaim.objects.filter(trajectory=OuterRef("pk"), status=ReviewClaim.Status.ACTIVE, expires_at__gt=now
                                       ).exclude(Exists(ReviewAssignment.objects.filter(
                                           trajectory=OuterRef("trajectory"), assignee=OuterRef("reviewer"),
                                           status=ReviewAssignment.Status.ACTIVE)))
    queue = (
        Trajectory.objects.filter(status=Trajectory.Status.FINISHED, iteration=F("task__current_iteration"))
        .select_related("task", "task__batch")
        .annotate(score=Subquery(auto.values("overall")[:1]), judge_status=Subquery(auto.values("status")[:1]),
                  verdicts=_count(humans, "reviewer", distinct=True),
                  holds=_count(holds, "id") + _count(assignments, "id"),
                  bucket=Mod(F("id") * 7919, AUDIT_BUCKETS))
        .annotate(audit=Q(score__gte=F("task__quality_threshold")),
                  open_slots=Value(per_item) - F("verdicts") - F("holds"))
        .filter(judge_status__in=[Review.Status.DONE, Review.Status.JUDGE_FAILED])
        .filter(Q(score__isnull=True) | Q(score__lt=F("task__quality_threshold")) | Q(bucket__lt=audit_buckets))
        .order_by("id")
    )
    decided = verdict in Review.Verdict.values or judged_by is not None
    if not include_done and not decided:
        queue = queue.filter(verdicts__lt=per_item)
    if reviewer is not None and not decided:
        skipped = ReviewClaim.objects.filter(
            trajectory=OuterRef("pk"), reviewer=reviewer, status=ReviewClaim.Status.RELEASED,
            ended_at__gt=now - timedelta(minutes=settings.REVIEW_CLAIM_MINUTES))
        queue = queue.exclude(Exists(humans.filter(reviewer=reviewer))).exclude(Exists(skipped))
    facets = {"task__batch_id": batch, "task__scene": scene, "score__gte": score_min, "score__lte": score_max,
              "model": model, "outcome": outcome, "iteration": iteration}
    queue = queue.filter(**{lookup: value for lookup, value in facets.items() if value not in (None, "")})
    if check:
        queue = queue.filter(Exists(Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.AUTO,
                                                          **{f"checks__{check}__fired": True})))
    if judge == "below":
        queue = queue.filter(score__lt=F("task__quality_threshold"))
    elif judge == "accepted":
        queue = queue.filter(score__gte=F("task__quality_threshold"))
    elif judge == "failed":
        queue = queue.filter(judge_status=Review.Status.JUDGE_FAILED)
    if verdict == NO_VERDICT:
        queue = queue.exclude(Exists(humans))
    elif verdict:
        queue = queue.annotate(latest_verdict=Subquery(
            humans.order_by("-created_at", "-id").values("verdict")[:1])).filter(latest_verdict=verdict)
    # a person's verdicts and assignments are few beside the queue: looked up from their side
    if judged_by is not None:
        queue = queue.filter(pk__in=Review.objects.filter(kind=Review.Kind.HUMAN, reviewer=judged_by)
                             .values("trajectory_id"))
    if assignee == UNASSIGNED:
        queue = queue.exclude(Exists(assignments))
    elif assignee is not None:
        queue = queue.filter(pk__in=ReviewAssignment.objects.filter(
            assignee=assignee, status=ReviewAssignment.Status.ACTIVE).values("trajectory_id"))
    return queue


def human_queue_size() -> int:
    return human_queue().count()


def reviewer_progress(reviewer: Any) -> dict[str, int]:
    """The reviewer's verdicts: in total and since midnight (local time); one query."""
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    return Review.objects.filter(kind=Review.Kind.HUMAN, reviewer=reviewer).aggregate(
        total=Count("id"), today=Count("id", filter=Q(created_at__gte=midnight)))


def batch_review_progress(batch_id: int) -> dict[str, int]:
    """A batch's human review: trajectories the queue routes to people, how many hold all their verdicts."""
    per_item = max(1, settings.REVIEW_REVIEWERS_PER_ITEM)
    counts = human_queue(batch=batch_id, include_done=True).order_by().aggregate(total=Count("id"), done=Count("id", filter=Q(verdicts__gte=per_item)))
    counts["left"] = counts["total"] - counts["done"]
    return counts


# -- spend and acceptance of a batch (the console, the admin, the API) ------------------------


def accepted_q() -> Q:
    """Accepted trajectories: a human verdict "accept" where a human reviewed it, else a success."""
    human = Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.HUMAN, status=Review.Status.DONE)
    return Q(Exists(human.filter(verdict=Review.Verdict.ACCEPT))) | (
        ~Q(Exists(human)) & Q(outcome=Trajectory.Outcome.SUCCESS))


def batch_sums(batch_id: int) -> tuple[Decimal, Decimal, int]:
    """A batch's stored spend (top-level trajectories — sub-episodes are in their parent's cost —
    plus the judge's calls), the judge's part, and its accepted trajectories; exact, three queries
    over every trajectory of the batch (the batch tally job's count; the API and the admin)."""
    rows = Trajectory.objects.filter(task__batch_id=batch_id)
    judge = Review.objects.filter(trajectory__task__batch_id=batch_id).aggregate(s=Sum("cost_usd"))["s"] or ZERO
    spent = (rows.aggregate(s=Sum("cost_usd"))["s"] or ZERO) + judge
    return spent, judge, rows.filter(accepted_q()).count()


def spend_of(budget: Decimal | None, spent: Decimal, judge: Decimal, accepted: int) -> dict[str, Any]:
    """The budget, spend, what is left, accepted trajectories and the cost per accepted one (decimals as strings)."""

    def money(value: Decimal | None) -> str | None:
        return None if value is None else str(value.quantize(MICRO))

    return {
        "budget_usd": money(budget),
        "spent_usd": money(spent),
        "judge_usd": money(judge),
        "remaining_usd": None if budget is None else money(max(ZERO, budget - spent)),
        "over_budget": budget is not None and spent >= budget,
        "accepted": accepted,
        "cost_per_accepted_usd": money(spent / accepted) if accepted else None,
    }


def batch_spend(batch: Batch) -> dict[str, Any]:
    """A batch's budget and spend, counted now (batch_sums; spend_of's fields)."""
    return spend_of(batch.budget_usd, *batch_sums(batch.pk))


def batch_tally(batch_id: int) -> BatchTally | None:
    """The batch's counts as the workers last made them (apps.reviews.tallies), None before the first."""
    return BatchTally.objects.filter(batch_id=batch_id).first()


def tally_spend(batch: Batch, tally: BatchTally) -> dict[str, Any]:
    """spend_of's fields from the batch's tally, with computed_at: the batch page's spend line."""
    return {**spend_of(batch.budget_usd, tally.spent_usd, tally.judge_usd, tally.accepted),
            "computed_at": tally.computed_at}


def tally_review_progress(tally: BatchTally | None) -> dict[str, Any] | None:
    """batch_review_progress's fields from a tally, with computed_at; None without a tally."""
    if tally is None:
        return None
    return {"total": tally.review_total, "done": tally.review_done, "left": tally.review_total - tally.review_done,
            "computed_at": tally.computed_at}


# -- facets' choices, assignments and the team page -------------------------------------------------

SUGGESTIONS = 20


def batch_names(text: str) -> list[str]:
    """Up to SUGGESTIONS batch names containing the text (case-insensitive), newest batch first."""
    text = text.strip()[:200]
    batches = Batch.objects.filter(name__icontains=text) if text else Batch.objects.all()
    return list(batches.order_by("-created_at", "-id").values_list("name", flat=True)[:SUGGESTIONS])


def model_names(text: str) -> list[str]:
    """Up to SUGGESTIONS model names trajectories ran with that start with the text, in order."""
    text = text.strip()[:200]
    rows = Trajectory.objects.exclude(model="")
    if text:
        rows = rows.filter(model__istartswith=text)
    return list(rows.order_by("model").values_list("model", flat=True).distinct()[:SUGGESTIONS])


def reviewers() -> QuerySet[Any]:
    """The active people who may give verdicts (the reviewers' queue owners), by username; one query."""
    perm = Q(groups__permissions__codename="add_review", groups__permissions__content_type__app_label="reviews") | Q(
        user_permissions__codename="add_review", user_permissions__content_type__app_label="reviews")
    return (get_user_model().objects.filter(perm | Q(is_superuser=True), is_active=True)
            .distinct().order_by("username"))


def assignees(trajectory_ids: list[int]) -> dict[int, list[str]]:
    """trajectory id -> the usernames it is actively assigned to; one query."""
    found: dict[int, list[str]] = {}
    for trajectory_id, name in (ReviewAssignment.objects.filter(trajectory_id__in=trajectory_ids,
                                                                 status=ReviewAssignment.Status.ACTIVE)
                                .order_by("id").values_list("trajectory_id", "assignee__username")):
        found.setdefault(trajectory_id, []).append(name)
    return found


TEAM_DAYS = 14


@dataclass
class ReviewerCounts:
    """One person's human verdicts counted now (team_counts): what a ReviewerTally row stores."""

    today: int = 0
    week: int = 0
    total: int = 0
    accepts: int = 0
    per_day: list[int] = field(default_factory=list)
    both_accept: int = 0
    judge_accepts_only: int = 0
    human_accepts_only: int = 0
    both_reject: int = 0


@dataclass
class TeamRow(ReviewerCounts):
    """One reviewer on the team page: their counted verdicts, and their assignments and claims now."""

    user_id: int = 0
    username: str = ""
    open_assigned: int = 0
    done_assigned: int = 0
    claims: int = 0

    @property
    def acceptance(self) -> float | None:
        return self.accepts / self.total if self.total else None

    @property
    def pairs(self) -> int:
        return self.both_accept + self.judge_accepts_only + self.human_accepts_only + self.both_reject

    @property
    def agree(self) -> int:
        return self.both_accept + self.both_reject

    @property
    def agreement(self) -> float | None:
        return self.agree / self.pairs if self.pairs else None

    @property
    def kappa(self) -> float | None:
        return cohen_kappa([(True, True)] * self.both_accept + [(True, False)] * self.judge_accepts_only
                           + [(False, True)] * self.human_accepts_only + [(False, False)] * self.both_reject)


COUNTED = ("today", "week", "total", "accepts", "both_accept", "judge_accepts_only", "human_accepts_only",
           "both_reject")


def team_counts(*, days: int = TEAM_DAYS, threshold: float | None = None) -> dict[int, ReviewerCounts]:
    """reviewer id -> their done human verdicts today, in the last 7 days and in all, per day over
    the last `days` days (local dates, oldest first), their accepts, and their latest verdict per
    trajectory that the judge scored crossed with the judge's accept (overall >= threshold,
    REVIEW_QUALITY_THRESHOLD, as on the agreement page). Exact, over every human verdict: the team
    tally job's count (apps.reviews.tallies), not a page's read. Two queries."""
    threshold = settings.REVIEW_QUALITY_THRESHOLD if threshold is None else threshold
    tz = timezone.get_current_timezone()
    today = timezone.localdate()
    midnight = timezone.make_aware(datetime.combine(today, time.min), tz)
    dates = [today - timedelta(days=n) for n in range(days - 1, -1, -1)]
    found: dict[int, ReviewerCounts] = {}
    humans = Review.objects.filter(kind=Review.Kind.HUMAN, status=Review.Status.DONE).order_by()
    # one count per local day, by time range (no per-row date conversion), in the same grouped query
    starts = [timezone.make_aware(datetime.combine(d, time.min), tz) for d in dates]
    ends = [*starts[1:], midnight + timedelta(days=1)]
    per_day = {f"day{n}": Count("id", filter=Q(created_at__gte=a, created_at__lt=b))
               for n, (a, b) in enumerate(zip(starts, ends))}
    counts = humans.values("reviewer_id").annotate(
        total=Count("id"), accepts=Count("id", filter=Q(verdict=Review.Verdict.ACCEPT)),
        week=Count("id", filter=Q(created_at__gte=midnight - timedelta(days=6))), **per_day)
    for c in counts:
        days_counts = [c[f"day{n}"] for n in range(days)]
        found[c["reviewer_id"]] = ReviewerCounts(today=days_counts[-1], week=c["week"], total=c["total"],
                                                 accepts=c["accepts"], per_day=days_counts)
    latest = humans.exclude(Exists(Review.objects.filter(
        trajectory=OuterRef("trajectory"), reviewer=OuterRef("reviewer"), kind=Review.Kind.HUMAN,
        created_at__gt=OuterRef("created_at"))))
    judged = Q(auto__overall__isnull=False)
    judge_yes, human_yes = Q(auto__overall__gte=threshold), Q(verdict=Review.Verdict.ACCEPT)
    tables = (latest.annotate(auto=FilteredRelation("trajectory__reviews", condition=Q(
        trajectory__reviews__kind=Review.Kind.AUTO, trajectory__reviews__status=Review.Status.DONE)))
        .values("reviewer_id").annotate(
            both_accept=Count("id", filter=judged & judge_yes & human_yes),
            judge_accepts_only=Count("id", filter=judged & judge_yes & ~human_yes),
            human_accepts_only=Count("id", filter=judged & ~judge_yes & human_yes),
            both_reject=Count("id", filter=judged & ~judge_yes & ~human_yes)))
    for t in tables:
        row = found.setdefault(t["reviewer_id"], ReviewerCounts(per_day=[0] * days))
        row.both_accept, row.judge_accepts_only = t["both_accept"], t["judge_accepts_only"]
        row.human_accepts_only, row.both_reject = t["human_accepts_only"], t["both_reject"]
    return found


def team(*, days: int = TEAM_DAYS) -> tuple[list[TeamRow], list[Any], datetime | None]:
    """Per reviewer (the current ones and anyone counted with a verdict): the team tally's verdicts
    today, in the last 7 days and in all, per day over the last `days` days, the acceptance rate,
    agreement with the judge and Cohen's kappa over each of their latest verdicts per trajectory
    that the judge scored (ReviewerTally, as of its computed_at) -- and, read now, their open / done
    assignments and held claims. Returns (rows by username, the tally's dates, when it counted;
    None before its first count, the dates then ending today). Four queries, whatever the team's
    size or the number of verdicts."""
    rows = {u.pk: TeamRow(user_id=u.pk, username=u.get_username()) for u in reviewers()}
    counted_at, last_day = None, timezone.localdate()
    for tally in ReviewerTally.objects.select_related("reviewer").order_by():
        row = rows.setdefault(tally.reviewer_id, TeamRow(user_id=tally.reviewer_id,
                                                         username=tally.reviewer.get_username()))
        for name in COUNTED:
            setattr(row, name, getattr(tally, name))
        row.per_day = (list(tally.per_day) + [0] * days)[:days]
        counted_at, last_day = tally.computed_at, tally.day  # one job run writes every row with one time
    dates = [last_day - timedelta(days=n) for n in range(days - 1, -1, -1)]
    for a in (ReviewAssignment.objects.order_by().values("assignee_id").annotate(
            open=Count("id", filter=Q(status=ReviewAssignment.Status.ACTIVE)),
            done=Count("id", filter=Q(status=ReviewAssignment.Status.DONE)))):
        if a["assignee_id"] in rows:
            rows[a["assignee_id"]].open_assigned, rows[a["assignee_id"]].done_assigned = a["open"], a["done"]
    for reviewer_id, n in (ReviewClaim.objects.filter(status=ReviewClaim.Status.ACTIVE, expires_at__gt=timezone.now())
                           .order_by().values_list("reviewer_id").annotate(n=Count("id"))):
        if reviewer_id in rows:
            rows[reviewer_id].claims = n
    for row in rows.values():
        row.per_day = row.per_day or [0] * days
    return sorted(rows.values(), key=lambda r: r.username), dates, counted_at
