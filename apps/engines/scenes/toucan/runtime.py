"""The toucan scene runtime: an agent answers a question with the tools of real MCP servers.

Per episode: a fresh sandbox of the `trajplatform-mcp` profile (the platform's packages and the
bundled MCP servers' packages, read-only), each target server's fixtures laid down in it (files,
the seed git repo, pages served on the sandbox's loopback: apps/engines/scenes/toucan/fixtures.py), then
every target server started in it by the MCP hub (apps/engines/mcp/), as its registry row says
(apps/engines/mcp_servers.py; secrets filled in at start, never stored).

The agent sees the union of the servers' offered tools, named `<server>__<tool>` with the schemas
of the registry's snapshot (the server's own tools/list at registration; the loop needs the tools
before the sandbox is up), plus `finish(answer)`. At set-up the live tools/list must still offer
every snapshot tool with the same schema, else the task is a set-up error (the package changed
under the registry: re-snapshot it). Calls go through the hub: an `isError` result is a tool
error the agent reads, a call without an answer in time a timed-out step, and each step keeps
the exchange (`server`, `mcp_tool`, `is_error`, `mcp_calls`). A server that dies mid-episode is
an InfrastructureError: the episode ends as the platform's failure, not the agent's.

verify: apps/engines/scenes/toucan/quality.py on the calls this runtime executed and the final answer
(the task's check AND the process conditions: the rule filter, every target tool called
successfully, in order; without a check Toucan's tool-call accuracy as a proxy), the state
check's probe run in the sandbox. With config `replay_of=<trajectory uuid>` the hub answers from
that trajectory's recorded responses and starts nothing; a state check is then not re-run.

scene_config (apps/engines/registry.py): target_servers (registered names), target_tools
(`<server>__<tool>`), order (strict | any), relax, check, difficulty, question_quality_assessment,
generation, image.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from apps.engines.scenes.code_exec.runtime import TOOLS as CODE_EXEC_TOOLS
from apps.engines.mcp import EpisodeHubs, McpHub, McpServerSpec
from apps.engines.runtime import InfrastructureError, SceneRuntime, SetupError, ToolResult
from apps.engines.sandboxes import PLATFORM_MCP_PROFILE, WORKDIR, Sandbox, SandboxSpec
from apps.engines.scenes.toucan import quality
from apps.engines.scenes.toucan.fixtures import FixtureError, install_fixtures

SCENE = "toucan"
DEFAULT_TIMEOUT_S = 600.0
TTL_MARGIN_S = 900.0
FINISH_TOOL = {"type": "function", "function": {
    **next(t["function"] for t in CODE_EXEC_TOOLS if t["function"]["name"] == "finish"),
    "description": "End the task with your final answer to the user's question. Call it once, when you have the "
                   "answer; put the answer itself (not a summary of your steps) in `answer`.",
}}


def scene_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("scene_config") or {}


@dataclass
class Server:
    """What an episode needs of one registered server."""

    spec: McpServerSpec
    tools: list[dict[str, Any]]
    fixtures: dict[str, Any]
    tools_sha256: str

    @property
    def name(self) -> str:
        return self.spec.name

    def offered(self) -> list[dict[str, Any]]:
        return [t for t in self.tools if self.spec.offers(t["name"])]


ServerReader = Callable[[list[str]], list[Server]]
_server_reader: ServerReader | None = None


def install_server_reader(reader: ServerReader) -> None:
    """The MCP server registry (apps.engines.mcp_servers, above the scenes) installs its reader of
    registered servers here when the engine app loads."""
    global _server_reader
    _server_reader = reader


def registered_servers(names: list[str]) -> list[Server]:
    """The task's servers from the registry, in the task's order (SetupError: unknown or disabled)."""
    if not names:
        raise SetupError("a toucan task names its MCP servers in scene_config.target_servers")
    if _server_reader is None:
        raise InfrastructureError("no MCP server registry is installed (the engine app installs "
                                  "apps.engines.mcp_servers when Django starts)")
    return _server_reader(names)


def agent_tools(servers: list[Server]) -> list[dict[str, Any]]:
    """The servers' offered tools as OpenAI function schemas named `<server>__<tool>`."""
    return [{"type": "function", "function": {
        "name": server.spec.agent_name(tool["name"]),
        "description": tool.get("description") or tool["name"],
        "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
    }} for server in servers for tool in server.offered()]


