"""Recorded tool responses: what every exchange with an MCP server said, and replaying it.

Every exchange through the hub becomes a record (a JSON object):

    {"server": "git", "method": "tools/call", "tool": "git_status",
     "arguments": '{"repo_path":"/workspace/repo"}',        # canonical JSON: sorted keys, no spaces
     "args_sha256": "…",                                     # sha256 of that text
     "content": [{"type": "text", "text": "…"}],             # the content blocks as the server sent them
     "is_error": false, "duration_ms": 12, "platform": false}

`method` is "tools/call" or "tools/list" (then `tools` holds the list and there are no
arguments); a call that got no answer in time has `timed_out: true` and `error`. Image and
audio blocks keep their type, mime type, size and sha256, not their data; a record whose text
passed RECORD_MAX_CHARS is cut and marked `truncated: true` (it cannot be replayed). The runtime
puts the records of a tool call on its step (`mcp_calls`, through ToolResult.extra); records of
calls made outside a step (a server's start, a state read in set-up) go on the next step, and
those of the verifier in `verifier_output["mcp_calls"]`.

Replay: `Recording.of_trajectory(uuid)` collects a stored trajectory's records in order (read
through `stored_trajectory`, the reader the tasks app installs: this layer imports no app); a hub
built with it starts no server and answers each exchange with the next unused record of the same
(server, method, tool, canonical arguments). An exchange with no such record left is an
`McpReplayMiss` naming it: a replay never falls back to a live call.
"""
from __future__ import annotations

import base64
import binascii
import copy
import hashlib
from collections import deque
from typing import Any, Callable

from apps.engines.llm import canonical_json
from apps.engines.runtime import SetupError

RECORD_MAX_CHARS = 250_000
BINARY_BLOCKS = ("image", "audio")
CALL, LIST = "tools/call", "tools/list"


class McpReplayMiss(SetupError):
    """A replay met an exchange the recorded trajectory does not have (or cannot give back)."""


# --- stored trajectories: what a replay reads ---------------------------------------------------
# The core imports no app: the tasks app installs the reader (TasksConfig.ready), which returns a
# stored trajectory's {"steps": [...], "verifier_output": {...}} by UUID, or None.
TrajectoryReader = Callable[[str], "dict[str, Any] | None"]
_trajectory_reader: TrajectoryReader | None = None


def set_trajectory_reader(reader: TrajectoryReader | None) -> TrajectoryReader | None:
    """Install the reader replays use (None: none); returns the one it replaces."""
    global _trajectory_reader
    previous, _trajectory_reader = _trajectory_reader, reader
    return previous


def stored_trajectory(trajectory_uuid: str) -> dict[str, Any] | None:
    """The steps and verifier output of the stored trajectory with this UUID (None: no such trajectory)."""
    if _trajectory_reader is None:
        raise SetupError("no stored-trajectory reader is installed, so nothing can be replayed "
                         "(the tasks app installs it when Django starts)")
    return _trajectory_reader(trajectory_uuid)


def args_key(arguments: Any) -> tuple[str, str]:
    """(canonical JSON of the arguments, its sha256)."""
    text = canonical_json(arguments if arguments is not None else {})
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def block_record(block: Any) -> dict[str, Any]:
    """One MCP content block as JSON; binary data replaced by its size and hash."""
    data = block.model_dump(mode="json", by_alias=True, exclude_none=True) if hasattr(block, "model_dump") else dict(block)
    if data.get("type") in BINARY_BLOCKS and isinstance(data.get("data"), str):
        raw = data.pop("data").encode("ascii", "replace")
        try:
            raw = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            pass
        data.update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    return data


def cap_blocks(blocks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The blocks with their text cut to RECORD_MAX_CHARS in all; (blocks, cut)."""
    left, cut, capped = RECORD_MAX_CHARS, False, []
    for block in blocks:
        text = block.get("text")
        if isinstance(text, str):
            if len(text) > left:
                block, cut = {**block, "text": text[:left]}, True
            left = max(0, left - len(text))
        capped.append(block)
    return capped, cut


def call_record(server: str, tool: str, arguments: Any, *, platform: bool) -> dict[str, Any]:
    """The request half of a tools/call record."""
    text, digest = args_key(arguments)
    return {"server": server, "method": CALL, "tool": tool, "arguments": text, "args_sha256": digest,
            "platform": platform}


def list_record(server: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"server": server, "method": LIST, "tool": "", "arguments": "{}", "args_sha256": args_key({})[1],
            "tools": tools}


def describe(server: str, method: str, tool: str, arguments: str) -> str:
    """How an error names an exchange."""
    return f"the tool list of server {server!r}" if method == LIST else f"{tool} {arguments} on server {server!r}"


class Recording:
    """A trajectory's records, answered in order per (server, method, tool, arguments)."""

    def __init__(self, records: list[dict[str, Any]], *, source: str):
        self.source = source
        self._left: dict[tuple[str, str, str, str], deque[dict[str, Any]]] = {}
        for record in records:
            key = (record.get("server", ""), record.get("method", CALL), record.get("tool", ""),
                   record.get("args_sha256", ""))
            self._left.setdefault(key, deque()).append(record)
        self.total = len(records)

    @classmethod
    def of_episode(cls, steps: list[dict[str, Any]], verifier_output: dict[str, Any] | None, *,
                   source: str) -> "Recording":
        records = [r for step in steps or [] for r in (step.get("mcp_calls") or [])]
        records += list((verifier_output or {}).get("mcp_calls") or [])
        return cls(records, source=source)

    @classmethod
    def of_trajectory(cls, trajectory_uuid: str) -> "Recording":
        """The records of the stored trajectory with this UUID (McpReplayMiss when it has none)."""
        row = stored_trajectory(trajectory_uuid)
        source = f"trajectory {trajectory_uuid}"
        if row is None:
            raise McpReplayMiss(f"replay_of names no stored trajectory: {trajectory_uuid}")
        recording = cls.of_episode(row["steps"], row["verifier_output"], source=source)
        if not recording.total:
            raise McpReplayMiss(f"{source} has no recorded tool responses to replay (it ran without the MCP hub)")
        return recording

    def take(self, server: str, method: str, tool: str, arguments: Any) -> dict[str, Any]:
        """A copy of the next record for this exchange; McpReplayMiss when there is none left."""
        text, digest = args_key(arguments)
        queue = self._left.get((server, method, tool, digest))
        if not queue:
            raise McpReplayMiss(f"replay of {self.source}: no recorded response for "
                                f"{describe(server, method, tool, text)} (a replay never calls the server)")
        record = queue.popleft()
        if record.get("truncated"):
            raise McpReplayMiss(f"replay of {self.source}: the recorded response of {describe(server, method, tool, text)}"
                                f" was cut at {RECORD_MAX_CHARS} characters and cannot be replayed")
        return copy.deepcopy(record)
