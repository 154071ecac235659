"""Step-level preference pairs (dpo-step-trl): two rollouts of one task, paired where they first diverge.

Whole-trajectory DPO (dpo.py) prefers one conversation to another from the first diverging turn
to the end. A step pair prefers one *next assistant turn* to another given everything before it:
the prompt is the two rollouts' shared prefix (system, user, and every assistant turn and tool
result they have in common), chosen and rejected are the single assistant turns (text and/or
tool calls) at which they part. The better rollout is picked as in dpo.py (human accept, then
success, then reward, then judge score); each other rollout of the task with the same prompt and
tools that it beats (by dpo_min_margin, or by a human verdict) gives one pair, so a task of n
rollouts gives up to n - 1 pairs. `metadata` names both rollouts, the shared-prefix length in
messages, the step (assistant turns before the divergence) and the margin.

Rollouts that part in a tool result (the same call answered differently) or where one is a
prefix of the other have no step to prefer and are excluded with that reason, as are pairs
identical to one already written.
"""
from __future__ import annotations

from typing import Any

from .chat import RenderError, dumps_compact, render_messages, validate_messages, validate_tools
from .dpo import _check_start, _chosen_key, _exclude, _verdict, margin
from .formats import _keys, _tools, prompt_prefix

Pair = tuple[dict[str, Any], list[dict[str, Any]]]


def _divergence(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def pair_steps(records: list[dict[str, Any]], ctx: dict[str, Any]) -> tuple[list[Pair], list[dict[str, Any]]]:
    """([(line, [better record, worse record])], excluded) for one task's records."""
    excluded: list[dict[str, Any]] = []
    candidates: list[tuple[dict[str, Any], list[dict[str, Any]], str]] = []
    for record in records:
        if record.get("outcome") not in ("success", "failure"):
            excluded.append(_exclude(record, f"dpo-step: outcome {record.get('outcome') or 'none'!r} is not a "
                                             "preference signal"))
            continue
        try:
            messages = render_messages(record, arguments="object", include_system=ctx["include_system"],
                                       tool_name=True, reasoning=True)
            key = dumps_compact([prompt_prefix(messages), _tools(record)])
        except RenderError as exc:
            excluded.append(_exclude(record, f"dpo-step: {exc}"))
            continue
        candidates.append((record, messages, key))
    usable = [c for c in candidates if _verdict(c[0]) != "reject"]
    if not usable:
        return [], excluded + [_exclude(c[0], "dpo-step: no rollout of this task can be chosen") for c in candidates]
    best = max(usable, key=lambda c: _chosen_key(c[0]))
    b = best[0]
    pairs: list[Pair] = []
    seen: set[str] = set()
    min_margin = ctx["dpo_min_margin"]
    for record, messages, key in candidates:
        if record is b:
            continue
        ids = f"chosen #{b['trajectory_id']}, rejected #{record['trajectory_id']}"
        if key != best[2]:
            excluded.append(_exclude(record, f"dpo-step: another prompt or other tools than #{b['trajectory_id']}"))
            continue
        if _verdict(record) == "accept":
            excluded.append(_exclude(record, "dpo-step: human-accepted, never rejected"))
            continue
        human = (_verdict(b) == "accept" and (_verdict(record) == "reject" or record.get("outcome") == "failure")) \
            or (_verdict(record) == "reject" and b.get("outcome") == "success")
        m = margin(b, record)
        if not human and (m is None or m <= 0 or m < min_margin):
            reason = ("no reward, judge score or outcome difference" if m is None
                      else f"margin {m:.3f} below the minimum {min_margin:g}")
            excluded.append(_exclude(record, f"dpo-step: {reason} ({ids})"))
            continue
        k = _divergence(best[1], messages)
        if k >= min(len(best[1]), len(messages)):
            excluded.append(_exclude(record, f"dpo-step: one rollout is a prefix of the other ({ids})"))
            continue
        if best[1][k]["role"] != "assistant" or messages[k]["role"] != "assistant":
            excluded.append(_exclude(record, f"dpo-step: the rollouts part in a {messages[k]['role']} message at "
                                             f"{k}, not in an assistant turn ({ids})"))
            continue
        line = {
            "prompt": best[1][:k], "chosen": [best[1][k]], "rejected": [messages[k]], "tools": _tools(b),
            "metadata": {
                "task_id": b["task_id"], "chosen_trajectory_id": b["trajectory_id"],
                "rejected_trajectory_id": record["trajectory_id"], "shared_prefix_messages": k,
                "step": sum(1 for msg in best[1][:k] if msg["role"] == "assistant"),
                "margin": None if m is None else round(float(m), 6),
                "by_human_verdict": human,
            },
        }
        signature = dumps_compact([line["prompt"], line["chosen"], line["rejected"]])
        if signature in seen:
            excluded.append(_exclude(record, f"dpo-step: the same step pair as one already written ({ids})"))
            continue
        seen.add(signature)
        pairs.append((line, [b, record]))
    if not pairs:
        excluded.append(_exclude(b, "dpo-step: no other rollout of this task gave a step pair"))
    return pairs, excluded


METADATA_KEYS = {"task_id", "chosen_trajectory_id", "rejected_trajectory_id", "shared_prefix_messages", "step",
                 "margin", "by_human_verdict"}


def validate_dpo_step(obj: Any) -> list[str]:
    problems = _keys(obj, {"prompt", "chosen", "rejected", "tools", "metadata"})
    if problems and not isinstance(obj, dict):
        return problems
    tool_problems, names = validate_tools(obj.get("tools", []))
    problems += tool_problems
    prompt, chosen, rejected = obj.get("prompt"), obj.get("chosen"), obj.get("rejected")
    problems += _check_start(prompt, [("chosen", chosen), ("rejected", rejected)])
    for where, output in (("chosen", chosen), ("rejected", rejected)):
        if isinstance(output, list) and len(output) != 1:
            problems.append(f"line.{where}: must hold exactly one assistant turn")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or set(meta) != METADATA_KEYS:
        problems.append(f"line.metadata: must hold exactly {', '.join(sorted(METADATA_KEYS))}")
    elif isinstance(prompt, list) and meta["shared_prefix_messages"] != len(prompt):
        problems.append("line.metadata.shared_prefix_messages: must be the prompt's length")
    if not problems:
        for where, output in (("chosen", chosen), ("rejected", rejected)):
            problems += validate_messages(prompt + output, names, arguments="object", where=f"prompt+{where}",
                                          allow_open_calls=True)
    return problems
