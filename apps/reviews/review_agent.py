"""The review agent: deterministic checks, an LLM judge with a per-scene rubric, the overall
score, and the changes it proposes for the next iteration.

    checks = run_checks(trajectory)                     # computed in code, no model involved
    verdict = judge(trajectory, checks, attempt=1)      # JudgeResult, or raises JudgeFailed
    overall = overall_score(verdict.scores, checks, trajectory.reward)
    drafts = draft_proposals(task, reviews)             # rule- and judge-derived, tiered by policy

The overall score (0-100), documented in docs/reviews.md:

    judge_mean = mean of the rubric dimensions' scores (each 0-100)
    base       = judge_mean                              when the trajectory has no reward
               = 0.5 * judge_mean + 0.5 * 100 * reward    when a verifier gave one
    overall    = clamp(base - sum of the penalties of the checks that fired, 0, 100)

Penalties (CHECK_PENALTIES): an episode error 30; a verifier's process condition that failed 25
each (at most 50: verifier_output["process"], see below); a step/time/token limit exhausted 15;
secrets or PII visible 20; repeated identical actions 10; an empty final answer 10; per
occurrence 5 (at most 15 each) for unparseable calls, unknown tools, invalid arguments and
errors left unhandled. A judge that cannot be reached or whose output cannot be parsed gives
no score at all (JudgeFailed): the review is `judge_failed` and retried later.

Process conditions: a scene's verifier reports how the task was done under
verifier_output["process"] = {name: {"ok": bool, "detail": str, "relaxed": bool}} (toucan: its rule
filter, target tools, their order; other scenes their own). Every condition that is not ok fires
`process_conditions`, also one the task relaxed (it did not gate the reward): a hollow success
(reward 1, judge 100) then scores at most 75, below the default threshold 80.

A limit hit by an agent whose last steps repeat one action (`limit_exhausted.stuck_on`) is a
stuck agent, not a short budget: no limit is raised for it (neither by rule nor by a judge
suggestion); the review proposes the loop hint in the system prompt instead (green), and when
that hint is already there, another model (yellow).

The judge never picks a tier: its suggestions ({field, to, options, rationale}) pass through
`apps.reviews.policy.classify` like the rule-derived ones, and fields the policy does not
cover, or values it refuses, are dropped.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from jsonschema import Draft202012Validator

from apps.engines.llm import LLMError, get_llm_client, llm_route
from apps.engines.registry import RUBRICS, rubric_for, rubric_id  # noqa: F401 (RUBRICS: each scene declares its rubric)
from apps.engines.toolargs import REFUSED_KINDS
from apps.reviews import policy

# The judge's calls are routed so (apps.engines.llm.llm_route): the offline stand-in knows them by
# the header; a real model's prompt carries no marker.
JUDGE_ROUTE = "judge"
EVIDENCE_OPEN, EVIDENCE_CLOSE = "<evidence>", "</evidence>"

CHECK_PENALTIES: dict[str, tuple[float, float]] = {
    # check id -> (penalty per occurrence, cap)
    "episode_error": (30, 30),
    "process_conditions": (25, 50),
    "limit_exhausted": (15, 15),
    "sensitive_data": (20, 20),
    "repeated_actions": (10, 10),
    "empty_final_answer": (10, 10),
    "unparseable_calls": (5, 15),
    "unknown_tools": (5, 15),
    "invalid_arguments": (5, 15),
    "unhandled_errors": (5, 15),
    "repeated_delegations": (5, 10),
    "unanswered_delegations": (5, 15),
    "verifier": (0, 0),  # the reward already weighs half of the base
}
CHECK_TITLES = {
    "verifier": "verifier / check function did not pass",
    "episode_error": "the episode ended in an error",
    "process_conditions": "the verifier's process conditions failed (the task done without its process)",
    "unparseable_calls": "tool calls whose arguments failed to parse",
    "unknown_tools": "calls to tools that were not offered",
    "invalid_arguments": "arguments invalid against the tool schema",
    "repeated_actions": "repeated identical actions (a loop)",
    "unhandled_errors": "failed steps never recovered from",
    "limit_exhausted": "step, time or token limit exhausted",
    "empty_final_answer": "empty final answer",
    "sensitive_data": "secrets or personal data visible in observations",
    "repeated_delegations": "the same instruction delegated to the same role again",
    "unanswered_delegations": "delegations whose role never finished",
}
REPEAT_THRESHOLD = 3
FINISH_TOOLS = frozenset({"finish", "submit", "final_answer"})
_SENSITIVE = [
    ("redacted secret", re.compile(r"\[REDACTED\]")),
    ("API key", re.compile(r"\b(?:sk-[A-Za-z0-9_\-]{16,}|AIza[0-9A-Za-z_\-]{30,}|hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,})")),
    ("AWS access key", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("e-mail address", re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b")),
    ("card number", re.compile(r"\b(?:\d[ -]?){13,16}\b")),
]
# Domains reserved for documentation and tests (RFC 2606, RFC 6761): bundled sites and fixtures use them.
_RESERVED_DOMAIN = re.compile(r"@(?:[A-Za-z0-9-]+\.)*(?:example\.(?:com|org|net)|example|test|invalid|localhost)$",
                              re.IGNORECASE)
STEP_TEXT_CHARS = 600
ARGUMENT_CHARS = 400
HEAD_STEPS, TAIL_STEPS = 40, 10


# -- deterministic checks ------------------------------------------------------------------------


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = int(ch)
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _sensitive_hits(text: str) -> list[str]:
    hits = []
    for label, pattern in _SENSITIVE:
        for match in pattern.finditer(text):
            if label == "card number":
                digits = re.sub(r"\D", "", match.group(0))
                if not (13 <= len(digits) <= 16 and _luhn(digits)):
                    continue
            if label == "e-mail address" and _RESERVED_DOMAIN.search(match.group(0)):
                continue  # RFC 2606 / 6761 names (example.org, *.test): made up, nobody's address
            hits.append(label)
            break
    return hits


def _tool_validators(tools: Any) -> dict[str, Draft202012Validator]:
    validators = {}
    for tool in tools if isinstance(tools, list) else []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            validators[fn["name"]] = Draft202012Validator(fn.get("parameters") or {"type": "object"})
    return validators


def _failed(step: dict[str, Any]) -> bool:
    if step.get("error"):
        return True
    code = step.get("exit_code")
    return isinstance(code, int) and code != 0


def _check(count: int, detail: str, **extra: Any) -> dict[str, Any]:
    return {"fired": count > 0, "count": count, "detail": detail if count else "", **extra}


def _call_error_kind(step: dict[str, Any], validators: dict[str, Any]) -> str:
    """What was wrong with a step's tool call: "unparseable_arguments", "unknown_tool",
    "invalid_arguments" or "". The agent loop records the kind on the step (`error_kind`) with
    the arguments as parsed; steps stored before it did are read from their error text."""
    kind = str(step.get("error_kind") or "")
    if kind in REFUSED_KINDS:
        return kind
    if kind:  # e.g. "infrastructure": the call itself was fine
        return ""
    name, error, args = str(step.get("tool") or ""), str(step.get("error") or ""), step.get("arguments")
    if "not valid JSON" in error:
        return "unparseable_arguments"
    if error.startswith("unknown tool") or (validators and name and name not in validators):
        return "unknown_tool"
    if error.startswith("invalid arguments") or "must be a JSON object" in error:
        return "invalid_arguments"
    if name in validators and isinstance(args, dict) and any(True for _ in validators[name].iter_errors(args)):
        return "invalid_arguments"
    return ""


def process_failures(verifier_output: Any) -> dict[str, str]:
    """{name: "<detail>"} for each of verifier_output["process"]'s conditions that is not ok (an
    entry without `"ok": true` counts as failed); "(relaxed by the task)" marks relaxed ones."""
    process = verifier_output.get("process") if isinstance(verifier_output, dict) else None
    failed = {}
    for name, condition in (process if isinstance(process, dict) else {}).items():
        condition = condition if isinstance(condition, dict) else {}
        if condition.get("ok") is not True:
            relaxed = " (relaxed by the task)" if condition.get("relaxed") else ""
            failed[str(name)] = f"{str(condition.get('detail') or 'not ok')[:300]}{relaxed}"
    return failed


def _action_key(step: dict[str, Any]) -> str:
    return json.dumps([step.get("tool"), step.get("arguments")], sort_keys=True, default=str)


def stuck_on(steps: list[dict[str, Any]]) -> str:
    """The action the trajectory's last steps repeat (at least REPEAT_THRESHOLD times in a row,
    as "<tool> xN (steps [...])"), else ""."""
    if not steps:
        return ""
    last = _action_key(steps[-1])
    run = 0
    for step in reversed(steps):
        if _action_key(step) != last:
            break
        run += 1
    if run < REPEAT_THRESHOLD:
        return ""
    return f"{steps[-1].get('tool')} x{run} (steps {[s.get('index') for s in steps[-run:]]})"


def run_checks(trajectory: Any) -> dict[str, Any]:
    """Every deterministic check on a finished trajectory: {check id: {fired, count, detail, penalty}}."""
    steps = [s for s in (trajectory.steps if isinstance(trajectory.steps, list) else []) if isinstance(s, dict)]
    validators = _tool_validators(trajectory.tools)
    checks: dict[str, dict[str, Any]] = {}

    reward = trajectory.reward
    verifier_failed = reward is not None and reward < 1.0
    checks["verifier"] = _check(
        int(verifier_failed),
        f"reward {reward:.2f}: {trajectory.outcome_reason}" if verifier_failed else "",
        reward=reward,
    )
    checks["episode_error"] = _check(int(trajectory.outcome == "error"), trajectory.outcome_reason)
    failed = process_failures(trajectory.verifier_output)
    checks["process_conditions"] = _check(len(failed), "; ".join(f"{k}: {v}" for k, v in failed.items()),
                                          conditions=list(failed))

    unparseable, unknown, invalid = [], [], []
    for step in steps:
        kind = _call_error_kind(step, validators)
        if kind == "unparseable_arguments":
            unparseable.append(step.get("index"))
        elif kind == "unknown_tool":
            unknown.append(str(step.get("tool") or "") or "?")
        elif kind == "invalid_arguments":
            invalid.append(step.get("index"))
    checks["unparseable_calls"] = _check(len(unparseable), f"steps {unparseable}")
    checks["unknown_tools"] = _check(len(unknown), f"called {sorted(set(unknown))}; offered {sorted(validators)}")
    checks["invalid_arguments"] = _check(len(invalid), f"steps {invalid}")

    seen: dict[str, list[int]] = {}
    for step in steps:
        seen.setdefault(_action_key(step), []).append(step.get("index"))
    loops = {k: v for k, v in seen.items() if len(v) >= REPEAT_THRESHOLD}
    worst = max(loops.values(), key=len) if loops else []
    checks["repeated_actions"] = _check(
        len(loops), f"{json.loads(max(loops, key=lambda k: len(loops[k])))[0]} repeated {len(worst)}x (steps {worst})"
        if loops else "",
    )

    unhandled = []
    for i, step in enumerate(steps):
        if not _failed(step) or str(step.get("error") or "").startswith("skipped"):
            continue
        later = [s for s in steps[i + 1:] if str(s.get("tool") or "") not in FINISH_TOOLS]
        if not any(not _failed(s) for s in later):
            unhandled.append(step.get("index"))
    checks["unhandled_errors"] = _check(len(unhandled), f"steps {unhandled}")

    reason = trajectory.outcome_reason or ""
    limit = ""
    if "max_steps (" in reason:
        limit = "max_steps"
    elif "wall-clock timeout" in reason:
        limit = "timeout"
    elif "token budget" in reason:
        limit = "token_budget"
    timed_out = [s.get("index") for s in steps if s.get("timed_out")]
    stuck = stuck_on(steps) if limit else ""
    checks["limit_exhausted"] = _check(
        int(bool(limit)) + len(timed_out),
        "; ".join(filter(None, [reason if limit else "", f"steps timed out: {timed_out}" if timed_out else "",
                                f"stuck: the last steps repeat {stuck}" if stuck else ""])),
        limit=limit or ("step_timeout" if timed_out else ""), stuck_on=stuck,
    )
    checks["empty_final_answer"] = _check(
        int(trajectory.outcome != "error" and not (trajectory.final_answer or "").strip()),
        "the trajectory ended without a final answer",
    )

    hits: dict[str, list[int]] = {}
    for step in steps:
        for label in _sensitive_hits(f"{step.get('output') or ''}\n{step.get('observation') or ''}"):
            hits.setdefault(label, []).append(step.get("index"))
    checks["sensitive_data"] = _check(
        sum(len(v) for v in hits.values()), "; ".join(f"{k} in steps {v}" for k, v in sorted(hits.items()))
    )

    # multi_agent: the steps that ran a role (apps/engines/scenes/multi_agent/runtime.py) carry `subagent`.
    delegated: dict[str, list[int]] = {}
    unanswered = []
    for step in steps:
        sub = step.get("subagent")
        if not isinstance(sub, dict):
            continue
        args = step.get("arguments") if isinstance(step.get("arguments"), dict) else {}
        key = json.dumps([sub.get("role"), " ".join(str(args.get("instruction") or "").split())])
        delegated.setdefault(key, []).append(step.get("index"))
        if sub.get("outcome") != "success":
            unanswered.append(f"{sub.get('label')} (step {step.get('index')}: {sub.get('outcome')})")
    repeated = {json.loads(k)[0]: v for k, v in delegated.items() if len(v) > 1}
    checks["repeated_delegations"] = _check(
        sum(len(v) - 1 for v in repeated.values()),
        "; ".join(f"{role} got the same instruction in steps {v}" for role, v in sorted(repeated.items())))
    checks["unanswered_delegations"] = _check(len(unanswered), "; ".join(unanswered))

    for name, check in checks.items():
        per, cap = CHECK_PENALTIES[name]
        check["penalty"] = min(cap, per * check["count"]) if check["fired"] else 0
        check["title"] = CHECK_TITLES[name]
    return checks


def overall_score(scores: dict[str, dict[str, Any]], checks: dict[str, Any], reward: float | None) -> float:
    """The documented formula (module docstring), rounded to one decimal."""
    judge_mean = mean(float(v["score"]) for v in scores.values())
    base = judge_mean if reward is None else 0.5 * judge_mean + 0.5 * 100.0 * float(reward)
    penalty = sum(float(c.get("penalty") or 0) for c in checks.values())
    return round(max(0.0, min(100.0, base - penalty)), 1)


# -- the judge -----------------------------------------------------------------------------------


class JudgeFailed(Exception):
    """The judge gave no usable verdict (unreachable, or unparseable output); never a score."""

    def __init__(self, message: str, *, raw: str = "", model: str = "", prompt: str = "", cost_usd: Any = 0):
        super().__init__(message)
        self.raw, self.model, self.prompt, self.cost_usd = raw, model, prompt, cost_usd  # a call that answered cost


@dataclass
class JudgeResult:
    scores: dict[str, dict[str, Any]]
    suggestions: list[dict[str, Any]]
    summary: str
    model: str
    prompt: str
    raw: str
    rubric_version: str
    usage: dict[str, int] = field(default_factory=dict)
    cost_usd: Any = 0  # Decimal, from the LLM client


def _clip(text: Any, limit: int) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [… {len(text) - limit} more characters not shown]"


def evidence(trajectory: Any, checks: dict[str, Any], rubric: dict[str, str]) -> dict[str, Any]:
    """What the judge is shown besides the conversation: facts computed in code."""
    steps = trajectory.steps if isinstance(trajectory.steps, list) else []
    return {
        "dimensions": list(rubric),
        "outcome": trajectory.outcome,
        "outcome_reason": trajectory.outcome_reason,
        "reward": trajectory.reward,
        "steps": len(steps),
        "max_steps": (trajectory.config_snapshot or {}).get("max_steps"),
        "final_answer_empty": not (trajectory.final_answer or "").strip(),
        "checks": {k: {"fired": v["fired"], "count": v["count"], "detail": v["detail"]} for k, v in checks.items()},
    }


def _step_lines(steps: list[Any]) -> list[str]:
    shown = list(enumerate(steps))
    omitted = 0
    if len(shown) > HEAD_STEPS + TAIL_STEPS:
        omitted = len(shown) - HEAD_STEPS - TAIL_STEPS
        shown = shown[:HEAD_STEPS] + shown[-TAIL_STEPS:]
    lines = []
    for i, step in shown:
        if omitted and i == len(steps) - TAIL_STEPS:
            lines.append(f"[… {omitted} steps in between not shown]")
        if not isinstance(step, dict):
            lines.append(f"step {i}: {_clip(step, STEP_TEXT_CHARS)}")
            continue
        parts = [f"step {step.get('index', i)}: {step.get('tool')}({_clip(step.get('arguments'), ARGUMENT_CHARS)})"]
        if step.get("thought"):
            parts.append(f"  thought: {_clip(step['thought'], ARGUMENT_CHARS)}")
        parts.append(f"  exit_code: {step.get('exit_code')}" + (" (timed out)" if step.get("timed_out") else ""))
        if step.get("error"):
            parts.append(f"  error: {_clip(step['error'], ARGUMENT_CHARS)}")
        parts.append(f"  output: {_clip(step.get('output') or '', STEP_TEXT_CHARS)}")
        lines.append("\n".join(parts))
    return lines


def judge_messages(trajectory: Any, checks: dict[str, Any]) -> list[dict[str, str]]:
    scene = (trajectory.config_snapshot or {}).get("scene") or trajectory.task.scene
    rubric = rubric_for(scene)
    dims = "\n".join(f"- {name}: {what}" for name, what in rubric.items())
    system = (
        "You review one trajectory of an AI agent. Score each rubric dimension from 0 to 100 with a short "
        "rationale, judging only what the trajectory shows. Facts computed in code (outcome, reward, "
        "deterministic checks) are given as evidence; do not contradict them.\n"
        f"Rubric dimensions:\n{dims}\n"
        "You may suggest config changes for the next iteration as {\"field\", \"to\", \"options\", \"rationale\"}; "
        f"fields: {', '.join(sorted(policy.TASK_FIELDS))} or scene_config.KEY. Another part of the system decides "
        "whether and how they are applied.\n"
        "Answer with one JSON object only: {\"scores\": {\"<dimension>\": {\"score\": <0-100>, \"rationale\": \"...\"}}, "
        "\"suggestions\": [...], \"summary\": \"...\"}"
    )
    snapshot = trajectory.config_snapshot or {}
    facts = json.dumps(evidence(trajectory, checks, rubric), ensure_ascii=False, sort_keys=True, default=str)
    verifier = _clip(trajectory.verifier_output or {}, 1500)
    user = "\n\n".join([
        f"## Task\n{snapshot.get('prompt') or trajectory.task.prompt}",
        f"## Agent config\nmodel {trajectory.model or snapshot.get('model') or '-'}, temperature "
        f"{snapshot.get('temperature')}, max_steps {snapshot.get('max_steps')}, hints: "
        f"{_clip(snapshot.get('system_prompt_extra') or '-', 800)}",
        "## Steps\n" + ("\n".join(_step_lines(trajectory.steps if isinstance(trajectory.steps, list) else []))
                        or "(no steps)"),
        f"## Final answer\n{_clip(trajectory.final_answer or '(empty)', 2000)}",
        f"## Verifier output\n{verifier}",
        f"## Evidence\n{EVIDENCE_OPEN}{facts}{EVIDENCE_CLOSE}",
    ])
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _json_object(text: str) -> Any:
    text = (text or "").strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    elif not text.startswith("{"):
        start, end = text.find("{"), text.rfind("}")
        if start == -1 or end <= start:
            raise ValueError("no JSON object in the reply")
        text = text[start:end + 1]
    return json.loads(text)


def parse_judge_output(text: str, rubric: dict[str, str]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], str]:
    """(scores, suggestions, summary) from the judge's reply; ValueError when it is unusable."""
    try:
        data = _json_object(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the reply is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict) or not isinstance(data.get("scores"), dict):
        raise ValueError("the reply has no `scores` object")
    scores = {}
    for name in rubric:
        entry = data["scores"].get(name)
        if isinstance(entry, (int, float)) and not isinstance(entry, bool):
            entry = {"score": entry, "rationale": ""}
        if not isinstance(entry, dict):
            raise ValueError(f"the reply scores no `{name}`")
        score = entry.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 100:
            raise ValueError(f"`{name}` must have a score from 0 to 100, got {score!r}")
        scores[name] = {"score": float(score), "rationale": str(entry.get("rationale") or "")[:2000]}
    suggestions = [s for s in data.get("suggestions") or [] if isinstance(s, dict) and isinstance(s.get("field"), str)]
    return scores, suggestions[:10], str(data.get("summary") or "")[:4000]


