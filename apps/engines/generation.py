"""What a scene that makes tasks declares, on the engine core's side: its generation pipeline's
stages, and the platform store it reads rows from and hands the tasks it makes to.

A scene imports only the engine core, so it describes its work as plain data and functions:

* a `Pipeline` of stages run per item (a seed, then whatever a fan-out stage made of it):
  `LLMStage` (a versioned prompt `Template`, an output JSON schema, an optional validator,
  bounded repair turns), `EpisodeStage` (one run of the shared agent loop with a scene config),
  `CodeStage` (a gate or transform, per item or over all live items at once); a stage drops an
  item by raising `Drop(reason)`, and `Pipeline.task` turns a surviving item into a task-file
  item. The pipelines layer (apps.engines.pipelines) runs it, stores every stage run and
  creates the tasks through the tasks services.
* `platform_store()`: the `PlatformStore`, installed once by the engine app (AppConfig.ready)
  from the pipelines layer: a pipeline reads the registered MCP servers and the prompts of
  existing tasks through it (toucan's plan and dedup), and a scene that emits a task from
  inside its episode (search2qa) hands it over; the store reads the apps' models and writes
  through the tasks services.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol


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


# The pseudo-stage that turns a surviving item into a task; its StageRun links the task.
TASK_STAGE = "task"


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


# -- the platform store --------------------------------------------------------------------------


class TaskSpecError(ValueError):
    """A task-file item the platform would refuse; `problems` lists (field, reason)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {r}" for f, r in problems))


class PlatformStore(Protocol):
    """The platform's rows as a scene sees them: the tasks and MCP servers that exist, and a way
    to add a task while an episode runs. Everything read is plain data."""

    def task_prompts(self, scene: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(prompt, scene_config) of every existing task of the scene."""

    def mcp_servers(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The registered, enabled MCP servers (all, or those of `names` that are), by name:
        {"name", "spec" (an McpServerSpec's dict), "labels", "tools" (the snapshot)}."""

    def task_config(self, item: dict[str, Any]) -> dict[str, Any]:
        """The episode config a task made of this task-file item runs with (its config
        snapshot); TaskSpecError when the item is invalid. Writes nothing."""

    def emit(self, item: dict[str, Any], *, source: str, trajectory: Any, attach: Any,
             batch_name: Callable[[str | None], str]) -> dict[str, Any]:
        """Create the item's task (or find it by its external id) in the batch
        `batch_name(name of the emitting trajectory's batch, or None)`, on behalf of the
        emitting trajectory's task creator; when it was created and `attach` is an episode
        result, that run becomes its first trajectory. Returns task_id, external_id, batch,
        created, trajectory_id and trajectory_uuid; TaskSpecError (nothing written) for an
        invalid item."""


_store: PlatformStore | None = None


def set_platform_store(store: PlatformStore | None) -> PlatformStore | None:
    """Install the platform store (the engine app does, once); returns the previous one."""
    global _store
    previous, _store = _store, store
    return previous


def platform_store() -> PlatformStore:
    """The installed platform store; RuntimeError when none is (the engine app is not loaded)."""
    if _store is None:
        raise RuntimeError("no platform store is installed: the apps.engines app installs it "
                           "(apps.engines.pipelines.store) when Django starts")
    return _store
