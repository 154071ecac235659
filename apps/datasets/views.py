"""Dataset pages for signed-in users with the viewer role or above: datasets, a version's data
card (histograms as inline SVG), its members and exclusions, downloads with checksums, and a
compare page. Approvers can publish and start exports from the version page (through the
services, like everywhere else)."""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from apps.datasets import exportability, selectors, services
from apps.datasets.exporters import format_table
from apps.datasets.models import DatasetVersion, VersionBuild
from apps.engines.registry import SCENE_CHOICES
from apps.reviews.fields import SuggestInput, batch_ids
from apps.reviews.models import Correction, Review
from trajplatform.charts import histogram_svg

VIEW_PERMISSION = "datasets.view_datasetversion"
PAGE_SIZE = 50
MAX_NUMBER = 2**31 - 1
MAX_ID = 2**63 - 1


def _version_or_404(name: str, number: int) -> DatasetVersion:
    if number > MAX_NUMBER:
        raise Http404("no such version")
    try:
        return selectors.version_get(name, number)
    except selectors.NotFound as exc:
        raise Http404(str(exc)) from None


def _dataset_or_404(name: str) -> Any:
    try:
        return selectors.dataset_get(name)
    except selectors.NotFound as exc:
        raise Http404(str(exc)) from None


def _page(request: HttpRequest, items: Any, param: str = "page") -> Any:
    return Paginator(items, PAGE_SIZE).get_page(request.GET.get(param))


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def dataset_list(request: HttpRequest) -> HttpResponse:
    return render(request, "datasets/dataset_list.html",
                  {"nav": "datasets", "page": _page(request, selectors.dataset_list())})


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def dataset_detail(request: HttpRequest, name: str) -> HttpResponse:
    dataset = _dataset_or_404(name)
    page = _page(request, selectors.versions_of(dataset))
    return render(request, "datasets/dataset_detail.html",
                  {"nav": "datasets", "dataset": dataset, "page": page, "compare_form": CompareForm()})


FINAL_ANSWER_CHOICES = [
    ("", "the format's default (text where it takes the option)"),
    ("text", "text: the answer as the last assistant message"),
    ("tool", "tool: the finish call kept (submit-tool agents)"),
]


class ExportForm(forms.Form):
    """The formats that apply to the version's scenes and would write a line, with the card's
    counts; for a multi_agent version, whose views the per-role formats write; how the chat formats
    end an episode (final_answer). What the version cannot export is the service's to refuse (`start`):
    its ExportError lands on the field it names."""

    format = forms.CharField(max_length=40, widget=forms.Select)
    split = forms.ChoiceField(choices=[(s, s) for s in services.SPLITS])
    layout = forms.ChoiceField(choices=[("jsonl", "JSONL file"), ("hf", "Hugging Face layout (Parquet + card)")],
                               initial="jsonl", required=False)
    roles = forms.ChoiceField(choices=[(r, r) for r in exportability.ROLE_CHOICES], initial="trainable",
                              required=False)
    final_answer = forms.ChoiceField(choices=FINAL_ANSWER_CHOICES, initial="", required=False)

    def __init__(self, version: DatasetVersion, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.version = version
        card = version.data_card or {}
        self.offered = exportability.offered(card)
        lines = {row.name: row.line for row in format_table()}
        self.fields["format"].widget.choices = [
            (o["format"], o["format"] + ("" if o["lines"] is None else f" — {o['lines']} lines"
                                         + (f", {o['excluded']} excluded" if o["excluded"] else ""))
             + f" — {lines[o['format']]}") for o in self.offered]
        self.role_options = exportability.role_options(card)
        if self.role_options:  # shown for multi_agent versions; a choice posted for another is refused
            self.fields["roles"].choices = [(r["roles"], r["label"]) for r in self.role_options]

    def start(self, actor: Any) -> Any:
        """The export the form asks for (services.export_start), or None with the refusal on the form."""
        if not self.is_valid():
            return None
        try:
            return services.export_start(version=self.version, fmt=self.cleaned_data["format"],
                                         split=self.cleaned_data["split"], actor=actor,
                                         layout=self.cleaned_data.get("layout") or "jsonl",
                                         roles=self.cleaned_data.get("roles") or "trainable",
                                         final_answer=self.cleaned_data.get("final_answer") or None)
        except services.ExportError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, str(exc))
            return None

    def problems(self) -> str:
        """The form's errors in one line, each under its field unless its text already names it."""
        return " ".join(m if k == "__all__" or m.startswith(k) else f"{k}: {m}"
                        for k, messages_ in self.errors.items() for m in messages_)


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def version_detail(request: HttpRequest, name: str, number: int) -> HttpResponse:
    version = _version_or_404(name, number)
    exports = _page(request, selectors.exports_of(version), "exports_page")
    exports_live = any(e.status in ("queued", "running") for e in exports.object_list)
    if request.GET.get("fragment") == "exports":
        return render(request, "datasets/_exports.html",
                      {"version": version, "exports": exports, "exports_live": exports_live})
    card = version.data_card or {}
    pending = services.exportability_pending(version)  # no export form until the counts are in the card
    diff = card.get("diff") or {}
    verdict = (Review.objects.filter(trajectory=OuterRef("trajectory_id"), kind=Review.Kind.HUMAN)
               .order_by("-created_at", "-id").values("verdict")[:1])
    members = selectors.members_page_queryset(version).annotate(
        verdict=Subquery(verdict),
        corrects=Subquery(Correction.objects.filter(corrected=OuterRef("trajectory_id")).values("original_id")[:1]),
        corrected_by=Subquery(Correction.objects.filter(original=OuterRef("trajectory_id"))
                              .order_by("-created_at").values("corrected_id")[:1]))
    return render(request, "datasets/version_detail.html", {
        "nav": "datasets",
        "version": version,
        "card": card,
        "counts": version.counts or {},
        "score_svg": histogram_svg(card.get("score_histogram"), title="automatic review score (0-100)"),
        "reward_svg": histogram_svg(card.get("reward_histogram"), title="reward"),
        "quantiles": [(k, card.get(k) or {}) for k in ("turns", "text_tokens", "usage_tokens")],
        "members": _page(request, members, "members_page"),
        "excluded": _page(request, card.get("excluded") or [], "excluded_page"),
        "diff_added": _page(request, diff.get("added") or [], "added_page"),
        "diff_removed": _page(request, diff.get("removed") or [], "removed_page"),
        "exports": exports, "exports_live": exports_live,
        "can_publish": not version.is_published and request.user.has_perm(services.PUBLISH_PERMISSION),
        "can_export": request.user.has_perm(services.EXPORT_PERMISSION),
        "export_form": ExportForm(version) if pending is None else None,
        "measuring": pending,
        "pass_rate_svg": histogram_svg((card.get("pass_rates") or {}).get("histogram"),
                                       title="tasks by pass rate over their rollouts (0-1)"),
        "exportable": card.get("exportability"),
        "exportable_rows": exportability.rows(card),
    })


