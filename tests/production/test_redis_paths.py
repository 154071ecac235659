"""What Redis carries besides the queue: live-log messages, API throttle counters, LLM replies.

Each is checked across processes: a second Django process (`manage.py shell -c`, another web
server or worker as far as Redis can tell) on the same test database and Redis.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings

from apps.tasks.consumers import TrajectoryLogConsumer
from apps.tasks.models import Trajectory
from apps.tasks.services import trajectory_log_append
from trajplatform.asgi import websocket_urlpatterns


def other_process(code: str, env: dict[str, str]) -> dict:
    """Run `code` in another Django process; it prints one JSON object, returned here."""
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=django_settings.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_idle_live_log_socket_outlives_redis_read_timeouts_and_gets_the_next_line(
        redis_client, viewer, make_task, monkeypatch):
    """redis-py 8's default 5 s read timeout used to end channels-redis's blocking receive, and
    with it every websocket that had been quiet for 5 s (settings: the layer's socket_timeout)."""
    monkeypatch.setattr(TrajectoryLogConsumer, "tail_poll_seconds", None)
    trajectory = await database_sync_to_async(
        lambda: Trajectory.objects.create(task=make_task(), iteration=1, status=Trajectory.Status.RUNNING))()
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/trajectories/{trajectory.pk}/")
    communicator.scope["user"] = viewer
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    await asyncio.sleep(7)  # longer than redis-py's default read timeout
    assert await communicator.receive_nothing(timeout=0.1)
    await database_sync_to_async(trajectory_log_append)(trajectory_id=trajectory.pk, lines=[("thought", "still here", {})])
    message = await communicator.receive_json_from(timeout=10)
    assert [(line["seq"], line["message"]) for line in message["lines"]] == [(1, "still here")]
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
def test_api_throttle_counters_and_llm_replies_are_shared_by_every_process(
        redis_client, cluster_env, make_user, settings):
    from django.core.cache import caches
    from rest_framework.test import APIClient

    from trajplatform.api_models import api_token_create

    _, token = api_token_create(user=make_user("viewer"), name="throttled", actor=None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    settings.API_THROTTLE_RATE = "3/min"
    assert [client.get("/api/v1/me").status_code for _ in range(3)] == [200, 200, 200]
    caches["llm"].set("reply-key", {"content": "cached by this process"})
    seen = other_process(
        "import json\n"
        "from django.core.cache import caches\n"
        "from rest_framework.test import APIClient\n"
        "c = APIClient(); c.credentials(HTTP_AUTHORIZATION='Bearer " + token + "')\n"
        "print(json.dumps({'status': c.get('/api/v1/me', HTTP_HOST='127.0.0.1').status_code,"
        " 'reply': caches['llm'].get('reply-key')}))\n",
        cluster_env(API_THROTTLE_RATE="3/min", DJANGO_ALLOWED_HOSTS="127.0.0.1"))
    # The fourth request, made by another process, is over the token's budget of three.
    assert seen == {"status": 429, "reply": {"content": "cached by this process"}}
