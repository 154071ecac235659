"""The EnvScaler environment side: runs INSIDE the task's sandbox, never in the platform.

    python3 server.py serve SPEC.json        # an MCP server over stdio (fastmcp)
    python3 server.py validate SPEC.json REPORT.json   # import validation; a JSON report

This file is copied into the sandbox and run by the sandbox's python3 (local: Debian's, with
the platform's packages on PYTHONPATH; OpenSandbox: the image's). It imports nothing from
the platform and must not: it is the only place environment code and check functions run.

serve: SPEC is {"env_name", "class_name", "code", "operations": [{name, description,
parameters}], "init_config"}. The code is executed as a module of its own; the class is
looked up by name among the classes *defined in that module* (never "the first class"), and
one instance is created with init_config. Every operation becomes an MCP tool with its
declared JSON schema; the arguments arrive as data and are passed as keyword arguments.
Besides the operations: get_current_time(timezone), and two tools for the platform that the
agent is never offered: envscaler_state (the instance's attributes as JSON) and
envscaler_check(source) (compile `def check(env)`, run it on the live instance).

validate: SPEC is {"envs": [{"key", "class_name", "code", "operations", "init_configs":
[{"key", "init_config"}], "checks": [{"key", "source"}]}]}; the report lists errors as
{"key", "field", "message"}.

Anything the environment prints goes to stderr: stdout carries the MCP stream.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import inspect
import json
import sys
import traceback
import types
from typing import Any
from zoneinfo import ZoneInfo

MODULE_NAME = "envscaler_env"
RESERVED_TOOLS = ("get_current_time", "finish", "envscaler_state", "envscaler_check")
STATE_MAX_CHARS = 200_000


def load_class(code: str, class_name: str) -> type:
    """Execute `code` as a fresh module and return the class `class_name` defined in it."""
    module = types.ModuleType(MODULE_NAME)
    sys.modules[MODULE_NAME] = module
    with contextlib.redirect_stdout(sys.stderr):
        exec(compile(code, f"<{class_name} environment>", "exec"), module.__dict__)
    cls = module.__dict__.get(class_name)
    if not inspect.isclass(cls):
        raise LookupError(f"the code defines no class named {class_name!r}")
    if cls.__module__ != MODULE_NAME:
        raise LookupError(f"{class_name!r} is imported into the code, not defined in it")
    return cls


def signature_problems(cls: type, operation: dict[str, Any]) -> list[str]:
    """How the declared operation disagrees with the class's method (empty: it matches)."""
    name = operation.get("name")
    method = inspect.getattr_static(cls, name, None)
    if method is None:
        return [f"the class has no method {name!r}"]
    if isinstance(method, (staticmethod, classmethod)):
        method = method.__func__
    if not callable(method):
        return [f"{name!r} is not a method"]
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError) as exc:
        return [f"cannot read the signature of {name!r}: {exc}"]
    if params and params[0].name in ("self", "cls") and not isinstance(inspect.getattr_static(cls, name), staticmethod):
        params = params[1:]
    schema = operation.get("parameters") or {}
    declared = set((schema.get("properties") or {}).keys())
    required = set(schema.get("required") or [])
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    problems = []
    for extra in sorted(declared - set(named)):
        if not takes_kwargs:
            problems.append(f"parameter {extra!r} is declared but {name}() does not accept it")
    for pname, param in named.items():
        if param.default is param.empty and pname not in required:
            if pname in declared:
                problems.append(f"parameter {pname!r} has no default in {name}() but is not required in the schema")
            else:
                problems.append(f"{name}() requires {pname!r}, which the schema does not declare")
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        problems.append(f"{name}() has positional-only parameters {positional_only}: tools pass keyword arguments")
    return problems


def compile_check(source: str) -> Any:
    """The `check` function defined by `source` (run in a namespace of its own)."""
    namespace: dict[str, Any] = {"__name__": "envscaler_check"}
    with contextlib.redirect_stdout(sys.stderr):
        exec(compile(source, "<check_func>", "exec"), namespace)
    check = namespace.get("check")
    if not callable(check):
        raise LookupError("the check source defines no function check(env)")
    params = [p for p in inspect.signature(check).parameters.values() if p.default is p.empty]
    if len(params) != 1:
        raise TypeError(f"check must take exactly one argument (env), it takes {len(params)} without defaults")
    return check


def state_of(env: Any) -> dict[str, Any]:
    """The instance's public and private attributes, JSON-safe (repr for what is not JSON)."""
    if hasattr(env, "__dict__"):
        attributes = dict(vars(env))
    else:  # a class with __slots__
        names = [n for c in type(env).__mro__ for n in getattr(c, "__slots__", ())]
        attributes = {n: getattr(env, n) for n in names if hasattr(env, n)}
    state = {k: v for k, v in attributes.items() if not k.startswith("__")}
    return json.loads(json.dumps(state, default=repr, sort_keys=True))


def dump(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=repr, ensure_ascii=False)


def reward_of(result: Any) -> tuple[float | None, str]:
    """(reward, note) of a check's return value: bool -> 1/0, a number clamped to [0, 1]."""
    if isinstance(result, bool):
        return (1.0 if result else 0.0), ""
    if isinstance(result, (int, float)) and result == result:
        value = float(result)
        clamped = min(1.0, max(0.0, value))
        return clamped, (f"check returned {value}; clamped to {clamped}" if clamped != value else "")
    return None, f"check returned {type(result).__name__}, not a bool or a number"


