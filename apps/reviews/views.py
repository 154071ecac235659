"""The review console under /review/ (signed-in users; viewers read, reviewers and approvers act).

    /review/                            pending proposals: filters tier/scene/batch/age/stale; decide
    /review/proposals/<id>/decide       POST decision=approve|reject|choose, option, comment
    /review/trajectories/<id>/          the trajectory viewer: review, checks, human verdicts, steps, live log
    /review/trajectories/<id>/verdict   POST verdict, reason (reject / needs fix), flag (step indices),
                                        note_<index>; queue=<filters>: then the next item of the queue
    /review/work/ ...                   the human review queue: apps.reviews.queue_views
    /review/tasks/<id>/                 iteration history with config diffs; end loop / force iteration
    /review/tasks/<id>/end | /force     POST
    /review/batches/                    batch progress; /review/batches/<id>/ its tasks
    /review/agreement/                  judge-human agreement per rubric dimension

Every write calls the one service for it (apps.reviews.services); a refused action is a 403,
bad input a message on the page it came from, never a 500. Lists are paginated and fetch their
related rows with the page (select_related, one grouped query for counts).
"""
from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Avg, OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_POST

from apps.engines.registry import SCENE_CHOICES
from apps.engines.toolargs import REFUSED_KINDS
from apps.reviews import alignment, queue_views, selectors, services, tallies
from apps.reviews.fields import BatchNameField
from apps.reviews.models import Preference, Proposal, Review, ReviewAssignment, ReviewClaim
from apps.reviews.review_agent import CHECK_TITLES
from apps.tasks.consumers import MAX_ID
from apps.tasks.episode import arguments_text
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.services import TransitionError, batch_cancel, batch_retry, task_cancel, task_retry, tasks_enqueue
from apps.tasks.views import viewer_context
from trajplatform.paging import window, without_page

PAGE_SIZE = 50
VIEW_PROPOSALS = "reviews.view_proposal"
VIEW_TRAJECTORIES = "tasks.view_trajectory"
VIEW_TASKS = "tasks.view_task"


def _page(request: HttpRequest, items: Any) -> tuple[Any, str]:
    """A page of a queryset, and the filters' query string without the page. The page's ids are
    found first (an index-friendly OFFSET over the ordered ids alone) and only those rows are read
    with their joins: a deep page does not join every row it skips (the proposal queue's last page
    at 1M trajectories on PostgreSQL)."""
    page = Paginator(items.values_list("pk", flat=True), PAGE_SIZE).get_page(request.GET.get("page"))
    ids = list(page.object_list)
    rows = {row.pk: row for row in items.filter(pk__in=ids)}
    page.object_list = [rows[pk] for pk in ids if pk in rows]
    return page, without_page(request.GET)


def _back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        target = default
    return HttpResponseRedirect(target)


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


# -- the proposal queue -----------------------------------------------------------------------------


class QueueFilterForm(forms.Form):
    tier = forms.ChoiceField(choices=[("", "yellow and red"), ("yellow", "yellow"), ("red", "red")], required=False)
    scene = forms.ChoiceField(choices=[("", "any scene"), *SCENE_CHOICES], required=False)
    batch = BatchNameField()
    task = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID, label="task id")
    older_than_hours = forms.FloatField(required=False, min_value=0, max_value=24 * 3650, label="older than (h)")
    stale = forms.BooleanField(required=False, label="stale only")


