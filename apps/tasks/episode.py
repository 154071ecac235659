"""The episode, readable: a trajectory's step records (or its messages) as observation ->
thought -> action -> result steps with summaries, highlighted code, file and state diffs and
the screenshots the agent acted on; plus the conversation as sent to and from the model.

Read by the trajectory pages (apps.tasks.views), the trace (apps.tasks.trace) and
`manage.py show_trajectory`. Malformed entries are shown as text, never dropped or raised on.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import BashLexer, DiffLexer, PythonLexer, SqlLexer, TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound

from trajplatform import json_limits
from trajplatform.artifacts import first_image, step_screenshot


# --- the episode, readable --------------------------------------------------------------

@dataclass
class Action:
    name: str
    arguments: str
    call_id: str = ""
    result: str | None = None
    meta: list[str] = field(default_factory=list)
    # the one-line summary of a collapsed step, and how the call ended
    summary: str = ""
    state: str = ""
    is_error: bool = False
    duration_ms: int | None = None
    tokens: int | None = None
    # code arguments as highlighted source, a file write as a diff against the previous content,
    # state before / after as a diff (stateful scenes)
    code: str = ""
    diff: str = ""
    new_file: bool = False
    state_diff: str = ""
    screenshot: dict[str, Any] | None = None  # trajplatform.artifacts.step_screenshot


@dataclass
class Step:
    number: int
    observations: list[tuple[str, str]]
    thought: str
    actions: list[Action]
    reasoning: str = ""
    turn: int | None = None


@dataclass
class Message:
    role: str
    text: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    call_id: str = ""


@dataclass
class Episode:
    steps: list[Step]
    # where the steps came from: the agent's per-step records, or the messages when there are none
    source: str
    conversation: list[Message]
    # user/tool messages after the last assistant turn (messages source only)
    trailing: list[tuple[str, str]] = field(default_factory=list)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)


def plain_text(content: Any) -> str:
    """Message content as plain text: a string, OpenAI content parts, or anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "\n".join(p["text"] if isinstance(p.get("text"), str) else pretty_json(p) for p in content)
    return pretty_json(content)


def arguments_text(raw: Any) -> str:
    """Tool-call arguments indented when they are JSON (keys sorted); left as sent when they are not.
    The trace shows them so and the correction form edits them so (apps/reviews/views.py)."""
    if isinstance(raw, str):
        try:
            return pretty_json(json_limits.loads(raw))
        except ValueError:  # not JSON, or nested too deep to parse safely
            return raw
    return pretty_json(raw)


def _step_meta(record: dict[str, Any]) -> list[str]:
    """The facts of one executed step worth a glance: exit code, time, cut-offs, errors, model call."""
    meta = []
    if "exit_code" in record:
        meta.append(f"exit code {record['exit_code']}" if record["exit_code"] is not None else "no exit code")
    if record.get("duration_ms") is not None:
        meta.append(f"{record['duration_ms']} ms")
    if record.get("truncated"):
        meta.append("output truncated")
    if record.get("timed_out"):
        meta.append("timed out")
    if record.get("error"):
        meta.append(f"error: {plain_text(record['error'])}")
    llm = record.get("llm")
    if isinstance(llm, dict):
        usage = llm.get("usage") if isinstance(llm.get("usage"), dict) else {}
        parts = [str(llm["model"])] if llm.get("model") else []
        if llm.get("latency_ms") is not None:
            parts.append(f"{llm['latency_ms']} ms")
        if usage.get("total_tokens") is not None:
            parts.append(f"{usage['total_tokens']} tokens")
        if llm.get("cached"):
            parts.append("cached")
        if parts:
            meta.append("model call: " + ", ".join(parts))
    return meta


# --- readable steps: summaries, highlighted code, diffs -------------------------------------------

CODE_KEYS = ("code", "command", "cmd", "script", "content", "source", "patch", "sql")
PATH_KEYS = ("path", "file", "filename", "file_path")
MAX_HIGHLIGHT_CHARS = 200_000
SUMMARY_CHARS = 90


def _lexer(tool: str, key: str, path: str) -> Any:
    if key == "patch":
        return DiffLexer(stripnl=False)
    if path:
        try:
            return get_lexer_for_filename(path, stripnl=False)
        except ClassNotFound:
            return TextLexer(stripnl=False)
    if key in ("command", "cmd") or "shell" in tool or "bash" in tool:
        return BashLexer(stripnl=False)
    if key == "sql" or "sql" in tool:
        return SqlLexer(stripnl=False)
    if key in ("code", "script", "source") or "python" in tool:
        return PythonLexer(stripnl=False)
    return TextLexer(stripnl=False)


