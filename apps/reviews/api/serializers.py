"""Proposals, reviews and human verdicts; review assignments and saved views of the review queue."""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.http import QueryDict
from django.utils.http import urlencode
from rest_framework import serializers

from apps.reviews.models import Proposal, Review, ReviewAssignment, SavedView
from apps.reviews.queue_actions import BULK_MAX
from apps.reviews.queue_views import WorkFilterForm, queue_query
from trajplatform.api import (
    INT64_MAX, NO_NUL_PATTERN, BlankChoicesMixin, LimitedJSONField, RedactedOutputMixin, StrictSerializerMixin,
)


class ProposalSerializer(RedactedOutputMixin, serializers.ModelSerializer):
    decided_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    from_value = serializers.JSONField(read_only=True)
    to_value = serializers.JSONField(read_only=True)
    options = serializers.JSONField(read_only=True)
    chosen_option = serializers.JSONField(read_only=True)

    class Meta:
        model = Proposal
        fields = [
            "id", "task", "review", "iteration", "field", "from_value", "to_value", "options", "tier", "status",
            "rationale", "impact_note", "proposer", "decided_by", "decided_at", "chosen_option", "comment",
            "created_at",
        ]
        read_only_fields = fields


class DecisionSerializer(StrictSerializerMixin, serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "reject", "choose"])
    option = LimitedJSONField(required=False, allow_null=True, help_text="choose: an option's index or value")
    comment = serializers.CharField(required=False, allow_blank=True, max_length=4000, default="")


class ReviewSerializer(BlankChoicesMixin, RedactedOutputMixin, serializers.ModelSerializer):
    reviewer = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    scores = serializers.JSONField(read_only=True)
    checks = serializers.JSONField(read_only=True)
    step_flags = serializers.JSONField(read_only=True)

    class Meta:
        model = Review
        fields = [
            "id", "trajectory", "kind", "status", "scores", "checks", "overall", "verdict", "rationale",
            "step_flags", "judge_model", "rubric_version", "error", "reviewer", "created_at", "finished_at",
        ]
        read_only_fields = fields


class VerdictSerializer(StrictSerializerMixin, serializers.Serializer):
    verdict = serializers.ChoiceField(choices=Review.Verdict.choices)
    reason = serializers.CharField(max_length=10000, required=False, allow_blank=True, default="",
                                   help_text="why; required for reject and needs_fix, optional for accept")
    step_flags = serializers.ListField(
        child=serializers.DictField(), required=False, default=list,
        help_text="[{step: index, note: text}] pointing at the steps the verdict is about",
    )


class PendingQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    tier = serializers.ChoiceField(choices=[Proposal.Tier.YELLOW, Proposal.Tier.RED], required=False)
    # Not trimmed: a value of whitespace (or another character str.strip() drops) is a scene no
    # proposal has, an empty list, not a blank one refused (the schema says minLength 1).
    scene = serializers.RegexField(NO_NUL_PATTERN, required=False, min_length=1, max_length=32, trim_whitespace=False)
    batch = serializers.IntegerField(required=False, min_value=1, max_value=INT64_MAX)
    task = serializers.IntegerField(required=False, min_value=1, max_value=INT64_MAX)
    stale = serializers.BooleanField(required=False, default=False,
                                     help_text="only proposals waiting longer than REVIEW_STALE_PROPOSAL_HOURS")
    mine = serializers.BooleanField(required=False, default=False, help_text="only tiers the caller may decide")

    def to_internal_value(self, data: Any) -> Any:
        # Query parameters: paging ones belong to the paginator.
        data = {k: v for k, v in data.items() if k not in ("cursor", "page_size")}
        return super().to_internal_value(data)


class ReviewAssignmentSerializer(serializers.ModelSerializer):
    assignee = serializers.SlugRelatedField(slug_field="username", read_only=True)
    assigned_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ReviewAssignment
        fields = ["id", "trajectory", "assignee", "assigned_by", "status", "assigned_at", "ended_at"]
        read_only_fields = fields


