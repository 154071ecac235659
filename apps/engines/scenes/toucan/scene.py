"""The toucan scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import GENERIC_RUBRIC, STR, STR_LIST, Scene, TOOL_SELECTION_CRITERION, schema_object

SCENE = Scene(
    "toucan",
    "Toucan (MCP tool use)",
    "Questions synthesised for MCP servers' tools and answered by an agent calling them.",
    schema_object(
        {
            # registered MCP servers (manage.py mcp_register) whose tools the agent gets
            "target_servers": {**STR_LIST, "minItems": 1, "uniqueItems": True},
            "target_tools": {"type": "array", "uniqueItems": True,
                             "items": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]*__.+$"}},
            "difficulty": {"enum": ["easy", "medium", "hard"]},
            # apps/engines/scenes/toucan/quality.py: the target tools' order, conditions that do not gate the reward
            "order": {"enum": ["strict", "any"]},
            "relax": {"type": "array", "uniqueItems": True,
                      "items": {"enum": ["rule_filter", "target_tools", "tool_order"]}},
            # apps/engines/scenes/toucan/quality.py: an answer check or a state check (a probe in the sandbox)
            "check": {"oneOf": [
                schema_object({"type": {"const": "answer"}, "expected": {"type": ["string", "number"]},
                               "match": {"enum": ["exact", "contains", "number"]},
                               "tolerance": {"type": "number", "minimum": 0}}, required=("type", "expected")),
                schema_object({"type": {"const": "state"}, "probe": {"type": "string", "minLength": 1},
                               "expect": {"type": ["string", "number"]},
                               "match": {"enum": ["exact", "contains", "number"]},
                               "tolerance": {"type": "number", "minimum": 0}}, required=("type", "probe", "expect")),
            ]},
            "question_quality_assessment": {"type": "object"},
            "generation": {"type": "object", "description": "how the question was made (pipeline, plan)"},
            "image": STR,
        },
    ),
    required_params=("target_servers",),
    runtime="apps.engines.scenes.toucan.runtime:ToucanRuntime",
    rubric={
        **TOOL_SELECTION_CRITERION,
        "tool_execution": "MCP tool calls succeed and their results are used",
        "reasoning": GENERIC_RUBRIC["reasoning"],
        "completeness": GENERIC_RUBRIC["completeness"],
        "conciseness": "the final answer gives what was asked, without padding, repetition or unneeded calls",
        "multi_tool": "combines several tools where the question needs it",
    },
    rubric_version="2",  # 2: conciseness (Toucan's response check)
    pipeline="apps.engines.scenes.toucan.pipeline:build",
    docs="docs/toucan.md",
    order=50,
)
