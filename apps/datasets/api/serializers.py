"""Datasets, versions and export jobs."""
from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.datasets import exportability, services
from apps.datasets.exporters import format_table
from apps.datasets.exporters.answers import MODES
from apps.datasets.hf_layout import LAYOUTS
from apps.datasets.models import Dataset, DatasetVersion, ExportabilityRun, ExportJob, VersionBuild
from apps.datasets.selectors import export_checksums, template_checks
from trajplatform.api import INT64_MAX, LimitedJSONField, StrictSerializerMixin


class DatasetSerializer(serializers.ModelSerializer):
    n_versions = serializers.IntegerField(read_only=True)
    latest_number = serializers.IntegerField(read_only=True, allow_null=True)
    latest_published = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = Dataset
        fields = ["id", "name", "description", "created_at", "n_versions", "latest_number", "latest_published"]
        read_only_fields = fields


class VersionSerializer(serializers.ModelSerializer):
    dataset = serializers.SlugRelatedField(slug_field="name", read_only=True)
    parent = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    filter_spec = serializers.JSONField(read_only=True)
    counts = serializers.JSONField(read_only=True)

    class Meta:
        model = DatasetVersion
        fields = ["id", "dataset", "number", "status", "parent", "filter_spec", "counts", "split_seed", "notes",
                  "created_by", "created_at", "published_at"]
        read_only_fields = fields

    def get_parent(self, version: DatasetVersion) -> int | None:
        return version.parent.number if version.parent_id else None


class VersionDetailSerializer(VersionSerializer):
    data_card = serializers.JSONField(read_only=True)
    exporter_versions = serializers.JSONField(read_only=True)
    exports = serializers.SerializerMethodField()
    template_checks = serializers.SerializerMethodField()
    export_formats = serializers.SerializerMethodField(
        help_text="the formats that apply to the version and would write a line: format, description, lines, excluded")
    publish_warnings = serializers.SerializerMethodField(
        help_text="members of the version's own scenes that their scene's format would exclude")
    exportability = serializers.SerializerMethodField(help_text=(
        "the measurement of what each format would write, run after the version is written: status (queued, "
        "running, done, failed), done of total members, error; null for a version made before it was a job. "
        "Until it is done export_formats is empty and exporting or publishing the version is refused"))

    class Meta(VersionSerializer.Meta):
        fields = [*VersionSerializer.Meta.fields, "data_card", "exporter_versions", "exports", "template_checks",
                  "export_formats", "publish_warnings", "exportability"]
        read_only_fields = fields

    def get_exports(self, version: DatasetVersion) -> list[dict[str, Any]]:
        return export_checksums(version)

    def get_template_checks(self, version: DatasetVersion) -> list[dict[str, Any]]:
        return template_checks(version)

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_export_formats(self, version: DatasetVersion) -> list[dict[str, Any]]:
        """The formats this version can be exported in (all splits), with the card's counts (none
        while they are being measured)."""
        if self._exportability(version) not in (None, ExportabilityRun.Status.DONE):
            return []
        return exportability.offered(version.data_card or {})

    def _exportability(self, version: DatasetVersion) -> str | None:
        state = self.get_exportability(version)
        return state["status"] if state else None

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_exportability(self, version: DatasetVersion) -> dict[str, Any] | None:
        cache = self.context.setdefault("exportability", {})
        if version.pk not in cache:
            cache[version.pk] = services.exportability_state(version.pk)
        return cache[version.pk]

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_publish_warnings(self, version: DatasetVersion) -> list[str]:
        return exportability.publish_warnings(version.data_card or {})


class VersionCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    filter_spec = LimitedJSONField(help_text="the selection (see docs/datasets.md): scenes, outcome, min score, ...")
    parent = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=INT64_MAX,
                                      help_text="number of the version this one derives from")
    notes = serializers.CharField(required=False, allow_blank=True, max_length=4000, default="")


class VersionBuildSerializer(serializers.ModelSerializer):
    """A queued version build: poll `url` (or follow the page's websocket) until done or failed."""

    dataset = serializers.CharField(source="dataset_name", read_only=True)
    parent = serializers.SerializerMethodField()
    version = serializers.SerializerMethodField(help_text="the version's number once the build is done")
    url = serializers.SerializerMethodField()
    version_url = serializers.SerializerMethodField(help_text="the version's API URL once the build is done")
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = VersionBuild
        fields = ["id", "dataset", "parent", "status", "stage", "done", "total", "error", "version", "url",
                  "version_url", "requested_by", "created_at", "started_at", "finished_at"]
        read_only_fields = fields

    def get_parent(self, build: VersionBuild) -> int | None:
        return build.parent.number if build.parent_id else None

    def get_version(self, build: VersionBuild) -> int | None:
        return build.version.number if build.version_id else None

    def get_url(self, build: VersionBuild) -> str:
        return reverse("api:version-build-detail", kwargs={"build_id": build.pk})

    def get_version_url(self, build: VersionBuild) -> str | None:
        if not build.version_id:
            return None
        return reverse("api:version-detail", kwargs={"name": build.dataset_name, "number": build.version.number})


@extend_schema_field({"type": "string", "enum": [row.name for row in format_table()]})
class ExportFormatField(serializers.CharField):
    """An exporter name: every format is in the schema's enum, with its line (exporters.format_table);
    which of them apply to a version is the service's to say."""


