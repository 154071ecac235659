"""The episode's final answer as the model's last message: export option `final_answer`.

The agent loop ends an episode on an accepted call of the scene's finish tool (`finish(answer)`;
search2qa's `propose_qa`, a delegated role's `finish` report, a round_robin role's `say`), answers
it with the acknowledgement FINISH_ACK, and answers calls made after it in the same turn with
NOT_EXECUTED (apps/engines/agent.py). A model trained on that learns to call a tool no deployment
has, so the chat formats render the record through `as_text` by default (final_answer "text"):

* the accepted finish call leaves its turn and the answer follows the turn's tool results as an
  assistant message: its text the answer (the record's `final_answer` for the episode's last
  finish, the runtime's reading of it; the call's `answer` argument for an earlier finish of a
  multi-turn episode), its `reasoning_content` the turn's reasoning and, when finish was the
  turn's only call, the text written beside it (a format with a place for reasoning keeps it);
* the acknowledgement, calls made after the finish and their NOT_EXECUTED results, and their steps
  go; so do the finish tools (`finish` and every tool an accepted call named) from `tools`;
* a JSON-text episode (tool_mode json) has its finish action in the assistant's text and the
  acknowledgement in a user message "[finish result]\\n…": the text becomes the answer, the
  user message goes;
* the system message says to answer in text: each sentence of the scene's prompt that names the finish
  tool is replaced by its text-form sentence, as the scene's runtime declares them
  (`text_form_rewrites`, read through apps.engines.registry.text_form_rewrites; exact substrings, the
  longest first; a JSON-text episode's tool section as textactions.json_action_text_form says); a
  system message that still names a finish tool after them (an episode recorded by an older prompt)
  is reported in `stale` and exported as it is;
* sub-episodes (a multi_agent record's `subtrajectories`) are rendered the same way, with the
  record's scene's rewrites.

A `finish` call answered otherwise but not with an error (an episode another version stored, or
imported), or not answered at all (a next-action sample ending on it), counts as accepted. A finish call the loop did not accept (refused arguments, the
wall-clock limit: its result an error) has no answer to write: the record is excluded saying so. final_answer "tool" exports the record as it ran (the
SWE-agent / OpenHands submit-tool style). Other platform tools keep their meaning: `ask_user` is
the assistant asking in text and the user's reply a user turn in every chat format
(chat.render_messages), `delegate` stays a tool call whose result is the role's report.
"""
from __future__ import annotations

import re
from typing import Any

from apps.engines.registry import text_form_rewrites
from apps.engines.textactions import json_action_text_form, parse_json_action

from .chat import RenderError, parse_arguments

# The loop's texts (apps/engines/agent.py; toolace's runtime FINISH_OUTPUT): tests/datasets check
# they are still the ones it writes.
FINISH_ACK = "finish accepted; the episode ends"
NOT_EXECUTED = "not executed: the episode already ended with finish"
FINISH = "finish"
MODES = ("text", "tool")
ANSWER_KEYS = ("answer", "report", "message", "summary")  # what the scenes' finish tools call their answer


def check_mode(value: Any) -> str:
    if value not in MODES:
        raise ValueError(f"final_answer: one of {', '.join(MODES)}")
    return value


def _answer_of(arguments: Any) -> str:
    args = parse_arguments(arguments) if not isinstance(arguments, dict) else arguments
    for key in ANSWER_KEYS:
        value = (args or {}).get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _answered(result: Any) -> bool:
    """A finish call's result that is not an error: an episode stored by another version or imported
    acknowledges its finish in its own words ("ok", "finish accepted")."""
    return isinstance(result, str) and result != NOT_EXECUTED and not result.startswith(("error", "not executed"))


def _json_ack(msg: Any) -> str | None:
    """The tool name of a JSON-text episode's acknowledgement message "[name result]\\n<ack>", else None."""
    content = msg.get("content") if isinstance(msg, dict) and msg.get("role") == "user" else None
    if isinstance(content, str) and content.startswith("[") and content.endswith(f" result]\n{FINISH_ACK}"):
        return content[1:-len(f" result]\n{FINISH_ACK}")]
    return None


