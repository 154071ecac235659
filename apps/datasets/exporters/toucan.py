"""The `toucan` format: Toucan's own row schema (TheAgentArk/Toucan, its SFT dataset's columns).

    {"messages": [...],                   # OpenAI chat: system, user, assistant tool_calls (arguments as
                                          # JSON strings), role tool results, the finish call
     "question": "...",                   # the task's prompt (the first user message)
     "available_tools": [...],            # OpenAI function specs the agent was offered (<server>__<tool>, finish)
     "target_tools": "git__git_log, time__convert_time",    # comma-separated, as Toucan writes it
     "question_quality_assessment": {...} | null,           # the generation pipeline's six-dimension check
     "response_quality_assessment": {...},
     "metadata": {...}}

response_quality_assessment follows Toucan's step 4 output: `completeness` and `conciseness`
({"score": 1-5 or null, "reasoning"}) from the review agent's judge (its 0-100 dimension scores
mapped to 1 + round(4 * score / 100); null when the rubric has no such dimension or the
trajectory has no done review), `overall_score` (their mean, null without either),
`desired_tools_used_percentage` and `order_correctness` (Toucan's tool-call accuracy, computed
in code on the stored steps: apps/engines/scenes/toucan/quality.py) and `rule_filter` (Toucan's step 3.2
rules on the stored steps and final answer). Any scene's trajectory renders; only the toucan
scene's tasks carry target tools and a question quality assessment (empty / null otherwise).
"""
from __future__ import annotations

from typing import Any

from apps.engines.scenes.toucan import quality
from apps.engines.scenes.toucan.questions import QC_DIMENSIONS

from .chat import function_specs, render_messages, validate_messages, validate_tools

Line = dict[str, Any]
KEYS = {"messages", "question", "available_tools", "target_tools", "question_quality_assessment",
        "response_quality_assessment", "metadata"}
RESPONSE_DIMENSIONS = ("completeness", "conciseness")
SUBSET = "single-turn-original"


def _judged(auto: dict[str, Any] | None, dim: str) -> dict[str, Any]:
    value = ((auto or {}).get("scores") or {}).get(dim)
    score = value.get("score") if isinstance(value, dict) else value
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return {"score": None, "reasoning": ""}
    reasoning = value.get("rationale", "") if isinstance(value, dict) else ""
    return {"score": 1 + round(4 * max(0.0, min(100.0, float(score))) / 100), "reasoning": reasoning or ""}


def render_toucan(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    task = record.get("task") or {}
    scene = task.get("scene_config") or {}
    messages = render_messages(record, arguments="string", include_system=ctx["include_system"])
    steps = record.get("steps") or []
    targets = list(scene.get("target_tools") or [])
    accuracy = quality.tool_call_accuracy(targets, quality.called_tools(steps))
    rules = quality.rule_filter(steps, record.get("final_answer") or "")
    auto = (record.get("reviews") or {}).get("auto")
    response = {dim: _judged(auto, dim) for dim in RESPONSE_DIMENSIONS}
    scores = [response[d]["score"] for d in RESPONSE_DIMENSIONS if response[d]["score"] is not None]
    response.update(overall_score=sum(scores) / len(scores) if scores else None,
                    desired_tools_used_percentage=accuracy["desired_tools_used_percentage"],
                    order_correctness=accuracy["order_correctness"],
                    rule_filter={"passed": rules["passed"], "failed": rules["failed"]},
                    judge_model=(auto or {}).get("judge_model") or "")
    verifier = record.get("verifier_output") or {}
    return {
        "messages": messages,
        "question": task.get("prompt") or "",
        "available_tools": [{"type": "function", "function": fn} for fn in function_specs(record.get("tools") or [])],
        "target_tools": ", ".join(targets),
        "question_quality_assessment": scene.get("question_quality_assessment"),
        "response_quality_assessment": response,
        "metadata": {
            "subset_name": SUBSET, "trajectory_id": record["trajectory_id"], "task_id": record["task_id"],
            "external_id": task.get("external_id") or "", "scene": task.get("scene") or "", "servers": list(scene.get("target_servers") or []),
            "model": record.get("model") or "", "outcome": record.get("outcome") or "", "reward": record.get("reward"),
            "verifier": verifier.get("method") or "", "check": verifier.get("check"),
            "generation": scene.get("generation"), "content_sha256": record.get("content_sha256") or "",
        },
    }


def _score(value: Any, where: str, *, nullable: bool) -> list[str]:
    if value is None and nullable:
        return []
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        return [f"{where}: must be a whole number from 1 to 5{' or null' if nullable else ''}"]
    return []


def _dimensions(assessment: dict[str, Any], dims: tuple[str, ...], where: str, *, nullable: bool) -> list[str]:
    problems = []
    for dim in dims:
        block = assessment.get(dim)
        if not isinstance(block, dict) or not isinstance(block.get("reasoning"), str):
            problems.append(f"{where}.{dim}: must be an object with reasoning and score")
        else:
            problems += _score(block.get("score"), f"{where}.{dim}.score", nullable=nullable)
    return problems


def validate_toucan(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in sorted(KEYS - obj.keys())]
    problems += [f"line.{k}: unexpected field" for k in sorted(obj.keys() - KEYS)]
    tool_problems, names = validate_tools(obj.get("available_tools", []), "line.available_tools")
    problems += tool_problems
    messages = obj.get("messages")
    problems += validate_messages(messages, names, arguments="string", where="line.messages")
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        problems.append("line.question: must be a non-empty string")
    elif isinstance(messages, list):
        first = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        if first is None or first.get("content") != question:
            problems.append("line.question: must be the first user message")
    targets = obj.get("target_tools")
    if not isinstance(targets, str):
        problems.append("line.target_tools: must be a comma-separated string")
    else:
        unknown = [t for t in (s.strip() for s in targets.split(",")) if t and t not in names]
        if unknown:
            problems.append(f"line.target_tools: not among available_tools: {', '.join(unknown)}")
    qqa = obj.get("question_quality_assessment")
    if qqa is not None:
        if not isinstance(qqa, dict):
            problems.append("line.question_quality_assessment: must be an object or null")
        else:
            problems += _dimensions(qqa, QC_DIMENSIONS, "line.question_quality_assessment", nullable=False)
    rqa = obj.get("response_quality_assessment")
    if not isinstance(rqa, dict):
        problems.append("line.response_quality_assessment: must be an object")
    else:
        problems += _dimensions(rqa, RESPONSE_DIMENSIONS, "line.response_quality_assessment", nullable=True)
        share = rqa.get("desired_tools_used_percentage")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            problems.append("line.response_quality_assessment.desired_tools_used_percentage: must be a number in 0..1")
        if not isinstance(rqa.get("order_correctness"), bool):
            problems.append("line.response_quality_assessment.order_correctness: must be true or false")
    if not isinstance(obj.get("metadata"), dict):
        problems.append("line.metadata: must be an object")
    return problems