def judge(trajectory: Any, checks: dict[str, Any], *, attempt: int = 1, llm: Any = None) -> JudgeResult:
    """Ask the configured judge model; raises JudgeFailed instead of ever inventing a score."""
    scene = (trajectory.config_snapshot or {}).get("scene") or trajectory.task.scene
    rubric = rubric_for(scene)
    messages = judge_messages(trajectory, checks)
    prompt = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
    try:
        client = llm or get_llm_client()
        with llm_route(JUDGE_ROUTE):
            result = client.chat(
                messages,
                temperature=0.0,
                max_tokens=settings.REVIEW_JUDGE_MAX_TOKENS,
                model=settings.REVIEW_JUDGE_MODEL or None,
                cache_key_extra={"judge": str(trajectory.uuid), "rubric": rubric_id(scene), "attempt": attempt},
            )
    except LLMError as exc:
        raise JudgeFailed(f"the judge could not be reached: {type(exc).__name__}: {exc}", prompt=prompt) from None
    except Exception as exc:  # e.g. a configuration error: still no score, and a readable reason
        raise JudgeFailed(f"the judge could not be asked: {type(exc).__name__}: {exc}", prompt=prompt) from None
    raw = result.content or ""
    try:
        scores, suggestions, summary = parse_judge_output(raw, rubric)
    except ValueError as exc:
        raise JudgeFailed(f"the judge's output could not be used: {exc}", raw=raw, model=result.model,
                          prompt=prompt, cost_usd=result.cost_usd) from None
    return JudgeResult(scores=scores, suggestions=suggestions, summary=summary, model=result.model, prompt=prompt,
                       raw=raw, rubric_version=rubric_id(scene), usage=dict(result.usage), cost_usd=result.cost_usd)