@dataclass
class _Live:
    """One episode's hub and the calls it executed (the verifier's input)."""

    hub: McpHub
    calls: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ToucanRuntime(SceneRuntime):
    scene_id = SCENE

    def __init__(self) -> None:
        self._episodes = EpisodeHubs(SetupError, "no MCP servers were started in sandbox {sandbox}")

    # -- what the agent sees

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        servers = registered_servers(list(scene_config(config).get("target_servers") or []))
        return agent_tools(servers) + [json.loads(json.dumps(FINISH_TOOL))]

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    text_form_rewrites: dict[str, str | None] = {
        "When you have the answer, call finish with the answer itself:":
            "When you have the answer, reply in text, without a tool call, with the answer itself:",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        servers = ", ".join(scene_config(config).get("target_servers") or [])
        lines = [
            "You are a helpful assistant that answers the user's question by using tools.",
            f"The tools come from these MCP servers: {servers}. A tool's name is <server>__<tool>.",
            "Work out which tools the question needs, call them with exact arguments, read each result and "
            "use it in the next step. If a tool reports an error, correct the call or try another way.",
            "When you have the answer, call finish with the answer itself: the value, time, name or "
            "confirmation the user asked for, stated plainly.",
        ]
        if config.get("max_steps"):
            lines.append(f"You have at most {int(config['max_steps'])} replies.")
        return "\n".join(lines)

    # -- the sandbox

    def sandbox_spec(self, config: dict[str, Any]) -> SandboxSpec:
        lifetime = float(config.get("timeout_s") or DEFAULT_TIMEOUT_S) + TTL_MARGIN_S
        image = scene_config(config).get("image") or PLATFORM_MCP_PROFILE
        # A server registered with network "egress" (a production server) needs an open network;
        # the local backend refuses that with a clear error rather than run it offline.
        servers = registered_servers(list(scene_config(config).get("target_servers") or []))
        network = "open" if any(s.spec.sandbox_network == "open" for s in servers) else "none"
        return SandboxSpec(image=image, labels={"scene": SCENE}, ttl=lifetime, network=network)

    def setup(self, sandbox: Sandbox, config: dict[str, Any]) -> None:
        servers = registered_servers(list(scene_config(config).get("target_servers") or []))
        hub = McpHub.for_episode([s.spec for s in servers], config)
        live = _Live(hub)
        self._episodes.add(sandbox, live)
        # A replay answers from the recorded trajectory (its tools/list too): no fixtures, no servers.
        for server in [] if hub.replaying else servers:
            try:
                install_fixtures(sandbox, server.fixtures)
            except FixtureError as exc:
                raise SetupError(f"the fixtures of the MCP server {server.name!r}: {exc}") from None
        hub.start(sandbox, lifetime=float(config.get("timeout_s") or DEFAULT_TIMEOUT_S) + quality.PROBE_TIMEOUT_S)
        for server in servers:
            live_tools = {t["name"]: t for t in hub.server_tools(server.name)}
            changed = [t["name"] for t in server.offered()
                       if t["name"] not in live_tools or live_tools[t["name"]].get("input_schema") != t.get("input_schema")]
            if changed:
                raise SetupError(f"the MCP server {server.name!r} no longer offers {', '.join(changed)} as registered "
                                 f"(snapshot {server.tools_sha256[:12]}); re-snapshot it in the registry")

    # -- tools

    def execute_tool(
        self, name: str, args: dict[str, Any], sandbox: Sandbox, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        live = self._episodes.get(sandbox)
        # ToolError (a tool the hub does not offer) goes to the agent; McpSessionError (a server
        # gone) is an InfrastructureError and ends the episode as the platform's failure.
        result = live.hub.call_tool(name, args, timeout=timeout)
        with live.lock:
            live.calls.append({"index": len(live.calls), "tool": name, "arguments": args, "output": result.output,
                               "is_error": bool(result.extra.get("is_error")), "error": result.extra.get("error"),
                               "timed_out": result.timed_out})
        return result

    # -- after finish

    def verify(self, sandbox: Sandbox, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        scene = scene_config(config)
        live = self._episodes.get(sandbox)
        check = scene.get("check")
        skip_state = bool(live.hub.replaying and check and check.get("type") == "state")
        if skip_state:
            scene = {k: v for k, v in scene.items() if k != "check"}

        def probe(command: str) -> tuple[int | None, str, str]:
            result = sandbox.run(command, timeout=quality.PROBE_TIMEOUT_S, cwd=WORKDIR)
            return result.exit_code, result.stdout, result.stderr

        with live.lock:
            calls = list(live.calls)
        try:
            reward, output = quality.verify_episode(scene, calls, final_answer, probe)
        except quality.CheckError as exc:
            raise SetupError(f"the task's check cannot run: {exc}") from None
        if skip_state:
            output["note_replay"] = "a replay does not re-run the state check (no live server state)"
        records = live.hub.take_records()
        if records:
            output["mcp_calls"] = records
        return reward, output
