"""Validating EnvScaler environments and scenarios, with per-item errors, into task rows.

    rows = validate_inputs(metadata=[...], scenarios=[...])   # EnvScalerImportError: every problem

The import itself (one batch of these rows, audited) is apps.engines.pipelines.envscaler.envscaler_import.

Inputs are the reference's two JSON documents (parsed):

* metadata: a list (or {"envs": [...]}) of environments: `env_name` (alt `name`),
  `description`, `code` (Python source of the environment class), `operations` (alts `tools`,
  `functions`): [{name, description, parameters: JSON schema of the arguments}], and an
  optional `class_name` (default: env_name).
* scenarios: a list (or {"tasks"|"scenarios": [...]}) of tasks: `task_id` (alt `id`),
  `task_desc` (alts `task`, `description`, `query`), `env_name`, `init_config` (alt
  `initial_state`; keyword arguments of the class), `check_func` (alt `check`; Python source
  of `def check(env): ...`), and optionally `max_steps`.

Validation never executes the submitted code in the platform's process. The static part
(here) uses `ast`: JSON shapes, Python syntax, the class defined at the top level under its
name, operation names, JSON schemas. The rest runs inside a sandbox (server.py validate):
the class is looked up by name among the classes the code defines, every declared
operation must exist on it with a matching signature, each task's init_config must be
accepted by its constructor (and construct), and each check function must compile to a
one-argument `check`. Any error anywhere: EnvScalerImportError with every error.
Otherwise one task row per scenario, the environment embedded in each task's scene_config,
so a trajectory's frozen config replays on its own.
"""
from __future__ import annotations

import ast
import hashlib
import json
import keyword
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from apps.engines.scenes.envscaler.runtime import SANDBOX_DIR, SERVER_PATH, SERVER_SOURCE
from apps.engines.runtime import validate_scene_config
from apps.engines.sandboxes import SandboxError, SandboxSpec, get_backend
from trajplatform.pyparse import parse_python

SCENE = "envscaler"
RESERVED_TOOL_NAMES = ("get_current_time", "finish", "envscaler_state", "envscaler_check")
MAX_ENVS = 200
MAX_SCENARIOS = 5000
MAX_CODE_CHARS = 200_000
VALIDATE_SPEC_PATH = f"{SANDBOX_DIR}/validate.json"
VALIDATE_REPORT_PATH = f"{SANDBOX_DIR}/report.json"


@dataclass(frozen=True)
class ItemError:
    """One problem: which item ("metadata[0] (clinic)", "scenarios[3] (t-4)"), which field, why."""

    item: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.item}: {self.field}: {self.message}" if self.field else f"{self.item}: {self.message}"

    def as_dict(self) -> dict[str, str]:
        return {"item": self.item, "field": self.field, "message": self.message}


class EnvScalerImportError(Exception):
    """The input is invalid; `errors` lists every problem found (nothing was written)."""

    def __init__(self, errors: list[ItemError]):
        self.errors = errors
        shown = "\n".join(f"  {e}" for e in errors[:50])
        more = f"\n  ... and {len(errors) - 50} more" if len(errors) > 50 else ""
        super().__init__(f"{len(errors)} error(s) in the EnvScaler input:\n{shown}{more}")


def _first(obj: dict[str, Any], *keys: str) -> Any:
    return next((obj[k] for k in keys if k in obj), None)


def _items(doc: Any, keys: tuple[str, ...], what: str, errors: list[ItemError]) -> list[Any]:
    if isinstance(doc, dict):
        doc = _first(doc, *keys)
    if not isinstance(doc, list):
        errors.append(ItemError(what, "", f"must be a JSON list (or an object with {' / '.join(keys)})"))
        return []
    if not doc:
        errors.append(ItemError(what, "", "is empty"))
    return doc


def _identifier(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value)


def _top_level_classes(tree: ast.Module) -> list[str]:
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)]