def highlighted(text: str, lexer: Any) -> str:
    """Source as highlighted HTML (Pygments, inline styles); plain escaped text when very long."""
    if len(text) > MAX_HIGHLIGHT_CHARS:
        return format_html('<pre class="text code">{}</pre>', text)
    return mark_safe(highlight(text, lexer, HtmlFormatter(noclasses=True, cssclass="highlight")))  # noqa: S308 (escaped by Pygments)


def diff_html(before: str, after: str, *, before_label: str = "before", after_label: str = "after") -> str:
    """A unified diff as HTML lines coloured by kind; empty when nothing changed."""
    lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), before_label, after_label, lineterm="", n=3))
    if not lines:
        return ""
    kinds = [("+++", "hdr"), ("---", "hdr"), ("@@", "hunk"), ("+", "add"), ("-", "del")]
    spans = [format_html('<span class="{}">{}</span>', next((k for p, k in kinds if line.startswith(p)), "ctx"),
                         line or " ") for line in lines]
    return mark_safe('<pre class="text diff">' + "".join(spans) + "</pre>")  # noqa: S308 (each line escaped)


def _one_line(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True, cls=DjangoJSONEncoder)
    text = " ".join(text.split())
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _outcome(record: dict[str, Any]) -> tuple[str, bool]:
    """(label, is_error) of one executed call: errors and environment errors in red, never green."""
    if record.get("error"):
        return ("refused: " + str(record.get("error_kind")) if record.get("error_kind") else "error"), True
    if record.get("env_error"):
        return "environment error", True
    if record.get("timed_out"):
        return "timed out", True
    exit_code = record.get("exit_code")
    if isinstance(exit_code, int):
        return f"exit {exit_code}", exit_code != 0
    return "ok", False


def _decorate(action: Action, record: dict[str, Any], files: dict[str, str]) -> None:
    """Fill the summary, outcome, highlighted code, file diff and state diff of one recorded call."""
    action.state, action.is_error = _outcome(record)
    action.duration_ms = record.get("duration_ms") if isinstance(record.get("duration_ms"), int) else None
    _show_arguments(action, record.get("arguments"), files, failed=bool(record.get("error")))
    if "state_before" in record or "state_after" in record:
        action.state_diff = diff_html(pretty_json(record.get("state_before")), pretty_json(record.get("state_after")),
                                      before_label="state before", after_label="state after") or "unchanged"


def _show_arguments(action: Action, args: Any, files: dict[str, str], *, failed: bool = False) -> None:
    """The call's summary line; code arguments highlighted, a file write as a diff, the rest as JSON."""
    tool = action.name.lower()
    if isinstance(args, str):
        try:
            args = json_limits.loads(args)
        except ValueError:
            action.summary = _one_line(args)
            return
    if isinstance(args, dict):
        path = next((str(args[k]) for k in PATH_KEYS if isinstance(args.get(k), str)), "")
        key = next((k for k in CODE_KEYS if isinstance(args.get(k), str)), "")
        if path:
            action.summary = _one_line(path)
        elif key:
            action.summary = _one_line((args[key].strip().splitlines() or [""])[0])
        else:
            action.summary = _one_line(args)
        if key:
            source = args[key]
            if path and key == "content" and not failed:
                previous = files.get(path)
                files[path] = source
                if previous is not None:
                    action.diff = diff_html(previous, source, before_label=f"{path} (before)", after_label=f"{path} (after)")
                else:
                    action.new_file = True
            if not action.diff:
                action.code = highlighted(source, _lexer(tool, key, path))
            rest = {k: v for k, v in args.items() if k != key}
            action.arguments = pretty_json(rest) if rest else ""
    else:
        action.summary = _one_line(args if args is not None else "")


def _conversation(messages: list[Any]) -> list[Message]:
    conversation = []
    for message in messages:
        if not isinstance(message, dict):
            conversation.append(Message(role="?", text=plain_text(message)))
            continue
        calls = []
        raw_calls = message.get("tool_calls")
        for call in raw_calls if isinstance(raw_calls, list) else []:
            function = call.get("function") if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
            if function:
                calls.append((str(function.get("name") or "?"), arguments_text(function.get("arguments", ""))))
            else:
                calls.append(("?", plain_text(call)))
        conversation.append(Message(
            role=str(message.get("role") or "?"), text=plain_text(message.get("content")), calls=calls,
            call_id=str(message.get("tool_call_id") or ""),
        ))
    return conversation


