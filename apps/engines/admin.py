"""Console page for sandboxes: read-only rows, one action that destroys through the service."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from apps.engines.models import SandboxRecord
from apps.engines.sandboxes.base import SandboxError
from apps.engines.sandboxes.records import sandbox_destroy_records
from trajplatform.admin import AuditTrailMixin, IdSearchMixin, ReadableJSONMixin


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
