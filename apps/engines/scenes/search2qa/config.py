"""A search2qa task's settings: its scene_config over the scene's defaults (the runtime's stages
and the emitted task both read them)."""
from __future__ import annotations

from typing import Any

DEFAULTS = {
    "qa_mode": "question", "max_evolutions": 2, "enable_evolution": True, "difficulty_check": "full",
    "uniqueness_check": False, "max_answer_words": 12, "min_sources": 2, "quote_match": 0.9,
    "stage_max_steps": 12, "solver_max_steps": 12, "emit": True,
}


def settings_of(config: dict[str, Any]) -> dict[str, Any]:
    return {**DEFAULTS, **(config.get("scene_config") or {})}
