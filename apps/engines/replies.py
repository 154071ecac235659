"""Model replies made one shape before the agent loop stores them, and the history sent back.

A provider's profile (apps.engines.profiles) says where its reasoning arrives, whether it may sit
in the content as `<think>...</think>`, how tool calls look when no server-side parser runs, and
how reasoning must go back. Whatever the provider, a stored assistant message is

    {"role": "assistant", "content": <visible text or None>, "reasoning_content": <text, if any>,
     "tool_calls": [{"id": <unique in the episode>, "type": "function", "function": {...}}]}

* Reasoning: the first non-empty field of `profile.reasoning_fields` (`reasoning_content`,
  `reasoning`, ...) becomes `reasoning_content`; the other fields are dropped. With
  `profile.think_tags`, `<think>...</think>` blocks in the content (and a leading reasoning that
  ends in `</think>` without its opening tag, as templates that open the block in the prompt
  produce) are moved there too, joined by a blank line: the stored content is the visible answer
  only, so the exporters' reasoning options decide whether trainers see it.
* Text tool calls (`profile.text_tool_format`, a server without a tool-call parser): the calls
  written in the content are parsed by that format and become the message's `tool_calls`; their
  text is removed from the content. Formats: "hermes" (`<tool_call>{"name", "arguments"}</tool_call>`,
  Qwen and Hermes templates), "llama_json" (bare `{"name", "parameters"}` objects, optionally
  after `<|python_tag|>`, separated by `;` or new lines), "mistral" (`[TOOL_CALLS]` followed by a
  JSON list of `{"name", "arguments"}`, or by `name[ARGS]{json}` items).
* Tool-call ids: a missing, empty or repeated id (within the reply or with any earlier id of the
  episode) is replaced by `call_<turn>_<n>` (made unique); the provider's own id is returned in
  `provider_ids` for the step record. Calls and results then always pair.

`api_messages(messages, profile)` is the history as the provider must receive it: reasoning sent
back by `profile.reasoning_echo` — "never" (stripped), "tool_turns" (kept on assistant turns that
made tool calls, in every later request), "always" — under `profile.reasoning_echo_field`.
Nothing else changes between turns, so each request extends the previous one byte for byte
(prompt caching) unless the context budget had to elide an observation.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

REASONING_KEY = "reasoning_content"  # the one field a stored message keeps reasoning under
KNOWN_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
TEXT_TOOL_FORMATS = ("hermes", "llama_json", "mistral")
ECHO_RULES = ("never", "tool_turns", "always")

_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_MISTRAL_ARGS = re.compile(r"([A-Za-z_][\w.\-]*)\[ARGS\]")
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_TAG = "[TOOL_CALLS]"


@dataclass
class Reply:
    """A normalised assistant message and what normalising it did."""

    message: dict[str, Any]
    reasoning: str = ""
    text_tool_format: str = ""  # the format its tool calls were read from ("" = native or none)
    provider_ids: list[Any] = field(default_factory=list)  # per tool call: the id the provider sent
    unparsed: str = ""  # a text tool call that could not be read (kept in the content)


def _profile_value(profile: Any, name: str, default: Any) -> Any:
    return getattr(profile, name, default) if profile is not None else default


def split_think(content: str) -> tuple[str, str]:
    """(visible content, reasoning) of a content that may carry `<think>` blocks."""
    reasoning: list[str] = []
    if "</think>" in content and "<think>" not in content.split("</think>", 1)[0]:
        head, content = content.split("</think>", 1)  # the block was opened by the prompt
        reasoning.append(head.strip())
    reasoning += [m.group(1).strip() for m in _THINK.finditer(content)]
    content = _THINK.sub("", content)
    return content.strip(), "\n\n".join(r for r in reasoning if r)


def _call(name: Any, arguments: Any) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name.strip():
        return None
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": "", "type": "function", "function": {"name": name.strip(), "arguments": arguments}}


def _from_object(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    args = obj.get("arguments", obj.get("parameters", {}))
    return _call(obj.get("name"), args)


def _json_objects(text: str) -> tuple[list[Any], list[tuple[int, int]]]:
    """Every top-level JSON value in `text` that starts with { or [, and where each sat."""
    decoder = json.JSONDecoder()
    found, spans, i = [], [], 0
    while i < len(text):
        if text[i] in "{[":
            try:
                obj, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            found.append(obj)
            spans.append((i, end))
            i = end
        else:
            i += 1
    return found, spans


def parse_text_tool_calls(content: str, fmt: str) -> tuple[list[dict[str, Any]], str, str]:
    """(calls, content without them, text of a call that could not be read) for one format."""
    if fmt == "hermes":
        calls, bad = [], []
        for m in _HERMES.finditer(content):
            try:
                call = _from_object(json.loads(m.group(1)))
            except json.JSONDecodeError:
                call = None
            if call is None:
                bad.append(m.group(0))
            else:
                calls.append(call)
        if bad:
            return [], content, bad[0]
        return calls, _HERMES.sub("", content).strip(), ""
    if fmt == "llama_json":
        text = content.replace(_PYTHON_TAG, "")
        objects, spans = _json_objects(text)
        calls, keep, last = [], [], 0
        for obj, (start, end) in zip(objects, spans):
            # A call names its function and has its arguments; any other JSON is the model's text.
            is_call = isinstance(obj, dict) and "name" in obj and ("parameters" in obj or "arguments" in obj)
            call = _from_object(obj) if is_call else None
            if call is None:
                continue
            calls.append(call)
            keep.append(text[last:start])
            last = end
        keep.append(text[last:])
        rest = "".join(keep)
        rest = re.sub(r"^[\s;]+|[\s;]+$", "", rest) if calls else content.strip()
        return calls, rest, ""
    if fmt == "mistral":
        if _MISTRAL_TAG not in content:
            return [], content, ""
        before, after = content.split(_MISTRAL_TAG, 1)
        after = after.replace(_MISTRAL_TAG, "")
        calls: list[dict[str, Any]] = []
        named = list(_MISTRAL_ARGS.finditer(after))
        if named:  # name[ARGS]{json} items (the newer tokenizers)
            decoder = json.JSONDecoder()
            for m in named:
                try:
                    args, _ = decoder.raw_decode(after, m.end())
                except json.JSONDecodeError:
                    return [], content, after.strip()
                call = _call(m.group(1), args)
                if call is not None:
                    calls.append(call)
            return calls, before.strip(), ""
        try:
            obj, _ = json.JSONDecoder().raw_decode(after.lstrip())
        except json.JSONDecodeError:
            return [], content, after.strip()
        for item in obj if isinstance(obj, list) else [obj]:
            call = _from_object(item)
            if call is None:
                return [], content, after.strip()
            calls.append(call)
        return calls, before.strip(), ""
    raise ValueError(f"unknown text tool-call format {fmt!r} (known: {', '.join(TEXT_TOOL_FORMATS)})")


def normalize_reply(raw: dict[str, Any], profile: Any, *, turn: int, used_ids: set[str]) -> Reply:
    """The stored form of one assistant message (see the module docstring); `used_ids` (the
    episode's tool-call ids so far) gets this reply's ids added."""
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
    fields = tuple(_profile_value(profile, "reasoning_fields", ("reasoning_content",)))
    # Every field a reply may carry reasoning in is taken out; the profile's order says which wins.
    candidates = {f: raw.get(f) for f in dict.fromkeys((*fields, *KNOWN_REASONING_FIELDS))}
    reasoning = next((v for f in fields if isinstance(v := candidates.get(f), str) and v.strip()), "")
    if not reasoning:
        reasoning = next((v for v in candidates.values() if isinstance(v, str) and v.strip()), "")
    content = message["content"]
    if isinstance(content, str) and _profile_value(profile, "think_tags", False) and "think>" in content:
        content, in_content = split_think(content)
        reasoning = "\n\n".join(r for r in (reasoning.strip(), in_content) if r)
        message["content"] = content or None
    if reasoning:
        message[REASONING_KEY] = reasoning
    calls = [dict(c) for c in raw.get("tool_calls") or []]
    fmt = _profile_value(profile, "text_tool_format", None) or ""
    unparsed = ""
    if not calls and fmt and isinstance(message["content"], str):
        calls, rest, unparsed = parse_text_tool_calls(message["content"], fmt)
        if calls:
            message["content"] = rest or None
        else:
            fmt = ""
    else:
        fmt = ""
    provider_ids: list[Any] = []
    for n, call in enumerate(calls):
        given = call.get("id")
        provider_ids.append(given)
        if not isinstance(given, str) or not given or given in used_ids:
            new, k = f"call_{turn}_{n}", 1
            while new in used_ids:
                k += 1
                new = f"call_{turn}_{n}_{k}"
            call["id"] = new
        used_ids.add(call["id"])
    if calls:
        message["tool_calls"] = calls
    return Reply(message, reasoning, fmt, provider_ids, unparsed)


def api_messages(messages: list[dict[str, Any]], profile: Any) -> list[dict[str, Any]]:
    """The stored history as the provider must be sent it (the reasoning echo rule)."""
    rule = _profile_value(profile, "reasoning_echo", "never") or "never"
    if rule not in ECHO_RULES:
        raise ValueError(f"unknown reasoning_echo {rule!r} (known: {', '.join(ECHO_RULES)})")
    echo_field = _profile_value(profile, "reasoning_echo_field", REASONING_KEY) or REASONING_KEY
    out = []
    for m in messages:
        if REASONING_KEY not in m:
            out.append(m)
            continue
        reasoning = m[REASONING_KEY]
        m = {k: v for k, v in m.items() if k != REASONING_KEY}
        if rule == "always" or (rule == "tool_turns" and m.get("tool_calls")):
            m[echo_field] = reasoning
        out.append(m)
    return out
