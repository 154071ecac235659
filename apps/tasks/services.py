"""Writes to tasks, batches and trajectories. Every change is one transaction with its audit row."""
from __future__ import annotations

import secrets
import threading
from collections import Counter
from datetime import timedelta
from decimal import Decimal
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone
from django_q.models import Schedule

from apps.engines.llm import check_models
from apps.tasks.importers import validate_task
from apps.tasks.models import Batch, Task, Trajectory, TrajectoryLog
from apps.tasks.selectors import STATE_LABELS, batch_state_counts
from apps.tasks.signals import iteration_finished
from trajplatform import artifacts
from trajplatform.audit import audit_record
from trajplatform.realtime import send_to_groups
from trajplatform.schedules import enqueue
from trajplatform.redaction import secret_values, storable, storable_count, unstorable_fields
from trajplatform.webhooks import webhook_emit


class TransitionError(Exception):
    """A status change that the object's current status does not allow."""


def task_cancel(*, task: Task, actor: Any, reason: str = "") -> Task:
    """Cancel a task that has not finished; its running trajectory stops at the next step."""
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.status == Task.Status.CANCELLED:
            return task  # repeat click: no-op, no audit row
        if task.status in Task.FINAL:
            raise TransitionError(f"task {task.pk} is {task.status} and cannot be cancelled")
        previous = task.status
        task.status = Task.Status.CANCELLED
        task.cancel_requested = True
        task.finished_at = timezone.now()
        task.save(update_fields=["status", "cancel_requested", "finished_at", "updated_at"])
        audit_record("tasks.task_cancel", actor=actor, target=task, data={"from": previous, "reason": reason})
        webhook_emit("task.finished", {"task": task.pk, "status": task.status, "iteration": task.current_iteration,
                                       "reason": reason or "cancelled"})
    return task


def _requeue(task: Task, actor: Any, reason: str) -> Task:
    """Inside the caller's transaction: lock a failed or cancelled task and set it queued again."""
    task = Task.objects.select_for_update().get(pk=task.pk)
    if task.status not in (Task.Status.FAILED, Task.Status.CANCELLED):
        raise TransitionError(f"task {task.pk} is {task.status}; only failed or cancelled tasks can be re-queued")
    previous = task.status
    task.status = Task.Status.QUEUED
    task.cancel_requested = False
    task.error = ""
    task.queued_at = timezone.now()
    task.finished_at = None
    task.save(update_fields=["status", "cancel_requested", "error", "queued_at", "finished_at", "updated_at"])
    audit_record("tasks.task_requeue", actor=actor, target=task, data={"from": previous, "reason": reason})
    return task


def task_requeue(*, task: Task, actor: Any, reason: str = "") -> Task:
    """Queue a failed or cancelled task again from its current config and start its next
    iteration (rollout jobs on commit): a re-queued task never sits queued with nothing to run."""
    with transaction.atomic():
        task = _requeue(task, actor, reason)
        task_start_iteration(task=task, actor=actor)
        task.refresh_from_db()
    return task


class BatchNameTaken(Exception):
    """A batch of this name exists (names are unique) and may not be reused by this caller."""


def batch_create(
    *, name: str, created_by: Any, source_name: str = "", source_sha256: str = "", source_format: str = "",
    notes: str = "", reuse: Callable[[Batch], bool] | None = None,
) -> tuple[Batch, bool]:
    """Create the batch `name`, or return the existing one if `reuse(batch)` allows it: (batch, created).

    Race-safe on SQLite and PostgreSQL; call it inside the caller's transaction. The insert runs
    in a savepoint: a concurrent caller that inserted the same name first makes it fail on the
    unique name (on PostgreSQL it waits for that caller to commit), and the committed batch is
    fetched instead. An existing batch is locked (select_for_update) so concurrent callers adding
    to it take turns. A name that exists and may not be reused raises BatchNameTaken.
    """
    name = name[:200]
    existing = Batch.objects.select_for_update().filter(name=name).first()
    if existing is None:
        try:
            with transaction.atomic():
                batch = Batch.objects.create(
                    name=name, created_by=created_by, source_name=source_name[:300], source_sha256=source_sha256,
                    source_format=source_format[:40], notes=notes,
                )
            return batch, True
        except IntegrityError:
            existing = Batch.objects.select_for_update().filter(name=name).first()
            if existing is None:
                raise
    if reuse is None or not reuse(existing):
        raise BatchNameTaken(f"a batch named {name!r} already exists (#{existing.pk}); choose another name")
    return existing, False


def batch_free_name(base: str) -> str:
    """`base`, or `base (2)`, `base (3)`, ...: the first name no batch has yet."""
    base = base[:190]
    taken = set(Batch.objects.filter(name__startswith=base).values_list("name", flat=True))
    n = 1
    while (candidate := base if n == 1 else f"{base} ({n})") in taken:
        n += 1
    return candidate


def batch_create_named_after(base: str, **fields: Any) -> Batch:
    """A new batch named `base` (a generated name), or `base (2)`, ... when that is taken, also
    when a concurrent caller takes the free name first. Inside the caller's transaction."""
    for _ in range(20):
        try:
            return batch_create(name=batch_free_name(base), **fields)[0]
        except BatchNameTaken:
            continue
    raise BatchNameTaken(f"no free batch name after {base!r} (2) ... (20); choose a name")


IMPORT_CHUNK_SIZE = 2000


def _storable_task_rows(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Task field dicts as stored: configured secrets and key shapes (an LLM key, `trj_` tokens)
    redacted, labelled values kept (a prompt may be about passwords). Text that cannot be stored
    (a NUL byte, a lone surrogate) is refused with TaskCreateError, not altered: it is input."""
    secrets = secret_values()
    for i, fields in enumerate(rows):
        problems = unstorable_fields(fields)
        if problems:
            raise TaskCreateError([(f"tasks[{i}].{field}", reason) for field, reason in problems])
        yield storable(fields, labels=False, _secrets=secrets)


def batch_import(
    *,
    rows: Iterable[dict[str, Any]],
    name: str,
    source_name: str,
    source_sha256: str,
    source_format: str,
    actor: Any,
) -> Batch:
    """Create a batch and its tasks (queued) from validated task field dicts, all or nothing.

    `rows` may be a generator (a file being read); it is consumed in chunks inside the one
    transaction, so an exception from it (or an empty input) leaves nothing written. One
    audit row for the batch, with counts; no per-task rows.
    """
    user = actor if getattr(actor, "is_authenticated", False) else None
    with transaction.atomic():
        batch, _ = batch_create(
            name=name, created_by=user, source_name=source_name, source_sha256=source_sha256,
            source_format=source_format,
        )
        now = timezone.now()
        by_scene: Counter[str] = Counter()
        iterator = _storable_task_rows(rows)
        while chunk := list(islice(iterator, IMPORT_CHUNK_SIZE)):
            tasks = [
                Task(batch=batch, created_by=user, status=Task.Status.QUEUED, queued_at=now, **fields)
                for fields in chunk
            ]
            Task.objects.bulk_create(tasks, batch_size=IMPORT_CHUNK_SIZE)
            by_scene.update(t.scene for t in tasks)
        total = sum(by_scene.values())
        if total == 0:
            raise ValueError("no tasks to import")
        batch.task_count = total
        batch.save(update_fields=["task_count"])
        audit_record(
            "tasks.batch_import",
            actor=actor,
            target=batch,
            data={
                "task_count": total,
                "by_scene": dict(sorted(by_scene.items())),
                "source_name": batch.source_name,
                "source_sha256": source_sha256,
                "source_format": batch.source_format,
            },
        )
    return batch


def trajectory_group_name(trajectory_id: int) -> str:
    """The channels group that live-log lines of one trajectory are sent to."""
    return f"trajectory-{trajectory_id}"


def trajectory_log_append(
    *, trajectory_id: int, lines: list[tuple[str, str, dict[str, Any]]]
) -> list["TrajectoryLog"]:
    """Append (kind, message, data) lines with the next sequence numbers; broadcast after commit.

    The websocket message is {"type": "log.lines", "trajectory": id, "lines": [line.as_message()]}.
    Raises Trajectory.DoesNotExist for an unknown trajectory.
    """
    if not lines:
        return []
    created = trajectory_logs_append(batches={trajectory_id: lines})
    if trajectory_id not in created:
        raise Trajectory.DoesNotExist(f"trajectory {trajectory_id} does not exist")
    return created[trajectory_id]


# --- rollouts: iterations, finishing, reaping ----------------------------------------------
#
# Concurrency rules (the jobs in apps/tasks/jobs.py rely on them):
# * A trajectory moves queued -> running only by the claiming job's compare-and-swap, which
#   stamps a fresh `claim_token`; running -> finished/cancelled only by `trajectory_finish`
#   with that token, or by the reaper after the heartbeat went stale. Whoever loses a race
#   changes nothing.
# * Every transition that can complete an iteration locks the task row first (task, then
#   trajectory: the one lock order used here), so exactly one writer sees the last
#   trajectory of an iteration end and calls `on_iteration_finished`.
# * Jobs are enqueued only in transaction.on_commit, and any number of them may run: each
#   claims whatever is queued and returns at once when nothing is.

ROLLOUT_JOB = "apps.tasks.jobs.run_rollouts"


def dispatch_rollouts(*, jobs: int = 1, delay_s: float = 0) -> None:
    """Enqueue `jobs` run_rollouts jobs on the django-q2 broker (call it from on_commit); with
    delay_s, one job as a one-off django-q2 Schedule that runs then (and deletes itself)."""
    if delay_s > 0:
        Schedule.objects.create(
            func=ROLLOUT_JOB, schedule_type=Schedule.ONCE, repeats=-1,
            next_run=timezone.now() + timedelta(seconds=delay_s),
        )
        return
    for _ in range(max(1, jobs)):
        enqueue(ROLLOUT_JOB, group="rollouts")


def _jobs_for(trajectory_count: int) -> int:
    """How many rollout jobs keep the cluster busy: each one runs ROLLOUT_CONCURRENCY at a time
    and claims more as slots free, so more jobs than worker processes add nothing."""
    per_job = max(1, settings.ROLLOUT_CONCURRENCY)
    workers = max(1, int(settings.Q_CLUSTER.get("workers") or 1))
    return max(1, min(-(-trajectory_count // per_job), workers))


def _check_startable(task: Task) -> None:
    if task.cancel_requested:
        raise TransitionError(f"task {task.pk} has a cancel request; re-queue it first")
    if task.status == Task.Status.QUEUED:
        return  # a new or re-queued task: an operator asked for it, max_iterations does not apply
    if task.status == Task.Status.REVIEWING and task.current_iteration < task.max_iterations:
        return
    if task.status == Task.Status.REVIEWING:
        raise TransitionError(f"task {task.pk} has used all {task.max_iterations} iterations")
    raise TransitionError(f"task {task.pk} is {task.status}; only queued or reviewing tasks start an iteration")


def _new_iteration(task: Task, now: Any) -> list["Trajectory"]:
    """Unsaved queued trajectories for the locked task's next iteration (config frozen now)."""
    iteration = task.current_iteration + 1
    snapshot = task.config_snapshot()
    trajectories = [
        Trajectory(
            task=task, iteration=iteration, sample_index=i, status=Trajectory.Status.QUEUED,
            config_snapshot=snapshot, queued_at=now,
        )
        for i in range(task.samples_per_iteration)
    ]
    for trajectory in trajectories:
        trajectory.content_sha256 = trajectory.compute_content_sha256()  # bulk_create skips save()
    task.current_iteration = iteration
    task.status = Task.Status.RUNNING
    task.started_at = task.started_at or now
    task.finished_at = None
    task.error = ""
    task.updated_at = now
    return trajectories


_START_FIELDS = ["current_iteration", "status", "started_at", "finished_at", "error", "updated_at"]


def task_start_iteration(*, task: Task, actor: Any = None) -> list["Trajectory"]:
    """Queue samples_per_iteration trajectories for the task's next iteration; the task runs.

    Allowed from queued (first iteration, or after a re-queue) and from reviewing (a next
    iteration, while iterations remain). A task already running is left alone (repeat call:
    no-op, no audit row). The rollout job is enqueued after commit.
    """
    _check_llm_models([task.model])
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.status == Task.Status.RUNNING:
            return []
        _check_startable(task)
        previous = task.status
        trajectories = Trajectory.objects.bulk_create(_new_iteration(task, timezone.now()))
        task.save(update_fields=_START_FIELDS)
        audit_record(
            "tasks.iteration_start",
            actor=actor,
            target=task,
            data={"from": previous, "iteration": task.current_iteration, "samples": len(trajectories)},
        )
        transaction.on_commit(dispatch_rollouts)
    return trajectories


ENQUEUE_CHUNK_SIZE = 500


def _check_llm_models(task_models: Iterable[str]) -> None:
    """Before any trajectory is queued: the configured models (and the tasks' own) must be ones
    the providers still serve; a retired name is an llm.ModelConfigError naming its replacement."""
    check_models(list(task_models))


def tasks_enqueue(*, batch: Batch | None = None, tasks: Any = None, actor: Any = None) -> int:
    """Start the next iteration of every queued task in `batch` (or the `tasks` queryset).

    Returns how many tasks started. Tasks in any other status, or with a cancel request, are
    skipped, so calling it twice starts nothing twice. One audit row for the whole call (the
    batch as target when given), then enough rollout jobs on commit to occupy the workers.
    """
    if (batch is None) == (tasks is None):
        raise ValueError("pass exactly one of batch= or tasks=")
    queryset = Task.objects.filter(batch=batch) if batch is not None else tasks
    _check_llm_models(queryset.filter(status=Task.Status.QUEUED, cancel_requested=False).exclude(model="")
                      .values_list("model", flat=True).distinct())
    started = 0
    samples = 0
    with transaction.atomic():
        pending = (
            queryset.filter(status=Task.Status.QUEUED, cancel_requested=False)
            # of=("self",): a caller's queryset may join the (nullable) batch, which PostgreSQL
            # cannot lock FOR UPDATE.
            .select_for_update(of=("self",))
            .order_by("-priority", "created_at", "id")
        )
        now = timezone.now()
        iterator = iter(pending)
        while chunk := list(islice(iterator, ENQUEUE_CHUNK_SIZE)):
            new: list[Trajectory] = []
            for task in chunk:
                new.extend(_new_iteration(task, now))
            Trajectory.objects.bulk_create(new, batch_size=ENQUEUE_CHUNK_SIZE)
            Task.objects.bulk_update(chunk, _START_FIELDS, batch_size=ENQUEUE_CHUNK_SIZE)
            batch_progress_changed(task.batch_id for task in chunk)  # bulk_update sends no post_save
            started += len(chunk)
            samples += len(new)
        if started:
            audit_record(
                "tasks.tasks_enqueue",
                actor=actor,
                target=batch,
                data={"tasks": started, "trajectories": samples},
            )
            jobs = _jobs_for(samples)
            transaction.on_commit(lambda: dispatch_rollouts(jobs=jobs))
    return started


REPLACED_CHARS = "replaced_chars"  # the step key counting characters replaced at write time


def _storable_result_fields(result: Any, error: str) -> tuple[dict[str, Any], dict[str, int]]:
    """The Trajectory columns an episode result (or an error) sets, made storable (secrets
    redacted, NUL bytes and lone surrogates replaced with U+FFFD: trajplatform.redaction.storable),
    and how many characters were replaced per column. A step whose own text had replacements
    carries the count under "replaced_chars", so an export says where the U+FFFD came from."""
    secrets = secret_values()
    replaced: dict[str, int] = {}

    def store(column: str, value: Any, labels: bool = False) -> Any:
        value, n = storable_count(value, labels=labels, _secrets=secrets)
        if n:
            replaced[column] = replaced.get(column, 0) + n
        return value

    Outcome = Trajectory.Outcome
    if result is None:
        reason = store("error", error or "the episode ended without a result", labels=True)
        fields: dict[str, Any] = {
            "status": Trajectory.Status.FINISHED, "outcome": Outcome.ERROR, "outcome_reason": reason, "error": reason,
        }
    else:
        steps = []
        for step in result.steps or []:
            before = replaced.get("steps", 0)
            step = store("steps", step)
            if replaced.get("steps", 0) > before and isinstance(step, dict):
                step[REPLACED_CHARS] = replaced["steps"] - before
            steps.append(step)
        # Model output and tool output are training data: keep labelled values (an agent may
        # write `password = ...` as part of its task), strip configured secrets and key shapes.
        fields = {
            "messages": store("messages", list(result.messages or [])),
            "tools": store("tools", list(result.tools or [])),
            "steps": steps,
            "final_answer": store("final_answer", result.final_answer or ""),
            "verifier_output": store("verifier_output", dict(result.verifier_output or {})),
            "outcome_reason": store("outcome_reason", result.outcome_reason or "", labels=True),
            "prompt_tokens": max(0, int(result.prompt_tokens or 0)),
            "completion_tokens": max(0, int(result.completion_tokens or 0)),
            "total_tokens": max(0, int(result.total_tokens or 0)),
            "cost_usd": Decimal(str(result.cost_usd or 0)),
            "model": store("model", result.model or "", labels=True)[:200],
        }
        if result.cancelled:
            fields.update(status=Trajectory.Status.CANCELLED, outcome="", reward=None)
            fields["outcome_reason"] = fields["outcome_reason"] or "cancelled"
        elif result.outcome in Outcome.values:
            fields.update(status=Trajectory.Status.FINISHED, outcome=result.outcome, reward=result.reward)
            if result.outcome == Outcome.ERROR:
                fields["error"] = fields["outcome_reason"]
        else:
            reason = f"the agent returned an unknown outcome {str(result.outcome)[:40]!r}"
            fields.update(status=Trajectory.Status.FINISHED, outcome=Outcome.ERROR, outcome_reason=reason,
                          error=reason, reward=None)
    content = Trajectory(**{k: v for k, v in fields.items() if k in Trajectory.CONTENT_FIELDS})
    fields["content_sha256"] = content.compute_content_sha256()
    return fields, replaced


def trajectory_finish(
    *, trajectory_id: int, claim_token: str, result: Any = None, error: str = ""
) -> "Trajectory | None":
    """Store the episode of a running trajectory this worker holds; None if the claim was lost.

    `result` is an `apps.engines.agent.EpisodeResult` (messages, tools, steps, final answer,
    outcome, reward, verifier output, tokens, cost, model; `cancelled` makes the trajectory
    cancelled instead of finished). With result=None the trajectory finishes as an error
    with `error` as the reason. Compare-and-swap on (running, claim_token): a worker the
    reaper gave up on changes nothing. When this was the iteration's last trajectory,
    `on_iteration_finished` moves the task on in the same transaction.
    """
    return trajectories_finish([{"trajectory_id": trajectory_id, "claim_token": claim_token, "result": result,
                                 "error": error}])[0]


def trajectories_finish(items: list[dict[str, Any]]) -> "list[Trajectory | None]":
    """`trajectory_finish` for several episodes in one transaction; per item (its keyword
    arguments) the stored trajectory or None. A worker stores the episodes that ended together
    this way: a dozen statements per episode become one UPDATE each plus a few for all, which
    matters when a hundred end within a second and each statement waits for the GIL.

    One item that cannot be stored makes the whole call raise (nothing is written): the caller
    then stores them one by one (apps.tasks.jobs.finish_together).
    """
    made = [_storable_result_fields(item.get("result"), item.get("error", "")) for item in items]
    fields = [values for values, _ in made]
    now = timezone.now()
    with transaction.atomic():
        task_of = dict(Trajectory.objects.filter(pk__in=[item["trajectory_id"] for item in items])
                       .values_list("pk", "task_id"))
        tasks = Task.objects.select_for_update().filter(pk__in=set(task_of.values())).order_by("pk").in_bulk()
        claimed = [
            item["trajectory_id"] for item, values in zip(items, fields)
            if item["trajectory_id"] in task_of and Trajectory.objects.filter(
                pk=item["trajectory_id"], status=Trajectory.Status.RUNNING, claim_token=item["claim_token"],
            ).update(finished_at=now, heartbeat_at=now, **values)
        ]
        # Not the episodes just written (they can be megabytes of JSON to decode again): callers
        # want their state; a deferred field still loads if one is read.
        stored = Trajectory.objects.defer(*_EPISODE_FIELDS).in_bulk(claimed)
        # The verifier output too: mobile_agent keeps the first screen there (no step shows it).
        artifacts.link_trajectories({item["trajectory_id"]: [values.get("steps"), values.get("messages"),
                                                             values.get("verifier_output")]
                                     for item, values in zip(items, fields) if item["trajectory_id"] in stored})
        for item in items:
            result = item.get("result")
            if item["trajectory_id"] in stored and getattr(result, "subepisodes", None):
                _store_subepisodes(stored[item["trajectory_id"]], result.subepisodes, now)
        notes = {
            item["trajectory_id"]: [("system", f"stored with {sum(replaced.values())} character(s) that cannot be "
                                    "stored (NUL bytes, lone surrogates) replaced by U+FFFD", {REPLACED_CHARS: replaced})]
            for item, (_, replaced) in zip(items, made) if replaced and item["trajectory_id"] in stored
        }
        if notes:
            trajectory_logs_append(batches=notes)
        ending = {(t.task_id, t.iteration) for t in stored.values()}
        ending = {(task_id, iteration) for task_id, iteration in ending
                  if (task := tasks.get(task_id)) is not None and task.status == Task.Status.RUNNING
                  and task.current_iteration == iteration}
        if ending:
            rows: dict[tuple[int, int], list[tuple[str, str]]] = {key: [] for key in ending}
            for task_id, iteration, status, outcome in Trajectory.objects.filter(
                task_id__in={task_id for task_id, _ in ending}
            ).values_list("task_id", "iteration", "status", "outcome"):
                if (task_id, iteration) in rows:
                    rows[(task_id, iteration)].append((status, outcome))
            for (task_id, _), states in sorted(rows.items()):
                if all(status in Trajectory.FINAL for status, _ in states):
                    on_iteration_finished(tasks[task_id], outcomes=Counter(o or s for s, o in states))
    return [stored.get(item["trajectory_id"]) for item in items]


_EPISODE_FIELDS = ("messages", "tools", "steps", "verifier_output", "config_snapshot")


def _store_subepisodes(parent: Any, results: list[Any], now: Any) -> None:
    """Inside the finishing transaction: a stored episode's sub-episodes (EpisodeResult.subepisodes)
    as its child trajectories, theirs under them; final, never claimed (Trajectory.parent)."""
    for result in results:
        values, _ = _storable_result_fields(result, "")
        child = Trajectory.all_objects.create(
            task_id=parent.task_id, iteration=parent.iteration, sample_index=parent.sample_index, parent=parent,
            role=str(result.role)[:100], label=str(result.label)[:200], parent_step=result.parent_step,
            config_snapshot=storable(dict(result.config or {})), worker=parent.worker,
            started_at=now - timedelta(milliseconds=max(0, int(result.duration_ms or 0))), finished_at=now,
            **values,
        )
        if result.subepisodes:
            _store_subepisodes(child, result.subepisodes, now)


def _maybe_finish_iteration(task: Task | None, iteration: int) -> None:
    """Inside a transaction, `task` read under select_for_update in it: if every trajectory of
    this (current) iteration is final, move the task on."""
    if task is None or task.status != Task.Status.RUNNING or task.current_iteration != iteration:
        return
    if Trajectory.objects.filter(task=task, iteration=iteration).exclude(status__in=Trajectory.FINAL).exists():
        return
    on_iteration_finished(task)


def on_iteration_finished(task: Task, *, outcomes: "Counter[str] | None" = None) -> Task:
    """Hand a finished iteration to the review agent: the task moves to "reviewing".

    Called (inside the finishing transaction, with the task row locked and running) when the
    last trajectory of the current iteration reaches a final state. The review job
    (apps.reviews.jobs.review_iteration, enqueued on commit by the receiver of
    apps.tasks.signals.iteration_finished) scores the iteration's
    trajectories and then completes the task, fails it, or proposes changes and starts the
    next iteration (see apps.reviews.services.iteration_conclude). `outcomes` (outcome or
    status -> count) when the caller has just read them.
    """
    if outcomes is None:
        rows = Trajectory.objects.filter(task=task, iteration=task.current_iteration).values_list("status", "outcome")
        outcomes = Counter(outcome or status for status, outcome in rows)
    task.status = Task.Status.REVIEWING
    task.error = ""
    task.save(update_fields=["status", "error", "updated_at"])
    audit_record(
        "tasks.iteration_finish",
        target=task,
        data={"iteration": task.current_iteration, "outcomes": dict(sorted(outcomes.items())), "status": task.status},
    )
    task_id, iteration = task.pk, task.current_iteration
    transaction.on_commit(lambda: iteration_finished.send(sender=Task, task_id=task_id, iteration=iteration))
    return task


def trajectory_reap(*, trajectory_id: int, max_worker_losses: int, stale_before: Any = None, dead_worker: str = "",
                    backoff_s: tuple[float, float] = (0.0, 0.0), dispatch: bool = True) -> str:
    """A running trajectory lost its worker: the process `dead_worker` that holds it is gone, or
    (stale_before) its heartbeat is older than that. Count the loss in `worker_losses` (not
    against the attempts) and queue it again, claimable after base * 2**(losses-1) seconds (at
    most max; backoff_s = (base, max)) and behind every trajectory queued before; after
    `max_worker_losses` losses finish it as an error. Returns "requeued", "abandoned" or "" (it
    moved on meanwhile: finished, re-claimed, or its heartbeat advanced)."""
    if not dead_worker and stale_before is None:
        raise ValueError("trajectory_reap needs dead_worker or stale_before")
    with transaction.atomic():
        task_id = Trajectory.objects.filter(pk=trajectory_id).values_list("task_id", flat=True).first()
        if task_id is None:
            return ""
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        trajectory = Trajectory.objects.select_for_update().get(pk=trajectory_id)
        last_sign = trajectory.heartbeat_at or trajectory.started_at
        if trajectory.status != Trajectory.Status.RUNNING:
            return ""
        if dead_worker and trajectory.worker != dead_worker:
            return ""
        if not dead_worker and last_sign is not None and last_sign >= stale_before:
            return ""
        since = f"{last_sign:%Y-%m-%d %H:%M:%S %Z}" if last_sign is not None else "it started"
        who = trajectory.worker or "unknown worker"
        what = f"{who}'s process is gone" if dead_worker else f"{who} sent no heartbeat since {since}"
        current = Trajectory.objects.filter(
            pk=trajectory.pk, status=Trajectory.Status.RUNNING, claim_token=trajectory.claim_token
        )
        now = timezone.now()
        losses = trajectory.worker_losses + 1
        data = {
            "worker": who,
            "last_heartbeat": last_sign.isoformat() if last_sign is not None else None,
            "process_gone": bool(dead_worker),
            "attempts": trajectory.attempts,
            "worker_losses": losses,
            "max_worker_losses": max_worker_losses,
        }
        if losses < max_worker_losses:
            base, most = backoff_s
            delay = min(most, base * 2 ** (losses - 1))
            data["delay_s"] = round(delay, 1)
            current.update(
                status=Trajectory.Status.QUEUED, worker="", claim_token="", heartbeat_at=None, started_at=None,
                queued_at=now + timedelta(seconds=delay), worker_losses=losses,
            )
            message = (f"worker lost: {what}; re-queued, claimable in {delay:.0f}s (worker loss {losses} of "
                       f"{max_worker_losses}; not counted against the attempts)")
            trajectory_log_append(trajectory_id=trajectory.pk, lines=[("system", message, data)])
            audit_record("tasks.rollout_requeue", target=trajectory, data=data)
            if dispatch:
                transaction.on_commit(lambda: dispatch_rollouts(delay_s=delay))
            return "requeued"
        reason = (f"worker lost: {what} (last worker {who}); gave up after {losses} worker losses "
                  f"(ROLLOUT_MAX_WORKER_LOSSES={max_worker_losses})")
        trajectory.outcome = Trajectory.Outcome.ERROR
        current.update(
            status=Trajectory.Status.FINISHED, outcome=Trajectory.Outcome.ERROR, outcome_reason=reason, error=reason,
            finished_at=now, content_sha256=trajectory.compute_content_sha256(), worker_losses=losses,
        )
        trajectory_log_append(trajectory_id=trajectory.pk, lines=[("error", reason, data)])
        audit_record("tasks.rollout_abandon", target=trajectory, data=data)
        _maybe_finish_iteration(task, trajectory.iteration)
        return "abandoned"


def trajectory_retry(*, trajectory_id: int, claim_token: str, reason: str, delay_s: float) -> "Trajectory | None":
    """Queue a running trajectory this worker holds again after a retryable error (LLM 5xx or
    429, a lost sandbox), claimable after delay_s; None if the claim was lost. The caller
    checks the attempt budget; the failed attempt's episode is not kept (its log lines are)."""
    reason = storable(reason)
    now = timezone.now()
    with transaction.atomic():
        claimed = Trajectory.objects.filter(
            pk=trajectory_id, status=Trajectory.Status.RUNNING, claim_token=claim_token
        ).update(
            status=Trajectory.Status.QUEUED, worker="", claim_token="", heartbeat_at=None, started_at=None,
            queued_at=now + timedelta(seconds=delay_s), error=f"retrying after: {reason}",
        )
        if not claimed:
            return None
        trajectory = Trajectory.objects.get(pk=trajectory_id)
        data = {"reason": reason, "attempts": trajectory.attempts, "delay_s": round(delay_s, 1)}
        trajectory_log_append(
            trajectory_id=trajectory_id,
            lines=[("system", f"retryable error ({reason}); queued again, claimable in {delay_s:.0f}s", data)],
        )
        audit_record("tasks.rollout_retry", target=trajectory, data=data)
        transaction.on_commit(lambda: dispatch_rollouts(delay_s=delay_s))
    return trajectory


def trajectory_logs_append(
    *, batches: dict[int, list[tuple[str, str, dict[str, Any]]]]
) -> dict[int, list["TrajectoryLog"]]:
    """Append live-log lines of many trajectories: one transaction, three queries.

    The trajectory rows are locked (in pk order) so a per-trajectory sequence never forks
    under two writers; each trajectory's lines get its next sequence numbers; messages and
    data are made storable (trajplatform.redaction.storable); each trajectory's group gets its
    own "log.lines" message after commit.
    Trajectories that no longer exist are skipped.
    """
    secrets = secret_values()
    # Made storable (secrets redacted, NUL and lone surrogates replaced: a line is never dropped
    # for its bytes) before the transaction: on SQLite the write lock is the whole database's.
    redacted = {
        pk: [(kind, storable(message, _secrets=secrets), storable(data, _secrets=secrets))
             for kind, message, data in lines]
        for pk, lines in batches.items() if lines
    }
    if not redacted:
        return {}
    with transaction.atomic():
        ids = list(
            Trajectory.objects.select_for_update().filter(pk__in=list(redacted)).order_by("pk").values_list("pk", flat=True)
        )
        last = dict(
            TrajectoryLog.objects.filter(trajectory_id__in=ids).order_by().values("trajectory_id")
            .annotate(last=Max("seq")).values_list("trajectory_id", "last")
        )
        rows = [
            TrajectoryLog(trajectory_id=pk, seq=last.get(pk, 0) + i, kind=kind, message=message, data=data)
            for pk in ids
            for i, (kind, message, data) in enumerate(redacted[pk], start=1)
        ]
        created: dict[int, list[TrajectoryLog]] = {}
        for row in TrajectoryLog.objects.bulk_create(rows):
            created.setdefault(row.trajectory_id, []).append(row)

        transaction.on_commit(lambda: send_to_groups(
            {trajectory_group_name(pk): pk for pk in created},
            lambda pk: {"type": "log.lines", "trajectory": pk, "lines": [row.as_message() for row in created[pk]]}))
    return created


# --- live batch progress (the batch page's websocket) ---------------------------------------


def batch_group_name(batch_id: int) -> str:
    """The channels group that a batch's progress events are sent to."""
    return f"batch-{batch_id}"


def batch_progress_message(batch_id: int) -> dict[str, Any]:
    """{"type": "batch.progress", "batch", "counts": {state: n, every state of selectors.TASK_STATES
    in order: the not started apart from the queued again}, "labels": {state: label}, "total", "final"}."""
    counts = batch_state_counts([batch_id])[batch_id]
    return {"type": "batch.progress", "batch": batch_id, "counts": counts, "labels": STATE_LABELS,
            "total": sum(counts.values()), "final": sum(counts[s] for s in Task.FINAL)}


# Per thread (a transaction and its on-commit callbacks run in one): batch id -> the tokens of the
# pending callbacks that may send its counts. The first of them to run after commit sends and
# removes the batch, so the others of that commit find nothing to send; a token whose callback
# was rolled back (with its transaction or savepoint) never runs, and goes with the next send.
_progress_pending = threading.local()


def batch_progress_changed(batch_ids: Iterable[int | None]) -> None:
    """A task or trajectory of these batches changed state: after commit, each batch's group gets
    its counts once, however many changes the transaction made (a batch cancel saves every task)."""
    ids = {pk for pk in batch_ids if pk}
    if not ids:
        return
    pending: dict[int, set[object]] | None = getattr(_progress_pending, "batches", None)
    if pending is None:
        pending = _progress_pending.batches = {}
    token = object()
    for pk in ids:
        pending.setdefault(pk, set()).add(token)

    def send() -> None:
        due = sorted(pk for pk in ids if token in pending.get(pk, ()))
        for pk in due:
            del pending[pk]
        if due:
            send_to_groups({batch_group_name(pk): pk for pk in due}, batch_progress_message)

    # robust: the change is committed whatever happens to its event (a broker down, a thread
    # running an event loop, where async_to_sync refuses): a failed send is logged, not raised.
    # Outside a transaction it runs now.
    transaction.on_commit(send, robust=True)


# --- creating tasks (the API) -----------------------------------------------------------------


class TaskCreateError(ValueError):
    """Items that failed validation; `errors` is a list of (field path, reason), e.g. ("tasks[2].prompt", ...)."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__(f"{len(errors)} invalid field(s): " + "; ".join(f"{f}: {r}" for f, r in errors[:5]))


class TaskCreateResult:
    """What tasks_create did: the batch, and per item the task and whether it was new."""

    def __init__(self, batch: Batch, tasks: list[Task], created: list[bool]):
        self.batch, self.tasks, self.created = batch, tasks, created


def _validated_items(items: list[Any], allowed_scenes: Any) -> list[dict[str, Any]]:
    errors: list[tuple[str, str]] = []
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        _shape, fields, problems = validate_task(item)
        errors.extend((f"tasks[{i}].{f}", r) for f, r in problems)
        if fields is None:
            continue
        errors.extend((f"tasks[{i}].{f}", r) for f, r in unstorable_fields(fields))
        if allowed_scenes is not None and fields["scene"] not in allowed_scenes:
            errors.append((f"tasks[{i}].scene", f"scene {fields['scene']!r} is not enabled on this platform; "
                           f"enabled: {', '.join(sorted(allowed_scenes)) or 'none'}"))
        external_id = fields.get("external_id", "")
        if external_id:
            if external_id in seen:
                errors.append((f"tasks[{i}].external_id", f"duplicate external id {external_id!r} (also tasks[{seen[external_id]}])"))
            seen.setdefault(external_id, i)
        rows.append(fields)
    if errors:
        raise TaskCreateError(errors)
    return rows


def tasks_create(
    *, items: list[Any], actor: Any, batch_name: str = "", notes: str = "", allowed_scenes: Any = None,
    source: str = "api",
) -> TaskCreateResult:
    """Validate and create tasks (the importers' rules, both item shapes) and start them after commit.

    All or nothing: any invalid item raises TaskCreateError listing every problem and writes
    nothing. With `batch_name`, the actor's batch of that name is reused (created if
    missing; race-safe: `batch_create`) and an item whose external id already exists in it
    returns that task instead of a duplicate; a batch of that name that is not the actor's batch
    from the same `source` ("api", or "pipeline" for generation pipelines) raises BatchNameTaken. Without it, a new batch is created. One "tasks.task_create" audit row per new
    task; the new tasks' first iterations are queued by `tasks_enqueue` (rollout jobs on commit).
    """
    if not isinstance(items, list) or not items:
        raise TaskCreateError([("tasks", "must be a non-empty list of task objects")])
    rows = list(_storable_task_rows(_validated_items(items, allowed_scenes)))
    user = actor if getattr(actor, "is_authenticated", False) else None
    batch_name = (batch_name or "").strip()[:200]
    with transaction.atomic():
        batch_fields = {"created_by": user, "source_name": source, "source_format": source, "notes": notes}
        if batch_name:
            batch, _ = batch_create(
                name=batch_name, **batch_fields,
                reuse=lambda b: b.source_format == source and b.created_by_id == getattr(user, "pk", None),
            )
        else:
            batch = batch_create_named_after(
                f"{source} {getattr(user, 'username', 'system')} {timezone.now():%Y-%m-%d %H:%M:%S}", **batch_fields)
        external_ids = [r["external_id"] for r in rows if r.get("external_id")]
        existing = {t.external_id: t for t in Task.objects.filter(batch=batch, external_id__in=external_ids)}
        now = timezone.now()
        new = [
            Task(batch=batch, created_by=user, status=Task.Status.QUEUED, queued_at=now, **fields)
            for fields in rows
            if not fields.get("external_id") or fields["external_id"] not in existing
        ]
        created_tasks = iter(Task.objects.bulk_create(new))
        batch_progress_changed([batch.pk] if new else [])
        tasks: list[Task] = []
        created: list[bool] = []
        for fields in rows:
            ext = fields.get("external_id")
            if ext and ext in existing:
                tasks.append(existing[ext])
                created.append(False)
            else:
                tasks.append(next(created_tasks))
                created.append(True)
        if new:
            batch.task_count = Task.objects.filter(batch=batch).count()
            batch.save(update_fields=["task_count"])
            for task in new:
                audit_record(
                    "tasks.task_create", actor=actor, target=task,
                    data={"batch": batch.pk, "scene": task.scene, "external_id": task.external_id},
                )
            tasks_enqueue(tasks=Task.objects.filter(pk__in=[t.pk for t in new]), actor=actor)
    fresh = Task.objects.in_bulk([t.pk for t in tasks])  # statuses after tasks_enqueue
    return TaskCreateResult(batch, [fresh[t.pk] for t in tasks], created)


def task_retry(*, task: Task, actor: Any, reason: str = "") -> Task:
    """The API's name for `task_requeue`: queue a failed or cancelled task again and start it."""
    return task_requeue(task=task, actor=actor, reason=reason)


def trajectory_attach_episode(*, task: Task, result: Any, source: dict[str, Any], actor: Any = None) -> "Trajectory":
    """Store an episode that already ran elsewhere (search2qa's deep_search solver) as the one queued
    trajectory of the task's current iteration, as a rollout worker would: claimed by compare-and-swap,
    then finished (`trajectories_finish`: the iteration ends and its review is enqueued on commit).
    `source` (what ran it: scene, task, trajectory) is stored in the audit row. Refused
    (TransitionError) unless the task's current iteration has exactly one trajectory, still queued."""
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        rows = list(Trajectory.objects.filter(task=task, iteration=task.current_iteration).values_list("pk", "status"))
        if len(rows) != 1 or rows[0][1] != Trajectory.Status.QUEUED:
            raise TransitionError(f"task {task.pk}: iteration {task.current_iteration} has {len(rows)} trajectories "
                                  f"({', '.join(sorted({s for _, s in rows})) or 'none'}); an episode is attached "
                                  "only to a single queued one")
        token, now = secrets.token_hex(16), timezone.now()
        pk = rows[0][0]
        if not Trajectory.objects.filter(pk=pk, status=Trajectory.Status.QUEUED).update(
                status=Trajectory.Status.RUNNING, worker=f"attached:{source.get('scene', '')}"[:200],
                claim_token=token, started_at=now, heartbeat_at=now):
            raise TransitionError(f"trajectory {pk} was claimed meanwhile")
        stored = trajectories_finish([{"trajectory_id": pk, "claim_token": token, "result": result}])[0]
        audit_record("tasks.trajectory_attach", actor=actor, target=stored,
                     data={"task": task.pk, "iteration": task.current_iteration, "outcome": stored.outcome,
                           "reward": stored.reward, "source": source})
    return stored


# --- the console's controls for whole batches --------------------------------------------------


def batch_cancel(*, batch: Batch, actor: Any, reason: str = "") -> int:
    """Cancel every unfinished task of the batch (`task_cancel` each: its audit row, its webhook);
    returns how many. A task that finished meanwhile is left as it is."""
    cancelled = 0
    with transaction.atomic():
        for task in Task.objects.filter(batch=batch).exclude(status__in=Task.FINAL).order_by("pk"):
            try:
                task_cancel(task=task, actor=actor, reason=reason)
            except TransitionError:
                continue
            cancelled += 1
    return cancelled


def batch_retry(*, batch: Batch, actor: Any, reason: str = "") -> int:
    """Queue every failed or cancelled task of the batch again (an audit row each) and start them
    in one `tasks_enqueue` (rollout jobs on commit); returns how many started."""
    with transaction.atomic():
        ids = [
            _requeue(task, actor, reason).pk
            for task in Task.objects.filter(batch=batch, status__in=[Task.Status.FAILED, Task.Status.CANCELLED])
            .order_by("pk")
        ]
        return tasks_enqueue(tasks=Task.objects.filter(pk__in=ids), actor=actor) if ids else 0


def task_saved(sender: Any, instance: Task, created: bool, update_fields: Any = None, **kwargs: Any) -> None:
    """post_save of Task (connected in apps.tasks.apps): a task saved with its status: its batch's
    progress group hears of it after commit. A signal because a dozen services in tasks and
    reviews save a task's status; the bulk writes (tasks_enqueue, tasks_create) call
    batch_progress_changed themselves."""
    if created or update_fields is None or "status" in update_fields:
        batch_progress_changed([instance.batch_id])
