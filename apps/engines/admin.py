"""Console pages for sandboxes (read-only rows, a destroy action through the service), for
generation pipeline runs (read-only, their stage runs inline, Start / Cancel / Resume through services),
for the MCP server registry and for corpora (read-only rows: a corpus changes only through
`manage.py corpus_build`)."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.engines.mcp_servers import McpRegistryError, mcp_server_resnapshot, mcp_server_set_enabled
from apps.engines.models import Corpus, McpServer, PipelineRun, SandboxRecord, StageRun
from apps.engines.pipelines import services as pipeline_services
from apps.engines.sandboxes.base import SandboxError
from apps.engines.sandbox_records import sandbox_destroy_records
from trajplatform.admin_base import (
    ActionsOnlyMixin,
    AuditTrailMixin,
    IdSearchMixin,
    ReadableJSONMixin,
    ReadOnlyInline,
    ViewOnlyMixin,
    pretty_json,
)


class LiveFilter(admin.SimpleListFilter):
    """Derived states an operator looks for: still running, overdue, stuck while creating."""

    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("live", "live (owns a sandbox)"),
            ("overdue", "live past its TTL"),
            ("stuck", "creating for over 10 minutes"),
            ("downgraded", "runs with downgraded isolation"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        now = timezone.now()
        live = queryset.filter(state__in=SandboxRecord.LIVE)
        if self.value() == "live":
            return live
        if self.value() == "overdue":
            return live.filter(expires_at__lt=now)
        if self.value() == "stuck":
            return queryset.filter(state=SandboxRecord.State.CREATING, created_at__lt=now - timedelta(minutes=10))
        if self.value() == "downgraded":
            return queryset.exclude(downgrades=[])
        return queryset


@admin.register(SandboxRecord)
class SandboxRecordAdmin(IdSearchMixin, ReadableJSONMixin, AuditTrailMixin, admin.ModelAdmin):
    list_display = (
        "__str__", "backend", "state", "trajectory", "host", "image", "created_at", "expires_at", "destroyed_at",
        "destroy_reason", "has_downgrades",
    )
    list_filter = ("backend", "state", LiveFilter, "created_at")
    search_fields = ("external_id__exact", "host", "image", "destroy_reason", "last_error")
    list_select_related = ("trajectory",)
    raw_id_fields = ("trajectory",)
    show_full_result_count = False
    date_hierarchy = "created_at"
    actions = ["destroy_selected_sandboxes"]
    json_fields = ("labels", "spec", "downgrades")
    fieldsets = [
        (None, {"fields": ["backend", "external_id", "state", "trajectory", "host", "image", "pool_key"]}),
        ("times", {"fields": ["created_at", "ready_at", "claimed_at", "expires_at", "destroyed_at", "destroy_reason"]}),
        ("spec", {"fields": ["labels", "spec", "downgrades"]}),
        ("errors", {"fields": ["last_error"]}),
        ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]}),
    ]
    readonly_fields = (
        "backend", "external_id", "state", "trajectory", "host", "image", "pool_key", "created_at", "ready_at",
        "claimed_at", "expires_at", "destroyed_at", "destroy_reason", "labels", "spec", "downgrades", "last_error",
        "recent_audit_events",
    )

    @admin.display(description="downgraded", boolean=True)
    def has_downgrades(self, obj: SandboxRecord) -> bool:
        return bool(obj.downgrades)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting a row would hide a sandbox from the reconciler; destroy it instead.
        return False

    def has_destroy_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("engines.change_sandboxrecord")

    @admin.action(description="Destroy selected sandboxes", permissions=["destroy"])
    def destroy_selected_sandboxes(self, request: HttpRequest, queryset: QuerySet) -> None:
        live = [r for r in queryset if r.state in SandboxRecord.LIVE]
        try:
            destroyed = sandbox_destroy_records(records=live, actor=request.user)
        except SandboxError as exc:
            self.message_user(request, f"Stopped: {exc}", messages.ERROR)
            return
        skipped = queryset.count() - len(live)
        suffix = f" ({skipped} already gone)" if skipped else ""
        self.message_user(request, f"Destroyed {destroyed}{suffix}")


def _task_link(task_id: int | None) -> SafeString | str:
    if task_id is None:
        return "-"
    return format_html('<a href="{}">task #{}</a>', reverse("admin:tasks_task_change", args=[task_id]), task_id)


class StageRunInline(ReadOnlyInline):
    """A run's stage runs, read-only and collapsed; each links to its full record and its task."""

    model = StageRun
    fields = ("index", "stage", "item_key", "kind", "status", "repair_attempts", "llm_calls", "total_tokens",
              "cost_usd", "short_error", "produced_task", "parsed")
    readonly_fields = fields
    ordering = ("index", "item_key")

    @admin.display(description="error")
    def short_error(self, obj: StageRun) -> str:
        return obj.error[:200]

    @admin.display(description="task")
    def produced_task(self, obj: StageRun) -> SafeString | str:
        return _task_link(obj.task_id)

    @admin.display(description="parsed output")
    def parsed(self, obj: StageRun) -> SafeString:
        return pretty_json(obj.parsed_output)


