"""The console counts tasks by their real state (issue 40, item 3): a task imported and never
started is "not started", not "queued" (its status is queued, its current iteration 0), on the
batches list, the batch page and its progress line, as on the operator overview; "queued" is a task
queued again after it ran. One definition: selectors.TASK_STATES."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.reviews import selectors
from apps.tasks.models import Batch, Task
from trajplatform import overview

pytestmark = pytest.mark.django_db


@pytest.fixture
def imported(make_task):
    """Batch 'fresh' of three tasks never started; batch 'rerun' with one task queued again after a
    failed iteration and one completed."""
    fresh, rerun = Batch.objects.create(name="fresh"), Batch.objects.create(name="rerun")
    for i in range(3):
        make_task(batch=fresh, external_id=f"f{i}")
    again = make_task(batch=rerun, external_id="r0")
    Task.objects.filter(pk=again.pk).update(status=Task.Status.QUEUED, current_iteration=1)
    done = make_task(batch=rerun, external_id="r1")
    Task.objects.filter(pk=done.pk).update(status=Task.Status.COMPLETED, current_iteration=2)
    return fresh, rerun


def cell(html: str, batch: str, state: str) -> str:
    return html.split(f'data-batch="{batch}"')[1].split(f'data-state="{state}">')[1].split("<")[0]


def test_the_batches_list_counts_not_started_apart_from_queued(client, viewer, imported):
    client.force_login(viewer)
    html = client.get(reverse("reviews:batches")).content.decode()
    assert "<th>not started</th><th>queued</th>" in html
    assert (cell(html, "fresh", "not_started"), cell(html, "fresh", "queued")) == ("3", "0")
    assert (cell(html, "rerun", "not_started"), cell(html, "rerun", "queued"), cell(html, "rerun", "completed")) == \
        ("0", "1", "1")


def test_the_batch_page_says_not_started_and_filters_by_it(client, make_user, imported):
    fresh, rerun = imported
    client.force_login(make_user("reviewer"))
    html = client.get(reverse("reviews:batch", args=[fresh.pk])).content.decode()
    line = html.split('id="batch-progress"')[1].split("</p>")[0]
    assert "3 not started ·" in line and "queued" not in line
    assert html.count('<span class="badge status-not_started">not started</span>') == 3
    assert '<button type="submit">Start</button>' in html  # a never-started batch can be started
    html = client.get(reverse("reviews:batch", args=[rerun.pk]), {"status": "not_started"}).content.decode()
    assert "No tasks." in html
    html = client.get(reverse("reviews:batch", args=[rerun.pk]), {"status": "queued"}).content.decode()
    assert html.count("badge status-queued") == 1 and "not started</span>" not in html
    fragment = client.get(reverse("reviews:batch_progress", args=[rerun.pk])).content.decode()
    assert "1 queued · 1 completed ·" in fragment


def test_the_progress_costs_the_same_queries_whatever_the_batches(client, viewer, imported, make_task):
    client.force_login(viewer)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("reviews:batches")).status_code == 200
        return len(captured)

    before = queries()
    more = Batch.objects.create(name="more")
    for i in range(4):
        make_task(batch=more, external_id=f"m{i}")
    assert queries() == before


def test_the_overview_and_the_console_count_with_one_definition(imported):
    fresh, rerun = imported
    progress = selectors.batch_progress([fresh, rerun])
    states = {s.key: s.n for s in overview.task_states()}
    assert states["not_started"] == progress[fresh.pk]["not_started"] + progress[rerun.pk]["not_started"] == 3
    assert states["queued"] == progress[rerun.pk]["queued"] == 1
    assert list(progress[fresh.pk]) == [key for key, *_ in overview.TASK_STATES] == list(selectors.STATE_LABELS)
