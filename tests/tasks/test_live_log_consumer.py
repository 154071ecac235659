"""The live-log websocket: who may subscribe, relaying committed lines, the {"after": n} resend."""
from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.test import Client

from apps.tasks.consumers import TrajectoryLogConsumer
from apps.tasks.models import Trajectory, TrajectoryLog
from apps.tasks.services import trajectory_log_append
from trajplatform.asgi import application, websocket_urlpatterns

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

# Generous: these bound how long a broken test hangs, they are not what is being measured.
WAIT = 10


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    yield
    async_to_sync(get_channel_layer().flush)()


@pytest.fixture
def no_tail(monkeypatch):
    """Group messages only: proves the channel-layer path without the in-memory fallback."""
    monkeypatch.setattr(TrajectoryLogConsumer, "tail_poll_seconds", None)


@pytest.fixture
def trajectory(make_task):
    return Trajectory.objects.create(task=make_task(), iteration=1, status=Trajectory.Status.RUNNING)


def communicator_for(trajectory_id: int, user) -> WebsocketCommunicator:
    """The routed consumer with `user` already in the scope (what AuthMiddlewareStack provides)."""
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/trajectories/{trajectory_id}/")
    communicator.scope["user"] = user
    return communicator


append = database_sync_to_async(trajectory_log_append)


async def assert_refused(communicator: WebsocketCommunicator, code: int) -> None:
    connected, _ = await communicator.connect(timeout=WAIT)
    assert connected  # accepted only to deliver the close code to the browser
    closing = await communicator.receive_output(timeout=WAIT)
    assert closing == {"type": "websocket.close", "code": code}
    await communicator.disconnect(code=code, timeout=WAIT)  # what the server does after a close


async def test_a_viewer_receives_lines_appended_after_subscribing(viewer, trajectory, no_tail):
    communicator = communicator_for(trajectory.pk, viewer)
    connected, _ = await communicator.connect(timeout=WAIT)
    assert connected

    await append(trajectory_id=trajectory.pk, lines=[("thought", "plan the work", {}), ("action", "ls", {"step": 1})])
    message = await communicator.receive_json_from(timeout=WAIT)
    assert message["type"] == "lines"
    assert [(line["seq"], line["kind"], line["message"], line["data"]) for line in message["lines"]] == [
        (1, "thought", "plan the work", {}), (2, "action", "ls", {"step": 1})]

    await append(trajectory_id=trajectory.pk, lines=[("output", "notes.txt", {})])
    message = await communicator.receive_json_from(timeout=WAIT)
    assert [line["seq"] for line in message["lines"]] == [3]
    assert await communicator.receive_nothing()
    await communicator.disconnect()


