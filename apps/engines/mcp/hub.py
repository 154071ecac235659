"""One episode's MCP servers behind one interface: start, merged tool list, routed calls, records, close.

    hub = McpHub([time_spec, git_spec])              # or McpHub(specs, recording=...) to replay
    hub.start(sandbox, lifetime=900)                 # every server, inside the episode's sandbox
    hub.tools()                                      # OpenAI function schemas: time__convert_time, git__git_status, …
    result = hub.call_tool("git__git_status", {"repo_path": "/workspace/repo"}, timeout=30)   # a ToolResult
    state = hub.call_platform("envscaler", "envscaler_state", {})   # McpResponse; never offered to the agent
    hub.take_records()                               # exchanges since the last take (records.py)
    hub.close()                                      # also run by the sandbox's destroy

Starting: each server's session (session.py) runs inside the sandbox: over stdio through
`sandbox.stdio_command` where the backend gives pipes (local bubblewrap), over streamable HTTP
through `sandbox.start_service` where it serves ports (OpenSandbox). The servers start at once,
each bounded by its spec's start timeout; one that fails is an `McpStartError` (a SetupError:
the task's servers are unusable) and the others are closed. The tool list is each server's own
`tools/list`, names prefixed `<namespace>__` (spec.py), denied and platform-only tools left out.

Calls: an agent's call to a tool the hub does not offer (unknown, denied, platform-only) is a
ToolError. `call_tool` gives the loop a ToolResult: text blocks joined, resource links named, an
`isError` result as an error the agent reads (output "error: …", the step's `error`), a call
without an answer within the per-call timeout (the spec's, cut to the loop's) as a timed-out
error; an image block goes to the artifact store (trajplatform/artifacts.py) and onto the
step as one of `ToolResult.images`, an audio block is refused with an error naming why.
A server that is gone (it died, the connection broke) raises McpSessionError, an
InfrastructureError: the loop ends the episode as the platform's failure, not the agent's.
Every exchange is recorded (records.py); `call_tool` puts the records since the last take on
its step as `mcp_calls`.
"""
from __future__ import annotations

import base64
import binascii
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from apps.engines.mcp.records import (
    BINARY_BLOCKS,
    CALL,
    LIST,
    Recording,
    block_record,
    call_record,
    cap_blocks,
    list_record,
)
from apps.engines.mcp.session import McpCallTimeout, McpSession, McpSessionError
from apps.engines.mcp.spec import McpServerSpec, McpSpecError
from apps.engines.runtime import SetupError, ToolError, ToolResult
from apps.engines.sandboxes import SandboxUnavailable
from apps.engines.sandboxes.base import SERVICE_HTTP, ServiceFailed
from trajplatform import artifacts

NO_AUDIO = "the platform keeps images (the artifact store) but not audio: such results are refused"


class McpStartError(SetupError):
    """A server of the episode could not be started (its launch, its package, its code)."""


