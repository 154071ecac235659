"""The toucan scene's verifier, in code: task checks, Toucan's tool-call accuracy and rule filter.

    accuracy = tool_call_accuracy(["time__convert_time", "git__git_log"], called_tools(steps))
    rules = rule_filter(steps, final_answer)
    reward, output = verify_episode(scene_config, steps, final_answer, probe=run_in_sandbox)

Nothing here calls a model. `steps` are the agent loop's step records (apps/engines/agent.py:
`tool`, `arguments`, `output`, `error`, `error_kind`, `timed_out`, `thought`, plus what the MCP
hub puts on them: `is_error`, `server`, `mcp_tool`, `mcp_calls`), or the runtime's own record
of the calls it executed, which has the same keys.

Tool-call accuracy (Toucan's step 4.3, computed on our `<server>__<tool>` names, so a name
matches exactly rather than as a substring): `desired_tools_used_percentage` is the share of
the target tools called at least once; `order_correctness` says whether the target tools occur
in the calls as an in-order subsequence (trivially true for one target tool, false when there
were fewer calls than target tools). A call the loop refused before it reached a server (an
unknown tool, arguments that are not JSON or break the schema) is not a use.

Rule filter (Toucan's step 3.2): a trajectory fails when it made no tool call, when every tool
response is an error (the server's `isError`, the loop's or hub's error, a timeout, or one of
Toucan's error patterns in the text), when the assistant's text carries an "[Error" marker,
when the final answer is empty, or when the assistant's text has a run of twelve "!".

Task checks (scene_config["check"]):

    {"type": "answer", "expected": "21:00", "match": "exact" | "contains" | "number", "tolerance": 0}
    {"type": "state", "probe": "git -C repo log --format=%s -1", "expect": "add README", "match": "exact"}

An answer check compares the final answer; a state check runs `probe` in the episode's sandbox
(cwd /workspace) and compares its stdout (a probe that exits non-zero fails the check).
Comparisons ignore case, surrounding space and runs of whitespace; `number` looks for a number
in the text equal to `expected` within `tolerance`.

Process conditions (verifier_output["process"], the shape in docs/reviews.md: each
{"ok", "detail"} plus "relaxed" when the task relaxed it), evaluated on every episode:

    rule_filter     the rule filter passed
    target_tools    every target tool was called at least once with a response that is not an error
                    (response_is_error: the same test as the rule filter's)
    tool_order      the target tools' successful calls contain the targets as an in-order
                    subsequence; only with more than one target tool and scene_config.order
                    "strict" (the default; "any" drops the condition)

Reward with a check: 1.0 when the check passed AND every condition holds, else 0.0. Without a
check it is a PROXY: the share of target tools called successfully, times 0 when the rule filter
fails or the order is wrong (Toucan drops such trajectories). scene_config.relax (a list of
"rule_filter", "target_tools", "tool_order") names conditions that do not gate this task's reward;
they are still reported (with relaxed: true), and the review agent still fails on them.
`decided_by` names what set the reward: the first failed gating condition in the order check,
rule_filter, target_tools, tool_order, else "check" or "tool_accuracy_proxy". With neither a
check nor target tools there is no verifier (None).
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

from apps.engines.toolargs import REFUSED_KINDS  # loop error kinds of a call that never reached a server

FINISH = "finish"
# Toucan's error patterns for tool responses (step 3.2), matched case-insensitively.
ERROR_PATTERNS = [
    r"error", r"an error occurred", r"exception", r"failed", r"not found", r"unavailable", r"invalid",
    r"timed out", r"could not", r"does not exist", r"unsuccessful", r"no .* found", r"too many requests",
    r"no device selected", r"no active sessions", r"missing required credentials", r"unauthorized",
    r"not authorized", r"not authenticated", r"\[Error", r"\[ERROR", r"\[error]", r"未找到", r"失败",
]
_TOOL_ERROR = re.compile("|".join(f"(?:{p})" for p in ERROR_PATTERNS), re.IGNORECASE)
_ASSISTANT_ERROR = re.compile(r"\[Error", re.IGNORECASE)
EXCLAMATION_RUN = "!" * 12
MATCH_MODES = ("exact", "contains", "number")
CHECK_TYPES = ("answer", "state")
ORDERS = ("strict", "any")
CONDITIONS = ("rule_filter", "target_tools", "tool_order")  # also the order in which they decide
PROBE_TIMEOUT_S = 30.0
PROBE_OUTPUT_CHARS = 4000
_WS = re.compile(r"\s+")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")

# A probe runner: shell command -> (exit code or None, stdout, stderr).
ProbeRunner = Callable[[str], tuple[int | None, str, str]]


class CheckError(ValueError):
    """A task check that cannot be evaluated as written (the message names the field)."""


# -- what was called ----------------------------------------------------------------------

def executed(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls that reached a tool (finish and calls the loop refused left out)."""
    return [s for s in steps or [] if s.get("tool") and s.get("tool") != FINISH
            and s.get("error_kind") not in REFUSED_KINDS and not str(s.get("error") or "").startswith("skipped:")]


