"""The envscaler scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import (
    EFFICIENCY_CRITERION,
    GENERIC_RUBRIC,
    STR,
    TOOL_SELECTION_CRITERION,
    Scene,
    schema_object,
)

SCENE = Scene(
    "envscaler",
    "EnvScaler (stateful MCP environments)",
    "A stateful domain environment served over MCP in the sandbox; a check function on the "
    "final state decides the reward.",
    schema_object(
        {
            "env_name": STR,
            "class_name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
            "env_description": STR,
            "code": STR,
            "operations": {
                "type": "array",
                "items": schema_object(
                    {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                     "description": STR, "parameters": {"type": "object"}},
                    required=("name", "parameters"),
                ),
            },
            "init_config": {"type": "object"},
            "check_func": STR,
            "task_id": STR,
            "image": STR,
        },
        required=("env_name",),
    ),
    required_params=("env_name",),
    runtime="apps.engines.scenes.envscaler.runtime:EnvScalerRuntime",
    rubric={
        **TOOL_SELECTION_CRITERION,
        "tool_execution": "calls succeed: valid arguments, correct order, state changes as intended",
        "reasoning": GENERIC_RUBRIC["reasoning"],
        "completeness": "the environment ends in the state the task asks for",
        **EFFICIENCY_CRITERION,
    },
    docs="docs/envscaler.md",
    order=20,
)
