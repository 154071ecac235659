"""What a scene is to the platform: its declaration (`Scene`) and its runtime (`SceneRuntime`),
the part of it the shared agent loop (apps/engines/agent.py) runs.

Each scene package (apps/engines/scenes/<id>/) declares itself in its scene.py as one `Scene`:
id, texts, config schema, runtime ("module:Class"), review rubric, pipeline, export formats, docs
page. The scene registry (apps/engines/registry.py, above the scenes) collects the declarations
and installs itself here as the scene directory, so that the loop and a scene that composes
others (multi_agent) find a runtime by scene id through this module, which imports no scene.

A scene runtime provides tools, a system prompt, a sandbox spec, set-up, tool execution and
verification; it never runs its own copy of the loop. Its methods are synchronous (the
sandbox interface is), and the loop calls the ones that touch a sandbox in a worker thread
(`in_thread`), but for tool calls: the loop awaits `aexecute_tool`, which runs
`execute_tool` in a worker thread unless the runtime awaits the tool itself (code_exec's
run_shell awaits `Sandbox.arun`, which runs the command without a thread of its own).

    runtime = get_runtime("code_exec")          # NoEngineError for a scene without an engine
    runtime.tools(config)                       # OpenAI function schemas
    runtime.system_prompt(config)               # without hints: the loop appends those
    runtime.sandbox_spec(config)                # None: the scene needs no sandbox
    runtime.setup(sandbox, config)              # SetupError: the task's set-up is unusable
    runtime.execute_tool(name, args, sandbox, config, timeout=s) -> ToolResult
    await runtime.aexecute_tool(name, args, sandbox, config, timeout=s) -> ToolResult
    runtime.verify(sandbox, config, final_answer) -> (reward | None, verifier_output)
    runtime.is_finish(name); runtime.finish_answer(args)
    runtime.next_user_turn(config, final_answer) -> str | None   # after finish: a follow-up goes on
    runtime.transcript(config) -> None | {"messages", "steps", "tools"}   # after verify: what to store

Every hook runs inside an episode: `current_episode()` returns its `EpisodeContext` (also in
the worker threads the loop runs hooks in). Through it a runtime reads the episode's config,
recorded steps and messages, keeps per-episode state (`ctx.state`, e.g. the pages opened),
and runs sub-episodes of the same loop:

    ctx = current_episode()
    result = ctx.run_subepisode(child_config, label="explore")      # from a hook in a worker thread
    result = await ctx.arun_subepisode(child_config, label="solve")  # from aexecute_tool

`ctx.all_steps` adds the steps of the sub-episodes (after the step that ran them).
A sub-episode is one more episode of the shared loop (apps/engines/agent.py) with its own
config (scene, prompt, tools, limits): cancellation and the LLM client pass down, its live log
goes to the parent's (prefixed with its label), its model calls are cached under the parent's
identity plus "<label>#<n>" (so a retried or replayed parent replays its sub-episodes), its
token budget is what is left of the parent's, its wall clock is bounded by what is left of the
parent's while the parent's agent loop runs, and its tokens and cost are added to the parent's
totals. With `share_sandbox` (the default) and the parent's scene it works in the parent's
environment: its sandbox (set up once, destroyed with the parent) and its `ctx.state` (the device,
browser or toolset a runtime keeps there); otherwise it makes its own. It returns the
child's `EpisodeResult`; it is kept on the parent's result (`subepisodes`) and stored with it as
a child trajectory (apps.tasks.models.Trajectory.parent) unless `keep=False`; what else of it
the parent records is the caller's choice (a step's `ToolResult.extra`, the verifier output).

Two hooks for scenes that observe an environment (gui, mobile):

* `runtime.initial_observation(sandbox, config) -> str | list[content parts] | None`: a runtime
  that overrides it makes the loop wait for set-up before the first model turn (otherwise the
  sandbox is made while the model answers) and append its text to the task's prompt in the
  first user message (gui: the start page's URL, title and snapshot); image parts in a list
  (`{"type": "image_url", "image_url": {"url": "artifact:<sha>"}}`) follow as a user message
  of their own, for a vision episode only.
* image observations: `ToolResult.images` (artifact refs from trajplatform/artifacts.py) are
  kept on the step as `images`; when the config (or scene_config) says `vision: true`, after
  the turn's tool messages (text only) the loop adds a user message with the turn's last image
  as an OpenAI `image_url` content part. Messages and steps keep `artifact:<sha>` refs, never
  base64: the loop inlines them as data: URLs only in the copy it sends to the model.

Errors a runtime raises say whose fault they are: `ToolError` is the agent's (a missing
file, a bad path: the message goes back to the model as the tool's result);
`SandboxNotFound` / `SandboxUnavailable` (from the sandbox package) and
`InfrastructureError` are the platform's and end the episode as an error. Any other
`SandboxError` is checked by the loop: if the sandbox still answers, it is the agent's.
"""
from __future__ import annotations

