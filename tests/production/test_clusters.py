"""Two worker clusters (two machines) sharing PostgreSQL and Redis.

Each cluster is a real `manage.py qcluster` with its own var and sandbox directories and its own
host name (conftest.Cluster); the rollouts are code_exec episodes against the offline scripted
model (served from this process) in local sandboxes. This process is the web side: it submits
the batch and holds websocket subscriptions through the real consumer, on the Redis channel
layer, with the consumer's table tail off — lines reach it only through Redis.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.db.models import Count

from apps.engines.offline_model import running_offline_model
from apps.tasks.consumers import TrajectoryLogConsumer
from apps.tasks.models import Trajectory, TrajectoryLog
from trajplatform.asgi import websocket_urlpatterns
from trajplatform.audit import AuditEvent

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

# Upper bounds on waiting for a batch (a broken test fails instead of hanging).
BATCH_WAIT_S = 240
PROMPT = "[script:clusters] Run a few shell commands, then finish."


def script(steps: int) -> dict[str, Any]:
    """The offline model's answers: `steps` run_shell calls, then finish."""
    answers = [{"tool_calls": [{"name": "run_shell", "arguments": {"command": f"echo step {i}"}}]}
               for i in range(steps)]
    answers.append({"tool_calls": [{"name": "finish", "arguments": {"answer": "done"}}]})
    return {"id": "clusters", "prompt": PROMPT, "reference_solution": answers}


def make_batch(name: str, rollouts: int, steps: int, prompt: str = PROMPT) -> Any:
    """A batch of `rollouts` one-iteration code_exec tasks, started (jobs enqueued on commit)."""
    from apps.tasks.services import batch_import, tasks_enqueue

    rows = [{"scene": "code_exec", "prompt": prompt, "max_steps": steps + 5, "step_timeout_s": 30.0,
             "timeout_s": 300.0, "temperature": 0.0, "max_iterations": 1, "external_id": f"{name}-{i}"}
            for i in range(rollouts)]
    batch = batch_import(rows=rows, name=name, source_name="test", source_sha256="", source_format="test", actor=None)
    tasks_enqueue(batch=batch)
    return batch


def host_of(worker: str) -> str:
    return worker.split(":", 1)[0]


def batch_state(batch: Any) -> dict[str, Any]:
    rows = Trajectory.objects.filter(task__batch=batch)
    return {
        "statuses": Counter(rows.values_list("status", flat=True)),
        "running_hosts": Counter(host_of(w) for w in rows.filter(status="running").values_list("worker", flat=True)),
    }


def batch_report(batch: Any) -> dict[str, Any]:
    """What the assertions need: outcomes, duplicates, who ran what, the reaper's audit rows."""
    rows = Trajectory.objects.filter(task__batch=batch)
    task_ids = [str(pk) for pk in batch.tasks.values_list("pk", flat=True)]
    return {
        "outcomes": Counter(o or s for o, s in rows.values_list("outcome", "status")),
        "reasons": Counter(r[:300] for r in rows.exclude(outcome="success").values_list("outcome_reason", flat=True)),
        "tasks_with_several_trajectories": batch.tasks.annotate(n=Count("trajectories")).filter(n__gt=1).count(),
        "iterations_ended_twice": AuditEvent.objects.filter(action="tasks.iteration_finish", target_id__in=task_ids)
        .values("target_id").annotate(n=Count("id")).filter(n__gt=1).count(),
        "finished_by": Counter(host_of(w) for w in rows.values_list("worker", flat=True)),
        "claims": dict(rows.values_list("pk", "attempts")),
        "losses": dict(rows.values_list("pk", "worker_losses")),
        "reaped": list(AuditEvent.objects.filter(action="tasks.rollout_requeue").values_list("target_id", "data")),
        "lines": {pk: sorted(TrajectoryLog.objects.filter(trajectory_id=pk).values_list("seq", flat=True))
                  for pk in rows.values_list("pk", flat=True)},
    }


