"""The toolace verifier's hard rules, computed in code on a recorded trajectory (steps + messages).

    report = check_rules(config, steps, messages)     # {"rules": {name: {passed, detail}}, "failed": [...]}

* `schema_valid`: no call broke its tool's JSON schema or had unparseable arguments (the loop's
  `error_kind` on the step).
* `known_tools`: no call named a tool the episode did not offer.
* `hidden_params`: each hidden parameter's value (the task's `missing_params`, valued in
  `user_facts`) is used in a call only in a later assistant turn than an `ask_user` step whose
  answer contained it: a call made in the same turn as the ask_user (parallel calls of one reply)
  was written before the answer came back, so the value was guessed, not obtained.
* `grounding` (ToolACE's hallucination check done in code): every string / number argument value
  appears in the prompt, a user turn, an earlier tool output (the simulated user's answers
  included), or the tool's own schema (an enum member or default). Case-insensitive; numbers
  compare by value. Free text the agent composes (a string of FREE_TEXT_WORDS words or more, e.g.
  a message body) is grounded by its values: each token in it with a digit or an "@" (ids,
  dates, amounts, addresses) must appear in that context; its wording need not.
* `expected_calls`: every expected call was made successfully (same tool, the expected arguments
  among the call's) — coverage 1.0 — and in the expected order, except for `parallel` tasks.

The reward is the check function's result when every rule holds, else 0.0 with the first failed
rule named (runtime.py).
"""
from __future__ import annotations

import json
import re
from typing import Any

from apps.engines.ask_user import ASK_USER, parse_facts

RULES = ("schema_valid", "known_tools", "hidden_params", "grounding", "expected_calls")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_VALUE_TOKEN = re.compile(r"[\w.@:/+-]*[\d@][\w.@:/+-]*")
FREE_TEXT_WORDS = 4
NOT_CALLS = (ASK_USER, "finish")


def _scalars(value: Any) -> list[Any]:
    """The leaf strings and numbers of an argument value (booleans and None are not values to ground)."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float, str)):
        return [value]
    return []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class Context:
    """What the agent has seen so far: texts, and the numbers in them."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.numbers: set[float] = set()

    def add(self, text: str) -> None:
        if text:
            self.texts.append(text.lower())
            self.numbers.update(float(n) for n in _NUMBER.findall(text))

    def has(self, value: Any) -> bool:
        if isinstance(value, (int, float)):
            return float(value) in self.numbers
        needle = str(value).strip().lower()
        return not needle or any(needle in text for text in self.texts)


def _schema_values(tool: dict[str, Any] | None) -> list[Any]:
    values: list[Any] = []

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            values.extend(schema.get("enum") or [])
            if "default" in schema:
                values.extend(_scalars(schema["default"]))
            for v in schema.values():
                walk(v)
        elif isinstance(schema, list):
            for v in schema:
                walk(v)

    walk((tool or {}).get("parameters") or {})
    return values


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    return a == b


def call_matches(expected: dict[str, Any], step: dict[str, Any]) -> bool:
    """The step made the expected call: same tool, each expected argument given with that value."""
    args = step.get("arguments") if isinstance(step.get("arguments"), dict) else {}
    return step.get("tool") == expected.get("tool") and all(
        k in args and _same(args[k], v) for k, v in (expected.get("arguments") or {}).items())


def succeeded(step: dict[str, Any]) -> bool:
    return not step.get("error") and not step.get("env_error") and not step.get("timed_out")


def _uses(args: Any, value: Any) -> bool:
    text = _text(value).strip().lower()
    return bool(text) and any(_same(s, value) or (isinstance(s, str) and text in s.lower()) for s in _scalars(args))


