"""The toolace pipeline's gates, platform side: static checks here, execution in a sandbox.

    suite_gate(suite) -> None                # or raises GateError("<gate>: why ...", with tracebacks)
    task_gates(suite, tasks) -> {key: None | "<gate>: why"}

Nothing of the synthesized code runs in the platform's process: the execution part copies
envscaler's server.py and sandbox_gate.py into a fresh sandbox and runs `sandbox_gate.py` there
(one sandbox per call, per suite). Every reason starts with the gate's name, which the benchmark
counts rejections by:

* `suite.static`: envscaler's static checks of an environment (apps/engines/scenes/envscaler/importer.py),
  plus every operation's `example` arguments valid against its schema, declared `errors` named;
* `suite.sandbox`: envscaler's in-sandbox validation (the class by name, every operation's
  signature, the seeded `init_config` constructing);
* `suite.smoke`: every operation called with its example arguments on a fresh instance: no
  exception but the ones it declares;
* `cross.static` / `cross.clash` (a combined suite for cross-group tasks, `combine_suites`): a
  class or operation name in both suites; an attribute both parts keep (they would overwrite
  each other's state);
* `task.static`: expected calls name operations and match their schemas, a hidden parameter is
  a user fact, a missing-parameter task hides one, a non-tool task expects no call, the check
  function parses;
* `task.leak`: a hidden value appears in the prompt;
* `task.replay`: an expected call raises when replayed in a fresh environment;
* `task.check`: the check function does not pass on the replayed state; for a non-tool task,
  it also passes on a state an operation changed (it must assert the state unchanged).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from django.conf import settings
from jsonschema import Draft202012Validator

from apps.engines.ask_user import FactsError, parse_facts
from apps.engines.scenes.envscaler.importer import ItemError, _check_env
from apps.engines.scenes.envscaler.runtime import SANDBOX_DIR, SERVER_PATH, SERVER_SOURCE
from apps.engines.sandboxes import SandboxError, SandboxSpec, get_backend
from trajplatform.pyparse import parse_python

GATE_SOURCE = Path(__file__).with_name("sandbox_gate.py")
GATE_PATH = f"{SANDBOX_DIR}/sandbox_gate.py"
SPEC_PATH = f"{SANDBOX_DIR}/gate.json"
REPORT_PATH = f"{SANDBOX_DIR}/gate-report.json"
TASK_TYPES = ("single", "parallel", "dependent", "missing_param", "non_tool")


class GateError(Exception):
    """An item failed a gate; the message starts with the gate's name."""


def operations_for_server(suite: dict[str, Any]) -> list[dict[str, Any]]:
    """The suite's operations as envscaler declares them (name, description, parameters)."""
    return [{"name": op["name"], "description": op.get("description") or "",
             "parameters": op.get("parameters") or {"type": "object", "properties": {}}}
            for op in suite.get("operations") or []]


def declared_errors(suite: dict[str, Any]) -> dict[str, list[str]]:
    return {op["name"]: [e["type"] for e in op.get("errors") or [] if isinstance(e, dict) and e.get("type")]
            for op in suite.get("operations") or []}


def suite_static(suite: dict[str, Any]) -> list[str]:
    errors: list[ItemError] = []
    raw = {"env_name": suite.get("env_name"), "class_name": suite.get("class_name") or suite.get("env_name"),
           "description": suite.get("description") or "", "code": suite.get("code"),
           "operations": operations_for_server(suite)}
    _check_env(0, raw, errors)
    problems = [f"{e.field}: {e.message}" if e.field else e.message for e in errors]
    for op in suite.get("operations") or []:
        example = op.get("example")
        if not isinstance(example, dict):
            problems.append(f"operations.{op.get('name')}: needs example arguments (an object) for the smoke call")
            continue
        try:
            problem = next(iter(Draft202012Validator(op.get("parameters") or {}).iter_errors(example)), None)
        except Exception as exc:  # noqa: BLE001 - a broken schema is reported by the static checks above
            problem = exc
        if problem is not None:
            problems.append(f"operations.{op.get('name')}: the example arguments break the schema: "
                            f"{getattr(problem, 'message', problem)}")
        if not [e for e in op.get("errors") or [] if isinstance(e, dict) and e.get("type")]:
            problems.append(f"operations.{op.get('name')}: declares no error cases ({{type, when}})")
    if not isinstance(suite.get("init_config", {}), dict):
        problems.append("init_config: must be an object")
    return problems


