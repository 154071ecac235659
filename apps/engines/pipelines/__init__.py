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
writes are in `.services`, the worker job and its reaper in `.jobs`.

Scenes register their pipeline in `PIPELINES` as "module:function"; the function takes the run's
config and returns a `Pipeline`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

# scene -> "module:function" building its Pipeline from a run's config.
PIPELINES: dict[str, str] = {
    "toucan": "apps.engines.scenes.toucan.pipeline:build",
    "toolace": "apps.engines.scenes.toolace.pipeline:build",
}


class PipelineError(Exception):
    """A pipeline that cannot run as configured (unknown scene, bad definition, bad seeds)."""


class Drop(Exception):
    """Raised by a code stage or validator: the item leaves the pipeline, with this reason."""


def stage_route(template_id: str, item_key: str, repair: int = 0) -> str:
    """The route of an llm stage's model calls (`with apps.engines.llm.llm_route(...)`): sent to
    the offline stand-in only, as a request header, never in the prompt."""
    return f"pipeline:{template_id} key={item_key}" + (f" repair={repair}" if repair else "")


@dataclass(frozen=True)
class Template:
    """A prompt with an identity: `id` names it in key lines and StageRuns, `version` changes
    whenever its text does. `user(inputs)` renders the user message; `system` is fixed text."""

    id: str
    version: str
    user: Callable[[dict[str, Any]], str]
    system: str = ""


def _whole_state(state: dict[str, Any]) -> dict[str, Any]:
    return state


@dataclass(frozen=True)
class Stage:
    name: str
    # What the stage sees of the item's state (the seed under "seed", then each earlier
    # stage's output under its name); stored as the StageRun's inputs.
    inputs: Callable[[dict[str, Any]], dict[str, Any]] = _whole_state
    # A fan-out stage's output is a list; each element becomes an item of its own
    # (key "<parent>.<i>", or "<parent>.<element id>" when elements carry an "id").
    fan_out: bool = False
    kind: str = field(default="", init=False)


@dataclass(frozen=True)
class LLMStage(Stage):
    template: Template | None = None
    schema: dict[str, Any] = field(default_factory=dict)
    # (parsed output, inputs) -> None, or raise Drop(reason) / return an error string.
    validator: Callable[[Any, dict[str, Any]], str | None] | None = None
    repairs: int = 1
    temperature: float | None = 0.0
    max_tokens: int | None = None
    kind: str = field(default="llm", init=False)


@dataclass(frozen=True)
class EpisodeStage(Stage):
    # inputs -> an episode config (the shape of Task.config_snapshot()).
    config: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    validator: Callable[[dict[str, Any], dict[str, Any]], str | None] | None = None
    kind: str = field(default="episode", init=False)


@dataclass(frozen=True)
class CodeStage(Stage):
    # scope "item": fn(inputs) -> output. scope "all": fn({item key: inputs}) -> {item key:
    # output or a Drop}; an item missing from the answer is dropped.
    fn: Callable[[Any], Any] | None = None
    scope: str = "item"
    kind: str = field(default="code", init=False)


@dataclass(frozen=True)
class Pipeline:
    """Stages in order, and how a surviving item becomes a task (a trajplatform task object)."""

    name: str
    stages: tuple[Stage, ...]
    task: Callable[[str, dict[str, Any]], dict[str, Any]]
    # seed -> its item key; default: the seed's "id", else its position.
    seed_key: Callable[[Any, int], str] | None = None

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        if not names or len(set(names)) != len(names) or TASK_STAGE in names:
            raise PipelineError(f"pipeline {self.name!r}: stage names must be unique, non-empty and not "
                                f"{TASK_STAGE!r}: {names}")
        for stage in self.stages:
            missing = {"llm": ("template",), "episode": ("config",), "code": ("fn",)}[stage.kind]
            if any(getattr(stage, attr) is None for attr in missing):
                raise PipelineError(f"pipeline {self.name!r}: stage {stage.name!r} needs {', '.join(missing)}")
            if isinstance(stage, CodeStage) and stage.scope not in ("item", "all"):
                raise PipelineError(f"stage {stage.name!r}: scope must be 'item' or 'all'")
            if isinstance(stage, CodeStage) and stage.scope == "all" and stage.fan_out:
                raise PipelineError(f"stage {stage.name!r}: a scope='all' stage cannot fan out")


# The pseudo-stage that turns a surviving item into a task; its StageRun links the task.
TASK_STAGE = "task"


def pipeline_for(scene: str, config: dict[str, Any] | None = None) -> Pipeline:
    """The scene's registered Pipeline for this config; PipelineError for a scene without one."""
    target = PIPELINES.get(scene)
    if target is None:
        from apps.engines.registry import SCENES

        if scene not in SCENES:
            raise PipelineError(f"unknown scene {scene!r}; scenes: {', '.join(SCENES)}")
        raise PipelineError(f"scene {scene} has no generation pipeline yet")
    module, _, attr = target.partition(":")
    pipeline = getattr(importlib.import_module(module), attr)(dict(config or {}))
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(f"{target} returned {type(pipeline).__name__}, not a Pipeline")
    return pipeline
