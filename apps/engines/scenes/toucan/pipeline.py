"""The toucan generation pipeline: questions for the registered MCP servers, deduplicated and checked.

    manage.py synthesize_pipeline toucan --seeds examples/toucan/seeds.jsonl [--config JSON] --wait

A seed is one sampling request (questions.py, SamplingSettings) over the registered, enabled
servers (all of them, or those it names):

    {"id": "time-git", "servers": ["time", "git"], "mode": "multi_server", "allocation": "random",
     "num_tools": 2, "total": 3, "seed": 7}

Stages, per item (declared with apps/engines/generation.py, run by apps/engines/pipelines/):

1. plan (code, fan-out): the seed's question plans, drawn with random.Random(seed["seed"]) (default:
   a hash of the seed's id), so a run is reproducible; each plan becomes an item "<seed id>.q<i>".
2. question (llm, template toucan/question): the question and its target tools; the validator
   parses and sanitises it (a rejection is sent back for one repair, then the item is dropped).
3. dedup (code, all items): MiniLM cosine against the questions kept before it in this run and
   the existing toucan tasks of the same set of servers (run config `dedup_threshold`, 0.85).
4. qc (llm, template toucan/qc): Toucan's six-dimension quality check; an answer that cannot be
   parsed is repaired once, then the item is dropped — never passed.
5. qc_gate (code): the scores against the thresholds (run config `qc_thresholds`, e.g.
   {"stability": 4, "overall_score": 3.5}; questions.DEFAULT_QC_THRESHOLDS otherwise).

A surviving item becomes a task: the question as prompt, scene_config target_servers (the plan's
servers, whose tools the agent gets), target_tools, question_quality_assessment and generation
(plan, strategy, server analysis, template versions). Such tasks have no check: their reward is
the tool-use proxy (quality.py).

Run config: dedup_threshold (0 < t <= 1), qc_thresholds, min_chars, max_chars, model.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any

from apps.engines.mcp import McpServerSpec
from apps.engines.generation import CodeStage, Drop, LLMStage, Pipeline, PipelineError, platform_store
from apps.engines.scenes.toucan import questions
from apps.engines.scenes.toucan.questions import PlanError, QcUnparseable, QuestionRejected

NAME = "toucan"
RUN_CONFIG_KEYS = ("dedup_threshold", "qc_thresholds", "min_chars", "max_chars", "model", "concurrency")
QUESTION_SCHEMA = {"type": "object", "required": ["target_tools", "question"],
                   "properties": {"server_analysis": {"type": "string"}, "question": {"type": "string"},
                                  "target_tools": {"type": "array", "minItems": 1}}}
QC_SCHEMA = {"type": "object", "required": list(questions.QC_DIMENSIONS)}


def server_records(names: list[str] | None = None) -> list[dict[str, Any]]:
    """The registered, enabled servers as questions.py's server records (offered tools only)."""
    found = platform_store().mcp_servers(names)
    missing = sorted(set(names or []) - {server["name"] for server in found})
    if missing:
        raise PlanError(f"the MCP servers {', '.join(missing)} are not registered or are disabled")
    records = []
    for server in found:
        spec = McpServerSpec.from_dict(server["spec"])
        labels = server["labels"]
        package = dict(server["spec"].get("package") or {})
        name = package.get("name", server["name"])
        about = [labels.get("description") or f"{name} {package.get('version', '')}".strip()]
        if labels.get("primary"):
            about.append(", ".join([labels["primary"], *labels.get("secondary", [])]))
        record = {"name": server["name"], "description": "; ".join(about),
                  "labels": {"primary_label": labels.get("primary", ""),
                             "secondary_labels": list(labels.get("secondary", [])),
                             "featured": bool(labels.get("featured", False))},
                  "tools": [t for t in server["tools"] if spec.offers(t["name"])]}
        if labels.get("rank"):
            record["rank"] = labels["rank"]
        records.append(record)
    return records


def _rng_seed(seed: dict[str, Any]) -> int:
    value = seed.get("seed")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(hashlib.sha256(str(seed.get("id", "")).encode()).hexdigest()[:12], 16)


