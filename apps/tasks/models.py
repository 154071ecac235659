"""Batches of tasks, and the trajectories (agent episodes) run for them.

Status fields change only through services in `services.py` (and jobs, by compare-and-swap);
the admin shows them read-only.
"""
from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.engines.registry import scene_choices


class Batch(models.Model):
    """A named submission of tasks: who submitted what, from which file, when."""

    name = models.CharField(max_length=200, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="batches"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    source_name = models.CharField(max_length=300, blank=True, help_text="file name the batch was imported from")
    source_sha256 = models.CharField(max_length=64, blank=True)
    source_format = models.CharField(max_length=40, blank=True, help_text="which input shape the file used")
    task_count = models.PositiveIntegerField(default=0)
    notes = models.TextField(blank=True)
    # A cost cap on the batch's trajectories (apps.tasks.budgets); null: none. Set through
    # budgets.batch_set_budget, never on a form.
    budget_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True, editable=False,
                                     validators=[MinValueValidator(0)])

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"
        constraints = [models.CheckConstraint(condition=Q(budget_usd__isnull=True) | Q(budget_usd__gte=0),
                                              name="batch_budget_ge_0")]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"


class UserBudget(models.Model):
    """A cost cap on everything one user's tasks spend (apps.tasks.budgets); no row: none."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="budget")
    budget_usd = models.DecimalField(max_digits=14, decimal_places=6, validators=[MinValueValidator(0)])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(budget_usd__gte=0), name="userbudget_budget_ge_0")]

    def __str__(self) -> str:
        return f"budget of {self.user} (${self.budget_usd})"


class TaskStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    REVIEWING = "reviewing", "reviewing"
    WAITING_APPROVAL = "waiting_approval", "waiting for approval"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class Task(models.Model):
    """One thing to synthesize trajectories for, with its scene config and model config."""

    Status = TaskStatus
    FINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})

    batch = models.ForeignKey(Batch, null=True, blank=True, on_delete=models.PROTECT, related_name="tasks")
    external_id = models.CharField(
        max_length=200, blank=True, help_text="the submitter's id (e.g. task_id); unique within its batch"
    )
    scene = models.CharField(max_length=32, choices=scene_choices, db_index=True)
    prompt = models.TextField(help_text="the task description the agent receives")
    scene_config = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    expected_tools = models.JSONField(default=list, blank=True)

    # Model config: what the next iteration runs with (proposals change these).
    model = models.CharField(max_length=200, blank=True, help_text="empty: the platform's default model")
    temperature = models.FloatField(default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)])
    top_p = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    max_steps = models.PositiveIntegerField(default=15, validators=[MinValueValidator(1), MaxValueValidator(500)])
    step_timeout_s = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.1)], help_text="per command / tool call, seconds"
    )
    timeout_s = models.FloatField(
        default=600.0, validators=[MinValueValidator(1.0)], help_text="wall clock per trajectory, seconds"
    )
    max_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="token budget per trajectory")
    system_prompt_extra = models.TextField(blank=True, help_text="hints appended to the system prompt")
    max_iterations = models.PositiveSmallIntegerField(default=3, validators=[MinValueValidator(1), MaxValueValidator(20)])
    quality_threshold = models.PositiveSmallIntegerField(
        default=80, validators=[MaxValueValidator(100)], help_text="0-100; reviews at or above it accept"
    )
    samples_per_iteration = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(64)]
    )
    priority = models.PositiveSmallIntegerField(
        default=5, validators=[MinValueValidator(1), MaxValueValidator(10)], help_text="1 (low) - 10 (high)"
    )

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)
    current_iteration = models.PositiveSmallIntegerField(default=0, help_text="0 until the first iteration starts")
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["batch", "external_id"], condition=~Q(external_id=""), name="task_external_id_unique_in_batch"
            ),
            models.CheckConstraint(condition=Q(priority__gte=1, priority__lte=10), name="task_priority_1_10"),
            models.CheckConstraint(condition=Q(quality_threshold__lte=100), name="task_threshold_0_100"),
            models.CheckConstraint(condition=Q(temperature__gte=0, temperature__lte=2), name="task_temperature_0_2"),
            models.CheckConstraint(condition=Q(max_iterations__gte=1), name="task_max_iterations_ge_1"),
            models.CheckConstraint(condition=Q(samples_per_iteration__gte=1), name="task_samples_ge_1"),
            models.CheckConstraint(condition=Q(max_steps__gte=1), name="task_max_steps_ge_1"),
            models.CheckConstraint(condition=Q(status__in=TaskStatus.values), name="task_status_valid"),
        ]
        indexes = [
            models.Index(fields=["status", "-priority", "created_at"], name="task_queue_idx"),
            models.Index(fields=["batch", "status"], name="task_batch_status_idx"),
            models.Index(fields=["scene", "status"], name="task_scene_status_idx"),
        ]

    def __str__(self) -> str:
        label = self.external_id or f"#{self.pk}"
        return f"{self.scene}:{label}"

    def config_snapshot(self) -> dict[str, Any]:
        """The config an iteration runs with; stored on each trajectory. Holds no secrets."""
        return {
            "scene": self.scene,
            "prompt": self.prompt,
            "scene_config": self.scene_config,
            "expected_tools": self.expected_tools,
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_steps": self.max_steps,
            "step_timeout_s": self.step_timeout_s,
            "timeout_s": self.timeout_s,
            "max_tokens": self.max_tokens,
            "system_prompt_extra": self.system_prompt_extra,
            "quality_threshold": self.quality_threshold,
            "samples_per_iteration": self.samples_per_iteration,
        }


def content_sha256(payload: dict[str, Any]) -> str:
    """SHA-256 of a canonical JSON encoding (sorted keys, no whitespace, UTF-8)."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, cls=DjangoJSONEncoder)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class TrajectoryStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    CANCELLED = "cancelled", "cancelled"


