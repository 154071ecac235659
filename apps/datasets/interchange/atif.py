"""ATIF (Agent Trajectory Interchange Format, Harbor's RFC 0001): render and validate our export
lines, read a file's trajectories back (the package's docstring describes the mapping)."""
from __future__ import annotations

from typing import Any

from apps.datasets.record_schema import RenderError

from ._common import (
    InterchangeError, _args_object, _args_text, _argument_texts, _as_written, _foreign_record, _head, _ours,
    _provenance, _restore_arguments, _turns,
)

ATIF_VERSION = "ATIF-v1.4"
ATIF_VERSIONS = ("ATIF-v1.0", "ATIF-v1.1", "ATIF-v1.2", "ATIF-v1.3", "ATIF-v1.4", "ATIF-v1.5")
AGENT_NAME = "trajplatform"
AGENT_VERSION = "1"


def render_atif(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("no messages")
    steps: list[dict[str, Any]] = []
    for msg, results in _turns(messages):
        role = msg.get("role")
        step: dict[str, Any] = {"step_id": len(steps) + 1}
        if role in ("system", "user"):
            step.update(source=role, message=msg.get("content") or "")
        elif role == "assistant":
            step.update(source="agent", message=msg.get("content") or "")
            if record.get("model"):
                step["model_name"] = record["model"]
            if isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
                step["reasoning_content"] = msg["reasoning_content"]
            calls = msg.get("tool_calls") or []
            if calls:
                step["tool_calls"] = [{"tool_call_id": c.get("id") or "", "function_name": c["function"]["name"],
                                       "arguments": _args_object(c["function"].get("arguments"))} for c in calls]
            if results:
                step["observation"] = {"results": [
                    {"source_call_id": r.get("tool_call_id"), "content": r.get("content") or ""} for r in results]}
        else:
            raise RenderError(f"unsupported role {role!r}")
        originals = _argument_texts([msg])
        if originals:
            step["extra"] = {"trajplatform_arguments": originals}
        if _messages_of_atif_step(_as_written(step)) != [msg, *results]:
            step["extra"] = {"trajplatform_messages": [msg, *results]}
        steps.append(step)
    agent = {"name": AGENT_NAME, "version": AGENT_VERSION, "extra": {}}
    if record.get("model"):
        agent["model_name"] = record["model"]
    final = {"total_prompt_tokens": record.get("prompt_tokens") or 0,
             "total_completion_tokens": record.get("completion_tokens") or 0,
             "total_steps": len(steps), "extra": {"reward": record.get("reward"), "outcome": record.get("outcome")}}
    try:
        final["total_cost_usd"] = float(record.get("cost_usd") or 0)
    except (TypeError, ValueError):
        pass
    task = record.get("task") or {}
    return {"schema_version": ATIF_VERSION, "session_id": f"trajplatform-{record['trajectory_id']}",
            "agent": agent, "steps": steps, "final_metrics": final,
            "notes": f"trajplatform {task.get('scene') or ''} trajectory {record['trajectory_id']} of task "
                     f"{record['task_id']}; extra.trajplatform holds the platform's record",
            "extra": {"trajplatform": _provenance(record)}}


def _messages_of_atif_step(step: dict[str, Any]) -> list[dict[str, Any]]:
    extra = step.get("extra") or {}
    if isinstance(extra.get("trajplatform_messages"), list):
        return extra["trajplatform_messages"]
    source = step.get("source")
    message = step.get("message")
    if source in ("system", "user"):
        return [{"role": source, "content": message if isinstance(message, str) else ""}]
    calls = step.get("tool_calls") or []
    out: dict[str, Any] = {"role": "assistant", "content": message if message or not calls else None}
    if step.get("reasoning_content"):
        out["reasoning_content"] = step["reasoning_content"]
    names: dict[str, str] = {}
    if calls:
        out["tool_calls"] = []
        for call in calls:
            args = call.get("arguments")
            out["tool_calls"].append({"id": call.get("tool_call_id"), "type": "function", "function": {
                "name": call.get("function_name"), "arguments": _args_text(args if isinstance(args, dict) else {})}})
            names[call.get("tool_call_id")] = call.get("function_name")
    results = ((step.get("observation") or {}).get("results")) or []
    tools = [{"role": "tool", "tool_call_id": r.get("source_call_id"), "name": names.get(r.get("source_call_id"), ""),
              "content": r.get("content") if isinstance(r.get("content"), str) else ""} for r in results]
    return _restore_arguments([out, *tools], extra.get("trajplatform_arguments"))


def validate_atif(obj: Any) -> list[str]:
    problems = _head(obj, {"schema_version", "session_id", "agent", "steps"}, {"notes", "final_metrics", "extra"},
                     ATIF_VERSIONS, "session_id")
    if problems and not isinstance(obj, dict):
        return problems
    agent = obj.get("agent")
    if not isinstance(agent, dict) or not all(isinstance(agent.get(k), str) for k in ("name", "version")):
        problems.append("line.agent: needs name and version strings")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        return problems + ["line.steps: a non-empty list"]
    for i, step in enumerate(steps):
        at = f"line.steps[{i}]"
        if not isinstance(step, dict):
            problems.append(f"{at}: must be an object")
            continue
        if step.get("step_id") != i + 1:
            problems.append(f"{at}.step_id: must be {i + 1} (ordinal from 1)")
        if step.get("source") not in ("system", "user", "agent"):
            problems.append(f"{at}.source: one of system, user, agent")
        if not isinstance(step.get("message"), str):
            problems.append(f"{at}.message: a string (may be empty)")
        ids = set()
        for j, call in enumerate(step.get("tool_calls") or []):
            if step.get("source") != "agent":
                problems.append(f"{at}.tool_calls: only agent steps call tools")
            if not isinstance(call, dict) or not isinstance(call.get("tool_call_id"), str) \
                    or not isinstance(call.get("function_name"), str) or not isinstance(call.get("arguments"), dict):
                problems.append(f"{at}.tool_calls[{j}]: needs tool_call_id, function_name and an arguments object")
            else:
                ids.add(call["tool_call_id"])
        observation = step.get("observation")
        if observation is not None:
            results = observation.get("results") if isinstance(observation, dict) else None
            if not isinstance(results, list):
                problems.append(f"{at}.observation.results: a list")
            else:
                for j, result in enumerate(results):
                    source = result.get("source_call_id") if isinstance(result, dict) else 0
                    if source is not None and source not in ids:
                        problems.append(f"{at}.observation.results[{j}].source_call_id: {source!r} is no call of "
                                        "this step")
    return problems


def from_atif(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    problems = validate_atif(obj)
    if problems:
        raise InterchangeError(f"{label}: not ATIF", [f"{label}: not ATIF: {p}" for p in problems])
    messages = [m for step in obj["steps"] for m in _messages_of_atif_step(step)]
    ours = _ours(obj.get("extra"), messages)
    if ours is not None:
        return ours
    final = obj.get("final_metrics") or {}
    agent = obj["agent"]
    source = {"format": "atif", "schema_version": obj["schema_version"], "session_id": obj["session_id"],
              "agent": {k: agent.get(k) for k in ("name", "version", "model_name")}, "file": options.get("file", ""),
              "notes": obj.get("notes") or ""}
    return _foreign_record(
        messages, n=n, external_id=obj["session_id"], source=source, options=options,
        model=agent.get("model_name") or "",
        tokens=(int(final.get("total_prompt_tokens") or 0), int(final.get("total_completion_tokens") or 0)),
        cost=float(final.get("total_cost_usd") or 0.0), reward=(final.get("extra") or {}).get("reward"))
