"""What an episode records per tool call (`Step`) and how an episode ends early (`Stop`).

A step is stored as a JSON object (Trajectory.steps, one per tool call); `Step.to_record()` gives
it with its keys in one fixed order: index, turn, tool_call_id, tool, arguments, format, thought,
observation, llm, reasoning_content (a turn with reasoning only), provider_tool_call_id (only when
the provider's id was replaced), output, exit_code, duration_ms, truncated, timed_out, then what
the step added in the order it added it (error_kind, a tool's own keys, error, images).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SUCCESS, FAILURE, ERROR = "success", "failure", "error"


class Stop(Exception):
    """Ends the loop with an outcome (raised from deep inside a turn)."""

    def __init__(self, outcome: str, reason: str, *, kind: str = "", retryable: bool = False):
        super().__init__(reason)
        self.outcome, self.reason, self.kind, self.retryable = outcome, reason, kind, retryable


@dataclass
class Step:
    """One tool call of an episode: what the model asked and what came of it."""

    index: int
    turn: int
    tool_call_id: str | None
    tool: str
    arguments: Any  # as parsed whenever they are JSON, the raw text only when they are not
    format: str  # "native", "json_text", "<format>_text" (a text tool call a profile read)
    thought: str
    observation: str  # the start of what the model saw last before this turn
    llm: dict[str, Any]  # the model call that produced it
    reasoning_content: str | None = None
    provider_tool_call_id: str | None = None  # the provider's own id, when it was replaced
    output: str = ""
    exit_code: int | None = None  # None when no process ran or it was killed on its deadline
    duration_ms: int = 0
    truncated: bool = False
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # anything else, in the order it came

    def update(self, **values: Any) -> None:
        """Set fields by name; other keys go to `extra` (a key already there keeps its place)."""
        for key, value in values.items():
            if key in _FIELDS:
                setattr(self, key, value)
            else:
                self.extra[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _FIELDS else self.extra.get(key, default)

    def __contains__(self, key: str) -> bool:
        if key in ("reasoning_content", "provider_tool_call_id"):
            return getattr(self, key) is not None
        return key in _FIELDS or key in self.extra

    def to_record(self) -> dict[str, Any]:
        """The stored JSON object (see the module docstring for its keys' order)."""
        record: dict[str, Any] = {
            "index": self.index, "turn": self.turn, "tool_call_id": self.tool_call_id, "tool": self.tool,
            "arguments": self.arguments, "format": self.format, "thought": self.thought,
            "observation": self.observation, "llm": self.llm,
        }
        if self.reasoning_content is not None:
            record["reasoning_content"] = self.reasoning_content
        if self.provider_tool_call_id is not None:
            record["provider_tool_call_id"] = self.provider_tool_call_id
        record.update(output=self.output, exit_code=self.exit_code, duration_ms=self.duration_ms,
                      truncated=self.truncated, timed_out=self.timed_out)
        record.update(self.extra)
        return record


_FIELDS = frozenset(f.name for f in fields(Step)) - {"extra"}