class TopLevelTrajectories(models.Manager):
    """`Trajectory.objects`: the episodes the platform schedules, claims, reviews and counts.
    The sub-episodes stored under one of them (`parent` set: a multi_agent role's view, a
    search2qa stage) are reached through `Trajectory.all_objects` or `trajectory.subtrajectories()`."""

    def get_queryset(self) -> models.QuerySet:
        return super().get_queryset().filter(parent__isnull=True)


class Trajectory(models.Model):
    """One agent episode for one task iteration and sample, or (with `parent`) a sub-episode of one.

    A sub-episode of the shared loop (apps.engines.runtime.EpisodeContext.run_subepisode) is
    stored, when its episode is, as a child trajectory: the parent's task, iteration and sample,
    its own messages, tools and steps, the `role` that acted and the `label` the parent's log and
    steps name it by ("coder#0"; nested ones "coder#0/tester#1"), and `parent_step`, the index of
    the parent's step that ran it (None when the parent's verifier did). Children are final when
    stored and never claimed; `Trajectory.objects` leaves them out, so every count, claim and
    review of a task's episodes stays what it was."""

    Status = TrajectoryStatus
    objects = TopLevelTrajectories()
    all_objects = models.Manager()
    FINAL = frozenset({Status.FINISHED, Status.CANCELLED})

    class Outcome(models.TextChoices):
        SUCCESS = "success", "success"
        FAILURE = "failure", "failure"
        ERROR = "error", "error"

    # The trajectory's identity outside this database (the LLM response cache is keyed on it):
    # primary keys repeat across databases, a UUID does not.
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="trajectories")
    # related_name "+": the reverse manager would filter through TopLevelTrajectories and find no
    # children; use subtrajectories().
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    role = models.CharField(max_length=100, blank=True)
    label = models.CharField(max_length=200, blank=True)
    parent_step = models.IntegerField(null=True, blank=True)
    iteration = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    sample_index = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True)

    # The episode, in OpenAI chat format: messages include assistant tool_calls and
    # role=tool results; `tools` is the function schema offered; `steps` holds per-step
    # metadata (duration, exit code, truncation) aligned with the tool calls.
    messages = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    tools = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    steps = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    final_answer = models.TextField(blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, blank=True, db_index=True)
    outcome_reason = models.TextField(blank=True)
    reward = models.FloatField(null=True, blank=True)
    verifier_output = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)

    model = models.CharField(max_length=200, blank=True)
    config_snapshot = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    content_sha256 = models.CharField(max_length=64, blank=True, db_index=True)

    worker = models.CharField(max_length=200, blank=True)
    # Set by the claiming job (a fresh random token per claim) and cleared on re-queue: only
    # the holder of the current token may heartbeat or finish the trajectory, so a worker the
    # reaper gave up on cannot overwrite the attempt that replaced it.
    claim_token = models.CharField(max_length=64, blank=True, editable=False)
    attempts = models.PositiveSmallIntegerField(
        default=0, help_text="times a worker has claimed it (the reaper re-queues up to ROLLOUT_MAX_ATTEMPTS)"
    )
    worker_losses = models.PositiveSmallIntegerField(
        default=0, help_text="claims that ended because their worker died (not counted against the attempts)"
    )
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "trajectories"
        constraints = [
            models.UniqueConstraint(fields=["task", "iteration", "sample_index"], condition=Q(parent__isnull=True),
                                    name="trajectory_unique_sample"),
            models.UniqueConstraint(fields=["parent", "label"], condition=Q(parent__isnull=False),
                                    name="trajectory_unique_child_label"),
            models.CheckConstraint(condition=Q(iteration__gte=1), name="trajectory_iteration_ge_1"),
            models.CheckConstraint(
                condition=Q(status="finished", outcome__in=["success", "failure", "error"])
                | (~Q(status="finished") & Q(outcome="")),
                name="trajectory_outcome_iff_finished",
            ),
            models.CheckConstraint(condition=Q(status__in=TrajectoryStatus.values), name="trajectory_status_valid"),
        ]
        indexes = [
            models.Index(fields=["task", "iteration"], name="trajectory_task_iter_idx"),
            models.Index(fields=["status", "heartbeat_at"], name="trajectory_heartbeat_idx"),
            models.Index(fields=["outcome", "-created_at"], name="trajectory_outcome_idx"),
            models.Index(fields=["finished_at"], name="trajectory_finished_idx"),  # the daily budget's sum
        ]

    def __str__(self) -> str:
        return f"trajectory #{self.pk} ({self.task_id} it{self.iteration}/s{self.sample_index})"

    def subtrajectories(self) -> models.QuerySet:
        """The sub-episodes stored under this trajectory (not their own children), in order."""
        return Trajectory.all_objects.filter(parent=self).order_by("id")

    def content(self) -> dict[str, Any]:
        """What the content hash covers: the training-relevant record, not bookkeeping."""
        return {
            "messages": self.messages,
            "tools": self.tools,
            "final_answer": self.final_answer,
            "outcome": self.outcome,
            "reward": self.reward,
        }

    def compute_content_sha256(self) -> str:
        return content_sha256(self.content())

    CONTENT_FIELDS = frozenset({"messages", "tools", "final_answer", "outcome", "reward"})

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Rehash only when content is written: heartbeat and status saves stay cheap.
        update_fields = kwargs.get("update_fields")
        if update_fields is None:
            self.content_sha256 = self.compute_content_sha256()
        elif self.CONTENT_FIELDS & set(update_fields):
            self.content_sha256 = self.compute_content_sha256()
            kwargs["update_fields"] = set(update_fields) | {"content_sha256"}
        super().save(*args, **kwargs)


class TrajectoryLog(models.Model):
    """One live-log line of a trajectory; `seq` orders lines within the trajectory from 1."""

    class Kind(models.TextChoices):
        SYSTEM = "system", "system"
        THOUGHT = "thought", "thought"
        ACTION = "action", "action"
        OUTPUT = "output", "output"
        RESULT = "result", "result"
        ERROR = "error", "error"

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="log_lines")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["trajectory", "seq"]
        constraints = [models.UniqueConstraint(fields=["trajectory", "seq"], name="trajectorylog_unique_seq")]

    def __str__(self) -> str:
        return f"{self.trajectory_id}#{self.seq} {self.kind}"

    def as_message(self) -> dict[str, Any]:
        """The JSON shape sent over the websocket and returned by the backfill endpoint."""
        return {
            "seq": self.seq,
            "kind": self.kind,
            "message": self.message,
            "data": self.data,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }
