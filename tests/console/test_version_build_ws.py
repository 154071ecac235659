"""A version build's progress live over /ws/version-builds/<id>/ (issue 40, item 5): the state on
subscribe, each stage the real job reports, the end with the version's URL; who may subscribe;
the in-memory layer's tail reads a build run elsewhere."""
from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from apps.datasets import jobs, services
from apps.datasets.consumers import VersionBuildConsumer
from apps.datasets.models import VersionBuild
from tests.datasets.version_data import make_trajectory, no_dedup
from tests.tasks.test_live_log_consumer import assert_refused, fresh_channel_layer  # noqa: F401 (autouse fixture)
from trajplatform.asgi import websocket_urlpatterns

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 10  # bounds a broken test's hang; not what is measured


@pytest.fixture
def build(make_task, approver, monkeypatch):
    monkeypatch.setattr(services, "_enqueue_build", lambda pk: None)
    monkeypatch.setattr(jobs, "BUILD_PROGRESS_EVERY_S", 0.0)
    for i in range(3):
        make_trajectory(make_task(prompt=f"Write program number {i}"), code=f"print({i})", score=90)
    return services.version_build_start(dataset_name="live-build", filter_spec=no_dedup(), actor=approver)


def communicator_for(build_id: int, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/version-builds/{build_id}/")
    communicator.scope["user"] = user
    return communicator


async def until_final(communicator: WebsocketCommunicator) -> list[dict]:
    seen = []
    while not seen or seen[-1]["status"] not in ("done", "failed"):
        seen.append(await communicator.receive_json_from(timeout=WAIT))
    return seen


@pytest.mark.asyncio
async def test_a_viewer_follows_a_build_from_queued_to_its_version(viewer, build, monkeypatch):
    monkeypatch.setattr(VersionBuildConsumer, "tail_poll_seconds", None)
    communicator = communicator_for(build.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    first = await communicator.receive_json_from(timeout=WAIT)
    assert (first["type"], first["build"], first["status"], first["version_url"]) == ("build", build.pk, "queued", None)
    await database_sync_to_async(jobs.run_version_build)(build.pk)
    seen = await until_final(communicator)
    stages = [m["stage"] for m in seen if m["status"] == "running"]
    assert stages[0] == "starting" and "scanned" in stages and "reading" in stages
    assert any(m["total"] == 3 and m["done"] == 3 for m in seen if m["stage"] == "reading")
    assert seen[-1]["status"] == "done" and seen[-1]["version_url"] == "/datasets/live-build/v1/"
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_without_a_shared_layer_the_consumer_reads_a_build_run_elsewhere(viewer, build, monkeypatch):
    monkeypatch.setattr(VersionBuildConsumer, "tail_poll_seconds", 0.05)
    communicator = communicator_for(build.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    await communicator.receive_json_from(timeout=WAIT)
    # a worker in another process: its group messages never reach this in-memory layer
    monkeypatch.setattr(services, "send_to_groups", lambda groups, message: None)
    await database_sync_to_async(jobs.run_version_build)(build.pk)
    seen = await until_final(communicator)
    assert seen[-1]["version_url"] == "/datasets/live-build/v1/"
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_outsiders_and_missing_builds_are_refused(make_user, viewer, build):
    await assert_refused(communicator_for(build.pk, AnonymousUser()), 4403)
    await assert_refused(communicator_for(build.pk, await database_sync_to_async(make_user)(None)), 4403)
    await assert_refused(communicator_for(build.pk + 1000, viewer), 4404)
    assert await database_sync_to_async(VersionBuild.objects.count)() == 1
