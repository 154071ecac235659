"""The platform's side of one MCP server: a fastmcp Client into the sandbox, over stdio or HTTP.

    session = McpSession.start(sandbox.stdio_command([...], lifetime=...), start_timeout=60, name="git")
    # or, where the backend serves ports instead of pipes (OpenSandbox):
    session = McpSession.connect(sandbox.start_service([...], port=..., ...), start_timeout=60,
                                 output=lambda: sandbox.service_output(service), name="git")
    session.tools, session.tool_names                   # from tools/list after initialize
    result = session.call("book", {"slot": "..."}, timeout=30)   # CallToolResult
    session.close()

The hub (hub.py) holds one session per server of an episode. The scene runtime's hooks are synchronous and run in worker threads, while the MCP client
is async and its connection must live across the whole episode. So each session owns a
thread with an event loop; one coroutine holds `async with Client(...)` open (fastmcp does
the MCP initialize handshake) until `close()`, and calls are submitted to that loop. The
transport is fastmcp's own: StdioTransport (a process spawned through the sandbox) or
StreamableHttpTransport (the MCP endpoint of a server listening inside the sandbox).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from apps.engines.runtime import InfrastructureError
from apps.engines.sandboxes import StdioCommand
from apps.engines.sandboxes.base import ServiceEndpoint

CLOSE_TIMEOUT_S = 10.0
# fastmcp's default path for MCP over streamable HTTP (FastMCP.run(transport="http")).
MCP_HTTP_PATH = "/mcp"
STDERR_TAIL_CHARS = 4000


class McpSessionError(InfrastructureError):
    """The MCP server could not be started or is gone."""


class McpCallTimeout(McpSessionError):
    """A tools/call got no answer in time; the server may still be busy with it."""


class McpSession:
    """Use `start` (stdio) or `connect` (streamable HTTP). `output` returns the tail of what the
    server wrote, for error messages; `on_close` runs once when the session is closed."""

    def __init__(self, transport: Any, *, start_timeout: float, name: str = "mcp",
                 output: Callable[[], str] = lambda: "", output_label: str = "server stderr",
                 on_close: Callable[[], None] | None = None):
        from fastmcp import Client  # deferred: heavy (fastmcp), only when a session opens

        self.name = name
        self._output = output
        self._output_label = output_label
        self._on_close = on_close
        self._client = Client(transport, init_timeout=start_timeout)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._done: concurrent.futures.Future | None = None
        self.tools: list[Any] = []  # mcp.types.Tool, as the server listed them
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"{name}-mcp")
        self._thread.start()
        self._done = asyncio.run_coroutine_threadsafe(self._hold(), self._loop)
        try:
            self.tools = self._ready.result(start_timeout + 5)
        except BaseException as exc:
            detail = self.stderr_tail()
            self.close()
            if isinstance(exc, concurrent.futures.TimeoutError):
                message = f"the MCP server {name!r} did not start within {start_timeout:g}s"
            else:
                message = f"the MCP server {name!r} did not start: {type(exc).__name__}: {exc}"
            raise McpSessionError(message + (f"\n{output_label}:\n{detail}" if detail else "")) from None

    @property
    def tool_names(self) -> list[str]:
        return [tool.name for tool in self.tools]

    @classmethod
    def start(cls, command: StdioCommand, *, start_timeout: float, name: str = "mcp") -> "McpSession":
        """Spawn `command` (a process inside the sandbox) and speak MCP over its stdin/stdout."""
        from fastmcp.client.transports import StdioTransport  # deferred: heavy (fastmcp), only when a session opens

        fd, log_name = tempfile.mkstemp(prefix=f"mcp-{name}-", suffix=".stderr")
        os.close(fd)
        log_path = Path(log_name)
        transport = StdioTransport(command=command.argv[0], args=command.argv[1:], env=command.env,
                                   cwd=command.cwd, keep_alive=False, log_file=log_path)

        def output() -> str:
            try:
                return log_path.read_text(errors="replace")[-STDERR_TAIL_CHARS:].strip()
            except OSError:
                return ""

        return cls(transport, start_timeout=start_timeout, name=name, output=output,
                   on_close=lambda: log_path.unlink(missing_ok=True))

    @classmethod
    def connect(cls, service: ServiceEndpoint, *, start_timeout: float, name: str = "mcp",
                output: Callable[[], str] = lambda: "", path: str = MCP_HTTP_PATH) -> "McpSession":
        """Speak MCP over streamable HTTP to a server already listening inside the sandbox."""
        from fastmcp.client.transports import StreamableHttpTransport  # deferred: heavy (fastmcp), only when a session opens

        transport = StreamableHttpTransport(service.url + path, headers=dict(service.headers))
        return cls(transport, start_timeout=start_timeout, name=name, output=output, output_label="server output")

    async def _hold(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with self._client as client:
                tools = await client.list_tools()
                self._ready.set_result(list(tools))
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    def call(self, name: str, arguments: dict[str, Any], *, timeout: float) -> Any:
        """tools/call; the raw CallToolResult (is_error says the tool refused). McpCallTimeout when
        the server does not answer in time, McpSessionError when the connection is gone."""
        if self._done is None or self._done.done():
            raise McpSessionError(f"the MCP server {self.name!r} is gone{self._stderr_note()}")
        # One deadline, ours: the client's own request timeout would surface as a generic MCPError.
        future = asyncio.run_coroutine_threadsafe(self._client.call_tool_mcp(name, arguments), self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise McpCallTimeout(f"the MCP server {self.name!r} did not answer {name} within {timeout:g}s") from None
        except Exception as exc:
            raise McpSessionError(f"calling {name} on the MCP server {self.name!r} failed: {type(exc).__name__}: {exc}{self._stderr_note()}") from None

    def stderr_tail(self) -> str:
        """The tail of what the server wrote ("" when nothing or unavailable)."""
        try:
            return (self._output() or "")[-STDERR_TAIL_CHARS:].strip()
        except Exception:  # noqa: BLE001 - only for an error message; the sandbox may be gone
            return ""

    def _stderr_note(self) -> str:
        tail = self.stderr_tail()
        return f"\n{self._output_label}:\n{tail}" if tail else ""

    def close(self) -> None:
        """Leave the MCP session (the client stops the server process) and the loop; idempotent."""
        if self._loop.is_closed():
            return
        stop = self._stop
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)
        if self._done is not None:
            try:
                self._done.result(CLOSE_TIMEOUT_S)
            except BaseException:  # noqa: BLE001 - closing; the sandbox's destroy kills what is left
                self._done.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