@login_required
@permission_required(VIEW_PROPOSALS, raise_exception=True)
@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    form = QueueFilterForm(request.GET or None)
    data = form.cleaned_data if form.is_bound and form.is_valid() else {}
    proposals = selectors.pending_proposals(
        tier=data.get("tier") or None, scene=data.get("scene") or None, batch=data.get("batch"),
        task=data.get("task"), older_than_hours=data.get("older_than_hours"), stale=bool(data.get("stale")),
    )
    page, filter_query = _page(request, proposals)
    stale_before = selectors.stale_before()
    can_yellow = request.user.has_perm("reviews.decide_yellow_proposal") or request.user.has_perm(
        "reviews.decide_red_proposal")
    can_red = request.user.has_perm("reviews.decide_red_proposal")
    rows = [{
        "proposal": p,
        "stale": p.created_at < stale_before,
        "options": [(i, _value(o)) for i, o in enumerate(p.options or [])],
        "from_text": _value(p.from_value), "to_text": _value(p.to_value),
        "can_decide": can_red if p.tier == Proposal.Tier.RED else can_yellow,
        "own_red": p.tier == Proposal.Tier.RED and p.proposed_by_id == request.user.pk,
        "own": p.proposed_by_id is not None and p.proposed_by_id == request.user.pk,
    } for p in page.object_list]
    return render(request, "reviews/queue.html", {
        "nav": "review", "form": form, "page": page, "rows": rows, "filter_query": filter_query,
        "counts": selectors.queue_counts(), "stale_hours": settings.REVIEW_STALE_PROPOSAL_HOURS,
    })


@login_required
@require_POST
def decide(request: HttpRequest, proposal_id: int) -> HttpResponse:
    proposal = get_object_or_404(Proposal, pk=proposal_id)
    decision = request.POST.get("decision", "")
    own = proposal.proposed_by_id is not None and proposal.proposed_by_id == request.user.pk
    # The proposer may always withdraw (reject) their own proposal; the service audits it as such.
    if not services.can_decide(request.user, proposal) and not (own and decision == "reject"):
        raise PermissionDenied(f"you may not decide {proposal.tier} proposals")
    option = request.POST.get("option")
    try:
        services.proposal_decide(proposal=proposal, actor=request.user, decision=decision,
                                 option=option if option not in (None, "") else None,
                                 comment=request.POST.get("comment", ""))
    except services.DecisionError as exc:
        messages.error(request, f"Proposal #{proposal.pk}: {exc}")
    else:
        messages.success(request, f"Proposal #{proposal.pk} ({proposal.field}): {decision} recorded.")
    return _back(request, reverse("reviews:queue"))


# -- the trajectory viewer --------------------------------------------------------------------------


class VerdictForm(forms.Form):
    # Nothing pre-selected: a verdict is a choice the reviewer makes (keys a / r / f).
    verdict = forms.ChoiceField(choices=Review.Verdict.choices, widget=forms.RadioSelect)
    reason = forms.CharField(max_length=10000, required=False, label="Reason (required for reject and needs fix)",
                             widget=forms.Textarea(attrs={"rows": 3}))


