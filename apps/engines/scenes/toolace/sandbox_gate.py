"""The toolace gates' sandbox side: runs INSIDE a sandbox, never in the platform.

    python3 sandbox_gate.py SPEC.json REPORT.json

It sits beside envscaler's server.py (copied into the same directory) and uses its loader, its
signature checks, its check-function compiler and its state snapshot, so a suite is judged by
exactly the code that will serve it. It imports nothing from the platform.

SPEC: {"class_name", "code", "operations": [{name, parameters}], "init_config",
       "declared_errors": {operation: [exception class names]},
       "smoke": [{"operation", "arguments"}],
       "tasks": [{"key", "init_config", "calls": [{"tool", "arguments"}], "check_func", "probe"?}],
       "probes": [{"operation", "arguments"}],
       "parts"?: [{"class_name", "init_config"}]}   (a combined suite's parts)

REPORT: {"validate": [{key, field, message}] (server.py validate's errors),
         "smoke": [{"operation", "ok", "error", "declared", "traceback"}],
         "part_attributes"?: {class_name: [attribute names]},
         "tasks": [{"key", "calls": [{"tool", "ok", "output", "error"}], "check": {"reward", "error"},
                    "state_before", "state_after", "probes"?: [{"operation", "reward"}]}]}

A task with "probe": true (a non-tool task) is also checked on the states each of the spec's
"probes" (operation + example arguments) leaves when it changes the state: its check must not
pass on any of them — it asserts the state unchanged.

Each task replays its calls on a fresh instance made from its own init_config (a fresh
environment per task); a smoke call runs on a fresh instance too, so one operation's side
effects never decide another's smoke call.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _server() -> Any:
    found = importlib.util.spec_from_file_location("envscaler_server", os.path.join(HERE, "server.py"))
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def _call(env: Any, name: str, arguments: dict[str, Any], server: Any) -> dict[str, Any]:
    method = getattr(env, name, None)
    if not callable(method) or name.startswith("_"):
        return {"tool": name, "ok": False, "error": f"LookupError: no operation {name!r}", "error_type": "LookupError"}
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = method(**(arguments or {}))
    except Exception as exc:  # noqa: BLE001 - the environment's refusal is the report
        return {"tool": name, "ok": False, "error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__,
                "traceback": traceback.format_exc(limit=6)[-3000:]}
    return {"tool": name, "ok": True, "output": server.dump(result)[:4000]}


def _probes(cls: type, task: dict[str, Any], probes: list[dict[str, Any]], server: Any) -> list[dict[str, Any]]:
    """A non-tool task's check on states the operations change: it must notice each change."""
    out = []
    for probe in probes:
        with contextlib.redirect_stdout(sys.stderr):
            env = cls(**(task.get("init_config") or {}))
        before = server.state_of(env)
        called = _call(env, probe["operation"], probe.get("arguments") or {}, server)
        if not called["ok"] or server.state_of(env) == before:
            continue
        try:
            check = server.compile_check(task["check_func"])
            with contextlib.redirect_stdout(sys.stderr):
                reward, _ = server.reward_of(check(env))
        except Exception:  # noqa: BLE001 - a check that raises on a changed state notices it
            reward = 0.0
        out.append({"operation": probe["operation"], "reward": reward})
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    server = _server()
    report: dict[str, Any] = {"validate": [], "smoke": [], "tasks": []}
    report["validate"] = server.validate({"envs": [{
        "key": "suite", "class_name": spec["class_name"], "code": spec["code"], "operations": spec["operations"],
        "init_configs": [{"key": "suite", "init_config": spec.get("init_config") or {}}]
        + [{"key": t["key"], "init_config": t.get("init_config") or {}} for t in spec.get("tasks", [])],
        "checks": [{"key": t["key"], "source": t["check_func"]} for t in spec.get("tasks", []) if t.get("check_func")],
    }]})["errors"]
    if report["validate"]:
        return report
    cls = server.load_class(spec["code"], spec["class_name"])
    if spec.get("parts"):  # a combined suite: which attributes each part's instance keeps
        report["part_attributes"] = {}
        for part in spec["parts"]:
            with contextlib.redirect_stdout(sys.stderr):
                instance = server.load_class(spec["code"], part["class_name"])(**(part.get("init_config") or {}))
            report["part_attributes"][part["class_name"]] = sorted(server.state_of(instance))
    declared = spec.get("declared_errors") or {}
    for smoke in spec.get("smoke", []):
        with contextlib.redirect_stdout(sys.stderr):
            env = cls(**(spec.get("init_config") or {}))
        outcome = _call(env, smoke["operation"], smoke.get("arguments") or {}, server)
        outcome["operation"] = smoke["operation"]
        outcome["declared"] = (not outcome["ok"]) and outcome.get("error_type") in declared.get(smoke["operation"], [])
        report["smoke"].append(outcome)
    for task in spec.get("tasks", []):
        with contextlib.redirect_stdout(sys.stderr):
            env = cls(**(task.get("init_config") or {}))
        before = server.state_of(env)
        calls = [_call(env, c["tool"], c.get("arguments") or {}, server) for c in task.get("calls", [])]
        entry: dict[str, Any] = {"key": task["key"], "calls": calls, "state_before": before,
                                 "state_after": server.state_of(env)}
        if task.get("check_func"):
            try:
                check = server.compile_check(task["check_func"])
                with contextlib.redirect_stdout(sys.stderr):
                    result = check(env)
                reward, note = server.reward_of(result)
                entry["check"] = {"reward": reward, "error": None if reward is not None else note,
                                  "result": server.dump(result)[:500]}
            except Exception as exc:  # noqa: BLE001
                entry["check"] = {"reward": None, "error": f"{type(exc).__name__}: {exc}"}
        if task.get("probe") and task.get("check_func"):
            entry["probes"] = _probes(cls, task, spec.get("probes", []), server)
        report["tasks"].append(entry)
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: sandbox_gate.py SPEC.json REPORT.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    report = run(spec)
    with open(argv[2], "w", encoding="utf-8") as fh:
        json.dump(report, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
