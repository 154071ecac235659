"""The multi_agent scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import GENERIC_RUBRIC, STR, STR_LIST, Scene, schema_object

SCENE = Scene(
    "multi_agent",
    "Multi-agent",
    "Several roles act in one base scene's environment (its sandbox, tools and verifier): a lead "
    "delegates to roles run as sub-episodes, or leads a round-robin discussion; each role's view "
    "is stored as a child trajectory (apps/engines/scenes/multi_agent/runtime.py, docs/multi_agent.md).",
    schema_object(
        {
            "base_scene": STR,
            "base_config": {"type": "object"},
            "protocol": {"enum": ["delegate", "round_robin"]},
            "roles": {"type": "array", "minItems": 1, "items": schema_object({
                "name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_-]{0,39}$"},
                "system_prompt": STR,
                "description": STR,
                "tools": STR_LIST,
                "model": STR,
                "provider": STR,
                "max_steps": {"type": "integer", "minimum": 1, "maximum": 200},
                "trainable": {"type": "boolean"},
            }, required=("name",))},
            "lead": STR,
            "max_rounds": {"type": "integer", "minimum": 1, "maximum": 20},
            "consensus": {"enum": ["none", "all_agree"]},
            "acting_role": STR,
        },
        required=("base_scene", "roles", "lead"),
    ),
    defaults={"protocol": "delegate", "base_config": {}},
    required_params=("base_scene", "roles", "lead"),
    check="apps.engines.scenes.multi_agent.runtime:check_config",
    runtime="apps.engines.scenes.multi_agent.runtime:MultiAgentRuntime",
    rubric={
        **GENERIC_RUBRIC,
        "coordination": "sub-agents get clear sub-tasks and their results are combined",
    },
    export_formats=("multiagent-agentjet",),
    docs="docs/multi_agent.md",
    order=90,
)