# -- proposals -------------------------------------------------------------------------------------

HINTS = {
    "unparseable_calls": "Send tool arguments as one valid JSON object.",
    "invalid_arguments": "Check each tool's parameters: pass every required argument with the right type.",
    "unknown_tools": "Call only the tools that are offered.",
    "unhandled_errors": "When a command fails, read the error and fix its cause before finishing.",
    "repeated_actions": "Do not repeat an action that already gave the same result; change the approach.",
    "empty_final_answer": "End with finish and state the result in the answer.",
}
# For an agent that ran out of steps repeating one call (limit_exhausted.stuck_on).
LOOP_HINT = ("You ran out of steps repeating the same call. When a call gives the same result twice, do not make "
             "it again: change its arguments, use another tool, or finish with what you have.")
# Fields whose raise gives a stuck agent more budget: never drafted upwards for one.
LIMIT_FIELDS = ("max_steps", "timeout_s", "max_tokens")
RULE_HINT_MIN = 2  # occurrences across the iteration before a hint is proposed


@dataclass(frozen=True)
class Rejected:
    """A value people rejected for one of a task's fields: never proposed for that task again."""

    field: str
    value: Any
    proposal: int
    by: str

    def note(self) -> str:
        return f"{self.field} = {self.value!r} was rejected (proposal #{self.proposal} by {self.by})"


