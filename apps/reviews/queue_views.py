"""The human review queue's pages (included at /review/ by apps.reviews.urls).

    /review/work/                       the queue: facets, saved views, progress, bulk selection
    /review/work/next                   POST: claim the next item (own assignments first) and open it
    /review/work/bulk                   POST action=accept|reject|needs_fix|assign|unassign, item=<id>...,
                                        reason, assignee: each item through its service, reported per item
    /review/work/views                  POST name: save the queue's filters; views/<id>/delete POST
    /review/trajectories/<id>/claim | /release   POST (release then=next: skip to the next item)
    /review/suggest/batches | models    <option>s for a datalist (batch names, model names), htmx
    /review/team/                       per reviewer: throughput, acceptance, agreement, assignments

Filters never take typed ids: a batch by its name (suggested as one types), reviewers and
assignees from a list. Every write calls its service (apps.reviews.services, .queue_actions).
"""
from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from apps.engines.registry import SCENE_CHOICES
from apps.reviews import queue_actions, selectors, services, tallies
from apps.reviews.fields import BatchNameField, SuggestInput
from apps.reviews.models import Review, ReviewAssignment, ReviewClaim, SavedView
from apps.reviews.review_agent import CHECK_TITLES
from apps.tasks.consumers import MAX_ID
from apps.tasks.models import Trajectory

PAGE_SIZE = 50
VIEW_TRAJECTORIES = "tasks.view_trajectory"
MAX_QUERY = 2000
VERDICT_FACETS = [("", "any human verdict"), (selectors.NO_VERDICT, "no human verdict yet"), *Review.Verdict.choices]
ME = "me"


class WorkFilterForm(forms.Form):
    """The queue's facets. Reviewer and assignee choices are the team's usernames (one query)."""

    batch = BatchNameField()
    scene = forms.ChoiceField(choices=[("", "any scene"), *SCENE_CHOICES], required=False)
    model = forms.CharField(required=False, max_length=200, widget=SuggestInput("models", "model"))
    outcome = forms.ChoiceField(choices=[("", "any outcome"), *Trajectory.Outcome.choices], required=False)
    score_min = forms.FloatField(required=False, min_value=0, max_value=100, label="score from")
    score_max = forms.FloatField(required=False, min_value=0, max_value=100, label="score to")
    check = forms.ChoiceField(choices=[("", "any checks"), *sorted(CHECK_TITLES.items())], required=False,
                              label="check fired")
    judge = forms.ChoiceField(choices=[("", "any judge verdict"), *selectors.JUDGE_VERDICTS.items()], required=False,
                              label="judge verdict")
    verdict = forms.ChoiceField(choices=VERDICT_FACETS, required=False, label="human verdict")
    reviewer = forms.ChoiceField(choices=(), required=False, label="judged by")
    assigned = forms.ChoiceField(choices=(), required=False, label="assigned to")
    iteration = forms.IntegerField(required=False, min_value=1, max_value=1000, label="iteration")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.team = {u.get_username(): u for u in selectors.reviewers()}
        names = [(name, name) for name in self.team]
        self.fields["reviewer"].choices = [("", "judged by anyone"), *names]
        self.fields["assigned"].choices = [("", "assigned or not"), (ME, "assigned to me"),
                                           (selectors.UNASSIGNED, "assigned to nobody"),
                                           *[(n, f"assigned to {n}") for n, _ in names]]


def queue_query(raw: str) -> str:
    """The queue's filters as a query string, keeping only fields the filter form knows."""
    data = QueryDict(raw[:MAX_QUERY])
    return urlencode({k: v for k, v in data.items() if k in WorkFilterForm.base_fields and v})


def _work_queue(request: HttpRequest, query: str) -> tuple[WorkFilterForm, Any]:
    form = WorkFilterForm(QueryDict(query))
    data = form.cleaned_data if form.is_valid() else {}
    assigned = data.get("assigned") or None
    queue = selectors.human_queue(
        reviewer=request.user, batch=data.get("batch"), scene=data.get("scene") or None,
        score_min=data.get("score_min"), score_max=data.get("score_max"), check=data.get("check") or None,
        judge=data.get("judge") or None, model=data.get("model") or None, outcome=data.get("outcome") or None,
        verdict=data.get("verdict") or None, iteration=data.get("iteration"),
        judged_by=form.team.get(data.get("reviewer") or ""),
        assignee=request.user if assigned == ME else form.team.get(assigned, assigned))
    return form, queue


def next_item(request: HttpRequest, query: str) -> HttpResponse:
    """Claim the reviewer's next item of the filtered queue and open it (or say nothing is left)."""
    _form, queue = _work_queue(request, query)
    claim = services.review_claim_next(actor=request.user, queue=queue)
    if claim is None:
        messages.info(request, "Nothing left to review with these filters. Well done.")
        return HttpResponseRedirect(reverse("reviews:work") + (f"?{query}" if query else ""))
    return HttpResponseRedirect(reverse("reviews:trajectory", args=[claim.trajectory_id]) + "?" +
                                urlencode({"queue": query}))


