"""The console: publishing from the version list, read-only export jobs, lost export jobs."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.datasets.models import DatasetVersion, ExportJob
from apps.datasets.services import dataset_version_create, export_start
from tests.datasets.version_data import export_dir, make_trajectory, no_dedup  # noqa: F401 (fixture)
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def version(make_task: Any, approver: Any) -> Any:
    make_trajectory(make_task(prompt="One"), score=90)
    return dataset_version_create(dataset_name="demo", actor=approver, filter_spec=no_dedup())


def test_the_publish_action_goes_through_the_service(client: Any, version: Any, approver: Any, reviewer: Any) -> None:
    url = reverse("admin:datasets_datasetversion_changelist")
    client.force_login(reviewer)
    assert "publish_versions" not in client.get(url).content.decode()
    client.force_login(approver)
    response = client.post(url, {"action": "publish_versions", "_selected_action": [version.pk]}, follow=True)
    assert "Published 1" in response.content.decode()
    assert DatasetVersion.objects.get(pk=version.pk).status == "published"
    assert AuditEvent.objects.filter(action="datasets.version_publish", actor=approver).count() == 1


def test_a_draft_is_read_only(client: Any, version: Any, approver: Any) -> None:
    # Its notes were editable here (saved without an audit row); they are set when it is built.
    client.force_login(approver)
    body = client.get(reverse("admin:datasets_datasetversion_change", args=[version.pk])).content.decode()
    assert 'name="filter_spec"' not in body and 'name="notes"' not in body


def test_export_jobs_are_view_only_in_the_console(client: Any, version: Any, admin_user_role: Any,
                                                  viewer: Any) -> None:
    job = export_start(version=version, fmt="raw", split="all", actor=None, enqueue=False)
    for user in (viewer, admin_user_role):
        client.force_login(user)
        assert client.get(reverse("admin:datasets_exportjob_changelist")).status_code == 200
        body = client.get(reverse("admin:datasets_exportjob_change", args=[job.pk])).content.decode()
        assert 'name="_save"' not in body and "datasets.export_start" in body
        assert client.get(reverse("admin:datasets_exportjob_add")).status_code == 403


def test_a_lost_running_export_is_failed_and_replaced(version: Any, settings: Any) -> None:
    job = export_start(version=version, fmt="raw", split="all", actor=None, enqueue=False)
    ExportJob.objects.filter(pk=job.pk).update(status="running", started_at=timezone.now() - timedelta(days=1))
    again = export_start(version=version, fmt="raw", split="all", actor=None, enqueue=False)
    assert again.pk != job.pk and again.status == "queued"
    job.refresh_from_db()
    assert job.status == "failed" and job.error.startswith("worker lost")
    # A fresh running job is not touched: asking again returns it.
    ExportJob.objects.filter(pk=again.pk).update(status="running", started_at=timezone.now())
    assert export_start(version=version, fmt="raw", split="all", actor=None, enqueue=False).pk == again.pk
