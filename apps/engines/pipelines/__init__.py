"""Generation pipelines: the LLM calls, agent episodes and code gates a scene runs to make its tasks.

A `Pipeline` is an ordered list of stages run per item (a seed, then whatever a fan-out stage
made of it):

* `LLMStage`: a versioned prompt `Template`, an output JSON schema, an optional validator, and
  bounded repair turns (the validation error is sent back); an item whose output is still
  invalid is dropped with the reason stored, never passed on;
* `EpisodeStage`: one run of the shared agent loop (`apps.engines.agent.run_episode`) with a
  scene config; an optional validator gates on its result;
* `CodeStage`: a Python gate or transform, per item or over all live items at once (`scope="all"`,
  e.g. dedup); it drops an item by raising `Drop(reason)`.

Every stage run is a `StageRun` row (inputs, prompt hash, raw and parsed output, validator result,
tokens, cost); a run resumed after a crash reuses every stage that finished. Each surviving item
becomes a task through `apps.tasks.services.tasks_create` (validation, audit rows), linked to the
`StageRun` that emitted it. See docs/pipelines.md; the runner is `apps.engines.pipelines.runner`,
writes are in `.services`, the worker job and its reaper in `.jobs`. The layer's other code that
creates tasks: `.store`, the platform store scenes read rows from and emit tasks to (installed
by EnginesConfig.ready), and `.envscaler`, the EnvScaler import.

A scene builds its pipeline with the classes of `apps.engines.generation` (engine core) and
declares it in its scene.py as `pipeline="module:function"` (`PIPELINES`, from the scene registry);
the function takes the run's config and returns a `Pipeline`.
"""
from __future__ import annotations

import importlib
from typing import Any

# The declarations a scene builds its pipeline from (Template, LLMStage, ...) live in the engine
# core, apps.engines.generation: scenes import only the core.
from apps.engines.generation import Pipeline, PipelineError
from apps.engines.registry import PIPELINES, SCENES

__all__ = ["PIPELINES", "pipeline_for"]


def pipeline_for(scene: str, config: dict[str, Any] | None = None) -> Pipeline:
    """The scene's registered Pipeline for this config; PipelineError for a scene without one."""
    target = PIPELINES.get(scene)
    if target is None:
        if scene not in SCENES:
            raise PipelineError(f"unknown scene {scene!r}; scenes: {', '.join(SCENES)}")
        raise PipelineError(f"scene {scene} has no generation pipeline yet")
    module, _, attr = target.partition(":")
    pipeline = getattr(importlib.import_module(module), attr)(dict(config or {}))
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(f"{target} returned {type(pipeline).__name__}, not a Pipeline")
    return pipeline