@login_required
@permission_required(VIEW_TRAJECTORIES, raise_exception=True)
@require_GET
def work(request: HttpRequest) -> HttpResponse:
    query = queue_query(request.GET.urlencode())
    form, queue = _work_queue(request, query)
    # A page of PAGE_SIZE + 1 rows says whether there is more: no count over the whole queue.
    offset = max(0, min(int(request.GET["offset"]) if request.GET.get("offset", "").isdigit() else 0, 10**7))
    rows = list(queue[offset:offset + PAGE_SIZE + 1])
    batch = form.cleaned_data.get("batch") if form.is_valid() else None
    ids = [t.pk for t in rows]
    own = {c.trajectory_id: c for c in ReviewClaim.objects.filter(
        reviewer=request.user, status=ReviewClaim.Status.ACTIVE, expires_at__gt=timezone.now(),
        trajectory_id__in=ids)}
    assigned = selectors.assignees(ids)
    can_review = request.user.has_perm("reviews.add_review")
    can_assign = request.user.has_perm(queue_actions.ASSIGN_PERMISSION)
    return render(request, "reviews/work.html", {
        "nav": "work", "form": form, "query": query,
        "rows": [(t, own.get(t.pk), assigned.get(t.pk, [])) for t in rows[:PAGE_SIZE]],
        "offset": offset, "more": len(rows) > PAGE_SIZE, "next_offset": offset + PAGE_SIZE,
        "prev_offset": max(0, offset - PAGE_SIZE),
        "progress": selectors.reviewer_progress(request.user),
        "batch_filtered": bool(batch), "batch_progress": selectors.tally_review_progress(selectors.batch_tally(batch)) if batch else None,
        "tally_every": tallies.BATCH_TALLY_EVERY_MINUTES,
        "assigned_to_me": ReviewAssignment.objects.filter(
            assignee=request.user, status=ReviewAssignment.Status.ACTIVE).count() if can_review else 0,
        "saved_views": list(SavedView.objects.filter(user=request.user)),
        "can_review": can_review, "can_assign": can_assign, "team": list(form.team),
        "bulk_actions": [a for a in queue_actions.BULK_ACTIONS
                         if (a in queue_actions.VERDICT_ACTIONS and can_review)
                         or (a not in queue_actions.VERDICT_ACTIONS and can_assign)],
        "per_item": settings.REVIEW_REVIEWERS_PER_ITEM, "claim_minutes": settings.REVIEW_CLAIM_MINUTES,
        "audit_share": settings.REVIEW_AUDIT_SHARE, "bulk_max": queue_actions.BULK_MAX,
    })


@login_required
@require_POST
def work_next(request: HttpRequest) -> HttpResponse:
    """Claim the next item of the (filtered) queue and open it."""
    if not request.user.has_perm("reviews.add_review"):
        raise PermissionDenied("the review queue needs the reviewer role")
    return next_item(request, queue_query(request.POST.get("queue", "")))


def _queue_page(query: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("reviews:work") + (f"?{query}" if query else ""))


