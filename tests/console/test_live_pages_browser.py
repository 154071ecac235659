"""The live batch progress and export status pages in Chromium against daphne (issue 28): the
pages' scripts follow their websockets (the in-memory layer's tail in daphne sees what this process
commits) and do not poll while the socket is open. The consumers' own tests are
test_batch_progress_ws.py and test_export_states_ws.py."""
from __future__ import annotations

import pytest
from django.urls import reverse

from apps.datasets.jobs import export_run
from apps.datasets.services import export_start
from apps.tasks.models import Task
from tests.console.test_batch_progress_ws import batch  # noqa: F401 (fixture)
from tests.console.test_export_states_ws import version  # noqa: F401 (fixture)
from tests.datasets.version_data import export_dir  # noqa: F401 (fixture)
from tests.tasks.test_live_log_browser import daphne_server, page, static_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


def test_in_chromium_the_batch_page_follows_the_socket(daphne_server, page, batch, make_user):
    """The page's script: live state once the socket is open, counts written from its events (here
    the in-memory layer's tail in daphne sees a change this process commits)."""
    from playwright.sync_api import expect

    from tests.console.test_console_browser import shot, sign_in

    sign_in(page, daphne_server, make_user("reviewer"), "/review/work/")
    requests = []
    page.on("request", lambda r: requests.append(r.url) if "/progress" in r.url else None)
    page.goto(f"{daphne_server.url}{reverse('reviews:batch', args=[batch.pk])}")
    expect(page.locator("#batch-progress")).to_have_attribute("data-live-state", "live")
    first, second, _third = Task.objects.filter(batch=batch).order_by("pk")
    Task.objects.filter(pk=second.pk).update(current_iteration=1)  # queued again after it ran
    Task.objects.filter(pk=first.pk).update(status=Task.Status.COMPLETED)
    expect(page.locator("#batch-progress [data-final]")).to_have_text("1 of 3 tasks final")
    # the states' labels, as the server-rendered line prints them: the imported one is not started
    expect(page.locator("#batch-progress [data-counts]")).to_have_text("1 not started · 1 queued · 1 completed ·")
    page.wait_for_timeout(3500)
    assert requests == []  # no polling while the socket is open
    shot(page, "batch-live-1440")


def test_in_chromium_the_exports_table_follows_the_socket(daphne_server, page, approver, version):
    from playwright.sync_api import expect

    from tests.console.test_console_browser import sign_in

    job = export_start(version=version, fmt="sft-openai", actor=approver, enqueue=False)
    sign_in(page, daphne_server, approver, "/review/?tier=red")
    requests = []
    page.on("request", lambda r: requests.append(r.url) if "fragment=exports" in r.url else None)
    page.goto(f"{daphne_server.url}{reverse('datasets:version_detail', args=[version.dataset.name, version.number])}")
    expect(page.locator("#exports-table")).to_have_attribute("data-live-state", "live")
    expect(page.locator(f'#exports-table tr[data-job="{job.pk}"]')).to_have_attribute("data-status", "queued")
    page.wait_for_timeout(3500)
    assert requests == []  # no polling while the socket is open
    export_run(job.pk)
    expect(page.locator(f'#exports-table tr[data-job="{job.pk}"]')).to_have_attribute("data-status", "done")
    expect(page.locator("#exports-table")).to_contain_text("download")
    # reloads asked for by the socket's events, one per state the table did not show yet: the
    # job's "running" and "done" come as two events, which arrive together or apart depending on
    # the machine's load (a 3 s poll would have added more)
    assert 1 <= len(requests) <= 2, requests
