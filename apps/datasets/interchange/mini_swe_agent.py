"""mini-swe-agent's trajectory JSON (`<instance_id>.traj.json`, trajectory_format "mini-swe-agent-1.1"):
read a saved trajectory, and write ours in its shape (the package's docstring describes the mapping)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from apps.datasets.record_schema import RenderError

from ._common import (
    InterchangeError, _args_object, _args_text, _foreign_record, document_rest, imported_from, keep_rest, kept_of,
    parts_text, put_kept, reasoning_of, record_messages, refuse, restore, type_problems,
)

TRAJECTORY_FORMAT = "mini-swe-agent-1.1"  # what mini-swe-agent 2.x saves, and what the export writes
# What the reader takes: its saved trajectories (an object with messages; info and
# trajectory_format as 1.x and 2.x save them), text mode (fenced commands) and tool-call mode.
TRAJECTORY_FORMATS = ("mini-swe-agent-1.0", "mini-swe-agent-1.1")
FORMAT = "mini-swe-agent"
_MSWEA_BLOCK = re.compile(r"```(?:mswea_bash_command|bash)\s*\n(.*?)\n```", re.S)
_RETURNCODE = re.compile(r"^\s*<returncode>")
_TEXT_CALL = "mswea_"  # the ids of calls read from a fenced command (text mode has no call ids)
ROLES = ("system", "user", "assistant", "tool", "exit")


def _image_part(part: dict[str, Any]) -> Any:
    """What an image part of a message (OpenAI's image_url) names."""
    if part.get("type") != "image_url":
        return None
    named = part.get("image_url")
    return str((named.get("url") if isinstance(named, dict) else named) or "an image part without a url")


def _returncode(msg: dict[str, Any]) -> int | None:
    code = (msg.get("extra") or {}).get("returncode") if isinstance(msg.get("extra"), dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _read_problems(obj: dict[str, Any]) -> list[str]:
    """The values of a saved trajectory the reader would misread: the types of what it takes."""
    problems = type_problems(obj, "line", strings=("instance_id", "trajectory_format"), objects=("info",))
    info = obj.get("info") if isinstance(obj.get("info"), dict) else {}
    problems += type_problems(info, "line.info", strings=("submission", "exit_status", "mini_version"),
                              objects=("config", "model_stats"))
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    problems += type_problems(config, "line.info.config", strings=("agent_type",), objects=("model",))
    if isinstance(config.get("model"), dict):
        problems += type_problems(config["model"], "line.info.config.model", strings=("model_name",))
    if isinstance(info.get("model_stats"), dict):
        problems += type_problems(info["model_stats"], "line.info.model_stats", costs=("instance_cost",))
    for i, msg in enumerate(obj["messages"]):
        at = f"line.messages[{i}]"
        if not isinstance(msg, dict):
            problems.append(f"{at}: must be an object")
            continue
        if msg.get("role") == "exit" and i != len(obj["messages"]) - 1:  # the reader stops at it
            problems.append(f"{at}: the exit message must be the last ({len(obj['messages']) - 1 - i} after it)")
        problems += type_problems(msg, at, strings=("tool_call_id", "reasoning_content"), objects=("extra",),
                                  lists=("tool_calls",))
        if msg.get("content") is not None and not isinstance(msg["content"], (str, list)):
            problems.append(f"{at}.content: a string, content parts or null")
        for k, call in enumerate(msg.get("tool_calls") if isinstance(msg.get("tool_calls"), list) else []):
            fn = call.get("function") if isinstance(call, dict) else None
            if not (isinstance(fn, dict) and isinstance(call.get("id"), str) and isinstance(fn.get("name"), str)
                    and fn["name"] and isinstance(fn.get("arguments"), (str, type(None)))):
                problems.append(f"{at}.tool_calls[{k}]: needs an id, a function name and arguments (a JSON string)")
        extra = msg.get("extra") if isinstance(msg.get("extra"), dict) else {}
        actions = extra.get("actions")
        if actions is not None and not (isinstance(actions, list) and all(
                isinstance(a, dict) and isinstance(a.get("command", ""), str) for a in actions)):
            problems.append(f"{at}.extra.actions: a list of {{command: a string}}")
    return problems


def from_mini_swe_agent(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise InterchangeError(f"{label}: not a mini-swe-agent trajectory (no messages list)")
    refuse(_read_problems(obj), label, "a mini-swe-agent trajectory")
    info = obj.get("info") if isinstance(obj.get("info"), dict) else {}
    messages: list[dict[str, Any]] = []
    made: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (our message, the file's message) to keep_rest
    pending: list[str] = []  # call ids of the last assistant turn still waiting for output
    exit_message: dict[str, Any] | None = None
    for i, msg in enumerate(obj["messages"]):
        if not isinstance(msg, dict):
            raise InterchangeError(f"{label}: messages[{i}] is not an object")
        role = msg.get("role")
        content = parts_text(msg.get("content"), f"{label}: messages[{i}].content", _image_part)
        if role == "exit":
            exit_message = msg
            status = str((msg.get("extra") or {}).get("exit_status") or info.get("exit_status") or "exit")
            for call_id in pending:  # the closing submit's result is how the run ended
                messages.append({"role": "tool", "tool_call_id": call_id, "name": "bash", "content": status,
                                 "provenance": {"format": FORMAT, "exit_status": status,
                                                "exit_code": 0 if status == "Submitted" else None}})
            pending = []
            break
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": content or None}
            if reasoning_of(msg):
                out["reasoning_content"] = reasoning_of(msg)
            if msg.get("tool_calls"):
                out["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
                    for c in msg["tool_calls"]]
                pending = [c["id"] for c in out["tool_calls"]]
            else:
                actions = ((msg.get("extra") or {}).get("actions")) or [
                    {"command": m} for m in _MSWEA_BLOCK.findall(content)]
                if actions:
                    out["tool_calls"] = [{"id": f"{_TEXT_CALL}{i}_{k}", "type": "function", "function": {
                        "name": "bash", "arguments": _args_text({"command": a.get("command", "")})}}
                        for k, a in enumerate(actions)]
                    pending = [c["id"] for c in out["tool_calls"]]
                elif out["content"] is None:
                    out["content"] = ""
            messages.append(out)
        elif role == "tool":
            if msg.get("tool_call_id") in pending:
                pending.remove(msg["tool_call_id"])
            out = {"role": "tool", "tool_call_id": msg.get("tool_call_id"), "name": "bash", "content": content}
            messages.append(out)
        elif role == "user" and pending and _RETURNCODE.match(content):
            out = {"role": "tool", "tool_call_id": pending.pop(0), "name": "bash", "content": content}
            messages.append(out)
        elif role in ("system", "user"):
            if pending:  # a format error message or the like answers the turn's calls
                for call_id in pending:
                    messages.append({"role": "tool", "tool_call_id": call_id, "name": "bash", "content": content,
                                     "provenance": {"format": FORMAT, "answers_turn": True}})
                made.append((messages[-len(pending)], msg))
                pending = []
                continue
            out = {"role": role, "content": content}
            messages.append(out)
        else:
            raise InterchangeError(f"{label}: messages[{i}]: unsupported role {role!r}")
        if role == "tool" or (role == "user" and messages[-1]["role"] == "tool"):
            code = _returncode(msg)
            if code is not None:
                messages[-1].setdefault("provenance", {"format": FORMAT})["exit_code"] = code
        made.append((messages[-1], msg))
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    model = (((info.get("config") or {}).get("model") or {}).get("model_name")) or ""
    instance = str(obj.get("instance_id") or Path(options.get("file", "")).name.removesuffix(".traj.json") or n)
    source = {"format": FORMAT, "trajectory_format": obj.get("trajectory_format") or "",
              "mini_version": info.get("mini_version") or "", "instance_id": instance,
              "exit_status": info.get("exit_status") or "", "file": options.get("file", ""),
              "agent_type": ((info.get("config") or {}).get("agent_type")) or ""}
    for ours, theirs in made:  # what the export's message does not say (extra: timestamps, costs, raw output)
        put_kept(ours, FORMAT, keep_rest(theirs, _mini_message(ours, messages)))
    record = _foreign_record(messages, n=n, external_id=instance, source=source, options=options, model=model,
                             final_answer=info.get("submission") or "", cost=float(stats.get("instance_cost") or 0.0))
    # the file's own fields (info, instance_id, fields this reader does not know) and its closing message
    source["kept"] = document_rest(obj, _mini_doc(record, []), ("messages",))
    source["exit"] = exit_message
    return record


# --- export ---------------------------------------------------------------------------------------

def _text_mode(call_id: Any) -> bool:
    return isinstance(call_id, str) and call_id.startswith(_TEXT_CALL)


def _mini_message(msg: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A message as mini-swe-agent saves it: text-mode calls are the assistant's fenced command and
    their results user messages; tool-call mode keeps tool_calls and role tool."""
    role = msg.get("role")
    provenance = msg.get("provenance") or {}
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
        if reasoning_of(msg):
            out["reasoning_content"] = reasoning_of(msg)
        calls = msg.get("tool_calls") or []
        if calls and not all(_text_mode(c.get("id")) for c in calls):
            out["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {
                "name": c["function"]["name"], "arguments": c["function"].get("arguments")}} for c in calls]
        actions = []
        for call in calls:
            action = {"command": str(_args_object(call["function"].get("arguments")).get("command", ""))}
            if not _text_mode(call.get("id")):
                action["tool_call_id"] = call.get("id")
            actions.append(action)
        if actions:
            out["extra"] = {"actions": actions}
        return out
    if role == "tool":
        out = {"role": "user", "content": msg.get("content") or ""} if _text_mode(msg.get("tool_call_id")) or \
            provenance.get("answers_turn") else \
            {"role": "tool", "tool_call_id": msg.get("tool_call_id"), "content": msg.get("content") or ""}
        if isinstance(provenance.get("exit_code"), int):
            out["extra"] = {"returncode": provenance["exit_code"]}
        return out
    return {"role": role, "content": msg.get("content") or ""}


def _exit_status(record: dict[str, Any]) -> str:
    """How our episode ended, in mini-swe-agent's words: Submitted when it finished with an answer."""
    if record.get("final_answer") and record.get("outcome") in ("success", "failure"):
        return "Submitted"
    return str(record.get("error") or record.get("outcome_reason") or record.get("outcome") or "")[:200]


def _mini_doc(record: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    status = _exit_status(record)
    info = {"model_stats": {"instance_cost": float(record.get("cost_usd") or 0),
                            "api_calls": sum(1 for m in messages if m.get("role") == "assistant")},
            "config": {"model": {"model_name": record.get("model") or ""}, "agent_type": "trajplatform"},
            "exit_status": status, "submission": record.get("final_answer") or ""}
    return {"info": info, "messages": messages, "trajectory_format": TRAJECTORY_FORMAT}


def render_mini_swe_agent(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    messages = record_messages(record)
    out = []
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool"):
            raise RenderError(f"unsupported message {str(msg)[:60]!r}")
        if isinstance(msg.get("content"), list):
            raise RenderError("a message with image parts has no mini-swe-agent form")
        if msg["role"] == "tool" and (msg.get("provenance") or {}).get("exit_status"):
            continue  # the closing submit's result: the exit message says it
        if msg["role"] == "tool" and (msg.get("provenance") or {}).get("answers_turn") and out \
                and out[-1].get("role") == "user" and kept_of(msg, FORMAT) == {}:
            continue  # one user message answered all of a turn's calls
        out.append(restore(_mini_message(msg, messages), kept_of(msg, FORMAT)))
    source = imported_from(record, FORMAT)
    doc = _mini_doc(record, out)
    if source is not None:
        doc = restore(doc, source.get("kept"))
    closing = source.get("exit") if source is not None and isinstance(source.get("exit"), dict) else {
        "role": "exit", "content": record.get("final_answer") or "",
        "extra": {"exit_status": doc["info"].get("exit_status", ""), "submission": record.get("final_answer") or ""}}
    doc["messages"] = [*out, closing]
    return doc


def validate_mini_swe_agent(obj: Any) -> list[str]:
    """A saved trajectory mini-swe-agent (and our import) reads: info, messages ending in its exit
    message, every command of a turn answered before the next turn."""
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in ("info", "messages", "trajectory_format") if k not in obj]
    if obj.get("trajectory_format") not in (None, *TRAJECTORY_FORMATS):
        problems.append(f"line.trajectory_format: one of {', '.join(TRAJECTORY_FORMATS)}")
    if "info" in obj and not isinstance(obj["info"], dict):
        problems.append("line.info: an object")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        return problems + ["line.messages: a non-empty list"]
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            problems.append(f"line.messages[{i}].role: one of {', '.join(ROLES)}")
        elif not isinstance(msg.get("content"), (str, list)) and msg.get("role") != "assistant":
            problems.append(f"line.messages[{i}].content: a string")
        if isinstance(msg, dict) and msg.get("role") == "exit" and i != len(messages) - 1:
            problems.append(f"line.messages[{i}]: the exit message must be the last")
    if isinstance(messages[-1], dict) and messages[-1].get("role") != "exit":
        problems.append("line.messages: must end with the exit message (role exit)")
    return problems