def _parse(source: str, filename: str) -> tuple[ast.Module | None, str]:
    try:
        return parse_python(source, filename=filename), ""
    except SyntaxError as exc:
        return None, f"syntax error at line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # NUL bytes
        return None, str(exc)


# --- static checks ----------------------------------------------------------------------------------


def _check_env(index: int, raw: Any, errors: list[ItemError]) -> dict[str, Any] | None:
    """One metadata entry, normalised, or None (its errors appended)."""
    if not isinstance(raw, dict):
        errors.append(ItemError(f"metadata[{index}]", "", "must be an object"))
        return None
    name = _first(raw, "env_name", "name")
    item = f"metadata[{index}] ({name})" if isinstance(name, str) and name else f"metadata[{index}]"
    before = len(errors)
    if not isinstance(name, str) or not name.strip():
        errors.append(ItemError(item, "env_name", "is required (a non-empty string)"))
    class_name = raw.get("class_name") or name
    if not _identifier(class_name):
        errors.append(ItemError(item, "class_name", f"{class_name!r} is not a Python class name"))
    code = raw.get("code")
    tree = None
    if not isinstance(code, str) or not code.strip():
        errors.append(ItemError(item, "code", "is required (the Python source of the environment class)"))
    elif len(code) > MAX_CODE_CHARS:
        errors.append(ItemError(item, "code", f"is longer than {MAX_CODE_CHARS} characters"))
    else:
        tree, problem = _parse(code, f"<{name}>")
        if problem:
            errors.append(ItemError(item, "code", problem))
        elif _identifier(class_name) and class_name not in _top_level_classes(tree):
            defined = ", ".join(_top_level_classes(tree)) or "none"
            errors.append(ItemError(item, "code",
                                    f"defines no top-level class {class_name!r} (classes defined: {defined}); "
                                    "set class_name if the class is named differently"))
    description = raw.get("description") or ""
    if not isinstance(description, str):
        errors.append(ItemError(item, "description", "must be a string"))
    operations = _first(raw, "operations", "tools", "functions")
    ops: list[dict[str, Any]] = []
    if not isinstance(operations, list) or not operations:
        errors.append(ItemError(item, "operations", "is required (a non-empty list of operations)"))
        operations = []
    seen: set[str] = set()
    for j, op in enumerate(operations):
        where = f"operations[{j}]"
        if not isinstance(op, dict):
            errors.append(ItemError(item, where, "must be an object {name, description, parameters}"))
            continue
        op_name = op.get("name")
        where = f"operations[{j}] ({op_name})" if isinstance(op_name, str) else where
        if not _identifier(op_name):
            errors.append(ItemError(item, where, f"name {op_name!r} is not a valid operation (method) name"))
            continue
        if op_name in RESERVED_TOOL_NAMES or op_name.startswith("_"):
            errors.append(ItemError(item, where, f"{op_name!r} is reserved (or private) and cannot be an operation"))
        if op_name in seen:
            errors.append(ItemError(item, where, f"operation {op_name!r} is declared twice"))
        seen.add(op_name)
        params = op.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            errors.append(ItemError(item, where, "parameters must be a JSON schema of type object"))
            continue
        try:
            Draft202012Validator.check_schema(params)
        except SchemaError as exc:
            errors.append(ItemError(item, where, f"parameters is not a valid JSON schema: {exc.message}"))
            continue
        props = params.get("properties") or {}
        if not isinstance(props, dict) or not all(_identifier(p) for p in props):
            errors.append(ItemError(item, where, "parameter names must be Python identifiers"))
            continue
        missing = [r for r in params.get("required") or [] if r not in props]
        if missing:
            errors.append(ItemError(item, where, f"required parameters {missing} are not declared in properties"))
            continue
        ops.append({"name": op_name, "description": str(op.get("description") or ""),
                    "parameters": {**params, "type": "object"}})
    if len(errors) > before:
        return None
    return {"env_name": name, "class_name": class_name, "env_description": description, "code": code,
            "operations": ops, "item": item}