@dataclass
class Draft:
    field: str
    to_value: Any
    from_value: Any
    tier: str
    options: list[Any]
    rationale: str
    proposer: str
    impact_note: str = ""
    rejected: Rejected | None = None  # set: the change the review found, but people rejected it before


def _rejection(rejected: tuple[Rejected, ...], field_name: str, value: Any) -> Rejected | None:
    return next((r for r in rejected if r.field == field_name and r.value == value), None)


def _bounded(rule: policy.Rule | None, value: float) -> float:
    if rule is not None and rule.max_value is not None:
        return min(value, rule.max_value)
    return value


def _alternatives(task: Any, field_name: str, current: Any, to: Any, table: dict[str, policy.Rule]) -> list[Any]:
    rule = table.get(field_name)
    if isinstance(to, (int, float)) and not isinstance(to, bool) and isinstance(current, (int, float)):
        middle = (current + to) / 2
        return [int(round(middle)) if isinstance(to, int) and isinstance(current, int) else round(middle, 2)]
    if field_name == "model" and rule is not None:
        return [m for m in rule.allowed_values if m != current]
    if field_name == "expected_tools" and isinstance(current, list) and isinstance(to, list):
        return [sorted(set(current) | set(to))]
    return []


def _options(task: Any, draft_field: str, current: Any, to: Any, extra: list[Any], table: dict[str, policy.Rule],
             tier: str) -> list[Any]:
    """2-4 distinct valid values (the proposed one first) a reviewer can pick from, each one the
    policy allows at the draft's tier."""
    options: list[Any] = []
    for value in [to, *extra, *_alternatives(task, draft_field, current, to, table)]:
        if value == current or value in options:
            continue
        try:
            policy.check_value(task, draft_field, value)
            policy.require_allowed(draft_field, value, tier=tier, table=table)
        except ValidationError:
            continue
        options.append(value)
        if len(options) == 4:
            break
    return options


