"""What a scene gives the shared agent loop (apps/engines/agent.py), and the registry of them.

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

Errors a runtime raises say whose fault they are: `ToolError` is the agent's (a missing
file, a bad path: the message goes back to the model as the tool's result);
`SandboxNotFound` / `SandboxUnavailable` (from the sandbox package) and
`InfrastructureError` are the platform's and end the episode as an error. Any other
`SandboxError` is checked by the loop: if the sandbox still answers, it is the agent's.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from apps.engines.sandboxes.base import in_thread
from apps.engines.scenes import SCENES


class ToolError(Exception):
    """The agent's call cannot be carried out (bad arguments, missing file); told to the model."""


class InfrastructureError(Exception):
    """The platform failed (not the agent): the episode ends as an error."""


class SetupError(Exception):
    """The task's set-up cannot be applied (e.g. a setup file outside the workspace)."""


class NoEngineError(LookupError):
    """The scene has no runtime (yet), or is not a scene at all."""


@dataclass
class ToolResult:
    """One tool call's result. `output` is the text for the model (the loop caps its length).

    `exit_code` is a real process status or None (no process ran, or it was killed on its
    deadline): never derived from anything else. `extra` lands in the step record.
    """

    output: str
    exit_code: int | None = None
    duration_ms: int = 0
    truncated: bool = False
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


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

    def is_finish(self, name: str) -> bool:
        return name == self.finish_tool

    def finish_answer(self, args: dict[str, Any]) -> str:
        answer = args.get("answer", "")
        return answer if isinstance(answer, str) else str(answer)


# scene id -> "module:Class"; imported on first use so the registry costs nothing to load.
RUNTIMES: dict[str, str] = {
    "code_exec": "apps.engines.code_exec:CodeExecRuntime",
    "envscaler": "apps.engines.envscaler.runtime:EnvScalerRuntime",
    "toucan": "apps.engines.toucan.runtime:ToucanRuntime",
}
_instances: dict[str, SceneRuntime] = {}


def register_runtime(scene_id: str, target: str | type[SceneRuntime]) -> None:
    """Register a runtime class (or its "module:Class" path) for a scene id."""
    _instances.pop(scene_id, None)
    if isinstance(target, str):
        RUNTIMES[scene_id] = target
    else:
        RUNTIMES[scene_id] = f"{target.__module__}:{target.__qualname__}"
        _instances[scene_id] = target()


def has_runtime(scene_id: str) -> bool:
    return scene_id in RUNTIMES


def get_runtime(scene_id: str) -> SceneRuntime:
    """The runtime of a scene; NoEngineError("scene X has no engine yet") when there is none."""
    if scene_id in _instances:
        return _instances[scene_id]
    target = RUNTIMES.get(scene_id)
    if target is None:
        if scene_id in SCENES:
            raise NoEngineError(f"scene {scene_id} has no engine yet")
        raise NoEngineError(f"unknown scene {scene_id!r}; valid scenes: {', '.join(SCENES)}")
    module_name, _, class_name = target.partition(":")
    runtime = getattr(importlib.import_module(module_name), class_name)()
    _instances[scene_id] = runtime
    return runtime
