"""The `toucan` format: a row of the released Toucan dataset (Agent-Ark/Toucan-1.5M on the Hub).

The released dataset's nine columns, every one a string (its card's dataset_info), the nested
ones JSON text that its users read with `json.loads(row["messages"])`:

    {"uuid": "5b1c…-…",                          # a UUID (version 5, from the trajectory's content)
     "subset_name": "single-turn-original",      # or "multi-turn" when the user spoke more than once
     "messages": "[{\\"role\\": \\"user\\", …}, {\\"role\\": \\"assistant\\", \\"content\\": \\"\\",
                   \\"function_call\\": {\\"name\\": \\"git-git_log\\", \\"arguments\\": \\"{…}\\"}},
                   {\\"role\\": \\"function\\", \\"name\\": \\"git-git_log\\", \\"content\\": \\"…\\"},
                   {\\"role\\": \\"assistant\\", \\"content\\": \\"<the answer>\\"}]",
     "question": "<the first user message>",
     "available_tools": "[{\\"type\\": \\"function\\", \\"function\\": {\\"name\\": \\"git-git_log\\", …}}]",
     "target_tools": "git_log, read_query",      # bare tool names, comma-separated
     "question_quality_assessment": "{…}" | "",  # the pipeline's six-dimension check; "" without one
     "response_quality_assessment": "{…}" | "",  # judge completeness / conciseness 1-5; "" unjudged
     "metadata": "{…}"}

Message conventions are Toucan's (Qwen-Agent's function calling): an assistant turn that calls
tools is one assistant message per call, `content` "" (the turn's text on the first) and
`function_call: {name, arguments}` with the arguments as JSON text; each result is a
`function` message with the tool's `name`; thoughts are `reasoning_content`; the episode ends
on the assistant's answer as text (our `finish(answer)` becomes that message, with the turn's
reasoning and text as its reasoning_content, its acknowledgement never written: answers.py). Tools are named as Toucan names them, `<server>-<tool>`
(its converter's `server_name.lower().replace(" ", "-") + "-" + name`; our `<server>__<tool>`),
and `metadata.mcp_servers` lists each server with its tools as Toucan's metadata does
(`server_name`, `remote_server_response.tools` of {name, description, input_schema}).

response_quality_assessment follows Toucan's step 4.3 output: `completeness` and `conciseness`
({"reasoning", "score" 1-5}) from the review agent's judge (its 0-100 scores mapped to
1 + round(4 * score / 100)), `overall_score` (their mean), `desired_tools_used_percentage` and
`order_correctness` (tool-call accuracy on the stored steps: apps/engines/scenes/toucan/quality.py).
A trajectory without both judged dimensions gets "" there (as Toucan's `irrelevant` subset
has), and a task not made by the generation pipeline "" as its question assessment; the tool-call
accuracy and the rule filter are in metadata either way.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

from apps.engines.scenes.toucan import quality
from apps.engines.scenes.toucan.questions import QC_DIMENSIONS

from .chat import RenderError, function_specs, parse_arguments, render_messages

Line = dict[str, Any]
KEYS = ("uuid", "subset_name", "messages", "question", "available_tools", "target_tools",
        "question_quality_assessment", "response_quality_assessment", "metadata")
RESPONSE_DIMENSIONS = ("completeness", "conciseness")
SUBSETS = ("single-turn-original", "single-turn-diversify", "multi-turn", "irrelevant")
ROLES = ("system", "user", "assistant", "function")
UUID_NAMESPACE = uuid.UUID("9f1d3c2e-5b7a-4c1e-8f00-7472616a706c")  # "trajpl"


def toucan_name(name: str) -> str:
    """Our `<server>__<tool>` as Toucan names it, `<server>-<tool>`; other names unchanged."""
    server, sep, tool = name.partition("__")
    return f"{server.lower().replace(' ', '-')}-{tool}" if sep else name


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _judged(auto: dict[str, Any] | None, dim: str) -> dict[str, Any] | None:
    value = ((auto or {}).get("scores") or {}).get(dim)
    score = value.get("score") if isinstance(value, dict) else value
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return None
    reasoning = value.get("rationale", "") if isinstance(value, dict) else ""
    return {"reasoning": reasoning or "", "score": 1 + round(4 * max(0.0, min(100.0, float(score))) / 100)}


def _messages(record: dict[str, Any], include_system: bool) -> list[dict[str, Any]]:
    """Our rendered chat in Toucan's function-calling convention (see the module doc); the record's
    finish is already its answer message (answers.as_text: toucan takes final_answer text only)."""
    rendered = render_messages(record, arguments="string", include_system=include_system, reasoning=True)
    names: dict[Any, str] = {}
    out: list[dict[str, Any]] = []
    for msg in rendered:
        role = msg["role"]
        if role in ("system", "user"):
            out.append({"role": role, "content": msg["content"]})
            continue
        if role == "tool":
            out.append({"role": "function", "content": msg["content"], "name": names.get(msg.get("tool_call_id"), "")})
            continue
        text, reasoning = msg.get("content") or "", msg.get("reasoning_content") or ""
        calls = msg.get("tool_calls") or []
        for n, call in enumerate(calls):
            fn = call["function"]
            names[call.get("id")] = toucan_name(fn["name"])
            item: dict[str, Any] = {"role": "assistant", "content": text if n == 0 else "",
                                    "function_call": {"name": names[call.get("id")], "arguments": fn["arguments"]}}
            if n == 0 and reasoning:
                item["reasoning_content"] = reasoning
            out.append(item)
        if not calls and text:
            out.append({"role": "assistant", "content": text, **({"reasoning_content": reasoning} if reasoning else {})})
    if not out or out[-1]["role"] != "assistant" or "function_call" in out[-1] or not out[-1]["content"]:
        raise RenderError("the episode does not end on the assistant's answer")
    return out


def _servers(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_server: dict[str, list[dict[str, Any]]] = {}
    for fn in tools:
        server, sep, tool = fn["name"].partition("__")
        if sep:
            by_server.setdefault(server, []).append({"name": tool, "description": fn.get("description") or "",
                                                     "input_schema": fn.get("parameters") or {}})
    return [{"server_name": s, "remote_server_response": {"tools": t}} for s, t in by_server.items()]


def render_toucan(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    task = record.get("task") or {}
    scene = task.get("scene_config") or {}
    messages = _messages(record, ctx["include_system"])
    tools = function_specs(record.get("tools") or [])
    steps = record.get("steps") or []
    targets = list(scene.get("target_tools") or [])
    accuracy = quality.tool_call_accuracy(targets, quality.called_tools(steps))
    rules = quality.rule_filter(steps, record.get("final_answer") or "")
    auto = (record.get("reviews") or {}).get("auto")
    judged = {dim: _judged(auto, dim) for dim in RESPONSE_DIMENSIONS}
    response: dict[str, Any] | None = None
    if all(judged.values()):
        response = {**judged, "overall_score": sum(j["score"] for j in judged.values()) / len(judged),  # type: ignore[index]
                    "desired_tools_used_percentage": accuracy["desired_tools_used_percentage"],
                    "order_correctness": accuracy["order_correctness"]}
    qqa = scene.get("question_quality_assessment")
    verifier = record.get("verifier_output") or {}
    users = sum(1 for m in messages if m["role"] == "user")
    identity = f"{record.get('content_sha256') or ''}:{record['trajectory_id']}"
    return {
        "uuid": str(uuid.uuid5(UUID_NAMESPACE, identity)),
        "subset_name": "multi-turn" if users > 1 else "single-turn-original",
        "messages": _dumps(messages),
        "question": task.get("prompt") or "",
        "available_tools": _dumps([{"type": "function", "function": {**fn, "name": toucan_name(fn["name"])}}
                                   for fn in tools]),
        "target_tools": ", ".join(t.partition("__")[2] or t for t in targets),
        "question_quality_assessment": _dumps(qqa) if isinstance(qqa, dict) else "",
        "response_quality_assessment": _dumps(response) if response else "",
        "metadata": _dumps({
            "mcp_servers": _servers(tools), "trajectory_id": record["trajectory_id"], "task_id": record["task_id"],
            "external_id": task.get("external_id") or "", "scene": task.get("scene") or "",
            "model": record.get("model") or "", "outcome": record.get("outcome") or "", "reward": record.get("reward"),
            "verifier": verifier.get("method") or "", "check": verifier.get("check"),
            "tool_call_accuracy": {k: accuracy[k] for k in ("desired_tools_used_percentage", "order_correctness")},
            "rule_filter": {"passed": rules["passed"], "failed": rules["failed"]},
            "judge_model": (auto or {}).get("judge_model") or "",
            "generation": scene.get("generation"), "content_sha256": record.get("content_sha256") or "",
        }),
    }


# -- the validator: the released rows' rules ------------------------------------------------------


def _json(obj: dict[str, Any], key: str, kind: type, problems: list[str], *, empty: bool = False) -> Any:
    """The JSON text in column `key` parsed, when it is `kind` (or "" where allowed); else a problem."""
    text = obj.get(key)
    if not isinstance(text, str):
        return None
    if empty and text == "":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        problems.append(f"line.{key}: not JSON text")
        return None
    if not isinstance(value, kind):
        shape = "a list" if kind is list else "an object"
        problems.append(f"line.{key}: must be the JSON text of {shape}" + (' (or "")' if empty else ""))
        return None
    return value


def _score(value: Any, where: str) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        return [f"{where}: must be a whole number from 1 to 5"]
    return []


def _dimensions(assessment: dict[str, Any], dims: tuple[str, ...], where: str) -> list[str]:
    problems = []
    for dim in dims:
        block = assessment.get(dim)
        if not isinstance(block, dict) or not isinstance(block.get("reasoning"), str):
            problems.append(f"{where}.{dim}: must be an object with reasoning and score")
        else:
            problems += _score(block.get("score"), f"{where}.{dim}.score")
    return problems


def _check_messages(messages: list[Any], names: set[str]) -> list[str]:
    problems: list[str] = []
    open_calls: list[str] = []
    started = False
    for i, msg in enumerate(messages):
        at = f"line.messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ROLES or not isinstance(msg.get("content"), str):
            problems.append(f"{at}: must be {{role: {'|'.join(ROLES)}, content: string}}")
            continue
        role = msg["role"]
        if role == "system":
            if started:
                problems.append(f"{at}: system message after the conversation started")
            continue
        if not started and role != "user":
            problems.append(f"{at}: the conversation must start with a user message")
        started = True
        if role == "function":
            if msg.get("name") not in open_calls:
                problems.append(f"{at}: a function result with no open call of {msg.get('name')!r}")
            else:
                open_calls.remove(msg["name"])
            continue
        if role == "user":
            open_calls = []
            continue
        call = msg.get("function_call")
        if call is None:
            continue
        if (not isinstance(call, dict) or not isinstance(call.get("name"), str)
                or not isinstance(call.get("arguments"), str)):
            problems.append(f"{at}.function_call: must be {{name, arguments: JSON text}}")
            continue
        if call["name"] not in names:
            problems.append(f"{at}.function_call.name: {call['name']!r} is not in available_tools")
        if parse_arguments(call["arguments"]) is None:
            problems.append(f"{at}.function_call.arguments: not the JSON text of an object")
        open_calls.append(call["name"])
    last = messages[-1] if messages else None
    if not (isinstance(last, dict) and last.get("role") == "assistant" and "function_call" not in last
            and isinstance(last.get("content"), str) and last["content"].strip()):
        problems.append("line.messages: must end on the assistant's answer as text")
    return problems


def validate_toucan(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in KEYS if k not in obj]
    problems += [f"line.{k}: unexpected field" for k in sorted(set(obj) - set(KEYS))]
    problems += [f"line.{k}: must be a string (the released dataset's columns are all strings)"
                 for k in KEYS if k in obj and not isinstance(obj[k], str)]
    try:
        uuid.UUID(str(obj.get("uuid")))
    except ValueError:
        problems.append("line.uuid: must be a UUID")
    if obj.get("subset_name") not in SUBSETS:
        problems.append(f"line.subset_name: must be one of {', '.join(SUBSETS)}")
    tools = _json(obj, "available_tools", list, problems) or []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            problems.append(f"line.available_tools[{i}]: must be {{type: function, function: {{name, ...}}}}")
        elif fn["name"] in names:
            problems.append(f"line.available_tools[{i}]: {fn['name']!r} listed twice")
        else:
            names.add(fn["name"])
    messages = _json(obj, "messages", list, problems)
    if messages is not None:
        problems += _check_messages(messages, names)
        first = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        question = obj.get("question", "")
        if "question" in obj and (not isinstance(question, str) or not question.strip()):
            problems.append("line.question: must be a non-empty string")
        elif "question" in obj and (first is None or first.get("content") != question):
            problems.append("line.question: must be the first user message")
    targets = obj.get("target_tools")
    if isinstance(targets, str):
        # Toucan's own accuracy check matches a target tool as a substring of a called name
        unknown = [t for t in (s.strip() for s in targets.split(",")) if t and not any(t in n for n in names)]
        if unknown:
            problems.append(f"line.target_tools: not among available_tools: {', '.join(unknown)}")
    qqa = _json(obj, "question_quality_assessment", dict, problems, empty=True)
    if qqa is not None:
        problems += _dimensions(qqa, QC_DIMENSIONS, "line.question_quality_assessment")
    rqa = _json(obj, "response_quality_assessment", dict, problems, empty=True)
    if rqa is not None:
        problems += _dimensions(rqa, RESPONSE_DIMENSIONS, "line.response_quality_assessment")
        share = rqa.get("desired_tools_used_percentage")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            problems.append("line.response_quality_assessment.desired_tools_used_percentage: must be a number in 0..1")
        if not isinstance(rqa.get("order_correctness"), bool):
            problems.append("line.response_quality_assessment.order_correctness: must be true or false")
    _json(obj, "metadata", dict, problems)
    return problems
