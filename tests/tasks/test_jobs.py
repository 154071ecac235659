"""Rollout services and jobs: iterations, compare-and-swap claims, heartbeats, the reaper, cancel,
errors, redaction. The agent loop is a fake injected through `apps.tasks.jobs.run_episode`; the
end-to-end run with the real loop is in test_synthesize.py."""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from apps.reviews.jobs import REVIEW_JOB
from apps.tasks import jobs
from apps.tasks.models import Task, Trajectory, TrajectoryLog
from apps.tasks.services import (
    ROLLOUT_JOB,
    TransitionError,
    task_cancel,
    task_start_iteration,
    tasks_enqueue,
    trajectories_finish,
    trajectory_finish,
)
from trajplatform.audit import AuditEvent, audit_events_for

REPO = Path(__file__).resolve().parent.parent.parent


@dataclass
class FakeResult:
    """The shape of apps.engines.agent.EpisodeResult."""

    messages: list[dict] = field(default_factory=lambda: [
        {"role": "user", "content": "task"}, {"role": "assistant", "content": "done"}])
    tools: list[dict] = field(default_factory=lambda: [{"type": "function", "function": {"name": "finish"}}])
    steps: list[dict] = field(default_factory=lambda: [{"step": 1, "duration_ms": 3}])
    final_answer: str = "done"
    outcome: str = "success"
    outcome_reason: str = "verifier passed"
    reward: float | None = 1.0
    verifier_output: dict = field(default_factory=lambda: {"exit_code": 0})
    prompt_tokens: int = 10
    completion_tokens: int = 5
    total_tokens: int = 15
    cost_usd: Decimal = Decimal("0.000123")
    model: str = "fake-model"
    provider: str = "fake"
    cancelled: bool = False
    retryable: bool = False


class FakeAgent:
    """Stands in for run_episode: records calls, emits one step of events, runs `body` if given."""

    def __init__(self, body: Callable[..., Any] | None = None):
        self.calls: list[dict[str, Any]] = []
        self.body = body
        self.lock = threading.Lock()

    async def __call__(self, *, config, llm, sandbox_backend=None, cache_key_extra=None, on_event=None,
                       should_cancel=None, trajectory=None, on_sandbox_destroyed=None):
        with self.lock:
            self.calls.append({"config": config, "cache_key_extra": cache_key_extra, "trajectory": trajectory.pk})
        await on_event("thought", "I will finish", {"step": 1})
        await on_event("action", "finish()", {"step": 1})
        await on_event("result", "success", {})
        if self.body is not None:
            return await self.body(config=config, on_event=on_event, should_cancel=should_cancel,
                                   trajectory=trajectory)
        return FakeResult()


@pytest.fixture
def fake_agent(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeAgent]:
    def install(body: Callable[..., Any] | None = None) -> FakeAgent:
        agent = FakeAgent(body)
        monkeypatch.setattr(jobs, "run_episode", agent)
        return agent

    return install


def started(make_task: Callable[..., Task], **fields: Any) -> Task:
    task = make_task(**fields)
    task_start_iteration(task=task)
    task.refresh_from_db()
    return task


def log_lines(trajectory: Trajectory) -> list[tuple[str, str]]:
    return list(TrajectoryLog.objects.filter(trajectory=trajectory).order_by("seq").values_list("kind", "message"))


# -- starting iterations ----------------------------------------------------------------------


@pytest.mark.django_db
def test_start_iteration_queues_samples_with_frozen_config_and_enqueues_a_job_on_commit(
        make_task, django_capture_on_commit_callbacks):
    task = make_task(samples_per_iteration=3, temperature=0.3, priority=8)
    with django_capture_on_commit_callbacks(execute=True):
        trajectories = task_start_iteration(task=task)
        assert not OrmQ.objects.exists()  # the job is enqueued on commit
    task.refresh_from_db()
    assert task.status == Task.Status.RUNNING and task.current_iteration == 1 and task.started_at is not None
    assert [(t.iteration, t.sample_index, t.status) for t in Trajectory.objects.filter(task=task).order_by("sample_index")] == [
        (1, 0, "queued"), (1, 1, "queued"), (1, 2, "queued")]
    assert all(t.config_snapshot == task.config_snapshot() and t.queued_at for t in trajectories)
    assert [row.task["func"] for row in OrmQ.objects.all()] == [ROLLOUT_JOB]
    event = audit_events_for(task).get()
    assert event.action == "tasks.iteration_start"
    assert event.data == {"from": "queued", "iteration": 1, "samples": 3}
    # Changing the task afterwards does not change what the queued trajectories run with.
    Task.objects.filter(pk=task.pk).update(temperature=1.5)
    assert Trajectory.objects.filter(task=task).first().config_snapshot["temperature"] == 0.3


@pytest.mark.django_db
def test_start_iteration_twice_is_a_no_op_and_cancelled_tasks_refuse(make_task, django_capture_on_commit_callbacks):
    task = started(make_task)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert task_start_iteration(task=task) == []
    assert callbacks == [] and Trajectory.objects.filter(task=task).count() == 1
    assert audit_events_for(task).filter(action="tasks.iteration_start").count() == 1
    other = make_task()
    Task.objects.filter(pk=other.pk).update(cancel_requested=True)
    with pytest.raises(TransitionError):
        task_start_iteration(task=other)


@pytest.mark.django_db
def test_tasks_enqueue_starts_the_queued_tasks_of_a_batch_once(make_task, django_capture_on_commit_callbacks):
    first = make_task(samples_per_iteration=2)
    batch = first.batch
    second = make_task(batch=batch)
    done = make_task(batch=batch)
    Task.objects.filter(pk=done.pk).update(status=Task.Status.COMPLETED)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks_enqueue(batch=batch) == 2
    assert tasks_enqueue(batch=batch) == 0
    assert Trajectory.objects.filter(task__batch=batch).count() == 3
    assert set(Task.objects.filter(batch=batch).values_list("status", flat=True)) == {"running", "completed"}
    event = AuditEvent.objects.get(action="tasks.tasks_enqueue")
    assert event.data == {"tasks": 2, "trajectories": 3}
    assert event.target_id == str(batch.pk)
    assert OrmQ.objects.count() >= 1
    del second


