"""The search2qa scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import GENERIC_RUBRIC, Scene, schema_object
from apps.engines.scenes.deep_search.scene import WEB

SCENE = Scene(
    "search2qa",
    "Search2QA (multi-hop QA synthesis)",
    "A QA factory: explore the web from a seed and propose a multi-hop question, evolve it "
    "(long-to-short), check it in code, test it on a no-tool and a deep_search solver, and emit a "
    "deep_search task with the passing solver's run (apps/engines/scenes/search2qa, docs/search2qa.md).",
    schema_object(
        {
            "seed": {"type": "string", "minLength": 1},
            "qa_mode": {"enum": ["question", "answer"]},
            "max_evolutions": {"type": "integer", "minimum": 0, "maximum": 5},
            "enable_evolution": {"type": "boolean"},
            "web": WEB,
            "difficulty_check": {"enum": ["off", "no_tool", "full"]},
            "uniqueness_check": {"type": "boolean"},
            "max_answer_words": {"type": "integer", "minimum": 1, "maximum": 50},
            "min_sources": {"type": "integer", "minimum": 1, "maximum": 10},
            "quote_match": {"type": "number", "minimum": 0.5, "maximum": 1},
            "stage_max_steps": {"type": "integer", "minimum": 1, "maximum": 100},
            "solver_max_steps": {"type": "integer", "minimum": 1, "maximum": 100},
            "emit": {"type": "boolean"},
            "output_batch": {"type": "string", "minLength": 1, "maxLength": 200},
        },
        required=("seed",),
    ),
    defaults={"qa_mode": "question", "max_evolutions": 2, "enable_evolution": True, "difficulty_check": "full"},
    required_params=("seed", "qa_mode"),
    runtime="apps.engines.scenes.search2qa.runtime:Search2QARuntime",
    rubric={
        "search_quality": "queries and crawls find relevant, trustworthy sources",
        "answer_accuracy": "the answer is correct, single and supported by the sources",
        "cross_source_reasoning": "facts from several sources are combined correctly",
        "reasoning": GENERIC_RUBRIC["reasoning"],
        "completeness": GENERIC_RUBRIC["completeness"],
    },
    export_formats=("qa", "qa-verl"),
    docs="docs/search2qa.md",
    order=40,
)
