"""The envscaler scene runtime: a stateful environment served over MCP inside the task's sandbox.

Per episode (one task sample): a fresh sandbox (the shared loop creates it), the server
script and the task's environment spec written into it, and the server started there by the
MCP hub (apps/engines/mcp/), one server spec named "envscaler" whose tools keep their own names
(namespace "") and whose envscaler_state / envscaler_check are platform-only. How depends on
the backend's `service_transport`: locally `python3 server.py serve` over stdio; on OpenSandbox
(execd gives background commands no stdin) a background command serving MCP over streamable
HTTP on ENVSCALER_MCP_PORT inside the sandbox, reached through the endpoint OpenSandbox
resolves for that port. The
environment instance is created from *this task's* init_config in that process, so no task
ever sees another's state. The agent gets the environment's operations as tools with their
declared JSON schemas, plus get_current_time and finish. Arguments are validated by the loop
against those schemas and sent as MCP data; nothing the agent chooses is spliced into code.

After each call the runtime asks the server for the instance's state; the step keeps the
state before and after (extra fields `state_before`, `state_after`). After finish the task's
check function runs in the sandbox against the final state: True/False -> 1.0/0.0, a number
-> clamped to [0, 1]; a check that raises scores 0.0 with the error kept. `verifier_output`
holds the result, the initial and final state.

Every exchange with the server is recorded (`mcp_calls` on the steps, the verifier's in
`verifier_output`); with config `replay_of=<trajectory uuid>` the hub answers from that
trajectory's records and no server starts (docs/mcp.md).

scene_config: see apps/engines/registry.py (env_name, class_name, env_description, code,
operations, init_config, check_func, task_id, image); written by the importer (importer.py).
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.engines.scenes.code_exec.runtime import TOOLS as CODE_EXEC_TOOLS
from apps.engines.mcp import EpisodeHubs, McpCallTimeout, McpHub, McpServerSpec, McpSessionError, McpStartError
from apps.engines.runtime import SceneRuntime, SetupError, ToolError, ToolResult
from apps.engines.sandboxes import WORKDIR, Sandbox, SandboxSpec

SERVER_SOURCE = Path(__file__).with_name("server.py")
SANDBOX_DIR = f"{WORKDIR}/.envscaler"
SERVER_PATH = f"{SANDBOX_DIR}/server.py"
SPEC_PATH = f"{SANDBOX_DIR}/spec.json"
PYTHON = "python3"
SERVER_ENV = {"FASTMCP_CHECK_FOR_UPDATES": "off", "FASTMCP_SHOW_SERVER_BANNER": "false", "FASTMCP_LOG_LEVEL": "WARNING",
              "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
DEFAULT_STEP_TIMEOUT_S = 30.0
CHECK_TIMEOUT_S = 60.0
STATE_STEP_CHARS = 20_000
TTL_MARGIN_S = 900
# MCP over streamable HTTP (backends without stdio): the server listens inside the sandbox on
# settings.ENVSCALER_MCP_HOST:ENVSCALER_MCP_PORT. Each sandbox has its own network, so one fixed
# port serves every task; 0.0.0.0 so a runtime that maps the port from outside the sandbox's
# loopback (Docker, Kubernetes) reaches it.

# Serves server.py's MCP server over HTTP: argv is SERVER_PATH SPEC_PATH HOST PORT (the hub fills
# in "{host}" and "{port}"). Host/Origin
# checks are off: the server is reached only through the sandbox's endpoint, under the proxy's
# Host name, never from a browser on the sandbox's loopback.
HTTP_LAUNCHER = (
    "import importlib.util, json, sys\n"
    "path, spec_path, host, port = sys.argv[1:5]\n"
    "found = importlib.util.spec_from_file_location('envscaler_server', path)\n"
    "server = importlib.util.module_from_spec(found)\n"
    "found.loader.exec_module(server)\n"
    "with open(spec_path, encoding='utf-8') as fh:\n"
    "    spec = json.load(fh)\n"
    "server.build_server(spec).run(transport='http', host=host, port=int(port), show_banner=False,\n"
    "                              host_origin_protection=False)\n"
)

TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_time",
        "description": "The current date and time (ISO 8601, date, time, weekday, Unix timestamp) in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "IANA timezone name", "default": "UTC"}},
        },
    },
}
# The same finish tool as every sandbox scene (code_exec's), with this scene's wording.
FINISH_TOOL = {"type": "function", "function": {
    **next(t["function"] for t in CODE_EXEC_TOOLS if t["function"]["name"] == "finish"),
    "description": "End the task. Call it once, when the task is done, with a short summary of what you did.",
}}


def scene_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("scene_config") or {}


def server_spec(scene: dict[str, Any]) -> dict[str, Any]:
    """What the in-sandbox server needs; the check function stays out until verification."""
    return {
        "env_name": scene.get("env_name", ""),
        "class_name": scene.get("class_name") or scene.get("env_name", ""),
        "code": scene.get("code", ""),
        "operations": scene.get("operations") or [],
        "init_config": scene.get("init_config") or {},
    }


def mcp_spec(config: dict[str, Any]) -> McpServerSpec:
    """The environment's server as the hub starts it."""
    return McpServerSpec(
        name="envscaler", namespace="", package={"kind": "module", "name": "apps.engines.scenes.envscaler.server"},
        argv=[PYTHON, SERVER_PATH, "serve", SPEC_PATH],
        http_argv=[PYTHON, "-c", HTTP_LAUNCHER, SERVER_PATH, SPEC_PATH, "{host}", "{port}"],
        port=settings.ENVSCALER_MCP_PORT, host=settings.ENVSCALER_MCP_HOST, env=dict(SERVER_ENV),
        platform_tools=["envscaler_state", "envscaler_check"],
        call_timeout_s=float(config.get("step_timeout_s") or DEFAULT_STEP_TIMEOUT_S),
        start_timeout_s=settings.ENVSCALER_START_TIMEOUT_S,
    )


