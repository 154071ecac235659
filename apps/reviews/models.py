"""Reviews of trajectories, and proposals that change a task's config for its next iteration."""
from __future__ import annotations

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q


class Review(models.Model):
    """An automatic (check + LLM judge) or human review of one trajectory; scores 0-100."""

    class Kind(models.TextChoices):
        AUTO = "auto", "automatic"
        HUMAN = "human", "human"

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        DONE = "done", "done"
        JUDGE_FAILED = "judge_failed", "judge failed"

    class Verdict(models.TextChoices):
        ACCEPT = "accept", "accept"
        REJECT = "reject", "reject"
        NEEDS_FIX = "needs_fix", "needs fix"

    trajectory = models.ForeignKey("tasks.Trajectory", on_delete=models.CASCADE, related_name="reviews")
    kind = models.CharField(max_length=10, choices=Kind.choices, db_index=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING, db_index=True)
    scores = models.JSONField(default=dict, blank=True, help_text="dimension -> {score 0-100, rationale}")
    checks = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder, help_text="deterministic checks")
    overall = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(100.0)]
    )
    verdict = models.CharField(max_length=10, choices=Verdict.choices, blank=True, db_index=True)
    rationale = models.TextField(blank=True)
    judge_model = models.CharField(max_length=200, blank=True)
    rubric_version = models.CharField(max_length=40, blank=True)
    judge_prompt = models.TextField(blank=True)
    judge_raw = models.TextField(blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0, help_text="judge calls made for this review")
    cost_usd = models.DecimalField(
        max_digits=12, decimal_places=6, default=0,
        help_text="what the judge's calls for this review cost (every attempt); counted in the budgets' spend")
    suggestions = models.JSONField(
        default=list, blank=True, encoder=DjangoJSONEncoder,
        help_text="the judge's suggested changes, as given; the server-side policy decides their tier",
    )
    step_flags = models.JSONField(
        default=list, blank=True, encoder=DjangoJSONEncoder,
        help_text="human verdicts: [{step: index, note: text}] for the steps the reviewer flagged",
    )
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="reviews"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(overall__isnull=True) | Q(overall__gte=0, overall__lte=100), name="review_overall_0_100"
            ),
            models.CheckConstraint(
                condition=~Q(kind="human") | Q(reviewer__isnull=False), name="review_human_has_reviewer"
            ),
            # A failed judge never carries an invented score.
            models.CheckConstraint(
                condition=~Q(status="judge_failed") | Q(overall__isnull=True), name="review_judge_failed_no_score"
            ),
            # One automatic review per trajectory: a judge retry updates it, a second job finds it.
            models.UniqueConstraint(fields=["trajectory"], condition=Q(kind="auto"), name="review_one_auto_per_trajectory"),
        ]
        indexes = [
            models.Index(fields=["trajectory", "-created_at"], name="review_trajectory_idx"),
            models.Index(fields=["kind", "status", "created_at"], name="review_kind_status_idx"),
            models.Index(fields=["finished_at"], name="review_finished_idx"),  # the daily budget's sum
        ]

    def __str__(self) -> str:
        score = "-" if self.overall is None else f"{self.overall:.0f}"
        return f"{self.get_kind_display()} review #{self.pk} of trajectory {self.trajectory_id} ({score})"