@login_required
@permission_required(VIEW_TRAJECTORIES, raise_exception=True)
@require_GET
def trajectory(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    trajectory = get_object_or_404(Trajectory.all_objects.select_related("task", "task__batch"),
                                   pk=min(trajectory_id, MAX_ID))  # a role's run (a sub-episode) too
    review = selectors.latest_auto_review(trajectory)
    checks = [{"id": k, **v, "title": v.get("title") or CHECK_TITLES.get(k, k)}
              for k, v in (review.checks if review else {}).items() if isinstance(v, dict)]
    steps = trajectory.steps if isinstance(trajectory.steps, list) else []
    claims = list(ReviewClaim.objects.filter(trajectory=trajectory, status=ReviewClaim.Status.ACTIVE,
                                             expires_at__gt=timezone.now()).select_related("reviewer"))
    own_claim = next((c for c in claims if c.reviewer_id == request.user.pk), None)
    queue_query = queue_views.queue_query(request.GET.get("queue", ""))
    return render(request, "reviews/trajectory.html", {
        **viewer_context(trajectory),
        "claims": claims, "own_claim": own_claim, "queue_query": queue_query,
        "assignments": list(ReviewAssignment.objects.filter(trajectory=trajectory, status=ReviewAssignment.Status.ACTIVE)
                            .select_related("assignee", "assigned_by")),
        "in_queue": own_claim is not None or "queue" in request.GET,
        "progress": selectors.reviewer_progress(request.user) if own_claim else None,
        "batch_progress": selectors.tally_review_progress(selectors.batch_tally(trajectory.task.batch_id))
        if own_claim and trajectory.task.batch_id else None,
        "nav": "work" if own_claim else "trajectories", "review": review, "checks_fired": [c for c in checks if c.get("fired")],
        "checks_passed": [c for c in checks if not c.get("fired")],
        "human_reviews": list(selectors.human_reviews(trajectory)[:50]),
        "can_verdict": request.user.has_perm("reviews.add_review") and trajectory.status in Trajectory.FINAL,
        "verdict_form": VerdictForm(), "step_numbers": range(len(steps)),
        "suggestions_json": json.dumps(review.suggestions, indent=2, ensure_ascii=False, sort_keys=True, default=str)
        if review and review.suggestions else "",
    })


@login_required
@require_POST
def verdict(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    if not request.user.has_perm("reviews.add_review"):
        raise PermissionDenied("human verdicts need the reviewer role")
    trajectory = get_object_or_404(Trajectory, pk=min(trajectory_id, MAX_ID))
    queue_query = queue_views.queue_query(request.POST.get("queue", ""))
    in_queue = "queue" in request.POST
    page = reverse("reviews:trajectory", args=[trajectory.pk]) + (f"?{urlencode({'queue': queue_query})}" if in_queue else "")
    flags = []
    for raw in request.POST.getlist("flag"):
        if not raw.isdigit():
            messages.error(request, f"step flag {raw!r} is not a step number")
            return HttpResponseRedirect(page)
        flags.append({"step": int(raw), "note": request.POST.get(f"note_{raw}", "")})
    try:
        review = services.human_verdict_record(
            trajectory=trajectory, actor=request.user, verdict=request.POST.get("verdict", ""),
            reason=request.POST.get("reason", ""), step_flags=flags)
    except ValidationError as exc:
        messages.error(request, "Verdict not recorded: " + "; ".join(exc.messages))
        return HttpResponseRedirect(page)
    messages.success(request, f"Verdict recorded: {review.get_verdict_display()} on trajectory #{trajectory.pk}.")
    if in_queue:
        return queue_views.next_item(request, queue_query)
    return HttpResponseRedirect(page)


# -- a task's iterations --------------------------------------------------------------------------


@login_required
@permission_required(VIEW_TASKS, raise_exception=True)
@require_GET
def task_history(request: HttpRequest, task_id: int) -> HttpResponse:
    task = get_object_or_404(Task.objects.select_related("batch"), pk=min(task_id, MAX_ID))
    iterations = selectors.iteration_history(task)
    for it in iterations:
        it.diff_rows = [(name, _value(before), _value(after)) for name, before, after in it.diff]
        it.rows = [(t, it.reviews.get(t.pk)) for t in it.trajectories]
    return render(request, "reviews/task_history.html", {
        "nav": "review", "task": task, "iterations": iterations,
        "can_control": request.user.has_perm("tasks.change_task"),
        "can_end": task.status in (Task.Status.REVIEWING, Task.Status.WAITING_APPROVAL),
        "can_force": task.status in (Task.Status.REVIEWING, Task.Status.WAITING_APPROVAL, *services.TERMINAL_LOOP)
        and task.current_iteration > 0,
    })


def _task_control(request: HttpRequest, task_id: int, service: Any, done: str) -> HttpResponse:
    if not request.user.has_perm("tasks.change_task"):
        raise PermissionDenied("controlling a task's loop needs the reviewer role")
    task = get_object_or_404(Task, pk=min(task_id, MAX_ID))
    try:
        service(task=task, actor=request.user, reason=request.POST.get("comment", ""))
    except TransitionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done)
    return HttpResponseRedirect(reverse("reviews:task", args=[task.pk]))


@login_required
@require_POST
def task_end(request: HttpRequest, task_id: int) -> HttpResponse:
    return _task_control(request, task_id, services.task_end_loop, "The loop ended; the task is completed.")


@login_required
@require_POST
def task_force(request: HttpRequest, task_id: int) -> HttpResponse:
    return _task_control(request, task_id, services.task_force_iteration, "One more iteration started.")


# -- side by side and preferences -------------------------------------------------------------------

COMPARE_MAX = 12
ALIGN_MAX = 4  # rollouts aligned step by step at once (A, B and two more for context)
DECISIONS = {"a": "A preferred", "b": "B preferred", "tie": "a tie", "skip": "skipped"}


def _picked(raw: Any, rollouts: dict[int, Trajectory]) -> Trajectory | None:
    return rollouts.get(int(raw)) if isinstance(raw, str) and raw.isascii() and raw.isdigit() and int(raw) <= MAX_ID else None


def _next_to_compare(task: Task) -> Task | None:
    """The batch's next task (by id) with two finished rollouts or more: where skip and a decision go."""
    if not task.batch_id:
        return None
    # "has a second finished rollout" per task, in id order: an index lookup per task looked at, it
    # stops at the first hit (no count over every later task of a big batch).
    second = Trajectory.objects.filter(task=OuterRef("pk"), status=Trajectory.Status.FINISHED).order_by("pk")
    return (Task.objects.filter(batch_id=task.batch_id, pk__gt=task.pk)
            .alias(second=Subquery(second.values("pk")[1:2])).filter(second__isnull=False)
            .order_by("pk").only("pk").first())


@login_required
@permission_required(VIEW_TRAJECTORIES, raise_exception=True)
@require_GET
def compare(request: HttpRequest, task_id: int) -> HttpResponse:
    """A task's finished rollouts: A and B (and up to two more) with their steps aligned, the first
    divergence marked, per-step diffs; then every rollout's summary card and the recorded preferences."""
    task = get_object_or_404(Task.objects.select_related("batch"), pk=min(task_id, MAX_ID))
    auto = Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.AUTO)
    human = Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.HUMAN).order_by("-created_at", "-id")
    rollouts = list(Trajectory.objects.filter(task=task, status=Trajectory.Status.FINISHED)
                    .defer("messages", "tools", "verifier_output", "config_snapshot")
                    .annotate(score=Subquery(auto.values("overall")[:1]), verdict=Subquery(human.values("verdict")[:1]))
                    .order_by("-iteration", "sample_index", "id")[:COMPARE_MAX + 1])
    more = len(rollouts) > COMPARE_MAX
    rollouts = rollouts[:COMPARE_MAX]
    for t in rollouts:
        t.length = len(t.steps) if isinstance(t.steps, list) else 0
    by_id = {t.pk: t for t in rollouts}
    a = _picked(request.GET.get("a"), by_id) or (rollouts[0] if rollouts else None)
    b = _picked(request.GET.get("b"), by_id)
    if b is None or b == a:
        b = next((t for t in rollouts if t != a), None)
    aligned = [t for t in (a, b) if t is not None]
    for raw in request.GET.getlist("also")[:ALIGN_MAX]:
        extra = _picked(raw, by_id)
        if extra is not None and extra not in aligned and len(aligned) < ALIGN_MAX:
            aligned.append(extra)
    for n, t in enumerate(aligned):
        t.letter = alignment.letter(n)
    preferences = list(Preference.objects.filter(task=task).select_related("reviewer")[:20])
    return render(request, "reviews/compare.html", {
        "nav": "work", "task": task, "rollouts": rollouts, "preferences": preferences, "more": more,
        "aligned": aligned, "alignment": alignment.align(aligned) if len(aligned) >= 2 else None,
        "a": a, "b": b, "also_ids": [t.pk for t in aligned[2:]], "next_task": _next_to_compare(task),
        "can_prefer": request.user.has_perm("reviews.add_review") and len(rollouts) >= 2,
    })


