"""Export status live on the version page (issue 28, item 7): /ws/versions/<id>/exports/ sends the
version's export states on subscribe and after each committed change made by the real services and
job (start, claim, finish, fail); who may subscribe; the in-memory layer's fallback tail; the page
reloads its exports table from the socket and polls only while the socket is closed."""
from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.urls import reverse

from apps.datasets.consumers import ExportStatesConsumer
from apps.datasets.jobs import export_run
from apps.datasets.models import ExportabilityRun, ExportJob
from apps.datasets.services import dataset_version_create, export_fail, export_start, exportability_measure
from tests.datasets.version_data import export_dir, make_trajectory, no_dedup  # noqa: F401 (export_dir: fixture)
from tests.tasks.test_live_log_consumer import assert_refused, fresh_channel_layer  # noqa: F401 (autouse fixture)
from trajplatform.asgi import websocket_urlpatterns

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 10  # bounds a broken test's hang; not what is measured


@pytest.fixture
def no_tail(monkeypatch):
    monkeypatch.setattr(ExportStatesConsumer, "tail_poll_seconds", None)


@pytest.fixture
def version(make_task, approver, export_dir):
    for i in range(2):
        make_trajectory(make_task(prompt=f"Write program number {i}"), code=f"print({i})", score=90)
    return dataset_version_create(dataset_name="live-exports", actor=approver, filter_spec=no_dedup())


async def subscribed(version_id: int, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/versions/{version_id}/exports/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=WAIT)
    assert connected
    return communicator


MEASURED = {"status": "done", "done": 2, "total": 2, "error": ""}  # the fixture's version, measured when made


def states(version_id: int, *jobs: tuple[int, str], exportability: dict | None = MEASURED) -> dict:
    return {"type": "exports", "version": version_id, "jobs": [list(j) for j in jobs], "exportability": exportability}


@pytest.mark.asyncio
async def test_a_viewer_follows_an_export_from_queued_to_done(viewer, approver, version, no_tail):
    communicator = await subscribed(version.pk, viewer)
    assert await communicator.receive_json_from(timeout=WAIT) == states(version.pk)
    job = await database_sync_to_async(export_start)(version=version, fmt="sft-openai", actor=approver, enqueue=False)
    assert await communicator.receive_json_from(timeout=WAIT) == states(version.pk, (job.pk, "queued"))
    await database_sync_to_async(export_run)(job.pk)
    assert await communicator.receive_json_from(timeout=WAIT) == states(version.pk, (job.pk, "running"))
    assert await communicator.receive_json_from(timeout=WAIT) == states(version.pk, (job.pk, "done"))
    assert await communicator.receive_nothing()
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_failed_export_is_sent_and_other_versions_are_not(viewer, approver, version, no_tail):
    other = await database_sync_to_async(dataset_version_create)(
        dataset_name="other-exports", actor=approver, filter_spec=no_dedup())
    communicator = await subscribed(version.pk, viewer)
    await communicator.receive_json_from(timeout=WAIT)
    await database_sync_to_async(export_start)(version=other, fmt="sft-openai", actor=approver, enqueue=False)
    assert await communicator.receive_nothing()
    job = await database_sync_to_async(export_start)(version=version, fmt="sft-openai", actor=approver, enqueue=False)
    await communicator.receive_json_from(timeout=WAIT)
    await database_sync_to_async(export_fail)(job=job, error="disk full")
    assert await communicator.receive_json_from(timeout=WAIT) == states(version.pk, (job.pk, "failed"))
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_without_a_shared_layer_the_consumer_reads_changes_made_elsewhere(viewer, approver, version, monkeypatch):
    monkeypatch.setattr(ExportStatesConsumer, "tail_poll_seconds", 0.1)
    job = await database_sync_to_async(export_start)(version=version, fmt="sft-openai", actor=approver, enqueue=False)
    communicator = await subscribed(version.pk, viewer)
    assert await communicator.receive_json_from(timeout=WAIT) == states(version.pk, (job.pk, "queued"))
    # An export worker's claim in another process: its event cannot reach this in-memory layer.
    await database_sync_to_async(ExportJob.objects.filter(pk=job.pk).update)(status="running")
    assert await communicator.receive_json_from(timeout=WAIT) == states(version.pk, (job.pk, "running"))
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_the_exportability_measurement_s_progress_is_sent_until_it_is_done(viewer, approver, make_task,
                                                                               no_tail, settings):
    settings.DATASET_EXPORT_CHUNK = 1  # one task a chunk: each is a step of the progress
    for i in range(3):
        await database_sync_to_async(make_trajectory)(await database_sync_to_async(make_task)(
            prompt=f"Write program number {i}"), code=f"print({i})", score=90)
    version = await database_sync_to_async(dataset_version_create)(
        dataset_name="measured-live", actor=approver, filter_spec=no_dedup(validation_fraction=0),
        wait_exportability=False)
    run = await database_sync_to_async(ExportabilityRun.objects.get)(version=version)
    communicator = await subscribed(version.pk, viewer)

    def state(status: str, done: int) -> dict:
        return states(version.pk, exportability={"status": status, "done": done, "total": 3, "error": ""})

    assert await communicator.receive_json_from(timeout=WAIT) == state("queued", 0)
    await database_sync_to_async(exportability_measure)(run.pk)
    for expected in (state("running", 0), state("running", 1), state("running", 2), state("running", 3),
                     state("done", 3)):
        assert await communicator.receive_json_from(timeout=WAIT) == expected
    assert await communicator.receive_nothing()
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_who_may_subscribe(make_user, viewer, version):
    def communicator_for(version_id, user):
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/versions/{version_id}/exports/")
        communicator.scope["user"] = user
        return communicator

    await assert_refused(communicator_for(version.pk, AnonymousUser()), 4403)
    outsider = await database_sync_to_async(make_user)()
    await assert_refused(communicator_for(version.pk, outsider), 4403)
    await assert_refused(communicator_for(version.pk + 1000, viewer), 4404)


def test_the_version_page_subscribes_and_polls_only_while_the_socket_is_closed(client, viewer, approver, version):
    export_start(version=version, fmt="sft-openai", actor=approver, enqueue=False)
    client.force_login(viewer)
    url = reverse("datasets:version_detail", args=[version.dataset.name, version.number])
    page = client.get(url).content.decode()
    assert f'data-ws="/ws/versions/{version.pk}/exports/"' in page and "console/exportstates.js" in page
    assert 'hx-trigger="every 3s [!(window.exportsLive && window.exportsLive())]"' in page
    fragment = client.get(url, {"fragment": "exports"}).content.decode()
    assert f'data-ws="/ws/versions/{version.pk}/exports/"' in fragment and 'data-status="queued"' in fragment
