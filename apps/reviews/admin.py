"""Console pages for reviews, proposals and the risk policy.

Reviews are written by the review agent and by reviewers (the /review/ pages); proposals are
decided through `apps.reviews.services.proposal_decide` (the actions below call it, exactly as
the /review/ queue does); policy rules are edited by admins, each change audited.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString

from apps.reviews import services
from apps.reviews.models import PolicyRule, Proposal, Review
from trajplatform.admin import ViewOnlyMixin, AuditTrailMixin, IdSearchMixin, ReadableJSONMixin, change_link


@admin.register(Review)
class ReviewAdmin(IdSearchMixin, ReadableJSONMixin, admin.ModelAdmin):
    list_display = (
        "id", "trajectory_link", "kind", "status", "overall", "verdict", "reviewer", "judge_model", "created_at",
    )
    list_filter = ("kind", "status", "verdict", "trajectory__task__scene", "judge_model")
    search_fields = ("trajectory__task__external_id", "judge_model", "reviewer__username")
    id_search_fields = ("pk", "trajectory_id")
    # Not the trajectory: its row carries the whole episode; the link needs only the id.
    list_select_related = ("reviewer",)
    raw_id_fields = ("trajectory", "reviewer")
    show_full_result_count = False
    json_fields = ("scores", "checks", "suggestions", "step_flags")
    readonly_fields = ("created_at",)
    fieldsets = [
        (None, {"fields": ["trajectory", "kind", "status", "overall", "verdict", "rationale", "reviewer"]}),
        ("details", {"fields": ["scores", "checks", "suggestions", "step_flags", "error", "attempts"]}),
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


class StaleFilter(admin.SimpleListFilter):
    title = "waiting"
    parameter_name = "stale"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "pending longer than REVIEW_STALE_PROPOSAL_HOURS")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            from apps.reviews.selectors import stale_before

            return queryset.filter(status=Proposal.Status.PENDING, created_at__lt=stale_before())
        return queryset


@admin.register(Proposal)
class ProposalAdmin(ViewOnlyMixin, IdSearchMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    list_display = (
        "id", "task", "field", "tier", "status", "iteration", "proposer", "decided_by", "decided_at", "created_at",
    )
    list_filter = ("tier", "status", StaleFilter, "task__scene", "task__batch")
    actions = ["approve_proposed_value", "reject_selected"]
    search_fields = ("task__external_id", "field", "proposer")
    id_search_fields = ("pk", "task_id")
    list_select_related = ("task", "decided_by")
    raw_id_fields = ("task", "review", "decided_by", "proposed_by")
    show_full_result_count = False
    json_fields = ("from_value", "to_value", "options", "chosen_option")
    fieldsets = [
        (None, {"fields": ["task", "review", "iteration", "tier", "status", "proposer", "proposed_by"]}),
        ("change", {"fields": ["field", "from_value", "to_value", "options", "rationale", "impact_note"]}),
        ("decision", {"fields": ["decided_by", "decided_at", "chosen_option", "comment"]}),
        ("times", {"fields": ["created_at"]}),
        ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]}),
    ]
    readonly_fields = ("created_at", "recent_audit_events")


    def _decide(self, request: HttpRequest, queryset: QuerySet, decision: str) -> None:
        done, refused = 0, []
        for proposal in queryset.filter(status=Proposal.Status.PENDING).order_by("pk"):
            try:
                services.proposal_decide(proposal=proposal, actor=request.user, decision=decision,
                                         comment="decided in the console")
                done += 1
            except (services.DecisionError, PermissionDenied) as exc:
                refused.append(f"#{proposal.pk}: {exc}")
        self.message_user(request, f"{decision.capitalize()}d {done} proposal(s)")
        for line in refused:
            self.message_user(request, line, messages.WARNING)

    @admin.action(description="Approve the proposed value of the selected pending proposals")
    def approve_proposed_value(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._decide(request, queryset, "approve")

    @admin.action(description="Reject the selected pending proposals")
    def reject_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._decide(request, queryset, "reject")


@admin.register(PolicyRule)
class PolicyRuleAdmin(AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    """The risk policy as data: admins edit it (every save and delete is audited)."""

    list_display = ("field", "tier", "min_value", "max_value", "out_of_bounds_tier", "enabled", "updated_at")
    list_filter = ("tier", "enabled")
    list_editable = ()
    search_fields = ("field",)
    json_fields = ("allowed_values",)
    readonly_fields = ("updated_at", "recent_audit_events")
    fields = ["field", "tier", "min_value", "max_value", "allowed_values", "out_of_bounds_tier", "impact_note",
              "enabled", "updated_at", "recent_audit_events"]

    def save_model(self, request: HttpRequest, obj: PolicyRule, form: Any, change: bool) -> None:
        services.policy_rule_save(rule=obj, actor=request.user, changed=list(form.changed_data))

    def delete_model(self, request: HttpRequest, obj: PolicyRule) -> None:
        services.policy_rule_delete(rule=obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for rule in queryset:
            services.policy_rule_delete(rule=rule, actor=request.user)
