"""Console pages for reviews, proposals and the risk policy.

Reviews are written by the review agent and by reviewers (the /review/ pages) and are never
deleted; proposals are made through `proposal_propose` (the proposal add page: the only way a
person changes a task's config) and decided through `proposal_decide` (the actions below call
it, exactly as the /review/ queue does); policy rules are edited by admins, each change audited.
"""
from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.safestring import SafeString

from apps.reviews import policy, queue_actions, services
from apps.reviews.models import BatchTally, PolicyRule, Proposal, Review, ReviewAssignment
from apps.reviews.selectors import stale_before
from apps.tasks.models import Task
from apps.tasks.services import TransitionError
from trajplatform.admin_base import (
    AuditTrailMixin, IdSearchMixin, ReadableJSONMixin, ViewOnlyMixin, change_link, truncated_column,
)


@admin.register(Review)
class ReviewAdmin(IdSearchMixin, ReadableJSONMixin, admin.ModelAdmin):
    list_display = (
        "id", "trajectory_link", "kind", "status", "overall", "verdict", "reviewer", "judge_short", "created_at",
    )
    list_filter = ("kind", "status", "verdict", "trajectory__task__scene", "judge_model")
    search_fields = ("trajectory__task__external_id", "judge_model", "reviewer__username")
    id_search_fields = ("pk", "trajectory_id")
    # Not the trajectory: its row carries the whole episode; the link needs only the id.
    list_select_related = ("reviewer",)
    raw_id_fields = ("trajectory", "reviewer")
    show_full_result_count = False
    json_fields = ("scores", "checks", "suggestions", "step_flags")
    json_tables = ("scores", "checks")
    readonly_fields = ("created_at",)
    judge_short = truncated_column("judge_model", "judge", 20, ordering="judge_model")
    fieldsets = [
        (None, {"fields": ["trajectory", "kind", "status", "overall", "verdict", "rationale", "reviewer"]}),
        ("details", {"fields": ["scores", "checks", "suggestions", "step_flags", "error", "attempts", "cost_usd"]}),
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

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # reviews and verdicts are the record of what was judged


class StaleFilter(admin.SimpleListFilter):
    title = "waiting"
    parameter_name = "stale"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "pending longer than REVIEW_STALE_PROPOSAL_HOURS")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(status=Proposal.Status.PENDING, created_at__lt=stale_before())
        return queryset


TIER_DECIDERS = {policy.GREEN: "applied at once", policy.YELLOW: "a reviewer decides",
                 policy.RED: "an approver decides", policy.REFUSE: "refused"}
# Taken as typed; other fields' values are JSON (a number, a list, an object), or text if not JSON.
TEXT_FIELDS = frozenset({"prompt", "system_prompt_extra", "model"})


def rule_summary(rule: policy.Rule) -> str:
    bounds = []
    if rule.min_value is not None or rule.max_value is not None:
        bounds.append(f"{rule.min_value if rule.min_value is not None else '…'}–"
                      f"{rule.max_value if rule.max_value is not None else '…'}")
    if rule.allowed_values:
        bounds.append("one of " + ", ".join(map(str, rule.allowed_values)))
    within = f" within {'; '.join(bounds)}" if bounds else ""
    return (f"{rule.field}: {rule.tier}{within} ({TIER_DECIDERS[rule.tier]}); "
            f"otherwise {rule.out_of_bounds_tier} ({TIER_DECIDERS[rule.out_of_bounds_tier]})")


