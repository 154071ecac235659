"""Dataset pages: sign-in and roles, the data card, downloads with checksums, compare, bad input."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.datasets.jobs import export_run
from apps.datasets.models import ExportJob
from apps.datasets.services import dataset_version_create, export_start
from tests.conftest import PASSWORD
from tests.datasets.version_data import export_dir, make_trajectory, no_dedup  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(make_task: Any, approver: Any) -> tuple[Any, Any]:
    for i in range(3):
        task = make_task(prompt=f"Task {i}")
        make_trajectory(task, code=f"print({i})", score=70 + i)
        make_trajectory(task, code=f"print({i}) # bad", outcome="failure", reward=0.0, score=10)
    v1 = dataset_version_create(dataset_name="demo", actor=approver, filter_spec=no_dedup())
    v2 = dataset_version_create(dataset_name="demo", actor=approver, filter_spec=no_dedup(success_only=True),
                                parent=v1)
    return v1, v2


def login(client: Any, user: Any) -> Any:
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_pages_need_a_signed_in_viewer(client: Any, versions: Any, make_user: Any) -> None:
    response = client.get("/datasets/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    login(client, make_user(None))
    assert client.get("/datasets/").status_code == 403
    assert client.get("/datasets/demo/v1/").status_code == 403


def test_a_viewer_reads_the_list_the_version_card_and_the_compare_page(client: Any, versions: Any,
                                                                         viewer: Any) -> None:
    v1, v2 = versions
    login(client, viewer)
    page = client.get("/datasets/").content.decode()
    assert 'href="/datasets/demo/"' in page and "v2" in page
    assert "v1" in client.get("/datasets/demo/").content.decode()
    body = client.get("/datasets/demo/v2/").content.decode()
    assert "<svg" in body and "automatic review score" in body
    assert "Changes against v1" in body and "success required" in body
    assert "Publish" not in body and "Export</button>" not in body  # viewers only read
    cmp = client.get("/datasets/demo/compare/", {"a": 1, "b": 2}).content.decode()
    assert "3 trajectories in both; 3 only in v1; 0 only in v2" in cmp


def test_the_version_page_does_not_query_per_member(client: Any, versions: Any, viewer: Any, make_task: Any,
                                                    approver: Any) -> None:
    login(client, viewer)
    with CaptureQueriesContext(connection) as small:
        client.get("/datasets/demo/v1/")
    for i in range(10):
        make_trajectory(make_task(prompt=f"More {i}"), code=f"x={i}", score=80)
    dataset_version_create(dataset_name="demo", actor=approver, filter_spec=no_dedup())
    with CaptureQueriesContext(connection) as big:
        client.get("/datasets/demo/v3/")
    assert len(big.captured_queries) == len(small.captured_queries)


def test_download_links_serve_the_file_with_its_checksum(client: Any, versions: Any, viewer: Any) -> None:
    v1, _ = versions
    job = export_start(version=v1, fmt="sft-openai", split="all", actor=None, enqueue=False)
    job = export_run(job.pk)
    login(client, viewer)
    body = client.get("/datasets/demo/v1/").content.decode()
    assert f"/datasets/exports/{job.pk}/download/" in body and job.sha256 in body
    response = client.get(f"/datasets/exports/{job.pk}/download/")
    assert response.status_code == 200
    data = b"".join(response.streaming_content)
    assert hashlib.sha256(data).hexdigest() == job.sha256 == response["X-Content-SHA256"]
    assert "demo-v1-sft-openai-all.jsonl" in response["Content-Disposition"]
    Path(job.path).unlink()
    assert client.get(f"/datasets/exports/{job.pk}/download/").status_code == 404


def test_an_approver_publishes_and_starts_an_export_from_the_page(
        client: Any, versions: Any, approver: Any, viewer: Any, django_capture_on_commit_callbacks: Any) -> None:
    v1, _ = versions
    login(client, viewer)
    assert client.post("/datasets/demo/v1/publish/").status_code == 403
    assert client.post("/datasets/demo/v1/export/", {"format": "raw", "split": "all"}).status_code == 403
    client.logout()
    login(client, approver)
    assert "Publish" in client.get("/datasets/demo/v1/").content.decode()
    assert client.post("/datasets/demo/v1/publish/").status_code == 302
    v1.refresh_from_db()
    assert v1.status == "published"
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/datasets/demo/v1/export/", {"format": "raw", "split": "train"}, follow=True)
    # the job's enqueue and the version page's export-state event (tests/console/test_export_states_ws.py)
    assert response.status_code == 200 and len(callbacks) == 2
    assert ExportJob.objects.get().split == "train"
    response = client.post("/datasets/demo/v1/export/", {"format": "csv", "split": "all"}, follow=True)
    assert "format: unknown format &#x27;csv&#x27;; formats: " in response.content.decode()
    # the Hugging Face layout from the form: recorded on the job, shown as a folder (no download link)
    with django_capture_on_commit_callbacks():
        client.post("/datasets/demo/v1/export/", {"format": "raw", "split": "train", "layout": "hf"}, follow=True)
    job = ExportJob.objects.get(format_version__endswith="+hf")
    assert job.path.endswith("raw-train.hf") and 'value="hf"' in client.get("/datasets/demo/v1/").content.decode()
    ExportJob.objects.filter(pk=job.pk).update(status="done", sha256="0" * 64, finished_at=job.created_at)
    body = client.get("/datasets/demo/v1/?fragment=exports").content.decode()
    assert "Hugging Face layout (a folder on the server)" in body and f"/datasets/exports/{job.pk}/download/" not in body


@pytest.mark.parametrize("url", [
    "/datasets/nope/",
    "/datasets/demo/v99/",
    "/datasets/demo/v99999999999999999999/",
    "/datasets/exports/99999999999999999999999/download/",
    "/datasets/exports/12345/download/",
    "/datasets/nope/compare/",
])
def test_unknown_things_are_404_not_500(client: Any, versions: Any, viewer: Any, url: str) -> None:
    login(client, viewer)
    assert client.get(url).status_code == 404


@pytest.mark.parametrize("query, status", [
    ({"a": "x", "b": "2"}, 200),
    ({"a": "1", "b": "99999999999999"}, 200),
    ({"a": "1", "b": "42"}, 404),
    ({"a": "-1", "b": "2"}, 200),
])
def test_bad_compare_input_is_reported_not_a_500(client: Any, versions: Any, viewer: Any, query: Any,
                                                 status: int) -> None:
    login(client, viewer)
    response = client.get("/datasets/demo/compare/", query)
    assert response.status_code == status
    assert "overlap" not in response.content.decode().lower() or status == 200


def test_bad_page_numbers_fall_back_to_a_valid_page(client: Any, versions: Any, viewer: Any) -> None:
    login(client, viewer)
    for param in ("members_page", "excluded_page", "exports_page"):
        assert client.get("/datasets/demo/v1/", {param: "abc"}).status_code == 200
        assert client.get("/datasets/demo/v1/", {param: "99999"}).status_code == 200