class PipelineStatusFilter(admin.SimpleListFilter):
    title = "heartbeat"
    parameter_name = "heartbeat"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("stale", "running, no heartbeat for 15 minutes")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "stale":
            return queryset.filter(status=PipelineRun.Status.RUNNING,
                                   heartbeat_at__lt=timezone.now() - timedelta(minutes=15))
        return queryset


@admin.register(PipelineRun)
class PipelineRunAdmin(ActionsOnlyMixin, IdSearchMixin, ReadableJSONMixin, AuditTrailMixin, admin.ModelAdmin):
    """Read-only runs; status changes only by the Start / Cancel / Resume actions (services, audited)."""

    list_display = ("id", "scene", "name", "status", "item_count", "items_done", "items_dropped", "tasks_created",
                    "llm_calls", "cost_usd", "batch", "created_at", "finished_at")
    list_filter = ("status", "scene", PipelineStatusFilter, "created_at")
    search_fields = ("name", "batch_name", "error")
    list_select_related = ("batch", "created_by")
    show_full_result_count = False
    actions = ["start_selected", "cancel_selected", "resume_selected"]
    inlines = [StageRunInline]
    json_fields = ("seeds", "config")
    fieldsets = [
        (None, {"fields": ["uuid", "scene", "name", "status", "cancel_requested", "error", "batch_name", "batch_link",
                           "created_by"]}),
        ("counts", {"fields": ["item_count", "items_done", "items_dropped", "tasks_created", "llm_calls",
                               "total_tokens", "cost_usd"]}),
        ("input", {"classes": ["collapse"], "fields": ["seeds", "config"]}),
        ("worker", {"fields": ["worker", "attempts", "heartbeat_at", "created_at", "queued_at", "started_at",
                               "finished_at"]}),
        ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]}),
    ]
    readonly_fields = (
        "uuid", "scene", "name", "status", "cancel_requested", "error", "batch_name", "batch_link", "created_by",
        "item_count", "items_done", "items_dropped", "tasks_created", "llm_calls", "total_tokens", "cost_usd",
        "seeds", "config", "worker", "attempts", "heartbeat_at", "created_at", "queued_at", "started_at",
        "finished_at", "recent_audit_events",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs start from `manage.py synthesize_pipeline` (seeds are a file)

    @admin.display(description="batch")
    def batch_link(self, obj: PipelineRun) -> SafeString | str:
        if obj.batch_id is None:
            return "- (created with the first task)"
        url = f"{reverse('admin:tasks_task_changelist')}?batch__id__exact={obj.batch_id}"
        return format_html('<a href="{}">{} (its tasks)</a>', url, obj.batch_name)

    def _each(self, request: HttpRequest, queryset: QuerySet, verb: str, service: Any) -> None:
        done, refused = 0, []
        for run in queryset:
            try:
                service(run=run, actor=request.user)
                done += 1
            except pipeline_services.TransitionError as exc:
                refused.append(str(exc))
        self.message_user(request, f"{verb} {done}")
        if refused:
            self.message_user(request, "; ".join(refused[:5]), messages.WARNING)

    @admin.action(description="Start (dispatch again) selected queued runs", permissions=["change"])
    def start_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, "Started", pipeline_services.pipeline_run_start)

    @admin.action(description="Cancel selected runs", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, "Cancelled", pipeline_services.pipeline_run_cancel)

    @admin.action(description="Resume selected failed or cancelled runs", permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, "Resumed", pipeline_services.pipeline_run_resume)


@admin.register(StageRun)
class StageRunAdmin(ViewOnlyMixin, IdSearchMixin, ReadableJSONMixin, admin.ModelAdmin):
    """One stage run in full: what went in, the raw and parsed output, the validator's verdict."""

    list_display = ("id", "run", "index", "stage", "item_key", "kind", "status", "llm_calls", "total_tokens",
                    "task", "finished_at")
    list_filter = ("status", "kind", "stage")
    search_fields = ("item_key", "stage", "template_id", "error")
    list_select_related = ("run", "task")
    raw_id_fields = ("run", "task")
    show_full_result_count = False
    json_fields = ("inputs", "parsed_output", "validator_result")
    fieldsets = [
        (None, {"fields": ["run", "index", "stage", "kind", "item_key", "status", "error", "task_link"]}),
        ("prompt", {"fields": ["template_id", "template_version", "prompt_hash"]}),
        ("input and output", {"fields": ["inputs", "raw_output", "parsed_output", "validator_result",
                                         "repair_attempts"]}),
        ("cost", {"fields": ["attempts", "llm_calls", "prompt_tokens", "completion_tokens", "total_tokens",
                             "cost_usd", "created_at", "started_at", "finished_at"]}),
    ]
    readonly_fields = (
        "run", "index", "stage", "kind", "item_key", "status", "error", "task_link", "template_id",
        "template_version", "prompt_hash", "inputs", "raw_output", "parsed_output", "validator_result",
        "repair_attempts", "attempts", "llm_calls", "prompt_tokens", "completion_tokens", "total_tokens", "cost_usd",
        "created_at", "started_at", "finished_at",
    )

    @admin.display(description="task")
    def task_link(self, obj: StageRun) -> SafeString | str:
        return _task_link(obj.task_id)


