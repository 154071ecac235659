"""Rollout jobs (django-q2): run queued trajectories, many at once per worker; reap stale ones.

    run_rollouts(limit=None)    claim queued trajectories (task priority first, then oldest) and
                                run up to ROLLOUT_CONCURRENCY of them at once in one asyncio
                                loop, claiming more as slots free, until nothing claimable is left
                                (or `limit` claims, or half the django-q2 timeout has passed)
    run_rollout(trajectory_id)  the same for one trajectory; a no-op unless it is still queued
    reap_stale_rollouts()       scheduled every minute: running trajectories whose worker process
                                (on this host) is gone or whose heartbeat is older than
                                ROLLOUT_STALE_S are re-queued behind the queue, after a back-off,
                                or finished as an error after ROLLOUT_MAX_WORKER_LOSSES such
                                losses (reap_dead_workers / trajectory_reap)
    on_worker_start()           django-q2's post_spawn: a worker that starts re-queues what its
                                dead predecessors on this host held and dispatches a job
    ensure_schedules()          register the reaper's Schedule and the other apps' (the registry of
                                trajplatform.schedules; idempotent); called from post_migrate
                                (apps.tasks.apps), so `make worker` and every deploy that migrates
                                has them, and again by `manage.py synthesize`

Delivery may be doubled and workers may die, so:

* A claim is a compare-and-swap queued -> running that stamps a fresh `claim_token`; a second
  delivery of the same job finds nothing queued and returns. On PostgreSQL the candidate query
  also skips rows another worker has locked (SKIP LOCKED), so parallel jobs rarely collide.
* A worker process that dies leaves its claims running: the next worker process to start on
  the same host (`on_worker_start`, django-q2's post_spawn) or the reaper re-queues those whose
  process is gone at once, the reaper also those without a heartbeat for ROLLOUT_STALE_S. Such
  a loss is counted in `worker_losses`, not against ROLLOUT_MAX_ATTEMPTS (episode attempts =
  attempts - worker_losses); the trajectory goes behind the queue (CLAIM_ORDER by queued_at)
  after a short back-off, and ends as an error after ROLLOUT_MAX_WORKER_LOSSES losses.
* While a trajectory runs, the job's bookkeeping task bumps `heartbeat_at` every
  ROLLOUT_HEARTBEAT_S for every claim it still holds (one UPDATE for all of them), and every
  CLAIM_POLL_S reads their tasks' `cancel_requested` and whether each claim is still held (one
  query). A claim the reaper took away makes `should_cancel` true, the episode stops, and its
  result is dropped (`trajectory_finish` refuses a stale token).
* Cancel is cooperative: `should_cancel` (asked by the agent loop between steps) answers from
  that poll, without I/O, so a cancel is honoured within CLAIM_POLL_S plus one step.
* Budgets (apps.tasks.budgets): `claimable()` leaves out the queued trajectories of a batch,
  user or day whose budget is spent; each episode runs with `agent.budget_check` set to the
  job's check (the process's cached spend plus the job's in-flight cost), asked before every
  model call, without I/O; the bookkeeping task refreshes that cache every BUDGET_REFRESH_S.
* Live-log lines are buffered in memory and written for all trajectories at once every
  LOG_FLUSH_S, and a trajectory's last ones right before its result is stored.
* Results (and retries) are stored by one `Finisher`: the episodes that ended while it was
  writing go to the ORM thread together, with their last log lines in one write and the
  records of the sandboxes they destroyed (episodes leave those to the job:
  `on_sandbox_destroyed`).
* Whatever run_episode raises, the trajectory is finished as an error with the (redacted)
  message; a hung episode is stopped after the task's timeout_s plus a grace period.

The model call is I/O bound, so one process drives many rollouts: the episodes are coroutines
in one event loop; the ORM (synchronous) runs in one thread of its own, the agent's sandbox
calls in the loop's default executor. Both pools close their threads' database connections
before the job returns. Per step an episode touches the database not at all; per job there
are a few transactions a second (logs, polls, heartbeats) plus claims and one finish per
trajectory.
"""
from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import secrets
import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.engines import agent
from apps.engines.llm import cache_identity, get_llm_client
from apps.tasks import budgets
from apps.tasks.models import Task, Trajectory, TrajectoryLog
from trajplatform.schedules import ensure_periodic, ensure_schedule, schedules_migrated
from apps.tasks.services import (
    dispatch_rollouts,
    trajectories_finish,
    trajectory_finish,
    trajectory_log_append,
    trajectory_logs_append,
    trajectory_reap,
    trajectory_retry,
)
from apps.engines.sandbox_records import records_destroyed
from trajplatform.redaction import install_log_filter, redact
from trajplatform.workers import _live_runners, _live_runners_lock, holder_alive, worker_name

logger = logging.getLogger("apps.tasks.jobs")
install_log_filter("apps.tasks.jobs")

REAP_SCHEDULE_NAME = "tasks.reap_stale_rollouts"
REAP_FUNC = "apps.tasks.jobs.reap_stale_rollouts"
REAP_EVERY_MINUTES = 1

