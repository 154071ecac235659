"""Every endpoint × every caller: anonymous, bad and revoked tokens get 401; roles below the
endpoint's get 403; roles at or above it get through (never a 5xx)."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from apps.tasks.models import Trajectory

pytestmark = pytest.mark.django_db

CALLERS = ("anonymous", "bad", "revoked", "outsider", "viewer", "reviewer", "approver", "admin")
RANK = {"outsider": 0, "viewer": 1, "reviewer": 2, "approver": 3, "admin": 4}


@pytest.fixture
def objects(make_task: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from apps.datasets.models import Dataset, DatasetVersion, ExportJob
    from apps.reviews.models import Proposal, Review
    from apps.tasks import services

    monkeypatch.setattr(services, "dispatch_rollouts", lambda **kw: None)
    task = make_task(status="waiting_approval", current_iteration=1)
    trajectory = Trajectory.objects.create(task=task, iteration=1, status="finished", outcome="success",
                                           steps=[{"tool": "run_shell"}])
    Review.objects.create(trajectory=trajectory, kind="auto", status="done", overall=50)
    yellow = Proposal.objects.create(task=task, iteration=1, field="temperature", from_value=0.7, to_value=0.3,
                                     options=[0.3, 0.5], tier="yellow", proposer="review-agent")
    red = Proposal.objects.create(task=task, iteration=1, field="max_steps", from_value=15, to_value=30,
                                  tier="red", proposer="review-agent")
    dataset = Dataset.objects.create(name="perm-ds")
    version = DatasetVersion.objects.create(dataset=dataset, number=1, exporter_versions={})
    job = ExportJob.objects.create(version=version, format="sft-openai", path="/nonexistent/perm.jsonl")
    return {"task": task, "batch": task.batch, "trajectory": trajectory, "yellow": yellow, "red": red,
            "version": version, "job": job}


# (method, path template, body, lowest role allowed)
ENDPOINTS: list[tuple[str, str, Any, str]] = [
    ("get", "/api/v1/me", None, "viewer"),
    ("get", "/api/v1/scenes", None, "viewer"),
    ("get", "/api/v1/scenes/code_exec", None, "viewer"),
    ("get", "/api/v1/tasks", None, "viewer"),
    ("get", "/api/v1/tasks/{task}", None, "viewer"),
    ("post", "/api/v1/tasks", {"tasks": [{"scene": "code_exec", "prompt": "p"}]}, "reviewer"),
    ("post", "/api/v1/tasks/{task}/cancel", {}, "reviewer"),
    ("post", "/api/v1/tasks/{task}/retry", {}, "reviewer"),
    ("get", "/api/v1/batches", None, "viewer"),
    ("get", "/api/v1/batches/{batch}", None, "viewer"),
    ("get", "/api/v1/trajectories", None, "viewer"),
    ("get", "/api/v1/trajectories/{trajectory}", None, "viewer"),
    ("post", "/api/v1/trajectories/{trajectory}/verdicts", {"verdict": "accept", "reason": "fine"}, "reviewer"),
    ("get", "/api/v1/reviews", None, "viewer"),
    ("get", "/api/v1/proposals", None, "viewer"),
    ("get", "/api/v1/proposals/{yellow}", None, "viewer"),
    ("post", "/api/v1/proposals/{yellow}/decide", {"decision": "reject", "comment": "no"}, "reviewer"),
    ("post", "/api/v1/proposals/{red}/decide", {"decision": "reject", "comment": "no"}, "approver"),
    ("get", "/api/v1/datasets", None, "viewer"),
    ("get", "/api/v1/datasets/perm-ds/versions", None, "viewer"),
    ("get", "/api/v1/datasets/perm-ds/versions/1", None, "viewer"),
    ("post", "/api/v1/datasets/perm-ds/versions", {"filter_spec": {"bogus": 1}}, "approver"),
    ("post", "/api/v1/datasets/perm-ds/versions/1/publish", None, "approver"),
    ("post", "/api/v1/datasets/perm-ds/versions/1/exports", {"format": "nope"}, "approver"),
    ("get", "/api/v1/exports/{job}", None, "viewer"),
    ("get", "/api/v1/exports/{job}/download", None, "viewer"),
    ("post", "/api/v1/exports/{job}/template-checks", {"template": "nope"}, "approver"),
    ("post", "/api/v1/envscaler/uploads", {"metadata": [], "scenarios": []}, "reviewer"),
    ("get", "/api/v1/webhooks", None, "viewer"),
    ("post", "/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook", "events": ["task.finished"]}, "viewer"),
]


def _call(client: Any, method: str, path: str, body: Any) -> Any:
    if body is None:
        return getattr(client, method)(path)
    return getattr(client, method)(path, body, format="json")


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "template", "body", "lowest"), ENDPOINTS,
                         ids=[f"{m} {t}" for m, t, _, _ in ENDPOINTS])
def test_endpoint_by_caller(
    caller: str, method: str, template: str, body: Any, lowest: str, objects: dict[str, Any],
    client_as: Callable[[str], Any], make_user: Any,
) -> None:
    path = template.format(**{k: getattr(v, "pk", v) for k, v in objects.items()})
    if caller == "outsider":
        from rest_framework.test import APIClient

        from trajplatform.api_models import api_token_create

        _token, raw = api_token_create(user=make_user(None), name="outsider", actor=None)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    else:
        client = client_as(caller)
    response = _call(client, method, path, body)
    assert response.status_code < 500, response.content[:500]
    if caller in ("anonymous", "bad", "revoked"):
        assert response.status_code == 401
        assert response.json()["error"]["code"] in ("not_authenticated", "authentication_failed")
        assert response["WWW-Authenticate"].startswith("Bearer")
    elif RANK[caller] < RANK[lowest]:
        assert response.status_code == 403, response.content[:300]
        assert response.json()["error"]["code"] == "permission_denied"
    else:
        assert response.status_code not in (401, 403), response.content[:300]
        # Allowed callers reach the view: the only 404 is a download whose file does not exist.
        assert response.status_code != 404 or path.endswith("/download"), response.content[:300]
    if response.status_code >= 400 and response.get("Content-Type", "").startswith("application/json"):
        assert set(response.json()) == {"error"}


def test_session_auth_serves_the_browsable_api(client: Any, viewer: Any) -> None:
    from tests.conftest import PASSWORD

    assert client.login(username=viewer.username, password=PASSWORD)
    response = client.get("/api/v1/scenes", HTTP_ACCEPT="text/html")
    assert response.status_code == 200 and b"<html" in response.content.lower()
    # A session write without the CSRF token is refused.
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.login(username=viewer.username, password=PASSWORD)
    assert strict.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/"}, content_type="application/json").status_code == 403


def test_a_token_records_its_last_use(client_as: Any) -> None:
    client = client_as("viewer")
    assert client.token.last_used_at is None
    client.get("/api/v1/me")
    client.token.refresh_from_db()
    assert client.token.last_used_at is not None


def test_me_names_the_role_and_token(client_as: Any) -> None:
    body = client_as("approver").get("/api/v1/me").json()
    assert body["role"] == "approver" and body["token"] == "approver-token"
