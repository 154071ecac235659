"""The toolace generation pipeline: executable tool suites, then tasks admitted by execution.

    manage.py synthesize_pipeline toolace --seeds examples/toolace/seeds.jsonl --wait [--start-offline-model]

A seed names a domain and optionally 1-6 tool specs to start from (PRESET_TOOLS, the
reference's six, when it gives neither):

    {"id": "calendar-email", "domain": "a work calendar with e-mail", "tools": [{name, description, parameters}],
     "cross_with": ["expense-reports"]}

Stages per item (apps/engines/pipelines/; every llm prompt starts with its key line):

1. refine (llm, toolace/refine): ToolACE's tool self-evolution, step 1 — the seed's tools made
   precise: defaults, enums, nested objects, a return shape, >= 2 declared error cases each.
2. expand (llm, toolace/expand): complementary operations of the same domain (the reference's
   expansion), all in one list.
3. couple (llm, toolace/couple): dependencies and tool chains, **and** the Python class with
   seeded state that implements every operation (`code`, `class_name`, `init_config`), example
   arguments per operation, and the suite's usage flows. Its validator is the suite gate
   (gates.py: envscaler's static checks, its in-sandbox validation, a smoke call of every
   operation); a failure is sent back once with the traceback, then the seed is dropped with the
   reason stored.
4. cross (code, all items): cross-group suites — pairs of admitted suites combined into one
   environment (gates.combine_suites: both classes and one inheriting from both), gated like any
   suite. Which pairs is the run config's `cross`: "named" (default: a seed with its `cross_with`
   ids), "all_pairs" (every unordered pair, in seed order) or "none". Each pair is made once,
   under its first seed; pairs past `max_cross_pairs` (default 4) are recorded as skipped.
5. flows (code, fan-out): one item per usage flow, "<seed>.<flow id>", plus one per combined
   suite, "<seed>.x-<other seed>", whose tasks run on the combined suite.
6. tasks (llm, toolace/tasks, fan-out): per flow, tasks of the types single / parallel /
   dependent / missing_param / non_tool, each with expected calls, user facts, hidden parameters,
   a check function, optionally an expected answer, a persona, follow-ups and the mode (agent|mt);
   one item per task, "<seed>.<flow>.<task id>".
7. task_gate (code, all items): gates.task_gates — static rules, hidden values kept out of the
   prompt, then the expected calls replayed in a fresh environment in a sandbox (one per suite):
   every call succeeds and the check passes; a non-tool task leaves the state unchanged.

Each survivor becomes a `toolace` task whose scene_config carries the environment (so the
trajectory replays on its own) and the task's dialogue facts; `generation` records the seed,
flow, tool chains and template versions.

Run config: model, concurrency, user_simulator (set on every task), refine_rounds, max_steps,
cross ("named" | "all_pairs" | "none"), max_cross_pairs (0-100).
"""
from __future__ import annotations

import json
from typing import Any

from django.db import close_old_connections

from apps.engines.generation import CodeStage, Drop, LLMStage, Pipeline, PipelineError, Template
from apps.engines.scenes.toolace.gates import GateError, combine_suites, operations_for_server, suite_gate, task_gates

NAME = "toolace"
RUN_CONFIG_KEYS = ("model", "concurrency", "user_simulator", "refine_rounds", "max_steps", "cross", "max_cross_pairs")
DEFAULT_MAX_STEPS = 12
CROSS_MODES = ("named", "all_pairs", "none")
DEFAULT_MAX_CROSS_PAIRS = 4
MAX_CROSS_PAIRS = 100  # each pair costs a suite gate in a sandbox and a tasks call

# The reference workbench's six preset source tools (workbench-notes §1.3).
PRESET_TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "search_web", "description": "Search the web",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "send_email", "description": "Send an e-mail",
     "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"},
                                                     "body": {"type": "string"}}, "required": ["to", "subject"]}},
    {"name": "query_database", "description": "Run a read query on a table",
     "parameters": {"type": "object", "properties": {"table": {"type": "string"}, "filter": {"type": "object"}},
                    "required": ["table"]}},
    {"name": "create_file", "description": "Create a file with content",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path"]}},
    {"name": "call_api", "description": "Call an HTTP API endpoint",
     "parameters": {"type": "object", "properties": {"endpoint": {"type": "string"}, "method": {"type": "string"}},
                    "required": ["endpoint"]}},
]

