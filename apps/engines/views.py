"""Console pages of the engines app: the EnvScaler upload (metadata + scenarios -> a batch).

Staff with the right to create batches (`tasks.add_batch`: reviewer and above) upload the two
JSON files; the import service validates everything (environment code and check functions
inside a sandbox) and either creates the batch or lists every per-item error, writing nothing.
"""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from apps.engines.pipelines.envscaler import envscaler_import
from apps.engines.scenes.envscaler.importer import EnvScalerImportError, ItemError
from trajplatform import json_limits

MAX_UPLOAD_BYTES = 16 << 20


class EnvScalerUploadForm(forms.Form):
    metadata = forms.FileField(label="Environment metadata (JSON)",
                               help_text="env_name, description, code, operations [, class_name]")
    scenarios = forms.FileField(label="Scenarios (JSON)",
                                help_text="task_id, task_desc, env_name, init_config, check_func")
    batch = forms.CharField(label="Batch name", required=False, max_length=200)
    dry_run = forms.BooleanField(label="Validate only (write nothing)", required=False)

    def _json(self, name: str) -> Any:
        upload = self.cleaned_data[name]
        if upload.size > MAX_UPLOAD_BYTES:
            raise forms.ValidationError(f"is larger than {MAX_UPLOAD_BYTES >> 20} MiB")
        try:
            return json_limits.loads(upload.read().decode("utf-8"))
        except ValueError as exc:  # not UTF-8, not JSON, or nested deeper than API_MAX_JSON_DEPTH
            raise forms.ValidationError(f"is not valid UTF-8 JSON: {exc}") from None

    def clean_metadata(self) -> Any:
        return self._json("metadata")

    def clean_scenarios(self) -> Any:
        return self._json("scenarios")


@require_http_methods(["GET", "POST"])
@staff_member_required
@permission_required("tasks.add_batch", raise_exception=True)
def envscaler_upload(request: HttpRequest) -> HttpResponse:
    errors: list[ItemError] = []
    result: dict[str, Any] | None = None
    status = 200
    if request.method == "POST":
        form = EnvScalerUploadForm(request.POST, request.FILES)
        if form.is_valid():
            data = form.cleaned_data
            try:
                outcome = envscaler_import(
                    metadata=data["metadata"], scenarios=data["scenarios"], actor=request.user,
                    batch_name=data["batch"] or None, dry_run=data["dry_run"],
                    source_name=f"{request.FILES['metadata'].name} + {request.FILES['scenarios'].name}",
                )
            except EnvScalerImportError as exc:
                errors, status = exc.errors, 400
            else:
                if not data["dry_run"]:
                    return redirect(reverse("admin:tasks_batch_change", args=[outcome.pk]))
                result = {"tasks": len(outcome),
                          "environments": sorted({row["scene_config"]["env_name"] for row in outcome})}
        else:
            status = 400
    else:
        form = EnvScalerUploadForm()
    return render(request, "engines/envscaler_upload.html",
                  {"form": form, "errors": errors, "result": result, "nav": "envscaler"}, status=status)
