"""GET /api/v1/scenes and POST /api/v1/envscaler/uploads."""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.views import APIView
from rest_framework.request import Request
from rest_framework.response import Response

from apps.engines.api import serializers as s
from apps.engines.pipelines.envscaler import envscaler_import
from apps.engines.registry import SCENES
from apps.tasks.services import tasks_enqueue
from trajplatform.api import ErrorSerializer, LimitedJSONParser
from trajplatform.skills import enabled_scene_ids, skill_for

ERRORS = {400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer, 429: ErrorSerializer}


def scene_data(scene_id: str) -> dict[str, Any]:
    scene = SCENES[scene_id]
    skill = skill_for(scene_id)
    return {
        "id": scene.id, "title": scene.title, "description": scene.description, "config_schema": scene.config_schema,
        "defaults": scene.defaults, "required_params": list(scene.required_params),
        "skill": skill.as_dict() if skill else None,
    }


class SceneListView(APIView):
    """Every enabled scene: description, config JSON schema, defaults, required parameters."""

    read_perms: tuple[str, ...] = ()
    serializer_class = s.SceneSerializer

    @extend_schema(responses={200: s.SceneSerializer(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        return Response([scene_data(sid) for sid in enabled_scene_ids()])


class SceneDetailView(APIView):
    read_perms: tuple[str, ...] = ()
    serializer_class = s.SceneSerializer

    @extend_schema(responses={200: s.SceneSerializer, **ERRORS})
    def get(self, request: Request, scene_id: str) -> Response:
        if scene_id not in enabled_scene_ids():
            raise exceptions.NotFound(f"no enabled scene {scene_id!r}")
        return Response(scene_data(scene_id))


class EnvScalerUploadView(APIView):
    """Upload EnvScaler environments (metadata) and scenarios: one batch of envscaler tasks."""

    read_perms: tuple[str, ...] = ("tasks.add_task",)
    write_perms: tuple[str, ...] = ("tasks.add_task", "tasks.add_batch")
    parser_classes = [MultiPartParser, FormParser, LimitedJSONParser]
    serializer_class = s.EnvScalerUploadSerializer

    @extend_schema(request=s.EnvScalerUploadSerializer,
                   responses={201: s.EnvScalerUploadResponseSerializer, **ERRORS})
    def post(self, request: Request) -> Response:
        if "envscaler" not in enabled_scene_ids():
            raise exceptions.ValidationError({"scene": ["the envscaler scene is not enabled on this platform"]})
        body = s.EnvScalerUploadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        files = [f.name for f in request.FILES.values()]
        batch = envscaler_import(
            metadata=data["metadata"], scenarios=data["scenarios"], actor=request.user,
            batch_name=data.get("batch") or None, source_name=", ".join(files) or "api upload",
        )
        started = tasks_enqueue(batch=batch, actor=request.user) if data["start"] else 0
        return Response(
            {"batch": batch.pk, "name": batch.name, "task_count": batch.task_count, "started": started}, status=201
        )
