"""Console pages for datasets, versions and members: read-only, except the publish action.

Datasets and versions are built by `dataset_version_create` (the /datasets/ pages, the API,
`manage.py dataset_create`), which validates, freezes the members and writes the audit row; a
form here would save neither. Nothing is deleted: versions are the record of what was exported.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.datasets.models import Dataset, DatasetMember, DatasetVersion, ExportJob, TemplateCheck, VersionBuild
from apps.datasets.services import PUBLISH_PERMISSION, dataset_version_publish
from trajplatform.admin_base import (
    ActionsOnlyMixin, AuditTrailMixin, IdSearchMixin, ReadableJSONMixin, ViewOnlyMixin, change_link, truncated_column,
)


class DatasetVersionInline(admin.TabularInline):
    model = DatasetVersion
    fields = ("number", "status", "published_at", "created_by", "created_at")
    readonly_fields = fields
    show_change_link = True
    can_delete = False
    extra = 0

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Dataset)
class DatasetAdmin(ViewOnlyMixin, admin.ModelAdmin):
    list_display = ("name_short", "description_short", "n_versions", "latest_published", "created_by", "created_at")
    search_fields = ("name", "description")
    list_select_related = ("created_by",)
    raw_id_fields = ("created_by",)
    readonly_fields = ("created_by", "created_at")
    inlines = [DatasetVersionInline]
    name_short = truncated_column("name", "name", 36, ordering="name")
    description_short = truncated_column("description", "description", 60)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_versions=Count("versions"),
                latest_published_number=Max("versions__number", filter=Q(versions__status="published")),
            )
        )

    @admin.display(description="versions", ordering="n_versions")
    def n_versions(self, obj: Dataset) -> int:
        return obj.n_versions

    @admin.display(description="latest published", ordering="latest_published_number")
    def latest_published(self, obj: Dataset) -> str:
        return "-" if obj.latest_published_number is None else f"v{obj.latest_published_number}"


@admin.register(DatasetVersion)
class DatasetVersionAdmin(ActionsOnlyMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    """View-only; approvers publish drafts with the action (`dataset_version_publish`)."""

    list_display = ("version_short", "status", "members_link", "published_at", "created_by", "created_at")
    list_filter = ("status", "dataset")
    search_fields = ("dataset__name", "notes")
    list_select_related = ("dataset", "created_by")
    raw_id_fields = ("dataset", "parent", "created_by")
    json_fields = ("filter_spec", "counts", "data_card", "exporter_versions")
    json_tables = ("filter_spec", "counts", "data_card", "exporter_versions")
    version_short = truncated_column("", "version", 40, ordering="dataset__name")
    readonly_fields = (
        "status", "published_at", "counts", "data_card", "exporter_versions", "created_by", "created_at",
        "members_link", "recent_audit_events",
    )
    fieldsets = [
        (None, {"fields": ["dataset", "number", "parent", "status", "published_at", "members_link"]}),
        ("selection", {"fields": ["filter_spec", "split_seed", "notes"]}),
        ("frozen record", {"fields": ["counts", "data_card", "exporter_versions"]}),
        ("created", {"fields": ["created_by", "created_at"]}),
        ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(n_members=Count("members"))

    @admin.display(description="members", ordering="n_members")
    def members_link(self, obj: DatasetVersion) -> SafeString | str:
        if obj.pk is None:
            return "-"
        url = f"{reverse('admin:datasets_datasetmember_changelist')}?{urlencode({'version__id__exact': obj.pk})}"
        n = getattr(obj, "n_members", None)
        return format_html('<a href="{}">{}</a>', url, "members" if n is None else n)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    actions = ["publish_versions"]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        if not request.user.has_perm(PUBLISH_PERMISSION):
            actions.pop("publish_versions", None)
        return actions

    @admin.action(description="Publish selected draft versions (they can never change afterwards)")
    def publish_versions(self, request: HttpRequest, queryset: QuerySet) -> None:
        n = 0
        for version in queryset.filter(status=DatasetVersion.Status.DRAFT):
            try:
                dataset_version_publish(version=version, actor=request.user)
            except PermissionDenied as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return
            n += 1
        self.message_user(request, f"Published {n}")


@admin.register(DatasetMember)
class DatasetMemberAdmin(ViewOnlyMixin, IdSearchMixin, admin.ModelAdmin):
    """Members are written by the version builder; read-only here."""

    list_display = ("version", "position", "trajectory_link", "split", "content_sha256")
    list_filter = ("split", "version__dataset", "version__status")
    search_fields = ("content_sha256__exact",)
    id_search_fields = ("trajectory_id",)
    list_select_related = ("version__dataset",)  # not the trajectory: the link needs only its id
    raw_id_fields = ("version", "trajectory")
    show_full_result_count = False

    @admin.display(description="trajectory", ordering="trajectory_id")
    def trajectory_link(self, obj: DatasetMember) -> SafeString | str:
        return change_link("tasks.trajectory", obj.trajectory_id, f"trajectory #{obj.trajectory_id}")



@admin.register(ExportJob)
class ExportJobAdmin(ViewOnlyMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    """Exports are started from the version page, the API or `dataset_export`; read-only here."""

    list_display = ("__str__", "version", "format", "split", "status", "lines", "n_excluded", "sha256",
                    "requested_by", "created_at", "finished_at")
    list_filter = ("status", "format", "split", "version__dataset")
    list_select_related = ("version__dataset", "requested_by")
    search_fields = ("sha256", "path")
    show_full_result_count = False
    json_fields = ("excluded",)
    fields = ("version", "format", "format_version", "split", "status", "path", "in_export_dir", "sha256", "lines",
              "bytes", "members", "resumed_chunks", "excluded", "error", "requested_by", "worker", "claims",
              "created_at", "started_at", "finished_at", "recent_audit_events")
    readonly_fields = ("recent_audit_events",)

    @admin.display(description="excluded")
    def n_excluded(self, obj: ExportJob) -> int:
        return len(obj.excluded or [])


@admin.register(VersionBuild)
class VersionBuildAdmin(ViewOnlyMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    """Version builds are queued by the console's builder and the API and run by the workers; read-only here."""

    list_display = ("__str__", "status", "stage", "done", "total", "version", "requested_by", "created_at",
                    "finished_at")
    list_filter = ("status",)
    list_select_related = ("version__dataset", "requested_by")
    raw_id_fields = ("parent", "version")
    show_full_result_count = False
    json_fields = ("filter_spec",)
    fields = ("dataset_name", "parent", "filter_spec", "notes", "status", "stage", "done", "total", "version",
              "error", "requested_by", "worker", "claims", "created_at", "started_at", "heartbeat_at", "finished_at",
              "recent_audit_events")
    readonly_fields = ("recent_audit_events",)


@admin.register(TemplateCheck)
class TemplateCheckAdmin(ViewOnlyMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    """Chat-template checks run by `dataset_export --check-template` or the API; read-only here."""

    list_display = ("__str__", "version", "export", "format", "template", "passed", "failed", "created_at")
    list_filter = ("format", "template", "version__dataset")
    list_select_related = ("version__dataset", "export")
    raw_id_fields = ("version", "export")
    show_full_result_count = False
    json_fields = ("summary",)
    json_tables = ("summary",)
    fields = ("version", "export", "format", "template", "template_sha256", "records", "passed", "failed", "summary",
              "created_by", "created_at", "recent_audit_events")
    readonly_fields = ("recent_audit_events",)
