"""search2qa's product: a deep_search task per verified pair, with its executed answering run.

    config = solver_config(search2qa_config, qa)       # the episode config of the emitted task
    emitted = emit_task(search2qa_config, qa, solver, gates)

The deep_search solver of the difficulty stage runs with exactly the config the emitted task will
have (`Task(**fields).config_snapshot()` of the validated item), so the run that passed is a
rollout of that task, and it is stored as the task's first trajectory
(`apps.tasks.services.trajectory_attach_episode`): it is reviewed, exported and paired like any
other rollout. Without a solver run (difficulty_check off or no_tool) the task is created and
queued for the workers like any new task.

The task goes to the output batch (`scene_config.output_batch`, default "<search2qa batch>-qa")
through `tasks_create` (validation, audit rows), with external id `search2qa-<sha256 of the
normalised question and answer>`: a pair made again (a retried or re-iterated search2qa
trajectory) finds its task instead of making a second one, and nothing is attached twice.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
from typing import Any

from apps.engines.runtime import SetupError, current_episode
from apps.engines.scenes.search2qa.gates import normalize_answer
from apps.engines.web.toolset import web_settings

EMIT_SOURCE = "search2qa"
DEFAULT_BATCH = "search2qa-output"


def external_id(qa: dict[str, Any]) -> str:
    key = f"{normalize_answer(qa['question'])}\n{normalize_answer(qa['answer'])}"
    return "search2qa-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def generation(config: dict[str, Any], rounds: int, gates: list[dict[str, Any]]) -> dict[str, Any]:
    """How the pair was made, carried in the emitted task's scene_config (the QA export reads it):
    the seed, the search2qa task and trajectory, the evolution rounds and the gates it passed
    before the deep_search solver ran (that solver's passing run is the task's first trajectory)."""
    from apps.engines.scenes.search2qa.runtime import settings_of

    s = settings_of(config)
    trajectory = current_episode().trajectory
    return {"pipeline": EMIT_SOURCE, "seed": s.get("seed"), "qa_mode": s["qa_mode"], "rounds": rounds,
            "source_task": getattr(trajectory, "task_id", None),
            "source_trajectory": str(trajectory.uuid) if trajectory is not None else None,
            "gates": [{"name": g["name"], "passed": g["passed"], "reason": g["reason"]} for g in gates]}


def task_item(config: dict[str, Any], qa: dict[str, Any], made: dict[str, Any]) -> dict[str, Any]:
    """The emitted deep_search task, as a task-file item (apps.tasks.importers shape)."""
    from apps.engines.scenes.search2qa.runtime import settings_of

    s = settings_of(config)
    sources = list(dict.fromkeys(e["url"] for e in qa.get("evidence") or []))
    scene_config: dict[str, Any] = {"expected_answer": qa["answer"], "aliases": list(qa.get("aliases") or []),
                                    "sources": sources, "generation": made}
    scene_config["web"] = web_settings(config)  # the corpus named, not left to a default that may change
    item: dict[str, Any] = {
        "external_id": external_id(qa), "scene": "deep_search", "prompt": qa["question"], "config": scene_config,
        "max_steps": int(s["solver_max_steps"]), "samples_per_iteration": 1,
    }
    for key in ("model", "temperature", "top_p", "step_timeout_s", "timeout_s", "max_tokens"):
        if config.get(key) not in (None, ""):
            item[key] = config[key]
    return item


def _validated_fields(item: dict[str, Any]) -> dict[str, Any]:
    from apps.tasks.importers import validate_task

    _shape, fields, problems = validate_task(item)
    if problems or fields is None:
        reasons = "; ".join(f"{f}: {r}" for f, r in problems)
        raise SetupError(f"the emitted deep_search task is invalid: {reasons}")
    return fields


def solver_config(item: dict[str, Any]) -> dict[str, Any]:
    """The config of the deep_search solver sub-episode: the emitted task's config snapshot."""
    from apps.tasks.models import Task

    return Task(**_validated_fields(item)).config_snapshot()


def _in_own_thread(fn: Any) -> Any:
    """Run database work in a thread of its own that closes its connection: the hook's worker
    thread is the event loop's executor, shared with other episodes."""

    def work() -> Any:
        from django.db import connections

        try:
            return fn()
        finally:
            connections.close_all()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="search2qa-emit") as pool:
        return pool.submit(work).result()


def emit_task(config: dict[str, Any], item: dict[str, Any], solver: Any, gates: list[dict[str, Any]]) -> dict[str, Any]:
    """Create (or find) the pair's deep_search task (`item`) and attach the solver's run; what was done."""
    from apps.engines.scenes.search2qa.runtime import settings_of

    trajectory = current_episode().trajectory
    _validated_fields(item)  # a config error before anything is written
    s = settings_of(config)

    def write() -> dict[str, Any]:
        from django.db import transaction

        from apps.tasks.models import Trajectory
        from apps.tasks.services import tasks_create, trajectory_attach_episode

        origin: dict[str, Any] = {"scene": EMIT_SOURCE}
        actor = None
        batch_name = s.get("output_batch") or DEFAULT_BATCH
        if trajectory is not None:
            row = Trajectory.objects.select_related("task__batch", "task__created_by").get(pk=trajectory.pk)
            origin.update(task=row.task_id, trajectory=str(row.uuid))
            actor = row.task.created_by
            if not s.get("output_batch") and row.task.batch is not None:
                batch_name = f"{row.task.batch.name}-qa"
        with transaction.atomic():
            result = tasks_create(items=[item], actor=actor, batch_name=batch_name, source=EMIT_SOURCE)
            task, created = result.tasks[0], result.created[0]
            attached = None
            if created and solver is not None:
                attached = trajectory_attach_episode(task=task, result=solver, source=origin, actor=actor)
        return {"task_id": task.pk, "external_id": task.external_id, "batch": result.batch.name, "created": created,
                "trajectory_id": attached.pk if attached is not None else None,
                "trajectory_uuid": str(attached.uuid) if attached is not None else None,
                "passed_gates": [g["name"] for g in gates if g["passed"]]}

    return _in_own_thread(write)
