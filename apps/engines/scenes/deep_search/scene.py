"""The deep_search scene's declaration: what the platform knows about it (collected by apps/engines/registry.py)."""
from __future__ import annotations

from apps.engines.runtime import GENERIC_RUBRIC, STR, STR_LIST, Scene, schema_object

# The web toolset's settings (apps/engines/web, docs/web.md): the offline corpus (default) or the live web.
WEB = schema_object({"backend": {"enum": ["corpus", "live"]},
                     "corpus": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]{0,63}$"}})

SCENE = Scene(
    "deep_search",
    "Deep search",
    "Multi-step research with web tools (search / open / find over the offline corpus or the live "
    "web) ending in a sourced answer graded by normalised exact match, or a report with checked "
    "citations (apps/engines/scenes/deep_search, docs/web.md).",
    schema_object(
        {
            "expected_answer": STR,
            "aliases": STR_LIST,
            "sources": {**STR_LIST, "description": "gold source URLs (informative; not required to be cited)"},
            "require_sources": {"type": "boolean", "description": "reward = EM x every cited URL was opened"},
            "web": WEB,
            "output": {"enum": ["answer", "report"]},
            "report": schema_object({"min_words": {"type": "integer", "minimum": 0},
                                     "max_words": {"type": "integer", "minimum": 1},
                                     "min_sources": {"type": "integer", "minimum": 0}}),
            "explore": {"type": "boolean", "description": "offer explore(question): a sub-episode that "
                                                          "searches and reads, then summarises"},
            "browse": {"type": "boolean", "description": "offer browse(url, question): a reader model reads "
                                                         "the page (its tokens count in the episode's)"},
            "explore_max_steps": {"type": "integer", "minimum": 1, "maximum": 50},
            "generation": {"type": "object", "description": "how the question was made (search2qa gates, seed)"},
        }
    ),
    defaults={"require_sources": True, "output": "answer"},
    runtime="apps.engines.scenes.deep_search.runtime:DeepSearchRuntime",
    rubric={
        "search_quality": "queries and reading find relevant, trustworthy sources",
        "answer_accuracy": "the answer is correct and supported by the sources",
        "reasoning": GENERIC_RUBRIC["reasoning"],
        "completeness": GENERIC_RUBRIC["completeness"],
    },
    export_formats=("qa", "qa-verl"),
    docs="docs/web.md",  # its section "The deep_search scene", beside the web toolset it runs on
    order=80,
)