def _capped(state: Any) -> Any:
    text = json.dumps(state, ensure_ascii=False, sort_keys=True)
    return state if len(text) <= STATE_STEP_CHARS else {"truncated": True, "head": text[:STATE_STEP_CHARS]}


class _Live:
    """One episode's environment: its MCP hub and the last state seen."""

    def __init__(self, hub: McpHub, state: Any):
        self.hub = hub
        self.initial_state = state
        self.state = state
        self.lock = threading.Lock()
        self.wedged = ""  # why the environment no longer answers (a call timed out)


class EnvScalerRuntime(SceneRuntime):
    scene_id = "envscaler"

    def __init__(self) -> None:
        self._episodes = EpisodeHubs(McpSessionError, "no environment is running in sandbox {sandbox}")

    # -- what the agent sees

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        tools = [
            {"type": "function", "function": {
                "name": op["name"],
                "description": op.get("description") or op["name"],
                "parameters": op.get("parameters") or {"type": "object", "properties": {}},
            }}
            for op in scene_config(config).get("operations") or []
        ]
        return tools + [json.loads(json.dumps(TIME_TOOL)), json.loads(json.dumps(FINISH_TOOL))]

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    text_form_rewrites: dict[str, str | None] = {
        "- finish(answer): end the task with a short summary; after it, the environment's final state is checked.\n":
            None,
        "Use a tool in every reply. Call finish when the task is done.":
            "Use a tool in every reply until the task is done; then reply in text, without a tool call, with a short "
            "summary: after it, the environment's final state is checked.",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        scene = scene_config(config)
        lines = [
            f"You are an agent operating the environment {scene.get('env_name', '')!r}.",
        ]
        if scene.get("env_description"):
            lines.append(f"About it: {scene['env_description']}")
        lines += [
            "You can act on it only through the tools below; each call changes or reads its state, and the "
            "result (or an error) comes back to you. Read the results, recover from errors, and check your work.",
            "",
            "Tools:",
        ]
        for op in scene.get("operations") or []:
            props = (op.get("parameters") or {}).get("properties") or {}
            required = set((op.get("parameters") or {}).get("required") or [])
            args = ", ".join(f"{name}{'' if name in required else '?'}" for name in props)
            lines.append(f"- {op['name']}({args}): {op.get('description') or ''}".rstrip(": "))
        lines += [
            "- get_current_time(timezone?): the current date and time.",
            "- finish(answer): end the task with a short summary; after it, the environment's final state is checked.",
            "",
            "Use a tool in every reply. Call finish when the task is done.",
        ]
        if config.get("max_steps"):
            lines.append(f"You have at most {int(config['max_steps'])} replies.")
        return "\n".join(lines)

    # -- the sandbox

    def sandbox_spec(self, config: dict[str, Any]) -> SandboxSpec:
        lifetime = float(config.get("timeout_s") or 600) + CHECK_TIMEOUT_S + TTL_MARGIN_S
        image = scene_config(config).get("image") or settings.ENVSCALER_SANDBOX_IMAGE
        return SandboxSpec(image=image, labels={"scene": "envscaler"}, ttl=lifetime)

    def setup(self, sandbox: Sandbox, config: dict[str, Any]) -> None:
        scene = scene_config(config)
        if not scene.get("code") or not scene.get("env_name"):
            raise SetupError(f"the task names the environment {scene.get('env_name')!r} but carries no code for it; "
                             "import environments with `manage.py import_envscaler` or the console upload")
        hub = McpHub.for_episode([mcp_spec(config)], config)
        # A replay answers from the recorded trajectory: no server, nothing to write for one.
        if not hub.replaying:
            sandbox.write_file(SERVER_PATH, SERVER_SOURCE.read_bytes())
            sandbox.write_file(SPEC_PATH, json.dumps(server_spec(scene)).encode("utf-8"))
        live = _Live(hub, None)
        # Whatever happens from here on, destroying the sandbox closes the hub (the hub's own
        # cleanup closes what it started should its start fail half-way).
        self._episodes.add(sandbox, live)
        try:
            hub.start(sandbox, lifetime=float(config.get("timeout_s") or 600) + CHECK_TIMEOUT_S)
        except McpStartError as exc:
            # The server itself exited or never listened (its code, or an image without fastmcp);
            # anything else (the sandbox or the OpenSandbox server gone) stays an infrastructure error.
            raise SetupError(f"the environment did not start: {exc}") from None
        offered = {tool["name"] for tool in hub.server_tools("envscaler")}
        missing = [op["name"] for op in scene.get("operations") or [] if op["name"] not in offered]
        if missing:
            raise SetupError(f"the environment's MCP server does not offer the operations {missing}")
        live.initial_state = live.state = self._state(hub)

    @staticmethod
    def _state(hub: McpHub) -> Any:
        result = hub.call_platform("envscaler", "envscaler_state", {}, timeout=DEFAULT_STEP_TIMEOUT_S)
        text = result.text
        if result.is_error:
            return {"error": text}
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return {"unreadable": text[:2000]}

    # -- tools

    def execute_tool(
        self, name: str, args: dict[str, Any], sandbox: Sandbox, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        live = self._episodes.get(sandbox)
        limit = float(timeout if timeout is not None else config.get("step_timeout_s") or DEFAULT_STEP_TIMEOUT_S)
        with live.lock:
            if live.wedged:
                raise ToolError(f"the environment no longer responds ({live.wedged}); call finish")
            started = time.monotonic()
            try:
                result = live.hub.call(name, args, timeout=limit)
            except McpCallTimeout:
                # The operation is still running in the server: the environment is unusable now,
                # which is the task's environment's doing, not the platform's (no retry).
                live.wedged = f"the environment did not answer {name} within {limit:g}s"
                return ToolResult(output=f"timed out: {live.wedged}; the environment no longer responds",
                                  duration_ms=int((time.monotonic() - started) * 1000), timed_out=True,
                                  extra={"env_error": live.wedged, "state_before": _capped(live.state),
                                         "mcp_calls": live.hub.take_records()})
            duration_ms = result.duration_ms
            text = result.text
            before = live.state
            live.state = self._state(live.hub)
        extra: dict[str, Any] = {"state_before": _capped(before), "state_after": _capped(live.state),
                                 "state_changed": before != live.state, "mcp_calls": live.hub.take_records()}
        if result.is_error:
            extra["env_error"] = text
            text = f"error: {text}"
        return ToolResult(output=text if text else "(no output)", duration_ms=duration_ms, extra=extra)

    # -- after finish

    def verify(self, sandbox: Sandbox, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        scene = scene_config(config)
        check = scene.get("check_func")
        live = self._episodes.get(sandbox)
        if not check:
            # Exchanges no step carried (set-up's, when the agent called nothing) still go on record.
            records = live.hub.take_records()
            return None, ({"mcp_calls": records} if records else {})
        with live.lock:
            if live.wedged:
                raise SetupError(f"the check cannot run: the environment no longer responds ({live.wedged})")
            result = live.hub.call_platform("envscaler", "envscaler_check", {"source": check}, timeout=CHECK_TIMEOUT_S)
            final_state = self._state(live.hub)
            records = live.hub.take_records()
        duration_ms = result.duration_ms
        text = result.text
        try:
            report = json.loads(text)
        except json.JSONDecodeError:
            report = {"reward": None, "error": f"unreadable check report: {text[:2000]}"}
        reward = report.get("reward")
        output: dict[str, Any] = {
            "method": "check_func",
            "check_result": report.get("result"),
            "error": report.get("error"),
            "duration_ms": duration_ms,
            "initial_state": _capped(live.initial_state),
            "final_state": _capped(final_state),
        }
        if reward is None:
            reward = 0.0
            output["note"] = f"the check function failed: {report.get('error')}"
        elif report.get("note"):
            output["note"] = report["note"]
        # passed/total: how the shared loop words the outcome ("1/1 tests passed").
        output.update(passed=1 if reward == 1.0 else 0, total=1, reward=float(reward), mcp_calls=records)
        return float(reward), output
