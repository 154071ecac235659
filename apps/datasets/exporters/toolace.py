"""The `toolace` format: ToolACE's released row (Team-ACE/ToolACE data.json).

    {"system": "<ToolACE's instructions>\\nHere is a list of functions in JSON format that you can invoke:\\n[...]. \\n<tail>",
     "conversations": [{"from": "user", "value": "..."},
                       {"from": "assistant", "value": "[Market Trends API(trend_type=\\"MOST_ACTIVE\\")]"},
                       {"from": "tool", "value": "[{\\"name\\": \\"Market Trends API\\", \\"results\\": {...}}]"},
                       {"from": "assistant", "value": "Booked."}]}

The system prompt is ToolACE's own text, word for word, with the tools (without finish and
ask_user) as a JSON list in ToolACE's function shape: {"name", "description", "parameters":
{"type": "dict", "properties", "required"}, "required": null}, parameter types in ToolACE's words
(object -> dict, integer -> int, number -> float; string, boolean, array as they are). Tool names
are kept as they are, spaces included ("Get Manager Placeholder Image"), as ToolACE's rows have
them. An assistant turn with calls is only the calls in ToolACE's bracket syntax
`[name(key=value, ...), ...]` (values as Python literals); the turn's text is not kept, as in
ToolACE. The results of one turn's calls are one `tool` turn (a JSON list of {name, results}; an
output that is JSON is kept as JSON). `finish(answer)` becomes the assistant's answer turn (answers.py);
clarifications (ask_user) are ordinary assistant / user turns (chat.render_messages). Every call
turn is parsed back with `parse_calls` when rendered and when validated, and must give the same
calls: a call that cannot round-trip (a name with a bracket, a comma or a quote in it, an argument
name that is not a Python identifier) excludes the record with the reason.
"""
from __future__ import annotations

import ast
import json
import math
from typing import Any

from trajplatform.pyparse import parse_python

from .chat import RenderError, function_specs, parse_arguments, render_messages

Line = dict[str, Any]
TOOLS_ANCHOR = "Here is a list of functions in JSON format that you can invoke:\n"
# ToolACE's system prompt, as its released rows have it (tests/datasets/anchor_rows/toolace_rows.json)
SYSTEM_HEAD = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. \n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. \n"
    "If none of the function can be used, point it out. If the given question lacks the parameters required "
    "by the function,\nalso point it out. You should only return the function call in tools call sections.\n"
)
SYSTEM_TAIL = (
    ". \nShould you decide to return the function call(s). \nPut it in the format of "
    "[func1(params_name=params_value, params_name2=params_value2...), func2(params)]\n\n"
    "NO other text MUST be included. \n"
)
# JSON Schema's type names in ToolACE's words (its rows say "dict", "int", "float")
TYPE_NAMES = {"object": "dict", "integer": "int", "number": "float"}
NAME_FORBIDDEN = frozenset("[](),=\"'\n")
ROLES = ("user", "assistant", "tool")