class Proposal(models.Model):
    """A change to one field of a task's config for its next iteration, gated by a risk tier."""

    class Tier(models.TextChoices):
        GREEN = "green", "green (applied automatically)"
        YELLOW = "yellow", "yellow (a reviewer picks an option)"
        RED = "red", "red (an approver signs off)"

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        APPLIED = "applied", "applied automatically"
        APPROVED = "approved", "approved"
        REJECTED = "rejected", "rejected"
        SUPERSEDED = "superseded", "superseded"

    FINAL = frozenset({Status.APPLIED, Status.APPROVED, Status.REJECTED, Status.SUPERSEDED})

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="proposals")
    review = models.ForeignKey(Review, null=True, blank=True, on_delete=models.SET_NULL, related_name="proposals")
    iteration = models.PositiveSmallIntegerField(help_text="the iteration whose review proposed it")
    field = models.CharField(max_length=100, help_text="the task config field it changes")
    from_value = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    to_value = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    options = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder, help_text="yellow: 2-4 options")
    tier = models.CharField(max_length=10, choices=Tier.choices, db_index=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING, db_index=True)
    rationale = models.TextField(blank=True)
    impact_note = models.TextField(blank=True, help_text="red: what signing off changes")
    proposer = models.CharField(max_length=100, help_text="e.g. review-agent, rule:max_steps, or a username")
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="proposals",
        help_text="the person who proposed it (empty: the review agent)",
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="decided_proposals"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    chosen_option = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [
            ("decide_yellow_proposal", "Can decide yellow-tier proposals"),
            ("decide_red_proposal", "Can sign off red-tier proposals"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=~Q(status__in=["approved", "rejected"]) | Q(decided_by__isnull=False, decided_at__isnull=False),
                name="proposal_decided_has_decider",
            ),
            models.CheckConstraint(
                condition=~Q(status="applied") | Q(tier="green"), name="proposal_only_green_auto_applied"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "tier", "created_at"], name="proposal_queue_idx"),
            models.Index(fields=["task", "iteration"], name="proposal_task_iter_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tier} proposal #{self.pk}: {self.field} on task {self.task_id}"


class PolicyRule(models.Model):
    """The risk tier of a change to one task config field: the server's policy, not the judge's.

    A change whose new value lies within [min_value, max_value] (numbers) and, when
    `allowed_values` is set, among them, gets `tier`; outside the bounds it gets
    `out_of_bounds_tier` ("refuse" drops it). A field without an enabled rule is never changed.
    """

    class Tier(models.TextChoices):
        GREEN = "green", "green (applied automatically)"
        YELLOW = "yellow", "yellow (a reviewer picks an option)"
        RED = "red", "red (an approver signs off)"
        REFUSE = "refuse", "refuse (never proposed)"

    field = models.CharField(
        max_length=100, unique=True,
        help_text="task field (temperature, max_steps, prompt, ...) or scene_config.KEY",
    )
    tier = models.CharField(max_length=10, choices=Tier.choices)
    min_value = models.FloatField(null=True, blank=True)
    max_value = models.FloatField(null=True, blank=True)
    allowed_values = models.JSONField(
        default=list, blank=True, encoder=DjangoJSONEncoder, help_text="when set, the only values allowed"
    )
    out_of_bounds_tier = models.CharField(max_length=10, choices=Tier.choices, default=Tier.REFUSE)
    impact_note = models.TextField(blank=True, help_text="shown to whoever decides (red: what signing off changes)")
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["field"]
        constraints = [
            models.CheckConstraint(condition=Q(tier__in=["green", "yellow", "red", "refuse"]), name="policyrule_tier_valid"),
            models.CheckConstraint(
                condition=Q(min_value__isnull=True) | Q(max_value__isnull=True) | Q(min_value__lte=models.F("max_value")),
                name="policyrule_bounds_ordered",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.field}: {self.tier}"


class ReviewClaim(models.Model):
    """A reviewer's reservation of one trajectory in the human review queue (issue 28).

    A trajectory takes REVIEW_REVIEWERS_PER_ITEM distinct human verdicts; each active claim holds
    one of those slots until it expires (REVIEW_CLAIM_MINUTES), is released, or ends in a verdict.
    The partial unique constraints are the compare-and-swap: two reviewers taking the last free
    slot at once insert the same (trajectory, slot) and one of them fails.
    """

    class Status(models.TextChoices):
        ACTIVE = "active", "active"
        RELEASED = "released", "released"
        DONE = "done", "verdict recorded"
        EXPIRED = "expired", "expired"

    trajectory = models.ForeignKey("tasks.Trajectory", on_delete=models.CASCADE, related_name="review_claims")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="review_claims")
    slot = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE, db_index=True)
    claimed_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-claimed_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["trajectory", "slot"], condition=Q(status="active"),
                                    name="reviewclaim_one_active_per_slot"),
            models.UniqueConstraint(fields=["trajectory", "reviewer"], condition=Q(status="active"),
                                    name="reviewclaim_one_active_per_reviewer"),
        ]
        indexes = [models.Index(fields=["reviewer", "status", "expires_at"], name="reviewclaim_reviewer_idx")]

    def __str__(self) -> str:
        return f"claim #{self.pk} of trajectory {self.trajectory_id} by {self.reviewer_id} ({self.status})"



class Preference(models.Model):
    """A person's pick between two finished rollouts of one task: `chosen` over `rejected`.

    The DPO exporters take the latest recorded preference of a task ahead of their automatic
    pairing (apps/datasets/exporters/dpo.py), with the reviewer and time in the pair's metadata."""

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="preferences")
    chosen = models.ForeignKey("tasks.Trajectory", on_delete=models.CASCADE, related_name="preferred_in")
    rejected = models.ForeignKey("tasks.Trajectory", on_delete=models.CASCADE, related_name="dispreferred_in")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="preferences")
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=~Q(chosen=models.F("rejected")), name="preference_two_trajectories"),
        ]

    def __str__(self) -> str:
        return f"preference #{self.pk}: {self.chosen_id} over {self.rejected_id}"


class Correction(models.Model):
    """A reviewer's edit of a trajectory (a thought, the final answer, dropped steps): `corrected` is a
    new trajectory; `original` is never changed. `diff` lists each edit with its before and after."""

    original = models.ForeignKey("tasks.Trajectory", on_delete=models.PROTECT, related_name="corrections")
    corrected = models.OneToOneField("tasks.Trajectory", on_delete=models.PROTECT, related_name="correction_of")
    editor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="corrections")
    diff = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder,
                            help_text="[{edit: thought|final_answer|drop_step, step?, before, after}]")
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"correction #{self.pk}: trajectory {self.original_id} -> {self.corrected_id}"