import asyncio
import contextvars
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from jsonschema import Draft202012Validator

from apps.engines.sandboxes.base import in_thread


class ToolError(Exception):
    """The agent's call cannot be carried out (bad arguments, missing file); told to the model.

    `extra` lands in the failed step's record, as `ToolResult.extra` does in a successful one
    (e.g. the recorded exchange a replay needs: a live fetch that answered HTTP 404)."""

    def __init__(self, *args: Any, extra: dict[str, Any] | None = None):
        super().__init__(*args)
        self.extra = dict(extra or {})


class InfrastructureError(Exception):
    """The platform failed (not the agent): the episode ends as an error."""


class SetupError(Exception):
    """The task's set-up cannot be applied (e.g. a setup file outside the workspace)."""


class NoEngineError(LookupError):
    """The scene has no runtime (yet), or is not a scene at all."""


MAX_SUBEPISODE_DEPTH = 3


class EpisodeContext:
    """What a runtime may see of the episode it serves: `current_episode()` inside any hook.

    `config`, `steps`, `messages` and `sandbox` are the episode's own (read them, do not
    change them); `state` is scratch space the runtime owns for this episode; `depth` is 0 for
    a top-level episode and one more for each level of sub-episode, `label` the sub-episode's
    label ("" at the top)."""

    def __init__(self, host: Any, *, depth: int = 0, label: str = ""):
        self._host = host  # the loop's episode (apps.engines.agent._Episode)
        self.depth = depth
        self.label = label
        self.state: dict[str, Any] = {}

    @property
    def config(self) -> dict[str, Any]:
        return self._host.config

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self._host.result.steps

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self._host.result.messages

    @property
    def sandbox(self) -> Any:
        return self._host.sandbox

    @property
    def trajectory(self) -> Any:
        """The Trajectory row the episode is stored on (a sub-episode: its parent's); None when the
        caller runs the loop without one (tests, bench). Read it; write through the task services."""
        return self._host.trajectory

    def time_left(self) -> float:
        """Seconds left of the episode's wall clock (`timeout_s` from the start of its agent loop;
        negative once spent). A verifier that runs sub-episodes bounds them with it: the worker
        stops the whole episode, verifier included, a grace period after that clock."""
        return self._host.deadline - time.monotonic()

    @property
    def llm(self) -> Any:
        """The episode's LLM client, for a runtime's own model call (e.g. a page reader); count
        it with `count_model_call` so the episode's tokens and cost include it."""
        return self._host.llm

    def count_model_call(self, chat: Any) -> None:
        """Add a runtime's own model call (an `llm.ChatResult`) to the episode's totals."""
        self._host.count_model_call(chat)

    @property
    def subepisodes(self) -> list[Any]:
        """The EpisodeResults of the sub-episodes this episode kept so far, in the order they ended."""
        return self._host.result.subepisodes

    @property
    def all_steps(self) -> list[dict[str, Any]]:
        """The episode's steps and, after each step that ran sub-episodes, theirs (recursively):
        everything the episode did, e.g. for a verifier asking which pages were opened."""
        return _with_children(self._host.result)

    async def arun_subepisode(self, config: dict[str, Any], *, label: str, share_sandbox: bool = True,
                              keep: bool = True) -> Any:
        """Run a sub-episode of the shared loop (see the module docstring); its EpisodeResult.
        With `keep` it is stored with the episode as a child trajectory (role: config "role",
        else the label); without, only what the caller records of it remains."""
        if self.depth >= MAX_SUBEPISODE_DEPTH:
            raise ToolError(f"sub-episodes nest at most {MAX_SUBEPISODE_DEPTH} deep")
        return await self._host.subepisode(config, label=label, share_sandbox=share_sandbox, keep=keep)

    def run_subepisode(self, config: dict[str, Any], *, label: str, share_sandbox: bool = True,
                       keep: bool = True) -> Any:
        """`arun_subepisode` for a hook running in a worker thread (execute_tool, verify):
        blocks until the sub-episode ends. Not callable on the episode's event loop itself."""
        loop = self._host.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("run_subepisode blocks: on the event loop, await arun_subepisode instead")
        future = asyncio.run_coroutine_threadsafe(
            self.arun_subepisode(config, label=label, share_sandbox=share_sandbox, keep=keep), loop)
        return future.result()


