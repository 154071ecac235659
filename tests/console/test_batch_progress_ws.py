"""Live batch progress (issue 28, item 6): /ws/batches/<id>/ sends the batch's task counts per state
on subscribe and after each committed change (through the real services), once per transaction;
who may subscribe; the in-memory layer's fallback tail; the page keeps polling while the socket is
closed."""
from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.urls import reverse

from apps.tasks.consumers import BatchProgressConsumer
from apps.tasks.models import Batch, Task
from apps.tasks.selectors import STATE_LABELS
from apps.tasks.services import batch_cancel, task_cancel, tasks_enqueue
from tests.tasks.test_live_log_consumer import assert_refused, fresh_channel_layer  # noqa: F401 (autouse fixture)
from trajplatform.asgi import websocket_urlpatterns

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 10  # bounds a broken test's hang; not what is measured
NONE = dict.fromkeys(STATE_LABELS, 0)


@pytest.fixture
def no_tail(monkeypatch):
    """Group messages only: proves the on-commit events without the in-memory fallback."""
    monkeypatch.setattr(BatchProgressConsumer, "tail_poll_seconds", None)


@pytest.fixture
def batch(make_task):
    batch = Batch.objects.create(name="live batch")
    for i in range(3):
        make_task(batch=batch, external_id=f"t{i}")
    return batch


def communicator_for(batch_id: int, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/batches/{batch_id}/")
    communicator.scope["user"] = user
    return communicator


def progress(batch_id: int, **counts: int) -> dict:
    merged = {**NONE, **counts}
    return {"type": "progress", "batch": batch_id, "counts": merged, "labels": STATE_LABELS, "total": sum(merged.values()),
            "final": sum(merged[s] for s in Task.FINAL)}


async def subscribed(batch_id: int, user) -> WebsocketCommunicator:
    communicator = communicator_for(batch_id, user)
    connected, _ = await communicator.connect(timeout=WAIT)
    assert connected
    return communicator


@pytest.mark.asyncio
async def test_a_viewer_gets_the_counts_then_each_committed_change(viewer, admin_user_role, batch, no_tail):
    communicator = await subscribed(batch.pk, viewer)
    assert await communicator.receive_json_from(timeout=WAIT) == progress(batch.pk, not_started=3)
    first = await database_sync_to_async(Task.objects.order_by("pk").first)()
    await database_sync_to_async(task_cancel)(task=first, actor=admin_user_role, reason="test")
    assert await communicator.receive_json_from(timeout=WAIT) == progress(batch.pk, not_started=2, cancelled=1)
    await database_sync_to_async(tasks_enqueue)(batch=batch, actor=admin_user_role)
    assert await communicator.receive_json_from(timeout=WAIT) == progress(batch.pk, running=2, cancelled=1)
    assert await communicator.receive_nothing()
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_batch_cancel_sends_one_event_for_all_its_tasks(viewer, admin_user_role, batch, no_tail):
    communicator = await subscribed(batch.pk, viewer)
    await communicator.receive_json_from(timeout=WAIT)
    cancelled = await database_sync_to_async(batch_cancel)(batch=batch, actor=admin_user_role, reason="test")
    assert cancelled == 3
    assert await communicator.receive_json_from(timeout=WAIT) == progress(batch.pk, cancelled=3)
    assert await communicator.receive_nothing()
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_rolled_back_change_sends_nothing_and_the_next_commit_still_does(
        viewer, admin_user_role, batch, no_tail):
    communicator = await subscribed(batch.pk, viewer)
    await communicator.receive_json_from(timeout=WAIT)

    @database_sync_to_async
    def cancel_then_roll_back_then_cancel() -> None:
        first, second = Task.objects.order_by("pk")[:2]
        with pytest.raises(RuntimeError), transaction.atomic():
            task_cancel(task=first, actor=admin_user_role)
            raise RuntimeError("roll back")
        task_cancel(task=second, actor=admin_user_role)

    await cancel_then_roll_back_then_cancel()
    assert await communicator.receive_json_from(timeout=WAIT) == progress(batch.pk, not_started=2, cancelled=1)
    assert await communicator.receive_nothing()
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_changes_of_other_batches_are_not_sent(viewer, admin_user_role, batch, make_task, no_tail):
    other = await database_sync_to_async(make_task)()
    communicator = await subscribed(batch.pk, viewer)
    await communicator.receive_json_from(timeout=WAIT)
    await database_sync_to_async(task_cancel)(task=other, actor=admin_user_role)
    assert await communicator.receive_nothing()
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_without_a_shared_layer_the_consumer_reads_changes_made_elsewhere(viewer, batch, monkeypatch):
    monkeypatch.setattr(BatchProgressConsumer, "tail_poll_seconds", 0.1)
    communicator = await subscribed(batch.pk, viewer)
    await communicator.receive_json_from(timeout=WAIT)
    # A worker process's change: its events cannot reach this process's in-memory layer.
    await database_sync_to_async(Task.objects.filter(batch=batch).update)(status=Task.Status.COMPLETED)
    assert await communicator.receive_json_from(timeout=WAIT) == progress(batch.pk, completed=3)
    assert await communicator.receive_nothing(timeout=0.5)  # unchanged counts are not sent again
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_who_may_subscribe(make_user, viewer, batch):
    await assert_refused(communicator_for(batch.pk, AnonymousUser()), 4403)
    outsider = await database_sync_to_async(make_user)()
    await assert_refused(communicator_for(batch.pk, outsider), 4403)
    await assert_refused(communicator_for(batch.pk + 1000, viewer), 4404)
    await assert_refused(communicator_for(2**63, viewer), 4404)


def test_the_batch_page_subscribes_and_polls_only_while_the_socket_is_closed(client, viewer, batch):
    client.force_login(viewer)
    page = client.get(reverse("reviews:batch", args=[batch.pk])).content.decode()
    assert f'data-ws="/ws/batches/{batch.pk}/"' in page and "console/batchprogress.js" in page
    assert 'hx-trigger="every 3s [!(window.batchProgressLive && window.batchProgressLive())]"' in page
    fragment = client.get(reverse("reviews:batch_progress", args=[batch.pk])).content.decode()
    assert "0 of 3 tasks final" in fragment and "3 not started" in fragment  # imported, never started


def test_a_failed_event_send_is_logged_and_the_change_stands(viewer, batch, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise ConnectionError("channel layer down")

    monkeypatch.setattr("apps.tasks.services.send_to_groups", broken)
    first = Task.objects.filter(batch=batch).order_by("pk").first()
    task_cancel(task=first, actor=viewer, reason="test")  # its event is sent when its transaction commits
    first.refresh_from_db()
    assert first.status == Task.Status.CANCELLED
    assert "channel layer down" in caplog.text


@pytest.mark.asyncio
async def test_the_live_line_counts_the_not_started_apart_from_the_queued_again(viewer, batch, no_tail):
    """A task that ran an iteration and is queued again is "queued"; the imported ones are "not
    started", with the labels the page prints (the same states as the server-rendered line)."""
    await database_sync_to_async(Task.objects.filter(external_id="t0").update)(current_iteration=1)
    communicator = await subscribed(batch.pk, viewer)
    message = await communicator.receive_json_from(timeout=WAIT)
    assert message == progress(batch.pk, not_started=2, queued=1)
    assert message["labels"]["not_started"] == "not started" and message["labels"]["waiting_approval"] == "waiting for approval"
    assert list(message["counts"]) == list(STATE_LABELS)
    await communicator.disconnect()
