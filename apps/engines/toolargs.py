"""The arguments of a tool call, parsed and checked against the schema of the tool it names."""
from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema import Draft202012Validator

# The error kinds `ToolArguments.parse` gives a call it refuses: such a call never ran, and its
# step's result is the refusal (the loop records the kind as the step's `error_kind`).
REFUSED_KINDS = frozenset({"unknown_tool", "unparseable_arguments", "invalid_arguments"})


@functools.lru_cache(maxsize=256)
def _validator_for(schema_json: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_json))


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A tool's argument validator; every episode of a scene offers the same tools."""
    return _validator_for(json.dumps(schema, sort_keys=True))


class ToolArguments:
    """The checks for the tools an episode offers (OpenAI tool definitions)."""

    def __init__(self, tools: list[dict[str, Any]] | None = None):
        self.validators: dict[str, Draft202012Validator] = {
            t["function"]["name"]: _validator(t["function"].get("parameters") or {"type": "object"})
            for t in tools or []
        }

    def parse(self, name: str, raw: Any) -> tuple[Any, str | None, str]:
        """(arguments, error, error kind): the arguments as parsed (the raw value when they are
        not JSON), the error to tell the model or None, and what went wrong: "" (nothing),
        "unknown_tool", "unparseable_arguments" (not JSON) or "invalid_arguments" (JSON that
        breaks the tool's schema, a non-object included). The review checks count on the kind."""
        args: Any = raw
        not_json = ""
        if isinstance(raw, dict):
            args = raw
        elif raw is None or (isinstance(raw, str) and not raw.strip()):
            args = {}
        elif isinstance(raw, str):
            try:
                args = json.loads(raw)
            except json.JSONDecodeError as exc:
                not_json = f"the arguments of {name} are not valid JSON ({exc.msg} at character {exc.pos})"
        if name not in self.validators:
            return args, f"unknown tool {name!r}; available tools: {', '.join(self.validators)}", "unknown_tool"
        if not_json:
            return args, not_json, "unparseable_arguments"
        if not isinstance(args, dict):
            got = type(args).__name__
            return args, f"the arguments of {name} must be a JSON object, got {got}", "invalid_arguments"
        problems = sorted(self.validators[name].iter_errors(args), key=lambda e: list(e.absolute_path))
        if problems:
            where = "".join(f".{p}" for p in problems[0].absolute_path)
            return args, f"invalid arguments for {name}{where}: {problems[0].message}", "invalid_arguments"
        return args, None, ""
