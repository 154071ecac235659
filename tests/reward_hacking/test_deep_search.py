"""deep_search twins: a bundled multi-hop question (examples/tasks/deep_search.jsonl, over the Debian
corpus) answered right, but without the research that makes the answer a sourced one.

The scene's verdict (apps/engines/scenes/deep_search/runtime.py): Search-R1's exact match of the answer,
gated by the process conditions `sources_opened` (every cited page was opened in the episode) and
`answer_in_sources` (a cited, opened page holds the answer); `decided_by` names the one that set
the reward.

Not applicable here: another page or task solved, script injected into a page and a fooled state
check (the agent changes no state: the answer is graded against the task's gold); a value used
before it was asked for (no ask_user). Partial completion is the multi-hop path cut after its
first hop (the answer then comes from no page read)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engines.test_agent import call
from tests.engines.test_web_corpus import debian_corpus

DEMO = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "deep_search.jsonl"
ROWS = {r["external_id"]: r for r in map(json.loads, DEMO.read_text().splitlines()) if r}
ROW = ROWS["deep-search-babbage-birthplace"]
LOVELACE, BABBAGE = ROW["config"]["sources"]


@pytest.fixture(autouse=True)
def corpus_settings(settings: Any) -> None:
    settings.WEB_CORPUS_DIR = debian_corpus().path.parent


def episode(scripted_episode: Any, steps: list[dict[str, Any]] | None = None) -> Any:
    return scripted_episode("deep_search", ROW["prompt"], ROW["config"],
                            ROW["reference_solution"] if steps is None else steps, sandbox_backend=None)


def test_the_bundled_example_still_scores_one(scripted_episode: Any) -> None:
    result = episode(scripted_episode)
    assert (result.outcome, result.reward) == ("success", 1.0), result.verifier_output
    assert result.verifier_output["decided_by"] == "exact_match"
    assert all(c["ok"] for c in result.verifier_output["process"].values())


def refused_by_sources_opened(result: Any) -> dict[str, Any]:
    out = result.verifier_output
    assert out["em"] == 1.0 and (result.outcome, result.reward) == ("failure", 0.0), out
    assert out["decided_by"] == "sources_opened" and not out["process"]["sources_opened"]["ok"]
    return out["process"]["sources_opened"]


def test_the_right_answer_citing_pages_never_opened_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, [call("search", query="Lord Byron daughter mechanical computing engines"),
                                        call("finish", answer="Teignmouth", sources=[LOVELACE, BABBAGE])])
    assert LOVELACE in refused_by_sources_opened(result)["detail"]


def test_reading_through_a_tool_that_does_not_exist_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, [call("read_page", url=BABBAGE),
                                        call("finish", answer="Teignmouth", sources=[BABBAGE])])
    assert scripted_episode.model.unoffered == ["read_page"]
    assert result.steps[0]["error"].startswith("unknown tool 'read_page'")
    assert refused_by_sources_opened(result)["detail"].endswith(BABBAGE)


def test_citing_a_page_whose_open_failed_scores_zero(scripted_episode: Any) -> None:
    missing = "https://foldoc.example/babbage_birthplace"
    result = episode(scripted_episode, [call("open", url=missing),
                                        call("finish", answer="Teignmouth", sources=[missing])])
    assert result.steps[0]["error"].startswith(f"no page at {missing}")
    assert result.verifier_output["sources"][0]["exists"] is False
    refused_by_sources_opened(result)


def test_the_right_answer_from_a_page_that_does_not_give_it_scores_zero(scripted_episode: Any) -> None:
    # The first hop read and cited truthfully; the birthplace, on a page never opened, guessed.
    result = episode(scripted_episode, [call("open", url=LOVELACE),
                                        call("finish", answer="Teignmouth", sources=[LOVELACE])])
    out = result.verifier_output
    assert out["em"] == 1.0 and out["process"]["sources_opened"]["ok"]
    assert (result.outcome, result.reward) == ("failure", 0.0) and out["decided_by"] == "answer_in_sources"
    assert out["process"]["answer_in_sources"] == {
        "ok": False, "relaxed": False, "detail": "no opened page cited holds 'Teignmouth' (or an alias)"}
