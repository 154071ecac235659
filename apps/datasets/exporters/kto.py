"""Unpaired signals: KTO records (kto-trl) and pointwise reward-model records (reward-score).

Both split a trajectory as TRL's prompt-completion formats do: `prompt` is the system and user
messages before the first assistant turn, `completion` everything the agent did after it (its
turns and the tool results), tool-call arguments as objects, `tools` beside them.

* kto-trl: TRL's unpaired preference format `{prompt, completion, label, tools}`. `label` is the
  latest human verdict when there is one (accept -> true; reject or needs_fix -> false), else the
  verifier's outcome (success -> true, failure -> false). A rollout that ended in an error, or
  has neither a verdict nor a success/failure outcome, is no signal and is excluded.
* reward-score: `{prompt, completion, score, tools}` with `score` in [0, 1]: the latest human
  review's overall score when it has one, else the latest automatic (judge) review's overall,
  divided by 100. A trajectory without a review score is excluded.
"""
from __future__ import annotations

from typing import Any

from .chat import RenderError, render_messages, validate_messages, validate_tools
from .formats import _keys, _tools, prompt_prefix

LABEL_OF_VERDICT = {"accept": True, "reject": False, "needs_fix": False}


def _prompt_completion(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    messages = render_messages(record, arguments="object", include_system=ctx["include_system"], tool_name=True,
                               reasoning=True)
    prompt = prompt_prefix(messages)
    completion = messages[len(prompt):]
    if not completion:
        raise RenderError("no assistant turn after the prompt")
    return {"prompt": prompt, "completion": completion, "tools": _tools(record)}


def kto_label(record: dict[str, Any]) -> bool:
    """Desirable or not: the human verdict first, else the verifier outcome (RenderError if neither)."""
    verdict = (((record.get("reviews") or {}).get("human") or {}).get("verdict") or "")
    if verdict in LABEL_OF_VERDICT:
        return LABEL_OF_VERDICT[verdict]
    outcome = record.get("outcome")
    if outcome in ("success", "failure"):
        return outcome == "success"
    raise RenderError(f"no human verdict and outcome {outcome or 'none'!r}: no desirability signal")


def render_kto(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    label = kto_label(record)
    return {**_prompt_completion(record, ctx), "label": label}


def review_score(record: dict[str, Any]) -> float:
    """The human review's overall score, else the judge's, on [0, 1] (RenderError if neither)."""
    reviews = record.get("reviews") or {}
    for kind in ("human", "auto"):
        value = (reviews.get(kind) or {}).get("overall")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return round(float(value) / 100.0, 6)
    raise RenderError("no review score (neither a human nor an automatic review has an overall score)")


def render_reward(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    score = review_score(record)
    return {**_prompt_completion(record, ctx), "score": score}


def _validate_prompt_completion(obj: Any, extra: str) -> tuple[list[str], bool]:
    problems = _keys(obj, {"prompt", "completion", "tools", extra})
    if problems and not isinstance(obj, dict):
        return problems, False
    tool_problems, names = validate_tools(obj.get("tools", []))
    problems += tool_problems
    prompt, completion = obj.get("prompt"), obj.get("completion")
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1], dict) \
            or prompt[-1].get("role") != "user":
        problems.append("line.prompt: must be a non-empty list ending with the user's message")
    if not isinstance(completion, list) or not completion or not isinstance(completion[0], dict) \
            or completion[0].get("role") != "assistant":
        problems.append("line.completion: must start with an assistant message")
    if not problems:
        problems += validate_messages(prompt + completion, names, arguments="object", where="prompt+completion")
    return problems, True


def validate_kto(obj: Any) -> list[str]:
    problems, ok = _validate_prompt_completion(obj, "label")
    if ok and not isinstance(obj.get("label"), bool):
        problems.append("line.label: must be true or false")
    return problems


def validate_reward(obj: Any) -> list[str]:
    problems, ok = _validate_prompt_completion(obj, "score")
    score = obj.get("score") if ok else None
    if ok and (isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1):
        problems.append("line.score: must be a number from 0 to 1")
    return problems