def _results(messages: list[Any]) -> dict[Any, str]:
    return {m.get("tool_call_id"): m.get("content") for m in messages
            if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("content"), str)}


def _answer_message(answer: str, thoughts: list[Any]) -> dict[str, Any]:
    if not answer:
        raise RenderError("the episode's finish gave no answer: there is no final message to write "
                          "(final_answer tool keeps the call)")
    item: dict[str, Any] = {"role": "assistant", "content": answer}
    thought = "\n\n".join(t.strip() for t in thoughts if isinstance(t, str) and t.strip())
    if thought:
        item["reasoning_content"] = thought
    return item


def _rewrites_of(record: dict[str, Any]) -> dict[str, str | None]:
    task = record.get("task") if isinstance(record.get("task"), dict) else {}
    scene, config = task.get("scene"), task.get("scene_config")
    return text_form_rewrites(scene, config if isinstance(config, dict) else None) if isinstance(scene, str) else {}


def _in_order(scene: dict[str, str | None], tools: Any, names: set[Any]) -> list[tuple[str, str | None]]:
    """The scene's rewrites and those of a JSON-text episode's tool section (its finish tools' lines),
    the longest first."""
    finish_tools = [t for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
                    and t["function"].get("name") in names] if isinstance(tools, list) else []
    rewrites = {**json_action_text_form(finish_tools), **scene}
    return sorted(rewrites.items(), key=lambda item: -len(item[0]))


def _mentions(names: set[Any]) -> re.Pattern[str]:
    """A finish tool named as a call: `name(`, "call name", `name` in backquotes; the word finish itself."""
    alternatives = [r"\bfinish\b"]
    for name in sorted(n for n in names if isinstance(n, str) and n):
        n = re.escape(name)
        alternatives += [rf"\b{n}\(", rf"\bcall(?:s|ing)?\s+`?{n}\b", rf"`{n}`"]
    return re.compile("|".join(alternatives), re.I)


def _text_form_prompt(text: str, rewrites: list[tuple[str, str | None]]) -> str:
    for old, new in rewrites:
        text = text.replace(old, new or "")
    return text


def _system_in_text_form(messages: list[Any], rewrites: list[tuple[str, str | None]], names: set[Any],
                         stale: list[str] | None, where: str) -> list[Any]:
    out = []
    mention = _mentions(names)
    for i, msg in enumerate(messages):
        if isinstance(msg, dict) and msg.get("role") == "system":
            content = msg.get("content")
            if isinstance(content, str):
                msg = {**msg, "content": _text_form_prompt(content, rewrites)}
                texts = [msg["content"]]
            elif isinstance(content, list):
                msg = {**msg, "content": [{**part, "text": _text_form_prompt(part["text"], rewrites)}
                                          if isinstance(part, dict) and isinstance(part.get("text"), str) else part
                                          for part in content]}
                texts = [part["text"] for part in msg["content"] if isinstance(part, dict)
                         and isinstance(part.get("text"), str)]
            else:
                texts = []
            found = next((m.group(0) for t in texts if (m := mention.search(t))), None)
            if found is not None and stale is not None:
                stale.append(f"{where} messages[{i}]: the system prompt still says {found!r} (no text-form "
                             "rewrite matches it)")
        out.append(msg)
    return out


