"""Console page for corpora: read-only rows (a corpus changes only through `manage.py corpus_build`)."""
from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from apps.engines.models import Corpus
from trajplatform.admin import ActionsOnlyMixin, AuditTrailMixin, ReadableJSONMixin


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