def _after_decision(task: Task, fallback: str) -> HttpResponseRedirect:
    following = _next_to_compare(task)
    return HttpResponseRedirect(reverse("reviews:compare", args=[following.pk]) if following else fallback)


@login_required
@require_POST
def prefer(request: HttpRequest, task_id: int) -> HttpResponse:
    """Record a preference: decision=a|b (A over B, or B over A) with a reason, stored by
    preference_record as every preference is; tie and skip store nothing. A decision moves on to
    the batch's next task to compare."""
    if not request.user.has_perm("reviews.add_review"):
        raise PermissionDenied("recording a preference needs the reviewer role")
    page = reverse("reviews:compare", args=[min(task_id, MAX_ID)])
    decision = request.POST.get("decision")
    if decision not in DECISIONS:
        messages.error(request, f"Unknown decision {(decision or '')[:20]!r}: a, b, tie or skip.")
        return HttpResponseRedirect(page)
    first, second = request.POST.get("a", ""), request.POST.get("b", "")
    ids = [first, second] if decision == "a" else [second, first]
    task = get_object_or_404(Task, pk=min(task_id, MAX_ID))
    if decision in ("tie", "skip"):
        # Nothing to store: a tie is no preference pair (the DPO exports need a chosen and a rejected).
        messages.info(request, f"Task #{task.pk}: {DECISIONS[decision]}, no preference stored.")
        return _after_decision(task, page)
    if not all(i.isascii() and i.isdigit() and 0 < int(i) <= MAX_ID for i in ids):
        messages.error(request, "Pick a preferred rollout (A) and the one it beats (B).")
        return HttpResponseRedirect(page)
    found = Trajectory.objects.in_bulk([int(i) for i in ids])
    if len(found) != len(set(ids)) or any(t.task_id != task_id for t in found.values()):
        messages.error(request, "Both rollouts must belong to this task.")
        return HttpResponseRedirect(page)
    try:
        preference = services.preference_record(chosen=found[int(ids[0])], rejected=found[int(ids[1])],
                                                actor=request.user, note=request.POST.get("note", ""))
    except ValidationError as exc:
        messages.error(request, "Preference not recorded: " + "; ".join(exc.messages))
        return HttpResponseRedirect(page)
    messages.success(request, f"Recorded: #{preference.chosen_id} preferred over #{preference.rejected_id}.")
    return _after_decision(task, page)


