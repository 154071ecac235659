"""Pending proposals and their decisions, reviews, human verdicts. The tier rules live in the services."""
from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.reviews import services
from apps.reviews.api import serializers as s
from apps.reviews.models import Proposal, Review
from apps.reviews.selectors import pending_proposals
from apps.tasks.api.views import ERRORS, ActionPermsMixin
from apps.tasks.models import Trajectory
from trajplatform.api import IdCursorPagination, IdFilter, StrictFilterSet, get_object_or_404


class OldestFirstPagination(IdCursorPagination):
    ordering = "id"


class ProposalFilter(StrictFilterSet):
    status = django_filters.MultipleChoiceFilter(choices=Proposal.Status.choices)
    tier = django_filters.MultipleChoiceFilter(choices=Proposal.Tier.choices)
    task = IdFilter(field_name="task_id")

    class Meta:
        model = Proposal
        fields: list[str] = []


class ProposalViewSet(ActionPermsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Proposals (filter `status=pending` for the queue) and the one decide action."""

    queryset = Proposal.objects.select_related("decided_by")
    serializer_class = s.ProposalSerializer
    filterset_class = ProposalFilter
    action_perms = {
        "list": ("reviews.view_proposal",),
        "retrieve": ("reviews.view_proposal",),
        "pending": ("reviews.view_proposal",),
        "decide": ("reviews.change_proposal",),
    }

    @extend_schema(parameters=[s.PendingQuerySerializer], responses={200: s.ProposalSerializer(many=True), **ERRORS})
    @action(detail=False, methods=["get"], pagination_class=OldestFirstPagination, filterset_class=None)
    def pending(self, request: Request) -> Response:
        """The decision queue: pending yellow and red proposals, oldest first (`mine=true`: only
        the tiers the caller may decide)."""
        query = s.PendingQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = dict(query.validated_data)
        mine = params.pop("mine", False)
        rows = pending_proposals(**params)
        if mine:
            red = request.user.has_perm("reviews.decide_red_proposal")
            yellow = red or request.user.has_perm("reviews.decide_yellow_proposal")
            tiers = [tier for tier, allowed in (("yellow", yellow), ("red", red)) if allowed]
            rows = rows.filter(tier__in=tiers)
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(s.ProposalSerializer(page, many=True).data)

    @extend_schema(request=s.DecisionSerializer, responses={200: s.ProposalSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def decide(self, request: Request, pk: str | None = None) -> Response:
        """Approve, reject or choose an option; yellow needs a reviewer, red an approver."""
        body = s.DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        proposal = services.proposal_decide(
            proposal=self.get_object(), actor=request.user, decision=body.validated_data["decision"],
            option=body.validated_data.get("option"), comment=body.validated_data["comment"],
        )
        return Response(s.ProposalSerializer(proposal).data)


class ReviewFilter(StrictFilterSet):
    trajectory = IdFilter(field_name="trajectory_id")
    kind = django_filters.ChoiceFilter(choices=Review.Kind.choices)
    status = django_filters.ChoiceFilter(choices=Review.Status.choices)
    verdict = django_filters.ChoiceFilter(choices=Review.Verdict.choices)

    class Meta:
        model = Review
        fields: list[str] = []


class ReviewViewSet(ActionPermsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Automatic and human reviews of trajectories."""

    queryset = Review.objects.select_related("reviewer").defer("judge_prompt", "judge_raw")
    serializer_class = s.ReviewSerializer
    filterset_class = ReviewFilter
    action_perms = {"list": ("reviews.view_review",), "retrieve": ("reviews.view_review",)}


class VerdictView(APIView):
    """A reviewer's human verdict (accept / reject / revise) on a finished trajectory."""

    write_perms = ("reviews.add_review",)

    @extend_schema(request=s.VerdictSerializer, responses={201: s.ReviewSerializer, **ERRORS})
    def post(self, request: Request, trajectory_id: int) -> Response:
        trajectory = get_object_or_404(Trajectory.objects.all(), pk=trajectory_id)
        body = s.VerdictSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        review = services.human_verdict_record(
            trajectory=trajectory, actor=request.user, verdict=body.validated_data["verdict"],
            reason=body.validated_data["reason"], step_flags=body.validated_data["step_flags"] or None,
        )
        return Response(s.ReviewSerializer(review).data, status=201)


