"""What the exporters and the interchange formats share: the raw record's schema version and the
task fields it carries, the render error, the check of an object's keys.

A module of its own, outside the exporters package: the interchange formats (ATIF, ADP,
mini-swe-agent) read and write lines with these without loading every exporter, and the
exporters' registry lists the interchange formats without an import cycle between the two
packages."""
from __future__ import annotations

from typing import Any

RAW_SCHEMA_VERSION = "trajplatform.raw/1"

# Task columns that define the task (its status and iteration counter are bookkeeping).
TASK_FIELDS = (
    "scene", "prompt", "external_id", "scene_config", "expected_tools", "model", "temperature", "top_p",
    "max_steps", "step_timeout_s", "timeout_s", "max_tokens", "system_prompt_extra", "max_iterations",
    "quality_threshold", "samples_per_iteration", "priority",
)


class RenderError(ValueError):
    """A record that cannot be expressed in a format; the message is the exclusion reason."""


def key_problems(obj: Any, required: set[str], optional: set[str] = frozenset(), where: str = "line") -> list[str]:
    """What is wrong with an object's keys: not an object, a required key missing, a key unexpected."""
    if not isinstance(obj, dict):
        return [f"{where}: must be an object"]
    problems = [f"{where}.{k}: missing" for k in sorted(required - obj.keys())]
    problems += [f"{where}.{k}: unexpected field" for k in sorted(obj.keys() - required - optional)]
    return problems