def check_rules(config: dict[str, Any], steps: list[dict[str, Any]], messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every rule's verdict on a trajectory of the task `config` (Task.config_snapshot() shape)."""
    scene = config.get("scene_config") or {}
    facts = {f.name: f for f in parse_facts(scene.get("user_facts") or {})}
    hidden = [facts[n] for n in scene.get("missing_params") or [] if n in facts]
    specs = {t["function"]["name"]: t["function"] for t in tools or [] if isinstance(t, dict) and "function" in t}
    calls = [s for s in steps if s.get("tool") not in NOT_CALLS]
    rules: dict[str, dict[str, Any]] = {}

    bad = [f"step {s['index']} ({s.get('tool')}): {s.get('error')}" for s in steps
           if s.get("error_kind") in ("invalid_arguments", "unparseable_arguments")]
    rules["schema_valid"] = {"passed": not bad, "detail": "; ".join(bad)}
    unknown = [f"step {s['index']}: {s.get('tool')!r}" for s in steps if s.get("error_kind") == "unknown_tool"]
    rules["known_tools"] = {"passed": not unknown, "detail": "; ".join(unknown)}

    # hidden parameters: revealed by an ask_user answer in an earlier turn than the first use
    revealed: dict[str, int] = {}  # fact name -> the turn whose ask_user answer gave it first
    early: list[str] = []
    for step in steps:
        turn = int(step.get("turn") or 0)
        if step.get("tool") == ASK_USER and succeeded(step):
            output = str(step.get("output") or "").lower()
            for f in hidden:
                if f.name in (step.get("revealed_facts") or []) or f.text.lower() in output:
                    revealed.setdefault(f.name, turn)
        elif step.get("tool") not in NOT_CALLS:
            for f in hidden:
                if _uses(step.get("arguments"), f.value) and not revealed.get(f.name, turn) < turn:
                    when = ("in the same turn as the ask_user that asked for it" if f.name in revealed
                            else "before the user gave it")
                    early.append(f"step {step['index']} ({step.get('tool')}) uses {f.name}={f.text!r} {when}")
    rules["hidden_params"] = {"passed": not early, "detail": "; ".join(early)}

    # grounding: walk the conversation; the n-th assistant message made the steps of turn n
    context = Context()
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for step in steps:
        by_turn.setdefault(int(step.get("turn") or 0), []).append(step)
    ungrounded: list[str] = []
    turn = 0
    for message in messages:
        role = message.get("role")
        if role == "user" or role == "tool":
            context.add(str(message.get("content") or ""))
        elif role == "assistant":
            turn += 1
            for step in by_turn.get(turn, []):
                if step.get("tool") in NOT_CALLS or step.get("error_kind"):
                    continue
                allowed = _schema_values(specs.get(step.get("tool")))
                for value in _scalars(step.get("arguments")):
                    if context.has(value) or any(_same(value, a) for a in allowed):
                        continue
                    if isinstance(value, str) and len(value.split()) >= FREE_TEXT_WORDS:
                        missing = [t.strip(".:,;") for t in _VALUE_TOKEN.findall(value)
                                   if not context.has(t.strip(".:,;"))]
                        if not missing:
                            continue
                        value = ", ".join(missing)
                    ungrounded.append(f"step {step['index']} ({step.get('tool')}): {value!r} appears nowhere "
                                      "in the prompt, the user's turns or earlier tool outputs")
    rules["grounding"] = {"passed": not ungrounded, "detail": "; ".join(ungrounded)}

    expected = scene.get("expected_calls") or []
    done = [s for s in calls if succeeded(s)]
    used: list[int] = []
    missing = []
    for i, exp in enumerate(expected):
        match = next((j for j, s in enumerate(done) if j not in used and call_matches(exp, s)), None)
        if match is None:
            missing.append(f"expected call {i} {exp.get('tool')}({json.dumps(exp.get('arguments') or {})}) not made")
        else:
            used.append(match)
    coverage = (len(expected) - len(missing)) / len(expected) if expected else 1.0
    in_order = used == sorted(used) or scene.get("task_type") == "parallel"
    detail = "; ".join(missing) or ("" if in_order else "the expected calls were made out of order")
    rules["expected_calls"] = {"passed": not missing and in_order, "detail": detail, "coverage": coverage,
                               "order_correct": in_order}
    failed = [name for name in RULES if not rules[name]["passed"]]
    return {"rules": rules, "failed": failed}