_OPERATION = {"type": "object", "required": ["name", "description", "parameters"],
              "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                             "parameters": {"type": "object"}}}
OPERATIONS_SCHEMA = {"type": "object", "required": ["operations"],
                     "properties": {"operations": {"type": "array", "minItems": 1, "items": _OPERATION}}}
SUITE_SCHEMA = {"type": "object", "required": ["env_name", "class_name", "description", "operations", "code",
                                               "init_config", "flows"],
                "properties": {
                    "env_name": {"type": "string"}, "class_name": {"type": "string"}, "description": {"type": "string"},
                    "operations": {"type": "array", "minItems": 2, "items": {**_OPERATION, "required": [
                        "name", "description", "parameters", "returns", "errors", "example"]}},
                    "tool_chains": {"type": "array"}, "code": {"type": "string"}, "init_config": {"type": "object"},
                    "flows": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["id", "name", "steps"],
                        "properties": {"id": {"type": "string"}, "steps": {"type": "array"}}}}}}
TASK_SCHEMA = {"type": "object", "required": ["items"], "properties": {"items": {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["id", "type", "prompt", "expected_calls", "check_func"],
    "properties": {"id": {"type": "string"}, "type": {"type": "string"}, "prompt": {"type": "string", "minLength": 1},
                   "persona": {"type": "string"}, "mode": {"enum": ["agent", "mt"]},
                   "expected_calls": {"type": "array", "items": {
                       "type": "object", "required": ["tool", "arguments"],
                       "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}}}},
                   "user_facts": {"type": "object"}, "missing_params": {"type": "array", "items": {"type": "string"}},
                   "check_func": {"type": "string"}, "expected_answer": {"type": "string"},
                   "follow_ups": {"type": "array", "items": {"type": "string"}},
                   "init_config": {"type": "object"}}}}}}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)


REFINE = Template(id="toolace/refine", version="1", system="You design precise, realistic tool APIs. Answer with JSON only.",
                  user=lambda i: (
                      f"Domain: {i['seed'].get('domain') or i['seed'].get('id')}\n"
                      f"Source tools:\n{_dumps(i['seed'].get('tools') or PRESET_TOOLS)}\n\n"
                      "Refine each tool: a clear description, a JSON-schema `parameters` object with types, "
                      "defaults, enums and nested objects where they fit, a `returns` shape, and at least two "
                      "`errors` ({type: a Python exception class name, when}). Answer {\"operations\": [...]}."))
EXPAND = Template(id="toolace/expand", version="1", system="You design precise, realistic tool APIs. Answer with JSON only.",
                  user=lambda i: (
                      f"Domain: {i['seed'].get('domain') or i['seed'].get('id')}\n"
                      f"Refined tools:\n{_dumps(i['refine']['operations'])}\n\n"
                      "Add complementary operations of the same domain (create/read/update/delete, search, "
                      "summaries) whose data the others use, so tasks can chain them. Keep every refined tool. "
                      "Answer {\"operations\": [...all operations...]}."))
COUPLE = Template(id="toolace/couple", version="1",
                  system="You implement tool suites as small stateful Python classes. Answer with JSON only.",
                  user=lambda i: (
                      f"Domain: {i['seed'].get('domain') or i['seed'].get('id')}\n"
                      f"Operations:\n{_dumps(i['expand']['operations'])}\n\n"
                      "Couple them into one executable suite. Answer a JSON object with: env_name, class_name, "
                      "description; operations (each with name, description, parameters, returns, errors "
                      "[{type, when}], example (arguments that succeed on the seeded state), depends_on); "
                      "tool_chains [{name, description, sequence}]; code: the Python source of class "
                      "<class_name> whose __init__ takes the seeded state as keyword arguments with defaults and "
                      "whose methods are the operations (keyword arguments as declared, raising the declared "
                      "errors, returning JSON-able values); init_config: the seeded state; flows: usage flows "
                      "[{id, name, description, steps: [{tool_name, purpose}]}]."))
TASKS = Template(id="toolace/tasks", version="1",
                 system="You write checkable tool-use tasks for a tool suite. Answer with JSON only.",
                 user=lambda i: (
                     f"Suite {i['suite']['env_name']}: {i['suite']['description']}\n"
                     f"Operations:\n{_dumps(operations_for_server(i['suite']))}\n"
                     f"Seeded state (init_config):\n{_dumps(i['suite']['init_config'])}\n"
                     f"Usage flow:\n{_dumps(i['flow'])}\n\n"
                     "Write tasks for this flow, of the types single, parallel, dependent, missing_param and "
                     "non_tool. Each: id, type, prompt (the user's request), optional persona, expected_calls "
                     "[{tool, arguments}] in order, user_facts {name: value} (what only the user knows), "
                     "missing_params (user facts deliberately left out of the prompt: the assistant must ask), "
                     "check_func (`def check(env): ...` on the final state), optional expected_answer, optional "
                     "follow_ups (later requests), mode (agent or mt). Answer {\"items\": [...]}."))
