"""Console pages for batches, tasks and trajectories. Status changes only through the actions."""
from __future__ import annotations

import operator
from datetime import timedelta
from functools import reduce
from typing import Any, Callable
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.core.exceptions import ValidationError
from django.db.models import Count, F, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.reviews import selectors as review_selectors
from apps.tasks import budgets
from apps.tasks.importers import validate_task
from apps.tasks.models import Batch, Task, Trajectory, UserBudget
from apps.tasks.selectors import NOT_STARTED
from apps.tasks.services import (
    BatchNameTaken, TaskCreateError, TransitionError, batch_cancel, batch_retry, task_cancel, task_requeue,
    tasks_create, tasks_enqueue,
)
from trajplatform.admin_base import (
    ActionsOnlyMixin, AuditTrailMixin, IdSearchMixin, ReadOnlyInline, ReadableJSONMixin, truncated_column,
)
from trajplatform.skills import enabled_scene_ids

# Per-object warnings beyond this many are summarised in one line.
MAX_WARNINGS = 10

AUDIT_FIELDSET = ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]})


def report(model_admin: admin.ModelAdmin, request: HttpRequest, message: str, errors: list[str]) -> None:
    """The action's summary, then at most MAX_WARNINGS of the objects it could not change."""
    model_admin.message_user(request, message, messages.WARNING if errors else messages.SUCCESS)
    for error in errors[:MAX_WARNINGS]:
        model_admin.message_user(request, error, messages.WARNING)
    if len(errors) > MAX_WARNINGS:
        model_admin.message_user(request, f"... and {len(errors) - MAX_WARNINGS} more not changed", messages.WARNING)


class OptionsFilter(admin.SimpleListFilter):
    """A list filter declared as {value: (label, queryset -> filtered queryset)}."""

    options: dict[str, tuple[str, Callable[[QuerySet], QuerySet]]] = {}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.options.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        chosen = self.options.get(self.value() or "")
        return chosen[1](queryset) if chosen else None


def _count_column(status: str) -> Callable[[Any], int]:
    @admin.display(description=Task.Status(status).label, ordering=f"n_{status}")
    def column(obj: Batch) -> int:
        return getattr(obj, f"n_{status}")

    column.__name__ = f"n_{status}"
    return column


def batch_state(obj: Batch) -> str:
    """empty, not started, in progress (with how many are not started), finished: from the row's counts."""
    total = obj.n_tasks
    if total == 0:
        return "empty"
    if obj.n_not_started == total:
        return "not started"
    if sum(getattr(obj, f"n_{s}") for s in Task.FINAL) == total:
        return "finished"
    if obj.n_not_started:
        return f"in progress ({obj.n_not_started} not started)"
    return "in progress"


def _n_final() -> Any:
    return reduce(operator.add, [F(f"n_{s}") for s in sorted(Task.FINAL)])


class BatchStateFilter(OptionsFilter):
    title = "state"
    parameter_name = "state"
    options = {
        "not_started": ("not started (imported, nothing run)",
                        lambda qs: qs.filter(n_tasks__gt=0, n_not_started=F("n_tasks"))),
        "has_not_started": ("some tasks not started", lambda qs: qs.filter(n_not_started__gt=0)),
        "in_progress": ("in progress", lambda qs: qs.alias(n_final=_n_final()).filter(n_final__lt=F("n_tasks"))
                        .exclude(n_not_started=F("n_tasks"))),
        "finished": ("finished", lambda qs: qs.alias(n_final=_n_final()).filter(n_tasks__gt=0, n_final=F("n_tasks"))),
    }


class BudgetActionForm(ActionForm):
    budget_usd = forms.CharField(required=False, label="budget (USD, empty: none)", max_length=40)


