"""Chat messages as trainers read them: rendering from our stored OpenAI-format messages,
and the rules a conversation with tool calls must follow (shared by the chat formats).
"""
from __future__ import annotations

from typing import Any

import orjson

from apps.datasets.record_schema import RenderError
from apps.engines.ask_user import ASK_USER

ROLES = frozenset({"system", "user", "assistant", "tool"})


def dumps_compact(value: Any) -> str:
    """Deterministic JSON text (sorted keys, UTF-8) for values embedded as strings."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """A tool call's arguments as an object, or None when they are not a JSON object."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None
    return None


def function_specs(tools: Any) -> list[dict[str, Any]]:
    """The `function` objects of OpenAI tool specs (`{"type": "function", "function": {...}}`)."""
    if not isinstance(tools, list):
        raise RenderError("tools: not a list")
    specs = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RenderError(f"tools[{i}]: not an OpenAI function spec with a name")
        if fn["name"] == ASK_USER:
            continue  # asked in plain words: render_messages makes its calls assistant / user turns
        specs.append(fn)
    return specs


def _ask_user_as_turns(messages: list[Any]) -> list[Any]:
    """The shared ask_user toolset's exchanges as ordinary turns: the question an assistant message
    (the turn's text before it when the turn called nothing else) and the simulated user's reply a
    user message, after the turn's other tool results."""
    out: list[Any] = []
    pending: set[Any] = set()
    questions: list[str] = []
    answers: list[str] = []

    def flush() -> None:
        if questions:
            out.append({"role": "assistant", "content": "\n".join(questions)})
        if answers:
            out.append({"role": "user", "content": "\n".join(answers)})
        pending.clear(), questions.clear(), answers.clear()

    for msg in messages:
        if isinstance(msg, dict) and msg.get("role") == "tool" and msg.get("tool_call_id") in pending:
            answers.append(str(msg.get("content") or ""))
            continue
        if not (isinstance(msg, dict) and msg.get("role") == "tool"):
            flush()
        calls = msg.get("tool_calls") if isinstance(msg, dict) and msg.get("role") == "assistant" else None
        asks = [c for c in calls or [] if isinstance(c, dict) and (c.get("function") or {}).get("name") == ASK_USER]
        if not asks:
            out.append(msg)
            continue
        pending.update(c.get("id") for c in asks)
        for c in asks:
            args = parse_arguments(c["function"].get("arguments"))
            questions.append(str((args or {}).get("question") or c["function"].get("arguments") or ""))
        others = [c for c in calls if c not in asks]
        if others:
            out.append({**msg, "tool_calls": others})
        else:
            text = "\n\n".join(t for t in (msg.get("content"), *questions) if t)
            out.append({k: v for k, v in msg.items() if k != "tool_calls"} | {"content": text})
            questions.clear()
    flush()
    return out


def render_messages(
    record: dict[str, Any], *, arguments: str, include_system: bool = True, tool_name: bool = False,
    reasoning: bool = False,
) -> list[dict[str, Any]]:
    """The record's messages for a chat trainer.

    arguments="string" keeps tool-call arguments as JSON text (OpenAI); "object" parses them
    (TRL chat templates); arguments that are not a JSON object cannot be rendered as objects.
    Our own keys beyond the OpenAI message shape are dropped, except `reasoning_content`
    when reasoning=True; tool results keep their `name` when tool_name=True. Calls of the
    shared `ask_user` tool become an assistant question and the user's reply as a user message
    (and `function_specs` leaves the tool out), so every chat format shows a clarification as
    ordinary turns.
    """
    out: list[dict[str, Any]] = []
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("no messages")
    messages = _ask_user_as_turns(messages)
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RenderError(f"messages[{i}]: not an object")
        role = msg.get("role")
        content = msg.get("content")
        if role not in ROLES:
            raise RenderError(f"messages[{i}]: unsupported role {role!r}")
        if role == "user" and isinstance(content, list) and all(
                isinstance(p, dict) and p.get("type") in ("text", "image_url") for p in content):
            continue  # an image observation (a vision episode's screenshot): vision.py exports those
        if content is not None and not isinstance(content, str):
            raise RenderError(f"messages[{i}]: non-text content is not supported")
        if role == "system":
            if include_system:
                out.append({"role": "system", "content": content or ""})
        elif role == "user":
            out.append({"role": "user", "content": content or ""})
        elif role == "tool":
            item = {"role": "tool", "tool_call_id": msg.get("tool_call_id"), "content": content or ""}
            if tool_name:
                item["name"] = msg.get("name") or ""
            out.append(item)
        else:
            item: dict[str, Any] = {"role": "assistant"}
            if content:
                item["content"] = content
            if reasoning and isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
                item["reasoning_content"] = msg["reasoning_content"]
            calls = msg.get("tool_calls") or []
            if calls:
                item["tool_calls"] = [_render_call(i, call, arguments) for call in calls]
            elif not content:
                item["content"] = ""
            out.append(item)
    return out