TEMPLATES = (REFINE, EXPAND, COUPLE, TASKS)


def check_suite(parsed: Any, inputs: dict[str, Any]) -> str | None:
    """The couple stage's validator: the suite gate; its reason (with tracebacks) goes back for one repair."""
    try:
        suite_gate(parsed)
    except GateError as exc:
        return str(exc)
    finally:
        # The runner calls this in a pool thread; the gate's sandbox record opened that thread's
        # database connection, which is closed here as in_thread does (CONN_MAX_AGE).
        close_old_connections()
    return None


def cross_pairs(items: dict[str, dict[str, Any]], mode: str) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The pairs of admitted seeds to combine, each once and in a stable order (seed order; a pair
    belongs to its first seed), and {seed: {"rejected"|"skipped": {other: reason}}} for the pairs a
    seed names that are not made: another seed's not admitted, the pair made already, cross "none"."""
    keys = list(items)
    notes: dict[str, Any] = {key: {"rejected": {}, "skipped": {}} for key in keys}
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:]] if mode == "all_pairs" else []
    owner = {frozenset(pair): pair[0] for pair in pairs}
    for key in keys:
        named = items[key]["seed"].get("cross_with") or []
        if not isinstance(named, list) or not all(isinstance(other, str) for other in named):
            notes[key]["rejected"]["cross_with"] = "cross: cross_with must be a list of seed ids"
            continue
        for other in dict.fromkeys(named):
            if mode == "none":
                notes[key]["skipped"][other] = "cross: the run's cross is 'none'"
            elif other == key:
                notes[key]["rejected"][other] = "cross: a seed cannot cross with itself"
            elif other not in items:
                notes[key]["rejected"][other] = "cross: that seed's suite was not admitted"
            elif frozenset((key, other)) in owner:
                if owner[frozenset((key, other))] != key:
                    notes[key]["skipped"][other] = f"cross: the pair is made under {owner[frozenset((key, other))]}"
            else:
                owner[frozenset((key, other))] = key
                pairs.append((key, other))
    return pairs, notes


def cross_stage(items: dict[str, dict[str, Any]], mode: str = "named",
                max_pairs: int = DEFAULT_MAX_CROSS_PAIRS) -> dict[str, Any]:
    """scope="all": per seed, the combined suites of the pairs it owns (cross_pairs), each gated
    like any suite (gates.combine_suites, suite_gate); nobody is dropped here: a pair that fails
    keeps its reason under "rejected", one past `max_pairs` is under "skipped"."""
    pairs, notes = cross_pairs(items, mode)
    answer = {key: {"combined": [], **notes[key]} for key in items}
    for number, (key, other) in enumerate(pairs, 1):
        if number > max_pairs:
            answer[key]["skipped"][other] = f"cross: over max_cross_pairs={max_pairs} (pair {number} of {len(pairs)})"
            continue
        try:
            suite = combine_suites(items[key]["couple"], items[other]["couple"])
            suite_gate(suite)
        except GateError as exc:
            answer[key]["rejected"][other] = str(exc)
        else:
            answer[key]["combined"].append({"with": other, "suite": suite})
    return answer


