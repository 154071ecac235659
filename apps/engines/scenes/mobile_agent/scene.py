"""The mobile_agent scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import EFFICIENCY_CRITERION, GENERIC_RUBRIC, STR, STR_LIST, Scene, schema_object

SCENE = Scene(
    "mobile_agent",
    "Mobile agent (Android)",
    "An agent operates Android apps (AndroidWorld's actions) on a simulated device or a real one "
    "through adbutils; checks on the device's state decide (apps/engines/scenes/mobile_agent, docs/mobile_agent.md).",
    schema_object(
        {
            "mode": {"enum": ["simulated", "device"]},  # explicit: never a fallback from one to the other
            "initial_state": {"type": "object"},  # simulated only (sim/apps.py initial_state)
            "device": schema_object({
                "provider": {"enum": ["endpoint", "opensandbox"]},
                "adb_server": {"type": "string", "pattern": "^[^:]*:[0-9]{1,5}$"},
                "serial": STR,
                "image": STR,
                "entrypoint": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                "cpu": {"type": "number", "exclusiveMinimum": 0},
                "memory_mb": {"type": "integer", "minimum": 1024},
                "ime": {"enum": ["", "adbkeyboard"]},
                "settle_s": {"type": "number", "minimum": 0, "maximum": 10},
                "boot_timeout_s": {"type": "number", "exclusiveMinimum": 0},
            }),
            "reset": STR_LIST,  # shell commands run before the first screen (pm clear …)
            "start_app": STR,
            "checks": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["type"],
                "properties": {"type": {"enum": ["shell", "content", "ui", "answer"]}}}},
            "expect_status": {"enum": ["complete", "infeasible"]},
            "provenance": {"type": "boolean"},  # numbers typed or answered must have been shown
            "vision": {"type": "boolean"},
            "tags": STR_LIST,
        },
        required=("mode",),
    ),
    check="apps.engines.scenes.mobile_agent.runtime:check_config",
    runtime="apps.engines.scenes.mobile_agent.runtime:MobileRuntime",
    rubric={
        "ui_understanding": "reads the screen / UI tree correctly (elements, state, navigation)",
        "action_accuracy": "taps, swipes and text input hit the intended elements with correct values",
        "reasoning": GENERIC_RUBRIC["reasoning"],
        "completeness": "the app ends in the state the task asks for",
        **EFFICIENCY_CRITERION,
    },
    export_formats=("aitw", "sft-openai-vision", "sharegpt-vision", "trl-vision"),
    docs="docs/mobile_agent.md",
    order=60,
)
