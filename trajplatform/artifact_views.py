"""Serving stored artifacts (screenshots) to the console.

    GET /artifacts/<sha256>   the bytes, for users who may view trajectories (tasks.view_trajectory),
                              only for an artifact some trajectory uses; immutable, cached a year
"""
from __future__ import annotations

from django.contrib.auth.decorators import login_required, permission_required
from django.http import FileResponse, Http404, HttpRequest
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