async def wait_for(predicate: Any, what: str, clusters: list[Any], timeout: float = BATCH_WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for cluster in clusters:
            cluster.check()
        value = await database_sync_to_async(predicate)()
        if value:
            return value
        await asyncio.sleep(0.25)
    tails = "\n".join(f"--- {c.host}\n{c.tail()}" for c in clusters)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def all_final(batch: Any) -> bool:
    return not Trajectory.objects.filter(task__batch=batch).exclude(status__in=Trajectory.FINAL).exists()


async def test_two_clusters_claim_each_trajectory_once_and_stream_to_one_subscriber(
        redis_client, cluster_env, clusters, viewer, monkeypatch):
    assert connection.vendor == "postgresql", "the production path runs on PostgreSQL (make test-redis)"
    monkeypatch.setattr(TrajectoryLogConsumer, "tail_poll_seconds", None)  # Redis is the only path
    rollouts, steps = 24, 3
    with running_offline_model(scripts=[script(steps)], faults="slow;seconds=0.3") as model:
        env = cluster_env(OFFLINE_MODEL_URL=model.url)
        batch = await database_sync_to_async(make_batch)("two-clusters", rollouts, steps)
        pks = await database_sync_to_async(
            lambda: list(Trajectory.objects.filter(task__batch=batch).values_list("pk", flat=True)))()
        # One subscriber: this process holds a socket per trajectory before any cluster runs.
        sockets = {}
        for pk in pks:
            communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/trajectories/{pk}/")
            communicator.scope["user"] = viewer
            connected, _ = await communicator.connect(timeout=10)
            assert connected
            sockets[pk] = communicator
        received: dict[int, set[int]] = {pk: set() for pk in pks}

        async def drain() -> None:
            for pk, communicator in sockets.items():
                while not await communicator.receive_nothing(timeout=0.01, interval=0.005):
                    message = await communicator.receive_json_from(timeout=1)
                    received[pk].update(line["seq"] for line in message.get("lines", []))

        a = clusters("machine-a", env)
        b = clusters("machine-b", env)
        for cluster in (a, b):
            await asyncio.to_thread(cluster.wait_running)
        # More jobs than either cluster's workers, delivered twice over: whichever pusher takes
        # them, both clusters get work, and a job finding nothing to claim returns at once.
        from apps.tasks.services import dispatch_rollouts
        await database_sync_to_async(dispatch_rollouts)(jobs=8)

        deadline = time.monotonic() + BATCH_WAIT_S
        while not await database_sync_to_async(all_final)(batch):
            assert time.monotonic() < deadline, f"batch not done: {await database_sync_to_async(batch_state)(batch)}"
            for cluster in (a, b):
                cluster.check()
            await drain()
            await asyncio.sleep(0.2)
        report = await database_sync_to_async(batch_report)(batch)
        # The last lines are broadcast after the finishing transaction commits.
        settle = time.monotonic() + 10
        while any(received[pk] != set(report["lines"][pk]) for pk in pks) and time.monotonic() < settle:
            await drain()
            await asyncio.sleep(0.1)
        for communicator in sockets.values():
            await communicator.disconnect()

    assert report["outcomes"] == {"success": rollouts}, report["reasons"]
    assert report["tasks_with_several_trajectories"] == 0 and report["iterations_ended_twice"] == 0
    assert set(report["claims"].values()) == {1}  # each trajectory claimed once, by one cluster
    assert set(report["finished_by"]) == {"machine-a", "machine-b"} and min(report["finished_by"].values()) > 0
    for pk in pks:
        assert report["lines"][pk] == list(range(1, len(report["lines"][pk]) + 1))
        assert received[pk] == set(report["lines"][pk]), f"trajectory {pk}: lines missed on the websocket"


@pytest.mark.parametrize("dies,survives", [("machine-a", "machine-b"), ("machine-b", "machine-a")])
async def test_the_reaper_on_one_machine_recovers_the_other_machines_dead_work(
        redis_client, cluster_env, clusters, dies, survives):
    """kill -9 a whole cluster mid-batch: its claims stay running on another host name, so the
    surviving cluster cannot see its processes are gone; their heartbeats stop, and the reaper
    run by the surviving cluster re-queues them (not counted as attempts) and runs them."""
    assert connection.vendor == "postgresql"
    rollouts, steps = 12, 6
    with running_offline_model(scripts=[script(steps)], faults="slow;seconds=0.6") as model:
        env = cluster_env(OFFLINE_MODEL_URL=model.url, ROLLOUT_STALE_S="4", ROLLOUT_HEARTBEAT_S="0.5")
        victim, survivor = clusters(dies, env), clusters(survives, env)
        for cluster in (victim, survivor):
            await asyncio.to_thread(cluster.wait_running)
        batch = await database_sync_to_async(make_batch)(f"reap-{dies}", rollouts, steps)
        from apps.tasks.services import dispatch_rollouts
        await database_sync_to_async(dispatch_rollouts)(jobs=4)
        state = await wait_for(lambda: batch_state(batch)["running_hosts"].get(dies, 0) >= 2 and batch_state(batch),
                               f"{dies} to hold running claims", [victim, survivor])
        victim.kill()
        held = await database_sync_to_async(
            lambda: set(Trajectory.objects.filter(task__batch=batch, status="running", worker__startswith=f"{dies}:")
                        .values_list("pk", flat=True)))()
        assert held, state
        # django-q2's Redis broker hands a job to one cluster only once (BLPOP, no ack): the
        # jobs the dead cluster had taken are gone with it. The reaper (scheduled every minute
        # on every cluster; queued here so the test need not wait for the schedule) runs on
        # the survivor, finds the dead machine's claims without a heartbeat for ROLLOUT_STALE_S,
        # re-queues them and dispatches a job.
        from trajplatform.schedules import enqueue
        await asyncio.sleep(4.5)
        await database_sync_to_async(enqueue)("apps.tasks.jobs.reap_stale_rollouts")
        await wait_for(lambda: all_final(batch), "the batch to finish on the survivor", [survivor])
        report = await database_sync_to_async(batch_report)(batch)

    assert report["outcomes"] == {"success": rollouts}, report["reasons"]
    assert report["tasks_with_several_trajectories"] == 0 and report["iterations_ended_twice"] == 0
    reaped = {int(pk) for pk, data in report["reaped"] if host_of(data["worker"]) == dies}
    assert held <= reaped, (held, report["reaped"])
    for pk in held:
        # Finished by the survivor; the dead machine's claim is a worker loss, not an attempt used.
        assert report["losses"][pk] == 1 and report["claims"][pk] == 2
    finished_by = Counter(host_of(w) for pk, w in
                          await database_sync_to_async(lambda: list(Trajectory.objects.filter(pk__in=held)
                                                                    .values_list("pk", "worker")))())
    assert finished_by == {survives: len(held)}