@login_required
@require_POST
def claim(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    trajectory = get_object_or_404(Trajectory, pk=min(trajectory_id, MAX_ID))
    query = queue_query(request.POST.get("queue", ""))
    try:
        taken = services.review_claim(trajectory=trajectory, actor=request.user)
    except services.ClaimError as exc:
        messages.error(request, f"Not claimed: {exc}.")
        return _queue_page(query)
    messages.success(request, f"Trajectory #{trajectory.pk} is yours until "
                              f"{timezone.localtime(taken.expires_at):%H:%M}.")
    return HttpResponseRedirect(reverse("reviews:trajectory", args=[trajectory.pk]) + "?" + urlencode({"queue": query}))


@login_required
@require_POST
def release(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    """Give the item back; with then=next, open the next one (a skip)."""
    trajectory = get_object_or_404(Trajectory, pk=min(trajectory_id, MAX_ID))
    query = queue_query(request.POST.get("queue", ""))
    released = services.review_claim_release(trajectory=trajectory, actor=request.user)
    if released is not None:
        messages.info(request, f"Trajectory #{trajectory.pk} released.")
    if request.POST.get("then") == "next":
        return next_item(request, query)
    return _queue_page(query)


# -- bulk actions -------------------------------------------------------------------------------------

BULK_DONE = {"accept": "Accepted", "reject": "Rejected", "needs_fix": "Marked needs fix", "assign": "Assigned",
             "unassign": "Unassigned"}
REPORTED_FAILURES = 20


@login_required
@require_POST
def work_bulk(request: HttpRequest) -> HttpResponse:
    """Apply one action to the selected items (queue_actions.review_bulk); a refused item is reported
    by id with its reason, the others are done."""
    query = queue_query(request.POST.get("queue", ""))
    raw = request.POST.getlist("item")
    if not all(i.isascii() and i.isdigit() and 0 < int(i) <= MAX_ID for i in raw):
        messages.error(request, "The selection holds something that is not a trajectory.")
        return _queue_page(query)
    action = request.POST.get("action", "")
    assignee = None
    if action in ("assign", "unassign"):
        name = request.POST.get("assignee", "")
        assignee = selectors.reviewers().filter(username=name).first()
        if assignee is None:
            messages.error(request, f"{BULK_DONE[action]}: choose a reviewer" +
                           (f" ({name[:150]!r} is not one)" if name else "") + ".")
            return _queue_page(query)
    try:
        result = queue_actions.review_bulk(trajectory_ids=[int(i) for i in raw], actor=request.user, action=action,
                                           reason=request.POST.get("reason", ""), assignee=assignee)
    except ValidationError as exc:
        messages.error(request, "Nothing done: " + "; ".join(exc.messages))
        return _queue_page(query)
    to = f" to {assignee.get_username()}" if action == "assign" else (
        f" from {assignee.get_username()}" if action == "unassign" else "")
    if result.done:
        messages.success(request, f"{BULK_DONE[action]} {len(result.done)} item(s){to}: "
                                  + ", ".join(f"#{pk}" for pk in result.done) + ".")
    for pk, why in result.failed[:REPORTED_FAILURES]:
        messages.error(request, f"#{pk} not {BULK_DONE[action].lower()}: {why}.")
    if len(result.failed) > REPORTED_FAILURES:
        messages.error(request, f"... and {len(result.failed) - REPORTED_FAILURES} more item(s) not done.")
    return _queue_page(query)


# -- saved views --------------------------------------------------------------------------------------


@login_required
@permission_required(VIEW_TRAJECTORIES, raise_exception=True)
@require_POST
def saved_view_save(request: HttpRequest) -> HttpResponse:
    """Save the queue's current filters under the name given (the same name again replaces them)."""
    query = queue_query(request.POST.get("queue", ""))
    try:
        view = queue_actions.saved_view_save(user=request.user, name=request.POST.get("name", ""), query=query)
    except ValidationError as exc:
        messages.error(request, "View not saved: " + "; ".join(exc.messages))
    else:
        messages.success(request, f"Saved the view {view.name!r}.")
    return _queue_page(query)


@login_required
@require_POST
def saved_view_delete(request: HttpRequest, view_id: int) -> HttpResponse:
    view = SavedView.objects.filter(pk=min(view_id, MAX_ID), user=request.user).first()
    if view is None:
        raise Http404("you have no saved view with this id")
    queue_actions.saved_view_delete(view=view, actor=request.user)
    messages.info(request, f"Deleted the view {view.name!r}.")
    return _queue_page(queue_query(request.POST.get("queue", "")))


# -- suggestions ---------------------------------------------------------------------------------------

SUGGEST = {"batches": (selectors.batch_names, ("batch", "batches")),
           "models": (selectors.model_names, ("model", "models"))}


@login_required
@permission_required(VIEW_TRAJECTORIES, raise_exception=True)
@require_GET
def suggest(request: HttpRequest, kind: str) -> HttpResponse:
    """<option>s completing what was typed (htmx fills a datalist). A comma-separated list (the
    version builder's) completes its last part, keeping the parts before it."""
    if kind not in SUGGEST:
        raise Http404(f"no suggestions of {kind!r}")
    names, keys = SUGGEST[kind]
    typed = next((request.GET[k] for k in keys if k in request.GET), request.GET.get("q", ""))[:MAX_QUERY]
    typed = typed.replace("\x00", "")  # no name holds one, and PostgreSQL refuses it in a query
    head, _, last = typed.rpartition(",") if any(k in request.GET for k in keys[1:]) else ("", "", typed)
    prefix = ", ".join(p.strip() for p in head.split(",") if p.strip())
    prefix = f"{prefix}, " if prefix else ""
    return render(request, "reviews/_suggestions.html", {"values": [prefix + n for n in names(last)]})


# -- the team page -------------------------------------------------------------------------------------


@login_required
@permission_required("reviews.view_review", raise_exception=True)
@require_GET
def team(request: HttpRequest) -> HttpResponse:
    """Per reviewer: verdicts per day and week, acceptance rate, agreement with the judge (Cohen's
    kappa, the agreement page's rule) as the team tally job last counted them; open and done
    assignments and held claims now."""
    rows, dates, counted_at = selectors.team()
    peak = max([n for r in rows for n in r.per_day] or [0]) or 1
    for row in rows:
        row.bars = [(d, n, round(100 * n / peak)) for d, n in zip(dates, row.per_day)]
    return render(request, "reviews/team.html", {
        "nav": "work", "rows": rows, "dates": dates, "threshold": settings.REVIEW_QUALITY_THRESHOLD,
        "counted_at": counted_at, "tally_every": tallies.TEAM_TALLY_EVERY_MINUTES,
        "can_assign": request.user.has_perm(queue_actions.ASSIGN_PERMISSION),
    })
