"""The toy scene's runtime: no sandbox, one tool (`add`), and a verifier on the final answer."""
from __future__ import annotations

from typing import Any

from apps.engines.runtime import SceneRuntime, ToolError, ToolResult


def check_config(config: dict[str, Any]) -> list[tuple[str, str]]:
    """What the schema cannot say: an expected sum must be the sum."""
    if "expected" in config and config["expected"] != config["a"] + config["b"]:
        return [("config.expected", f"is not {config['a']} + {config['b']}")]
    return []


def _fn(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}}}


TOOLS = [
    _fn("add", "a + b", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
    _fn("finish", "End with the sum.", {"answer": {"type": "string"}}),
]


class ToyRuntime(SceneRuntime):
    scene_id = "toy"

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        return TOOLS

    def system_prompt(self, config: dict[str, Any]) -> str:
        return "Add the two numbers of the task with the add tool, then call finish with the sum."

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float) -> ToolResult:
        if name != "add":
            raise ToolError(f"unknown tool {name!r}")
        return ToolResult(output=str(args["a"] + args["b"]))

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        scene = config.get("scene_config") or {}
        expected = scene["a"] + scene["b"]
        return (1.0 if final_answer.strip() == str(expected) else 0.0), {"expected": expected}