def flows_stage(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """The suite's usage flows, then one flow per combined suite ("x-<other seed>") carrying it."""
    flows = [{**flow, "id": str(flow["id"])} for flow in inputs["couple"]["flows"]]
    for entry in (inputs.get("cross") or {}).get("combined") or []:
        flow = entry["suite"]["flows"][0]
        flows.append({**flow, "id": f"x-{entry['with']}", "suite": entry["suite"], "cross_with": entry["with"]})
    return flows


def _suite_of(state: dict[str, Any]) -> dict[str, Any]:
    """The suite an item's tasks run on: its flow's combined suite, else its seed's."""
    return state["flows"].get("suite") or state["couple"]


def gate_all(items: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """scope="all": every task of a suite gated in one sandbox; Drop(reason) for the rejected."""
    by_suite: dict[str, list[str]] = {}
    for key, inputs in items.items():
        by_suite.setdefault(inputs["suite"]["env_name"], []).append(key)
    answer: dict[str, Any] = {}
    for keys in by_suite.values():
        suite = items[keys[0]]["suite"]
        verdicts = task_gates(suite, {key: items[key]["task"] for key in keys})
        for key in keys:
            answer[key] = Drop(verdicts[key]) if verdicts[key] else items[key]["task"]
    return answer


def build(config: dict[str, Any]) -> Pipeline:
    """The toolace pipeline for a run's config (PipelineError on a bad config)."""
    unknown = sorted(set(config) - set(RUN_CONFIG_KEYS))
    if unknown:
        raise PipelineError(f"unknown toolace run config {', '.join(unknown)}; known: {', '.join(RUN_CONFIG_KEYS)}")
    simulator = config.get("user_simulator")
    if simulator is not None and (not isinstance(simulator, dict) or simulator.get("kind") not in ("deterministic", "llm")):
        raise PipelineError("user_simulator must be {\"kind\": \"deterministic\"} or {\"kind\": \"llm\", \"model\", \"prompt\"}")
    max_steps = config.get("max_steps", DEFAULT_MAX_STEPS)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= 500:
        raise PipelineError("max_steps must be a whole number from 1 to 500")
    cross_mode = config.get("cross", "named")
    if cross_mode not in CROSS_MODES:
        raise PipelineError(f"cross must be one of {', '.join(map(repr, CROSS_MODES))}, not {cross_mode!r}")
    max_pairs = config.get("max_cross_pairs", DEFAULT_MAX_CROSS_PAIRS)
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or not 0 <= max_pairs <= MAX_CROSS_PAIRS:
        raise PipelineError(f"max_cross_pairs must be a whole number from 0 to {MAX_CROSS_PAIRS}, not {max_pairs!r}")

    def task(key: str, state: dict[str, Any]) -> dict[str, Any]:
        suite, item = _suite_of(state), state["task_gate"]
        flow = {k: v for k, v in state["flows"].items() if k != "suite"}
        cross = f"{key.split('.', 1)[0]}+{flow['cross_with']}" if flow.get("cross_with") else ""
        scene = {
            "env_name": suite["env_name"], "class_name": suite.get("class_name") or suite["env_name"],
            "env_description": suite.get("description") or "", "code": suite["code"],
            "operations": operations_for_server(suite),
            "init_config": item.get("init_config") or suite.get("init_config") or {},
            "check_func": item["check_func"], "task_id": key, "suite": cross or key.split(".", 1)[0],
            "task_type": item["type"], "mode": item.get("mode") or "agent",
            "expected_calls": item.get("expected_calls") or [], "user_facts": item.get("user_facts") or {},
            "missing_params": item.get("missing_params") or [],
            "generation": {"pipeline": NAME, "item": key, "flow": flow, "tool_chains": suite.get("tool_chains") or [],
                           "templates": {t.id: t.version for t in TEMPLATES}},
        }
        for field in ("expected_answer", "persona", "follow_ups"):
            if item.get(field):
                scene[field] = item[field]
        if simulator:
            scene["user_simulator"] = simulator
        if "refine_rounds" in config:
            scene["refine_rounds"] = config["refine_rounds"]
        return {"scene": NAME, "prompt": item["prompt"], "external_id": f"toolace-{key}", "config": scene,
                "expected_tools": sorted({c["tool"] for c in item.get("expected_calls") or []}),
                "max_steps": max_steps}

    return Pipeline(name=NAME, task=task, stages=(
        LLMStage(name="refine", template=REFINE, schema=OPERATIONS_SCHEMA, temperature=0.5,
                 inputs=lambda s: {"seed": s["seed"]}),
        LLMStage(name="expand", template=EXPAND, schema=OPERATIONS_SCHEMA, temperature=0.8,
                 inputs=lambda s: {"seed": s["seed"], "refine": s["refine"]}),
        LLMStage(name="couple", template=COUPLE, schema=SUITE_SCHEMA, validator=check_suite, repairs=1,
                 temperature=0.5, inputs=lambda s: {"seed": s["seed"], "expand": s["expand"]}),
        CodeStage(name="cross", fn=lambda items: cross_stage(items, cross_mode, max_pairs), scope="all",
                  inputs=lambda s: {"seed": s["seed"], "couple": s["couple"]}),
        CodeStage(name="flows", fn=flows_stage, fan_out=True, inputs=lambda s: {"couple": s["couple"], "cross": s["cross"]}),
        LLMStage(name="tasks", template=TASKS, schema=TASK_SCHEMA, fan_out=True, temperature=0.7,
                 inputs=lambda s: {"suite": _suite_of(s),
                                   "flow": {k: v for k, v in s["flows"].items() if k != "suite"}}),
        CodeStage(name="task_gate", fn=gate_all, scope="all",
                  inputs=lambda s: {"suite": _suite_of(s), "task": s["tasks"]}),
    ))
