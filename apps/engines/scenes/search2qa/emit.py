"""search2qa's product: a deep_search task per verified pair, with its executed answering run.

    item = task_item(search2qa_config, qa, generation(search2qa_config, rounds, gates))
    config = solver_config(item)                       # the episode config of the emitted task
    emitted = emit_task(search2qa_config, item, solver, gates)

The deep_search solver of the difficulty stage runs with exactly the config the emitted task will
have (the platform store's `task_config` of the item: the config snapshot of the task it validates
to), so the run that passed is a rollout of that task, and it is stored as the task's first
trajectory: it is reviewed, exported and paired like any other rollout. Without a solver run
(difficulty_check off or no_tool) the task is created and queued for the workers like any new
task.

The scene writes nothing itself: it hands the item to the platform store
(apps.engines.generation.platform_store(), installed by the engine app: apps/engines/pipelines/store.py),
which creates it through the tasks services (validation, audit rows) in the output batch
(`scene_config.output_batch`, default "<search2qa batch>-qa"), with external id
`search2qa-<sha256 of the normalised question and answer>`: a pair made again (a retried or
re-iterated search2qa trajectory) finds its task instead of making a second one, and nothing is
attached twice.
"""
from __future__ import annotations

import hashlib
from typing import Any

from apps.engines.generation import TaskSpecError, platform_store
from apps.engines.runtime import SetupError, current_episode
from apps.engines.scenes.search2qa.config import settings_of
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
    s = settings_of(config)
    trajectory = current_episode().trajectory
    return {"pipeline": EMIT_SOURCE, "seed": s.get("seed"), "qa_mode": s["qa_mode"], "rounds": rounds,
            "source_task": getattr(trajectory, "task_id", None),
            "source_trajectory": str(trajectory.uuid) if trajectory is not None else None,
            "gates": [{"name": g["name"], "passed": g["passed"], "reason": g["reason"]} for g in gates]}


def task_item(config: dict[str, Any], qa: dict[str, Any], made: dict[str, Any]) -> dict[str, Any]:
    """The emitted deep_search task, as a task-file item (apps.tasks.importers shape)."""
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


def solver_config(item: dict[str, Any]) -> dict[str, Any]:
    """The config of the deep_search solver sub-episode: the emitted task's config snapshot."""
    try:
        return platform_store().task_config(item)
    except TaskSpecError as exc:
        raise SetupError(f"the emitted deep_search task is invalid: {exc}") from None


def emit_task(config: dict[str, Any], item: dict[str, Any], solver: Any, gates: list[dict[str, Any]]) -> dict[str, Any]:
    """Create (or find) the pair's deep_search task (`item`) and attach the solver's run; what was done."""
    s = settings_of(config)

    def batch_name(source_batch: str | None) -> str:
        # The output batch: as configured, else the factory task's batch with "-qa", else the default.
        if s.get("output_batch"):
            return s["output_batch"]
        return f"{source_batch}-qa" if source_batch else DEFAULT_BATCH

    try:
        emitted = platform_store().emit(item, source=EMIT_SOURCE, trajectory=current_episode().trajectory,
                                    attach=solver, batch_name=batch_name)
    except TaskSpecError as exc:  # nothing was written
        raise SetupError(f"the emitted deep_search task is invalid: {exc}") from None
    return {**emitted, "passed_gates": [g["name"] for g in gates if g["passed"]]}
