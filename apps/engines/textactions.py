"""Tool calls written as text: a model without tool support (or a task with `tool_mode: "json"`)
answers with a {"tool": ..., "arguments": ...} object, fenced or bare; the prompt section that
asks for it, and the corrective message for a reply with no tool call at all."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JsonAction:
    """A tool call written as JSON in a text reply; `span` is where it sat in the text."""

    name: str
    arguments: Any  # a dict, or the raw string the model gave
    span: tuple[int, int]


_NAME_KEYS = ("tool", "name", "tool_name", "action", "function")
_ARGS_KEYS = ("arguments", "args", "parameters", "input", "action_input", "tool_input")


def _as_action(obj: Any) -> tuple[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"function": {"name", "arguments"}} (OpenAI shape)
        obj = obj["function"]
    name = next((obj[k] for k in _NAME_KEYS if isinstance(obj.get(k), str) and obj[k].strip()), None)
    if name is None:
        return None
    arguments = next((obj[k] for k in _ARGS_KEYS if k in obj), {})
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
            arguments = parsed if isinstance(parsed, dict) else arguments
        except json.JSONDecodeError:
            pass  # kept as given: the loop reports it like any malformed arguments
    return name.strip(), arguments


def parse_json_action(text: str | None) -> JsonAction | None:
    """The first JSON tool call in a text reply, or None.

    Accepted: an object with a tool name under "tool" / "name" / "tool_name" / "action" and
    its arguments under "arguments" / "args" / "parameters" / "input" / "action_input"
    (an object or a JSON string), or {"function": {"name", "arguments"}}; in a ```json (or
    plain ```) fenced block, which wins, or bare in the text.
    """
    if not text or "{" not in text:
        return None
    decoder = json.JSONDecoder()
    candidates: list[int] = []
    fence = 0
    while (start := text.find("```", fence)) >= 0:
        end = text.find("```", start + 3)
        if end < 0:
            break
        brace = text.find("{", start, end)
        if brace >= 0:
            candidates.append(brace)
        fence = end + 3
    fenced = set(candidates)
    candidates += [i for i, ch in enumerate(text) if ch == "{" and i not in fenced]
    for position in candidates:
        try:
            obj, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            continue
        action = _as_action(obj)
        if action is not None:
            span_start, span_end = position, end
            # Take the fence with it, so the thought is the text around the action.
            before = text.rfind("```", 0, position)
            if before >= 0 and text[before + 3:position].strip().lower() in ("", "json"):
                after = text.find("```", end)
                if after >= 0 and not text[end:after].strip():
                    span_start, span_end = before, after + 3
            return JsonAction(action[0], action[1], (span_start, span_end))
    return None


JSON_ACTION_RULE = "Reply with exactly one JSON object per message, in a ```json block, naming one tool and its arguments:"


def _json_tool_line(tool: dict[str, Any]) -> str:
    fn = tool.get("function", {})
    return (f"- {fn.get('name')}: {fn.get('description', '')} "
            # keys sorted: the export's text form finds this line again from the stored tools, whose
            # key order PostgreSQL's jsonb does not keep
            f"arguments: {json.dumps(fn.get('parameters', {}), ensure_ascii=False, sort_keys=True)}")


def json_action_instructions(tools: list[dict[str, Any]]) -> str:
    """The prompt section that asks a model without tool support for JSON actions."""
    lines = [
        "## How to call a tool",
        JSON_ACTION_RULE,
        '```json\n{"tool": "<tool name>", "arguments": {"<argument>": "<value>"}}\n```',
        "You may write your reasoning before the block. Available tools and their arguments (JSON schema):",
    ]
    lines += [_json_tool_line(tool) for tool in tools]
    return "\n".join(lines)


def json_action_text_form(finish_tools: list[dict[str, Any]]) -> dict[str, str | None]:
    """That section in an export's text form (apps/datasets/exporters/answers.py), as the scenes'
    `text_form_rewrites`: the finish tools' lines dropped, the rule saying how to end in text."""
    rewrites: dict[str, str | None] = {
        JSON_ACTION_RULE: "Until you are done, reply with exactly one JSON object per message, in a ```json block, "
                          "naming one tool and its arguments; when you are done, reply in text with no JSON object:"}
    for tool in finish_tools:
        line = _json_tool_line(tool)
        rewrites[f"\n{line}\n"] = "\n"
        rewrites[f"\n{line}"] = None  # the last line of the section
    return rewrites


def corrective_message(tool_names: list[str], tool_mode: str) -> str:
    names = ", ".join(tool_names)
    if tool_mode == "json":
        return ("Your reply did not contain a tool call. Every reply must contain exactly one JSON action, "
                'e.g. ```json\n{"tool": "finish", "arguments": {"answer": "..."}}\n```'
                f"\nAvailable tools: {names}. Call finish when you are done.")
    return (f"Your reply did not call a tool. Every reply must call one of the tools ({names}); "
            "call finish(answer) when you are done.")
