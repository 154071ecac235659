"""The scene registry: the nine scenes, their descriptions and their config schemas.

A task's `scene_config` is validated against its scene's JSON schema (jsonschema, draft
2020-12) when the task is created or imported. Each scene's engine lives beside this module
and is registered by later work; the registry itself is the single list of scene ids the
whole platform uses (model choices, import validation, the API's /scenes).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator


@dataclass(frozen=True)
class Scene:
    id: str
    title: str
    description: str
    config_schema: dict[str, Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    required_params: tuple[str, ...] = ()
    # Rules the schema cannot say: "module:function", given the config (schema-valid, defaults
    # filled in), returning (field, reason) pairs; imported on use.
    check: str = ""

    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.config_schema)


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_STR = {"type": "string"}
_STR_LIST = {"type": "array", "items": {"type": "string"}}
_FILES = {"type": "object", "additionalProperties": {"type": "string"}, "description": "path -> file content"}
# The web toolset's settings (apps/engines/web, docs/web.md): the offline corpus (default) or the live web.
_WEB = _obj({"backend": {"enum": ["corpus", "live"]}, "corpus": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]{0,63}$"}})

SCENES: dict[str, Scene] = {
    s.id: s
    for s in [
        Scene(
            "code_exec",
            "Code execution",
            "An agent writes and runs code with shell and file tools in a sandbox; an optional "
            "verifier (files + check command) decides the reward.",
            _obj(
                {
                    "image": _STR,
                    "setup_files": _FILES,
                    "verifier": _obj(
                        {"files": _FILES, "hidden_files": _FILES, "command": _STR, "partial_credit": {"type": "boolean"},
                         "timeout": {"type": "number", "exclusiveMinimum": 0}},
                        required=("command",),
                    ),
                }
            ),
        ),
        Scene(
            "envscaler",
            "EnvScaler (stateful MCP environments)",
            "A stateful domain environment served over MCP in the sandbox; a check function on the "
            "final state decides the reward.",
            _obj(
                {
                    "env_name": _STR,
                    "class_name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                    "env_description": _STR,
                    "code": _STR,
                    "operations": {
                        "type": "array",
                        "items": _obj(
                            {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                             "description": _STR, "parameters": {"type": "object"}},
                            required=("name", "parameters"),
                        ),
                    },
                    "init_config": {"type": "object"},
                    "check_func": _STR,
                    "task_id": _STR,
                    "image": _STR,
                },
                required=("env_name",),
            ),
            required_params=("env_name",),
        ),
        Scene(
            "toolace",
            "ToolACE (synthetic tool use)",
            "Tool-calling dialogues over synthesized tool suites that execute (an envscaler environment in "
            "the sandbox), with a simulated user answering clarification turns; agent or ToolACE-MT mode "
            "(apps/engines/scenes/toolace, docs/toolace.md).",
            _obj(
                {
                    # the suite as an envscaler environment (see "envscaler")
                    "env_name": _STR, "class_name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                    "env_description": _STR, "code": _STR, "init_config": {"type": "object"}, "check_func": _STR,
                    "operations": {"type": "array", "items": _obj(
                        {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "description": _STR,
                         "parameters": {"type": "object"}}, required=("name", "parameters"))},
                    "task_id": _STR, "suite": _STR, "image": _STR,
                    "task_type": {"enum": ["single", "parallel", "dependent", "missing_param", "non_tool"]},
                    "mode": {"enum": ["agent", "mt"]},
                    "expected_calls": {"type": "array", "items": _obj(
                        {"tool": _STR, "arguments": {"type": "object"}}, required=("tool", "arguments"))},
                    # what only the user knows: {name: value} or {name: {"value", "aliases"}}
                    "user_facts": {"type": "object"},
                    "missing_params": _STR_LIST,
                    "expected_answer": _STR,
                    "follow_ups": {"type": "array", "items": {"type": "string", "minLength": 1}},
                    "persona": _STR,
                    "user_simulator": _obj({"kind": {"enum": ["deterministic", "llm"]}, "model": _STR,
                                            "prompt": _STR}, required=("kind",)),
                    "refine_rounds": {"type": "integer", "minimum": 0, "maximum": 5},
                    "generation": {"type": "object"},
                },
                required=("env_name", "code", "operations"),
            ),
            required_params=("env_name",),
        ),
        Scene(
            "search2qa",
            "Search2QA (multi-hop QA synthesis)",
            "A QA factory: explore the web from a seed and propose a multi-hop question, evolve it "
            "(long-to-short), check it in code, test it on a no-tool and a deep_search solver, and emit a "
            "deep_search task with the passing solver's run (apps/engines/scenes/search2qa, docs/search2qa.md).",
            _obj(
                {
                    "seed": {"type": "string", "minLength": 1},
                    "qa_mode": {"enum": ["question", "answer"]},
                    "max_evolutions": {"type": "integer", "minimum": 0, "maximum": 5},
                    "enable_evolution": {"type": "boolean"},
                    "web": _WEB,
                    "difficulty_check": {"enum": ["off", "no_tool", "full"]},
                    "uniqueness_check": {"type": "boolean"},
                    "max_answer_words": {"type": "integer", "minimum": 1, "maximum": 50},
                    "min_sources": {"type": "integer", "minimum": 1, "maximum": 10},
                    "quote_match": {"type": "number", "minimum": 0.5, "maximum": 1},
                    "stage_max_steps": {"type": "integer", "minimum": 1, "maximum": 100},
                    "solver_max_steps": {"type": "integer", "minimum": 1, "maximum": 100},
                    "emit": {"type": "boolean"},
                    "output_batch": {"type": "string", "minLength": 1, "maxLength": 200},
                },
                required=("seed",),
            ),
            defaults={"qa_mode": "question", "max_evolutions": 2, "enable_evolution": True, "difficulty_check": "full"},
            required_params=("seed", "qa_mode"),
        ),
        Scene(
            "toucan",
            "Toucan (MCP tool use)",
            "Questions synthesised for MCP servers' tools and answered by an agent calling them.",
            _obj(
                {
                    # registered MCP servers (manage.py mcp_register) whose tools the agent gets
                    "target_servers": {**_STR_LIST, "minItems": 1, "uniqueItems": True},
                    "target_tools": {"type": "array", "uniqueItems": True,
                                     "items": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]*__.+$"}},
                    "difficulty": {"enum": ["easy", "medium", "hard"]},
                    # apps/engines/scenes/toucan/quality.py: the target tools' order, conditions that do not gate the reward
                    "order": {"enum": ["strict", "any"]},
                    "relax": {"type": "array", "uniqueItems": True,
                              "items": {"enum": ["rule_filter", "target_tools", "tool_order"]}},
                    # apps/engines/scenes/toucan/quality.py: an answer check or a state check (a probe in the sandbox)
                    "check": {"oneOf": [
                        _obj({"type": {"const": "answer"}, "expected": {"type": ["string", "number"]},
                              "match": {"enum": ["exact", "contains", "number"]},
                              "tolerance": {"type": "number", "minimum": 0}}, required=("type", "expected")),
                        _obj({"type": {"const": "state"}, "probe": {"type": "string", "minLength": 1},
                              "expect": {"type": ["string", "number"]},
                              "match": {"enum": ["exact", "contains", "number"]},
                              "tolerance": {"type": "number", "minimum": 0}}, required=("type", "probe", "expect")),
                    ]},
                    "question_quality_assessment": {"type": "object"},
                    "generation": {"type": "object", "description": "how the question was made (pipeline, plan)"},
                    "image": _STR,
                },
            ),
            required_params=("target_servers",),
        ),
        Scene(
            "mobile_agent",
            "Mobile agent (Android)",
            "An agent operates Android apps (AndroidWorld's actions) on a simulated device or a real one "
            "through adbutils; checks on the device's state decide (apps/engines/scenes/mobile_agent, docs/mobile_agent.md).",
            _obj(
                {
                    "mode": {"enum": ["simulated", "device"]},  # explicit: never a fallback from one to the other
                    "initial_state": {"type": "object"},  # simulated only (sim/apps.py initial_state)
                    "device": _obj({
                        "provider": {"enum": ["endpoint", "opensandbox"]},
                        "adb_server": {"type": "string", "pattern": "^[^:]*:[0-9]{1,5}$"},
                        "serial": _STR,
                        "image": _STR,
                        "entrypoint": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                        "cpu": {"type": "number", "exclusiveMinimum": 0},
                        "memory_mb": {"type": "integer", "minimum": 1024},
                        "ime": {"enum": ["", "adbkeyboard"]},
                        "settle_s": {"type": "number", "minimum": 0, "maximum": 10},
                        "boot_timeout_s": {"type": "number", "exclusiveMinimum": 0},
                    }),
                    "reset": _STR_LIST,  # shell commands run before the first screen (pm clear …)
                    "start_app": _STR,
                    "checks": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["type"],
                        "properties": {"type": {"enum": ["shell", "content", "ui", "answer"]}}}},
                    "expect_status": {"enum": ["complete", "infeasible"]},
                    "provenance": {"type": "boolean"},  # numbers typed or answered must have been shown
                    "vision": {"type": "boolean"},
                    "tags": _STR_LIST,
                },
                required=("mode",),
            ),
            check="apps.engines.scenes.mobile_agent.runtime:check_config",
        ),
        Scene(
            "gui",
            "GUI (browser)",
            "An agent drives a real browser in the sandbox (MiniWoB++ pages, bundled web apps, or allowed "
            "external origins); the page's own reward, the app's state or the answer decides (docs/gui.md).",
            {**_obj(
                {
                    "source": {"enum": ["miniwob", "site", "url"]},
                    "task": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},  # a MiniWoB page name
                    "seed": {"type": "integer", "minimum": 0},
                    "utterance": _STR,  # the page's utterance for the seed (checked at set-up)
                    "site": {"enum": ["shop", "mail", "admin"]},
                    "site_data": {"type": "object"},
                    "start_path": {"type": "string", "pattern": "^/"},
                    "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
                    "start_url": {"type": "string", "pattern": "^https?://"},
                    "allowed_origins": {**_STR_LIST, "minItems": 1},
                    # apps/engines/scenes/gui/checks.py: one check or a list that must all pass
                    "check": {"oneOf": [
                        {"type": "object", "required": ["type"], "properties": {
                            "type": {"enum": ["miniwob", "js", "url", "program_html", "answer", "site_state"]}}},
                        {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["type"], "properties": {
                            "type": {"enum": ["miniwob", "js", "url", "program_html", "answer", "site_state"]}}}},
                    ]},
                    "vision": {"type": "boolean"},
                    "viewport": {"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 1920},
                                 "minItems": 2, "maxItems": 2},
                    "memory_mb": {"type": "integer", "minimum": 1024},
                    "image": _STR,
                },
            ), "allOf": [
                {"if": {"properties": {"source": {"const": "miniwob"}}, "required": ["source"]}, "then": {"required": ["task"]}},
                {"if": {"properties": {"source": {"const": "site"}}, "required": ["source"]}, "then": {"required": ["site"]}},
                {"if": {"properties": {"source": {"const": "url"}}, "required": ["source"]},
                 "then": {"required": ["start_url", "allowed_origins"]}},
            ]},
        ),
        Scene(
            "deep_search",
            "Deep search",
            "Multi-step research with web tools (search / open / find over the offline corpus or the live "
            "web) ending in a sourced answer graded by normalised exact match, or a report with checked "
            "citations (apps/engines/scenes/deep_search, docs/web.md).",
            _obj(
                {
                    "expected_answer": _STR,
                    "aliases": _STR_LIST,
                    "sources": {**_STR_LIST, "description": "gold source URLs (informative; not required to be cited)"},
                    "require_sources": {"type": "boolean", "description": "reward = EM x every cited URL was opened"},
                    "web": _WEB,
                    "output": {"enum": ["answer", "report"]},
                    "report": _obj({"min_words": {"type": "integer", "minimum": 0},
                                    "max_words": {"type": "integer", "minimum": 1},
                                    "min_sources": {"type": "integer", "minimum": 0}}),
                    "explore": {"type": "boolean", "description": "offer explore(question): a sub-episode that "
                                                                  "searches and reads, then summarises"},
                    "browse": {"type": "boolean", "description": "offer browse(url, question): a reader model reads "
                                                                 "the page (its tokens count in the episode's)"},
                    "explore_max_steps": {"type": "integer", "minimum": 1, "maximum": 50},
                    "generation": {"type": "object", "description": "how the question was made (search2qa gates, seed)"},
                }
            ),
            defaults={"require_sources": True, "output": "answer"},
        ),
        Scene(
            "multi_agent",
            "Multi-agent",
            "Several roles act in one base scene's environment (its sandbox, tools and verifier): a lead "
            "delegates to roles run as sub-episodes, or leads a round-robin discussion; each role's view "
            "is stored as a child trajectory (apps/engines/scenes/multi_agent/runtime.py, docs/multi_agent.md).",
            _obj(
                {
                    "base_scene": _STR,
                    "base_config": {"type": "object"},
                    "protocol": {"enum": ["delegate", "round_robin"]},
                    "roles": {"type": "array", "minItems": 1, "items": _obj({
                        "name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_-]{0,39}$"},
                        "system_prompt": _STR,
                        "description": _STR,
                        "tools": _STR_LIST,
                        "model": _STR,
                        "provider": _STR,
                        "max_steps": {"type": "integer", "minimum": 1, "maximum": 200},
                        "trainable": {"type": "boolean"},
                    }, required=("name",))},
                    "lead": _STR,
                    "max_rounds": {"type": "integer", "minimum": 1, "maximum": 20},
                    "consensus": {"enum": ["none", "all_agree"]},
                    "acting_role": _STR,
                },
                required=("base_scene", "roles", "lead"),
            ),
            defaults={"protocol": "delegate", "base_config": {}},
            required_params=("base_scene", "roles", "lead"),
            check="apps.engines.scenes.multi_agent.runtime:check_config",
        ),
    ]
}

SCENE_CHOICES: list[tuple[str, str]] = [(s.id, s.title) for s in SCENES.values()]


class SceneConfigError(ValueError):
    """A scene config that does not match its scene's schema; `errors` is a list of (field, reason)."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors))


def get_scene(scene_id: str) -> Scene:
    try:
        return SCENES[scene_id]
    except KeyError:
        raise KeyError(f"unknown scene {scene_id!r}; valid scenes: {', '.join(SCENES)}") from None


def validate_scene_config(scene_id: str, config: Any) -> dict[str, Any]:
    """Return the config with the scene's defaults filled in, or raise SceneConfigError."""
    scene = get_scene(scene_id)
    if not isinstance(config, dict):
        raise SceneConfigError([("config", f"must be a JSON object, got {type(config).__name__}")])
    errors = sorted(scene.validator().iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise SceneConfigError(
            [("config" + "".join(f".{p}" for p in e.absolute_path), e.message) for e in errors]
        )
    config = {**scene.defaults, **config}
    if scene.check:
        module, _, function = scene.check.partition(":")
        problems = getattr(importlib.import_module(module), function)(config)
        if problems:
            raise SceneConfigError(problems)
    return config