def _draft(task: Any, field_name: str, to: Any, rationale: str, proposer: str, table: dict[str, policy.Rule],
           extra_options: list[Any] | None = None, rejected: tuple[Rejected, ...] = ()) -> Draft | None:
    """The draft of changing `field_name` to `to`, None when the field or the policy refuses it.

    When people rejected `to` for this task, the next of `extra_options` they did not reject
    is drafted instead; when none is left, the draft comes back marked `rejected`."""
    try:
        current = policy.current_value(task, field_name)
        policy.check_value(task, field_name, to)
    except ValidationError:
        return None
    if to == current:
        return None
    tier = policy.classify(field_name, to, table)
    if tier == policy.REFUSE:
        return None
    hit = _rejection(rejected, field_name, to)
    if hit is not None:
        rest = [v for v in extra_options or [] if v != to]
        for index, value in enumerate(rest):
            if _rejection(rejected, field_name, value) is None:
                other = _draft(task, field_name, value, f"{rationale} ({hit.note()})", proposer, table,
                               rest[index + 1:], rejected)
                if other is not None:
                    return other
    options = _options(task, field_name, current, to, extra_options or [], table, tier) if tier == policy.YELLOW else []
    options = [v for v in options if v == to or _rejection(rejected, field_name, v) is None]
    return Draft(field=field_name, to_value=to, from_value=current, tier=tier, options=options, rationale=rationale,
                 proposer=proposer, impact_note=policy.impact_note(field_name, table), rejected=hit)


