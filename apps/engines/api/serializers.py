"""Scene catalog and EnvScaler upload serializers."""
from __future__ import annotations

from typing import Any

from rest_framework import serializers

from trajplatform import json_limits
from trajplatform.api import LimitedJSONField, StrictSerializerMixin

MAX_UPLOAD_BYTES = 20 * 1024 * 1024


class SkillSerializer(serializers.Serializer):
    skill_id = serializers.CharField()
    description = serializers.CharField()
    trigger_keywords = serializers.ListField(child=serializers.CharField())
    must_clarify = serializers.JSONField()
    defaults = serializers.JSONField()
    required_params = serializers.ListField(child=serializers.CharField())


class SceneSerializer(serializers.Serializer):
    id = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    config_schema = serializers.JSONField(help_text="JSON schema (draft 2020-12) of a task's `config`")
    defaults = serializers.JSONField(help_text="config values filled in when a task leaves them out")
    required_params = serializers.ListField(child=serializers.CharField())
    skill = SkillSerializer(allow_null=True, help_text="VibeDataBot's skill manifest entry, when one is loaded")


class JSONUploadField(serializers.FileField):
    """An uploaded JSON file, decoded (or the JSON value itself in a JSON request body)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, (list, dict)):
            return data
        upload = super().to_internal_value(data)
        if upload.size > MAX_UPLOAD_BYTES:
            raise serializers.ValidationError(f"the file is larger than {MAX_UPLOAD_BYTES // (1024 * 1024)} MB")
        try:
            return json_limits.loads(upload.read().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise serializers.ValidationError(f"not a UTF-8 JSON document: {exc}") from None


class EnvScalerUploadSerializer(StrictSerializerMixin, serializers.Serializer):
    """Multipart (`metadata_file`, `scenarios_file`) or JSON (`metadata`, `scenarios`)."""

    metadata_file = JSONUploadField(required=False, help_text="environments JSON (list or {envs: [...]})")
    scenarios_file = JSONUploadField(required=False, help_text="scenarios JSON (list or {tasks|scenarios: [...]})")
    metadata = LimitedJSONField(required=False)
    scenarios = LimitedJSONField(required=False)
    batch = serializers.CharField(required=False, allow_blank=True, max_length=200)
    start = serializers.BooleanField(required=False, default=False, help_text="queue the tasks' first iteration now")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for name in ("metadata", "scenarios"):
            has_file, has_value = f"{name}_file" in attrs, name in attrs
            if has_file == has_value:
                raise serializers.ValidationError({name: [f"send exactly one of `{name}_file` (upload) or `{name}` (JSON)"]})
            if has_file:
                attrs[name] = attrs.pop(f"{name}_file")
        return attrs


class EnvScalerUploadResponseSerializer(serializers.Serializer):
    batch = serializers.IntegerField()
    name = serializers.CharField()
    task_count = serializers.IntegerField()
    started = serializers.IntegerField()