class ReviewAssignment(models.Model):
    """An approver's assignment of one review queue item to a named reviewer: the item is in their
    queue ("assigned to me") and holds one of its REVIEW_REVIEWERS_PER_ITEM slots for them, as a claim
    does, until they record a verdict (done) or the assignment is withdrawn."""

    class Status(models.TextChoices):
        ACTIVE = "active", "active"
        DONE = "done", "verdict recorded"
        WITHDRAWN = "withdrawn", "withdrawn"

    trajectory = models.ForeignKey("tasks.Trajectory", on_delete=models.CASCADE, related_name="review_assignments")
    assignee = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                 related_name="review_assignments")
    assigned_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE, db_index=True)
    assigned_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-assigned_at", "-id"]
        permissions = [("assign_review", "Can assign review queue items to reviewers")]
        constraints = [
            models.UniqueConstraint(fields=["trajectory", "assignee"], condition=Q(status="active"),
                                    name="reviewassignment_one_active"),
        ]
        indexes = [models.Index(fields=["assignee", "status"], name="reviewassignment_assignee_idx")]

    def __str__(self) -> str:
        return f"assignment #{self.pk} of trajectory {self.trajectory_id} to {self.assignee_id} ({self.status})"


class SavedView(models.Model):
    """A person's named filter set of the review queue (/review/work/), reopened from the queue."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_review_views")
    name = models.CharField(max_length=100)
    query = models.CharField(max_length=2000, blank=True, help_text="the queue's filters as a query string")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="savedview_one_name_per_user")]

    def __str__(self) -> str:
        return f"saved view {self.name!r} of {self.user_id}"


class BatchTally(models.Model):
    """A batch's spend, accepted trajectories and human review progress, as last counted.

    A cache of aggregates, not a record: `apps.reviews.tallies.refresh_batch_tallies` (a scheduled
    job on the workers, every BATCH_TALLY_EVERY_MINUTES) recounts every batch from the trajectory
    and review tables, so the batch page and the review queue filtered by a batch read one row
    instead of aggregating the batch's trajectories in the request (11.7 s and 19.1 s at 1M
    trajectories on PostgreSQL). The pages say when it was counted. Derived, so rewritten without
    audit rows; nothing else writes them."""

    batch = models.OneToOneField("tasks.Batch", on_delete=models.CASCADE, related_name="tally")
    spent_usd = models.DecimalField(max_digits=16, decimal_places=6, default=0,
                                    help_text="top-level trajectories' recorded cost plus the judge's calls")
    judge_usd = models.DecimalField(max_digits=16, decimal_places=6, default=0, help_text="the judge's calls alone")
    accepted = models.PositiveIntegerField(default=0, help_text="accepted trajectories (selectors.accepted_q)")
    review_total = models.PositiveIntegerField(default=0, help_text="trajectories the human queue routes to people")
    review_done = models.PositiveIntegerField(default=0, help_text="of those, holding all their verdicts")
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"tally of batch {self.batch_id}"


class ReviewerTally(models.Model):
    """One person's human verdicts as last counted: the team page's throughput, acceptance and
    agreement with the judge.

    A cache of aggregates like BatchTally: `apps.reviews.tallies.refresh_team_tally` (a scheduled
    job on the workers, every TEAM_TALLY_EVERY_MINUTES) recounts every verdict with the exact
    selector (selectors.team_counts), so the team page reads one row per reviewer instead of
    aggregating every human verdict in the request (730 ms at 1M trajectories and 100k verdicts on
    PostgreSQL). The page says when it was counted. Derived, so rewritten without audit rows;
    nothing else writes them."""

    reviewer = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="review_tally")
    day = models.DateField(help_text="the local date the count was made on: per_day's last day, 'today'")
    today = models.PositiveIntegerField(default=0)
    week = models.PositiveIntegerField(default=0, help_text="verdicts on the 7 local days ending on `day`")
    total = models.PositiveIntegerField(default=0)
    accepts = models.PositiveIntegerField(default=0)
    per_day = models.JSONField(default=list, help_text="verdicts per local day, oldest first, ending on `day`")
    both_accept = models.PositiveIntegerField(default=0, help_text="latest verdicts: the judge and the person accept")
    judge_accepts_only = models.PositiveIntegerField(default=0)
    human_accepts_only = models.PositiveIntegerField(default=0)
    both_reject = models.PositiveIntegerField(default=0)
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"tally of reviewer {self.reviewer_id}"


class BatchChange(models.Model):
    """A mark that a batch's tally inputs changed: written by database triggers (reviews migration
    0011) on every insert, delete and relevant update of a trajectory, review or task, whoever
    writes it; read and removed by `apps.reviews.tallies.refresh_batch_tallies`, which recounts
    only the batches marked since its last run. A plain column, not a foreign key: a mark may
    outlive its batch (the job skips it)."""

    batch_id = models.BigIntegerField()

    def __str__(self) -> str:
        return f"change #{self.pk} of batch {self.batch_id}"