def as_text(record: dict[str, Any], stale: list[str] | None = None, *,
            rewrites: dict[str, str | None] | None = None) -> dict[str, Any]:
    """The record with its finish calls rendered as final answers and its system prompt saying to
    answer in text (the module doc); unchanged when it has no accepted finish, offers no finish tool
    and its prompt names none. `stale` collects where a system prompt names a finish tool no rewrite
    matched; `rewrites` are the record's scene's (sub-episodes get their parent's)."""
    messages = record.get("messages")
    if not isinstance(messages, list):
        return record  # the format's renderer says what is wrong
    if rewrites is None:
        rewrites = _rewrites_of(record)
    results = _results(messages)
    accepted: set[Any] = set()
    skipped: set[Any] = set()
    names = {FINISH}
    total = 0  # accepted finishes, native and JSON-text
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        if (name := _json_ack(msg)) is not None:
            names.add(name)
            total += 1
        for call in (msg.get("tool_calls") or []) if msg.get("role") == "assistant" else []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                continue
            result = results.get(call.get("id"))
            if result == FINISH_ACK or (fn.get("name") == FINISH and (result is None or _answered(result))):
                accepted.add(call.get("id"))
                names.add(fn.get("name"))
                total += 1
            elif result == NOT_EXECUTED:
                skipped.add(call.get("id"))
    out: list[Any] = []
    pending: dict[str, Any] | None = None  # the answer, once the finish turn's other results are in
    seen = 0

    def answer_for(arguments: Any) -> str:
        last = record.get("final_answer")
        if seen == total and isinstance(last, str) and last.strip():
            return last.strip()
        return _answer_of(arguments)

    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            out.append(msg)
            continue
        role = msg.get("role")
        if role == "tool":
            if msg.get("tool_call_id") not in accepted | skipped:
                out.append(msg)
            continue
        if pending is not None:
            out.append(pending)
            pending = None
        if _json_ack(msg) is not None:
            seen += 1
            previous = out[-1] if out else None
            action = parse_json_action(previous.get("content")) if isinstance(previous, dict) \
                and previous.get("role") == "assistant" and not previous.get("tool_calls") else None
            if action is None:
                raise RenderError(f"messages[{i}]: a finish acknowledgement after no finish action")
            text = previous["content"]
            out[-1] = _answer_message(answer_for(action.arguments), [
                previous.get("reasoning_content"), text[: action.span[0]] + text[action.span[1]:]])
            continue
        calls = msg.get("tool_calls") if role == "assistant" else None
        if not calls:
            out.append(msg)
            continue
        finish = next((c for c in calls if isinstance(c, dict) and c.get("id") in accepted), None)
        kept = [c for c in calls if not (isinstance(c, dict) and c.get("id") in accepted | skipped)]
        for c in kept:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict) and fn.get("name") in names:
                said = (results.get(c.get("id")) or "no result")[:200]
                raise RenderError(f"messages[{i}]: a {fn.get('name')} call the loop did not accept (its result: "
                                  f"{said}): it has no answer to write as text (final_answer tool keeps the call)")
        if finish is None:
            out.append(msg)
            continue
        seen += 1
        answer = answer_for(finish["function"].get("arguments"))
        if kept:
            out.append({**msg, "tool_calls": kept})
            pending = _answer_message(answer, [])
        else:
            rest = {k: v for k, v in msg.items() if k not in ("tool_calls", "content", "reasoning_content")}
            pending = {**rest, **_answer_message(answer, [msg.get("reasoning_content"), msg.get("content")])}
    if pending is not None:
        out.append(pending)
    dropped = accepted | skipped
    where = f"trajectory {record.get('trajectory_id')}"
    new = {**record, "messages": _system_in_text_form(out, _in_order(rewrites, record.get("tools"), names), names,
                                                      stale, where)}
    if isinstance(record.get("tools"), list):
        new["tools"] = [t for t in record["tools"] if not (
            isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") in names)]
    if isinstance(record.get("steps"), list):
        new["steps"] = [s for s in record["steps"] if not (isinstance(s, dict) and (
            (s.get("tool_call_id") is not None and s.get("tool_call_id") in dropped)
            or (s.get("tool_call_id") is None and s.get("output") == FINISH_ACK)))]
    if isinstance(record.get("subtrajectories"), list) and record["subtrajectories"]:
        new["subtrajectories"] = [as_text(child, stale, rewrites=rewrites) for child in record["subtrajectories"]]
    return new