class ReviewAssignmentCreatedSerializer(ReviewAssignmentSerializer):
    created = serializers.BooleanField(read_only=True, help_text="false: it was assigned to them already")

    class Meta(ReviewAssignmentSerializer.Meta):
        fields = [*ReviewAssignmentSerializer.Meta.fields, "created"]
        read_only_fields = fields


class AssignmentsCreatedSerializer(serializers.Serializer):
    assignments = ReviewAssignmentCreatedSerializer(many=True)


class UsernameField(serializers.SlugRelatedField):
    """A user by username; a NUL character is refused before the lookup (PostgreSQL refuses it in a
    query: it would be a 500)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            raise serializers.ValidationError("a username cannot contain NUL characters")
        return super().to_internal_value(data)


class AssignSerializer(StrictSerializerMixin, serializers.Serializer):
    assignee = UsernameField(
        slug_field="username", queryset=get_user_model().objects.all(), help_text="the reviewer's username",
        error_messages={"does_not_exist": "no user is named {value}"})
    trajectories = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=INT64_MAX), min_length=1, max_length=BULK_MAX,
        help_text="the ids of finished trajectories to put in the reviewer's queue (all or none)")


class AssignmentQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    assignee = serializers.RegexField(NO_NUL_PATTERN, required=False, min_length=1, max_length=150,
                                      trim_whitespace=False,  # as `scene` above: no user has that name
                                      help_text="`me`, or a username (approvers only: another person's)")
    status = serializers.ChoiceField(choices=ReviewAssignment.Status.choices, required=False)
    trajectory = serializers.IntegerField(required=False, min_value=1, max_value=INT64_MAX)

    def to_internal_value(self, data: Any) -> Any:
        # Query parameters: paging ones belong to the paginator.
        data = {k: v for k, v in data.items() if k not in ("cursor", "page_size")}
        return super().to_internal_value(data)


FILTER_NAMES = tuple(WorkFilterForm.base_fields)


class QueueFiltersField(serializers.DictField):
    """The review queue's filters ({facet: value}, the console's /review/work/ facets), checked by the
    console's own filter form; cleans to the query string the console saves."""

    def __init__(self, **kwargs: Any):
        super().__init__(child=serializers.JSONField(), help_text=(
            "the review queue's facets: " + ", ".join(FILTER_NAMES) + " (values as the console's filter "
            "form takes them: a batch by name, reviewers by username, assigned=me|nobody|<username>)"), **kwargs)

    def to_internal_value(self, data: Any) -> str:
        data = super().to_internal_value(data)
        errors = {name: ["unknown filter; filters: " + ", ".join(FILTER_NAMES)]
                  for name in data if name not in FILTER_NAMES}
        errors.update({name: ["must be a string or a number"] for name, value in data.items()
                       if name in FILTER_NAMES and (isinstance(value, bool) or not isinstance(value, (str, int, float)))})
        if errors:
            raise serializers.ValidationError(errors)
        query = queue_query(urlencode({name: str(value) for name, value in data.items()}))
        form = WorkFilterForm(QueryDict(query))
        if not form.is_valid():
            raise serializers.ValidationError({name: list(reasons) for name, reasons in form.errors.items()})
        return query


class SavedViewSerializer(RedactedOutputMixin, serializers.ModelSerializer):
    filters = serializers.SerializerMethodField()

    class Meta:
        model = SavedView
        fields = ["id", "name", "filters", "query", "created_at", "updated_at"]
        read_only_fields = fields

    def get_filters(self, view: SavedView) -> dict[str, str]:
        return dict(QueryDict(view.query).items())


class SavedViewWriteSerializer(StrictSerializerMixin, serializers.Serializer):
    name = serializers.CharField(max_length=100, help_text="a name of yours; POST with one you have replaces its filters")
    filters = QueueFiltersField()