def called_tools(steps: list[dict[str, Any]]) -> list[str]:
    return [s["tool"] for s in executed(steps)]


def in_order(targets: list[str], called: list[str]) -> bool:
    """Whether `targets` occur in `called` as an in-order subsequence."""
    position = 0
    for name in called:
        if position < len(targets) and name == targets[position]:
            position += 1
    return position == len(targets)


def tool_call_accuracy(target_tools: list[str], called: list[str]) -> dict[str, Any]:
    """Toucan's tool-call accuracy over exact `<server>__<tool>` names (see the module doc)."""
    targets = list(target_tools or [])
    used = [t for t in targets if t in called]
    share = len(used) / len(targets) if targets else 1.0
    ordered = len(targets) <= 1 or in_order(targets, called)
    return {"desired_tools_used_percentage": share, "order_correctness": ordered, "target_tools": targets,
            "called_tools": list(called), "missing_tools": [t for t in targets if t not in called]}


# -- the rule filter ----------------------------------------------------------------------

def response_is_error(step: dict[str, Any]) -> bool:
    """Whether one executed call's response counts as an error for the rule filter."""
    if step.get("is_error") or step.get("error") or step.get("timed_out"):
        return True
    if any(record.get("is_error") for record in step.get("mcp_calls") or [] if record.get("method") == "tools/call"):
        return True
    return bool(_TOOL_ERROR.search(str(step.get("output") or "")))


def rule_filter(steps: list[dict[str, Any]], final_answer: str) -> dict[str, Any]:
    """Toucan's rule filter: {"passed", "failed": [rule ids], counts}. See the module doc."""
    calls = executed(steps)
    errors = [s for s in calls if response_is_error(s)]
    texts = [str(s.get("thought") or "") for s in steps or []] + [final_answer or ""]
    failed = []
    if not calls:
        failed.append("no_tool_calls")
    elif len(errors) == len(calls):
        failed.append("no_successful_tool_response")
    if any(_ASSISTANT_ERROR.search(t) for t in texts):
        failed.append("error_in_assistant_text")
    if not (final_answer or "").strip():
        failed.append("empty_final_answer")
    if any(EXCLAMATION_RUN in t for t in texts):
        failed.append("exclamation_run_in_assistant_text")
    return {"passed": not failed, "failed": failed, "tool_responses": len(calls), "error_responses": len(errors),
            "error_steps": [s.get("index") for s in errors if s.get("index") is not None]}


# -- task checks --------------------------------------------------------------------------

def normalize(text: Any) -> str:
    return _WS.sub(" ", str(text if text is not None else "")).strip().casefold()


def numbers_in(text: str) -> list[float]:
    return [float(m.replace(",", "")) for m in _NUMBER.findall(text or "")]


def matches(value: str, expected: Any, mode: str, tolerance: float = 0.0) -> bool:
    """Whether `value` matches `expected` by `mode` (exact, contains, number)."""
    if mode == "exact":
        return normalize(value).rstrip(".") == normalize(expected).rstrip(".")
    if mode == "contains":
        return normalize(expected) in normalize(value)
    if mode == "number":
        target = float(expected)
        return any(math.isclose(n, target, rel_tol=0.0, abs_tol=tolerance) for n in numbers_in(value))
    raise CheckError(f"check.match must be one of {', '.join(MATCH_MODES)}, got {mode!r}")


def validate_check(check: Any) -> dict[str, Any]:
    """The check with its defaults, or CheckError naming what is wrong."""
    if not isinstance(check, dict):
        raise CheckError(f"check must be an object, got {type(check).__name__}")
    kind = check.get("type")
    if kind not in CHECK_TYPES:
        raise CheckError(f"check.type must be one of {', '.join(CHECK_TYPES)}, got {kind!r}")
    mode = check.get("match", "exact")
    if mode not in MATCH_MODES:
        raise CheckError(f"check.match must be one of {', '.join(MATCH_MODES)}, got {mode!r}")
    field = "expected" if kind == "answer" else "expect"
    if field not in check or not isinstance(check[field], (str, int, float)) or isinstance(check[field], bool):
        raise CheckError(f"an {kind} check needs check.{field} (a string or a number)")
    if mode == "number":
        try:
            float(check[field])
        except ValueError:
            raise CheckError(f"check.{field} must be a number for match=number, got {check[field]!r}") from None
    tolerance = check.get("tolerance", 0)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise CheckError(f"check.tolerance must be a number >= 0, got {tolerance!r}")
    if kind == "state" and (not isinstance(check.get("probe"), str) or not check["probe"].strip()):
        raise CheckError("a state check needs check.probe, a shell command run in the sandbox")
    return {**check, "match": mode, "tolerance": tolerance}