def plan_stage(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    seed = inputs["seed"]
    if not isinstance(seed, dict):
        raise Drop(f"a toucan seed is an object of sampling settings, got {type(seed).__name__}")
    settings = {k: v for k, v in seed.items() if k not in ("id", "servers", "seed")}
    unknown = sorted(set(settings) - set(questions.SamplingSettings.__dataclass_fields__))
    try:
        if unknown:
            raise PlanError(f"unknown seed fields {', '.join(unknown)}")
        return questions.plan_questions(server_records(seed.get("servers")), settings,
                                        rng=random.Random(_rng_seed(seed)))
    except PlanError as exc:
        raise Drop(f"the seed cannot be planned: {exc}") from None


def _earlier_questions(servers: list[str]) -> list[str]:
    """Questions of existing toucan tasks for exactly this set of servers."""
    wanted = sorted(servers)
    return [prompt for prompt, scene in platform_store().task_prompts("toucan")
            if sorted((scene or {}).get("target_servers") or []) == wanted]


def build(config: dict[str, Any]) -> Pipeline:
    """The toucan pipeline for a run's config (PipelineError on a bad config)."""
    unknown = sorted(set(config) - set(RUN_CONFIG_KEYS))
    if unknown:
        raise PipelineError(f"unknown toucan run config {', '.join(unknown)}; known: {', '.join(RUN_CONFIG_KEYS)}")
    threshold = config.get("dedup_threshold", questions.DEFAULT_DEDUP_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise PipelineError(f"dedup_threshold must be a number in (0, 1], got {threshold!r}")
    try:
        thresholds = questions.qc_thresholds(config.get("qc_thresholds"))
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
    bounds = {"min_chars": config.get("min_chars", questions.DEFAULT_MIN_CHARS),
              "max_chars": config.get("max_chars", questions.DEFAULT_MAX_CHARS)}
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in bounds.values()) \
            or bounds["min_chars"] > bounds["max_chars"]:
        raise PipelineError(f"min_chars and max_chars must be whole numbers, min <= max, got {bounds}")

    def sanitised(inputs: dict[str, Any]) -> dict[str, Any]:
        return questions.sanitise(questions.parse_question(inputs["question"]), inputs["plan"], **bounds)

    def check_question(parsed: Any, inputs: dict[str, Any]) -> str | None:
        try:
            sanitised({"question": parsed, "plan": inputs["plan"]})
        except (ValueError, QuestionRejected) as exc:
            return str(exc)
        return None

    def dedup(items: dict[str, dict[str, Any]]) -> dict[str, Any]:
        done = {key: sanitised(inputs) for key, inputs in items.items()}
        earlier: dict[tuple[str, ...], list[str]] = {}
        verdicts: dict[str, str | None] = {}
        for key, item in done.items():
            servers = tuple(sorted(item["target_servers"]))
            if servers not in earlier:
                earlier[servers] = _earlier_questions(list(servers))
        # One pass over the batch against all earlier questions of each item's server set.
        by_servers: dict[tuple[str, ...], list[str]] = {}
        for key, item in done.items():
            by_servers.setdefault(tuple(sorted(item["target_servers"])), []).append(key)
        batch = [(key, done[key]["question"]) for key in done]
        within = questions.dedup_questions(batch, threshold=threshold)
        for servers, keys in by_servers.items():
            against = questions.dedup_questions([(k, done[k]["question"]) for k in keys], earlier[servers],
                                                threshold=threshold) if earlier[servers] else {}
            for key in keys:
                verdicts[key] = against.get(key) or within[key]
        return {key: Drop(verdicts[key]) if verdicts[key] else done[key] for key in done}

    def check_qc(parsed: Any, inputs: dict[str, Any]) -> str | None:
        try:
            questions.parse_qc(parsed)
        except QcUnparseable as exc:
            return str(exc)
        return None

    def qc_gate(inputs: dict[str, Any]) -> dict[str, Any]:
        assessment = questions.parse_qc(inputs["qc"])
        passed, reasons = questions.qc_verdict(assessment, thresholds)
        if not passed:
            raise Drop(f"below the quality thresholds: {'; '.join(reasons)}")
        return assessment

    def task(key: str, state: dict[str, Any]) -> dict[str, Any]:
        item, plan = state["dedup"], state["plan"]
        return {"scene": "toucan", "prompt": item["question"], "external_id": f"toucan-{key}", "config": {
            "target_servers": item["target_servers"], "target_tools": item["target_tools"],
            "question_quality_assessment": state["qc_gate"],
            "generation": {"pipeline": NAME, "item": key, "mode": plan["mode"], "strategy": plan["strategy"],
                           "num_tools": plan["num_tools"], "server_analysis": item["server_analysis"],
                           "templates": {t.id: t.version for t in (questions.QUESTION, questions.QC)}},
        }}

    return Pipeline(name=NAME, task=task, stages=(
        CodeStage(name="plan", fn=plan_stage, fan_out=True, inputs=lambda s: {"seed": s["seed"]}),
        LLMStage(name="question", template=questions.QUESTION, schema=QUESTION_SCHEMA, validator=check_question,
                 repairs=1, temperature=0.8, inputs=lambda s: {"plan": s["plan"]}),
        CodeStage(name="dedup", fn=dedup, scope="all",
                  inputs=lambda s: {"plan": s["plan"], "question": s["question"]}),
        LLMStage(name="qc", template=questions.QC, schema=QC_SCHEMA, validator=check_qc, repairs=1, temperature=0.0,
                 inputs=lambda s: {"servers": s["plan"]["servers"], "question": s["dedup"]["question"],
                                   "target_tools": s["dedup"]["target_tools"]}),
        CodeStage(name="qc_gate", fn=qc_gate, inputs=lambda s: {"qc": s["qc"]}),
    ))
