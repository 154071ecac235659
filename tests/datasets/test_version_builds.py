"""Version builds on the workers (issue 40, item 5): the console and the API queue a build and
return; the job runs dataset_version_create, records its progress and ends done (with the version,
in the same transaction) or failed with a readable reason; double delivery, a lost worker and a
build taken over by another worker; the web process never loads the embedding model."""
from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import set_script_prefix

from apps.datasets import jobs, services
from apps.datasets.models import DatasetVersion, VersionBuild
from apps.datasets.services import DatasetError, FilterSpecError, version_build_start
from tests.datasets.version_data import make_trajectory, no_dedup
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def three(make_task):
    return [make_trajectory(make_task(prompt=f"Write program number {i}"), code=f"print({i})", score=90)
            for i in range(3)]


@pytest.fixture
def queued(monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(services, "_enqueue_build", sent.append)
    return sent


def test_starting_a_build_queues_it_after_commit_and_writes_no_version(approver, three, queued,
                                                                       django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        build = version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=approver, notes="n")
    assert (build.status, build.requested_by, build.notes, queued) == ("queued", approver, "n", [build.pk])
    assert not DatasetVersion.objects.exists()
    event = AuditEvent.objects.get(action="datasets.version_build_start")
    assert (event.actor_id, event.target_id, event.data["dataset"]) == (approver.pk, str(build.pk), "built")


@pytest.mark.parametrize("name, spec, error", [
    ("bad name!", no_dedup(), DatasetError), ("fine", {"colour": 1}, FilterSpecError),
    ("fine", {"min_score": 400}, FilterSpecError),
])
def test_a_bad_request_is_refused_at_once_and_queues_nothing(approver, queued, name, spec, error,
                                                             django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(error):
        version_build_start(dataset_name=name, filter_spec=spec, actor=approver)
    assert not VersionBuild.objects.exists() and queued == []
    assert not AuditEvent.objects.filter(action="datasets.version_build_start").exists()


def test_a_reviewer_cannot_start_a_build(reviewer, queued):
    with pytest.raises(PermissionDenied):
        version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=reviewer)
    assert not VersionBuild.objects.exists()


def test_the_job_builds_the_version_records_progress_and_a_second_delivery_is_a_no_op(approver, three, queued):
    build = version_build_start(dataset_name="built", filter_spec=no_dedup(min_score=80), actor=approver, notes="n")
    seen: list[str] = []
    real = services.version_build_progress

    def spy(**kwargs):
        seen.append(kwargs["stage"])
        return real(**kwargs)

    services.version_build_progress = spy
    try:
        result = jobs.run_version_build(build.pk)
    finally:
        services.version_build_progress = real
    build.refresh_from_db()
    version = DatasetVersion.objects.get()
    assert result == {"build": build.pk, "status": "done", "version": version.pk, "error": ""}
    assert (build.status, build.version, build.claims, build.stage) == ("done", version, 1, "done")
    assert build.started_at <= build.finished_at and build.heartbeat_at is not None
    assert (version.number, version.counts["members"], version.created_by, version.notes) == (1, 3, approver, "n")
    assert seen[0] == "scanned" and "reading" in seen
    assert AuditEvent.objects.filter(action="datasets.version_create", target_id=str(version.pk)).exists()
    assert AuditEvent.objects.filter(action="datasets.version_build_finish", target_id=str(build.pk)).exists()
    assert jobs.run_version_build(build.pk) == {"build": build.pk, "skipped": "already claimed or taken over"}
    assert DatasetVersion.objects.count() == 1


def test_a_build_whose_requester_lost_the_role_fails_with_the_reason(approver, three, queued):
    build = version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=approver)
    approver.groups.clear()
    type(approver).objects.get(pk=approver.pk)  # a fresh row: no cached permissions
    jobs.run_version_build(build.pk)
    build.refresh_from_db()
    assert build.status == "failed" and "datasets.add_datasetversion" in build.error and build.version is None
    assert not DatasetVersion.objects.exists()
    assert AuditEvent.objects.filter(action="datasets.version_build_fail", target_id=str(build.pk)).exists()


def test_a_build_of_a_dataset_made_invalid_since_fails_without_a_version(approver, make_task, queued):
    make_trajectory(make_task(prompt="Write program one"), code="print(1)", score=90)
    first = services.dataset_version_create(dataset_name="built", filter_spec=no_dedup(), actor=approver)
    build = version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=approver, parent=first)
    # the parent belongs to another dataset now: the job validates the request again
    VersionBuild.objects.filter(pk=build.pk).update(dataset_name="elsewhere")
    jobs.run_version_build(build.pk)
    build.refresh_from_db()
    assert build.status == "failed" and "is not a version of dataset 'elsewhere'" in build.error
    assert DatasetVersion.objects.count() == 1