class ExportStartSerializer(StrictSerializerMixin, serializers.Serializer):
    """The export's options; the service refuses a format that does not apply to the version or
    would write no line of the split, a roles choice the version or the format cannot take, and a
    final_answer the format does not take, answered as a 400 naming the field (ExportError.field,
    mapped in trajplatform.api)."""

    format = ExportFormatField(max_length=40, help_text=(
        "an exporter name that applies to the version (its data card's exportability.formats with lines, the "
        "version detail's export_formats); what each is for and which consumer loads it:\n\n"
        + "\n".join(f"* `{row.name}`: {row.line}" for row in format_table())))
    split = serializers.ChoiceField(choices=ExportJob.Split.choices, default=ExportJob.Split.ALL)
    layout = serializers.ChoiceField(choices=LAYOUTS, default="jsonl", help_text=(
        "jsonl: one JSONL file (downloadable); hf: the Hugging Face layout, a folder of Parquet shards per split and "
        "a README.md card under DATASET_EXPORT_DIR (read on the server with datasets.load_dataset)"))
    roles = serializers.ChoiceField(choices=list(exportability.ROLE_CHOICES), default="trainable", help_text=(
        "multi_agent versions: whose views the per-role formats write — trainable (every role not marked "
        "trainable: false), lead (the lead only) or all"))
    final_answer = serializers.ChoiceField(choices=list(MODES), required=False, allow_null=True, default=None,
                                           help_text=(
        "the chat formats: text (their default) ends each episode on the final answer as an assistant message, "
        "finish out of the tools; tool keeps the finish call and its acknowledgement (a submit-tool agent). "
        "toucan and toolace take text only; a format without the option (raw, atif, adp, mini-swe-agent, qa, aitw) "
        "refuses it. Omitted or null: the format's default"))


class ExportJobSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="version.dataset.name", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True)
    layout = serializers.ChoiceField(choices=LAYOUTS, read_only=True, help_text="jsonl (one file) or hf (a folder)")
    roles = serializers.ChoiceField(choices=list(ExportJob.ROLES), read_only=True, help_text=(
        "whose views a multi_agent export's per-role formats write; trainable (the default) for any other"))
    final_answer = serializers.ChoiceField(choices=list(MODES), read_only=True, allow_null=True, help_text=(
        "the final_answer the job was started with (exports.md, \"Final answers\"); null: the format's default"))
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = ExportJob
        fields = ["id", "dataset", "version", "format", "format_version", "layout", "roles", "final_answer", "split",
                  "status", "sha256", "lines", "bytes", "members", "error", "created_at", "started_at", "finished_at",
                  "download_url"]
        read_only_fields = fields

    def get_download_url(self, job: ExportJob) -> str | None:
        if job.status != ExportJob.Status.DONE or not job.in_export_dir or job.layout == "hf":
            return None  # a Hugging Face layout is a folder, not one file to download
        return f"/api/v1/exports/{job.pk}/download"


class TemplateCheckStartSerializer(StrictSerializerMixin, serializers.Serializer):
    template = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", max_length=100,
                                      help_text="a chat template's name in DATASET_CHAT_TEMPLATE_DIR (NAME.jinja)")


class TemplateCheckSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    export = serializers.IntegerField(source="export_id")
    format = serializers.CharField()
    template = serializers.CharField()
    template_sha256 = serializers.CharField()
    records = serializers.IntegerField()
    passed = serializers.IntegerField()
    failed = serializers.IntegerField()
    summary = serializers.JSONField(help_text="totals, what the template drops by design (properties: property, "
                                        "turns, records), its own errors (render_errors: error, records, lines) "
                                        "and the failing records with their problems")
    created_at = serializers.DateTimeField()


IMPORT_FORMATS = ["raw", "atif", "adp", "mini-swe-agent"]


class TrajectoryImportSerializer(StrictSerializerMixin, serializers.Serializer):
    """A multipart upload: the file and how to read it (as `manage.py import_trajectories`)."""

    file = serializers.FileField(help_text="a raw export (JSONL), or another tool's trajectories in `format`")
    format = serializers.ChoiceField(choices=IMPORT_FORMATS, default="raw", help_text=(
        "raw (ours); atif (Harbor's ATIF v1.0-v1.7, JSONL, a JSON list or one trajectory.json); adp (Agent Data "
        "Protocol 1.x or without schema_version, JSONL or a JSON list); mini-swe-agent (a saved .traj.json, or "
        "JSONL of them)"))
    batch = serializers.CharField(required=False, max_length=200, help_text="one new batch for every imported task")
    outcome = serializers.ChoiceField(choices=["success", "failure"], required=False, help_text=(
        "the outcome of trajectories from another tool (required for those, ignored for our own exports)"))
    scene = serializers.CharField(required=False, max_length=40, help_text="the scene of another tool's tasks")


class TrajectoryImportResultSerializer(serializers.Serializer):
    batches = serializers.ListField(child=serializers.DictField())
    tasks = serializers.IntegerField()
    trajectories = serializers.IntegerField()
    reviews = serializers.IntegerField()
    rehashed = serializers.IntegerField(help_text="lines whose content no longer matched their content_sha256")
    sha256 = serializers.CharField(help_text="of the file as imported")
    warnings = serializers.ListField(child=serializers.CharField(), help_text=(
        "imported trajectories a chat format (sft-trl, sft-openai, sharegpt) cannot take as they are: "
        "FILE: id: not exportable as FORMAT: reason"))