# --- validate ----------------------------------------------------------------------------------


def validate(spec: dict[str, Any]) -> dict[str, Any]:
    errors: list[dict[str, str]] = []
    for env_spec in spec.get("envs", []):
        key = env_spec["key"]
        try:
            cls = load_class(env_spec["code"], env_spec["class_name"])
        except BaseException as exc:  # noqa: BLE001 - anything the code does is its own error
            errors.append({"key": key, "field": "code", "message": f"{type(exc).__name__}: {exc}"})
            continue
        for operation in env_spec.get("operations", []):
            for problem in signature_problems(cls, operation):
                errors.append({"key": key, "field": f"operations.{operation.get('name')}", "message": problem})
        for item in env_spec.get("init_configs", []):
            config = item["init_config"]
            try:
                inspect.signature(cls).bind(**config)
            except TypeError as exc:
                errors.append({"key": item["key"], "field": "init_config",
                               "message": f"not accepted by {env_spec['class_name']}(): {exc}"})
                continue
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    instance = cls(**config)
                state_of(instance)
            except BaseException as exc:  # noqa: BLE001
                errors.append({"key": item["key"], "field": "init_config",
                               "message": f"{env_spec['class_name']}(**init_config) failed: {type(exc).__name__}: {exc}"})
        for item in env_spec.get("checks", []):
            try:
                compile_check(item["source"])
            except BaseException as exc:  # noqa: BLE001
                errors.append({"key": item["key"], "field": "check_func", "message": f"{type(exc).__name__}: {exc}"})
    return {"errors": errors}


# --- serve -------------------------------------------------------------------------------------


def build_server(spec: dict[str, Any]) -> Any:
    from fastmcp import FastMCP  # deferred: fastmcp (1.3 s import), sandbox server only
    from fastmcp.tools import Tool  # deferred: fastmcp (1.3 s import), sandbox server only
    from fastmcp.tools.base import ToolResult  # deferred: fastmcp (1.3 s import), sandbox server only

    cls = load_class(spec["code"], spec["class_name"])
    with contextlib.redirect_stdout(sys.stderr):
        env = cls(**(spec.get("init_config") or {}))

    def error(text: str) -> ToolResult:
        return ToolResult(content=text, is_error=True)

    class OperationTool(Tool):
        """One environment operation: the declared schema, the instance's method."""

        async def run(self, arguments: dict[str, Any]) -> ToolResult:
            method = getattr(env, self.name, None)
            if not callable(method):
                return error(f"the environment has no operation {self.name!r}")
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    result = method(**(arguments or {}))
            except TypeError as exc:
                return error(f"TypeError: {exc}")
            except Exception as exc:  # the environment refused: the agent reads why
                return error(f"{type(exc).__name__}: {exc}")
            return ToolResult(content=dump(result))

    class StateTool(Tool):
        async def run(self, arguments: dict[str, Any]) -> ToolResult:
            text = json.dumps(state_of(env), ensure_ascii=False, sort_keys=True)
            if len(text) > STATE_MAX_CHARS:
                text = json.dumps({"truncated": True, "chars": len(text), "head": text[:STATE_MAX_CHARS]})
            return ToolResult(content=text)

    class CheckTool(Tool):
        async def run(self, arguments: dict[str, Any]) -> ToolResult:
            try:
                check = compile_check(arguments["source"])
                with contextlib.redirect_stdout(sys.stderr):
                    result = check(env)
            except Exception as exc:
                return ToolResult(content=json.dumps({
                    "reward": None, "result": None, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=5)[-4000:],
                }))
            reward, note = reward_of(result)
            return ToolResult(content=json.dumps({"reward": reward, "result": dump(result)[:2000], "note": note,
                                                  "error": None if reward is not None else note}))

    mcp = FastMCP(spec.get("env_name") or spec["class_name"])
    for operation in spec.get("operations", []):
        mcp.add_tool(OperationTool(
            name=operation["name"], description=operation.get("description") or operation["name"],
            parameters=operation.get("parameters") or {"type": "object", "properties": {}},
        ))

    @mcp.tool
    def get_current_time(timezone: str = "UTC") -> dict[str, Any]:
        """The current date and time in an IANA timezone (default UTC)."""
        now = _dt.datetime.now(ZoneInfo(timezone))
        return {"timezone": timezone, "datetime": now.isoformat(timespec="seconds"), "date": now.date().isoformat(),
                "time": now.strftime("%H:%M:%S"), "weekday": now.strftime("%A"), "timestamp": int(now.timestamp())}

    mcp.add_tool(StateTool(name="envscaler_state", description="platform only: the environment's state",
                           parameters={"type": "object", "properties": {}}))
    mcp.add_tool(CheckTool(name="envscaler_check", description="platform only: run a check function",
                           parameters={"type": "object", "properties": {"source": {"type": "string"}},
                                       "required": ["source"]}))
    return mcp


def main(argv: list[str]) -> int:
    if len(argv) != {"serve": 3, "validate": 4}.get(argv[1] if len(argv) > 1 else "", -1):
        print("usage: server.py serve SPEC.json | validate SPEC.json REPORT.json", file=sys.stderr)
        return 2
    with open(argv[2], encoding="utf-8") as fh:
        spec = json.load(fh)
    if argv[1] == "validate":
        report = validate(spec)
        with open(argv[3], "w", encoding="utf-8") as fh:
            json.dump(report, fh)
        return 0
    build_server(spec).run(transport="stdio", show_banner=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