# ORM threads per job (see RolloutRunner.__init__).
DB_THREADS = 1
# Threads for the agent's synchronous sandbox calls; each blocks on a subprocess or HTTP call.
MAX_SANDBOX_THREADS = 64
# Live-log lines of all the job's trajectories are written together every LOG_FLUSH_S (sooner
# when one trajectory has LOG_FLUSH_LINES waiting), and a trajectory's own lines right before
# its result is stored.
LOG_FLUSH_S = 0.25
LOG_FLUSH_LINES = 200
# How often the job reads the cancel flags (and claim ownership) of its running trajectories:
# the most a cancel waits before should_cancel() says so.
CLAIM_POLL_S = 1.0
LOG_MESSAGE_MAX_CHARS = 16_000
LOG_KEEP_ON_FAILURE = 1_000
# A hung episode is stopped after timeout_s + max(EPISODE_GRACE_S, 25 % of timeout_s).
EPISODE_GRACE_S = 60.0
# An episode that ends in a retryable error (the agent's `retryable`: LLM 5xx/429 after the
# client's own retries, a lost sandbox) is queued again while attempts remain, claimable after
# RETRY_BASE_S * 2**(attempt-1) seconds, at most RETRY_MAX_S.
RETRY_BASE_S = 30.0
RETRY_MAX_S = 600.0
# A job whose queue is empty but for trajectories that become due within CLAIM_WAIT_S waits for
# them instead of ending (the scheduler that would dispatch a later job ticks every 30 s).
CLAIM_WAIT_S = 20.0
# A trajectory whose worker died is claimable again after
# WORKER_LOSS_BACKOFF_S * 2**(losses-1) seconds, at most WORKER_LOSS_BACKOFF_MAX_S: a worker
# that keeps dying on the same trajectory (it exhausts the memory, say) is not restarted into
# it at once, and at most ROLLOUT_MAX_WORKER_LOSSES such deaths end it as an error.
WORKER_LOSS_BACKOFF_S = 2.0
WORKER_LOSS_BACKOFF_MAX_S = CLAIM_WAIT_S

# The agent loop, looked up at call time: tests replace this attribute with a fake; None means
# apps.engines.agent.run_episode.
run_episode: Callable[..., Any] | None = None


def _episode_runner() -> Callable[..., Any]:
    return run_episode if run_episode is not None else agent.run_episode


# -- claims, heartbeats, housekeeping (synchronous; run in the ORM threads) --------------------


@dataclass
class Claim:
    """A trajectory this job holds; `cancel` / `lost` are refreshed by the job's bookkeeping."""

    trajectory: Trajectory
    token: str
    lost: bool = False
    cancel: bool = False

    @property
    def pk(self) -> int:
        return self.trajectory.pk

    async def should_stop(self) -> bool:
        """The agent's should_cancel: the task has a cancel request, or the claim was taken away.
        Async (and free of I/O) on purpose: the agent runs sync callbacks in a thread."""
        return self.cancel or self.lost


def claimable(*, due: bool = True) -> Any:
    """Queued trajectories a worker may start now: their task is running, not being cancelled,
    they belong to its current iteration, their batch's, user's and the day's budgets are not
    spent (apps.tasks.budgets: the process's cached spend), and they are due (a retry or a
    trajectory whose worker died waits out its backoff). due=False: also those still waiting."""
    rows = Trajectory.objects.filter(
        status=Trajectory.Status.QUEUED,
        task__status=Task.Status.RUNNING,
        task__cancel_requested=False,
        iteration=F("task__current_iteration"),
    )
    over_budget = budgets.claim_filter()
    if over_budget is not None:
        rows = rows.exclude(over_budget)
    if due:
        rows = rows.filter(Q(queued_at__isnull=True) | Q(queued_at__lte=timezone.now()))
    return rows


# Highest task priority first, then first queued first: a trajectory queued again (after a
# retryable error or its worker's death) gets a new queued_at and goes behind every one queued
# before it, so after a crash the trajectories that were running do not take the next claims
# again and absorb the next crash too.
CLAIM_ORDER = ("-task__priority", F("queued_at").asc(nulls_first=True), "created_at", "id")


def claim_trajectories(n: int, *, worker: str, only: list[int] | None = None,
                       batch_id: int | None = None, exclude: Q | None = None) -> list[Claim]:
    """Claim up to n claimable trajectories, highest task priority first, by compare-and-swap
    (only those with these pks / of this batch, when given; none that `exclude` matches)."""
    if n <= 0:
        return []
    candidates = claimable()
    if exclude is not None:
        candidates = candidates.exclude(exclude)
    if only is not None:
        candidates = candidates.filter(pk__in=only)
    if batch_id is not None:
        candidates = candidates.filter(task__batch_id=batch_id)
    now = timezone.now()
    claimed: list[tuple[int, str]] = []
    with transaction.atomic():
        if connection.features.has_select_for_update_skip_locked:
            candidates = candidates.select_for_update(skip_locked=True, of=("self",))
        pks = list(candidates.order_by(*CLAIM_ORDER).values_list("pk", flat=True)[:n])
        for pk in pks:
            token = secrets.token_hex(16)
            # The compare-and-swap is what makes the claim exclusive; the lock above only
            # keeps parallel jobs from wasting their candidates on each other.
            won = Trajectory.objects.filter(pk=pk, status=Trajectory.Status.QUEUED).update(
                status=Trajectory.Status.RUNNING, worker=worker[:200], claim_token=token, started_at=now,
                heartbeat_at=now, attempts=F("attempts") + 1,
            )
            if won:
                claimed.append((pk, token))
    rows = Trajectory.objects.select_related("task").in_bulk([pk for pk, _ in claimed])
    return [Claim(rows[pk], token) for pk, token in claimed]


