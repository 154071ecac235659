"""Console pages for reviews and proposals: read-only until their services land.

Reviews are written by the review agent and proposals are decided through services (a later
issue adds the decide actions); here they can be listed, filtered and read.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString

from apps.reviews.models import Proposal, Review
from trajplatform.admin import ViewOnlyMixin, AuditTrailMixin, IdSearchMixin, ReadableJSONMixin, change_link


@admin.register(Review)
class ReviewAdmin(IdSearchMixin, ReadableJSONMixin, admin.ModelAdmin):
    list_display = (
        "id", "trajectory_link", "kind", "status", "overall", "verdict", "reviewer", "judge_model", "created_at",
    )
    list_filter = ("kind", "status", "verdict", "trajectory__task__scene")
    search_fields = ("trajectory__task__external_id", "judge_model", "reviewer__username")
    id_search_fields = ("pk", "trajectory_id")
    # Not the trajectory: its row carries the whole episode; the link needs only the id.
    list_select_related = ("reviewer",)
    raw_id_fields = ("trajectory", "reviewer")
    show_full_result_count = False
    json_fields = ("scores", "checks")
    readonly_fields = ("created_at",)
    fieldsets = [
        (None, {"fields": ["trajectory", "kind", "status", "overall", "verdict", "rationale", "reviewer"]}),
        ("details", {"fields": ["scores", "checks", "error"]}),
        ("judge", {"classes": ["collapse"], "fields": [
            "judge_model", "rubric_version", "judge_prompt", "judge_raw",
        ]}),
        ("times", {"fields": ["created_at", "finished_at"]}),
    ]

    @admin.display(description="trajectory", ordering="trajectory_id")
    def trajectory_link(self, obj: Review) -> SafeString | str:
        return change_link("tasks.trajectory", obj.trajectory_id, f"trajectory #{obj.trajectory_id}")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Proposal)
class ProposalAdmin(ViewOnlyMixin, IdSearchMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    list_display = (
        "id", "task", "field", "tier", "status", "iteration", "proposer", "decided_by", "decided_at", "created_at",
    )
    list_filter = ("tier", "status", "task__scene", "task__batch")
    search_fields = ("task__external_id", "field", "proposer")
    id_search_fields = ("pk", "task_id")
    list_select_related = ("task", "decided_by")
    raw_id_fields = ("task", "review", "decided_by")
    show_full_result_count = False
    json_fields = ("from_value", "to_value", "options", "chosen_option")
    fieldsets = [
        (None, {"fields": ["task", "review", "iteration", "tier", "status", "proposer"]}),
        ("change", {"fields": ["field", "from_value", "to_value", "options", "rationale", "impact_note"]}),
        ("decision", {"fields": ["decided_by", "decided_at", "chosen_option", "comment"]}),
        ("times", {"fields": ["created_at"]}),
        ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]}),
    ]
    readonly_fields = ("created_at", "recent_audit_events")

