"""Site-wide pages: the role-aware home, the admin login's landing, styled error pages.

Each role lands where its work is: a reviewer on the human review queue, an approver on red
proposals waiting for a sign-off, an admin on the operator overview, a viewer on the
trajectories. Error pages say why (the PermissionDenied / Http404 message), except under
/api/, where the API's JSON errors are kept.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.shortcuts import redirect, render
from django.template import loader
from django.urls import reverse
from django.views.decorators.http import require_GET

from apps.reviews import selectors as review_selectors
from trajplatform import api
from trajplatform import overview as overview_reads
from trajplatform.charts import series_svg
from trajplatform.permissions import highest_role


def landing_url(user: Any) -> str:
    """Where a signed-in user's work is."""
    role = highest_role(user)
    if role == "admin":
        return reverse("home")
    if role == "approver":
        return reverse("reviews:queue") + "?" + urlencode({"tier": "red"})
    if role == "reviewer":
        return reverse("reviews:work")
    return reverse("tasks:trajectory_list")


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect(f"{reverse('admin:login')}?{urlencode({'next': reverse('home')})}")
    if highest_role(request.user) != "admin":
        return redirect(landing_url(request.user))
    return overview(request)


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    """The operator overview: work by its real state, activity over time, batches in progress."""
    batches, more_batches, not_started_batches = overview_reads.batches_in_progress()
    return render(request, "home.html", {
        "nav": "home", "task_states": overview_reads.task_states(), "live": overview_reads.live_trajectories(),
        "proposals": review_selectors.queue_counts(), "batches": batches, "more_batches": more_batches, "not_started_batches": not_started_batches,
        "activity": _activity_charts(overview_reads.activity()),
    })


def _activity_charts(activity: dict[str, Any]) -> dict[str, Any]:
    points = activity["points"]
    labels = [p["label"] for p in points]
    activity["throughput_svg"] = series_svg(
        labels, [("accepted", [p["accepted"] for p in points]), ("not accepted", [p["not_accepted"] for p in points])],
        title="trajectories finished per day (accepted at the bottom)", fmt=lambda v: f"{v:,.0f}",
        classes=("bar bar-1", "bar"))
    activity["rate_svg"] = series_svg(labels, [("accepted", [p["rate"] for p in points])],
                                      title="acceptance rate per day (%)", fmt=lambda v: f"{v:.0f}%", peak=100)
    activity["cost_svg"] = series_svg(
        labels, [("cost per accepted", [None if p["per_accepted"] is None else float(p["per_accepted"])
                                        for p in points])],
        title="cost per accepted trajectory per day (USD)", fmt=overview_reads.money)
    activity["backlog_svg"] = series_svg(labels, [("awaiting a human verdict", [p["awaiting"] for p in points])],
                                         title="trajectories awaiting a human verdict, at each day's last count",
                                         fmt=lambda v: f"{v:,.0f}")
    return activity


FAVICON = Path(__file__).resolve().parent / "static" / "console" / "favicon.ico"


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for on every first visit of any page (the API docs' too)."""
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response


def admin_login(request: HttpRequest) -> HttpResponse:
    """The admin's login form, landing on the home page (role-aware) rather than the admin index."""
    extra = {} if "next" in request.GET or "next" in request.POST else {"next": reverse("home")}
    return admin.site.login(request, extra_context=extra)


# -- error pages ------------------------------------------------------------------------------------


def _reason(exception: Any, default: str) -> str:
    text = str(exception or "").strip() if exception is not None else ""
    # Django's own resolver message is a dict repr; keep the page readable.
    return text if text and not text.startswith("{") else default


def handler403(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api.json_error_response(request, 403, "permission_denied", _reason(exception, "Permission denied."))
    role = highest_role(request.user) if getattr(request, "user", None) is not None else None
    reason = _reason(exception, "Your role does not allow this page or action.")
    return render(request, "403.html", {"reason": reason, "role": role or "no role"}, status=403)


def handler404(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api.handler404(request, exception)
    reason = _reason(exception, f"Nothing lives at {request.path}.")
    return render(request, "404.html", {"reason": reason}, status=404)


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api.handler500(request)
    # No request context: the failure may be in a context processor or the database.
    return HttpResponseServerError(loader.get_template("500.html").render({"path": request.path}))