def _claims_q(claims: list[Claim]) -> Q:
    """The rows these claims still hold: pk among theirs and claim_token among theirs. The same
    rows as OR-ing (pk, token) pairs, since each token is random and was only ever written to
    its own row; but two IN lists, which the ORM compiles in microseconds where a hundred ORed
    pairs took tens of milliseconds of the ORM thread on every heartbeat."""
    return Q(pk__in=[c.pk for c in claims], claim_token__in=[c.token for c in claims])


HEARTBEAT_CHUNK = 100  # claims per statement (two IN lists of this many values)


def heartbeat(claims: list[Claim]) -> set[int]:
    """Bump heartbeat_at of every claim still held; return the pks still held."""
    now = timezone.now()
    held: set[int] = set()
    for i in range(0, len(claims), HEARTBEAT_CHUNK):
        mine = Trajectory.objects.filter(_claims_q(claims[i:i + HEARTBEAT_CHUNK]), status=Trajectory.Status.RUNNING)
        mine.update(heartbeat_at=now)
        held.update(mine.values_list("pk", flat=True))
    return held


def retire_unrunnable() -> int:
    """Cancel queued trajectories that can never run (task cancelled or final, or an old
    iteration); returns how many."""
    now = timezone.now()
    return Trajectory.objects.filter(status=Trajectory.Status.QUEUED).filter(
        Q(task__cancel_requested=True)
        | Q(task__status__in=Task.FINAL)
        | ~Q(iteration=F("task__current_iteration"))
    ).update(
        status=Trajectory.Status.CANCELLED,
        finished_at=now,
        outcome_reason="not run: its task was cancelled or had finished, or had moved to another iteration",
    )


# -- the asyncio side ---------------------------------------------------------------------------


class _ThreadPool(ThreadPoolExecutor):
    """A thread pool whose threads' Django DB connections can be closed before it goes away."""

    def close_connections(self, timeout: float = 30.0) -> None:
        threads = len(self._threads)
        if not threads:
            return
        # One closing job per thread: each waits at the barrier, so no thread takes two.
        barrier = threading.Barrier(threads)

        def close() -> None:
            try:
                connections.close_all()
            finally:
                try:
                    barrier.wait(timeout)
                except threading.BrokenBarrierError:  # a thread still busy (a hung sandbox call)
                    pass

        futures = [self.submit(close) for _ in range(threads)]
        _, not_done = wait_futures(futures, timeout=timeout * 2)
        if not_done:
            logger.warning("%d worker thread(s) were busy; their database connections stay open", len(not_done))


def _json_safe(data: Any) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        data = {"value": data}
    try:
        return json.loads(json.dumps(data, default=str))
    except (TypeError, ValueError):
        return {"repr": repr(data)[:LOG_MESSAGE_MAX_CHARS]}


LogLine = tuple[str, str, dict[str, Any]]


def append_log_lines(batches: dict[int, list[LogLine]]) -> dict[int, list[LogLine]]:
    """Append many trajectories' live-log lines in one go; returns the batches that failed, to
    be tried again. If the bulk write fails, each trajectory is tried on its own, so one bad
    line cannot hold back the others."""
    try:
        trajectory_logs_append(batches=batches)
        return {}
    except Exception:
        logger.exception("writing live-log lines of %d trajectories failed; trying them one by one", len(batches))
    failed: dict[int, list[LogLine]] = {}
    for trajectory_id, lines in batches.items():
        try:
            trajectory_log_append(trajectory_id=trajectory_id, lines=lines)
        except Trajectory.DoesNotExist:
            pass  # deleted meanwhile: nothing to keep the lines for
        except Exception:
            logger.exception("trajectory %s: writing %d live-log line(s) failed", trajectory_id, len(lines))
            failed[trajectory_id] = lines
    return failed


