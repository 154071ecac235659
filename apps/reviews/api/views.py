"""Pending proposals and their decisions, reviews, human verdicts; review assignments and saved views.
The tier, assignment and ownership rules live in the services (apps.reviews.services, .queue_actions)."""
from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.reviews import queue_actions, services
from apps.reviews.api import serializers as s
from apps.reviews.models import Proposal, Review, ReviewAssignment, SavedView
from apps.reviews.selectors import pending_proposals
from apps.tasks.api.views import ERRORS, ActionPermsMixin
from apps.tasks.models import Trajectory
from trajplatform.api import (
    ErrorSerializer, IdCursorPagination, IdFilter, LimitedJSONParser, StrictFilterSet, get_object_or_404,
    register_domain_errors,
)

# An item the assignment service refuses for its state (not finished, no free slot): a 409 naming
# every refused item under details.fields.trajectories (AssignRefused), or the one reason.
register_domain_errors((queue_actions.AssignError, 409, "conflict"))


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




ME = "me"


class ReviewAssignmentViewSet(ActionPermsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                              mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Review queue items assigned to named reviewers: approvers assign and see everyone's; a
    reviewer sees their own (another's is a 404, `?assignee=<them>` a 403) and may hand one back."""

    serializer_class = s.ReviewAssignmentSerializer
    filterset_class = None
    # JSON bodies only, like the saved views: a form would carry the ids' list as repeated strings
    # a schema cannot describe; anything else is a 415.
    parser_classes = [LimitedJSONParser]
    action_perms = {
        "list": ("reviews.view_reviewassignment",),
        "retrieve": ("reviews.view_reviewassignment",),
        "create": (queue_actions.ASSIGN_PERMISSION,),
        "destroy": ("reviews.add_review",),
    }

    def get_queryset(self) -> QuerySet[ReviewAssignment]:
        rows = ReviewAssignment.objects.select_related("assignee", "assigned_by")
        if getattr(self, "swagger_fake_view", False) or self.request.user.has_perm(queue_actions.ASSIGN_PERMISSION):
            return rows
        return rows.filter(assignee=self.request.user)

    @extend_schema(parameters=[s.AssignmentQuerySerializer],
                   responses={200: s.ReviewAssignmentSerializer(many=True), **ERRORS})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Newest first; `assignee=me` or a username, `status`, `trajectory`."""
        query = s.AssignmentQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        rows = self.get_queryset()
        name = query.validated_data.get("assignee")
        if name == ME or name == request.user.get_username():
            rows = rows.filter(assignee=request.user)
        elif name is not None:
            if not request.user.has_perm(queue_actions.ASSIGN_PERMISSION):
                raise exceptions.PermissionDenied("only approvers see other reviewers' assignments")
            rows = rows.filter(assignee__username=name)
        if "status" in query.validated_data:
            rows = rows.filter(status=query.validated_data["status"])
        if "trajectory" in query.validated_data:
            rows = rows.filter(trajectory_id=query.validated_data["trajectory"])
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(s.ReviewAssignmentSerializer(page, many=True).data)

    @extend_schema(request=s.AssignSerializer, responses={201: s.AssignmentsCreatedSerializer,
                                                          200: s.AssignmentsCreatedSerializer, 415: ErrorSerializer,
                                                          **ERRORS})
    def create(self, request: Request) -> Response:
        """Put finished trajectories in a reviewer's queue, all or none (201; 200 when every one was
        assigned to them already)."""
        body = s.AssignSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        result = queue_actions.review_assign_many(trajectory_ids=body.validated_data["trajectories"],
                                                  assignee=body.validated_data["assignee"], actor=request.user)
        items = [{**s.ReviewAssignmentSerializer(a).data, "created": created} for a, created in result]
        return Response({"assignments": items}, status=201 if any(c for _, c in result) else 200)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Withdraw an active assignment (approvers; or its assignee handing it back)."""
        assignment = self.get_object()
        if assignment.status != ReviewAssignment.Status.ACTIVE or queue_actions.review_unassign(
                trajectory=assignment.trajectory, assignee=assignment.assignee, actor=request.user) is None:
            raise queue_actions.AssignError(f"assignment {assignment.pk} is {assignment.get_status_display()}, "
                                            "not active")
        return Response(status=204)


class SavedViewViewSet(ActionPermsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The caller's saved views of the review queue (named filter sets); nobody sees another's."""

    serializer_class = s.SavedViewSerializer
    filterset_class = None
    # JSON bodies only: a form field cannot carry the filters' object (a multipart "filters" part
    # read as a form would be no filters at all, and an empty view saved); anything else is a 415.
    parser_classes = [LimitedJSONParser]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    action_perms = {action: ("tasks.view_trajectory",)
                    for action in ("list", "retrieve", "create", "partial_update", "destroy")}

    def get_queryset(self) -> QuerySet[SavedView]:
        if getattr(self, "swagger_fake_view", False):
            return SavedView.objects.none()
        return SavedView.objects.filter(user=self.request.user)

    @extend_schema(request=s.SavedViewWriteSerializer, responses={201: s.SavedViewSerializer,
                                                                  200: s.SavedViewSerializer, 415: ErrorSerializer,
                                                                  **ERRORS})
    def create(self, request: Request) -> Response:
        """Save filters under a name (201); a name the caller has already replaces that view's
        filters (200), as saving in the console does."""
        body = s.SavedViewWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        had = set(self.get_queryset().values_list("pk", flat=True))
        view = queue_actions.saved_view_save(user=request.user, name=body.validated_data["name"],
                                             query=body.validated_data["filters"])
        return Response(s.SavedViewSerializer(view).data, status=200 if view.pk in had else 201)

    # 415: a body that is not JSON, in the error envelope
    @extend_schema(request=s.SavedViewWriteSerializer(partial=True),
                   responses={200: s.SavedViewSerializer, 415: ErrorSerializer, **ERRORS})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Rename the view and/or replace its filters (a name of another of yours is a 400)."""
        body = s.SavedViewWriteSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        view = queue_actions.saved_view_update(view=self.get_object(), actor=request.user,
                                               name=body.validated_data.get("name"),
                                               query=body.validated_data.get("filters"))
        return Response(s.SavedViewSerializer(view).data)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        queue_actions.saved_view_delete(view=self.get_object(), actor=request.user)
        return Response(status=204)