@login_required
@require_POST
def version_publish(request: HttpRequest, name: str, number: int) -> HttpResponse:
    version = _version_or_404(name, number)
    try:
        services.dataset_version_publish(version=version, actor=request.user)  # PermissionDenied -> 403
    except services.DatasetError as exc:
        messages.error(request, str(exc))
        return redirect("datasets:version_detail", name=name, number=number)
    messages.success(request, f"Published {version}.")
    for warning in services.publish_warnings(version):
        messages.warning(request, warning)
    return redirect("datasets:version_detail", name=name, number=number)


@login_required
@require_POST
def version_export(request: HttpRequest, name: str, number: int) -> HttpResponse:
    version = _version_or_404(name, number)
    if not request.user.has_perm(services.EXPORT_PERMISSION):
        raise PermissionDenied("exporting needs the approver role")
    form = ExportForm(version, request.POST)
    job = form.start(request.user)
    if job is None:
        messages.error(request, form.problems())
    else:
        messages.success(request, f"Export #{job.pk} ({job.format}/{job.split}) is {job.status}.")
    return redirect("datasets:version_detail", name=name, number=number)


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def export_download(request: HttpRequest, job_id: int) -> FileResponse:
    if job_id > MAX_ID:
        raise Http404("no such export")
    try:
        job, path = selectors.export_for_download(job_id)
    except selectors.NotFound as exc:
        raise Http404(str(exc)) from None
    name = f"{job.version.dataset.name}-v{job.version.number}-{job.format}-{job.split}.jsonl"
    response = FileResponse(open(path, "rb"), as_attachment=True, filename=name,
                            content_type="application/jsonl; charset=utf-8")
    response["X-Content-SHA256"] = job.sha256
    return response


class CompareForm(forms.Form):
    a = forms.IntegerField(min_value=1, max_value=MAX_NUMBER, label="version A")
    b = forms.IntegerField(min_value=1, max_value=MAX_NUMBER, label="version B")


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def version_compare(request: HttpRequest, name: str) -> HttpResponse:
    dataset = _dataset_or_404(name)
    form = CompareForm(request.GET or None)
    comparison, error = None, ""
    if form.is_bound and form.is_valid():
        try:
            a = selectors.version_get(name, form.cleaned_data["a"])
            b = selectors.version_get(name, form.cleaned_data["b"])
        except selectors.NotFound as exc:
            error = str(exc)
        else:
            comparison = selectors.version_compare(a, b)
            comparison["score_svgs"] = [histogram_svg(h, title=f"score v{v.number}")
                                        for h, v in zip(comparison["score_histograms"], (a, b))]
            comparison["reward_svgs"] = [histogram_svg(h, title=f"reward v{v.number}")
                                         for h, v in zip(comparison["reward_histograms"], (a, b))]
    status = 200 if not error else 404
    return render(request, "datasets/compare.html",
                  {"nav": "datasets", "dataset": dataset, "form": form, "cmp": comparison, "error": error},
                  status=status)


# --- the version builder --------------------------------------------------------------------------


