"""Console page for the MCP server registry: read-only rows, the tool snapshot rendered readably,
"Re-snapshot" and "Enable" / "Disable" through the registry's services (apps/engines/admin.py imports it)."""
from __future__ import annotations


from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.engines.models import McpServer
from apps.engines.scenes.toucan.registry import McpRegistryError, mcp_server_resnapshot, mcp_server_set_enabled
from trajplatform.admin_base import ActionsOnlyMixin, AuditTrailMixin, ReadableJSONMixin, pretty_json


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