async def test_lines_of_other_trajectories_are_not_sent(viewer, trajectory, no_tail):
    other = await database_sync_to_async(Trajectory.objects.create)(task=trajectory.task, iteration=2)
    communicator = communicator_for(trajectory.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    await append(trajectory_id=other.pk, lines=[("output", "elsewhere", {})])
    await append(trajectory_id=trajectory.pk, lines=[("output", "here", {})])
    message = await communicator.receive_json_from(timeout=WAIT)
    assert [line["message"] for line in message["lines"]] == ["here"]
    await communicator.disconnect()


async def test_anonymous_users_are_refused(trajectory):
    await assert_refused(communicator_for(trajectory.pk, AnonymousUser()), 4403)


async def test_a_missing_user_in_the_scope_is_refused(trajectory):
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/trajectories/{trajectory.pk}/")
    await assert_refused(communicator, 4403)


async def test_a_signed_in_user_without_the_view_permission_is_refused(make_user, trajectory):
    outsider = await database_sync_to_async(make_user)(None)
    await assert_refused(communicator_for(trajectory.pk, outsider), 4403)


async def test_an_inactive_viewer_is_refused(make_user, trajectory):
    viewer = await database_sync_to_async(make_user)("viewer", is_active=False)
    await assert_refused(communicator_for(trajectory.pk, viewer), 4403)


@pytest.mark.parametrize("trajectory_id", [987654, 10**30])
async def test_an_unknown_trajectory_is_refused(viewer, trajectory_id):
    await assert_refused(communicator_for(trajectory_id, viewer), 4404)


async def test_an_outsider_cannot_probe_which_trajectories_exist(make_user, db):
    outsider = await database_sync_to_async(make_user)(None)
    await assert_refused(communicator_for(987654, outsider), 4403)


async def test_after_resends_the_lines_after_that_seq(viewer, trajectory, no_tail):
    await append(trajectory_id=trajectory.pk, lines=[("output", f"line {n}", {}) for n in range(1, 6)])
    communicator = communicator_for(trajectory.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]

    await communicator.send_json_to({"after": 3})
    reply = await communicator.receive_json_from(timeout=WAIT)
    assert reply["type"] == "lines"
    assert (reply["after"], reply["more"]) == (3, False)
    assert [(line["seq"], line["message"]) for line in reply["lines"]] == [(4, "line 4"), (5, "line 5")]

    await communicator.send_json_to({"after": 5})
    reply = await communicator.receive_json_from(timeout=WAIT)
    assert (reply["lines"], reply["more"]) == ([], False)
    await communicator.disconnect()


async def test_a_resend_is_chunked_and_says_when_there_is_more(viewer, trajectory, no_tail, monkeypatch):
    monkeypatch.setattr(TrajectoryLogConsumer, "RESEND_LIMIT", 2)
    await append(trajectory_id=trajectory.pk, lines=[("output", f"line {n}", {}) for n in range(1, 6)])
    communicator = communicator_for(trajectory.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    await communicator.send_json_to({"after": 0})
    reply = await communicator.receive_json_from(timeout=WAIT)
    assert ([line["seq"] for line in reply["lines"]], reply["more"]) == ([1, 2], True)
    await communicator.disconnect()


@pytest.mark.parametrize(
    "frame", ['{"after": -1}', '{"after": "3"}', '{"after": true}', '{"after": 1.5}', '{"after": 99999999999999999999}',
              '{"nope": 1}', '[1, 2]', 'not json']
)
async def test_bad_client_messages_get_an_error_and_keep_the_subscription(viewer, trajectory, no_tail, frame):
    communicator = communicator_for(trajectory.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    await communicator.send_to(text_data=frame)
    reply = await communicator.receive_json_from(timeout=WAIT)
    assert reply["type"] == "error"
    await append(trajectory_id=trajectory.pk, lines=[("output", "still here", {})])
    message = await communicator.receive_json_from(timeout=WAIT)
    assert [line["message"] for line in message["lines"]] == ["still here"]
    await communicator.disconnect()


async def test_with_the_in_memory_layer_lines_written_by_another_process_are_tailed(viewer, trajectory, monkeypatch):
    # A worker process's group_send never reaches this process's in-memory layer: a row
    # written without any broadcast stands in for it.
    monkeypatch.setattr(TrajectoryLogConsumer, "tail_poll_seconds", 0.05)
    await append(trajectory_id=trajectory.pk, lines=[("output", "before subscribe", {})])
    communicator = communicator_for(trajectory.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    await database_sync_to_async(TrajectoryLog.objects.create)(
        trajectory=trajectory, seq=2, kind="output", message="from the worker"
    )
    message = await communicator.receive_json_from(timeout=WAIT)
    # Lines before the subscribe are the backfill's job, not the tail's.
    assert [(line["seq"], line["message"]) for line in message["lines"]] == [(2, "from the worker")]
    await communicator.disconnect()


async def test_disconnect_leaves_the_group(viewer, trajectory, no_tail):
    communicator = communicator_for(trajectory.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    layer = get_channel_layer()
    assert layer.groups.get(f"trajectory-{trajectory.pk}")
    await communicator.disconnect()
    assert not layer.groups.get(f"trajectory-{trajectory.pk}")


# --- the real stack: origin check, session cookie, AuthMiddlewareStack ------------------------

def session_cookie_for(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def real_stack_communicator(trajectory_id: int, *, cookie: str | None, origin: str) -> WebsocketCommunicator:
    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", origin.encode())]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/trajectories/{trajectory_id}/", headers=headers)


async def test_the_asgi_application_authenticates_by_session_cookie(viewer, trajectory, no_tail):
    cookie = await database_sync_to_async(session_cookie_for)(viewer)
    communicator = real_stack_communicator(trajectory.pk, cookie=cookie, origin="http://127.0.0.1:8000")
    connected, _ = await communicator.connect(timeout=WAIT)
    assert connected
    await append(trajectory_id=trajectory.pk, lines=[("result", "reward 1.0", {})])
    message = await communicator.receive_json_from(timeout=WAIT)
    assert [line["message"] for line in message["lines"]] == ["reward 1.0"]
    await communicator.disconnect()


async def test_the_asgi_application_refuses_a_request_without_a_session(trajectory):
    communicator = real_stack_communicator(trajectory.pk, cookie=None, origin="http://127.0.0.1:8000")
    await assert_refused(communicator, 4403)


async def test_the_asgi_application_refuses_a_forged_session_cookie(trajectory):
    communicator = real_stack_communicator(trajectory.pk, cookie="not-a-session", origin="http://127.0.0.1:8000")
    await assert_refused(communicator, 4403)


async def test_the_asgi_application_rejects_another_sites_origin_at_the_handshake(viewer, trajectory):
    cookie = await database_sync_to_async(session_cookie_for)(viewer)
    communicator = real_stack_communicator(trajectory.pk, cookie=cookie, origin="http://evil.example")
    connected, _ = await communicator.connect(timeout=WAIT)
    assert not connected
    await communicator.disconnect(timeout=WAIT)


async def test_the_tail_does_not_keep_resending_a_line(viewer, trajectory, monkeypatch):
    monkeypatch.setattr(TrajectoryLogConsumer, "tail_poll_seconds", 0.05)
    communicator = communicator_for(trajectory.pk, viewer)
    assert (await communicator.connect(timeout=WAIT))[0]
    await append(trajectory_id=trajectory.pk, lines=[("output", "once", {})])
    seen = [line["seq"] for line in (await communicator.receive_json_from(timeout=WAIT))["lines"]]
    # Let several tail periods pass. The tail and the group message may both carry seq 1
    # once (clients key lines by seq); after that, nothing more.
    await asyncio.sleep(0.3)
    while not await communicator.receive_nothing(timeout=0.1):
        seen += [line["seq"] for line in (await communicator.receive_json_from(timeout=WAIT))["lines"]]
    assert set(seen) == {1} and len(seen) <= 2
    await communicator.disconnect()
