"""The toolace scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import GENERIC_RUBRIC, STR, STR_LIST, Scene, TOOL_SELECTION_CRITERION, schema_object

SCENE = Scene(
    "toolace",
    "ToolACE (synthetic tool use)",
    "Tool-calling dialogues over synthesized tool suites that execute (an envscaler environment in "
    "the sandbox), with a simulated user answering clarification turns; agent or ToolACE-MT mode "
    "(apps/engines/scenes/toolace, docs/toolace.md).",
    schema_object(
        {
            # the suite as an envscaler environment (see "envscaler")
            "env_name": STR, "class_name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
            "env_description": STR, "code": STR, "init_config": {"type": "object"}, "check_func": STR,
            "operations": {"type": "array", "items": schema_object(
                {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "description": STR,
                 "parameters": {"type": "object"}}, required=("name", "parameters"))},
            "task_id": STR, "suite": STR, "image": STR,
            "task_type": {"enum": ["single", "parallel", "dependent", "missing_param", "non_tool"]},
            "mode": {"enum": ["agent", "mt"]},
            "expected_calls": {"type": "array", "items": schema_object(
                {"tool": STR, "arguments": {"type": "object"}}, required=("tool", "arguments"))},
            # what only the user knows: {name: value} or {name: {"value", "aliases"}}
            "user_facts": {"type": "object"},
            "missing_params": STR_LIST,
            "expected_answer": STR,
            "follow_ups": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "persona": STR,
            "user_simulator": schema_object({"kind": {"enum": ["deterministic", "llm"]}, "model": STR,
                                             "prompt": STR}, required=("kind",)),
            "refine_rounds": {"type": "integer", "minimum": 0, "maximum": 5},
            "generation": {"type": "object"},
        },
        required=("env_name", "code", "operations"),
    ),
    required_params=("env_name",),
    runtime="apps.engines.scenes.toolace.runtime:ToolAceRuntime",
    rubric={
        **TOOL_SELECTION_CRITERION,
        "param_accuracy": "arguments are complete and correct; missing ones are asked for, not invented",
        "reasoning": GENERIC_RUBRIC["reasoning"],
        "error_handling": GENERIC_RUBRIC["error_handling"],
        "completeness": GENERIC_RUBRIC["completeness"],
    },
    pipeline="apps.engines.scenes.toolace.pipeline:build",
    docs="docs/toolace.md",
    order=30,
)