def run_check(check: dict[str, Any], final_answer: str, probe: ProbeRunner | None) -> dict[str, Any]:
    """Evaluate a task check: {"type", "passed", what was compared}. CheckError on a bad check."""
    check = validate_check(check)
    mode, tolerance = check["match"], float(check["tolerance"])
    if check["type"] == "answer":
        return {"type": "answer", "match": mode, "expected": check["expected"], "answer": (final_answer or "")[:2000],
                "passed": matches(final_answer or "", check["expected"], mode, tolerance)}
    if probe is None:
        raise CheckError("a state check needs the episode's sandbox")
    exit_code, stdout, stderr = probe(check["probe"])
    out = {"type": "state", "match": mode, "probe": check["probe"], "expect": check["expect"], "exit_code": exit_code,
           "stdout": stdout[:PROBE_OUTPUT_CHARS]}
    if exit_code != 0:
        out.update(passed=False, stderr=stderr[:PROBE_OUTPUT_CHARS],
                   note=f"the probe exited with {exit_code}" if exit_code is not None else "the probe timed out")
        return out
    out["passed"] = matches(stdout, check["expect"], mode, tolerance)
    return out


# -- process conditions ---------------------------------------------------------------

def process_options(scene: dict[str, Any]) -> tuple[str, frozenset[str]]:
    """(order, relaxed conditions) of a task's scene_config; CheckError naming a bad value."""
    order = scene.get("order", "strict")
    if order not in ORDERS:
        raise CheckError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    relax = scene.get("relax") or []
    if not isinstance(relax, list) or any(r not in CONDITIONS for r in relax):
        raise CheckError(f"relax must be a list of {', '.join(CONDITIONS)}, got {relax!r}")
    return order, frozenset(relax)


def process_conditions(scene: dict[str, Any], steps: list[dict[str, Any]], rules: dict[str, Any]) -> dict[str, Any]:
    """The episode's process conditions ({name: {"ok", "detail", "relaxed"?}}, see the module doc)."""
    targets = list(scene.get("target_tools") or [])
    order, relaxed = process_options(scene)
    good = [s["tool"] for s in executed(steps) if not response_is_error(s)]
    conditions = {"rule_filter": {"ok": rules["passed"], "detail": "" if rules["passed"] else
                                  f"failed rules: {', '.join(rules['failed'])}"}}
    if targets:
        missing = [t for t in targets if t not in good]
        conditions["target_tools"] = {"ok": not missing, "detail": "" if not missing else
                                      f"no successful call of {', '.join(missing)}"}
    if len(targets) > 1 and order == "strict":
        ok = in_order(targets, good)
        conditions["tool_order"] = {"ok": ok, "detail": "" if ok else
                                    f"successful calls {good} do not contain {targets} in this order"}
    for name in relaxed & conditions.keys():
        conditions[name]["relaxed"] = True
    return conditions


def failed_conditions(conditions: dict[str, Any]) -> list[str]:
    """The conditions that fail and gate the reward (not relaxed), in CONDITIONS order."""
    return [n for n in CONDITIONS if n in conditions and not conditions[n]["ok"] and not conditions[n].get("relaxed")]


# -- the verifier -------------------------------------------------------------------------

def verify_episode(scene: dict[str, Any], steps: list[dict[str, Any]], final_answer: str,
                   probe: ProbeRunner | None = None) -> tuple[float | None, dict[str, Any]]:
    """(reward, verifier_output) for one toucan episode; see the module doc for the reward."""
    targets = list(scene.get("target_tools") or [])
    accuracy = tool_call_accuracy(targets, called_tools(steps))
    rules = rule_filter(steps, final_answer)
    process = process_conditions(scene, steps, rules)
    failed = failed_conditions(process)
    output: dict[str, Any] = {"tool_call_accuracy": accuracy, "rule_filter": rules, "process": process}
    check = scene.get("check")
    if check:
        result = run_check(check, final_answer, probe)
        output.update(method="check", check=result)
        if not result["passed"]:
            reward, output["decided_by"] = 0.0, "check"
            output["note"] = result.get("note") or f"the {result['type']} check did not match"
        elif failed:
            reward, output["decided_by"] = 0.0, failed[0]
            output["note"] = f"the check passed but the process did not: {failed[0]} ({process[failed[0]]['detail']})"
        else:
            reward, output["decided_by"] = 1.0, "check"
    elif targets:
        good = {s["tool"] for s in executed(steps) if not response_is_error(s)}
        share = sum(t in good for t in targets) / len(targets)
        gate = [n for n in failed if n != "target_tools"]
        reward = 0.0 if gate else share
        output.update(method="tool_accuracy_proxy",
                      note_proxy="no task check: the reward is the share of target tools called successfully "
                                 "(a proxy), 0 when the rule filter fails or the order is wrong")
        output["decided_by"] = failed[0] if failed else "tool_accuracy_proxy"
        if failed:
            output["note"] = f"{failed[0]}: {process[failed[0]]['detail']}"
    else:
        output["method"] = "none"
        return None, output
    output.update(passed=1 if reward == 1.0 else 0, total=1, reward=reward)
    return reward, output