def py_literal(value: Any) -> str:
    """A JSON value as the Python literal ToolACE's calls use (True/False/None, double-quoted strings)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RenderError(f"argument value {value!r} has no literal")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise RenderError(f"argument value of type {type(value).__name__} has no literal")


def render_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "[" + ", ".join(f"{name}(" + ", ".join(f"{k}={py_literal(v)}" for k, v in args.items()) + ")"
                           for name, args in calls) + "]"


def _closing(text: str, start: int) -> int:
    """The index of the ")" that closes the "(" at `start` (brackets and string literals skipped), or -1."""
    depth, i, quote = 0, start, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i if c == ")" else -1
        i += 1
    return -1


def _arguments(source: str) -> dict[str, Any] | None:
    """`key=literal, ...` as a dict, or None when it is anything else."""
    try:
        tree = parse_python(f"f({source})", mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.Call) or tree.args:
        return None
    try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords if kw.arg is not None}
    except ValueError:
        return None
    return arguments if len(arguments) == len(tree.keywords) else None


def parse_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """ToolACE's bracket syntax read back: [(name, arguments)], or None when `text` is not a call list.

    A name is any text up to its "(" without brackets, commas, quotes or "=" (ToolACE's names have
    spaces: "[Get Manager Placeholder Image(sport=\"football\")]"); the arguments are keywords with
    Python literal values."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    body = body[1:-1]
    calls: list[tuple[str, dict[str, Any]]] = []
    i = 0
    while True:
        open_at = body.find("(", i)
        if open_at < 0:
            return None
        name = body[i:open_at].strip()
        if not name or NAME_FORBIDDEN & set(name):
            return None
        close_at = _closing(body, open_at)
        arguments = _arguments(body[open_at + 1:close_at]) if close_at > 0 else None
        if arguments is None:
            return None
        calls.append((name, arguments))
        rest = body[close_at + 1:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(","):
            return None
        i = len(body) - len(rest) + 1


def toolace_schema(schema: Any) -> Any:
    """A JSON schema with its type names in ToolACE's words (nested properties and items too)."""
    if isinstance(schema, list):
        return [toolace_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = TYPE_NAMES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: toolace_schema(prop) for name, prop in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "additionalProperties"):
            out[key] = toolace_schema(value)
        else:
            out[key] = value
    return out


def toolace_function(fn: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function spec in ToolACE's function shape."""
    parameters = toolace_schema(fn.get("parameters") or {"type": "object", "properties": {}})
    parameters = {"type": parameters.get("type", "dict"), "properties": parameters.get("properties", {}),
                  "required": list(parameters.get("required") or []),
                  **{k: v for k, v in parameters.items() if k not in ("type", "properties", "required")}}
    return {"name": fn["name"], "description": fn.get("description") or "", "parameters": parameters,
            "required": None}


def _results(content: str) -> Any:
    try:
        value = json.loads(content)
    except (json.JSONDecodeError, TypeError):
        return content
    return value if isinstance(value, (dict, list)) else content


def render_toolace(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    messages = render_messages(record, arguments="string", include_system=False)
    tools = [toolace_function(fn) for fn in function_specs(record.get("tools") or [])]
    turns: list[dict[str, str]] = []
    names: dict[Any, str] = {}
    results: list[dict[str, Any]] = []

    def flush() -> None:
        if results:
            turns.append({"from": "tool", "value": json.dumps(results, ensure_ascii=False)})
            results.clear()

    for i, msg in enumerate(messages):
        if msg["role"] == "tool":
            results.append({"name": names.get(msg.get("tool_call_id"), ""), "results": _results(msg["content"])})
            continue
        flush()
        if msg["role"] == "user":
            turns.append({"from": "user", "value": msg["content"]})
            continue
        calls = []
        for call in msg.get("tool_calls") or []:
            fn = call["function"]
            args = parse_arguments(fn["arguments"])
            if args is None:
                raise RenderError(f"messages[{i}]: tool call {call.get('id')} ({fn['name']}): arguments are not an object")
            if NAME_FORBIDDEN & set(fn["name"]) or fn["name"] != fn["name"].strip():
                raise RenderError(f"messages[{i}]: tool {fn['name']!r} is not a name ToolACE's call syntax can carry")
            names[call.get("id")] = fn["name"]
            calls.append((fn["name"], args))
        if calls:
            value = render_calls(calls)
            if parse_calls(value) != calls:
                raise RenderError(f"messages[{i}]: the calls do not survive ToolACE's call syntax: {value[:200]}")
            turns.append({"from": "assistant", "value": value})
        elif msg.get("content"):
            turns.append({"from": "assistant", "value": msg["content"]})
    flush()
    if not turns or turns[-1]["from"] != "assistant":
        raise RenderError("the conversation does not end with the assistant")
    system = SYSTEM_HEAD + TOOLS_ANCHOR + json.dumps(tools, ensure_ascii=False) + SYSTEM_TAIL
    return {"system": system, "conversations": turns}


def tools_of(system: Any) -> list[dict[str, Any]] | None:
    """The function list embedded in a ToolACE system prompt (the JSON list after its anchor), or None."""
    if not isinstance(system, str) or TOOLS_ANCHOR not in system:
        return None
    text = system.split(TOOLS_ANCHOR, 1)[1]
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


def validate_toolace(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in ("system", "conversations") if k not in obj]
    problems += [f"line.{k}: unexpected field" for k in sorted(set(obj) - {"system", "conversations"})]
    tools = tools_of(obj.get("system"))
    if tools is None:
        problems.append("line.system: must embed the function list as JSON after "
                        f"{TOOLS_ANCHOR.strip()!r}")
        tools = []
    names = {t.get("name") for t in tools if isinstance(t, dict)}
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        return problems + ["line.conversations: must be a non-empty list"]
    open_calls: list[tuple[str, dict[str, Any]]] | None = None
    previous = None
    for i, turn in enumerate(turns):
        at = f"line.conversations[{i}]"
        if not isinstance(turn, dict) or set(turn) != {"from", "value"} or not isinstance(turn["value"], str):
            problems.append(f"{at}: must be {{\"from\": ..., \"value\": string}}")
            continue
        role = turn["from"]
        if role not in ROLES:
            problems.append(f"{at}.from: {role!r} is not one of {', '.join(ROLES)}")
            continue
        if i == 0 and role != "user":
            problems.append(f"{at}: the conversation must start with the user")
        if role == "tool":
            results = _results(turn["value"])
            if open_calls is None:
                problems.append(f"{at}: a tool turn must follow the assistant's calls")
            elif not isinstance(results, list) or [r.get("name") if isinstance(r, dict) else None
                                                   for r in results] != [n for n, _ in open_calls]:
                problems.append(f"{at}: must list {{name, results}} for each call of the turn before, in order")
            open_calls = None
        else:
            if open_calls is not None:
                problems.append(f"{at}: the calls of turn {i - 1} have no tool turn")
                open_calls = None
            if role == "assistant":
                if previous == "assistant":
                    problems.append(f"{at}: two assistant turns in a row")
                calls = parse_calls(turn["value"])
                if calls is not None:
                    if render_calls(calls) != turn["value"].strip():
                        problems.append(f"{at}: the calls do not round-trip through ToolACE's call syntax")
                    unknown = sorted({n for n, _ in calls} - names)
                    if unknown:
                        problems.append(f"{at}: calls functions not in the system prompt: {', '.join(unknown)}")
                    open_calls = calls
                elif not turn["value"].strip():
                    problems.append(f"{at}.value: an assistant turn must not be empty")
            elif not turn["value"].strip():
                problems.append(f"{at}.value: a user turn must not be empty")
        previous = role
    if open_calls is not None:
        problems.append("line.conversations: the last calls have no tool turn")
    if isinstance(turns[-1], dict) and turns[-1].get("from") != "assistant":
        problems.append("line.conversations: must end with the assistant")
    return problems