def run_gate(spec: dict[str, Any]) -> dict[str, Any]:
    """Run sandbox_gate.py on `spec` in a fresh sandbox; its report. GateError if the run itself fails."""
    timeout = settings.ENVSCALER_VALIDATE_TIMEOUT_S
    box = SandboxSpec(image=settings.ENVSCALER_SANDBOX_IMAGE, labels={"scene": "toolace", "purpose": "gate"},
                      ttl=timeout + 600)
    try:
        with get_backend().create(box) as sandbox:
            sandbox.write_file(SERVER_PATH, SERVER_SOURCE.read_bytes())
            sandbox.write_file(GATE_PATH, GATE_SOURCE.read_bytes())
            sandbox.write_file(SPEC_PATH, json.dumps(spec).encode("utf-8"))
            result = sandbox.run(["python3", GATE_PATH, SPEC_PATH, REPORT_PATH], timeout=timeout,
                                 max_output_bytes=64 * 1024)
            if result.timed_out or result.exit_code != 0:
                why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
                tail = (result.stderr or result.stdout).strip()[-3000:]
                raise GateError(f"suite.sandbox: running the suite in the sandbox {why}" + (f":\n{tail}" if tail else ""))
            return json.loads(sandbox.read_file(REPORT_PATH, max_bytes=8 << 20))
    except (ValueError, UnicodeDecodeError) as exc:
        raise GateError(f"suite.sandbox: the gate's report is unreadable: {exc}") from None


