"""Trajectory pages for signed-in users with tasks.view_trajectory: list, detail, log backfill.

The detail page renders the episode server-side and carries an empty live-log panel that
static/tasks/livelog.js fills: backfill from `trajectory_log` by seq, then follow the
websocket served by `apps.tasks.consumers.TrajectoryLogConsumer`.
"""
from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import OuterRef, Q, Subquery
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from apps.engines.registry import SCENE_CHOICES
from apps.reviews.fields import BatchNameField
from apps.reviews.models import Correction, Review
from apps.reviews.selectors import latest_human_verdicts
from apps.tasks.consumers import MAX_ID, MAX_SEQ
from apps.tasks.episode import episode_from, plain_text, pretty_json
from apps.tasks.importers import InvalidImport, check_file, iter_tasks
from apps.tasks.models import Task, Trajectory, TrajectoryLog
from apps.tasks.services import (
    BatchNameTaken, TaskCreateError, batch_free_name, batch_import, tasks_create, tasks_enqueue,
)
from apps.tasks.trace import trace_of
from trajplatform import json_limits
from trajplatform.paging import window, without_page
from trajplatform.skills import enabled_scene_ids

VIEW_PERMISSION = "tasks.view_trajectory"
LIST_PAGE_SIZE = 50
BACKFILL_DEFAULT_LIMIT = 500
BACKFILL_MAX_LIMIT = 1000
_DIGITS = re.compile(r"[0-9]{1,10}")


# --- pages --------------------------------------------------------------------------------

class TrajectoryFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="search",
                        widget=forms.TextInput(attrs={"placeholder": "id, task id, or words of the prompt / answer",
                                                      "type": "search"}))
    status = forms.ChoiceField(choices=[("", "any status"), *Trajectory.Status.choices], required=False)
    outcome = forms.ChoiceField(choices=[("", "any outcome"), *Trajectory.Outcome.choices], required=False)
    scene = forms.ChoiceField(choices=[("", "any scene"), *SCENE_CHOICES], required=False)
    verdict = forms.ChoiceField(choices=[("", "any human verdict"), ("none", "no human verdict"),
                                         *Review.Verdict.choices], required=False, label="human verdict")
    task = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1, label="task id")
    batch = BatchNameField()

    def clean_q(self) -> str:
        value = self.cleaned_data["q"]
        if "\x00" in value:
            raise forms.ValidationError("the search may not contain NUL characters")
        return value.strip()


def _add_scores_and_verdicts(rows: Any) -> None:
    """The page's judge scores and latest human verdicts: two queries for the page, none per row."""
    rows = list(rows)
    ids = [t.pk for t in rows]
    scores = dict(Review.objects.filter(trajectory_id__in=ids, kind=Review.Kind.AUTO).values_list("trajectory_id",
                                                                                                  "overall"))
    verdicts = latest_human_verdicts(ids)
    for t in rows:
        t.score, t.verdict = scores.get(t.pk), verdicts.get(t.pk, "")


def _latest_verdict() -> Subquery:
    return Subquery(Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.HUMAN)
                    .order_by("-created_at", "-id").values("verdict")[:1])


def _search(q: str) -> Any:
    """The ids of the trajectories the search matches: its task's prompt or its own final answer
    holds q (case-insensitive), q is the task's external id, or a number that is the trajectory's
    or its task's id. A union of one query per table, not an OR across the join: each side can use
    its own index (on PostgreSQL the trigram indexes of tasks' migration 0008 serve the substring
    matches of 3 characters or more), where the OR made PostgreSQL scan every trajectory."""
    tasks = Q(prompt__icontains=q) | Q(external_id=q)
    own = Q(final_answer__icontains=q)
    if q.isdigit() and int(q) <= MAX_ID:
        tasks |= Q(pk=int(q))
        own |= Q(pk=int(q))
    by_task = Trajectory.objects.filter(task__in=Task.objects.filter(tasks).values("pk"))
    return by_task.order_by().values("pk").union(Trajectory.objects.filter(own).order_by().values("pk"))


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def trajectory_list(request: HttpRequest) -> HttpResponse:
    form = TrajectoryFilterForm(request.GET or None)
    trajectories = (
        Trajectory.objects.select_related("task", "task__batch")
        .defer("messages", "tools", "steps", "verifier_output", "config_snapshot")
        # Newest first by the primary key (ids grow with creation): the index serves ORDER BY + LIMIT,
        # where (-created_at, -id) made SQLite sort every row of the table.
        .order_by("-id")
    )
    if form.is_bound:
        form.is_valid()
        # Apply the filters that parsed; the form shows the errors of the others.
        data = getattr(form, "cleaned_data", {})
        if data.get("status"):
            trajectories = trajectories.filter(status=data["status"])
        if data.get("outcome"):
            trajectories = trajectories.filter(outcome=data["outcome"])
        if data.get("scene"):
            trajectories = trajectories.filter(task__scene=data["scene"])
        if data.get("task"):
            trajectories = trajectories.filter(task_id=data["task"])
        if data.get("batch"):
            trajectories = trajectories.filter(task__batch_id=data["batch"])
        if data.get("verdict"):
            # An alias, not an annotation: the subquery filters, it is never computed for the rows
            # a sort would otherwise materialize (SQLite evaluates selected subqueries before ORDER BY).
            trajectories = trajectories.alias(verdict=_latest_verdict())
            trajectories = trajectories.filter(verdict__isnull=True) if data["verdict"] == "none" \
                else trajectories.filter(verdict=data["verdict"])
        if q := data.get("q"):
            trajectories = trajectories.filter(pk__in=_search(q))
    page = window(trajectories, request.GET.get("page"), LIST_PAGE_SIZE)
    _add_scores_and_verdicts(page.object_list)
    return render(
        request,
        "tasks/trajectory_list.html",
        {"nav": "trajectories", "form": form, "page": page, "filter_query": without_page(request.GET)},
    )