# -- corrections --------------------------------------------------------------------------------------


def _arguments_json(step: Any) -> str:
    """A step's arguments as the reviewer edits them: as the trace shows them (none: `{}`)."""
    args = step.get("arguments") if isinstance(step, dict) else None
    return arguments_text({} if args is None else args)


@login_required
def correct(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    """Edit a trajectory (thoughts, tool-call arguments as JSON, final answer, dropped steps) into a
    new linked trajectory; the arguments are checked against the tool's schema before anything is saved."""
    if not request.user.has_perm("reviews.add_review"):
        raise PermissionDenied("corrections need the reviewer role")
    trajectory = get_object_or_404(Trajectory.objects.select_related("task"), pk=min(trajectory_id, MAX_ID))
    steps = [s for s in (trajectory.steps if isinstance(trajectory.steps, list) else [])]
    errors: list[str] = []
    if request.method == "POST":
        thoughts, drop, arguments = {}, [], {}
        for i, step in enumerate(steps):
            if f"thought_{i}" in request.POST:
                thoughts[i] = request.POST[f"thought_{i}"][:100_000]
            if request.POST.get(f"drop_{i}"):
                drop.append(i)
            # browsers send a textarea's line breaks as CRLF: an untouched field is no edit
            sent = request.POST.get(f"arguments_{i}")
            if sent is not None and sent.replace("\r\n", "\n") != _arguments_json(step):
                arguments[i] = sent.replace("\r\n", "\n")[:200_000]
        try:
            correction = services.trajectory_correct(
                trajectory=trajectory, actor=request.user, thoughts=thoughts, drop_steps=drop, arguments=arguments,
                final_answer=request.POST.get("final_answer", trajectory.final_answer)[:100_000],
                note=request.POST.get("note", ""))
        except ValidationError as exc:
            errors = exc.messages
        else:
            messages.success(request, f"Correction saved as trajectory #{correction.corrected_id}; "
                                      f"#{trajectory.pk} is unchanged.")
            return HttpResponseRedirect(reverse("reviews:trajectory", args=[correction.corrected_id]))
    rows = []
    for i, s in enumerate(steps):
        step = s if isinstance(s, dict) else {}
        original = _arguments_json(step)
        rows.append({
            "index": i, "tool": str(step.get("tool") or "?"), "result": _value(step.get("output", "")),
            "thought": request.POST.get(f"thought_{i}", step.get("thought") or ""),
            "arguments": request.POST.get(f"arguments_{i}", original), "edited": bool(step.get("arguments_edited")),
            "never_ran": step.get("error_kind") in REFUSED_KINDS,
            "arguments_lines": min(12, original.count("\n") + 2), "dropped": bool(request.POST.get(f"drop_{i}")),
        })
    return render(request, "reviews/correct.html", {
        "nav": "trajectories", "trajectory": trajectory, "task": trajectory.task, "rows": rows, "errors": errors,
        "final_answer": request.POST.get("final_answer", trajectory.final_answer),
        "is_final": trajectory.status == Trajectory.Status.FINISHED,
    }, status=400 if errors else 200)


# -- batches ------------------------------------------------------------------------------------------


def _progress_rows(batches: list[Batch]) -> list[dict[str, Any]]:
    progress = selectors.batch_progress(batches)
    pending = selectors.batch_pending_proposals(batches)
    rows = []
    for batch in batches:
        counts = progress[batch.pk]
        total = sum(counts.values())
        final = sum(counts[s] for s in Task.FINAL)
        rows.append({"batch": batch, "counts": counts, "total": total, "final": final,
                     "percent": round(100 * final / total) if total else 0, "pending": pending.get(batch.pk, 0),
                     "states": [(selectors.STATE_LABELS[key], n) for key, n in counts.items()]})
    return rows


@login_required
@permission_required(VIEW_TASKS, raise_exception=True)
@require_GET
def batches(request: HttpRequest) -> HttpResponse:
    page, filter_query = _page(request, Batch.objects.order_by("-created_at", "-id"))
    return render(request, "reviews/batches.html", {
        "nav": "review", "page": page, "rows": _progress_rows(list(page.object_list)), "filter_query": filter_query,
        "statuses": list(selectors.STATE_LABELS.items()),
    })


@login_required
@permission_required(VIEW_TASKS, raise_exception=True)
@require_GET
def batch_detail(request: HttpRequest, batch_id: int) -> HttpResponse:
    batch = get_object_or_404(Batch, pk=min(batch_id, MAX_ID))
    score = (Review.objects.filter(trajectory__task=OuterRef("pk"), trajectory__iteration=OuterRef("current_iteration"),
                                   kind=Review.Kind.AUTO, status=Review.Status.DONE)
             .order_by().values("trajectory__task").annotate(mean=Avg("overall")).values("mean"))
    tasks = Task.objects.filter(batch=batch).annotate(score=Subquery(score)).order_by("id").only(
        "pk", "external_id", "scene", "status", "current_iteration", "max_iterations", "quality_threshold", "error")
    status = request.GET.get("status")
    if status in selectors.STATE_FILTERS:  # a task state: "not started" apart from "queued" (again)
        tasks = tasks.filter(selectors.STATE_FILTERS[status])
    # A batch holds up to every task: its list is a window, not a count of them all (paging.py).
    page, filter_query = window(tasks, request.GET.get("page"), PAGE_SIZE), without_page(request.GET)
    tally = selectors.batch_tally(batch.pk)

    return render(request, "reviews/batch_detail.html", {
        "nav": "batches", "batch": batch, "row": _progress_rows([batch])[0], "page": page,
        "spend": selectors.tally_spend(batch, tally) if tally else None,
        "tally_every": tallies.BATCH_TALLY_EVERY_MINUTES,
        "filter_query": filter_query, "statuses": list(selectors.STATE_LABELS.items()), "status": status,
        "can_control": request.user.has_perm("tasks.change_task"),
    })


@login_required
@permission_required(VIEW_TASKS, raise_exception=True)
@require_GET
def batch_progress(request: HttpRequest, batch_id: int) -> HttpResponse:
    """The batch's progress line alone (the batch page polls it while tasks are unfinished)."""
    batch = get_object_or_404(Batch, pk=min(batch_id, MAX_ID))
    return render(request, "reviews/_batch_progress.html", {"batch": batch, "row": _progress_rows([batch])[0]})


BATCH_CONTROLS = {"start": "started", "cancel": "cancelled", "retry": "queued again"}


def _require_control(request: HttpRequest, what: str, actions: dict[str, str], action: str) -> None:
    if not request.user.has_perm("tasks.change_task"):
        raise PermissionDenied(f"starting, cancelling or retrying a {what} needs the reviewer role")
    if action not in actions:
        raise Http404(f"no {what} action {action!r}; actions: {', '.join(actions)}")


@login_required
@require_POST
def batch_control(request: HttpRequest, batch_id: int, action: str) -> HttpResponse:
    """Start / Cancel / Retry a whole batch through the tasks services (each writes its audit rows)."""
    _require_control(request, "batch", BATCH_CONTROLS, action)
    batch = get_object_or_404(Batch, pk=min(batch_id, MAX_ID))
    service = {"start": tasks_enqueue, "cancel": batch_cancel, "retry": batch_retry}[action]
    n = service(batch=batch, actor=request.user)
    messages.success(request, f"Batch {batch.name}: {n} task(s) {BATCH_CONTROLS[action]}.")
    return HttpResponseRedirect(reverse("reviews:batch", args=[batch.pk]))


TASK_CONTROLS = {"start": "started", "cancel": "cancelled", "retry": "queued again and started"}


@login_required
@require_POST
def task_control(request: HttpRequest, task_id: int, action: str) -> HttpResponse:
    """Start / Cancel / Retry one task through the tasks services."""
    _require_control(request, "task", TASK_CONTROLS, action)
    task = get_object_or_404(Task, pk=min(task_id, MAX_ID))
    try:
        if action == "start":
            if not tasks_enqueue(tasks=Task.objects.filter(pk=task.pk), actor=request.user):
                raise TransitionError(f"task {task.pk} is {task.status}: only a queued, not started task starts")
        elif action == "cancel":
            task_cancel(task=task, actor=request.user, reason=request.POST.get("comment", ""))
        else:
            task_retry(task=task, actor=request.user, reason=request.POST.get("comment", ""))
    except TransitionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Task #{task.pk} {TASK_CONTROLS[action]}.")
    return HttpResponseRedirect(reverse("reviews:task", args=[task.pk]))


# -- agreement -----------------------------------------------------------------------------------------


class AgreementFilterForm(forms.Form):
    batch = BatchNameField()


@login_required
@permission_required("reviews.view_review", raise_exception=True)
@require_GET
def agreement(request: HttpRequest) -> HttpResponse:
    form = AgreementFilterForm(request.GET or None)
    batch_id = form.cleaned_data["batch"] if form.is_bound and form.is_valid() else None
    trajectories = Trajectory.objects.filter(task__batch_id=batch_id) if batch_id else None
    window = selectors.AGREEMENT_WINDOW
    table, verdicts = selectors.judge_human_agreement(trajectories, window=window)
    return render(request, "reviews/agreement.html", {
        "nav": "review", "table": table, "form": form, "threshold": settings.REVIEW_QUALITY_THRESHOLD,
        "verdicts": verdicts, "window": window, "batch": batch_id,
    })
