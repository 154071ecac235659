"""The dataset version builder (issue 28, item 7): the filter spec as a form, a live count and a
sample of members before creating, then an approver creates and publishes the version."""
from __future__ import annotations

import pytest
from django.urls import reverse

from apps.datasets.jobs import run_version_build
from tests.datasets.version_data import measure_exportability
from apps.datasets.models import DatasetVersion, VersionBuild
from tests.reviews.factories import auto_review, finished_trajectory

pytestmark = pytest.mark.django_db


@pytest.fixture
def scored(make_task):
    out = []
    for i, score in enumerate((95.0, 85.0, 40.0)):
        t = finished_trajectory(make_task(prompt=f"Task number {i}: print {i} primes."))
        auto_review(t, score)
        out.append(t)
    return out


def test_the_preview_counts_and_samples_as_the_filter_changes(client, viewer, scored):
    client.force_login(viewer)
    page = client.get(reverse("datasets:builder")).content.decode()
    assert 'id="builder-form"' in page and 'hx-get="/datasets/new/preview"' in page
    html = client.get(reverse("datasets:builder_preview"), {"dataset": "d", "dedup_exact": "on"}).content.decode()
    assert "3 trajectories of 3 tasks pass" in html and all(f"#{t.pk}<" in html for t in scored)
    html = client.get(reverse("datasets:builder_preview"), {"dataset": "d", "min_score": "80"}).content.decode()
    assert "2 trajectories of 2 tasks pass" in html and f"#{scored[2].pk}<" not in html
    html = client.get(reverse("datasets:builder_preview"), {"dataset": "d", "batches": "abc"}).content.decode()
    assert 'id="builder-errors"' in html and "batches" in html


def test_an_approver_builds_and_publishes_a_version_from_the_form(client, approver, viewer, scored):
    client.force_login(viewer)
    assert client.post(reverse("datasets:builder"), {"dataset": "primes", "min_score": "80"}).status_code == 403
    client.force_login(approver)
    response = client.post(reverse("datasets:builder"), {"dataset": "primes", "min_score": "80",
                                                         "notes": "from the form"})
    # The request queues the build and returns; the worker's job writes the version.
    build = VersionBuild.objects.get()
    assert response.url == reverse("datasets:build_detail", args=[build.pk])
    assert build.status == "queued" and not DatasetVersion.objects.exists()
    page = client.get(response.url).content.decode()
    assert f'data-ws="/ws/version-builds/{build.pk}/"' in page and "queued" in page
    run_version_build(build.pk)
    version = measure_exportability(DatasetVersion.objects.get())
    done = client.get(response.url).content.decode()
    assert 'data-status="done"' in done and f'href="{reverse("datasets:version_detail", args=["primes", 1])}"' in done
    assert (version.status, version.counts["members"], version.created_by, version.notes) == (
        "draft", 2, approver, "from the form")
    assert version.filter_spec["min_score"] == 80
    client.post(reverse("datasets:version_publish", args=["primes", 1]))
    version.refresh_from_db()
    assert version.status == "published"


def test_a_bad_filter_is_shown_and_creates_nothing(client, approver, scored):
    client.force_login(approver)
    response = client.post(reverse("datasets:builder"), {"dataset": "not a slug!", "min_score": "800"})
    assert response.status_code == 400 and 'id="builder-errors"' in response.content.decode()
    assert not DatasetVersion.objects.exists() and not VersionBuild.objects.exists()


def test_members_show_verdicts_and_corrections_and_exports_refresh_while_running(
        client, approver, reviewer, scored, django_capture_on_commit_callbacks):
    from apps.datasets.models import ExportJob
    from apps.reviews.services import human_verdict_record, trajectory_correct

    human_verdict_record(trajectory=scored[0], actor=reviewer, verdict="accept", reason="")
    fixed = trajectory_correct(trajectory=scored[1], actor=reviewer, final_answer="a better answer").corrected
    client.force_login(approver)
    client.post(reverse("datasets:builder"), {"dataset": "primes", "min_score": "80"})
    run_version_build(VersionBuild.objects.get().pk)
    measure_exportability(DatasetVersion.objects.get())
    html = client.get(reverse("datasets:version_detail", args=["primes", 1])).content.decode()
    assert "verdict-accept" in html and f"corrected in <a href=\"/trajectories/{fixed.pk}/\">#{fixed.pk}</a>" in html
    with django_capture_on_commit_callbacks(execute=False):
        # raw: these trajectories have no assistant turn, which the chat formats cannot write (refused)
        client.post(reverse("datasets:version_export", args=["primes", 1]), {"format": "raw", "split": "all"})
    assert ExportJob.objects.get().status == "queued"
    fragment = client.get(reverse("datasets:version_detail", args=["primes", 1]), {"fragment": "exports"})
    # every 3 s while the version's websocket is not open (tests/console/test_export_states_ws.py)
    assert 'hx-trigger="every 3s [' in fragment.content.decode() and "<html" not in fragment.content.decode()
    ExportJob.objects.update(status="failed", error="x")
    fragment = client.get(reverse("datasets:version_detail", args=["primes", 1]), {"fragment": "exports"})
    assert "hx-trigger" not in fragment.content.decode()
