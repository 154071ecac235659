"""Serializers of tasks, batches and trajectories. Output is redacted; input is validated by services."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.reviews.selectors import batch_spend
from apps.tasks.budgets import parse_budget
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.selectors import batch_status_counts
from trajplatform.api import BlankChoicesMixin, RedactedOutputMixin, StrictSerializerMixin


class BatchRefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Batch
        fields = ["id", "name"]


class BatchSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = Batch
        fields = ["id", "name", "created_by", "created_at", "source_name", "source_format", "task_count", "notes"]


class BatchDetailSerializer(BatchSerializer):
    progress = serializers.SerializerMethodField()
    budget = serializers.SerializerMethodField()

    class Meta(BatchSerializer.Meta):
        fields = [*BatchSerializer.Meta.fields, "progress", "budget"]

    @extend_schema_field(serializers.DictField())
    def get_budget(self, batch: Batch) -> dict[str, Any]:
        """Budget, stored spend, what is left, accepted trajectories and the cost per accepted one
        (USD as decimal strings; budget null: none)."""
        return batch_spend(batch)

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_progress(self, batch: Batch) -> dict[str, Any]:
        counts = batch_status_counts(batch)
        total = sum(counts.values())
        done = sum(counts.get(s, 0) for s in Task.FINAL)
        return {**counts, "total": total, "finished": done}


@extend_schema_field({"oneOf": [{"type": "number", "minimum": 0, "maximum": 99999999},
                                 {"type": "string", "pattern": r"^\d{1,8}(\.\d{1,6})?$"}], "nullable": True})
class BudgetField(serializers.Field):
    """US dollars as a number or a decimal string (apps.tasks.budgets.parse_budget); null: none."""

    def to_internal_value(self, data: Any) -> Any:
        try:
            return parse_budget(data)
        except ValidationError as exc:
            raise serializers.ValidationError(exc.message_dict["budget_usd"]) from None

    def to_representation(self, value: Any) -> Any:
        return None if value is None else str(value)


class BudgetSerializer(StrictSerializerMixin, serializers.Serializer):
    budget_usd = BudgetField(allow_null=True, help_text='US dollars (25, "25.00"); null: no budget')


TASK_FIELDS = [
    "id", "batch", "external_id", "scene", "status", "prompt", "scene_config", "expected_tools", "model",
    "temperature", "top_p", "max_steps", "step_timeout_s", "timeout_s", "max_tokens", "system_prompt_extra",
    "max_iterations", "quality_threshold", "samples_per_iteration", "priority", "current_iteration",
    "cancel_requested", "error", "created_by", "created_at", "queued_at", "started_at", "finished_at", "updated_at",
]


class TaskSerializer(RedactedOutputMixin, serializers.ModelSerializer):
    batch = BatchRefSerializer(read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    scene_config = serializers.JSONField(read_only=True)

    class Meta:
        model = Task
        fields = TASK_FIELDS
        read_only_fields = TASK_FIELDS


class TrajectorySummarySerializer(BlankChoicesMixin, RedactedOutputMixin, serializers.ModelSerializer):
    class Meta:
        model = Trajectory
        fields = [
            "id", "uuid", "task", "iteration", "sample_index", "status", "outcome", "outcome_reason", "reward", "model",
            "prompt_tokens", "completion_tokens", "total_tokens", "cost_usd", "content_sha256", "attempts",
            "worker_losses", "created_at", "queued_at", "started_at", "finished_at",
        ]
        read_only_fields = fields


class IterationSerializer(serializers.Serializer):
    iteration = serializers.IntegerField()
    trajectories = TrajectorySummarySerializer(many=True)


class TaskDetailSerializer(TaskSerializer):
    iterations = serializers.SerializerMethodField()

    class Meta(TaskSerializer.Meta):
        fields = [*TASK_FIELDS, "iterations"]
        read_only_fields = fields

    @extend_schema_field(IterationSerializer(many=True))
    def get_iterations(self, task: Task) -> list[dict[str, Any]]:
        grouped: dict[int, list[Trajectory]] = {}
        for trajectory in task.trajectories.order_by("iteration", "sample_index").defer(
            "messages", "tools", "steps", "verifier_output", "config_snapshot"
        ):
            grouped.setdefault(trajectory.iteration, []).append(trajectory)
        return [
            {"iteration": n, "trajectories": TrajectorySummarySerializer(rows, many=True).data}
            for n, rows in sorted(grouped.items())
        ]


class TaskCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    """A list of tasks in either import shape (see docs/tasks.md), validated by the service."""

    tasks = serializers.ListField(
        child=serializers.DictField(), min_length=1,
        help_text="task objects: {scene, prompt, config, external_id, ...} or the agent-data-platform shape",
    )
    batch = serializers.CharField(
        required=False, allow_blank=True, max_length=200,
        help_text="batch name (unique): your API batch of this name is reused (created if missing) and external "
                  "ids dedupe within it; a name another batch has is a 409",
    )
    notes = serializers.CharField(required=False, allow_blank=True, max_length=2000)

    def validate_tasks(self, value: list[Any]) -> list[Any]:
        if len(value) > settings.API_MAX_TASKS_PER_REQUEST:
            raise serializers.ValidationError(
                f"at most {settings.API_MAX_TASKS_PER_REQUEST} tasks per request (got {len(value)}); "
                "split the list or use `manage.py import_tasks`"
            )
        return value


class TaskCreateItemSerializer(TaskSerializer):
    created = serializers.BooleanField(help_text="false: an existing task with this external id in the batch")

    class Meta(TaskSerializer.Meta):
        fields = [*TASK_FIELDS, "created"]
        read_only_fields = fields


class TaskCreateResponseSerializer(serializers.Serializer):
    batch = BatchRefSerializer()
    tasks = TaskCreateItemSerializer(many=True)


class ReasonSerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class ReviewSummarySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    status = serializers.CharField()
    overall = serializers.FloatField(allow_null=True)
    verdict = serializers.CharField()
    rationale = serializers.CharField()
    scores = serializers.JSONField()
    reviewer = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class SubtrajectorySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    role = serializers.CharField()
    label = serializers.CharField()
    parent_step = serializers.IntegerField(allow_null=True)
    outcome = serializers.CharField()
    reward = serializers.FloatField(allow_null=True)


class TrajectoryDetailSerializer(TrajectorySummarySerializer):
    messages = serializers.JSONField(read_only=True)
    tools = serializers.JSONField(read_only=True)
    steps = serializers.JSONField(read_only=True)
    verifier_output = serializers.JSONField(read_only=True)
    config_snapshot = serializers.JSONField(read_only=True)
    reviews = serializers.SerializerMethodField()
    subtrajectories = serializers.SerializerMethodField()

    class Meta(TrajectorySummarySerializer.Meta):
        fields = [
            *TrajectorySummarySerializer.Meta.fields, "messages", "tools", "steps", "final_answer",
            "verifier_output", "config_snapshot", "error", "reviews", "parent", "role", "label", "parent_step",
            "subtrajectories",
        ]
        read_only_fields = fields

    @extend_schema_field(SubtrajectorySerializer(many=True))
    def get_subtrajectories(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        """The sub-episodes stored under it (multi_agent roles, search2qa stages): each is itself
        retrievable here by id."""
        return list(trajectory.subtrajectories().values("id", "role", "label", "parent_step", "outcome", "reward"))

    @extend_schema_field(ReviewSummarySerializer(many=True))
    def get_reviews(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        rows = trajectory.reviews.select_related("reviewer").order_by("-created_at", "-id")
        return [
            {
                "id": r.pk, "kind": r.kind, "status": r.status, "overall": r.overall, "verdict": r.verdict,
                "rationale": r.rationale, "scores": r.scores,
                "reviewer": r.reviewer.get_username() if r.reviewer else None, "created_at": r.created_at,
            }
            for r in rows
        ]