def _steps_from_records(records: list[Any], seen: dict[str, Any] | None = None) -> list[Step]:
    """One step per record the agent loop wrote (observation, thought, tool, arguments, output, ...).

    `seen` is the start page's screenshot when the model was shown one; after that, each step
    acted on the previous step's last image."""
    steps: list[Step] = []
    previous_turn: Any = object()
    files: dict[str, str] = {}  # path -> content last written by the agent, for the next write's diff
    previous_outputs: set[str] = set()
    turn_outputs: list[str] = []
    for n, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            steps.append(Step(number=n, observations=[], thought="", actions=[Action("?", "", result=plain_text(record))]))
            continue
        turn = record.get("turn")
        reasoning = record.get("reasoning_content")
        new_turn = turn != previous_turn or turn is None
        if new_turn:
            previous_outputs = {o.strip() for o in turn_outputs} | {"\n".join(turn_outputs).strip()}
            turn_outputs = []
        # Calls of one model reply share its observation; show it once, on the first of them, and
        # not at all when it only repeats the previous step's result (shown there already).
        observation = plain_text(record.get("observation")) if new_turn else ""
        if observation.strip() in previous_outputs:
            observation = ""
        previous_turn = turn
        turn_outputs.append(plain_text(record.get("output")))
        steps.append(Step(
            number=n,
            turn=turn if isinstance(turn, int) else None,
            observations=[("", observation)] if observation else [],
            thought=plain_text(record.get("thought")),
            # The loop records reasoning as the thought when the reply had no other text.
            reasoning=plain_text(reasoning) if reasoning and reasoning != record.get("thought") else "",
            actions=[Action(
                name=str(record.get("tool") or "?"),
                arguments=arguments_text(record.get("arguments", "")),
                call_id=str(record.get("tool_call_id") or ""),
                result=plain_text(record["output"]) if "output" in record else None,
                meta=_step_meta(record),
                screenshot=step_screenshot(record, seen),
            )],
        ))
        images = record.get("images")
        if isinstance(images, list) and images and isinstance(images[-1], dict):
            seen = images[-1]
        action = steps[-1].actions[0]
        _decorate(action, record, files)
        llm = record.get("llm") if isinstance(record.get("llm"), dict) else {}
        usage = llm.get("usage") if isinstance(llm.get("usage"), dict) else {}
        if new_turn and isinstance(usage.get("total_tokens"), int):
            action.tokens = usage["total_tokens"]
    return steps


def _steps_from_messages(messages: list[Any]) -> tuple[list[Step], list[tuple[str, str]]]:
    """Each assistant message starts a step; role=tool messages are matched to calls by id."""
    steps: list[Step] = []
    pending: list[tuple[str, str]] = []
    by_call_id: dict[str, Action] = {}
    files: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict):
            pending.append(("message", plain_text(message)))
            continue
        role = message.get("role")
        if role == "system":
            continue  # shown in the conversation
        if role == "assistant":
            actions = []
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                call = call if isinstance(call, dict) else {"function": {"arguments": call}}
                function = call.get("function") if isinstance(call.get("function"), dict) else {}
                action = Action(
                    name=str(function.get("name") or call.get("type") or "call"),
                    arguments=arguments_text(function.get("arguments", "")),
                    call_id=str(call.get("id") or ""),
                )
                _show_arguments(action, function.get("arguments", ""), files)
                actions.append(action)
                if action.call_id:
                    by_call_id[action.call_id] = action
            steps.append(Step(number=len(steps) + 1, observations=pending, thought=plain_text(message.get("content")),
                              actions=actions))
            pending = []
        elif role == "tool" and (action := by_call_id.get(str(message.get("tool_call_id") or ""))) \
                and action.result is None:
            action.result = plain_text(message.get("content"))
        else:
            label = "task" if role == "user" and not steps and not pending else str(role or "message")
            pending.append((label, plain_text(message.get("content"))))
    return steps, pending


def episode_from(messages: Any, steps: Any) -> Episode:
    """The episode as observation -> thought -> action -> result steps, plus the conversation.

    The agent loop's `steps` records are the source when there are any; otherwise steps are
    rebuilt from the chat-format `messages`. Malformed entries are shown as text, never
    dropped or raised on.
    """
    messages = messages if isinstance(messages, list) else [messages] if messages else []
    records = steps if isinstance(steps, list) else [steps] if steps else []
    conversation = _conversation(messages)
    if records:
        # One query, and only for an episode with screenshots: the start page the agent first acted on.
        shots = any(isinstance(r, dict) and r.get("images") for r in records)
        return Episode(steps=_steps_from_records(records, first_image(messages) if shots else None), source="steps",
                       conversation=conversation)
    built, trailing = _steps_from_messages(messages)
    return Episode(steps=built, source="messages", conversation=conversation, trailing=trailing)