@admin.register(Batch)
class BatchAdmin(ActionsOnlyMixin, AuditTrailMixin, admin.ModelAdmin):
    """Batches are created by imports, the API and the task add form; run with the actions."""

    list_display = (
        "name_short", "state", "created_at", "tasks_link", *(_count_column(s) for s in Task.Status.values),
    )
    list_filter = (BatchStateFilter, "source_format", "created_at")
    search_fields = ("name", "source_name", "source_sha256__exact")
    list_select_related = ("created_by",)
    raw_id_fields = ("created_by",)
    actions = ["start_batches", "cancel_batches", "retry_batches", "set_budget"]
    action_form = BudgetActionForm
    readonly_fields = (
        "name", "notes", "state_and_actions", "created_by", "created_at", "source_name", "source_sha256", "source_format",
        "task_count", "tasks_link", "spend", "recent_audit_events",
    )
    fieldsets = [
        (None, {"fields": ["name", "state_and_actions", "notes"]}),
        ("budget", {"fields": ["spend"]}),
        ("source", {"fields": ["source_name", "source_format", "source_sha256", "task_count", "tasks_link"]}),
        ("created", {"fields": ["created_by", "created_at"]}),
        AUDIT_FIELDSET,
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # One grouped query for every row's counts, not one query per batch.
        counts = {f"n_{s}": Count("tasks", filter=Q(tasks__status=s)) for s in Task.Status.values}
        not_started = Count("tasks", filter=Q(tasks__status=Task.Status.QUEUED, tasks__current_iteration=0))
        return super().get_queryset(request).annotate(n_tasks=Count("tasks"), n_not_started=not_started, **counts)

    def has_run_permission(self, request: HttpRequest) -> bool:
        """The batch actions run its tasks: whoever may control tasks may use them."""
        return request.user.has_perm("tasks.change_task")

    name_short = truncated_column("", "batch", 36, ordering="name")

    @admin.display(description="state", ordering="n_not_started")
    def state(self, obj: Batch) -> str:
        return batch_state(obj)

    @admin.display(description="state")
    def state_and_actions(self, obj: Batch) -> SafeString:
        url = f"{reverse('admin:tasks_batch_changelist')}?{urlencode({'id__exact': obj.pk})}"
        return format_html('{} — <a href="{}">Start / Cancel / Retry</a> from the batch list (actions)',
                           batch_state(obj), url)

    @admin.display(description="tasks", ordering="n_tasks")
    def tasks_link(self, obj: Batch) -> SafeString | str:
        if obj.pk is None:
            return "-"
        url = f"{reverse('admin:tasks_task_changelist')}?{urlencode({'batch__id__exact': obj.pk})}"
        n = getattr(obj, "n_tasks", None)
        return format_html('<a href="{}">{}</a>', url, "tasks" if n is None else n)

    @admin.action(description="Start the not-started tasks of the selected batches", permissions=["run"])
    def start_batches(self, request: HttpRequest, queryset: QuerySet) -> None:
        started = sum(tasks_enqueue(batch=batch, actor=request.user) for batch in queryset)
        report(self, request, f"Started {started} task(s)", [])

    @admin.action(description="Cancel the unfinished tasks of the selected batches", permissions=["run"])
    def cancel_batches(self, request: HttpRequest, queryset: QuerySet) -> None:
        cancelled = sum(batch_cancel(batch=batch, actor=request.user, reason="admin action") for batch in queryset)
        report(self, request, f"Cancelled {cancelled} task(s)", [])

    @admin.action(description="Retry the failed and cancelled tasks of the selected batches", permissions=["run"])
    def retry_batches(self, request: HttpRequest, queryset: QuerySet) -> None:
        started = sum(batch_retry(batch=batch, actor=request.user, reason="admin action") for batch in queryset)
        report(self, request, f"Retried {started} task(s)", [])

    def has_budget_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("tasks.change_batch")

    @admin.action(description="Set the budget (USD, the field beside the action; empty: none) of the selected batches",
                  permissions=["budget"])
    def set_budget(self, request: HttpRequest, queryset: QuerySet) -> None:
        value = request.POST.get("budget_usd", "")
        try:
            budgets.parse_budget(value)
        except ValidationError as exc:
            self.message_user(request, f"Budget not set: {'; '.join(exc.message_dict['budget_usd'])}", messages.ERROR)
            return
        changed = [budgets.batch_set_budget(batch=batch, budget_usd=value, actor=request.user) for batch in queryset]
        report(self, request, f"Set the budget of {len(changed)} batch(es) to {value.strip() or 'none'}", [])

    @admin.display(description="spend against budget")
    def spend(self, obj: Batch) -> SafeString:
        spend = review_selectors.batch_spend(obj)
        per = spend["cost_per_accepted_usd"]
        return format_html(
            "${} spent (of it ${} by the judge) of {}{} — {} accepted trajectories, {} per accepted one",
            spend["spent_usd"], spend["judge_usd"], "no budget" if spend["budget_usd"] is None else f"${spend['budget_usd']}",
            " (over budget: its queued trajectories wait)" if spend["over_budget"] else "",
            spend["accepted"], "-" if per is None else f"${per}",
        )


@admin.register(UserBudget)
class UserBudgetAdmin(admin.ModelAdmin):
    """A user's cost budget; add, change and delete go through budgets.user_set_budget."""

    list_display = ("user", "budget_usd", "updated_at")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    search_fields = ("user__username",)
    readonly_fields = ("updated_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ("user", *self.readonly_fields) if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: UserBudget, form: Any, change: bool) -> None:
        saved = budgets.user_set_budget(user=obj.user, budget_usd=obj.budget_usd, actor=request.user)
        obj.pk = saved.pk if saved is not None else obj.pk

    def delete_model(self, request: HttpRequest, obj: UserBudget) -> None:
        budgets.user_set_budget(user=obj.user, budget_usd=None, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for row in queryset.select_related("user"):
            budgets.user_set_budget(user=row.user, budget_usd=None, actor=request.user)


def _older(hours: int) -> Any:
    return timezone.now() - timedelta(hours=hours)


class StuckFilter(OptionsFilter):
    title = "stuck"
    parameter_name = "stuck"
    options = {
        "running_1h": ("running, no progress > 1h",
                       lambda qs: qs.filter(status=Task.Status.RUNNING, updated_at__lt=_older(1))),
        "queued_24h": ("queued > 24h", lambda qs: qs.filter(status=Task.Status.QUEUED, updated_at__lt=_older(24))),
    }


class StartedFilter(OptionsFilter):
    title = "started"
    parameter_name = "started"
    options = {
        "no": ("not started (imported, no iteration yet)", lambda qs: qs.filter(NOT_STARTED)),
        "yes": ("started", lambda qs: qs.exclude(NOT_STARTED)),
    }


# The add form's fields, as the task-creation service (the importers' rules) takes them.
ADD_FIELDS = [
    "external_id", "scene", "prompt", "scene_config", "expected_tools", "model", "temperature", "top_p",
    "max_steps", "step_timeout_s", "timeout_s", "max_tokens", "system_prompt_extra", "max_iterations",
    "quality_threshold", "samples_per_iteration", "priority",
]


class TaskAddForm(forms.ModelForm):
    """A new task, created by `tasks_create` (validation, audit row, first iteration started)."""

    batch_name = forms.CharField(
        max_length=200, required=False,
        help_text="a batch of this name that you created here or through the API gets the task; "
                  "empty: a new batch named after you and the time",
    )
    actor: Any = None  # set by TaskAdmin.get_form

    class Meta:
        model = Task
        fields = ADD_FIELDS

    def item(self) -> dict[str, Any]:
        """The task as an item of `tasks_create` (the trajplatform import shape)."""
        data = self.cleaned_data
        item = {"config" if name == "scene_config" else name: data.get(name) for name in ADD_FIELDS}
        return {k: v for k, v in item.items() if v is not None and v != ""}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        _shape, _fields, problems = validate_task(self.item())
        for name, reason in problems:
            field = "scene_config" if name.split(".")[0] == "config" else name
            self.add_error(field if field in self.fields else None, f"{name}: {reason}" if field != name else reason)
        name = (data.get("batch_name") or "").strip()
        if name:
            other = Batch.objects.filter(name=name).first()
            if other is not None and (other.created_by_id != getattr(self.actor, "pk", None)
                                      or other.source_format != "api"):
                self.add_error("batch_name", f"batch {name!r} exists and was not created by you here or "
                                             "through the API; choose another name")
        return data


class TrajectoryInline(ReadOnlyInline):
    model = Trajectory
    fields = ("iteration", "sample_index", "status", "outcome", "reward", "total_tokens", "created_at")
    readonly_fields = fields
    ordering = ("-iteration", "sample_index")


@admin.register(Task)
class TaskAdmin(ActionsOnlyMixin, IdSearchMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    """A task's config changes only by a proposal (the risk policy picks who applies it); its
    status only by the Start / Cancel / Retry actions; a new task through `tasks_create`."""

    list_display = ("id", "task_short", "batch_short", "scene", "status", "priority", "iteration", "model_short",
                    "updated_at")
    list_filter = ("status", StartedFilter, "scene", StuckFilter, "batch")
    search_fields = ("external_id", "batch__name", "model")
    list_select_related = ("batch",)
    raw_id_fields = ("batch", "created_by")
    show_full_result_count = False
    actions = ["start_selected", "cancel_selected", "retry_selected"]
    inlines = [TrajectoryInline]
    json_fields = ("scene_config", "expected_tools")
    readonly_fields = (
        "status", "current_iteration", "cancel_requested", "error", "propose_link",
        "created_by", "created_at", "queued_at", "started_at", "finished_at", "updated_at", "recent_audit_events",
        "generated_by",
    )
    fieldsets = [
        (None, {"fields": ["batch", "external_id", "scene", "prompt", "scene_config", "expected_tools", "priority"]}),
        ("model config", {"fields": [
            "propose_link", "model", ("temperature", "top_p"), "max_steps", ("step_timeout_s", "timeout_s"),
            "max_tokens", "system_prompt_extra",
        ]}),
        ("iterations", {"fields": ["max_iterations", "quality_threshold", "samples_per_iteration"]}),
        ("status", {"fields": [
            "status", "current_iteration", "cancel_requested", "error",
            "created_by", "created_at", "queued_at", "started_at", "finished_at", "updated_at", "generated_by",
        ]}),
        AUDIT_FIELDSET,
    ]
    add_fieldsets = [
        (None, {"fields": ["batch_name", "external_id", "scene", "prompt", "scene_config", "expected_tools",
                           "priority"]}),
        ("model config", {"fields": [
            "model", ("temperature", "top_p"), "max_steps", ("step_timeout_s", "timeout_s"), "max_tokens",
            "system_prompt_extra",
        ]}),
        ("iterations", {"fields": ["max_iterations", "quality_threshold", "samples_per_iteration"]}),
    ]

    task_short = truncated_column("", "task", 36, ordering="external_id")
    batch_short = truncated_column("batch", "batch", 28, ordering="batch__name")
    model_short = truncated_column("model", "model", 20, ordering="model")

    @admin.display(description="generated by")
    def generated_by(self, obj: Task) -> SafeString | str:
        """The generation pipeline's stage run that made this task (apps.engines.pipelines), if any."""
        row = obj.stage_runs.select_related("run").first() if obj.pk else None
        if row is None:
            return "-"
        return format_html('<a href="{}">pipeline run #{} ({}), item {}</a>',
                           reverse("admin:engines_stagerun_change", args=[row.pk]), row.run_id, row.run.name,
                           row.item_key)

    @admin.display(description="iteration", ordering="current_iteration")
    def iteration(self, obj: Task) -> str:
        return f"{obj.current_iteration}/{obj.max_iterations}"

    @admin.display(description="change the config")
    def propose_link(self, obj: Task) -> SafeString | str:
        if obj.pk is None:
            return "-"
        url = f"{reverse('admin:reviews_proposal_add')}?{urlencode({'task': obj.pk})}"
        return format_html(
            '<a href="{}">Propose a change</a> — the risk policy decides who applies it (green: at once, '
            'yellow: a reviewer, red: an approver)', url)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple[Any, dict[str, Any]]]:
        if obj is None:
            return self.add_fieldsets
        fieldsets = super().get_fieldsets(request, obj)
        if request.user.has_perm("reviews.decide_yellow_proposal"):  # who may propose (the service checks it)
            return fieldsets
        return [(title, {**opts, "fields": [f for f in opts["fields"] if f != "propose_link"]})
                for title, opts in fieldsets]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return () if obj is None else super().get_readonly_fields(request, obj)

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        return [] if obj is None else super().get_inline_instances(request, obj)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = type("TaskAddForm", (TaskAddForm,), {"actor": request.user})
            kwargs["fields"] = ["batch_name", *ADD_FIELDS]
        return super().get_form(request, obj, change=change, **kwargs)

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: Any = None) -> HttpResponse:
        try:
            return super().add_view(request, form_url, extra_context)
        except (TaskCreateError, BatchNameTaken) as exc:  # what the form's checks could not see (e.g. a race)
            self.message_user(request, f"Not created: {exc}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def save_model(self, request: HttpRequest, obj: Task, form: Any, change: bool) -> None:
        if change:
            raise RuntimeError("the task change page is view-only")  # has_change_permission refuses first
        result = tasks_create(items=[form.item()], actor=request.user,
                              batch_name=form.cleaned_data.get("batch_name", ""),
                              allowed_scenes=set(enabled_scene_ids()))
        task = result.tasks[0]
        obj.__dict__.update({k: v for k, v in task.__dict__.items() if not k.startswith("_")})
        if not result.created[0]:
            self.message_user(request, f"Batch {result.batch} already has a task with external id "
                                       f"{task.external_id!r}: nothing was added", messages.WARNING)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        pass  # the service wrote everything; the trajectories inline is read-only

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
        report(self, request, message, errors)

    @admin.action(description="Start selected tasks (queued, not started)", permissions=["change"])
    def start_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        # The changelist's queryset joins the batch (list_select_related): PostgreSQL locks no outer join.
        selected = Task.objects.filter(pk__in=queryset.values("pk"))
        started = tasks_enqueue(tasks=selected, actor=request.user)
        others = queryset.count() - started
        note = f" ({others} not queued: left as they are)" if others else ""
        report(self, request, f"Started {started}{note}", [])

    @admin.action(description="Cancel selected tasks", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._run_each(request, queryset, task_cancel, Task.Status.CANCELLED, "Cancelled")

    @admin.action(description="Retry selected tasks (failed or cancelled: queue again and start)",
                  permissions=["change"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._run_each(request, queryset, task_requeue, None, "Retried")


@admin.register(Trajectory)
class TrajectoryAdmin(IdSearchMixin, ReadableJSONMixin, admin.ModelAdmin):
    """Written by the rollout jobs only: read-only here."""

    list_display = (
        "id", "task_short", "iteration_sample", "status", "outcome", "reward", "model_short", "total_tokens",
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
    task_short = truncated_column("task", "task", 32, ordering="task_id")
    model_short = truncated_column("model", "model", 20, ordering="model")
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

    @admin.display(description="iteration / sample", ordering="iteration")
    def iteration_sample(self, obj: Trajectory) -> str:
        return f"{obj.iteration} / {obj.sample_index}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # reviews and dataset memberships hang on it: history is kept
