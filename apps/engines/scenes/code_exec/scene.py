"""The code_exec scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import FILES, STR, Scene, schema_object

SCENE = Scene(
    "code_exec",
    "Code execution",
    "An agent writes and runs code with shell and file tools in a sandbox; an optional "
    "verifier (files + check command) decides the reward.",
    schema_object(
        {
            "image": STR,
            "setup_files": FILES,
            "verifier": schema_object(
                {"files": FILES, "hidden_files": FILES, "command": STR, "partial_credit": {"type": "boolean"},
                 "timeout": {"type": "number", "exclusiveMinimum": 0}},
                required=("command",),
            ),
        }
    ),
    runtime="apps.engines.scenes.code_exec.runtime:CodeExecRuntime",
    docs="docs/code_exec.md",
    order=10,
)
