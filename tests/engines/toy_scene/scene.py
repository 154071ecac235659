"""The toy scene's declaration (docs/new-scene.md): sums answered with an `add` tool."""
from __future__ import annotations

from apps.engines.runtime import GENERIC_RUBRIC, STR, Scene, schema_object

SCENE = Scene(
    "toy",
    "Toy (sums)",
    "Add two numbers with the add tool and finish with the sum; the verifier compares it with the expected one.",
    schema_object(
        {
            "a": {"type": "integer"},
            "b": {"type": "integer"},
            "expected": {"type": "integer"},
            "note": STR,
        },
        required=("a", "b"),
    ),
    defaults={"note": ""},
    required_params=("a", "b"),
    check="tests.engines.toy_scene.runtime:check_config",
    runtime="tests.engines.toy_scene.runtime:ToyRuntime",
    rubric={
        "arithmetic": "the sum is computed with the add tool, not guessed",
        "completeness": GENERIC_RUBRIC["completeness"],
    },
    rubric_version="2",
    docs="docs/new-scene.md",
)