class LiveLogs:
    """The job's live-log buffer: `on_event(trajectory_id)` callbacks only append in memory;
    `flush` writes every trajectory's pending lines in one transaction. The bookkeeping task
    flushes every LOG_FLUSH_S, so an episode never waits on the database for its log, and the
    log costs a few transactions per second per job, not one per event."""

    KINDS = frozenset(TrajectoryLog.Kind.values)

    def __init__(self, run_db: Callable[..., Any]):
        self.run_db = run_db
        self.pending: dict[int, list[LogLine]] = {}
        self.lock = asyncio.Lock()
        self.wake = asyncio.Event()

    def on_event_for(self, trajectory_id: int) -> Callable[..., Any]:
        # Async on purpose: the agent runs sync callbacks in a thread, this needs none.
        async def on_event(kind: str, message: Any = "", data: Any = None) -> None:
            self.add(trajectory_id, kind, message, data)

        return on_event

    def add(self, trajectory_id: int, kind: str, message: Any = "", data: Any = None) -> None:
        kind = kind if kind in self.KINDS else "system"
        text = "" if message is None else str(message)
        if len(text) > LOG_MESSAGE_MAX_CHARS:
            text = (f"{text[:LOG_MESSAGE_MAX_CHARS]}\n[… {len(text) - LOG_MESSAGE_MAX_CHARS} more characters; "
                    "the whole text is in the trajectory]")
        lines = self.pending.setdefault(trajectory_id, [])
        lines.append((kind, text, _json_safe(data)))
        if len(lines) >= LOG_FLUSH_LINES:
            self.wake.set()

    def take(self, trajectory_id: int) -> dict[int, list[LogLine]]:
        """One trajectory's pending lines, removed from the buffer, as a batch to write."""
        lines = self.pending.pop(trajectory_id, None)
        return {trajectory_id: lines} if lines else {}

    def put_back(self, failed: dict[int, list[LogLine]]) -> None:
        for pk, lines in failed.items():
            # The episode matters more than its live log: keep (the last of) them for the next try.
            self.pending[pk] = (lines + self.pending.get(pk, []))[-LOG_KEEP_ON_FAILURE:]

    async def flush(self) -> None:
        """Write every trajectory's pending lines. (A trajectory's last lines are `take`n and
        written with its final state, see `Finisher`; that write does not wait for this one:
        the job's single ORM thread (DB_THREADS) runs writes in the order they were handed
        over, so they still land after the earlier lines this flush took.)"""
        async with self.lock:
            batches, self.pending = self.pending, {}
            if not batches:
                return
            try:
                failed = await self.run_db(append_log_lines, batches)
            except Exception:
                logger.exception("writing live-log lines failed")
                failed = batches
            self.put_back(failed)


def mark_sandboxes_destroyed(sandboxes: list[tuple[str, str]]) -> None:
    """(backend, sandbox id) pairs the job's episodes destroyed: mark their records, one UPDATE
    per backend. A failure is logged: the reconciler marks them later (their owners finished)."""
    by_backend: dict[str, list[str]] = {}
    for backend, sandbox_id in sandboxes:
        by_backend.setdefault(backend, []).append(sandbox_id)
    for backend, ids in by_backend.items():
        try:
            records_destroyed(backend=backend, external_ids=ids, reason="destroyed")
        except Exception:
            logger.exception("marking %d destroyed %s sandbox(es) failed; the reconciler will", len(ids), backend)


Ending = tuple[dict[int, list[LogLine]], Callable[..., Any], dict[str, Any]]  # last lines, store, its kwargs


def finish_together(items: list[Ending], sandboxes: list[tuple[str, str]] | None = None) -> list[tuple[bool, Any]]:
    """In the ORM thread: episodes that ended together. The records of the sandboxes destroyed
    meanwhile are marked, the episodes' last live-log lines go in one write, then each one's
    final state, `store(**kwargs)` (trajectory_finish or trajectory_retry): the finishes all in
    one transaction (trajectories_finish), or, if that fails, each on its own (one bad result
    fails only itself). Per item (True, (the lines that failed, what `store` returned))
    or (False, the exception it raised)."""
    if sandboxes:
        mark_sandboxes_destroyed(sandboxes)
    merged: dict[int, list[LogLine]] = {}
    for batches, _, _ in items:
        for pk, lines in batches.items():
            merged.setdefault(pk, []).extend(lines)
    failed = append_log_lines(merged) if merged else {}
    together: dict[int, Any] = {}
    finishes = [i for i, (_, store, _) in enumerate(items) if store is trajectory_finish]
    if len(finishes) > 1:
        try:
            together = dict(zip(finishes, trajectories_finish([items[i][2] for i in finishes])))
        except Exception:
            logger.info("storing %d episodes together failed; storing them one by one", len(finishes),
                        exc_info=True)
    results: list[tuple[bool, Any]] = []
    for i, (batches, store, kwargs) in enumerate(items):
        try:
            stored = together[i] if i in together else store(**kwargs)
        except Exception as exc:
            results.append((False, exc))
        else:
            results.append((True, ({pk: failed[pk] for pk in batches if pk in failed}, stored)))
    return results


class Finisher:
    """Hands episodes' ends to the ORM thread, all that ended while it was busy in one go
    (`finish_together`). When a hundred episodes end within a second, one hand-over and one
    live-log write each cost more than the ORM thread has; together they take a fraction."""

    def __init__(self, run_db: Callable[..., Any]):
        self.run_db = run_db
        self.pending: list[tuple[Ending, asyncio.Future[Any]]] = []
        self.sandboxes: list[tuple[str, str]] = []  # destroyed, records not marked yet
        self.drainer: asyncio.Task[None] | None = None

    def sandbox_destroyed(self, sandbox: Any) -> None:
        """The episodes' on_sandbox_destroyed: its record is marked with the next finishes."""
        self.sandboxes.append((sandbox.backend_name, sandbox.id))

    async def close(self) -> None:
        """At the job's end: mark what no finish took along (an episode stopped by its timeout)."""
        if self.drainer is not None:
            await asyncio.gather(self.drainer, return_exceptions=True)
        sandboxes, self.sandboxes = self.sandboxes, []
        if sandboxes:
            await self.run_db(mark_sandboxes_destroyed, sandboxes)

    async def store(self, last_lines: dict[int, list[LogLine]], store: Callable[..., Any], /,
                    **kwargs: Any) -> tuple[Any, Any]:
        """`store(**kwargs)` after `last_lines`; returns (the lines that failed, what it returned)."""
        future = asyncio.get_running_loop().create_future()
        self.pending.append(((last_lines, store, kwargs), future))
        if self.drainer is None or self.drainer.done():
            self.drainer = asyncio.create_task(self._drain())
        return await asyncio.shield(future)  # a cancelled waiter does not cancel the others' write

    async def _drain(self) -> None:
        while self.pending:
            items, self.pending = self.pending, []
            sandboxes, self.sandboxes = self.sandboxes, []
            try:
                results = await self.run_db(finish_together, [ending for ending, _ in items], sandboxes)
            except BaseException as exc:  # noqa: BLE001 (handed to every waiter, re-raised below if fatal)
                self.sandboxes[:0] = sandboxes  # for the next hand-over, or close()
                for _, future in items:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), (ok, value) in zip(items, results):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)


