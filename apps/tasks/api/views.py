"""Tasks, batches and trajectories over HTTP. Every write is one service call."""
from __future__ import annotations

from typing import Any

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.engines.registry import SCENE_CHOICES
from apps.tasks import services
from apps.tasks.api import serializers as s
from apps.tasks.budgets import batch_set_budget
from apps.tasks.models import Batch, Task, Trajectory
from trajplatform.api import (
    ErrorSerializer, IdFilter, LimitedJSONParser, StrictFilterSet, UtcDateTimeFilter, idempotent,
)
from trajplatform.skills import enabled_scene_ids

ERRORS = {400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer,
          409: ErrorSerializer, 429: ErrorSerializer}


class ActionPermsMixin:
    """`action_perms` maps a viewset action to the model permissions it needs."""

    action_perms: dict[str, tuple[str, ...]] = {}

    def perms_for(self, request: Request) -> tuple[str, ...]:
        return self.action_perms.get(getattr(self, "action", None) or "", ("__no_such_permission__",))


class CreatedRangeFilterSet(StrictFilterSet):
    """`created_after` (inclusive) and `created_before` (exclusive), ISO 8601 date-times."""

    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcDateTimeFilter(field_name="created_at", lookup_expr="lt")


class TaskFilter(CreatedRangeFilterSet):
    status = django_filters.MultipleChoiceFilter(choices=Task.Status.choices)
    scene = django_filters.MultipleChoiceFilter(choices=SCENE_CHOICES)
    batch = IdFilter(field_name="batch_id")
    external_id = django_filters.CharFilter()

    class Meta:
        model = Task
        fields: list[str] = []


class TaskViewSet(ActionPermsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Submit tasks, follow them, cancel or retry them."""

    queryset = Task.objects.select_related("batch", "created_by")
    filterset_class = TaskFilter
    action_perms = {
        "list": ("tasks.view_task",),
        "retrieve": ("tasks.view_task",),
        "create": ("tasks.add_task",),
        "cancel": ("tasks.change_task",),
        "retry": ("tasks.change_task",),
    }

    def get_serializer_class(self) -> Any:
        return s.TaskDetailSerializer if self.action == "retrieve" else s.TaskSerializer

    @extend_schema(
        request=s.TaskCreateSerializer,
        responses={201: s.TaskCreateResponseSerializer, 200: s.TaskCreateResponseSerializer, **ERRORS},
        description=(
            "Create one or many tasks (all or nothing) and start them. Send an `Idempotency-Key` header to make "
            "retries safe: the same key with the same body returns the first response, with a different body "
            "409. With `batch`, items whose external id already exists in that batch return the existing task."
        ),
    )
    def create(self, request: Request) -> Response:
        body = s.TaskCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)

        def run() -> Response:
            result = services.tasks_create(
                items=body.validated_data["tasks"], actor=request.user,
                batch_name=body.validated_data.get("batch", ""), notes=body.validated_data.get("notes", ""),
                allowed_scenes=set(enabled_scene_ids()),
            )
            items = []
            for task, created in zip(result.tasks, result.created):
                items.append({**s.TaskSerializer(task).data, "created": created})
            data = {"batch": s.BatchRefSerializer(result.batch).data, "tasks": items}
            return Response(data, status=201 if any(result.created) else 200)

        return idempotent(request, "POST /api/v1/tasks", run)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.TaskSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel a task that has not finished (its running trajectory stops at the next step)."""
        return self._transition(request, services.task_cancel)

    @extend_schema(request=s.ReasonSerializer, responses={200: s.TaskSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Queue a failed or cancelled task again and start its next iteration."""
        return self._transition(request, services.task_retry)

    def _transition(self, request: Request, service: Any) -> Response:
        body = s.ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        task = service(task=self.get_object(), actor=request.user, reason=body.validated_data["reason"])
        return Response(s.TaskSerializer(task).data)


class BatchFilter(CreatedRangeFilterSet):
    name = django_filters.CharFilter()

    class Meta:
        model = Batch
        fields: list[str] = []


class BatchViewSet(ActionPermsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Batches with their progress (task count per status)."""

    queryset = Batch.objects.select_related("created_by")
    filterset_class = BatchFilter
    action_perms = {"list": ("tasks.view_batch",), "retrieve": ("tasks.view_batch",),
                    "budget": ("tasks.change_batch",)}

    def get_serializer_class(self) -> Any:
        return s.BatchDetailSerializer if self.action in ("retrieve", "budget") else s.BatchSerializer

    @extend_schema(request=s.BudgetSerializer, responses={200: s.BatchDetailSerializer, **ERRORS})
    @action(detail=True, methods=["post"], parser_classes=[LimitedJSONParser])  # JSON: null means none
    def budget(self, request: Request, pk: str | None = None) -> Response:
        """Set (or with null clear) the batch's cost budget; queued trajectories of a batch over
        budget wait, a running one stops at its next model call."""
        body = s.BudgetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        batch = batch_set_budget(batch=self.get_object(), budget_usd=body.validated_data["budget_usd"],
                                 actor=request.user)
        return Response(s.BatchDetailSerializer(batch).data)


class TrajectoryFilter(CreatedRangeFilterSet):
    status = django_filters.MultipleChoiceFilter(choices=Trajectory.Status.choices)
    outcome = django_filters.MultipleChoiceFilter(choices=Trajectory.Outcome.choices)
    task = IdFilter(field_name="task_id")
    batch = IdFilter(field_name="task__batch_id")
    scene = django_filters.MultipleChoiceFilter(field_name="task__scene", choices=SCENE_CHOICES)
    iteration = IdFilter(min_value=0)
    model = django_filters.CharFilter()
    min_reward = django_filters.NumberFilter(field_name="reward", lookup_expr="gte")

    class Meta:
        model = Trajectory
        fields: list[str] = []


class TrajectoryViewSet(ActionPermsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Trajectories: a light list (cursor-paginated, newest first) and the full episode by id."""

    filterset_class = TrajectoryFilter
    action_perms = {"list": ("tasks.view_trajectory",), "retrieve": ("tasks.view_trajectory",)}

    def get_queryset(self) -> Any:
        if self.action == "retrieve":  # a sub-episode (a multi_agent role's run) is retrievable too
            return Trajectory.all_objects.all()
        return Trajectory.objects.defer("messages", "tools", "steps", "verifier_output", "config_snapshot")

    def get_serializer_class(self) -> Any:
        return s.TrajectoryDetailSerializer if self.action == "retrieve" else s.TrajectorySummarySerializer