def _tool_names(tools: Any) -> list[str]:
    names = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name"):
            names.append(str(function["name"]))
        elif isinstance(tool, dict) and tool.get("name"):
            names.append(str(tool["name"]))
        else:
            names.append(plain_text(tool))
    return names


# The loop's reason for a run without a verifier (apps.engines.agent): a role's run ends so, and
# the episode it belongs to has the verifier; its page says that instead.
_NO_VERIFIER = "finished (no verifier)"


def _own_reason(trajectory: Trajectory) -> str:
    if trajectory.parent_id and trajectory.outcome_reason == _NO_VERIFIER:
        return "finished its part; the episode's verifier gives the reward"
    return trajectory.outcome_reason


def viewer_context(trajectory: Trajectory) -> dict[str, Any]:
    """What both trajectory pages (/trajectories/<id>/ and the review viewer) render."""
    episode = episode_from(trajectory.messages, trajectory.steps)
    return {
        "correction_of": Correction.objects.filter(corrected=trajectory).select_related("editor").first(),
        "corrections": list(Correction.objects.filter(original=trajectory).select_related("editor")[:20]),
        "trajectory": trajectory,
        "task": trajectory.task,
        "episode": episode,
        "trace": trace_of(trajectory, episode),
        "tool_names": _tool_names(trajectory.tools),
        "verifier_output": pretty_json(trajectory.verifier_output) if trajectory.verifier_output else "",
        "is_final": trajectory.status in Trajectory.FINAL,
        # A multi_agent episode's roles (search2qa's stages, ...): its sub-episodes, and, on one of
        # them, the episode that ran it; each is a trajectory of its own with its own page.
        "parent": (Trajectory.all_objects.filter(pk=trajectory.parent_id).only(
            "id", "role", "label", "status", "outcome", "outcome_reason", "reward").first()
                   if trajectory.parent_id else None),
        "own_reason": _own_reason(trajectory),
        "subtrajectories": list(trajectory.subtrajectories().only(
            "id", "role", "label", "parent_step", "outcome", "reward", "total_tokens")),
    }


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def trajectory_detail(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    if trajectory_id > MAX_ID:
        raise Http404("no such trajectory")
    trajectory = get_object_or_404(Trajectory.all_objects.select_related("task", "task__batch"), pk=trajectory_id)
    return render(request, "tasks/trajectory_detail.html", {"nav": "trajectories", **viewer_context(trajectory)})


def _json_error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _int_param(request: HttpRequest, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not minimum <= int(raw) <= maximum:
        raise ValueError(f"{name} must be an integer from {minimum} to {maximum}")
    return int(raw)


@never_cache
@require_GET
def trajectory_log(request: HttpRequest, trajectory_id: int) -> JsonResponse:
    """Log lines with seq > `after`, oldest first, at most `limit` (capped) per call.

    JSON errors, never a login redirect: the caller is a script that cannot follow one.
    """
    if not request.user.is_authenticated:
        return _json_error("sign in to read this log", 403)
    if not request.user.has_perm(VIEW_PERMISSION):
        return _json_error("you do not have permission to view trajectories", 403)
    try:
        after = _int_param(request, "after", 0, 0, MAX_SEQ)
        # Asking for more than the cap is not an error: the reply says `more` and the
        # client asks again from its last seq.
        limit = min(_int_param(request, "limit", BACKFILL_DEFAULT_LIMIT, 1, MAX_SEQ), BACKFILL_MAX_LIMIT)
    except ValueError as exc:
        return _json_error(str(exc), 400)
    status = (
        Trajectory.all_objects.filter(pk=trajectory_id).values_list("status", flat=True).first()
        if trajectory_id <= MAX_ID else None
    )
    if status is None:
        return _json_error("no such trajectory", 404)
    rows = list(TrajectoryLog.objects.filter(trajectory_id=trajectory_id, seq__gt=after).order_by("seq")[: limit + 1])
    more = len(rows) > limit
    lines = [row.as_message() for row in rows[:limit]]
    return JsonResponse(
        {
            "trajectory": trajectory_id,
            "status": status,
            "after": after,
            "limit": limit,
            "lines": lines,
            "last_seq": lines[-1]["seq"] if lines else after,
            "more": more,
        },
        encoder=DjangoJSONEncoder,
    )


# --- start work from the browser ------------------------------------------------------------------

MAX_UPLOAD_BYTES = 50 * 1024 * 1024
MAX_ERRORS_SHOWN = 50


class TaskFileForm(forms.Form):
    file = forms.FileField(label="Task file (.jsonl or .json)", help_text="the formats of manage.py import_tasks")
    batch = forms.CharField(max_length=200, required=False, label="Batch name",
                            help_text="default: the file's name (made unique)")
    start = forms.BooleanField(required=False, initial=True, label="Start the batch now")


class SingleTaskForm(forms.Form):
    scene = forms.ChoiceField(choices=SCENE_CHOICES)
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 5}), max_length=100_000)
    external_id = forms.CharField(max_length=200, required=False, label="External id")
    scene_config = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, label="Scene config (JSON object)")
    max_steps = forms.IntegerField(min_value=1, max_value=500, required=False, label="Max steps")
    batch = forms.CharField(max_length=200, required=False, label="Batch name", help_text="default: a new batch")

    def clean_scene_config(self) -> dict[str, Any]:
        raw = self.cleaned_data["scene_config"].strip()
        if not raw:
            return {}
        try:
            value = json_limits.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("must be a JSON object")
        return value


