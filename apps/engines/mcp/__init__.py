"""The MCP hub every scene with MCP servers shares (envscaler today; toucan, toolace, gui next).

- spec.py: `McpServerSpec`, how to launch one server and which of its tools the agent sees.
- session.py: `McpSession`, the platform's fastmcp Client into one server in the sandbox.
- hub.py: `McpHub`, one episode's servers: start, merged `<server>__<tool>` list, calls, close.
- records.py: every exchange recorded on the steps; `Recording` replays a trajectory's.

See docs/mcp.md.
"""
from apps.engines.mcp.hub import EpisodeHubs, McpHub, McpResponse, McpStartError
from apps.engines.mcp.records import McpReplayMiss, Recording
from apps.engines.mcp.session import McpCallTimeout, McpSession, McpSessionError
from apps.engines.mcp.spec import McpServerSpec, McpSpecError

__all__ = ["EpisodeHubs", "McpCallTimeout", "McpHub", "McpReplayMiss", "McpResponse", "McpServerSpec", "McpSession",
           "McpSessionError", "McpSpecError", "McpStartError", "Recording"]