def render(blocks: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """(text for the model, binary blocks it cannot carry): text blocks joined, others named;
    an image kept in the artifact store (its block has `artifact`) is named by its hash."""
    parts: list[str] = []
    binary: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "image" and block.get("artifact"):
            parts.append(f"[image ({block.get('mimeType') or 'image'}, {block.get('bytes', '?')} bytes): "
                         f"artifact {str(block['artifact'])[:12]}]")
        elif kind in BINARY_BLOCKS:
            what = f"{kind} ({block.get('mimeType') or 'unknown type'}, {block.get('bytes', '?')} bytes)"
            binary.append(what)
            parts.append(f"[{what}: not kept]")
        elif kind == "resource_link":
            about = f": {block['description']}" if block.get("description") else ""
            parts.append(f"[resource link {block.get('name') or ''} <{block.get('uri')}>{about}]")
        elif kind == "resource":
            resource = block.get("resource") or {}
            if isinstance(resource.get("text"), str):
                parts.append(f"[resource <{resource.get('uri')}>]\n{resource['text']}")
            else:
                parts.append(f"[resource <{resource.get('uri')}>: {resource.get('mimeType') or 'binary'} data, not shown]")
        else:
            parts.append(f"[{kind or 'content'} block]")
    return "\n".join(parts), binary


@dataclass
class McpResponse:
    """One tools/call answer: its content blocks (records.block_record form) and is_error."""

    server: str
    tool: str
    content: list[dict[str, Any]]
    is_error: bool
    duration_ms: int
    text: str = field(init=False)
    binary: list[str] = field(init=False)  # blocks the platform cannot keep (audio)
    images: list[dict[str, Any]] = field(init=False)  # image blocks as artifact refs (trajplatform/artifacts.py)

    def __post_init__(self) -> None:
        self.text, self.binary = render(self.content)
        self.images = [{"artifact": b["artifact"], "mime": b.get("mimeType") or "image/png", "bytes": b.get("bytes")}
                       for b in self.content if b.get("type") == "image" and b.get("artifact")]


def keep_image(block: Any) -> dict[str, Any]:
    """A content block's record; an image's bytes go to the artifact store, the record names it
    (`artifact`: the SHA-256 of the bytes, as `sha256`), so a replay finds the same image."""
    record = block_record(block)
    data = getattr(block, "data", None)
    if record.get("type") == "image" and isinstance(data, str):
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return record
        mime = getattr(block, "mime_type", None) or "image/png"  # mcp 2.x (mimeType is deprecated)
        try:
            record["artifact"] = artifacts.store(raw, mime)["artifact"]
        except artifacts.ArtifactError as exc:  # too large, or not the image it says: named, not kept
            record["not_kept"] = str(exc)
    return record


class McpHub:
    """The MCP servers of one episode. Thread-safe; calls to one server may overlap."""

    def __init__(self, specs: list[McpServerSpec], *, recording: Recording | None = None):
        if not specs:
            raise McpSpecError("an MCP hub needs at least one server spec")
        self.specs = {spec.name: spec for spec in specs}
        if len(self.specs) != len(specs):
            raise McpSpecError(f"two MCP servers share a name: {[s.name for s in specs]}")
        prefixes = [spec.prefix for spec in specs if spec.prefix]
        if len(set(prefixes)) != len(prefixes):
            raise McpSpecError(f"two MCP servers share a namespace: {prefixes}")
        self.recording = recording
        self._sessions: dict[str, McpSession] = {}
        self._tools: dict[str, list[dict[str, Any]]] = {}  # server -> its tools/list (name, description, schema)
        self._offered: dict[str, tuple[McpServerSpec, str]] = {}  # the agent's name -> (spec, tool)
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._running = False

    @classmethod
    def for_episode(cls, specs: list[McpServerSpec], config: dict[str, Any]) -> "McpHub":
        """The hub of an episode: a replay of the recorded trajectory when the config says
        `replay_of` (McpReplayMiss if it has no records), live servers otherwise."""
        replay_of = config.get("replay_of")
        return cls(specs, recording=Recording.of_trajectory(str(replay_of)) if replay_of else None)

    @property
    def replaying(self) -> bool:
        return self.recording is not None

    # -- start and stop

    def start(self, sandbox: Any, *, lifetime: float) -> None:
        """Start every server inside `sandbox` (none when replaying); closing rides on its destroy."""
        sandbox.add_cleanup(self.close)
        if self.recording is not None:
            for name in self.specs:
                record = self.recording.take(name, LIST, "", {})
                self._record(record)
                self._tools[name] = record.get("tools") or []
        else:
            with concurrent.futures.ThreadPoolExecutor(len(self.specs), thread_name_prefix="mcp-start") as pool:
                futures = {name: pool.submit(self._start_one, spec, sandbox, lifetime)
                           for name, spec in self.specs.items()}
                errors = []
                for name, future in futures.items():
                    try:
                        self._sessions[name] = future.result()
                    except Exception as exc:  # noqa: BLE001 - the first error is raised below, all are closed
                        errors.append(exc)
            if errors:
                self.close()
                raise errors[0]
            for name, session in self._sessions.items():
                self._tools[name] = [{"name": t.name, "description": t.description or "",
                                      "input_schema": t.input_schema or {"type": "object", "properties": {}}}
                                     for t in session.tools]
                self._record(list_record(name, self._tools[name]))
        offered: dict[str, tuple[McpServerSpec, str]] = {}
        for name, spec in self.specs.items():
            for tool in self._tools[name]:
                if not spec.offers(tool["name"]):
                    continue
                agent_name = spec.agent_name(tool["name"])
                if agent_name in offered:
                    self.close()
                    raise McpStartError(f"two MCP servers offer a tool named {agent_name!r}: "
                                        f"{offered[agent_name][0].name!r} and {name!r}; give one a namespace")
                offered[agent_name] = (spec, tool["name"])
        self._offered = offered
        self._running = True

    @staticmethod
    def _start_one(spec: McpServerSpec, sandbox: Any, lifetime: float) -> McpSession:
        http = spec.transport == "http" or sandbox.service_transport == SERVICE_HTTP
        try:
            argv = spec.launch_argv("http" if http else "stdio")
            if not http:
                command = sandbox.stdio_command(argv, lifetime=lifetime, cwd=spec.cwd, env=spec.env)
                return McpSession.start(command, start_timeout=spec.start_timeout_s, name=spec.name)
            service = sandbox.start_service(argv, port=spec.port, lifetime=lifetime, ready_timeout=spec.start_timeout_s,
                                            cwd=spec.cwd, env=spec.env)
            return McpSession.connect(service, start_timeout=spec.start_timeout_s, name=spec.name, path=spec.path,
                                      output=lambda: sandbox.service_output(service))
        except (McpSpecError, SandboxUnavailable, ServiceFailed, McpSessionError) as exc:
            # SandboxUnavailable: a capability the backend lacks, not a lost sandbox (retrying
            # would not help); ServiceFailed: the server exited or never listened.
            prefix = "" if isinstance(exc, McpSessionError) else f"the MCP server {spec.name!r} did not start: "
            raise McpStartError(f"{prefix}{exc}") from None

    def close(self) -> None:
        """Leave every session (their servers stop); idempotent, also called by the sandbox's destroy."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
            self._running = False
        for session in sessions:
            session.close()

    # -- what the agent sees

    def server_tools(self, server: str) -> list[dict[str, Any]]:
        """The server's own tools/list (every tool, offered or not): name, description, input_schema."""
        return list(self._tools.get(server, []))

    def tools(self) -> list[dict[str, Any]]:
        """The offered tools as OpenAI function schemas, in the servers' order."""
        return [{"type": "function", "function": {
            "name": agent_name,
            "description": next(t["description"] for t in self._tools[spec.name] if t["name"] == tool) or tool,
            "parameters": next(t["input_schema"] for t in self._tools[spec.name] if t["name"] == tool),
        }} for agent_name, (spec, tool) in self._offered.items()]

    def resolve(self, name: str) -> tuple[McpServerSpec, str]:
        """(spec, the server's tool name) for an agent's tool name; ToolError when not offered."""
        found = self._offered.get(name)
        if found is not None:
            return found
        for spec in self.specs.values():
            if spec.prefix == "" or name.startswith(spec.prefix):
                tool = name[len(spec.prefix):]
                if any(t["name"] == tool for t in self._tools.get(spec.name, [])):
                    raise ToolError(f"the tool {name} is not available to the agent")
        raise ToolError(f"unknown tool {name!r}; available tools: {', '.join(self._offered)}")

    # -- calls

    def call(self, name: str, arguments: dict[str, Any], *, timeout: float) -> McpResponse:
        """An agent's call by its tool name, bounded by `timeout` (ToolError if not offered)."""
        spec, tool = self.resolve(name)
        return self._exchange(spec, tool, arguments, timeout=timeout, platform=False)

    def call_platform(self, server: str, tool: str, arguments: dict[str, Any], *,
                      timeout: float | None = None) -> McpResponse:
        """The platform's call of any tool but a denied one (its spec's timeout by default)."""
        spec = self.specs.get(server)
        if spec is None or tool in spec.deny_tools:
            raise ToolError(f"the platform cannot call {tool!r} on server {server!r}")
        return self._exchange(spec, tool, arguments, timeout=timeout or spec.call_timeout_s, platform=True)

    def call_tool(self, name: str, arguments: dict[str, Any], *, timeout: float | None = None) -> ToolResult:
        """An agent's call as the step's result; the limit is the spec's call timeout, cut to `timeout`."""
        spec, tool = self.resolve(name)
        limit = spec.call_timeout_s if timeout is None else min(spec.call_timeout_s, timeout)
        extra: dict[str, Any] = {"server": spec.name, "mcp_tool": tool}
        started = time.monotonic()
        try:
            response = self._exchange(spec, tool, arguments, timeout=limit, platform=False)
        except McpCallTimeout as exc:
            return ToolResult(output=f"error: timed out: {exc}", timed_out=True,
                              duration_ms=int((time.monotonic() - started) * 1000),
                              extra={**extra, "is_error": True, "error": f"timed out: {exc}",
                                     "mcp_calls": self.take_records()})
        extra.update(is_error=response.is_error, mcp_calls=self.take_records())
        error = ""
        if response.is_error:
            error = response.text or "the tool reported an error without a message"
        elif response.binary:
            error = f"{name} returned {', '.join(response.binary)}: {NO_AUDIO}"
        if error:
            extra["error"] = error
        output = f"error: {error}" if error else (response.text or "(no output)")
        return ToolResult(output=output, duration_ms=response.duration_ms, extra=extra,
                          images=[] if error else response.images)

    def _exchange(self, spec: McpServerSpec, tool: str, arguments: dict[str, Any], *, timeout: float,
                  platform: bool) -> McpResponse:
        record = call_record(spec.name, tool, arguments, platform=platform)
        if self.recording is not None:
            record = self.recording.take(spec.name, CALL, tool, arguments)
            self._record(record)
            if record.get("timed_out"):
                raise McpCallTimeout(record.get("error") or f"{tool} timed out")
            return McpResponse(spec.name, tool, record.get("content") or [], bool(record.get("is_error")),
                               int(record.get("duration_ms") or 0))
        with self._lock:
            session = self._sessions.get(spec.name) if self._running else None
        if session is None:
            raise McpSessionError(f"the MCP server {spec.name!r} is not running (the hub was closed or never started)")
        started = time.monotonic()
        try:
            result = session.call(tool, arguments, timeout=timeout)
        except McpCallTimeout as exc:
            record.update(content=[], is_error=True, timed_out=True, error=str(exc),
                          duration_ms=int((time.monotonic() - started) * 1000))
            self._record(record)
            raise
        duration_ms = int((time.monotonic() - started) * 1000)
        blocks = [keep_image(block) for block in result.content or []]
        kept, cut = cap_blocks(blocks)
        record.update(content=kept, is_error=bool(result.is_error), duration_ms=duration_ms)
        if cut:
            record["truncated"] = True
        self._record(record)
        return McpResponse(spec.name, tool, blocks, bool(result.is_error), duration_ms)

    # -- records

    def _record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._records.append(record)

    def take_records(self) -> list[dict[str, Any]]:
        """The exchanges recorded since the last take, oldest first."""
        with self._lock:
            records, self._records = self._records, []
        return records


class EpisodeHubs:
    """A scene runtime's live episodes by sandbox id: each entry holds an `McpHub` (as `.hub`)
    and is closed when its sandbox is destroyed. The runtime's hooks run in worker threads, so
    the map is guarded by a lock."""

    def __init__(self, missing: type[Exception], message: str) -> None:
        """`missing(message.format(sandbox=id))` is raised for a sandbox with no live entry."""
        self._live: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._missing, self._message = missing, message

    def add(self, sandbox: Any, live: Any) -> None:
        """Keep `live` for this sandbox; destroying the sandbox closes its hub."""
        with self._lock:
            self._live[sandbox.id] = live
        sandbox.add_cleanup(lambda: self.close(sandbox.id))

    def get(self, sandbox: Any) -> Any:
        with self._lock:
            live = self._live.get(sandbox.id)
        if live is None:
            raise self._missing(self._message.format(sandbox=sandbox.id))
        return live

    def __contains__(self, sandbox_id: str) -> bool:
        with self._lock:
            return sandbox_id in self._live

    def close(self, sandbox_id: str) -> None:
        with self._lock:
            live = self._live.pop(sandbox_id, None)
        if live is not None:
            live.hub.close()
