"""search2qa twins: the bundled factory runs (examples/search2qa over the Debian corpus), and pairs
that pass for verified while their answer or a fact of their evidence is not the pages'.

The scene's verdict (apps/engines/scenes/search2qa/runtime.py): reward 1 exactly when every gate passed;
the code gates (gates.py) decide these twins: `answer_in_evidence` (an opened evidence page holds
the answer), `evidence_quotes` (each quote's numbers and names exactly as its page has them) and
`answer_not_in_question` (possessives and punctuation folded). Each twin keeps the bundled
explore path and changes only the pair; its scene_config drops the evolve rounds (whose scripts
would put the bundled pair back) and keeps the no-tool difficulty stage, so a twin that slipped
through the code gates would be scored 1.

Not applicable here: another page or task solved, injected script and a fooled state check (no
browser, no state); a value used before it was asked for (no ask_user). Evidence cited but never
opened, a quote no page has and an answer leaked verbatim are tests/engines/test_search2qa.py's
(`evidence_opened`, `evidence_quotes`, `answer_not_in_question` on the tiny corpus); the
emitted task's solver is deep_search's verifier, whose twins are test_deep_search.py's."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from apps.engines.scenes.search2qa.prompts import seed_slug
from tests.engines.test_web_corpus import debian_corpus

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "search2qa"
ROWS = {r["config"]["seed"]: r for r in map(json.loads, (EXAMPLES / "tasks.jsonl").read_text().splitlines()) if r}
SCRIPTS = json.loads((EXAMPLES / "scripts.json").read_text())
SOLVER_PROMPTS = {s["id"]: s["prompt"] for s in SCRIPTS}
# What `make demo` promises (Makefile: "3 verified QA pairs and one dropped as too easy").
VERIFIED = {"Ada Lovelace": "Teignmouth", "TMRC": "TMRC", "asyncio TaskGroup": "PEP 654"}


@pytest.fixture(autouse=True)
def corpus_settings(settings: Any) -> None:
    settings.WEB_CORPUS_DIR = debian_corpus().path.parent


def factory(scripted_episode: Any, seed: str, steps: list[dict[str, Any]] | None = None, **scene: Any) -> Any:
    row = ROWS[seed]
    return scripted_episode("search2qa", row["prompt"], {**row["config"], "emit": False, **scene},
                            row["reference_solution"] if steps is None else steps, scripts=SCRIPTS,
                            sandbox_backend=None, max_steps=row["max_steps"], timeout_s=row["timeout_s"])


def twin(scripted_episode: Any, seed: str, decided_by: str, **changes: Any) -> dict[str, Any]:
    """The seed's bundled explore path ending in its pair with `changes`, refused by the gate
    `decided_by` (the first that failed); the gates by name."""
    steps = copy.deepcopy(ROWS[seed]["reference_solution"])
    steps[-1]["tool_calls"][0]["arguments"].update(changes)
    result = factory(scripted_episode, seed, steps, max_evolutions=0, difficulty_check="no_tool")
    assert result.reward == 0.0 and result.outcome == "failure", result.verifier_output
    assert result.verifier_output["decided_by"] == decided_by, result.verifier_output["failed"]
    return {g["name"]: g for g in result.verifier_output["gates"]}


def bundled_pair(seed: str) -> dict[str, Any]:
    return ROWS[seed]["reference_solution"][-1]["tool_calls"][0]["arguments"]


def test_the_bundled_factory_runs_still_verify_the_same_pairs(scripted_episode: Any) -> None:
    for seed in ROWS:
        result = factory(scripted_episode, seed)
        out = result.verifier_output
        if seed in VERIFIED:
            assert result.reward == 1.0, (seed, out["failed"], out["gates"])
            assert out["qa"]["answer"] == VERIFIED[seed]
            # the last evolved question: the one the bundled deep_search solver's script answers
            assert out["qa"]["question"] == SOLVER_PROMPTS[f"search2qa-solve-{seed_slug(seed)}"]
            assert [g["name"] for g in out["gates"] if not g["passed"]] == []
            assert all(c["ok"] for c in out["process"].values()) and out["decided_by"] == "gates"
        else:  # foo: a model answers it from memory
            assert result.reward == 0.0 and out["failed"] == ["no_tool_fails"], (seed, out["gates"])


def test_an_invented_answer_with_true_quotes_scores_zero(scripted_episode: Any) -> None:
    # Every quote is Lovelace's and Babbage's pages' own text; the birthplace is not.
    gates = twin(scripted_episode, "Ada Lovelace", "answer_in_evidence", answer="Exeter")
    assert gates["evidence_quotes"]["passed"] and gates["distinct_pages"]["passed"]
    assert not gates["answer_in_evidence"]["passed"]
    assert gates["answer_in_evidence"]["reason"] == (
        "no opened evidence page (2 checked) contains the answer 'Exeter' or an alias")


def test_a_quote_with_its_year_changed_scores_zero(scripted_episode: Any) -> None:
    evidence = copy.deepcopy(bundled_pair("Ada Lovelace")["evidence"])
    assert "1791" in evidence[1]["quote"]
    evidence[1]["quote"] = evidence[1]["quote"].replace("1791", "1792")
    gates = twin(scripted_episode, "Ada Lovelace", "evidence_quotes", evidence=evidence)
    quotes = gates["evidence_quotes"]
    assert not quotes["passed"] and quotes["items"][1]["changed"] == ["1792"] and quotes["items"][1]["score"] == 0.0
    assert "the page does not say '1792' there" in quotes["reason"]
    assert gates["answer_in_evidence"]["passed"]  # the answer itself is the page's


def test_an_answer_leaked_as_a_possessive_scores_zero(scripted_episode: Any) -> None:
    question = ("Emergency-power-off switches are named with a backronym credited to Enrico Fermi. Which MIT club "
                "called them foo switches, as TMRC's own dictionary records?")
    gates = twin(scripted_episode, "TMRC", "answer_not_in_question", question=question)
    assert not gates["answer_not_in_question"]["passed"]
    assert gates["answer_not_in_question"]["reason"] == "the question contains the answer 'TMRC'"
    assert gates["no_tool_fails"]["reason"].startswith("not run")