def claim_states(claims: list[Claim]) -> dict[int, str]:
    """'held', 'cancel' (its task has a cancel request) or 'lost' (no longer ours) per claim."""
    states = {c.pk: "lost" for c in claims}
    for i in range(0, len(claims), HEARTBEAT_CHUNK):
        rows = Trajectory.objects.filter(
            _claims_q(claims[i:i + HEARTBEAT_CHUNK]), status=Trajectory.Status.RUNNING
        ).values_list("pk", "task__cancel_requested")
        for pk, cancel in rows:
            states[pk] = "cancel" if cancel else "held"
    return states


def _episode_limit_s(config: dict[str, Any]) -> float:
    try:
        timeout = float(config.get("timeout_s") or 600.0)
    except (TypeError, ValueError):
        timeout = 600.0
    return timeout + max(EPISODE_GRACE_S, 0.25 * timeout)


def _job_budget_s() -> float:
    # Stop claiming after half the django-q2 timeout so the running episodes can end before
    # the cluster kills the job; a follow-up job carries on.
    return 0.5 * float(settings.Q_CLUSTER.get("timeout") or 3600)


# The cyclic garbage collector while a job runs. Its episodes allocate hundreds of thousands of
# short-lived objects: with Python's default thresholds (700, 10, 10) a batch of 128 rollouts
# spent ~0.7 s of 14 in collections, the oldest generation's scanning the whole Django process
# and stopping every thread for up to 165 ms at a time. So, for the job, the objects that
# existed before it are frozen (reference counting still frees them; only a cycle among them
# waits for the job's end) and the youngest generation is collected every 50 000 allocations.
JOB_GC_THRESHOLDS = (50_000, 50, 100)
_job_gc_lock = threading.Lock()
_job_gc_state: dict[str, Any] = {"jobs": 0, "thresholds": None}


@contextmanager
def _job_gc() -> Any:
    with _job_gc_lock:
        if not _job_gc_state["jobs"]:  # the first of the jobs running in this process
            _job_gc_state["thresholds"] = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(*JOB_GC_THRESHOLDS)
        _job_gc_state["jobs"] += 1
    try:
        yield
    finally:
        with _job_gc_lock:
            _job_gc_state["jobs"] -= 1
            if not _job_gc_state["jobs"]:  # the last one
                gc.set_threshold(*_job_gc_state["thresholds"])
                gc.unfreeze()