def _with_children(result: Any) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    children: dict[int | None, list[Any]] = {}
    for child in result.subepisodes:
        children.setdefault(child.parent_step, []).append(child)
    for step in result.steps:
        steps.append(step)
        for child in children.pop(step.get("index"), []):
            steps.extend(_with_children(child))
    for rest in children.values():  # run by the verifier, or by a step that did not finish
        for child in rest:
            steps.extend(_with_children(child))
    return steps


_current: contextvars.ContextVar[EpisodeContext] = contextvars.ContextVar("trajplatform_episode")


def current_episode() -> EpisodeContext:
    """The episode a runtime hook serves; LookupError outside an episode."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("not inside an episode of the shared loop") from None


def enter_episode(context: EpisodeContext) -> contextvars.Token[EpisodeContext]:
    """For the loop: make `context` current (undo with `leave_episode(token)`)."""
    return _current.set(context)


def leave_episode(token: contextvars.Token[EpisodeContext]) -> None:
    _current.reset(token)


@dataclass
class ToolResult:
    """One tool call's result. `output` is the text for the model (the loop caps its length).

    `exit_code` is a real process status or None (no process ran, or it was killed on its
    deadline): never derived from anything else. `extra` lands in the step record. `images`
    are image observations, artifact refs (trajplatform/artifacts.py `store`): the step keeps
    them as `images`, and a vision episode shows the model the turn's last one.
    """

    output: str
    exit_code: int | None = None
    duration_ms: int = 0
    truncated: bool = False
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    images: list[dict[str, Any]] = field(default_factory=list)


class SceneRuntime:
    """Base class of scene runtimes; subclasses set `scene_id` and implement the hooks."""

    scene_id: str = ""
    finish_tool: str = "finish"

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def system_prompt(self, config: dict[str, Any]) -> str:
        raise NotImplementedError

    def sandbox_spec(self, config: dict[str, Any]) -> Any:
        """A SandboxSpec for this episode, or None when the scene needs no sandbox."""
        return None

    def setup(self, sandbox: Any, config: dict[str, Any]) -> None:
        """Prepare the sandbox before the agent's first turn."""

    def initial_observation(self, sandbox: Any, config: dict[str, Any]) -> str | list[dict[str, Any]] | None:
        """What the model sees of the environment before its first turn (see the module
        docstring); only a runtime that overrides this makes the first turn wait for set-up."""
        return None

    def execute_tool(
        self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        raise NotImplementedError

    async def aexecute_tool(
        self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        """`execute_tool` for the agent loop, which awaits it; the same arguments, result and errors.

        This default runs `execute_tool` in a worker thread (`in_thread`). A runtime overrides
        it for the tools it can await without a thread, and hands the others to this one."""
        return await in_thread(self.execute_tool, name, args, sandbox, config, timeout=timeout)

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        """(reward, verifier_output) after finish; (None, {}) when the task has no verifier."""
        return None, {}

    def next_user_turn(self, config: dict[str, Any], final_answer: str) -> str | None:
        """Asked after each finish: the user's next request (appended as a user message, the
        episode goes on) or None (the episode ends and is verified)."""
        return None

    def transcript(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """Asked after verify: None stores the episode as it ran; a dict {"messages", "steps",
        "tools"} is stored instead (a runtime that generates the dialogue, e.g. toolace's mt mode,
        keeping the generation conversation in its verifier output)."""
        return None

    def is_finish(self, name: str) -> bool:
        return name == self.finish_tool

    def finish_answer(self, args: dict[str, Any]) -> str:
        answer = args.get("answer", "")
        return answer if isinstance(answer, str) else str(answer)


# -- the declaration ---------------------------------------------------------------------------

# The review rubric's criteria most scenes share (the judge scores each criterion 0-100).
GENERIC_RUBRIC: dict[str, str] = {
    "tool_usage": "chooses fitting tools and calls them with correct arguments",
    "reasoning": "thoughts are relevant, correct and lead to the actions",
    "error_handling": "notices failed commands or tool errors and recovers from them",
    "completeness": "the task is fully solved and the final answer states the result",
}
EFFICIENCY_CRITERION = {"efficiency": "reaches the goal without wasted or repeated steps"}
TOOL_SELECTION_CRITERION = {"tool_selection": "picks the right tool for each sub-goal"}


@dataclass(frozen=True)
class Scene:
    """Everything the platform needs about one scene, declared in its package's scene.py as `SCENE`.

    `check`: rules the schema cannot say, "module:function" given the config (schema-valid,
    defaults filled in) and returning (field, reason) pairs. `runtime`: "module:Class" of its
    SceneRuntime. `check`, `runtime` and `pipeline` ("module:function" building its generation
    Pipeline from a run's config) are imported on first use. `rubric`: the judge's criteria;
    `rubric_version` changes whenever they do (judge answers are cached per scene@version).
    `export_formats`: the export formats made for this scene's records (a format some scenes
    declare takes only their records). `docs`: the scene's page. `order`: its place in the
    scene lists (the console, the API's /scenes, model choices)."""

    id: str
    title: str
    description: str
    config_schema: dict[str, Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    required_params: tuple[str, ...] = ()
    check: str = ""
    runtime: str = ""
    rubric: dict[str, str] = field(default_factory=lambda: dict(GENERIC_RUBRIC))
    rubric_version: str = "1"
    pipeline: str | None = None
    export_formats: tuple[str, ...] = ()
    docs: str = ""
    order: int = 1000

    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.config_schema)


class SceneConfigError(ValueError):
    """A scene config that does not match its scene's schema; `errors` is a list of (field, reason)."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors))


# JSON-schema pieces the declarations share.
STR: dict[str, Any] = {"type": "string"}
STR_LIST: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
FILES: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}, "description": "path -> file content"}


def schema_object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A closed JSON object: these properties only."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


# -- the scene directory -------------------------------------------------------------------------

class SceneDirectory(Protocol):
    """What the loop and composing scenes ask of the scene registry (apps.engines.registry)."""

    def scene_ids(self) -> list[str]: ...
    def get_runtime(self, scene_id: str) -> SceneRuntime: ...
    def has_runtime(self, scene_id: str) -> bool: ...
    def validate_scene_config(self, scene_id: str, config: Any) -> dict[str, Any]: ...


_directory: SceneDirectory | None = None


def install_scene_directory(directory: SceneDirectory) -> None:
    """Called by the scene registry when it loads (apps.engines.registry)."""
    global _directory
    _directory = directory


def scene_directory() -> SceneDirectory:
    if _directory is None:
        raise NoEngineError("no scene registry loaded (apps.engines.registry installs it on import)")
    return _directory


def get_runtime(scene_id: str) -> SceneRuntime:
    """The runtime of a scene; NoEngineError("scene X has no engine yet") when there is none."""
    return scene_directory().get_runtime(scene_id)


def has_runtime(scene_id: str) -> bool:
    return scene_directory().has_runtime(scene_id)


def validate_scene_config(scene_id: str, config: Any) -> dict[str, Any]:
    """The config with the scene's defaults filled in, or SceneConfigError (the registry's rules)."""
    return scene_directory().validate_scene_config(scene_id, config)
