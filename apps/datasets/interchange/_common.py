"""What the interchange formats share: the import error, the message helpers both exports use, a
document's head check, the image an import keeps, and the record a foreign trajectory becomes.
The formats themselves are described in the package's docstring."""
from __future__ import annotations

import json
from typing import Any, Iterator, NamedTuple

import orjson

from apps.datasets.record_schema import RAW_SCHEMA_VERSION, TASK_FIELDS, RenderError, key_problems as _keys
from apps.tasks.models import Task

OUTCOMES = ("success", "failure")
_KEPT_OUT = ("messages",)  # rebuilt from the steps / content


class InterchangeError(ValueError):
    """A file that cannot be imported; `errors` lists every problem as `FILE:LINE: reason`."""

    def __init__(self, message: str, errors: list[str] | None = None):
        self.errors = errors or [message]
        super().__init__(message)


def _args_object(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        raise RenderError(f"tool-call arguments are not JSON: {str(raw)[:60]!r}") from None
    if not isinstance(value, dict):
        raise RenderError("tool-call arguments are not a JSON object")
    return value


def _args_text(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


def _turns(messages: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(message, the tool messages right after it) for each non-tool message."""
    i = 0
    while i < len(messages):
        msg = messages[i]
        if not isinstance(msg, dict):
            raise RenderError(f"messages[{i}]: not an object")
        j = i + 1
        while j < len(messages) and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
            j += 1
        if msg.get("role") == "tool":
            raise RenderError(f"messages[{i}]: a tool result that follows no assistant turn")
        yield msg, messages[i + 1:j]
        i = j


def _as_written(value: Any) -> Any:
    """The value as a reader gets it back from the line (exports sort keys, so argument objects too)."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def _argument_texts(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Call id -> the arguments as the model wrote them, where that is not how we would write their object
    (key order, spacing): the standard formats carry arguments as objects, and exports sort keys."""
    out = {}
    for msg in messages:
        for call in msg.get("tool_calls") or []:
            raw = call.get("function", {}).get("arguments")
            if isinstance(raw, str) and isinstance(call.get("id"), str):
                try:
                    rewritten = _args_text(_as_written(_args_object(raw)))
                except RenderError:
                    continue
                if rewritten != raw:
                    out[call["id"]] = raw
    return out


def _restore_arguments(messages: list[dict[str, Any]], originals: Any) -> list[dict[str, Any]]:
    if isinstance(originals, dict) and originals:
        for msg in messages:
            for call in msg.get("tool_calls") or []:
                if call.get("id") in originals:
                    call["function"]["arguments"] = originals[call["id"]]
    return messages


def _provenance(record: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if k not in _KEPT_OUT}
    if isinstance(out.get("task"), dict) and "pass_rate" in out["task"]:
        # the task's pass rate is read from the rollouts stored where the file is exported, not the file's
        out["task"] = {k: v for k, v in out["task"].items() if k != "pass_rate"}
    return out


def _head(obj: Any, required: set[str], optional: set[str], versions: tuple[str, ...], id_key: str) -> list[str]:
    """A document's keys, its schema_version among versions, and a non-empty id."""
    problems = _keys(obj, required, optional)
    if not isinstance(obj, dict):
        return problems
    if obj.get("schema_version") not in versions:
        problems.append(f"line.schema_version: one of {', '.join(versions)}")
    if not isinstance(obj.get(id_key), str) or not obj[id_key]:
        problems.append(f"line.{id_key}: a non-empty string")
    return problems


class Image(NamedTuple):
    data: bytes
    mime: str
    width: int
    height: int


def _tools_for(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = sorted({c["function"]["name"] for m in messages for c in m.get("tool_calls") or []})
    return [{"type": "function", "function": {"name": n, "description": "", "parameters": {
        "type": "object", "properties": {}}}} for n in names]


def _foreign_record(messages: list[dict[str, Any]], *, n: int, external_id: str, source: dict[str, Any],
                    options: dict[str, Any], model: str = "", final_answer: str = "",
                    tokens: tuple[int, int] = (0, 0), cost: float = 0.0, reward: Any = None) -> dict[str, Any]:
    outcome = options.get("outcome")
    if outcome not in OUTCOMES:
        raise InterchangeError(f"{external_id}: a trajectory from another tool has no outcome we can verify; say "
                               "which it is (outcome success or failure, --outcome)")
    users = [m for m in messages if m["role"] == "user" and isinstance(m.get("content"), str)
             and (m.get("provenance") or {}).get("source") != "environment"]
    if not users:
        raise InterchangeError(f"{external_id}: no user message (the task)")
    task = {f: Task._meta.get_field(f).get_default() for f in TASK_FIELDS}  # the defaults a new task gets
    task.update(scene=options.get("scene") or "code_exec", prompt=users[0]["content"], external_id=external_id[:200],
                model=model[:200], batch="")
    return {
        "schema_version": RAW_SCHEMA_VERSION, "trajectory_id": n, "task_id": n, "task": task,
        "reviews": {"auto": None, "human": None}, "iteration": 1, "sample_index": 0, "status": "finished",
        "messages": messages, "tools": _tools_for(messages), "steps": [], "final_answer": final_answer,
        "outcome": outcome, "outcome_reason": f"imported from {source['format']}: outcome given on import",
        "reward": reward if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        "verifier_output": {}, "model": model[:200], "config_snapshot": {"imported_from": source},
        "prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": tokens[0] + tokens[1],
        "cost_usd": str(cost), "content_sha256": "", "error": "", "started_at": None, "finished_at": None,
    }


def _ours(extra: Any, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    record = (extra or {}).get("trajplatform") if isinstance(extra, dict) else None
    if isinstance(record, dict) and record.get("schema_version") == RAW_SCHEMA_VERSION:
        return {**record, "messages": messages}
    return None
