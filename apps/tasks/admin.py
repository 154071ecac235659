"""Console pages for batches, tasks and trajectories. Status changes only through the actions."""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.engines.scenes import SceneConfigError, validate_scene_config
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.services import TransitionError, task_cancel, task_requeue
from trajplatform.admin import AuditTrailMixin, IdSearchMixin, ReadableJSONMixin

# Per-object warnings beyond this many are summarised in one line.
MAX_WARNINGS = 10

AUDIT_FIELDSET = ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]})


def _count_column(status: str) -> Callable[[Any], int]:
    @admin.display(description=Task.Status(status).label, ordering=f"n_{status}")
    def column(obj: Batch) -> int:
        return getattr(obj, f"n_{status}")

    column.__name__ = f"n_{status}"
    return column


@admin.register(Batch)
class BatchAdmin(AuditTrailMixin, admin.ModelAdmin):
    list_display = (
        "__str__", "created_by", "created_at", "source_format", "tasks_link",
        *(_count_column(s) for s in Task.Status.values),
    )
    list_filter = ("source_format", "created_at")
    search_fields = ("name", "source_name", "source_sha256__exact")
    list_select_related = ("created_by",)
    raw_id_fields = ("created_by",)
    readonly_fields = (
        "created_by", "created_at", "source_name", "source_sha256", "source_format", "task_count",
        "tasks_link", "recent_audit_events",
    )
    fieldsets = [
        (None, {"fields": ["name", "notes"]}),
        ("source", {"fields": ["source_name", "source_format", "source_sha256", "task_count", "tasks_link"]}),
        ("created", {"fields": ["created_by", "created_at"]}),
        AUDIT_FIELDSET,
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # One grouped query for every row's counts, not one query per batch.
        counts = {f"n_{s}": Count("tasks", filter=Q(tasks__status=s)) for s in Task.Status.values}
        return super().get_queryset(request).annotate(n_tasks=Count("tasks"), **counts)

    @admin.display(description="tasks", ordering="n_tasks")
    def tasks_link(self, obj: Batch) -> SafeString | str:
        if obj.pk is None:
            return "-"
        url = f"{reverse('admin:tasks_task_changelist')}?{urlencode({'batch__id__exact': obj.pk})}"
        n = getattr(obj, "n_tasks", None)
        return format_html('<a href="{}">{}</a>', url, "tasks" if n is None else n)

    def save_model(self, request: HttpRequest, obj: Batch, form: Any, change: bool) -> None:
        if not change and obj.created_by_id is None:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("running_1h", "running, no progress > 1h"), ("queued_24h", "queued > 24h")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        now = timezone.now()
        if self.value() == "running_1h":
            return queryset.filter(status=Task.Status.RUNNING, updated_at__lt=now - timedelta(hours=1))
        if self.value() == "queued_24h":
            return queryset.filter(status=Task.Status.QUEUED, updated_at__lt=now - timedelta(hours=24))
        return None


class TaskForm(forms.ModelForm):
    class Meta:
        model = Task
        fields = "__all__"

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        scene, config = data.get("scene"), data.get("scene_config")
        if scene and config is not None:
            try:
                data["scene_config"] = validate_scene_config(scene, config)
            except SceneConfigError as exc:
                self.add_error("scene_config", str(exc))
        return data


class TrajectoryInline(admin.TabularInline):
    model = Trajectory
    fields = ("iteration", "sample_index", "status", "outcome", "reward", "total_tokens", "created_at")
    readonly_fields = fields
    ordering = ("-iteration", "sample_index")
    show_change_link = True
    can_delete = False
    extra = 0
    classes = ["collapse"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(IdSearchMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    form = TaskForm
    list_display = (
        "id", "__str__", "batch", "scene", "status", "priority", "iteration", "model", "created_at", "updated_at",
    )
    list_filter = ("status", "scene", StuckFilter, "batch")
    search_fields = ("external_id", "batch__name", "model")
    list_select_related = ("batch",)
    raw_id_fields = ("batch", "created_by")
    show_full_result_count = False
    actions = ["cancel_selected", "requeue_selected"]
    inlines = [TrajectoryInline]
    json_fields = ("scene_config", "expected_tools")
    readonly_fields = (
        "status", "current_iteration", "cancel_requested", "error",
        "created_by", "created_at", "queued_at", "started_at", "finished_at", "updated_at", "recent_audit_events",
    )
    fieldsets = [
        (None, {"fields": ["batch", "external_id", "scene", "prompt", "scene_config", "expected_tools", "priority"]}),
        ("model config", {"fields": [
            "model", ("temperature", "top_p"), "max_steps", ("step_timeout_s", "timeout_s"), "max_tokens",
            "system_prompt_extra",
        ]}),
        ("iterations", {"fields": ["max_iterations", "quality_threshold", "samples_per_iteration"]}),
        ("status", {"fields": [
            "status", "current_iteration", "cancel_requested", "error",
            "created_by", "created_at", "queued_at", "started_at", "finished_at", "updated_at",
        ]}),
        AUDIT_FIELDSET,
    ]

    @admin.display(description="iteration", ordering="current_iteration")
    def iteration(self, obj: Task) -> str:
        return f"{obj.current_iteration}/{obj.max_iterations}"

    def save_model(self, request: HttpRequest, obj: Task, form: Any, change: bool) -> None:
        if not change and obj.created_by_id is None:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    def _run_each(
        self, request: HttpRequest, queryset: QuerySet, service: Callable[..., Task], skip_status: str | None, verb: str
    ) -> None:
        done, skipped, errors = 0, 0, []
        for task in queryset:
            if skip_status is not None and task.status == skip_status:
                skipped += 1
                continue
            try:
                service(task=task, actor=request.user, reason="admin action")
            except TransitionError as exc:
                errors.append(f"{task}: {exc}")
                continue
            done += 1
        message = f"{verb} {done}"
        if skipped:
            message += f" ({skipped} already {skip_status})"
        self.message_user(request, message, messages.SUCCESS if done or not errors else messages.INFO)
        for error in errors[:MAX_WARNINGS]:
            self.message_user(request, error, messages.WARNING)
        if len(errors) > MAX_WARNINGS:
            self.message_user(request, f"... and {len(errors) - MAX_WARNINGS} more not changed", messages.WARNING)

    @admin.action(description="Cancel selected tasks", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._run_each(request, queryset, task_cancel, Task.Status.CANCELLED, "Cancelled")

    @admin.action(description="Re-queue selected tasks", permissions=["change"])
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._run_each(request, queryset, task_requeue, None, "Re-queued")


@admin.register(Trajectory)
class TrajectoryAdmin(IdSearchMixin, ReadableJSONMixin, admin.ModelAdmin):
    """Written by the rollout jobs only: read-only here."""

    list_display = (
        "id", "task", "iteration", "sample_index", "status", "outcome", "reward", "model", "total_tokens",
        "cost_usd", "created_at",
    )
    list_filter = ("status", "outcome", "task__scene", "task__batch")
    search_fields = ("task__external_id", "content_sha256__exact", "model")
    id_search_fields = ("pk", "task_id")
    list_select_related = ("task",)
    raw_id_fields = ("task",)
    show_full_result_count = False
    json_fields = ("messages", "tools", "steps", "verifier_output", "config_snapshot")
    readonly_fields = ("created_at",)
    fieldsets = [
        (None, {"fields": ["task", ("iteration", "sample_index"), "status", "outcome", "outcome_reason", "reward"]}),
        ("episode", {"fields": ["messages", "final_answer", "tools", "steps", "verifier_output"]}),
        ("model", {"fields": [
            "model", "config_snapshot", ("prompt_tokens", "completion_tokens", "total_tokens"), "cost_usd",
            "content_sha256",
        ]}),
        ("run", {"fields": [
            "worker", "heartbeat_at", "error", "created_at", "queued_at", "started_at", "finished_at",
        ]}),
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
