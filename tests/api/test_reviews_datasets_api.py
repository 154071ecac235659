"""Proposals (tier permissions), human verdicts, and datasets: version from a filter, export,
poll, download with checksum — all through the API, all through the services."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from apps.reviews.models import Proposal, Review
from apps.tasks.models import Trajectory
from tests.datasets.version_data import make_trajectory
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(make_task: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from apps.tasks import services

    monkeypatch.setattr(services, "dispatch_rollouts", lambda **kw: None)
    task = make_task(status="waiting_approval", current_iteration=1, max_iterations=3, temperature=0.7)
    yellow = Proposal.objects.create(task=task, iteration=1, field="temperature", from_value=0.7, to_value=0.3,
                                     options=[0.3, 0.5], tier="yellow", proposer="review-agent")
    red = Proposal.objects.create(task=task, iteration=1, field="max_steps", from_value=15, to_value=30,
                                  tier="red", proposer="review-agent")
    return {"task": task, "yellow": yellow, "red": red}


def test_pending_queue_lists_oldest_first_and_mine_filters_by_tier(client_as: Any, waiting: dict[str, Any]) -> None:
    rows = client_as("viewer").get("/api/v1/proposals/pending").json()["results"]
    assert [r["id"] for r in rows] == [waiting["yellow"].pk, waiting["red"].pk]
    mine = client_as("reviewer").get("/api/v1/proposals/pending", {"mine": "true"}).json()["results"]
    assert [r["tier"] for r in mine] == ["yellow"]
    both = client_as("approver").get("/api/v1/proposals/pending", {"mine": "true"}).json()["results"]
    assert {r["tier"] for r in both} == {"yellow", "red"}
    assert client_as("viewer").get("/api/v1/proposals/pending", {"tier": "green"}).status_code == 400
    # a scene filter of a character str.strip() would drop is a scene nothing has, not a blank 400
    viewer = client_as("viewer")
    assert viewer.get("/api/v1/proposals/pending", {"scene": waiting["task"].scene}).json()["results"]
    assert viewer.get("/api/v1/proposals/pending", {"scene": "\x1c"}).json()["results"] == []
    assert viewer.get("/api/v1/proposals/pending", {"scene": ""}).status_code == 400


def test_a_reviewer_chooses_a_yellow_option_but_cannot_sign_off_red(client_as: Any, waiting: dict[str, Any]) -> None:
    reviewer = client_as("reviewer")
    chosen = reviewer.post(f"/api/v1/proposals/{waiting['yellow'].pk}/decide",
                           {"decision": "choose", "option": 1, "comment": "a bit warmer"}, format="json")
    assert chosen.status_code == 200, chosen.json()
    assert chosen.json()["status"] == "approved" and chosen.json()["chosen_option"] == 0.5
    waiting["task"].refresh_from_db()
    assert waiting["task"].temperature == 0.5
    red = reviewer.post(f"/api/v1/proposals/{waiting['red'].pk}/decide", {"decision": "approve"}, format="json")
    assert red.status_code == 403 and "approver" in red.json()["error"]["message"]
    waiting["red"].refresh_from_db()
    assert waiting["red"].status == "pending"


def test_an_approver_signs_off_red_and_a_second_decision_conflicts(client_as: Any, waiting: dict[str, Any]) -> None:
    approver = client_as("approver")
    ok = approver.post(f"/api/v1/proposals/{waiting['red'].pk}/decide", {"decision": "approve"}, format="json")
    assert ok.status_code == 200 and ok.json()["status"] == "approved"
    assert AuditEvent.objects.filter(action="reviews.proposal_decide").count() == 1
    other = client_as("approver").post(f"/api/v1/proposals/{waiting['red'].pk}/decide", {"decision": "reject"},
                                       format="json")
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
    bad = approver.post(f"/api/v1/proposals/{waiting['yellow'].pk}/decide", {"decision": "choose", "option": 9},
                        format="json")
    assert bad.status_code == 400 and "option 9" in bad.json()["error"]["message"]


def test_a_reviewer_records_a_human_verdict(client_as: Any, make_task: Any) -> None:
    trajectory = Trajectory.objects.create(task=make_task(), iteration=1, status="finished", outcome="success",
                                           steps=[{"tool": "run_shell"}, {"tool": "finish"}])
    client = client_as("reviewer")
    response = client.post(f"/api/v1/trajectories/{trajectory.pk}/verdicts",
                           {"verdict": "reject", "reason": "skipped the tests", "step_flags": [{"step": 1, "note": "x"}]},
                           format="json")
    assert response.status_code == 201, response.json()
    review = Review.objects.get(kind="human")
    assert (review.verdict, review.rationale, review.reviewer_id) == ("reject", "skipped the tests", client.token.user_id)
    bad = client.post(f"/api/v1/trajectories/{trajectory.pk}/verdicts",
                      {"verdict": "reject", "reason": "x", "step_flags": [{"step": 7}]}, format="json")
    assert bad.status_code == 400 and "step 7" in bad.json()["error"]["message"]
    detail = client_as("viewer").get(f"/api/v1/trajectories/{trajectory.pk}").json()
    assert detail["reviews"][0]["verdict"] == "reject"


@pytest.fixture
def export_dir(settings: Any, tmp_path: Path) -> Path:
    settings.DATASET_EXPORT_DIR = tmp_path / "exports"
    return settings.DATASET_EXPORT_DIR


def test_version_export_poll_and_download_with_checksum(
    client_as: Any, make_task: Any, export_dir: Path, django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apps.datasets import services as dataset_services
    from apps.datasets.jobs import run_export, run_version_build
    from apps.datasets.models import DatasetVersion
    from tests.datasets.version_data import measure_exportability

    for i in range(3):
        make_trajectory(make_task(prompt=f"Program {i}"), code=f"print({i})", score=90)
    approver = client_as("approver")
    builds: list[int] = []
    monkeypatch.setattr(dataset_services, "_enqueue_build", builds.append)
    with django_capture_on_commit_callbacks(execute=True):
        created = approver.post("/api/v1/datasets/api-ds/versions",
                                {"filter_spec": {"min_score": 80, "dedup": {"near": False}}, "notes": "first"},
                                format="json")
    # The request only queues the build: no version until a worker runs it.
    assert created.status_code == 202, created.json()
    build = created.json()
    assert builds == [build["id"]] and build["status"] == "queued" and build["version"] is None
    assert created["Location"] == build["url"] == f"/api/v1/version-builds/{build['id']}"
    assert not DatasetVersion.objects.exists()
    run_version_build(build["id"])
    polled = approver.get(build["url"]).json()
    assert (polled["status"], polled["version"], polled["error"]) == ("done", 1, "")
    version = approver.get(polled["version_url"]).json()
    assert version["number"] == 1 and version["status"] == "draft" and version["counts"]["members"] == 3
    assert version["notes"] == "first"
    assert approver.post("/api/v1/datasets/api-ds/versions", {"filter_spec": {"colour": 1}},
                         format="json").status_code == 400

    queued: list[int] = []
    monkeypatch.setattr(dataset_services, "_enqueue_export", queued.append)
    # Exports open once the version's exportability job (queued with the version) has measured it.
    refused = approver.post("/api/v1/datasets/api-ds/versions/1/exports", {"format": "sft-openai"}, format="json")
    assert refused.status_code == 400 and "still being measured (0 of 3 members)" in refused.json()["error"]["message"]
    assert not queued
    measure_exportability(DatasetVersion.objects.get())
    with django_capture_on_commit_callbacks(execute=True):
        started = approver.post("/api/v1/datasets/api-ds/versions/1/exports", {"format": "sft-openai"}, format="json")
    assert started.status_code == 202, started.json()
    job_id = started.json()["id"]
    assert queued == [job_id] and started.json()["status"] == "queued" and started.json()["download_url"] is None

    viewer = client_as("viewer")
    assert viewer.get(f"/api/v1/exports/{job_id}/download").status_code == 404
    run_export(job_id)
    polled = viewer.get(f"/api/v1/exports/{job_id}").json()
    assert polled["status"] == "done" and polled["lines"] == 3
    download = viewer.get(polled["download_url"])
    assert download.status_code == 200
    content = b"".join(download.streaming_content)
    assert hashlib.sha256(content).hexdigest() == polled["sha256"] == download["X-Checksum-SHA256"]

    bad = approver.post("/api/v1/datasets/api-ds/versions/1/exports", {"format": "nope"}, format="json")
    assert bad.status_code == 400 and "unknown format" in bad.json()["error"]["message"]
    published = approver.post("/api/v1/datasets/api-ds/versions/1/publish")
    assert published.status_code == 200 and published.json()["status"] == "published"
    listing = viewer.get("/api/v1/datasets").json()["results"]
    assert listing[0]["name"] == "api-ds" and listing[0]["latest_published"] == 1
    assert viewer.get("/api/v1/datasets/api-ds/versions/1").json()["exports"][0]["sha256"] == polled["sha256"]
    assert viewer.get("/api/v1/datasets/nope/versions/1").status_code == 404


def test_a_finished_export_notifies_export_ready(
    make_task: Any, export_dir: Path, approver: Any, make_token: Any, receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from apps.datasets import services as dataset_services
    from apps.datasets.jobs import run_export
    from trajplatform import webhooks
    from trajplatform.webhooks import WebhookDelivery, WebhookEndpoint

    monkeypatch.setattr(dataset_services, "_enqueue_export", lambda job_id: None)
    monkeypatch.setattr(webhooks, "enqueue_deliveries", lambda ids: None)
    token, _ = make_token("viewer")
    WebhookEndpoint.objects.create(owner=token.user, token=token, url=receiver.url, events=["export.ready"])
    make_trajectory(make_task(prompt="Program"), code="print(1)", score=90)
    version = dataset_services.dataset_version_create(dataset_name="hooked", actor=approver,
                                                      filter_spec={"dedup": {"near": False}})
    job = dataset_services.export_start(version=version, fmt="raw", actor=approver)
    assert not WebhookDelivery.objects.exists()
    run_export(job.pk)
    job.refresh_from_db()
    delivery = WebhookDelivery.objects.get(event="export.ready")
    data = json.loads(delivery.body)["data"]
    assert data["status"] == "done" and data["sha256"] == job.sha256 and data["dataset"] == "hooked"
    assert data["download_url"] == f"/api/v1/exports/{job.pk}/download"