class RolloutRunner:
    """One job's worth of rollouts in one event loop (see the module docstring)."""

    def __init__(self, *, concurrency: int | None = None, limit: int | None = None,
                 trajectory_ids: list[int] | None = None, batch_id: int | None = None,
                 stop: threading.Event | None = None):
        self.concurrency = max(1, concurrency or settings.ROLLOUT_CONCURRENCY)
        self.limit = limit
        self.only = trajectory_ids
        self.batch_id = batch_id
        self.stop = stop
        self.worker = f"{worker_name()}:{secrets.token_hex(3)}"
        self.counts: Counter[str] = Counter()
        self.claimed = 0
        self.running: dict[asyncio.Task[str], Claim] = {}
        self.spend = budgets.EpisodeBudgets()  # the check before each model call of its episodes
        # One ORM thread: SQLite has a single writer anyway, and one thread never waits on its
        # own locks (concurrent writers sleep in SQLite's busy handler); one connection per job.
        self.db_pool = _ThreadPool(max_workers=DB_THREADS, thread_name_prefix="rollout-db")
        self.sandbox_pool = _ThreadPool(
            max_workers=min(self.concurrency, MAX_SANDBOX_THREADS) + 4, thread_name_prefix="rollout-io"
        )

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        with _live_runners_lock:
            _live_runners.add(self.worker)
        try:
            with _job_gc(), asyncio.Runner() as runner:
                runner.get_loop().set_default_executor(self.sandbox_pool)
                try:
                    runner.run(self._main())
                finally:
                    self.db_pool.close_connections()
                    self.sandbox_pool.close_connections()
        finally:
            self.db_pool.shutdown(wait=False, cancel_futures=True)
            self.sandbox_pool.shutdown(wait=False, cancel_futures=True)
            with _live_runners_lock:
                _live_runners.discard(self.worker)
        return {"worker": self.worker, "claimed": self.claimed, "wall_s": round(time.monotonic() - started, 3),
                **dict(self.counts)}

    def _scoped(self, queryset: Any) -> Any:
        if self.only is not None:
            queryset = queryset.filter(pk__in=self.only)
        if self.batch_id is not None:
            queryset = queryset.filter(task__batch_id=self.batch_id)
        return queryset

    def _due_in(self, exclude: Q | None = None) -> float | None:
        """Seconds until the first trajectory this job may claim (none that `exclude` matches: the
        budgets its own episodes spent) becomes due (0 if one is due now), None if none is queued."""
        queued = self._scoped(claimable(due=False))
        if exclude is not None:
            queued = queued.exclude(exclude)
        first = queued.order_by(F("queued_at").asc(nulls_first=True)).values_list("queued_at", flat=True).first()
        if first is None and not queued.exists():
            return None
        return 0.0 if first is None else max(0.0, (first - timezone.now()).total_seconds())

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.db_pool, functools.partial(fn, *args, **kwargs))

    async def _main(self) -> None:
        llm = get_llm_client()
        self.logs = LiveLogs(self.db)
        self.finisher = Finisher(self.db)
        budget_end = time.monotonic() + _job_budget_s()
        await self.db(retire_unrunnable)
        running = self.running
        keeper = asyncio.create_task(self._bookkeeping())
        exhausted = False
        wake_at: float | None = None  # nothing due now; claim again then
        try:
            while True:
                room = self.concurrency - len(running)
                if self.limit is not None:
                    room = min(room, self.limit - self.claimed)
                if self.stop is not None and self.stop.is_set():
                    exhausted = True
                if not exhausted and room > 0 and (wake_at is None or time.monotonic() >= wake_at):
                    wake_at = None
                    if time.monotonic() >= budget_end:
                        exhausted = True
                        if await self.db(self._scoped(claimable()).exists):
                            logger.info("%s: job budget used; handing the queue to a follow-up job", self.worker)
                            await self.db(dispatch_rollouts)
                    else:
                        try:
                            claims = await self.db(claim_trajectories, room, worker=self.worker, only=self.only,
                                                   batch_id=self.batch_id, exclude=self.spend.blocked())
                        except Exception:
                            # E.g. the database stayed locked: finish what runs; a later job claims.
                            logger.exception("%s: claiming failed; not claiming more in this job", self.worker)
                            claims = []
                        self.claimed += len(claims)
                        exhausted = not claims
                        if exhausted and self.limit is None:
                            wait = await self.db(self._due_in, self.spend.blocked())
                            if wait is not None and wait <= CLAIM_WAIT_S and time.monotonic() + wait < budget_end:
                                exhausted, wake_at = False, time.monotonic() + max(wait, 0.05)
                        for claim in claims:
                            running[asyncio.create_task(self._run_one(claim, llm))] = claim
                if not running and (exhausted or wake_at is None):
                    break
                timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
                if not running:
                    await asyncio.sleep(min(timeout or 0.0, CLAIM_POLL_S))  # CLAIM_POLL_S: `stop` is seen
                    continue
                done, _ = await asyncio.wait(running, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    claim = running.pop(finished)
                    self.spend.ended(claim.pk)  # stored by now: the next snapshot has its cost
                    try:
                        outcome = finished.result()
                    except Exception:
                        # A bug between the episode and its storage; the reaper retires the row.
                        logger.exception("trajectory %s: the worker failed around the episode", claim.pk)
                        outcome = "worker_error"
                    self.counts[outcome] += 1
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await self.finisher.close()
            await self.logs.flush()
            try:
                await llm.aclose()
            except Exception:  # closing HTTP pools must not hide the job's own outcome
                logger.exception("closing the LLM client's connections failed")

    async def _bookkeeping(self) -> None:
        """Every LOG_FLUSH_S: write pending log lines; every CLAIM_POLL_S: read the cancel flags
        and claim ownership of every running trajectory (one query); every ROLLOUT_HEARTBEAT_S:
        bump their heartbeats (one UPDATE)."""
        heartbeat_s = max(0.01, float(settings.ROLLOUT_HEARTBEAT_S))
        tick = min(LOG_FLUSH_S, CLAIM_POLL_S, heartbeat_s)
        last_beat = last_poll = time.monotonic()
        while True:
            try:
                await asyncio.wait_for(self.logs.wake.wait(), tick)
            except TimeoutError:
                pass
            self.logs.wake.clear()
            await self.logs.flush()
            now = time.monotonic()
            claims = [c for c in self.running.values() if not c.lost]
            if claims and now - budgets.cached().taken_at >= float(settings.BUDGET_REFRESH_S):
                try:
                    await self.db(budgets.snapshot)
                except Exception:
                    logger.exception("%s: reading the budgets' spend failed", self.worker)
            if claims and now - last_poll >= CLAIM_POLL_S:
                last_poll = now
                try:
                    states = await self.db(claim_states, claims)
                except Exception:
                    logger.exception("%s: reading cancel flags failed", self.worker)
                else:
                    for claim in claims:
                        claim.cancel = states[claim.pk] == "cancel"
                        claim.lost = states[claim.pk] == "lost"
            if claims and now - last_beat >= heartbeat_s:
                last_beat = now
                try:
                    held = await self.db(heartbeat, claims)
                except Exception:
                    logger.exception("%s: heartbeat failed", self.worker)
                else:
                    for claim in claims:
                        if claim.pk not in held:
                            claim.lost = True

    async def _run_one(self, claim: Claim, llm: Any) -> str:
        """Run one claimed trajectory to a stored end; returns its outcome (or 'cancelled'/'lost')."""
        trajectory = claim.trajectory
        on_event = self.logs.on_event_for(trajectory.pk)
        attempt = episode_attempts(trajectory)
        lost = f"; {trajectory.worker_losses} earlier claim(s) lost with their worker" if trajectory.worker_losses else ""
        self.logs.add(
            trajectory.pk, "system",
            f"claimed by worker {self.worker} (attempt {attempt} of {settings.ROLLOUT_MAX_ATTEMPTS}{lost})",
            {"worker": self.worker, "attempt": attempt, "worker_losses": trajectory.worker_losses},
        )
        config = trajectory.config_snapshot or trajectory.task.config_snapshot()
        limit_s = _episode_limit_s(config)
        result, error = None, ""
        # This task's context: the episode and its sub-episodes see the check, no other episode.
        agent.budget_check.set(self.spend.check_for(trajectory))
        try:
            async with asyncio.timeout(limit_s) as deadline:
                result = await _episode_runner()(
                    config=config,
                    llm=llm,
                    sandbox_backend=None,
                    # Its UUID, not its pk: the cache outlives the database (see llm.cache_identity).
                    cache_key_extra=cache_identity(trajectory.uuid),
                    on_event=on_event,
                    should_cancel=claim.should_stop,
                    trajectory=trajectory,
                    on_sandbox_destroyed=self.finisher.sandbox_destroyed,
                )
        except TimeoutError as exc:
            if deadline.expired():
                error = f"the episode did not end within {limit_s:.0f}s (timeout_s plus grace); the worker stopped it"
            else:
                error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            logger.exception("trajectory %s: the episode raised", trajectory.pk)
            error = f"{type(exc).__name__}: {exc}"
        if error:
            error = redact(error)
            self.logs.add(trajectory.pk, "error", f"worker: {error}")
        # Its log lines go in before its final state (in the same hand-over to the ORM thread),
        # so a reader never sees a finished trajectory whose last lines are still missing.
        last_lines = self.logs.take(trajectory.pk)
        if _retryable(result) and attempt < settings.ROLLOUT_MAX_ATTEMPTS:
            delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (attempt - 1))
            try:
                failed, retried = await self.finisher.store(
                    last_lines, trajectory_retry, trajectory_id=trajectory.pk, claim_token=claim.token,
                    reason=result.outcome_reason or "retryable error", delay_s=delay,
                )
            except Exception:
                logger.exception("trajectory %s: queueing the retry failed; storing the error instead", trajectory.pk)
                last_lines = {}  # written before the retry failed
            else:
                self.logs.put_back(failed)
                return "retried" if retried is not None else "lost"
        try:
            failed, stored = await self.finisher.store(
                last_lines, trajectory_finish, trajectory_id=trajectory.pk, claim_token=claim.token, result=result,
                error=error,
            )
            self.logs.put_back(failed)
        except Exception as exc:
            if result is None:
                logger.exception("trajectory %s: storing the error failed; the reaper will retire it", trajectory.pk)
                return "unstored"
            # E.g. a result the database cannot store: record that rather than leave it running.
            logger.exception("trajectory %s: storing the episode failed", trajectory.pk)
            reason = redact(f"the episode's result could not be stored: {type(exc).__name__}: {exc}")
            self.logs.add(trajectory.pk, "error", f"worker: {reason}")
            failed, stored = await self.finisher.store(
                self.logs.take(trajectory.pk), trajectory_finish, trajectory_id=trajectory.pk,
                claim_token=claim.token, result=None, error=reason,
            )
            self.logs.put_back(failed)
        if stored is None:
            logger.warning("trajectory %s: claim lost (re-queued or finished elsewhere); result dropped", trajectory.pk)
            return "lost"
        return stored.outcome or stored.status