def _base_spec(suite: dict[str, Any]) -> dict[str, Any]:
    return {"class_name": suite.get("class_name") or suite.get("env_name"), "code": suite["code"],
            "operations": operations_for_server(suite), "init_config": suite.get("init_config") or {},
            "declared_errors": declared_errors(suite)}


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def combine_suites(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One suite over two admitted ones, for cross-group tasks: both classes' code and a class
    inheriting from both (each part's seeded state under its snake_case name in init_config),
    both operation lists, one usage flow chaining a flow of each. GateError("cross.static: ...")
    when the two cannot share one environment (a class or an operation name in both)."""
    names = [s.get("class_name") or s["env_name"] for s in (first, second)]
    clash = sorted({op["name"] for op in first["operations"]} & {op["name"] for op in second["operations"]})
    if names[0] == names[1] or clash:
        raise GateError(f"cross.static: {names[0]} and {names[1]} cannot share one environment"
                        + (f" (operations in both: {', '.join(clash)})" if clash else " (same class name)"))
    combined = names[0] + names[1]
    parts = [_snake(n) for n in names]
    code = (f"{first['code'].rstrip()}\n\n\n{second['code'].rstrip()}\n\n\n"
            f"class {combined}({names[0]}, {names[1]}):\n"
            f"    def __init__(self, {parts[0]}=None, {parts[1]}=None):\n"
            f"        {names[0]}.__init__(self, **({parts[0]} or {{}}))\n"
            f"        {names[1]}.__init__(self, **({parts[1]} or {{}}))\n")
    steps = [step for suite in (first, second) for step in (suite["flows"][0]["steps"] if suite["flows"] else [])]
    return {"env_name": combined, "class_name": combined,
            "description": f"{first.get('description', '')} Together with: {second.get('description', '')}".strip(),
            "operations": [*first["operations"], *second["operations"]], "code": code,
            "init_config": {parts[0]: first.get("init_config") or {}, parts[1]: second.get("init_config") or {}},
            "tool_chains": [*first.get("tool_chains", []), *second.get("tool_chains", [])],
            "parts": [{"class_name": n, "init_config": s.get("init_config") or {}} for n, s in zip(names, (first, second))],
            "flows": [{"id": "cross", "name": f"{names[0]} with {names[1]}",
                       "description": "a request that needs the tools of both", "steps": steps}]}


def suite_gate(suite: dict[str, Any]) -> dict[str, Any]:
    """The suite's gate report when every operation passes; GateError naming the gate otherwise.
    SandboxError (no sandbox) propagates: the platform's failure, not the suite's. A combined
    suite (combine_suites) must also keep its parts' attributes apart (`cross.clash`)."""
    problems = suite_static(suite)
    if problems:
        raise GateError("suite.static: " + "; ".join(problems))
    spec = {**_base_spec(suite), "smoke": [{"operation": op["name"], "arguments": op["example"]}
                                           for op in suite["operations"]]}
    if suite.get("parts"):
        spec["parts"] = suite["parts"]
    report = run_gate(spec)
    if report["validate"]:
        raise GateError("suite.sandbox: " + "; ".join(f"{e['field']}: {e['message']}" for e in report["validate"]))
    attributes = list((report.get("part_attributes") or {}).values())
    shared = sorted(set(attributes[0]) & set(attributes[1])) if len(attributes) == 2 else []
    if shared:
        raise GateError(f"cross.clash: both parts keep the attribute(s) {', '.join(shared)}")
    broken = [s for s in report["smoke"] if not s["ok"] and not s["declared"]]
    if broken:
        raise GateError("suite.smoke: " + "\n".join(
            f"{s['operation']}({json.dumps(next(o['example'] for o in suite['operations'] if o['name'] == s['operation']))}) "
            f"raised an undeclared {s['error']}\n{s.get('traceback', '')}" for s in broken))
    return {"smoke": report["smoke"]}


def _hidden(task: dict[str, Any]) -> list[tuple[str, str]]:
    facts = {f.name: f for f in parse_facts(task.get("user_facts") or {})}
    return [(name, facts[name].text) for name in task.get("missing_params") or [] if name in facts]


def task_static(suite: dict[str, Any], task: dict[str, Any]) -> str | None:
    """Why the task fails a static gate ("task.static: ..." / "task.leak: ..."), or None."""
    ops = {op["name"]: op for op in suite.get("operations") or []}
    problems = []
    kind = task.get("type")
    if kind not in TASK_TYPES:
        problems.append(f"type {kind!r} is not one of {', '.join(TASK_TYPES)}")
    calls = task.get("expected_calls") or []
    for i, call in enumerate(calls):
        op = ops.get(call.get("tool"))
        if op is None:
            problems.append(f"expected_calls[{i}]: {call.get('tool')!r} is not an operation of the suite")
            continue
        problem = next(iter(Draft202012Validator(op.get("parameters") or {}).iter_errors(call.get("arguments") or {})),
                       None)
        if problem is not None:
            problems.append(f"expected_calls[{i}] ({op['name']}): {problem.message}")
    try:
        facts = {f.name for f in parse_facts(task.get("user_facts") or {})}
    except FactsError as exc:
        problems.append(str(exc))
        facts = set()
    hidden = task.get("missing_params") or []
    problems += [f"missing_params: {name!r} is not among user_facts" for name in hidden if name not in facts]
    if kind == "missing_param" and not hidden:
        problems.append("a missing_param task must hide at least one parameter (missing_params)")
    if kind == "non_tool" and calls:
        problems.append("a non_tool task expects no call")
    if kind in ("single", "parallel", "dependent", "missing_param") and not calls:
        problems.append(f"a {kind} task expects at least one call")
    if kind == "parallel" and len(calls) < 2:
        problems.append("a parallel task expects at least two calls")
    try:
        tree = parse_python(task.get("check_func") or "")
        if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
            problems.append("check_func defines no top-level function check(env)")
    except SyntaxError as exc:
        problems.append(f"check_func: syntax error at line {exc.lineno}: {exc.msg}")
    if problems:
        return "task.static: " + "; ".join(problems)
    prompt = (task.get("prompt") or "").lower()
    leaked = [f"{name}={value!r}" for name, value in _hidden(task) if value.strip() and value.lower() in prompt]
    if leaked:
        return "task.leak: the prompt contains hidden value(s) " + ", ".join(leaked)
    return None


def task_gates(suite: dict[str, Any], tasks: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """{key: None (admitted) | why not} for tasks of one suite; the replay runs in one sandbox."""
    verdicts: dict[str, str | None] = {key: task_static(suite, task) for key, task in tasks.items()}
    replay = [key for key, why in verdicts.items() if why is None]
    if not replay:
        return verdicts
    spec = {**_base_spec(suite), "tasks": [
        {"key": key, "init_config": tasks[key].get("init_config") or suite.get("init_config") or {},
         "calls": tasks[key].get("expected_calls") or [], "check_func": tasks[key]["check_func"],
         "probe": tasks[key].get("type") == "non_tool"} for key in replay],
        "probes": [{"operation": op["name"], "arguments": op.get("example") or {}} for op in suite["operations"]]}
    report = run_gate(spec)
    if report["validate"]:
        by_key = {}
        for e in report["validate"]:
            by_key.setdefault(e["key"], []).append(f"{e['field']}: {e['message']}")
        for key in replay:
            if key in by_key:
                verdicts[key] = "task.static: " + "; ".join(by_key[key])
        if "suite" in by_key:
            return {key: verdicts[key] or "task.replay: the suite no longer validates" for key in verdicts}
        return verdicts
    for entry in report["tasks"]:
        key = entry["key"]
        failed = [(i, c) for i, c in enumerate(entry["calls"]) if not c["ok"]]
        check = entry.get("check") or {}
        if failed:
            i, call = failed[0]
            verdicts[key] = f"task.replay: expected call {i} ({call['tool']}) raised {call['error']}"
        elif tasks[key].get("type") == "non_tool" and entry["state_after"] != entry["state_before"]:
            verdicts[key] = "task.check: a non-tool task changed the state"
        elif blind := [p["operation"] for p in entry.get("probes") or [] if p["reward"] == 1.0]:
            verdicts[key] = (f"task.check: a non-tool task's check passes on a changed state (after "
                             f"{', '.join(blind)}): it must assert the state unchanged")
        elif check.get("reward") != 1.0:
            verdicts[key] = (f"task.check: the check function does not pass on the expected calls "
                             f"(result {check.get('result')!r}, error {check.get('error')!r})")
    return verdicts


__all__ = ["GateError", "SandboxError", "suite_gate", "task_gates", "task_static", "suite_static"]