class BuilderForm(forms.Form):
    """The filter spec (apps/datasets/spec.py) as a form; empty fields are left out of the spec."""

    dataset = forms.SlugField(max_length=100, label="Dataset name", help_text="an existing dataset or a new one")
    scenes = forms.MultipleChoiceField(choices=(), required=False, widget=forms.CheckboxSelectMultiple)
    batches = forms.CharField(required=False, max_length=2000, label="Batches", help_text="names, comma-separated",
                              widget=SuggestInput("batches", "batch names"))
    models = forms.CharField(required=False, max_length=2000, help_text="comma-separated",
                             widget=SuggestInput("models", "model names"))
    min_score = forms.FloatField(required=False, min_value=0, max_value=100, label="Minimum judge score")
    min_reward = forms.FloatField(required=False, label="Minimum reward")
    accepted_only = forms.BooleanField(required=False, label="Human-accepted only")
    success_only = forms.BooleanField(required=False, label="Successful only")
    prefer_corrections = forms.BooleanField(required=False, label="Prefer reviewers' corrections")
    since = forms.DateField(required=False, label="Finished since", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="Finished before", widget=forms.DateInput(attrs={"type": "date"}))
    dedup_exact = forms.BooleanField(required=False, initial=True, label="Drop exact duplicates")
    dedup_near = forms.BooleanField(required=False, initial=True, label="Drop near duplicates")
    validation_fraction = forms.FloatField(required=False, min_value=0, max_value=0.5, label="Validation share")
    notes = forms.CharField(required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["scenes"].choices = SCENE_CHOICES

    def clean_batches(self) -> list[int]:
        return batch_ids(self.cleaned_data["batches"] or "")

    def spec(self) -> dict[str, Any]:
        """The raw filter spec for validate_filter_spec (which reports what is still wrong)."""
        data = self.cleaned_data
        spec: dict[str, Any] = {"dedup": {"exact": data["dedup_exact"], "near": data["dedup_near"]}}
        if data["scenes"]:
            spec["scenes"] = list(data["scenes"])
        if data["batches"]:
            spec["batches"] = data["batches"]
        models = [p.strip() for p in (data["models"] or "").split(",") if p.strip()]
        if models:
            spec["models"] = models
        for key in ("min_score", "min_reward", "validation_fraction"):
            if data[key] is not None:
                spec[key] = data[key]
        for key in ("accepted_only", "success_only", "prefer_corrections"):
            if data[key]:
                spec[key] = True
        for key in ("since", "until"):
            if data[key]:
                spec[key] = data[key].isoformat()
        return spec


def _builder_preview(form: BuilderForm) -> dict[str, Any]:
    if not form.is_valid():
        return {"errors": [f"{k}: {' '.join(v)}" for k, v in form.errors.items()]}
    try:
        return {"preview": services.version_preview(form.spec())}
    except services.FilterSpecError as exc:
        return {"errors": [f"{k}: {v}" for k, v in exc.errors.items()]}


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def builder_preview(request: HttpRequest) -> HttpResponse:
    """The builder's live count and sample of members for the form as it stands (htmx fragment)."""
    return render(request, "datasets/_builder_preview.html", _builder_preview(BuilderForm(request.GET)))


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
def builder(request: HttpRequest) -> HttpResponse:
    """Build a dataset version from a form: a live count and sample first, then create (approvers)."""
    can_create = request.user.has_perm(services.CREATE_PERMISSION)
    if request.method == "POST":
        if not can_create:
            raise PermissionDenied("building a dataset version needs the approver role")
        form = BuilderForm(request.POST)
        result = _builder_preview(form)
        if "preview" in result:
            # Dedup embeds every member: the build runs on a worker, never in this request.
            try:
                build = services.version_build_start(
                    dataset_name=form.cleaned_data["dataset"], filter_spec=form.spec(), actor=request.user,
                    notes=form.cleaned_data["notes"])
            except services.DatasetError as exc:
                result = {"errors": [str(exc)]}
            else:
                messages.success(request, f"Building a version of {build.dataset_name} (build #{build.pk}); "
                                          "this page follows it and opens the version when it is ready.")
                return redirect("datasets:build_detail", build_id=build.pk)
    else:
        form = BuilderForm(initial={"dataset": request.GET.get("dataset", "")[:100]})
        result = {}
    return render(request, "datasets/builder.html", {"nav": "datasets", "form": form, "can_create": can_create,
                                                     **result}, status=400 if result.get("errors") else 200)


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def build_detail(request: HttpRequest, build_id: int) -> HttpResponse:
    """A version build's progress, live over /ws/version-builds/<id>/; a finished build links to its version."""
    if build_id > MAX_ID:
        raise Http404("no such build")
    build = VersionBuild.objects.select_related("version__dataset", "requested_by", "parent").filter(pk=build_id).first()
    if build is None:
        raise Http404("no such build")
    return render(request, "datasets/build_detail.html", {"nav": "datasets", "build": build,
                                                           "state": services.build_state(build)})