def episode_attempts(trajectory: Trajectory) -> int:
    """The claims that count against ROLLOUT_MAX_ATTEMPTS: all of them but those whose worker
    died under them (Trajectory.worker_losses)."""
    return max(0, trajectory.attempts - trajectory.worker_losses)


def _retryable(result: Any) -> bool:
    return (
        result is not None
        and not result.cancelled
        and result.outcome == Trajectory.Outcome.ERROR
        and bool(getattr(result, "retryable", False))
    )


# -- the jobs ----------------------------------------------------------------------------------


def run_rollouts(limit: int | None = None, *, concurrency: int | None = None,
                 trajectory_ids: list[int] | None = None, batch_id: int | None = None,
                 stop: threading.Event | None = None) -> dict[str, Any]:
    """Run queued trajectories, ROLLOUT_CONCURRENCY (or `concurrency`) at a time, until none is
    claimable, `limit` were claimed or `stop` is set; returns counts by outcome. Safe to
    deliver twice. `trajectory_ids` / `batch_id` restrict what it claims (in-process runs)."""
    report = RolloutRunner(concurrency=concurrency, limit=limit, trajectory_ids=trajectory_ids, batch_id=batch_id,
                           stop=stop).run()
    if report["claimed"]:
        logger.info("rollouts: %s", report)
    return report


