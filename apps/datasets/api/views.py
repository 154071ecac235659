"""Dataset versions: list, create from a filter, publish; exports: start, poll, download with checksum."""
from __future__ import annotations

from typing import Any

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.datasets import selectors, services
from apps.datasets.api import serializers as s
from apps.datasets.models import DatasetVersion, ExportJob, VersionBuild
from apps.datasets.raw_import import interchange_import
from apps.tasks.api.views import ERRORS
from trajplatform.api import ErrorSerializer, get_object_or_404

VIEW = ("datasets.view_datasetversion",)


class DatasetListView(GenericAPIView):
    """Every dataset with its version count and latest (published) version."""

    read_perms = ("datasets.view_dataset",)
    serializer_class = s.DatasetSerializer

    def get_queryset(self) -> Any:
        return selectors.dataset_list()

    @extend_schema(responses={200: s.DatasetSerializer(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.DatasetSerializer(page, many=True).data)


class VersionListView(GenericAPIView):
    """A dataset's versions (GET) or a new draft version built from a filter spec (POST)."""

    read_perms = VIEW
    write_perms = ("datasets.add_datasetversion",)
    serializer_class = s.VersionSerializer

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return DatasetVersion.objects.none()
        return selectors.versions_of(selectors.dataset_get(self.kwargs["name"]))

    @extend_schema(responses={200: s.VersionSerializer(many=True), **ERRORS})
    def get(self, request: Request, name: str) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.VersionSerializer(page, many=True).data)

    @extend_schema(request=s.VersionCreateSerializer, responses={202: s.VersionBuildSerializer, **ERRORS},
                   description="Queue a build of a new draft version (selection, dedup, split, data card; the "
                               "dataset is created if new) on the workers. The request is checked at once (400 "
                               "for a bad filter spec); poll the build's `url` until `status` is done (its "
                               "`version_url`) or failed (its `error`).")
    def post(self, request: Request, name: str) -> Response:
        body = s.VersionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        parent_number = body.validated_data.get("parent")
        parent = selectors.version_get(name, parent_number) if parent_number else None
        build = services.version_build_start(
            dataset_name=name, filter_spec=body.validated_data["filter_spec"], actor=request.user, parent=parent,
            notes=body.validated_data["notes"],
        )
        data = s.VersionBuildSerializer(build).data
        return Response(data, status=202, headers={"Location": data["url"]})


class VersionBuildDetailView(APIView):
    """A version build's state: queued, running (stage, done of total), done (its version) or failed (why)."""

    read_perms = VIEW

    @extend_schema(responses={200: s.VersionBuildSerializer, **ERRORS})
    def get(self, request: Request, build_id: int) -> Response:
        build = get_object_or_404(VersionBuild.objects.select_related("parent", "version", "requested_by"), pk=build_id)
        return Response(s.VersionBuildSerializer(build).data)


class VersionDetailView(APIView):
    read_perms = VIEW

    @extend_schema(responses={200: s.VersionDetailSerializer, **ERRORS})
    def get(self, request: Request, name: str, number: int) -> Response:
        return Response(s.VersionDetailSerializer(selectors.version_get(name, number)).data)


class VersionPublishView(APIView):
    """Publish a draft version: it never changes again (approver role)."""

    write_perms = ("datasets.publish_datasetversion",)

    @extend_schema(request=None, responses={200: s.VersionDetailSerializer, **ERRORS})
    def post(self, request: Request, name: str, number: int) -> Response:
        version = services.dataset_version_publish(version=selectors.version_get(name, number), actor=request.user)
        return Response(s.VersionDetailSerializer(version).data)


class ExportStartView(APIView):
    """Start an export of one split in one format; poll /api/v1/exports/{id} until done."""

    write_perms = ("datasets.add_datasetversion",)

    @extend_schema(request=s.ExportStartSerializer, responses={202: s.ExportJobSerializer, **ERRORS})
    def post(self, request: Request, name: str, number: int) -> Response:
        version = selectors.version_get(name, number)
        body = s.ExportStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = services.export_start(
            version=version, fmt=body.validated_data["format"], split=body.validated_data["split"],
            actor=request.user, layout=body.validated_data["layout"], roles=body.validated_data["roles"],
            final_answer=body.validated_data.get("final_answer"),
        )
        return Response(s.ExportJobSerializer(job).data, status=202)


class ExportDetailView(APIView):
    read_perms = VIEW

    @extend_schema(responses={200: s.ExportJobSerializer, **ERRORS})
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(ExportJob.objects.select_related("version__dataset"), pk=job_id)
        return Response(s.ExportJobSerializer(job).data)


class ExportDownloadView(APIView):
    """The finished file; its SHA-256 is in the `X-Checksum-SHA256` header (and the job)."""

    read_perms = VIEW

    @extend_schema(responses={(200, "application/x-ndjson"): OpenApiResponse(OpenApiTypes.BINARY), **ERRORS})
    def get(self, request: Request, job_id: int) -> FileResponse:
        job, path = selectors.export_for_download(job_id)
        response = FileResponse(open(path, "rb"), as_attachment=True, filename=path.name,
                                content_type="application/x-ndjson")
        response["X-Checksum-SHA256"] = job.sha256
        response["ETag"] = f'"{job.sha256}"'
        return response


class TemplateCheckView(APIView):
    """Render a finished export through a chat template (by name) and record the per-record report."""

    write_perms = ("datasets.add_datasetversion",)

    @extend_schema(request=s.TemplateCheckStartSerializer, responses={201: s.TemplateCheckSerializer, **ERRORS})
    def post(self, request: Request, job_id: int) -> Response:
        body = s.TemplateCheckStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = get_object_or_404(ExportJob.objects.select_related("version__dataset"), pk=job_id)
        check, _report = services.template_check_run(job=job, template_name=body.validated_data["template"],
                                                     actor=request.user, by_name=True)
        return Response(s.TemplateCheckSerializer(check).data, status=201)


class TrajectoryImportView(APIView):
    """Import a file of trajectories (ours, or ATIF / ADP / mini-swe-agent): every line is checked
    first, a bad file is a 400 listing each problem as FILE:LINE: reason and nothing is written.
    Admins only: an import writes outcomes and human verdicts as the file states them."""

    write_perms = ("tasks.add_trajectory",)
    parser_classes = [MultiPartParser]

    # 415: a body that is not multipart/form-data (a file upload has no JSON form here)
    @extend_schema(request={"multipart/form-data": s.TrajectoryImportSerializer},
                   responses={201: s.TrajectoryImportResultSerializer, 415: ErrorSerializer, **ERRORS})
    def post(self, request: Request) -> Response:
        body = s.TrajectoryImportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        upload = data["file"]
        # RawImportError about a request field (batch, outcome) is answered under it (trajplatform.api)
        result = interchange_import(path_or_file=upload, fmt=data["format"], actor=request.user,
                                    batch_name=data.get("batch"), outcome=data.get("outcome"),
                                    scene=data.get("scene"))
        return Response({"batches": [{"id": b.pk, "name": b.name} for b in result.batches],
                         "tasks": result.task_count, "trajectories": result.trajectory_count,
                         "reviews": result.review_count, "rehashed": result.rehashed, "sha256": result.sha256,
                         "warnings": result.warnings}, status=201)
