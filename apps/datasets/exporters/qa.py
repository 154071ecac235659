"""QA pairs for RL training sets: `qa` (the pair and its gates) and `qa-verl` (verl's RL task row).

    {"question": "...", "answer": "Teignmouth", "aliases": [...], "sources": ["https://...", ...],
     "gates": [{"name": "evidence_quotes", "passed": true, "reason": "..."}, ...],
     "metadata": {"scene", "task_id", "trajectory_id", "external_id", "batch", "seed", "web"}}

A pair comes from either side of the search2qa factory:
- a `search2qa` trajectory: its verifier output's final pair, evidence urls as sources, every gate;
  only a trajectory whose every gate passed (reward 1.0) is a pair, the others are excluded with the
  gates that failed;
- a `deep_search` task (one the factory emitted, or any with an expected answer): its prompt, its
  scene_config expected_answer, aliases and sources, and the gates of `scene_config.generation`
  (the factory's, before its deep_search solver ran: that solver's passing run is the task's first
  trajectory); a hand-written task has no gates ([]).

`qa-verl` is the `rl-verl` row (apps/datasets/exporters/formats.py: the same prompt prefix, tools and
validator) with `reward_model.ground_truth` = the answer and `extra_info` carrying aliases, sources
and gates, so a reward function can accept any alias (Search-R1's EM over a target list). Its prompt
is the deep_search episode's system and user messages, or for a search2qa trajectory the question
alone as the user message. Both formats write one line per task.
"""
from __future__ import annotations

from typing import Any

from .chat import RenderError, dumps_compact
from .formats import _keys, _task_prompt, _tools, validate_verl

Line = dict[str, Any]
KEYS = {"question", "answer", "aliases", "sources", "gates", "metadata"}


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _gates(value: Any) -> list[dict[str, Any]]:
    return [{"name": g.get("name"), "passed": bool(g.get("passed")), "reason": g.get("reason") or ""}
            for g in value if isinstance(g, dict)] if isinstance(value, list) else []


def pair_of(record: dict[str, Any]) -> dict[str, Any]:
    """The record's QA pair: question, answer, aliases, sources, gates and where it came from."""
    task = record.get("task") or {}
    scene = task.get("scene") or ""
    config = task.get("scene_config") or {}
    meta = {"scene": scene, "task_id": record["task_id"], "trajectory_id": record["trajectory_id"],
            "external_id": task.get("external_id") or "", "batch": task.get("batch") or "", "web": config.get("web")}
    if scene == "search2qa":
        out = record.get("verifier_output") or {}
        qa = out.get("qa")
        if not isinstance(qa, dict) or not qa.get("question"):
            raise RenderError("the search2qa trajectory has no pair (its factory did not run to the gates)")
        gates = _gates(out.get("gates"))
        if record.get("reward") != 1.0:
            failed = [g["name"] for g in gates if not g["passed"]]
            raise RenderError(f"the pair did not pass every gate (failed: {', '.join(failed) or 'none listed'})")
        sources = list(dict.fromkeys(e["url"] for e in qa.get("evidence") or [] if isinstance(e, dict)
                                     and isinstance(e.get("url"), str)))
        return {"question": qa["question"], "answer": qa.get("answer") or "", "aliases": _strings(qa.get("aliases")),
                "sources": sources, "gates": gates,
                "metadata": {**meta, "seed": config.get("seed"), "emitted": out.get("emitted")}}
    if scene == "deep_search":
        if not config.get("expected_answer"):
            raise RenderError("the deep_search task has no expected_answer")
        made = config.get("generation") if isinstance(config.get("generation"), dict) else {}
        return {"question": task.get("prompt") or "", "answer": config["expected_answer"],
                "aliases": _strings(config.get("aliases")), "sources": _strings(config.get("sources")),
                "gates": _gates(made.get("gates")), "metadata": {**meta, "seed": made.get("seed"),
                                                              "source_trajectory": made.get("source_trajectory")}}
    raise RenderError(f"a {scene or 'unknown'} task has no QA pair (search2qa and deep_search do)")


def render_qa(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    return pair_of(record)


def validate_qa(obj: Any) -> list[str]:
    problems = _keys(obj, KEYS)
    if problems and not isinstance(obj, dict):
        return problems
    for key in ("question", "answer"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            problems.append(f"line.{key}: must be a non-empty string")
    for key in ("aliases", "sources"):
        if not isinstance(obj.get(key), list) or not all(isinstance(v, str) and v for v in obj[key]):
            problems.append(f"line.{key}: must be a list of non-empty strings")
    gates = obj.get("gates")
    if not isinstance(gates, list) or not all(
            isinstance(g, dict) and isinstance(g.get("name"), str) and isinstance(g.get("passed"), bool)
            and isinstance(g.get("reason"), str) for g in gates):
        problems.append("line.gates: must be a list of {name, passed, reason}")
    if not isinstance(obj.get("metadata"), dict):
        problems.append("line.metadata: must be an object")
    return problems


def render_qa_verl(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    pair = pair_of(record)
    if pair["metadata"]["scene"] == "search2qa":
        prompt: list[dict[str, Any]] = [{"role": "user", "content": pair["question"]}]
        tools: list[dict[str, Any]] = []
    else:
        prompt, tools = _task_prompt(record, ctx), _tools(record)
    meta = pair["metadata"]
    return {
        "data_source": "trajplatform/qa", "prompt": prompt, "ability": "deep_search",
        "reward_model": {"style": "rule", "ground_truth": pair["answer"]},
        "extra_info": {
            "split": ctx["split"], "index": ctx["index"], "task_id": meta["task_id"],
            "trajectory_id": meta["trajectory_id"], "external_id": meta["external_id"],
            "question": pair["question"], "aliases": pair["aliases"], "sources": pair["sources"],
            "gates": dumps_compact(pair["gates"]), "tools": dumps_compact(tools),
        },
    }


def validate_qa_verl(obj: Any) -> list[str]:
    problems = validate_verl(obj)
    extra = obj.get("extra_info") if isinstance(obj, dict) else None
    if isinstance(extra, dict) and (not isinstance(extra.get("aliases"), list)
                                    or not all(isinstance(a, str) for a in extra["aliases"])):
        problems.append("line.extra_info.aliases: must be a list of strings")
    return problems