def run_rollout(trajectory_id: int) -> dict[str, Any]:
    """Run one trajectory if it is still queued and claimable; otherwise a no-op."""
    return run_rollouts(limit=1, concurrency=1, trajectory_ids=[trajectory_id])


def _reap(pk: int, report: Counter[str], **how: Any) -> None:
    try:
        done = trajectory_reap(
            trajectory_id=pk, max_worker_losses=settings.ROLLOUT_MAX_WORKER_LOSSES,
            backoff_s=(WORKER_LOSS_BACKOFF_S, WORKER_LOSS_BACKOFF_MAX_S), dispatch=False, **how,
        )
    except Exception:
        logger.exception("reaping trajectory %s failed", pk)
        report["errors"] += 1
        return
    if done:
        report[done] += 1


def reap_dead_workers(report: Counter[str] | None = None) -> Counter[str]:
    """Re-queue (or end, after ROLLOUT_MAX_WORKER_LOSSES) the running trajectories claimed by a
    process of this host that no longer runs, at once: a restarted worker need not wait out
    ROLLOUT_STALE_S for what its dead predecessor held. Counts "requeued" / "abandoned"."""
    report = Counter() if report is None else report
    host = socket.gethostname()
    held = Trajectory.objects.filter(status=Trajectory.Status.RUNNING, worker__startswith=f"{host}:")
    for pk, worker, started_at in list(held.values_list("pk", "worker", "started_at")):
        if not holder_alive(worker, started_at):
            _reap(pk, report, dead_worker=worker)
    return report


def reap_stale_rollouts(dispatch: bool = True) -> dict[str, int]:
    """Re-queue or fail running trajectories whose worker process on this host is gone or that
    sent no heartbeat for ROLLOUT_STALE_S; retire queued ones that can never run; dispatch a
    job for what was re-queued, or for a queue that no job seems to be serving (unless
    dispatch=False: a caller that runs the rollouts itself)."""
    stale_before = timezone.now() - timedelta(seconds=settings.ROLLOUT_STALE_S)
    report = reap_dead_workers()
    stale = Trajectory.objects.filter(status=Trajectory.Status.RUNNING).filter(
        Q(heartbeat_at__lt=stale_before) | Q(heartbeat_at__isnull=True, started_at__lt=stale_before)
        | Q(heartbeat_at__isnull=True, started_at__isnull=True)
    )
    for pk in list(stale.values_list("pk", flat=True)):
        _reap(pk, report, stale_before=stale_before)
    report["retired"] = retire_unrunnable()
    # A claimable trajectory queued for longer than the stale limit has no job serving it (a
    # lost broker message, or a `synthesize --wait` that was interrupted): dispatch one.
    if dispatch and (report["requeued"] or claimable().filter(queued_at__lt=stale_before).exists()):
        transaction.on_commit(dispatch_rollouts)
        report["dispatched"] = 1
    result = {k: report.get(k, 0) for k in ("requeued", "abandoned", "retired", "dispatched", "errors")}
    if any(result.values()):
        logger.info("rollout reaper: %s", result)
    return result


def on_worker_start(**kwargs: Any) -> dict[str, int]:
    """A django-q2 worker process started (signal post_spawn): re-queue what dead rollout
    processes of this host held, and dispatch a job if anything is claimable, so that work
    resumes now, not after the reaper's schedule, ROLLOUT_STALE_S, the scheduler's tick or the
    broker's redelivery of jobs the dead cluster had taken (Q_TIMEOUT + 300 s)."""
    result = {"requeued": 0, "abandoned": 0, "errors": 0, "dispatched": 0}
    try:
        report = reap_dead_workers()
        result.update({k: report.get(k, 0) for k in ("requeued", "abandoned", "errors")})
        if report["requeued"] or claimable(due=False).exists():
            dispatch_rollouts()
            result["dispatched"] = 1
    except Exception:  # the worker must start whatever happens here; the reaper tries again
        logger.exception("reaping the dead workers' rollouts at worker start failed")
        result["errors"] += 1
    finally:
        connections.close_all()
    if any(result.values()):
        logger.info("worker start: %s", result)
    return result


def register_rollout_schedules(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """After `migrate` (post_migrate of apps.tasks): make sure the rollout reaper and the other
    apps' periodic jobs are scheduled (idempotent). Done here rather than by hand so that every
    database the worker cluster serves has them: `make worker` migrates first, and so does every
    deploy. `manage.py synthesize` calls `ensure_schedules()` as well."""
    if not schedules_migrated(using):
        return  # django_q not migrated on this database (e.g. `migrate tasks` alone)
    ensure_schedules(using=using)


def ensure_schedules(*, minutes: int = REAP_EVERY_MINUTES, using: str = "default") -> Any:
    """Register the rollout reaper's Schedule and those the other apps registered
    (trajplatform.schedules.register_periodic: the sandbox reconciler, the pipeline and the export
    reapers); idempotent, run after every migrate; returns the rollout reaper's."""
    ensure_periodic(using=using)
    return ensure_schedule(name=REAP_SCHEDULE_NAME, func=REAP_FUNC, minutes=minutes, using=using)