def test_a_build_taken_over_by_another_worker_keeps_no_version(approver, three, queued):
    build = version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=approver)

    def reaped_meanwhile(stage, done, total):
        if stage == "scanned":  # the reaper gave the build to another worker while this one ran
            VersionBuild.objects.filter(pk=build.pk).update(worker="elsewhere:1")

    VersionBuild.objects.filter(pk=build.pk).update(status="running", worker="here:1")
    build.refresh_from_db()
    with pytest.raises(DatasetError, match="no longer this worker's"):
        services.dataset_version_create(dataset_name="built", filter_spec=no_dedup(), actor=approver,
                                        progress=reaped_meanwhile, build=build)
    assert not DatasetVersion.objects.exists()
    assert VersionBuild.objects.get(pk=build.pk).status == "running"


def test_progress_of_a_build_no_longer_this_workers_stops_the_job(approver, three, queued, monkeypatch):
    build = version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=approver)
    real = services.version_build_progress

    def taken(**kwargs):
        VersionBuild.objects.filter(pk=build.pk).update(worker="elsewhere:1")
        return real(**kwargs)

    monkeypatch.setattr(services, "version_build_progress", taken)
    assert jobs.run_version_build(build.pk)["skipped"]
    assert not DatasetVersion.objects.exists()


def test_the_reaper_requeues_a_build_whose_worker_died_and_fails_it_after_its_claims(approver, three, queued,
                                                                                   django_capture_on_commit_callbacks):
    build = version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=approver)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = jobs.socket.gethostname()
    from django.utils import timezone
    VersionBuild.objects.filter(pk=build.pk).update(status="running", worker=f"{host}:{dead.pid}",
                                                    started_at=timezone.now(), claims=1)
    with django_capture_on_commit_callbacks(execute=True):
        report = jobs.reap_exports()
    build.refresh_from_db()
    assert report["builds_requeued"] == 1 and build.status == "queued" and queued == [build.pk]
    VersionBuild.objects.filter(pk=build.pk).update(status="running", worker=f"{host}:{dead.pid}",
                                                    started_at=timezone.now(), claims=jobs.BUILD_MAX_CLAIMS)
    assert jobs.reap_exports()["builds_failed"] == 1
    build.refresh_from_db()
    assert build.status == "failed" and "gave up after 3 runs" in build.error
    assert AuditEvent.objects.filter(action="datasets.version_build_requeue").count() == 2


def test_the_build_page_reads_its_build_once_and_links_the_version(approver, three, queued, client):
    build = version_build_start(dataset_name="built", filter_spec=no_dedup(), actor=approver)
    jobs.run_version_build(build.pk)
    client.force_login(approver)
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/datasets/builds/{build.pk}/")
    assert page.status_code == 200 and 'data-version-url="/datasets/built/v1/"' in page.content.decode()
    reads = [q["sql"] for q in queries.captured_queries if "datasets_versionbuild" in q["sql"]]
    assert len(reads) == 1, reads


def test_the_api_s_build_urls_follow_the_site_s_routes_under_a_script_prefix(approver, three, queued):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(approver)
    # Served under /traj (a proxy's SCRIPT_NAME, which Django's WSGI handler sets as the script
    # prefix; the test client does not): every URL the API hands out carries it.
    set_script_prefix("/traj/")
    try:
        created = api.post("/api/v1/datasets/built/versions", {"filter_spec": no_dedup()}, format="json")
        assert created.status_code == 202, created.json()
        build = created.json()
        assert created["Location"] == build["url"] == f"/traj/api/v1/version-builds/{build['id']}"
        jobs.run_version_build(build["id"])
        polled = api.get(f"/api/v1/version-builds/{build['id']}").json()
        assert polled["version_url"] == "/traj/api/v1/datasets/built/versions/1"
    finally:
        set_script_prefix("/")


def test_serving_the_builder_and_queueing_a_build_never_imports_the_embedding_model(tmp_path):
    """The web process (urls, views, the builder's preview and POST) never loads sentence-transformers."""
    code = f"""
import os, sys
os.environ["DATABASE_URL"] = "sqlite:///{tmp_path}/web.sqlite3"
os.environ["DJANGO_ALLOWED_HOSTS"] = "127.0.0.1"
os.environ["DJANGO_HTTPS"] = "0"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth.models import Group, User
from django.test import Client
import trajplatform.asgi, trajplatform.urls
from apps.tasks.models import Batch, Task
from tests.datasets.version_data import make_trajectory
batch = Batch.objects.create(name="web")
for i in range(3):  # near dedup has something to embed if it ran here
    make_trajectory(Task.objects.create(batch=batch, scene="code_exec", prompt=f"Write program {{i}}"),
                    code=f"print({{i}})")
user = User.objects.create_user("a", password="x", is_staff=True)
user.groups.add(Group.objects.get(name="approver"))
client = Client(HTTP_HOST="127.0.0.1")
client.force_login(user)
assert client.get("/datasets/new/").status_code == 200
assert client.get("/datasets/new/preview", {{"dataset": "d", "dedup_near": "on"}}).status_code == 200
response = client.post("/datasets/new/", {{"dataset": "d", "dedup_near": "on", "dedup_exact": "on"}})
assert response.status_code == 302 and "/datasets/builds/" in response.url, response
assert client.get(response.url).status_code == 200
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("sentence_transformers", "torch", "transformers"))
print("LOADED", loaded)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LOADED []" in out.stdout, out.stdout[-2000:]