def _render_call(i: int, call: Any, arguments: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise RenderError(f"messages[{i}]: a tool call is not an OpenAI function call")
    fn = call["function"]
    raw = fn.get("arguments")
    if arguments == "object":
        args = parse_arguments(raw)
        if args is None:
            raise RenderError(
                f"messages[{i}]: tool call {call.get('id')} ({fn.get('name')}): arguments are not a JSON object")
        value: Any = args
    else:
        value = dumps_compact(raw) if isinstance(raw, dict) else raw
    return {"id": call.get("id"), "type": call.get("type") or "function",
            "function": {"name": fn.get("name"), "arguments": value}}


def _function_of(item: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    """The `function` of an OpenAI `{"type": "function", "function": {...}}` item, else a problem."""
    fn = item.get("function") if isinstance(item, dict) else None
    if not isinstance(item, dict) or item.get("type") != "function" or not isinstance(fn, dict):
        problems.append(f"{where}: must be {{\"type\": \"function\", \"function\": {{...}}}}")
        return None
    return fn


def _add_unique(value: Any, seen: set[str], where: str, problems: list[str]) -> bool:
    """Record a non-empty string that must not repeat (a tool name, a call id); False on a problem."""
    if not isinstance(value, str) or not value:
        problems.append(f"{where}: missing")
        return False
    if value in seen:
        problems.append(f"{where}: {value!r} used twice")
        return False
    seen.add(value)
    return True


def validate_tools(tools: Any, where: str = "tools") -> tuple[list[str], set[str]]:
    """Problems with OpenAI-style tool specs, and the tool names they declare."""
    if not isinstance(tools, list):
        return [f"{where}: must be a list"], set()
    problems: list[str] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        fn = _function_of(tool, f"{where}[{i}]", problems)
        if fn is None:
            continue
        _add_unique(fn.get("name"), names, f"{where}[{i}].function.name", problems)
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            problems.append(f"{where}[{i}].function.parameters: must be a JSON schema object")
    return problems, names


def validate_messages(
    messages: Any, tool_names: set[str], *, arguments: str, where: str = "messages",
    require_assistant: bool = True, allow_open_calls: bool = False,
) -> list[str]:
    """Role order, tool calls answered exactly once, arguments that parse, known tools.

    allow_open_calls lets the list end while tool calls are unanswered (a DPO continuation
    may stop at the diverging turn).
    """
    if not isinstance(messages, list) or not messages:
        return [f"{where}: must be a non-empty list"]
    problems: list[str] = []
    seen_ids: set[str] = set()
    pending: list[str] = []
    previous: str | None = None
    started = False  # a non-system message has appeared
    assistants = 0
    for i, msg in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(msg, dict):
            problems.append(f"{at}: must be an object")
            continue
        role = msg.get("role")
        if role not in ROLES:
            problems.append(f"{at}.role: {role!r} is not one of system, user, assistant, tool")
            continue
        if pending and role != "tool":
            problems.append(f"{at}: {role} message before tool call(s) {', '.join(pending)} were answered")
            pending = []
        if role == "system":
            if started:
                problems.append(f"{at}: system message after the conversation started")
            if not isinstance(msg.get("content"), str):
                problems.append(f"{at}.content: must be a string")
        elif role == "user":
            if not isinstance(msg.get("content"), str) or not msg["content"]:
                problems.append(f"{at}.content: must be a non-empty string")
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(msg.get("content"), str):
                problems.append(f"{at}.content: must be a string")
            if call_id in pending:
                pending.remove(call_id)
            else:
                problems.append(f"{at}: tool message answers no open tool call (tool_call_id {call_id!r})")
        else:
            assistants += 1
            if previous == "assistant":
                problems.append(f"{at}: two assistant messages in a row")
            problems += _check_assistant(at, msg, tool_names, arguments, seen_ids, pending)
        if role != "system" and not started:
            started = True
            if role != "user":
                problems.append(f"{at}: the conversation must start with a user message")
        previous = role
    if pending and not allow_open_calls:
        problems.append(f"{where}: tool call(s) {', '.join(pending)} never answered")
    if require_assistant and not assistants:
        problems.append(f"{where}: no assistant message")
    return problems


def _check_assistant(
    at: str, msg: dict[str, Any], tool_names: set[str], arguments: str, seen_ids: set[str], pending: list[str]
) -> list[str]:
    problems: list[str] = []
    content = msg.get("content")
    calls = msg.get("tool_calls")
    if content is not None and not isinstance(content, str):
        problems.append(f"{at}.content: must be a string or absent")
    if calls is None:
        if not content:
            problems.append(f"{at}: assistant message with neither content nor tool calls")
        return problems
    if not isinstance(calls, list) or not calls:
        return problems + [f"{at}.tool_calls: must be a non-empty list"]
    for j, call in enumerate(calls):
        cat = f"{at}.tool_calls[{j}]"
        fn = _function_of(call, cat, problems)
        if fn is None:
            continue
        if _add_unique(call.get("id"), seen_ids, f"{cat}.id", problems):
            pending.append(call["id"])
        name = fn.get("name")
        if name not in tool_names:
            problems.append(f"{cat}.function.name: {name!r} is not in tools")
        raw = fn.get("arguments")
        if arguments == "object":
            if not isinstance(raw, dict):
                problems.append(f"{cat}.function.arguments: must be an object")
        elif not isinstance(raw, str):
            problems.append(f"{cat}.function.arguments: must be a JSON string")
        elif parse_arguments(raw) is None:
            problems.append(f"{cat}.function.arguments: not a JSON object")
    return problems