def _import_file(request: HttpRequest, form: TaskFileForm) -> tuple[Any, list[str]]:
    """Check then import an uploaded task file with the import command's service; (batch, errors)."""
    upload = form.cleaned_data["file"]
    if upload.size > MAX_UPLOAD_BYTES:
        return None, [f"{upload.name}: larger than {MAX_UPLOAD_BYTES // (1024 * 1024)} MiB"]
    # The raw file object: iterating Django's File wrapper restarts from byte 0 at every `for`.
    upload.seek(0)
    summary = check_file(upload.file)
    if summary.errors:
        errors = [e.format(upload.name) for e in summary.errors[:MAX_ERRORS_SHOWN]]
        if len(summary.errors) > MAX_ERRORS_SHOWN:
            errors.append(f"… and {len(summary.errors) - MAX_ERRORS_SHOWN} more")
        return None, errors + ["nothing was imported"]
    name = form.cleaned_data["batch"].strip() or batch_free_name(upload.name.rsplit(".", 1)[0][:200] or "upload")
    try:
        upload.seek(0)
        batch = batch_import(rows=iter_tasks(upload.file), name=name, source_name=upload.name[:300],
                             source_sha256=summary.sha256, source_format=summary.source_format, actor=request.user)
    except (InvalidImport, BatchNameTaken, ValueError) as exc:
        return None, [f"{upload.name}: {exc}", "nothing was imported"]
    if form.cleaned_data["start"]:
        tasks_enqueue(batch=batch, actor=request.user)
    return batch, []


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
def task_new(request: HttpRequest) -> HttpResponse:
    """Upload a task file (the import service: every line error shown, nothing written on error) or create one task."""
    can_create = request.user.has_perm("tasks.add_task") and request.user.has_perm("tasks.add_batch")
    file_form, single_form, errors = TaskFileForm(), SingleTaskForm(), []
    if request.method == "POST":
        if not can_create:
            raise PermissionDenied("creating tasks needs the reviewer role")
        if request.POST.get("kind") == "file":
            file_form = TaskFileForm(request.POST, request.FILES)
            if file_form.is_valid():
                batch, errors = _import_file(request, file_form)
                if batch is not None:
                    started = " and started" if file_form.cleaned_data["start"] else " (not started: use Start)"
                    messages.success(request, f"Imported {batch.task_count} tasks into batch {batch.name!r}{started}.")
                    return redirect("reviews:batch", batch.pk)
        elif request.POST.get("kind") == "single":
            single_form = SingleTaskForm(request.POST)
            if single_form.is_valid():
                data = single_form.cleaned_data
                item = {"scene": data["scene"], "prompt": data["prompt"], "config": data["scene_config"]}
                if data["external_id"]:
                    item["external_id"] = data["external_id"]
                if data["max_steps"]:
                    item["max_steps"] = data["max_steps"]
                try:
                    result = tasks_create(items=[item], actor=request.user, batch_name=data["batch"], source="console",
                                          allowed_scenes=set(enabled_scene_ids()))
                except TaskCreateError as exc:
                    errors = [f"{field.replace('tasks[0].', '')}: {reason}" for field, reason in exc.errors]
                except BatchNameTaken as exc:
                    errors = [str(exc)]
                else:
                    messages.success(request, f"Task #{result.tasks[0].pk} created and started.")
                    return redirect("reviews:task", result.tasks[0].pk)
        else:
            errors = ["choose a task file or fill in the task form"]
    return render(request, "tasks/task_new.html", {
        "nav": "batches", "file_form": file_form, "single_form": single_form, "errors": errors, "can_create": can_create,
    }, status=400 if errors or file_form.errors or single_form.errors else 200)
