"""The gui scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import GENERIC_RUBRIC, STR, STR_LIST, Scene, schema_object

SCENE = Scene(
    "gui",
    "GUI (browser)",
    "An agent drives a real browser in the sandbox (MiniWoB++ pages, bundled web apps, or allowed "
    "external origins); the page's own reward, the app's state or the answer decides (docs/gui.md).",
    {**schema_object(
        {
            "source": {"enum": ["miniwob", "site", "url"]},
            "task": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},  # a MiniWoB page name
            "seed": {"type": "integer", "minimum": 0},
            "utterance": STR,  # the page's utterance for the seed (checked at set-up)
            "site": {"enum": ["shop", "mail", "admin"]},
            "site_data": {"type": "object"},
            "start_path": {"type": "string", "pattern": "^/"},
            "port": {"type": "integer", "minimum": 1024, "maximum": 65535},
            "start_url": {"type": "string", "pattern": "^https?://"},
            "allowed_origins": {**STR_LIST, "minItems": 1},
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
            "image": STR,
        },
    ), "allOf": [
        {"if": {"properties": {"source": {"const": "miniwob"}}, "required": ["source"]}, "then": {"required": ["task"]}},
        {"if": {"properties": {"source": {"const": "site"}}, "required": ["source"]}, "then": {"required": ["site"]}},
        {"if": {"properties": {"source": {"const": "url"}}, "required": ["source"]},
         "then": {"required": ["start_url", "allowed_origins"]}},
    ]},
    runtime="apps.engines.scenes.gui.runtime:GuiRuntime",
    rubric={
        "ui_understanding": "reads the page correctly (elements, state, navigation)",
        "action_accuracy": "clicks and input hit the intended elements with correct values",
        "reasoning": GENERIC_RUBRIC["reasoning"],
        "completeness": GENERIC_RUBRIC["completeness"],
    },
    export_formats=("sft-openai-vision", "sharegpt-vision", "trl-vision"),
    docs="docs/gui.md",
    order=70,
)
