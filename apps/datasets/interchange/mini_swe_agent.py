"""mini-swe-agent's trajectory JSON (`<instance_id>.traj.json`), import only (the package's
docstring describes the mapping)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ._common import InterchangeError, _args_text, _foreign_record

_MSWEA_BLOCK = re.compile(r"```(?:mswea_bash_command|bash)\s*\n(.*?)\n```", re.S)
_RETURNCODE = re.compile(r"^\s*<returncode>")


def from_mini_swe_agent(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise InterchangeError(f"{label}: not a mini-swe-agent trajectory (no messages list)")
    info = obj.get("info") if isinstance(obj.get("info"), dict) else {}
    messages: list[dict[str, Any]] = []
    pending: list[str] = []  # call ids of the last assistant turn still waiting for output
    for i, msg in enumerate(obj["messages"]):
        if not isinstance(msg, dict):
            raise InterchangeError(f"{label}: messages[{i}] is not an object")
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        content = content if isinstance(content, str) else ""
        if role == "exit":
            break
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": content or None}
            if isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
                out["reasoning_content"] = msg["reasoning_content"]
            if msg.get("tool_calls"):
                out["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
                    for c in msg["tool_calls"]]
                pending = []
            else:
                actions = ((msg.get("extra") or {}).get("actions")) or [
                    {"command": m} for m in _MSWEA_BLOCK.findall(content)]
                if actions:
                    out["tool_calls"] = [{"id": f"mswea_{i}_{k}", "type": "function", "function": {
                        "name": "bash", "arguments": _args_text({"command": a.get("command", "")})}}
                        for k, a in enumerate(actions)]
                    pending = [c["id"] for c in out["tool_calls"]]
                elif out["content"] is None:
                    out["content"] = ""
            messages.append(out)
        elif role == "tool":
            messages.append({"role": "tool", "tool_call_id": msg.get("tool_call_id"), "name": "bash",
                             "content": content})
        elif role == "user" and pending and _RETURNCODE.match(content):
            messages.append({"role": "tool", "tool_call_id": pending.pop(0), "name": "bash", "content": content})
        elif role in ("system", "user"):
            if pending:  # a format error message or the like answers the turn's calls
                for call_id in pending:
                    messages.append({"role": "tool", "tool_call_id": call_id, "name": "bash", "content": content})
                pending = []
                continue
            messages.append({"role": role, "content": content})
        else:
            raise InterchangeError(f"{label}: messages[{i}]: unsupported role {role!r}")
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    model = (((info.get("config") or {}).get("model") or {}).get("model_name")) or ""
    instance = str(obj.get("instance_id") or Path(options.get("file", "")).name.removesuffix(".traj.json") or n)
    source = {"format": "mini-swe-agent", "trajectory_format": obj.get("trajectory_format") or "",
              "mini_version": info.get("mini_version") or "", "instance_id": instance,
              "exit_status": info.get("exit_status") or "", "file": options.get("file", ""),
              "agent_type": ((info.get("config") or {}).get("agent_type")) or ""}
    return _foreign_record(messages, n=n, external_id=instance, source=source, options=options, model=model,
                           final_answer=info.get("submission") or "", cost=float(stats.get("instance_cost") or 0.0))
