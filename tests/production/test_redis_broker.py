"""django-q2 on Redis: what the broker guarantees, and why the platform does not need more.

django-q2's Redis broker takes a job off the list with BLPOP and has no acknowledgement: a job
is delivered once and is gone from Redis as soon as a cluster's pusher has taken it, even if
that cluster is killed before a worker ran it (the ORM broker, by contrast, hands a job out
again after Q_TIMEOUT + 300 s). The platform's state is in the database, not in the broker:
a killed cluster's running trajectories are re-queued by the next worker process that starts
(or by the reaper), which dispatches a new job, and a job delivered twice (the reaper, a
worker start and a submission each dispatch one) claims each trajectory once.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django_q.brokers import get_broker

from apps.engines.offline_model import running_offline_model
from apps.tasks.models import Trajectory
from apps.tasks.services import dispatch_rollouts
from tests.production.test_clusters import all_final, batch_report, host_of, make_batch, script

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_S = 240


def wait_until(predicate: Any, what: str, cluster: Any, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.check()
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.tail()}")


def test_the_broker_is_redis_and_the_channel_layer_and_caches_too(settings):
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    assert type(get_broker()).__name__ == "Redis" and "orm" not in settings.Q_CLUSTER
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert isinstance(caches["llm"], RedisCache) and isinstance(caches["api"], RedisCache)


def test_a_job_taken_by_a_killed_cluster_is_not_redelivered_and_the_claims_make_up_for_it(
        redis_client, cluster_env, clusters):
    assert connection.vendor == "postgresql"
    broker = get_broker()
    rollouts, steps = 6, 4
    with running_offline_model(scripts=[script(steps)], faults="slow;seconds=0.5") as model:
        # One worker process, two rollouts per job: the first job runs, the others wait in the
        # cluster's own task queue, already taken off Redis.
        env = cluster_env(OFFLINE_MODEL_URL=model.url, Q_WORKERS="1", ROLLOUT_CONCURRENCY="2")
        first = clusters("machine-a", env)
        first.wait_running()
        batch = make_batch("redis-at-most-once", rollouts, steps)
        dispatch_rollouts(jobs=3)
        wait_until(lambda: Trajectory.objects.filter(task__batch=batch, status="running").count() == 2,
                   "the first job's two claims", first)
        wait_until(lambda: broker.queue_size() == 0, "the pusher to take every job", first)
        first.kill()
        held = set(Trajectory.objects.filter(task__batch=batch, status="running").values_list("pk", flat=True))
        assert len(held) == 2
        # Nothing comes back: the jobs the dead cluster had taken are gone, not redelivered.
        time.sleep(2)
        assert broker.queue_size() == 0
        assert not Trajectory.objects.filter(task__batch=batch, status="finished").exists()

        # A cluster starting on the same machine re-queues the dead processes' claims at once
        # (their pids are gone) and dispatches a job: the batch finishes, each task once.
        second = clusters("machine-a", env)
        wait_until(lambda: all_final(batch), "the batch to finish after the restart", second)
        report = batch_report(batch)

    assert report["outcomes"] == {"success": rollouts}, report["reasons"]
    assert report["tasks_with_several_trajectories"] == 0 and report["iterations_ended_twice"] == 0
    assert {report["losses"][pk] for pk in held} == {1}
    assert Counter(report["losses"].values()) == {1: 2, 0: rollouts - 2}
    assert {host_of(d["worker"]) for _, d in report["reaped"]} == {"machine-a"}


def test_a_job_delivered_many_times_runs_each_trajectory_once(redis_client, cluster_env, clusters):
    assert connection.vendor == "postgresql"
    rollouts, steps = 8, 2
    with running_offline_model(scripts=[script(steps)], faults="slow;seconds=0.2") as model:
        cluster = clusters("machine-a", cluster_env(OFFLINE_MODEL_URL=model.url, Q_WORKERS="3"))
        cluster.wait_running()
        batch = make_batch("redis-duplicates", rollouts, steps)
        dispatch_rollouts(jobs=12)  # as if the broker delivered the submission's job a dozen times
        wait_until(lambda: all_final(batch), "the batch to finish", cluster)
        report = batch_report(batch)
    assert report["outcomes"] == {"success": rollouts}, report["reasons"]
    assert set(report["claims"].values()) == {1} and report["tasks_with_several_trajectories"] == 0
