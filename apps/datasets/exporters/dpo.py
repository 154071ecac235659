"""Preference pairs from several rollouts of one task (dpo-trl, dpo-openai).

Pairs never cross tasks: the exporter hands this module one task's records at a time. Of
the rollouts that share the task's prompt (same system and user messages, same tools), the
chosen one is human-accepted first, then succeeded, then has the highest reward, then the
highest judge score; the rejected one is human-rejected first, then failed, then has the
lowest reward, then the lowest judge score. One pair per task, written only if the margin
between them reaches `dpo_min_margin` (reward difference, or judge overall / 100 when the
rewards tie or are missing; success against failure counts as 1 when neither exists), or
a human verdict settles it (accepted against rejected or failed, succeeded against
rejected). A preference a person recorded in the console ("prefer A over B", the record's
reviews.preferences) comes first: the latest one between two of the task's rollouts with the same
prompt is the pair, whatever the margin (dpo-trl adds metadata.preference: reviewer, time, ids).
A rollout that ended in an error is no preference signal and is left out. The
prompt is the longest common prefix of the two conversations that ends right before an
assistant turn in both.
"""
from __future__ import annotations

import math
from typing import Any

from .chat import RenderError, dumps_compact, render_messages, validate_messages, validate_tools
from .formats import _keys, _openai_message_keys, _parallel, _tools, prompt_prefix

Excluded = dict[str, Any]


def _verdict(record: dict[str, Any]) -> str:
    return ((record.get("reviews") or {}).get("human") or {}).get("verdict") or ""


def _overall(record: dict[str, Any]) -> float | None:
    value = ((record.get("reviews") or {}).get("auto") or {}).get("overall")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _reward(record: dict[str, Any]) -> float | None:
    value = record.get("reward")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _chosen_key(r: dict[str, Any]) -> tuple:
    return (_verdict(r) == "accept", r.get("outcome") == "success", _or(_reward(r), -math.inf),
            _or(_overall(r), -math.inf), -r["trajectory_id"])


def _rejected_key(r: dict[str, Any]) -> tuple:
    return (_verdict(r) != "reject", r.get("outcome") == "success", _or(_reward(r), math.inf),
            _or(_overall(r), math.inf), r["trajectory_id"])


def margin(chosen: dict[str, Any], rejected: dict[str, Any]) -> float | None:
    """How much better chosen is than rejected, on a 0-1 scale; None if they are not comparable."""
    rc, rr = _reward(chosen), _reward(rejected)
    if rc is not None and rr is not None and rc != rr:
        return rc - rr
    oc, orj = _overall(chosen), _overall(rejected)
    if oc is not None and orj is not None:
        return (oc - orj) / 100.0
    if rc is not None and rr is not None:
        return 0.0
    if chosen.get("outcome") == "success" and rejected.get("outcome") == "failure":
        return 1.0
    return None


def _exclude(record: dict[str, Any], reason: str) -> Excluded:
    return {"trajectory_id": record["trajectory_id"], "task_id": record["task_id"], "reason": reason}


def pair_group(
    records: list[dict[str, Any]], ctx: dict[str, Any], *, style: str
) -> tuple[list[tuple[dict[str, Any], list[dict[str, Any]]]], list[Excluded]]:
    """([(line, [chosen record, rejected record])], excluded) for one task's records."""
    excluded: list[Excluded] = []
    candidates: list[tuple[dict[str, Any], list[dict[str, Any]], str]] = []
    arguments = "object" if style == "trl" else "string"
    for record in records:
        if record.get("outcome") not in ("success", "failure"):
            outcome = record.get("outcome") or "none"
            excluded.append(_exclude(record, f"dpo: outcome {outcome!r} is not a preference signal"))
            continue
        try:
            messages = render_messages(record, arguments=arguments, include_system=ctx["include_system"],
                                       tool_name=style == "trl", reasoning=style == "trl")
            key = dumps_compact([prompt_prefix(messages), _tools(record)])
        except RenderError as exc:
            excluded.append(_exclude(record, f"dpo: {exc}"))
            continue
        candidates.append((record, messages, key))
    human = _preferred_pair(candidates, style)
    if human is not None:
        line, chosen, rejected = human
        ids = f"chosen #{chosen[0]['trajectory_id']}, rejected #{rejected[0]['trajectory_id']}"
        excluded += [_exclude(c[0], f"dpo: not selected (a person's preference: {ids})")
                     for c in candidates if c is not chosen and c is not rejected]
        return [(line, [chosen[0], rejected[0]])], excluded
    usable = [c for c in candidates if _verdict(c[0]) != "reject"]
    if not usable:
        return [], excluded + [_exclude(c[0], "dpo: no rollout of this task can be chosen") for c in candidates]
    chosen = max(usable, key=lambda c: _chosen_key(c[0]))
    rivals = [c for c in candidates if c is not chosen and c[2] == chosen[2] and _verdict(c[0]) != "accept"]
    if not rivals:
        reason = "dpo: no other rollout of this task with the same prompt to pair with"
        return [], excluded + [_exclude(c[0], reason) for c in candidates]
    rejected = min(rivals, key=lambda c: _rejected_key(c[0]))
    ids = f"chosen #{chosen[0]['trajectory_id']}, rejected #{rejected[0]['trajectory_id']}"
    c, r = chosen[0], rejected[0]
    human_pair = (_verdict(c) == "accept" and (_verdict(r) == "reject" or r.get("outcome") == "failure")) or (
        _verdict(r) == "reject" and c.get("outcome") == "success")
    m = margin(chosen[0], rejected[0])
    min_margin = ctx["dpo_min_margin"]
    if not human_pair and (m is None or m <= 0 or m < min_margin):
        reason = ("dpo: the best and worst rollouts cannot be compared (no reward, judge score or outcome difference)"
                  if m is None else f"dpo: margin {m:.3f} below the minimum {min_margin:g} ({ids})")
        return [], excluded + [_exclude(c[0], reason) for c in candidates]
    try:
        line = _pair_line(chosen[1], rejected[1], _tools(chosen[0]), style)
    except RenderError as exc:
        return [], excluded + [_exclude(c[0], f"dpo: {exc} ({ids})") for c in candidates]
    for c in candidates:
        if c is not chosen and c is not rejected:
            excluded.append(_exclude(c[0], f"dpo: not selected (one pair per task: {ids})"))
    return [(line, [chosen[0], rejected[0]])], excluded