def _check_scenario(index: int, raw: Any, envs: dict[str, Any], known: set[str], seen: set[str],
                    errors: list[ItemError]) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        errors.append(ItemError(f"scenarios[{index}]", "", "must be an object"))
        return None
    task_id = _first(raw, "task_id", "id")
    task_id = str(task_id) if isinstance(task_id, (str, int)) and not isinstance(task_id, bool) else task_id
    item = f"scenarios[{index}] ({task_id})" if isinstance(task_id, str) and task_id else f"scenarios[{index}]"
    before = len(errors)
    if not isinstance(task_id, str) or not task_id.strip() or len(task_id) > 200:
        errors.append(ItemError(item, "task_id", "is required (a string or number, at most 200 characters)"))
    elif task_id in seen:
        errors.append(ItemError(item, "task_id", f"{task_id!r} appears more than once"))
    else:
        seen.add(task_id)
    desc = _first(raw, "task_desc", "task", "description", "query")
    if not isinstance(desc, str) or not desc.strip():
        errors.append(ItemError(item, "task_desc", "is required (the task the agent receives)"))
    env_name = raw.get("env_name")
    if not isinstance(env_name, str) or env_name not in known:
        errors.append(ItemError(item, "env_name", f"{env_name!r} is not an environment in the metadata"
                                                  + (f" (known: {', '.join(sorted(known))})" if known else "")))
    init_config = _first(raw, "init_config", "initial_state")
    if init_config is None:
        init_config = {}
    if not isinstance(init_config, dict) or not all(_identifier(k) for k in init_config):
        errors.append(ItemError(item, "init_config", "must be an object whose keys are the constructor's "
                                                     "keyword arguments"))
    check = _first(raw, "check_func", "check")
    if not isinstance(check, str) or not check.strip():
        errors.append(ItemError(item, "check_func", "is required (Python source of `def check(env): ...`)"))
    else:
        tree, problem = _parse(check, "<check_func>")
        if problem:
            errors.append(ItemError(item, "check_func", problem))
        elif not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
            errors.append(ItemError(item, "check_func", "defines no top-level function check(env)"))
    max_steps = raw.get("max_steps")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                  or not 1 <= max_steps <= 500):
        errors.append(ItemError(item, "max_steps", "must be an integer from 1 to 500"))
    if len(errors) > before:
        return None
    return {"task_id": task_id, "task_desc": desc.strip(), "env_name": env_name, "init_config": init_config,
            "check_func": check, "max_steps": max_steps, "item": item}


# --- the sandbox part ----------------------------------------------------------------------------