def test_tasks_enqueue_accepts_a_queryset_that_joins_the_batch(make_task):
    # The admin's changelist queryset joins the nullable batch; PostgreSQL refuses FOR UPDATE on it
    # unless the lock names the task table alone.
    task = make_task()
    assert tasks_enqueue(tasks=Task.objects.filter(pk=task.pk).select_related("batch")) == 1
    assert Task.objects.get(pk=task.pk).status == "running"


@pytest.mark.django_db(transaction=True)
@override_settings(LLM_API_KEY="sk-live-bulk-log-secret-0123456789")
def test_log_lines_of_many_trajectories_are_appended_together_each_with_its_own_sequence(make_task):
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from apps.tasks.services import trajectory_group_name, trajectory_log_append, trajectory_logs_append

    task = started(make_task, samples_per_iteration=2)
    a, b = task.trajectories.order_by("sample_index")
    trajectory_log_append(trajectory_id=a.pk, lines=[("system", "first", {})])
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(trajectory_group_name(b.pk), channel)
    created = trajectory_logs_append(batches={
        a.pk: [("thought", "a2", {}), ("output", "key sk-live-bulk-log-secret-0123456789", {})],
        b.pk: [("action", "b1", {"token": "sk-live-bulk-log-secret-0123456789"})],
        999999: [("system", "gone", {})],  # a deleted trajectory is skipped
    })
    assert sorted(created) == [a.pk, b.pk]
    assert [(k, m) for k, m in log_lines(a)] == [("system", "first"), ("thought", "a2"), ("output", "key [REDACTED]")]
    assert list(TrajectoryLog.objects.filter(trajectory=b).values_list("seq", "kind", "data")) == [
        (1, "action", {"token": "[REDACTED]"})]
    message = async_to_sync(layer.receive)(channel)
    assert (message["trajectory"], [line["seq"] for line in message["lines"]]) == (b.pk, [1])