def _preferred_pair(candidates: list[tuple[dict[str, Any], list[dict[str, Any]], str]], style: str) -> Any:
    """(line, chosen, rejected) for the latest preference a person recorded between two of these
    rollouts that share a prompt and render as a pair; None when there is none."""
    by_id = {c[0]["trajectory_id"]: c for c in candidates}
    picks = {(p["chosen"], p["rejected"]): p for c in candidates
             for p in ((c[0].get("reviews") or {}).get("preferences") or [])}
    for pick in sorted(picks.values(), key=lambda p: p.get("at") or "", reverse=True):
        chosen, rejected = by_id.get(pick["chosen"]), by_id.get(pick["rejected"])
        if chosen is None or rejected is None or chosen[2] != rejected[2]:
            continue
        try:
            line = _pair_line(chosen[1], rejected[1], _tools(chosen[0]), style)
        except RenderError:
            continue
        if style == "trl":  # TRL keeps extra columns; OpenAI's preference format allows none
            line["metadata"] = {"preference": {"reviewer": pick.get("reviewer") or "", "at": pick.get("at"),
                                               "chosen": pick["chosen"], "rejected": pick["rejected"]}}
        return line, chosen, rejected
    return None


def _pair_line(chosen: list[dict[str, Any]], rejected: list[dict[str, Any]], tools: list[dict[str, Any]],
               style: str) -> dict[str, Any]:
    common = 0
    while common < min(len(chosen), len(rejected)) and chosen[common] == rejected[common]:
        common += 1
    cut = common
    # The prompt must stop right before an assistant turn in both conversations.
    while cut > 0 and not (cut < len(chosen) and cut < len(rejected)
                           and chosen[cut]["role"] == "assistant" and rejected[cut]["role"] == "assistant"):
        cut -= 1
    if cut == 0 or common == min(len(chosen), len(rejected)) and len(chosen) == len(rejected):
        raise RenderError("the two rollouts do not diverge after a shared prompt")
    prompt = chosen[:cut]
    if style == "trl":
        return {"prompt": prompt, "chosen": chosen[cut:], "rejected": rejected[cut:], "tools": tools}
    if chosen[cut] == rejected[cut]:
        raise RenderError("the first differing assistant turns are identical (they diverge in a tool result)")
    return {"input": {"messages": prompt, "tools": tools, "parallel_tool_calls": _parallel(chosen + rejected)},
            "preferred_output": [chosen[cut]], "non_preferred_output": [rejected[cut]]}


def _check_start(prompt: Any, outputs: list[tuple[str, Any]]) -> list[str]:
    problems = []
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1], dict) \
            or prompt[-1].get("role") not in ("user", "tool"):
        problems.append("prompt: must be a non-empty list ending with a user or tool message")
    for where, output in outputs:
        if not isinstance(output, list) or not output or not isinstance(output[0], dict) \
                or output[0].get("role") != "assistant":
            problems.append(f"{where}: must start with an assistant message")
    if outputs[0][1] == outputs[1][1]:
        problems.append("chosen and rejected are identical")
    return problems


def validate_dpo_trl(obj: Any) -> list[str]:
    problems = _keys(obj, {"prompt", "chosen", "rejected"}, {"tools", "metadata"})
    if problems and not isinstance(obj, dict):
        return problems
    tool_problems, names = validate_tools(obj.get("tools", []))
    problems += tool_problems
    prompt, chosen, rejected = obj.get("prompt"), obj.get("chosen"), obj.get("rejected")
    problems += _check_start(prompt, [("chosen", chosen), ("rejected", rejected)])
    if not problems:
        problems += validate_messages(prompt + chosen, names, arguments="object", where="prompt+chosen")
        problems += validate_messages(prompt + rejected, names, arguments="object", where="prompt+rejected")
    return problems


def validate_dpo_openai(obj: Any) -> list[str]:
    problems = _keys(obj, {"input", "preferred_output", "non_preferred_output"})
    if problems and not isinstance(obj, dict):
        return problems
    inp = obj.get("input")
    problems += _keys(inp, {"messages"}, {"tools", "parallel_tool_calls"}, where="input")
    if not isinstance(inp, dict):
        return problems
    tool_problems, names = validate_tools(inp.get("tools", []), "input.tools")
    problems += tool_problems
    prompt = inp.get("messages")
    outputs = [(key, obj.get(key)) for key in ("preferred_output", "non_preferred_output")]
    problems += _check_start(prompt, outputs)
    for where, output in outputs:
        if isinstance(output, list) and len(output) != 1:
            problems.append(f"{where}: must hold exactly one assistant message")
    if not problems:
        for where, output in outputs:
            problems += validate_messages(prompt + output, names, arguments="string", where=f"input.messages+{where}",
                                          allow_open_calls=True)
            problems += _openai_message_keys(output, where)
        problems += _openai_message_keys(prompt, "input.messages")
    return problems
