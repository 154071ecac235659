"""Proposals, reviews and human verdicts."""
from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.reviews.models import Proposal, Review
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
    scene = serializers.RegexField(NO_NUL_PATTERN, required=False, max_length=32)
    batch = serializers.IntegerField(required=False, min_value=1, max_value=INT64_MAX)
    task = serializers.IntegerField(required=False, min_value=1, max_value=INT64_MAX)
    stale = serializers.BooleanField(required=False, default=False,
                                     help_text="only proposals waiting longer than REVIEW_STALE_PROPOSAL_HOURS")
    mine = serializers.BooleanField(required=False, default=False, help_text="only tiers the caller may decide")

    def to_internal_value(self, data: Any) -> Any:
        # Query parameters: paging ones belong to the paginator.
        data = {k: v for k, v in data.items() if k not in ("cursor", "page_size")}
        return super().to_internal_value(data)