# -- claims and double delivery ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_trajectory_delivered_twice_runs_once(make_task, fake_agent):
    agent = fake_agent()
    task = started(make_task)
    trajectory = task.trajectories.get()
    first = jobs.run_rollout(trajectory.pk)
    second = jobs.run_rollout(trajectory.pk)
    assert first["claimed"] == 1 and first["success"] == 1
    assert second["claimed"] == 0
    assert len(agent.calls) == 1
    trajectory.refresh_from_db()
    assert trajectory.status == "finished" and trajectory.outcome == "success" and trajectory.attempts == 1
    kinds = [kind for kind, _ in log_lines(trajectory)]
    assert kinds == ["system", "thought", "action", "result"]  # one set of lines


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_for_the_same_trajectory_run_it_once(make_task, fake_agent):
    async def slow(**kwargs):
        await asyncio.sleep(0.05)
        return FakeResult()

    agent = fake_agent(slow)
    task = started(make_task)
    trajectory = task.trajectories.get()
    reports: list[dict] = []
    threads = [threading.Thread(target=lambda: reports.append(jobs.run_rollout(trajectory.pk))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r["claimed"] for r in reports) == [0, 1]
    assert len(agent.calls) == 1
    assert [k for k, _ in log_lines(trajectory)].count("system") == 1


@pytest.mark.django_db(transaction=True)
def test_claims_follow_task_priority_then_age(make_task, fake_agent):
    agent = fake_agent()
    low = started(make_task, prompt="low", priority=2)
    high = started(make_task, prompt="high", priority=9)
    mid_old = started(make_task, prompt="mid old", priority=5)
    mid_new = started(make_task, prompt="mid new", priority=5)
    report = jobs.run_rollouts(concurrency=1)
    assert report["claimed"] == 4
    assert [c["config"]["prompt"] for c in agent.calls] == ["high", "mid old", "mid new", "low"]
    del low, high, mid_old, mid_new


@pytest.mark.django_db(transaction=True)
def test_limit_caps_how_many_one_job_claims(make_task, fake_agent):
    fake_agent()
    task = started(make_task, samples_per_iteration=3)
    assert jobs.run_rollouts(limit=2)["claimed"] == 2
    assert task.trajectories.filter(status="queued").count() == 1


def test_heartbeats_and_claim_checks_hold_only_the_claims_still_ours(make_task):
    task = started(make_task, samples_per_iteration=3)
    claims = jobs.claim_trajectories(3, worker="here")
    assert len(claims) == 3
    kept, requeued, stolen = claims
    # The reaper re-queued one; another worker holds the third now, with a token of its own.
    Trajectory.objects.filter(pk=requeued.trajectory.pk).update(status="queued", claim_token="")
    Trajectory.objects.filter(pk=stolen.trajectory.pk).update(claim_token="f" * 32, worker="there")
    assert jobs.heartbeat(claims) == {kept.trajectory.pk}
    assert jobs.claim_states(claims) == {kept.trajectory.pk: "held", requeued.trajectory.pk: "lost",
                                         stolen.trajectory.pk: "lost"}
    task.cancel_requested = True
    task.save(update_fields=["cancel_requested"])
    assert jobs.claim_states(claims)[kept.trajectory.pk] == "cancel"


@pytest.mark.django_db(transaction=True)
def test_one_job_runs_up_to_concurrency_episodes_at_once(make_task, fake_agent):
    state = {"in_flight": 0, "peak": 0}

    async def overlapping(**kwargs):
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        # Wait (bounded) until four episodes are in flight together: proves they overlap.
        for _ in range(500):
            if state["peak"] >= 4:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        state["in_flight"] -= 1
        return FakeResult()

    agent = fake_agent(overlapping)
    started(make_task, samples_per_iteration=6)
    report = jobs.run_rollouts(concurrency=4)
    assert report["claimed"] == 6 and report["success"] == 6
    assert state["peak"] == 4  # never more than the concurrency, and really concurrent
    assert len(agent.calls) == 6
    # Each sample its own cache identity: the trajectory's UUID.
    uuids = {str(u) for u in Trajectory.objects.values_list("uuid", flat=True)}
    assert {c["cache_key_extra"]["trajectory"] for c in agent.calls} == uuids and len(uuids) == 6


@pytest.mark.django_db(transaction=True)
def test_a_trajectory_that_reuses_a_pk_of_a_flushed_database_gets_its_own_cache_identity(make_task, fake_agent):
    """The LLM cache is machine-wide: a fresh database numbering its rows from 1 again must not
    be served the answers recorded for the old database's trajectory with the same pk."""
    agent = fake_agent()
    task = started(make_task, prompt="the same prompt")
    old = task.trajectories.get()
    jobs.run_rollouts()
    # What a flushed database holds next: the same task, a trajectory with the same pk.
    Trajectory.objects.filter(pk=old.pk).delete()
    Trajectory.objects.create(pk=old.pk, task=task, iteration=1, sample_index=0, queued_at=timezone.now(),
                              config_snapshot=task.config_snapshot())
    Task.objects.filter(pk=task.pk).update(status=Task.Status.RUNNING)
    jobs.run_rollouts()
    assert [c["trajectory"] for c in agent.calls] == [old.pk, old.pk]
    first, second = (c["cache_key_extra"] for c in agent.calls)
    assert first == {"trajectory": str(old.uuid)} and second != first
    assert second == {"trajectory": str(Trajectory.objects.get(pk=old.pk).uuid)}


@pytest.mark.django_db(transaction=True)
def test_a_retried_trajectory_keeps_its_cache_identity(make_task, fake_agent, settings):
    settings.ROLLOUT_MAX_ATTEMPTS = 2
    calls = []

    async def flaky(trajectory, **kwargs):
        calls.append(trajectory.pk)
        return FakeResult(outcome="error", outcome_reason="sandbox lost", retryable=True) if len(calls) == 1 else FakeResult()

    agent = fake_agent(flaky)
    trajectory = started(make_task).trajectories.get()
    jobs.run_rollouts()
    _make_due(trajectory)
    jobs.run_rollouts()
    assert [c["cache_key_extra"] for c in agent.calls] == [{"trajectory": str(trajectory.uuid)}] * 2


@pytest.mark.django_db(transaction=True)
def test_heartbeat_advances_while_the_episode_runs(make_task, fake_agent, settings):
    settings.ROLLOUT_HEARTBEAT_S = 0.02

    def heartbeat_of(pk: int):
        from django.db import connection as conn

        try:
            return Trajectory.objects.values_list("heartbeat_at", flat=True).get(pk=pk)
        finally:
            conn.close()

    async def watch(trajectory, **kwargs):
        first = await asyncio.to_thread(heartbeat_of, trajectory.pk)
        for _ in range(500):
            await asyncio.sleep(0.01)
            if await asyncio.to_thread(heartbeat_of, trajectory.pk) > first:
                return FakeResult()
        return FakeResult(outcome="failure", outcome_reason="heartbeat never advanced", reward=0.0)

    fake_agent(watch)
    task = started(make_task)
    jobs.run_rollouts()
    trajectory = task.trajectories.get()
    assert (trajectory.outcome, trajectory.outcome_reason) == ("success", "verifier passed")


# -- outcomes move the task on -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_finished_iteration_goes_to_review_with_its_outcomes_and_a_review_job(make_task, fake_agent):
    async def by_sample(trajectory, **kwargs):
        if trajectory.task.prompt == "mixed" and trajectory.sample_index == 1:
            return FakeResult(outcome="failure", outcome_reason="2 tests failed", reward=0.0)
        return FakeResult()

    fake_agent(by_sample)
    good = started(make_task, prompt="good", samples_per_iteration=2)
    mixed = started(make_task, prompt="mixed", samples_per_iteration=2)
    jobs.run_rollouts()
    good.refresh_from_db()
    mixed.refresh_from_db()
    # The review agent decides what happens next (tests/reviews); here: the hand-over.
    assert good.status == mixed.status == Task.Status.REVIEWING and good.finished_at is None
    event = audit_events_for(mixed).get(action="tasks.iteration_finish")
    assert event.data == {"iteration": 1, "outcomes": {"failure": 1, "success": 1}, "status": "reviewing"}
    review_jobs = sorted(row.task["args"] for row in OrmQ.objects.all() if row.task["func"] == REVIEW_JOB)
    assert review_jobs == sorted([(good.pk, 1), (mixed.pk, 1)])
    stored = good.trajectories.first()
    assert stored.messages == FakeResult().messages and stored.final_answer == "done" and stored.reward == 1.0
    assert (stored.prompt_tokens, stored.completion_tokens, stored.total_tokens) == (10, 5, 15)
    assert stored.cost_usd == Decimal("0.000123") and stored.model == "fake-model"
    assert stored.verifier_output == {"exit_code": 0} and stored.steps == [{"step": 1, "duration_ms": 3}]
    assert stored.content_sha256 == stored.compute_content_sha256()


@pytest.mark.django_db(transaction=True)
def test_an_exception_from_the_episode_finishes_it_as_an_error(make_task, fake_agent):
    async def boom(**kwargs):
        raise RuntimeError("sandbox vanished")

    fake_agent(boom)
    task = started(make_task)
    report = jobs.run_rollouts()
    assert report["error"] == 1
    trajectory = task.trajectories.get()
    assert trajectory.status == "finished" and trajectory.outcome == "error"
    assert trajectory.outcome_reason == trajectory.error == "RuntimeError: sandbox vanished"
    assert ("error", "worker: RuntimeError: sandbox vanished") in log_lines(trajectory)
    task.refresh_from_db()
    assert task.status == Task.Status.REVIEWING


@pytest.mark.django_db(transaction=True)
def test_a_retryable_error_is_queued_again_with_backoff_and_then_succeeds(make_task, fake_agent, monkeypatch):
    monkeypatch.setattr(jobs, "RETRY_BASE_S", 0)
    attempts = []

    async def flaky(trajectory, **kwargs):
        attempts.append(trajectory.attempts)
        if trajectory.attempts == 1:
            return FakeResult(outcome="error", outcome_reason="offline/m: HTTP 503: overloaded", retryable=True)
        return FakeResult()

    fake_agent(flaky)
    task = started(make_task)
    report = jobs.run_rollouts()
    assert (report["claimed"], report["retried"], report["success"]) == (2, 1, 1)
    assert attempts == [1, 2]
    trajectory = task.trajectories.get()
    assert (trajectory.status, trajectory.outcome, trajectory.attempts) == ("finished", "success", 2)
    assert any("retryable error (offline/m: HTTP 503: overloaded)" in m for _, m in log_lines(trajectory))
    assert AuditEvent.objects.filter(action="tasks.rollout_retry", target_id=str(trajectory.pk)).count() == 1


async def sandbox_lost(**kwargs: Any) -> FakeResult:
    return FakeResult(outcome="error", outcome_reason="sandbox lost", retryable=True)


@pytest.mark.django_db(transaction=True)
def test_a_retry_waits_out_its_backoff_and_the_last_attempt_stores_the_error(make_task, fake_agent, settings):
    settings.ROLLOUT_MAX_ATTEMPTS = 2
    fake_agent(sandbox_lost)
    task = started(make_task)
    assert jobs.run_rollouts()["retried"] == 1
    trajectory = task.trajectories.get()
    assert trajectory.status == "queued" and trajectory.queued_at > timezone.now()  # backing off
    assert Schedule.objects.filter(func=ROLLOUT_JOB, schedule_type=Schedule.ONCE).exists()
    assert jobs.run_rollouts()["claimed"] == 0
    Trajectory.objects.filter(pk=trajectory.pk).update(queued_at=timezone.now())
    assert jobs.run_rollouts()["error"] == 1
    trajectory.refresh_from_db()
    assert (trajectory.status, trajectory.outcome, trajectory.outcome_reason) == ("finished", "error", "sandbox lost")


@pytest.mark.django_db(transaction=True)
def test_a_hung_episode_is_stopped_after_its_time_limit(make_task, fake_agent, monkeypatch):
    monkeypatch.setattr(jobs, "EPISODE_GRACE_S", 0.05)

    async def hang(**kwargs):
        await asyncio.sleep(3600)

    fake_agent(hang)
    task = started(make_task, timeout_s=0.05)
    jobs.run_rollouts()
    trajectory = task.trajectories.get()
    assert trajectory.outcome == "error"
    assert "did not end within" in trajectory.outcome_reason


@pytest.mark.django_db(transaction=True)
def test_an_unstorable_result_is_recorded_as_an_error_not_left_running(make_task, fake_agent):
    async def odd(**kwargs):
        return FakeResult(messages=[{"role": "assistant", "content": object()}])

    fake_agent(odd)
    task = started(make_task)
    jobs.run_rollouts()
    trajectory = task.trajectories.get()
    assert trajectory.status == "finished" and trajectory.outcome == "error"
    assert trajectory.outcome_reason.startswith("the episode's result could not be stored: TypeError")


@pytest.mark.django_db(transaction=True)
def test_episodes_ending_together_are_stored_in_one_hand_over_and_a_bad_one_fails_alone(
    make_task, fake_agent, monkeypatch
):
    handovers: list[int] = []
    finish_together = jobs.finish_together

    def counted(items, sandboxes=None):
        handovers.append(len(items))
        return finish_together(items, sandboxes)

    monkeypatch.setattr(jobs, "finish_together", counted)
    gate: dict[str, Any] = {"started": 0}

    async def together(*, trajectory, **kwargs):
        gate.setdefault("open", asyncio.Event())
        gate["started"] += 1
        if gate["started"] == 6:
            gate["open"].set()
        await asyncio.wait_for(gate["open"].wait(), 30)
        if trajectory.sample_index == 2:
            return FakeResult(messages=[{"role": "assistant", "content": object()}])  # cannot be stored
        return FakeResult()

    fake_agent(together)
    task = started(make_task, samples_per_iteration=6)
    report = jobs.run_rollouts(concurrency=6)

    # The six in one hand-over; then the bad one's error, stored in its place, in another.
    assert handovers == [6, 1], handovers
    assert report["success"] == 5
    by_sample = {t.sample_index: t for t in task.trajectories.all()}
    assert by_sample[2].outcome == "error"
    assert by_sample[2].outcome_reason.startswith("the episode's result could not be stored")
    for sample, trajectory in by_sample.items():
        assert trajectory.status == "finished"
        lines = log_lines(trajectory)
        # Each one's own last lines, in order, before (or with) its final state.
        assert ("result", "success") in lines and lines.count(("result", "success")) == 1
        assert lines.index(("action", "finish()")) < lines.index(("result", "success"))


@pytest.mark.django_db(transaction=True)
def test_a_job_marks_its_episodes_destroyed_sandboxes_and_leaves_the_collector_as_it_was(make_task, monkeypatch):
    from types import SimpleNamespace

    from apps.engines.models import SandboxRecord

    records = {}

    async def destroying(*, trajectory, on_sandbox_destroyed, **kwargs):
        sandbox = SimpleNamespace(backend_name="local", id=f"sb-{trajectory.sample_index}")
        on_sandbox_destroyed(sandbox)  # as run_episode does once its sandbox is gone
        return FakeResult()

    task = started(make_task, samples_per_iteration=3)
    for trajectory in task.trajectories.all():
        records[trajectory.sample_index] = SandboxRecord.objects.create(
            backend="local", external_id=f"sb-{trajectory.sample_index}", state="ready", trajectory=trajectory)
    monkeypatch.setattr(jobs, "run_episode", destroying)
    before = gc.get_threshold()
    report = jobs.run_rollouts(concurrency=3)
    assert report["success"] == 3
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0  # the job left the collector as it was
    for record in records.values():
        record.refresh_from_db()
        assert (record.state, record.destroy_reason) == ("destroyed", "destroyed")
        assert record.destroyed_at is not None


@pytest.mark.django_db(transaction=True)
def test_batch_progress_is_sent_once_per_batch_per_commit_and_not_for_a_rolled_back_change(monkeypatch):
    from django.db import transaction

    from apps.tasks import services

    sent: list[list[str]] = []
    monkeypatch.setattr(services, "send_to_groups", lambda groups, message: sent.append(sorted(groups)))

    with transaction.atomic():
        services.batch_progress_changed([1, None])
        services.batch_progress_changed([1, 2])
        services.batch_progress_changed([2])
        assert sent == []  # not before the commit
    assert sorted(group for call in sent for group in call) == ["batch-1", "batch-2"]

    sent.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        services.batch_progress_changed([3])
        raise RuntimeError("roll back")
    with transaction.atomic():
        services.batch_progress_changed([1])
        try:
            with transaction.atomic():  # a savepoint rolled back: its change is not sent
                services.batch_progress_changed([4])
                raise RuntimeError("roll back the savepoint")
        except RuntimeError:
            pass
    assert sent == [["batch-1"]]

    sent.clear()
    services.batch_progress_changed([5])  # no transaction: at once
    services.batch_progress_changed([5])
    assert sent == [["batch-5"], ["batch-5"]]


# -- cancel ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cancel_requested_mid_episode_cancels_the_trajectory_and_the_task(make_task, fake_agent, monkeypatch):
    monkeypatch.setattr(jobs, "CLAIM_POLL_S", 0.01)

    async def cancellable(should_cancel, trajectory, on_event, **kwargs):
        for step in range(1000):  # steps until the cancel is seen (bounded)
            if await should_cancel():
                await on_event("system", f"cancelled before step {step}", {})
                return FakeResult(cancelled=True, outcome="failure", outcome_reason="cancelled by request",
                                  reward=None, messages=[{"role": "user", "content": "task"}])
            if step == 1:
                await asyncio.to_thread(_cancel, trajectory.task_id)
            await asyncio.sleep(0.01)
        return FakeResult()

    fake_agent(cancellable)
    task = started(make_task, samples_per_iteration=2)
    report = jobs.run_rollouts()
    assert report["cancelled"] == 2
    task.refresh_from_db()
    assert task.status == Task.Status.CANCELLED
    for trajectory in task.trajectories.all():
        assert trajectory.status == "cancelled" and trajectory.outcome == "" and trajectory.reward is None
        assert trajectory.outcome_reason == "cancelled by request"
        assert trajectory.messages == [{"role": "user", "content": "task"}]
        assert any(m.startswith("cancelled before step") for _, m in log_lines(trajectory))


def _cancel(task_id: int) -> None:
    from django.db import connection as conn

    try:
        task_cancel(task=Task.objects.get(pk=task_id), actor=None, reason="test")
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_queued_trajectories_of_a_cancelled_task_never_run(make_task, fake_agent):
    agent = fake_agent()
    task = started(make_task, samples_per_iteration=2)
    task_cancel(task=task, actor=None)
    report = jobs.run_rollouts()
    assert report["claimed"] == 0 and agent.calls == []
    assert set(task.trajectories.values_list("status", flat=True)) == {"cancelled"}


# -- losing a claim; the reaper --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_lost_its_claim_stops_and_stores_nothing(make_task, fake_agent, monkeypatch):
    monkeypatch.setattr(jobs, "CLAIM_POLL_S", 0.01)

    def requeue(pk: int) -> None:
        from django.db import connection as conn

        try:  # what the reaper does to a trajectory it believes abandoned
            Trajectory.objects.filter(pk=pk).update(status="queued", claim_token="", worker="")
        finally:
            conn.close()

    async def long_episode(should_cancel, trajectory, **kwargs):
        await asyncio.to_thread(requeue, trajectory.pk)
        for _ in range(1000):
            if await should_cancel():
                return FakeResult(cancelled=True, final_answer="partial")
            await asyncio.sleep(0.01)
        return FakeResult()

    fake_agent(long_episode)
    task = started(make_task)
    trajectory = task.trajectories.get()
    report = jobs.run_rollout(trajectory.pk)
    assert report["lost"] == 1
    trajectory.refresh_from_db()
    assert trajectory.status == "queued" and trajectory.final_answer == ""
    assert trajectory_finish(trajectory_id=trajectory.pk, claim_token="not-the-token", result=FakeResult()) is None


@pytest.mark.django_db(transaction=True)
def test_episodes_stored_together_skip_a_lost_claim_and_end_each_iteration_once(make_task):
    pair, single, half = (started(make_task, samples_per_iteration=2), started(make_task),
                          started(make_task, samples_per_iteration=2))
    OrmQ.objects.all().delete()
    tokens = {c.pk: c.token for c in jobs.claim_trajectories(10, worker="w")}
    first, second = pair.trajectories.order_by("sample_index")
    [alone] = single.trajectories.all()
    started_half, _ = half.trajectories.order_by("sample_index")

    stored = trajectories_finish([
        {"trajectory_id": first.pk, "claim_token": tokens[first.pk], "result": FakeResult()},
        {"trajectory_id": alone.pk, "claim_token": "not-the-token", "result": FakeResult()},
        {"trajectory_id": second.pk, "claim_token": tokens[second.pk],
         "result": FakeResult(outcome="failure", reward=0.0)},
        {"trajectory_id": started_half.pk, "claim_token": tokens[started_half.pk], "result": None, "error": "boom"},
    ])

    assert [t.pk if t else None for t in stored] == [first.pk, None, second.pk, started_half.pk]
    assert [t.outcome for t in stored if t] == ["success", "failure", "error"]
    assert Trajectory.objects.get(pk=alone.pk).status == "running"  # the lost claim wrote nothing
    statuses = {t.pk: t.status for t in Task.objects.all()}
    assert statuses == {pair.pk: Task.Status.REVIEWING, single.pk: Task.Status.RUNNING,
                        half.pk: Task.Status.RUNNING}
    ends = AuditEvent.objects.filter(action="tasks.iteration_finish")
    assert [(e.target_id, e.data["outcomes"]) for e in ends] == [(str(pair.pk), {"failure": 1, "success": 1})]
    assert [row.task["args"] for row in OrmQ.objects.all() if row.task["func"] == REVIEW_JOB] == [(pair.pk, 1)]


@pytest.mark.django_db(transaction=True)
def test_episodes_stored_together_are_all_or_nothing(make_task):
    task = started(make_task, samples_per_iteration=2)
    tokens = {c.pk: c.token for c in jobs.claim_trajectories(10, worker="w")}
    good, bad = task.trajectories.order_by("sample_index")
    unstorable = FakeResult(reward="not a number")  # refused by the UPDATE, after the good one's
    with pytest.raises((TypeError, ValueError)):
        trajectories_finish([
            {"trajectory_id": good.pk, "claim_token": tokens[good.pk], "result": FakeResult()},
            {"trajectory_id": bad.pk, "claim_token": tokens[bad.pk], "result": unstorable},
        ])
    assert set(task.trajectories.values_list("status", flat=True)) == {"running"}
    task.refresh_from_db()
    assert task.status == Task.Status.RUNNING


def _make_stale(trajectory: Trajectory, seconds: float = 3600) -> None:
    Trajectory.objects.filter(pk=trajectory.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def _make_due(trajectory: Trajectory) -> None:
    Trajectory.objects.filter(pk=trajectory.pk).update(queued_at=timezone.now() - timedelta(seconds=1))


@pytest.mark.django_db(transaction=True)
def test_the_reaper_requeues_a_stale_trajectory_then_gives_up_after_the_worker_loss_cap(make_task, settings):
    settings.ROLLOUT_MAX_ATTEMPTS = 3
    settings.ROLLOUT_MAX_WORKER_LOSSES = 3
    task = started(make_task)
    trajectory = task.trajectories.get()
    for loss in (1, 2):
        [claim] = jobs.claim_trajectories(1, worker="ghost-host:4242")
        assert claim.trajectory.attempts == loss
        _make_stale(trajectory)
        before = timezone.now()
        assert jobs.reap_stale_rollouts()["requeued"] == 1
        trajectory.refresh_from_db()
        assert (trajectory.status, trajectory.worker, trajectory.claim_token) == ("queued", "", "")
        assert (trajectory.attempts, trajectory.worker_losses) == (loss, loss)
        backoff = jobs.WORKER_LOSS_BACKOFF_S * 2 ** (loss - 1)  # 2 s, then 4 s
        assert trajectory.queued_at >= before + timedelta(seconds=backoff)
        assert not jobs.claimable().filter(pk=trajectory.pk).exists()  # waiting out its back-off
        _make_due(trajectory)
    requeues = AuditEvent.objects.filter(action="tasks.rollout_requeue", target_id=str(trajectory.pk))
    assert requeues.count() == 2
    assert requeues.first().data["worker"] == "ghost-host:4242"
    assert any("worker lost: ghost-host:4242 sent no heartbeat since" in m and "worker loss 1 of 3" in m
               and "not counted against the attempts" in m for _, m in log_lines(trajectory))

    [claim] = jobs.claim_trajectories(1, worker="ghost-host:4242")
    _make_stale(trajectory)
    heartbeat = Trajectory.objects.get(pk=trajectory.pk).heartbeat_at
    assert jobs.reap_stale_rollouts()["abandoned"] == 1
    trajectory.refresh_from_db()
    assert trajectory.status == "finished" and trajectory.outcome == "error" and trajectory.worker_losses == 3
    assert trajectory.outcome_reason == (
        f"worker lost: ghost-host:4242 sent no heartbeat since {heartbeat:%Y-%m-%d %H:%M:%S %Z} "
        "(last worker ghost-host:4242); gave up after 3 worker losses (ROLLOUT_MAX_WORKER_LOSSES=3)")
    task.refresh_from_db()
    assert task.status == Task.Status.REVIEWING  # the review agent weighs the error
    assert AuditEvent.objects.filter(action="tasks.rollout_abandon", target_id=str(trajectory.pk)).count() == 1
    # A late result from the lost worker changes nothing.
    assert trajectory_finish(trajectory_id=trajectory.pk, claim_token=claim.token, result=FakeResult()) is None
    assert jobs.reap_stale_rollouts()["abandoned"] == 0  # idempotent


@pytest.mark.django_db
def test_trajectory_reap_of_a_dead_process_requeues_audits_and_schedules_a_job_for_when_it_is_due(
        make_task, django_capture_on_commit_callbacks):
    from apps.tasks.services import trajectory_reap

    task = started(make_task)
    trajectory = task.trajectories.get()
    Schedule.objects.filter(func=ROLLOUT_JOB).delete()
    [claim] = jobs.claim_trajectories(1, worker="here:1:abc")
    assert trajectory_reap(trajectory_id=trajectory.pk, max_worker_losses=3, dead_worker="here:2:other") == ""
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert trajectory_reap(trajectory_id=trajectory.pk, max_worker_losses=3, dead_worker="here:1:abc",
                               backoff_s=(5.0, 20.0)) == "requeued"
    trajectory.refresh_from_db()
    assert (trajectory.status, trajectory.claim_token, trajectory.worker_losses, trajectory.attempts) == (
        "queued", "", 1, 1)
    event = AuditEvent.objects.get(action="tasks.rollout_requeue", target_id=str(trajectory.pk))
    assert (event.data["process_gone"], event.data["worker_losses"], event.data["delay_s"]) == (True, 1, 5.0)
    assert len(callbacks) == 2  # the live-log broadcast and the job
    [job] = Schedule.objects.filter(func=ROLLOUT_JOB)  # a one-off job for when it is due, not now
    assert job.schedule_type == Schedule.ONCE and abs((job.next_run - trajectory.queued_at).total_seconds()) < 2
    assert trajectory_finish(trajectory_id=trajectory.pk, claim_token=claim.token, result=FakeResult()) is None
    with pytest.raises(ValueError):
        trajectory_reap(trajectory_id=trajectory.pk, max_worker_losses=3)


@pytest.mark.django_db(transaction=True)
def test_claims_lost_with_their_worker_do_not_burn_the_episode_attempts(make_task, fake_agent, settings):
    settings.ROLLOUT_MAX_ATTEMPTS = 2
    fake_agent(sandbox_lost)
    task = started(make_task)
    trajectory = task.trajectories.get()
    for _ in range(2):  # two workers died under it
        jobs.claim_trajectories(1, worker="ghost-host:4242")
        _make_stale(trajectory)
        assert jobs.reap_stale_rollouts()["requeued"] == 1
        _make_due(trajectory)
    assert jobs.run_rollouts()["retried"] == 1  # its first episode attempt of 2: retried, not ended
    trajectory.refresh_from_db()
    assert (trajectory.status, trajectory.attempts, trajectory.worker_losses) == ("queued", 3, 2)
    assert any("(attempt 1 of 2; 2 earlier claim(s) lost with their worker)" in m for _, m in log_lines(trajectory))


@pytest.mark.django_db(transaction=True)
def test_a_requeued_trajectory_goes_behind_those_never_tried(make_task, monkeypatch):
    monkeypatch.setattr(jobs, "WORKER_LOSS_BACKOFF_S", 0.0)
    first, second = started(make_task), started(make_task)
    [claim] = jobs.claim_trajectories(1, worker="ghost-host:4242")
    assert claim.trajectory.task_id == first.pk  # oldest first
    _make_stale(claim.trajectory)
    assert jobs.reap_stale_rollouts()["requeued"] == 1
    assert jobs.claimable().filter(pk=claim.pk).exists()  # due at once, but behind the queue
    assert [c.trajectory.task_id for c in jobs.claim_trajectories(2, worker="w")] == [second.pk, first.pk]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.django_db(transaction=True)
def test_a_starting_worker_requeues_what_dead_processes_of_its_host_held_and_kicks_the_queue(make_task, settings):
    settings.ROLLOUT_STALE_S = 3600  # the heartbeats are fresh: only the dead processes count
    host = socket.gethostname()
    tasks = [started(make_task) for _ in range(5)]
    OrmQ.objects.all().delete()
    younger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        holders = {
            "dead": f"{host}:{_dead_pid()}:aaaaaa",
            "reused pid": f"{host}:{os.getpid()}:bbbbbb",  # this process runs no such job
            "younger than the claim": f"{host}:{younger.pid}:cccccc",
            "alive": f"{host}:{os.getppid()}:dddddd",
            "elsewhere": f"other-host:{_dead_pid()}:eeeeee",
        }
        claimed = {}
        for task, (label, worker) in zip(tasks, holders.items()):
            [claim] = jobs.claim_trajectories(1, worker=worker, only=[task.trajectories.get().pk])
            claimed[label] = claim.pk
        Trajectory.objects.filter(pk=claimed["younger than the claim"]).update(
            started_at=timezone.now() - timedelta(minutes=5))
        from django_q.signals import post_spawn

        post_spawn.send(sender="django_q", proc_name="Process-test")  # what a django-q2 worker sends
    finally:
        younger.kill()
        younger.wait()
    status = dict(Trajectory.objects.values_list("pk", "status"))
    assert {label: status[pk] for label, pk in claimed.items()} == {
        "dead": "queued", "reused pid": "queued", "younger than the claim": "queued",
        "alive": "running", "elsewhere": "running"}
    reaped = Trajectory.objects.get(pk=claimed["dead"])
    assert (reaped.worker_losses, reaped.attempts) == (1, 1)
    assert any(f"worker lost: {holders['dead']}'s process is gone" in m for _, m in log_lines(reaped))
    assert [row.task["func"] for row in OrmQ.objects.all()] == [ROLLOUT_JOB]  # one job, dispatched now


@pytest.mark.django_db(transaction=True)
def test_a_starting_worker_dispatches_nothing_for_an_empty_queue(make_task):
    OrmQ.objects.all().delete()
    assert jobs.on_worker_start() == {"requeued": 0, "abandoned": 0, "errors": 0, "dispatched": 0}
    assert not OrmQ.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_job_waits_for_work_due_within_claim_wait_s_and_not_longer(make_task, fake_agent):
    agent = fake_agent()
    soon, later = started(make_task), started(make_task)
    Trajectory.objects.filter(task=soon).update(queued_at=timezone.now() + timedelta(seconds=0.5))
    Trajectory.objects.filter(task=later).update(queued_at=timezone.now() + timedelta(seconds=jobs.CLAIM_WAIT_S + 30))
    started_at = time.monotonic()
    report = jobs.run_rollouts()
    assert report["success"] == 1 and [c["trajectory"] for c in agent.calls] == [soon.trajectories.get().pk]
    assert time.monotonic() - started_at < 10
    assert later.trajectories.get().status == "queued"


@pytest.mark.django_db(transaction=True)
def test_the_reaper_leaves_live_trajectories_alone(make_task, settings):
    settings.ROLLOUT_STALE_S = 120
    task = started(make_task)
    jobs.claim_trajectories(1, worker="alive")
    assert jobs.reap_stale_rollouts() == {"requeued": 0, "abandoned": 0, "retired": 0, "dispatched": 0, "errors": 0}
    assert task.trajectories.get().status == "running"


@pytest.mark.django_db(transaction=True)
def test_the_reaper_dispatches_a_job_for_a_queue_nobody_serves(make_task, settings):
    settings.ROLLOUT_STALE_S = 60
    task = started(make_task)
    OrmQ.objects.all().delete()
    task.trajectories.update(queued_at=timezone.now() - timedelta(minutes=5))
    assert jobs.reap_stale_rollouts()["dispatched"] == 1
    assert [row.task["func"] for row in OrmQ.objects.all()] == [ROLLOUT_JOB]


def _database_url() -> str:
    sd = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{sd['NAME']}"
    from urllib.parse import quote

    auth = quote(sd["USER"] or "", safe="") + (":" + quote(sd["PASSWORD"], safe="") if sd.get("PASSWORD") else "")
    return f"postgres://{auth}@{sd['HOST'] or '127.0.0.1'}:{sd['PORT'] or 5432}/{sd['NAME']}"


WORKER_SCRIPT = textwrap.dedent("""
    import asyncio, django
    django.setup()
    from apps.tasks import jobs

    async def hang(*, on_event, **kwargs):
        await on_event("output", "worker is in the episode", {})
        await asyncio.sleep(3600)

    jobs.run_episode = hang
    jobs.run_rollouts()
""")


@pytest.mark.django_db(transaction=True)
def test_a_killed_workers_trajectory_is_picked_up_by_the_reaper_and_finished(make_task, fake_agent, settings):
    task = started(make_task)
    trajectory = task.trajectories.get()
    env = {**os.environ, "DATABASE_URL": _database_url(), "DJANGO_SETTINGS_MODULE": "trajplatform.settings",
           "ROLLOUT_HEARTBEAT_S": "3600"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):  # the worker claimed it and is inside the episode
            if TrajectoryLog.objects.filter(trajectory=trajectory, kind="output").exists():
                break
            assert worker.poll() is None, worker.stdout.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("the worker never started the episode")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    trajectory.refresh_from_db()
    assert trajectory.status == "running" and trajectory.attempts == 1  # left behind by the dead worker

    # Its heartbeat is fresh; the process that held it is gone: re-queued without waiting.
    assert jobs.reap_stale_rollouts()["requeued"] == 1
    agent = fake_agent()
    assert jobs.run_rollouts()["success"] == 1  # after the back-off, in the same job
    trajectory.refresh_from_db()
    assert (trajectory.status, trajectory.outcome, trajectory.attempts, trajectory.worker_losses) == (
        "finished", "success", 2, 1)
    assert len(agent.calls) == 1
    task.refresh_from_db()
    assert task.status == Task.Status.REVIEWING


# -- secrets -----------------------------------------------------------------------------------------

SECRET = "sk-live-rollout-secret-0123456789abcdef"


@pytest.mark.django_db(transaction=True)
@override_settings(LLM_API_KEY=SECRET)
def test_a_configured_api_key_appears_in_no_row_log_line_or_page(make_task, fake_agent, client, django_user_model,
                                                                 caplog):
    async def leaky(on_event, trajectory, **kwargs):
        await on_event("output", f"env: LLM_API_KEY={SECRET}", {"env": {"LLM_API_KEY": SECRET}, "raw": SECRET})
        if trajectory.sample_index == 1:
            raise RuntimeError(f"provider said: bad key {SECRET}")
        return FakeResult(
            messages=[{"role": "user", "content": "task"},
                      {"role": "tool", "tool_call_id": "1", "content": f"printenv -> {SECRET}"}],
            steps=[{"stdout": SECRET}],
            final_answer=f"the key is {SECRET}",
            outcome="failure",
            outcome_reason=f"verifier saw {SECRET}",
            verifier_output={"stdout": SECRET},
            model=f"model-{SECRET}",
        )

    fake_agent(leaky)
    task = started(make_task, samples_per_iteration=2, prompt="print the environment")
    caplog.set_level("DEBUG")
    jobs.run_rollouts()
    assert set(task.trajectories.values_list("outcome", flat=True)) == {"failure", "error"}

    rows = [*Trajectory.objects.values(), *TrajectoryLog.objects.values(), *AuditEvent.objects.values(),
            *Task.objects.values()]
    assert rows and not [row for row in rows if SECRET in str(row)]
    assert TrajectoryLog.objects.filter(message__contains="[REDACTED]").exists()
    assert SECRET not in caplog.text
    assert "RuntimeError" in caplog.text  # the exception was logged, redacted

    admin = django_user_model.objects.create_superuser("root", "root@example.test", "pw-123456789")
    client.force_login(admin)
    pages = [f"/admin/tasks/trajectory/{t.pk}/change/" for t in task.trajectories.all()]
    pages += ["/admin/tasks/trajectory/", f"/admin/tasks/task/{task.pk}/change/", "/admin/trajplatform/auditevent/"]
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        assert SECRET not in response.content.decode(), page


# -- schedules -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_ensure_schedules_registers_the_reaper_once():
    # The other apps' schedules come with it (each app registers them from its AppConfig.ready).
    others = ["engines.reconcile_sandboxes", "engines.reap_pipeline_runs", "datasets.reap_exports"]
    Schedule.objects.filter(name__in=[jobs.REAP_SCHEDULE_NAME, *others]).delete()
    first = jobs.ensure_schedules()
    assert sorted(Schedule.objects.filter(name__in=others).values_list("name", flat=True)) == sorted(others)
    Schedule.objects.filter(pk=first.pk).update(minutes=30, func="somewhere.else")
    Schedule.objects.create(name=jobs.REAP_SCHEDULE_NAME, func="dup", schedule_type=Schedule.MINUTES, minutes=1)
    second = jobs.ensure_schedules()
    assert second.pk == first.pk
    schedules = Schedule.objects.filter(name=jobs.REAP_SCHEDULE_NAME)
    assert list(schedules.values_list("func", "schedule_type", "minutes", "repeats")) == [
        ("apps.tasks.jobs.reap_stale_rollouts", Schedule.MINUTES, jobs.REAP_EVERY_MINUTES, -1)]


@pytest.mark.django_db
def test_migrate_registers_the_reaper_schedule():
    # pytest-django built the test database with `migrate`; the post_migrate hook ran then.
    assert Schedule.objects.filter(name=jobs.REAP_SCHEDULE_NAME, func=jobs.REAP_FUNC).exists()


@pytest.mark.django_db
def test_migrate_registers_the_sandbox_reconciler_too():
    from apps.engines import jobs as engine_jobs

    assert Schedule.objects.filter(name=engine_jobs.RECONCILE_SCHEDULE_NAME, func=engine_jobs.RECONCILE_FUNC).exists()


@pytest.mark.django_db
def test_migrate_registers_the_pipeline_reaper_too():
    # Not only when a pipeline run is created: a worker restarted after a crash reaps runs at once.
    from apps.engines.pipelines import services as pipeline_services

    assert Schedule.objects.filter(name=pipeline_services.REAP_SCHEDULE_NAME, func=pipeline_services.REAP_FUNC).exists()
