"""Serving stored artifacts (screenshots) to the console, and what a step shows of its screenshot.

    GET /artifacts/<sha256>   the bytes, for users who may view trajectories (tasks.view_trajectory),
                              only for an artifact some trajectory uses; immutable, cached a year
"""
from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required, permission_required
from django.http import FileResponse, Http404, HttpRequest
from django.urls import reverse
from django.views.decorators.http import require_GET

from trajplatform import artifacts


@login_required
@permission_required("tasks.view_trajectory", raise_exception=True)
@require_GET
def artifact(request: HttpRequest, sha256: str) -> FileResponse:
    try:
        row = artifacts.get(sha256)
    except artifacts.ArtifactError:
        raise Http404("no such artifact") from None
    if not row.uses.exists():  # an episode never stored: nobody's to see yet
        raise Http404("no such artifact")
    response = FileResponse(artifacts.storage().open(row.name, "rb"), content_type=row.mime)
    response["Cache-Control"] = "private, max-age=31536000, immutable"  # the name is the content
    response["X-Content-Type-Options"] = "nosniff"
    return response


def step_screenshot(record: Any) -> dict[str, Any] | None:
    """What the console draws for a step: its last image and the acted-on element's box (or
    point), as percentages of the image so the drawing scales with it; None without an image."""
    if not isinstance(record, dict) or not isinstance(record.get("images"), list) or not record["images"]:
        return None
    ref = record["images"][-1]
    if not isinstance(ref, dict) or not isinstance(ref.get("artifact"), str) or not artifacts.SHA_RE.match(ref["artifact"]):
        return None
    shot: dict[str, Any] = {"url": reverse("artifact", args=[ref["artifact"]]), "width": ref.get("width"),
                            "height": ref.get("height")}
    action = record.get("action") if isinstance(record.get("action"), dict) else {}
    width, height = ref.get("width"), ref.get("height")
    if isinstance(width, (int, float)) and isinstance(height, (int, float)) and width > 0 and height > 0:
        box, point = action.get("box"), action.get("point")
        if isinstance(box, dict) and all(isinstance(box.get(k), (int, float)) for k in ("x", "y", "width", "height")):
            shot["box"] = {"left": 100 * box["x"] / width, "top": 100 * box["y"] / height,
                           "width": 100 * box["width"] / width, "height": 100 * box["height"] / height}
        if isinstance(point, dict) and all(isinstance(point.get(k), (int, float)) for k in ("x", "y")):
            shot["point"] = {"left": 100 * point["x"] / width, "top": 100 * point["y"] / height}
    return shot