def _sandbox_validate(envs: dict[str, dict[str, Any]], scenarios: list[dict[str, Any]]) -> list[ItemError]:
    """Run server.py validate in a fresh sandbox; the errors it reports, keyed back to items."""
    items: dict[str, str] = {}
    spec_envs = []
    for name, env in envs.items():
        key = f"env:{name}"
        items[key] = env["item"]
        tasks = [s for s in scenarios if s["env_name"] == name]
        for s in tasks:
            items[f"task:{s['task_id']}"] = s["item"]
        spec_envs.append({
            "key": key, "class_name": env["class_name"], "code": env["code"], "operations": env["operations"],
            "init_configs": [{"key": f"task:{s['task_id']}", "init_config": s["init_config"]} for s in tasks],
            "checks": [{"key": f"task:{s['task_id']}", "source": s["check_func"]} for s in tasks],
        })
    timeout = settings.ENVSCALER_VALIDATE_TIMEOUT_S
    spec = SandboxSpec(image=settings.ENVSCALER_SANDBOX_IMAGE, labels={"scene": "envscaler", "purpose": "validate"},
                       ttl=timeout + 600)
    try:
        with get_backend().create(spec) as sandbox:
            sandbox.write_file(SERVER_PATH, SERVER_SOURCE.read_bytes())
            sandbox.write_file(VALIDATE_SPEC_PATH, json.dumps({"envs": spec_envs}).encode("utf-8"))
            result = sandbox.run(["python3", SERVER_PATH, "validate", VALIDATE_SPEC_PATH, VALIDATE_REPORT_PATH],
                                 timeout=timeout, max_output_bytes=64 * 1024)
            if result.timed_out or result.exit_code != 0:
                why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
                tail = (result.stderr or result.stdout).strip()[-2000:]
                return [ItemError("metadata", "code", f"validating the environments in the sandbox {why}"
                                  + (f": {tail}" if tail else ""))]
            report = json.loads(sandbox.read_file(VALIDATE_REPORT_PATH, max_bytes=4 << 20))
    except SandboxError as exc:
        raise EnvScalerImportError([ItemError("sandbox", "", f"cannot validate the environments: {exc}")]) from None
    except (ValueError, UnicodeDecodeError) as exc:
        return [ItemError("metadata", "code", f"the validation report is unreadable: {exc}")]
    return [ItemError(items.get(e.get("key"), str(e.get("key"))), str(e.get("field", "")), str(e.get("message", "")))
            for e in report.get("errors", [])]


# --- the rows -----------------------------------------------------------------------------------------


def validate_inputs(*, metadata: Any, scenarios: Any) -> list[dict[str, Any]]:
    """The task field dicts for a valid input; EnvScalerImportError listing every problem otherwise."""
    errors: list[ItemError] = []
    raw_envs = _items(metadata, ("envs", "environments"), "metadata", errors)[:MAX_ENVS + 1]
    raw_scenarios = _items(scenarios, ("tasks", "scenarios"), "scenarios", errors)[:MAX_SCENARIOS + 1]
    if len(raw_envs) > MAX_ENVS:
        errors.append(ItemError("metadata", "", f"more than {MAX_ENVS} environments"))
    if len(raw_scenarios) > MAX_SCENARIOS:
        errors.append(ItemError("scenarios", "", f"more than {MAX_SCENARIOS} scenarios"))
    envs: dict[str, dict[str, Any]] = {}
    known: set[str] = set()
    for i, raw in enumerate(raw_envs):
        name = _first(raw, "env_name", "name") if isinstance(raw, dict) else None
        if isinstance(name, str) and name in known:
            errors.append(ItemError(f"metadata[{i}] ({name})", "env_name", f"{name!r} is declared twice"))
            continue
        if isinstance(name, str) and name:
            known.add(name)
        env = _check_env(i, raw, errors)
        if env is not None:
            envs[env["env_name"]] = env
    seen: set[str] = set()
    checked = [_check_scenario(i, raw, envs, known, seen, errors) for i, raw in enumerate(raw_scenarios)]
    valid = [s for s in checked if s is not None and s["env_name"] in envs]
    if envs:
        errors += _sandbox_validate(envs, valid)
    if errors:
        raise EnvScalerImportError(errors)
    rows = []
    for s in valid:
        env = envs[s["env_name"]]
        config = validate_scene_config(SCENE, {
            "env_name": env["env_name"], "class_name": env["class_name"], "env_description": env["env_description"],
            "code": env["code"], "operations": env["operations"], "init_config": s["init_config"],
            "check_func": s["check_func"], "task_id": s["task_id"],
        })
        row = {"scene": SCENE, "prompt": s["task_desc"], "scene_config": config, "external_id": s["task_id"],
               "expected_tools": sorted({op["name"] for op in env["operations"]})}
        if s["max_steps"]:
            row["max_steps"] = s["max_steps"]
        rows.append(row)
    return rows


def input_digest(metadata: Any, scenarios: Any) -> str:
    """The sha256 of the input's canonical JSON (the batch's source_sha256)."""
    canonical = json.dumps({"metadata": metadata, "scenarios": scenarios}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