def parse_value(field: str, raw: str) -> Any:
    if field in TEXT_FIELDS:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class ProposeForm(forms.Form):
    task = forms.IntegerField(min_value=1, help_text="the task's id")
    field = forms.ChoiceField(help_text="only fields with an enabled policy rule can change")
    value = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 90}), strip=False,
        help_text="the new value: JSON for numbers, lists and objects (2400, [\"run_shell\"]); "
                  "prompt, system_prompt_extra and model as typed; other text as typed",
    )
    rationale = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 90}), required=False, max_length=4000)

    def __init__(self, *args: Any, rules: dict[str, policy.Rule], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["field"].choices = [(name, rule_summary(rule)) for name, rule in sorted(rules.items())]


@admin.register(Proposal)
class ProposalAdmin(ViewOnlyMixin, IdSearchMixin, AuditTrailMixin, ReadableJSONMixin, admin.ModelAdmin):
    list_display = (
        "id", "task_short", "field", "tier", "status", "iteration", "proposer_short", "decided_by", "created_at",
    )
    list_filter = ("tier", "status", StaleFilter, "task__scene", "task__batch")
    actions = ["approve_proposed_value", "reject_selected"]
    search_fields = ("task__external_id", "field", "proposer")
    id_search_fields = ("pk", "task_id")
    list_select_related = ("task", "decided_by")
    raw_id_fields = ("task", "review", "decided_by", "proposed_by")
    show_full_result_count = False
    json_fields = ("from_value", "to_value", "options", "chosen_option")
    task_short = truncated_column("task", "task", 32, ordering="task_id")
    proposer_short = truncated_column("proposer", "proposer", 20, ordering="proposer")
    fieldsets = [
        (None, {"fields": ["task", "review", "iteration", "tier", "status", "proposer", "proposed_by"]}),
        ("change", {"fields": ["field", "from_value", "to_value", "options", "rationale", "impact_note"]}),
        ("decision", {"fields": ["decided_by", "decided_at", "chosen_option", "comment"]}),
        ("times", {"fields": ["created_at"]}),
        ("audit", {"classes": ["collapse"], "fields": ["recent_audit_events"]}),
    ]
    readonly_fields = ("created_at", "recent_audit_events")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("reviews.decide_yellow_proposal")

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: Any = None) -> HttpResponse:
        """Propose a change to a task's config through `proposal_propose`: the policy sets the tier."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        rules = policy.rules()
        asked = request.GET.get("task", "")
        form = ProposeForm(request.POST or None, rules=rules, initial={"task": asked})
        task = Task.objects.filter(pk=int(asked)).first() if asked.isdigit() and len(asked) < 19 else None
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            task = Task.objects.filter(pk=data["task"]).first()
            if task is None:
                form.add_error("task", f"there is no task {data['task']}")
            else:
                try:
                    proposal = services.proposal_propose(
                        task=task, actor=request.user, field=data["field"],
                        to_value=parse_value(data["field"], data["value"]), rationale=data["rationale"])
                except (PermissionDenied, services.DecisionError, TransitionError) as exc:
                    form.add_error(None, str(exc))
                else:
                    outcome = ("applied" if proposal.status == Proposal.Status.APPLIED
                               else f"pending: {TIER_DECIDERS[proposal.tier]}")
                    self.message_user(request, f"Proposed {proposal.field} {proposal.from_value!r} -> "
                                               f"{proposal.to_value!r} for task {task.pk}: {proposal.tier}, {outcome}")
                    return HttpResponseRedirect(reverse("admin:reviews_proposal_change", args=[proposal.pk]))
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": "Propose a change to a task",
            "form": form, "task": task, "media": self.media + form.media,
        }
        return TemplateResponse(request, "admin/reviews/proposal/propose.html", context)

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


@admin.register(ReviewAssignment)
class ReviewAssignmentAdmin(ViewOnlyMixin, AuditTrailMixin, admin.ModelAdmin):
    """Assignments are made in the review queue (bulk "assign", approvers); here they are read, and
    withdrawn through review_unassign."""

    list_display = ("id", "trajectory_id", "assignee", "assigned_by", "status", "assigned_at", "ended_at")
    list_filter = ("status",)
    list_select_related = ("assignee", "assigned_by")
    search_fields = ("assignee__username",)
    show_full_result_count = False
    actions = ["withdraw"]
    fields = readonly_fields = ("trajectory", "assignee", "assigned_by", "status", "assigned_at", "ended_at",
                                "recent_audit_events")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # the withdraw action needs it (no object: the changelist's actions); no change form
        return obj is None and request.user.has_perm(queue_actions.ASSIGN_PERMISSION)

    @admin.action(description="Withdraw the selected active assignments")
    def withdraw(self, request: HttpRequest, queryset: QuerySet[ReviewAssignment]) -> None:
        done = 0
        for assignment in queryset.filter(status=ReviewAssignment.Status.ACTIVE).select_related("trajectory", "assignee"):
            if queue_actions.review_unassign(trajectory=assignment.trajectory, assignee=assignment.assignee,
                                             actor=request.user):
                done += 1
        self.message_user(request, f"Withdrew {done} assignment(s).")


@admin.register(BatchTally)
class BatchTallyAdmin(ViewOnlyMixin, admin.ModelAdmin):
    """The batches' counts the tally job derives and rewrites (apps.reviews.tallies); view-only."""

    list_display = ("batch", "spent_usd", "judge_usd", "accepted", "review_total", "review_done", "computed_at")
    list_select_related = ("batch",)
