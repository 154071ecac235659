"""ToolACE-MT (non-autoregressive) mode: a dialogue skeleton, executed, its stale suffixes re-filled.

In an `mt` episode the model gets one tool, `write_dialogue(turns, from_turn?)`, and `finish`.
Its first reply writes the whole dialogue after the task prompt in one call: assistant turns
with tool calls, each with the output it *expects* (`output`), the user's replies to
clarifying `ask_user` calls, and a last `finish(answer)` call. The runtime then executes the
calls in order against the episode's fresh environment (the envscaler server in the sandbox;
`ask_user` is answered by the user simulator) and replaces each simulated output by the real
one. When a real output no longer carries a value a later turn took from the simulated one
(an argument, an answer), that later part is stale: the turns after the call are masked and the
model is asked to re-write them (`write_dialogue(from_turn=k, turns=[...])`, one model call per
masked span, at most `refine_rounds` of them, default 2). A call with unknown tool or invalid
arguments masks the dialogue from its own turn. When nothing is stale the model calls finish.

The stored trajectory is the dialogue itself (`transcript`): the agent-mode system prompt and
tools, the prompt, each assistant turn's tool calls with their real outputs, as steps like an
agent episode's (state before/after, `simulated_user` for ask_user), plus `source: "mt"`,
`mt_turn`, `skeleton_output` (what the skeleton assumed) and `refilled` (the turn came from a
re-fill round). The generation conversation (skeleton and re-fill calls) stays in the verifier
output under `mt`.
"""
from __future__ import annotations

import json
import re
from typing import Any

from jsonschema import Draft202012Validator

from apps.engines.ask_user import ASK_USER
from apps.engines.scenes.toolace.rules import Context, _scalars

WRITE_DIALOGUE = "write_dialogue"
DEFAULT_REFINE_ROUNDS = 2
_TOKEN = re.compile(r"[A-Za-z0-9_@.:\-]*\d[A-Za-z0-9_@.:\-]*")
_CALL = {"type": "object", "required": ["name", "arguments"], "additionalProperties": False, "properties": {
    "name": {"type": "string"}, "arguments": {"type": "object"},
    "output": {"type": "string", "description": "the output you expect (replaced by the real one)"}}}
WRITE_DIALOGUE_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": WRITE_DIALOGUE,
    "description": ("Write the dialogue after the user's request: the assistant's turns with their tool calls and "
                    "the outputs you expect, the user's replies, ending with a finish call. With from_turn, "
                    "re-write the dialogue from that turn on (the earlier turns stay)."),
    "parameters": {"type": "object", "required": ["turns"], "additionalProperties": False, "properties": {
        "from_turn": {"type": "integer", "minimum": 0},
        "turns": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role"], "additionalProperties": False, "properties": {
                "role": {"enum": ["assistant", "user"]}, "content": {"type": "string"},
                "tool_calls": {"type": "array", "items": _CALL}}}}}},
}}


def simulated_values(output: str) -> set[str]:
    """The values a later turn could take from a tool output: its JSON leaves, else its tokens with digits."""
    try:
        parsed = json.loads(output)
    except (json.JSONDecodeError, TypeError):
        parsed = None
    if isinstance(parsed, (dict, list)):
        values = {str(v) for v in _scalars(parsed)}
    else:
        values = {t.strip(".:-") for t in _TOKEN.findall(output or "")}  # "on 2026-11-19." -> the date
    return {v for v in values if len(v) >= 2}


def _turn_values(turn: dict[str, Any]) -> list[str]:
    """What a turn says: its text and its calls' argument values."""
    values = [str(turn.get("content") or "")]
    for call in turn.get("tool_calls") or []:
        values += [str(v) for v in _scalars(call.get("arguments") or {})]
    return values


def stale_values(simulated: str, real: str, seen: Context) -> set[str]:
    """Values of the simulated output that the real output (and what came before) does not carry."""
    real_lower = (real or "").lower()
    return {v for v in simulated_values(simulated) if v.lower() not in real_lower and not seen.has(v)}


def depends_on(turns: list[dict[str, Any]], stale: set[str]) -> bool:
    lowered = [v.lower() for turn in turns for v in _turn_values(turn)]
    return any(s.lower() in text for s in stale for text in lowered)


class Dialogue:
    """One mt episode's dialogue: its turns (with real outputs once executed) and the rounds used."""

    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []
        self.executed = 0  # turns[:executed] ran against the environment
        self.rounds = 0
        self.consistent = False
        self.finished_answer: str | None = None
        self.history: list[dict[str, Any]] = []  # what each write_dialogue call did

    def as_dict(self) -> dict[str, Any]:
        return {"turns": self.turns, "executed": self.executed, "rounds": self.rounds,
                "consistent": self.consistent, "history": self.history}


def invalid_call(call: dict[str, Any], validators: dict[str, Draft202012Validator]) -> str:
    name = call.get("name")
    if name not in validators:
        return f"unknown tool {name!r}; available tools: {', '.join(validators)}"
    problems = sorted(validators[name].iter_errors(call.get("arguments") or {}), key=lambda e: list(e.absolute_path))
    if problems:
        where = "".join(f".{p}" for p in problems[0].absolute_path)
        return f"invalid arguments for {name}{where}: {problems[0].message}"
    return ""