# The MCP server registry (apps/engines/mcp_servers.py): read-only rows, the tool snapshot rendered
# readably, "Re-snapshot" and "Enable" / "Disable" through the registry's services.
@admin.register(McpServer)
class McpServerAdmin(ActionsOnlyMixin, ReadableJSONMixin, AuditTrailMixin, admin.ModelAdmin):
    list_display = ("name", "package_label", "primary_label", "tool_count", "short_sha256", "enabled",
                    "snapshot_at", "snapshot_start_ms")
    list_filter = ("enabled",)
    search_fields = ("name",)
    actions = ["resnapshot_selected", "enable_selected", "disable_selected"]
    json_fields = ("spec", "labels", "secrets", "fixtures", "state_probe")
    fieldsets = [
        (None, {"fields": ["name", "enabled", "package_label", "labels", "secrets"]}),
        ("tool snapshot", {"fields": ["tools_sha256", "snapshot_at", "snapshot_start_ms", "tool_table"]}),
        ("launch", {"fields": ["spec", "fixtures", "state_probe"]}),
        ("times", {"fields": ["created_at", "updated_at"]}),
        ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]}),
    ]
    readonly_fields = ("name", "enabled", "package_label", "labels", "secrets", "tools_sha256", "snapshot_at",
                       "snapshot_start_ms", "tool_table", "spec", "fixtures", "state_probe", "created_at",
                       "updated_at", "recent_audit_events")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # registration starts the server in a sandbox: manage.py mcp_register

    @admin.display(description="package")
    def package_label(self, obj: McpServer) -> str:
        package = obj.package
        return f"{package.get('kind', '?')}: {package.get('name', '?')} {package.get('version', '')}".strip()

    @admin.display(description="primary label")
    def primary_label(self, obj: McpServer) -> str:
        return str(obj.labels.get("primary", ""))

    @admin.display(description="tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools)

    @admin.display(description="tools sha256")
    def short_sha256(self, obj: McpServer) -> str:
        return obj.tools_sha256[:12]

    @admin.display(description="tools (from the server's tools/list)")
    def tool_table(self, obj: McpServer) -> SafeString:
        denied = set(obj.deny_tools) | set(obj.spec.get("platform_tools") or [])
        rows = format_html_join("", "<tr><td><code>{}</code>{}</td><td style=\"white-space: pre-wrap\">{}</td><td>{}</td></tr>",
                                ((t.get("name", ""), " (not offered)" if t.get("name") in denied else "",
                                  t.get("description", ""), pretty_json(t.get("input_schema", {})))
                                 for t in obj.tools))
        return format_html("<table><thead><tr><th>name</th><th>description</th><th>input schema</th></tr></thead>"
                           "<tbody>{}</tbody></table>", rows)

    @admin.action(description="Re-snapshot the tools (start each server in a sandbox)", permissions=["change"])
    def resnapshot_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        changed, same = [], []
        for server in queryset:
            try:
                result = mcp_server_resnapshot(server=server, actor=request.user)
            except McpRegistryError as exc:
                self.message_user(request, f"Stopped at {server.name}: {exc}", messages.ERROR)
                return
            (changed if result.tools_changed else same).append(server.name)
        self.message_user(request, f"Re-snapshotted {len(changed) + len(same)}"
                          + (f"; tools changed: {', '.join(changed)}" if changed else "; no tools changed"))

    @admin.action(description="Enable selected MCP servers", permissions=["change"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected MCP servers", permissions=["change"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_enabled(request, queryset, False)

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet, enabled: bool) -> None:
        for server in queryset:
            mcp_server_set_enabled(server=server, enabled=enabled, actor=request.user)
        self.message_user(request, f"{'Enabled' if enabled else 'Disabled'} {queryset.count()}")


@admin.register(Corpus)
class CorpusAdmin(ActionsOnlyMixin, ReadableJSONMixin, AuditTrailMixin, admin.ModelAdmin):
    list_display = ("name", "pages", "links", "size_mb", "licence_list", "built_at")
    search_fields = ("name",)
    json_fields = ("sources", "inputs", "licences")
    readonly_fields = ("name", "path", "sha256", "pages", "links", "bytes", "sources", "inputs", "licences",
                       "build_seconds", "built_at", "created_at", "recent_audit_events")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # building reads packages and writes a file: manage.py corpus_build

    @admin.display(description="MB")
    def size_mb(self, obj: Corpus) -> str:
        return f"{obj.bytes / 1e6:.1f}"

    @admin.display(description="licences")
    def licence_list(self, obj: Corpus) -> str:
        return ", ".join(sorted({entry.get("licence", "?") for entry in obj.licences}))