def _raises(task: Any, field_name: str, to: Any) -> bool:
    current = getattr(task, field_name, None)
    if isinstance(to, bool) or not isinstance(to, (int, float)):
        return False
    return current is None or to > current


def draft_proposals(task: Any, reviews: list[Any], *, rejected: tuple[Rejected, ...] = ()) -> list[Draft]:
    """Changes for the task's next iteration from its reviews' checks (rules) and judge suggestions.

    At most one draft per field: rules first, then the judge's suggestions in order. A change
    people rejected for the task (`rejected`) is not proposed again: its draft is returned with
    `rejected` set, after the others, and a later draft for the same field may take its place."""
    table = policy.rules()
    drafts: dict[str, Draft] = {}
    refused: dict[str, Draft] = {}

    def add(draft: Draft | None) -> None:
        if draft is None or draft.field in drafts:
            return
        if draft.rejected is None:
            drafts[draft.field] = draft
            refused.pop(draft.field, None)
        else:
            refused.setdefault(draft.field, draft)

    stuck = [r.checks["limit_exhausted"]["stuck_on"] for r in reviews
             if (r.checks.get("limit_exhausted") or {}).get("stuck_on")]
    limits = set() if stuck else {r.checks.get("limit_exhausted", {}).get("limit") for r in reviews} - {None, ""}
    if "max_steps" in limits:
        to = int(_bounded(table.get("max_steps"), task.max_steps * 2))
        if to <= task.max_steps:
            to = task.max_steps * 2  # at the bound: propose beyond it, the policy escalates the tier
        add(_draft(task, "max_steps", to, f"the step limit ({task.max_steps}) was hit without finish",
                   "rule:max_steps", table, [task.max_steps + 5], rejected))
    if "timeout" in limits:
        add(_draft(task, "timeout_s", float(task.timeout_s * 2), f"the wall-clock limit ({task.timeout_s:g}s) was hit",
                   "rule:timeout", table, rejected=rejected))
    if "token_budget" in limits and task.max_tokens:
        add(_draft(task, "max_tokens", int(task.max_tokens * 2), f"the token budget ({task.max_tokens}) was exhausted",
                   "rule:token_budget", table, rejected=rejected))

    counts: dict[str, int] = {}
    for review in reviews:
        for name in HINTS:
            counts[name] = counts.get(name, 0) + int((review.checks.get(name) or {}).get("count") or 0)
    current_extra = task.system_prompt_extra or ""
    hints = [HINTS[name] for name, n in counts.items()
             if n >= (1 if name in ("repeated_actions", "empty_final_answer") else RULE_HINT_MIN)
             and HINTS[name] not in current_extra]
    if stuck:  # the loop hint says more than the generic one
        hints = [h for h in hints if h != HINTS["repeated_actions"]]
    fired = sorted(name for name, n in counts.items() if n and HINTS[name] in hints)
    loop_hinted = bool(stuck) and LOOP_HINT in current_extra
    if stuck and not loop_hinted:
        hints.append(LOOP_HINT)
        fired.insert(0, f"stuck at the limit repeating {stuck[0]}")
    if hints:
        to = "\n".join(filter(None, [current_extra.rstrip(), *hints]))
        add(_draft(task, "system_prompt_extra", to, f"repeated problems across the iteration: {', '.join(fired)}",
                   "rule:prompt_hint", table, rejected=rejected))
    if loop_hinted:
        # The agent loops with the loop hint in its prompt already: another model (a reviewer picks one).
        rule = table.get("model")
        models = [m for m in (rule.allowed_values if rule else ()) if m != task.model]
        if models:
            add(_draft(task, "model", models[0], f"stuck at the limit repeating {stuck[0]} with the loop hint "
                       "already in the prompt", "rule:stuck", table, models[1:], rejected))

    for review in reviews:
        for suggestion in (review.suggestions or []):
            name = suggestion.get("field")
            if name == "system_prompt_extra" and isinstance(suggestion.get("to"), str) and name not in drafts:
                hint = suggestion["to"].strip()
                to = current_extra if hint in current_extra else "\n".join(filter(None, [current_extra.rstrip(), hint]))
            else:
                to = suggestion.get("to")
            extra = suggestion.get("options") if isinstance(suggestion.get("options"), list) else []
            if stuck and name in LIMIT_FIELDS and _raises(task, str(name), to):
                continue  # more budget for a stuck agent
            add(_draft(task, str(name), to, str(suggestion.get("rationale") or "suggested by the judge")[:2000],
                       "review-agent", table, extra, rejected))
    return [*drafts.values(), *refused.values()]
