"""The search2qa factory driven end to end: the shared loop, the offline scripted model over loopback
HTTP and the tiny corpus (tests/engines/test_web_corpus.py). Every gate on a passing and a failing
run the real loop produced: the explore episode, its evolve / no-tool sub-episodes, the code gates."""
from __future__ import annotations

from typing import Any

import pytest

from apps.engines.offline_model import running_offline_model
from apps.engines.scenes.search2qa import gates as G
from apps.engines.offline_model import script_key
from apps.engines.scenes.search2qa.prompts import stage_route
from tests.engines.test_agent import call, client, config_for, llm_env, run  # noqa: F401 (a fixture)
from tests.engines.test_web_corpus import build_tiny_corpus
from tests.engines.test_web_live import fake_web  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("llm_env")]

LOVELACE = "https://tiny.example/people/lovelace.html"
ADA = "https://tiny.example/languages/ada.md"
BABBAGE = "https://tiny.example/people/babbage.html"
QUESTION = "The programming language named after Lord Byron's daughter was first standardised in which year?"
EVIDENCE = [{"url": LOVELACE, "quote": "The programming language Ada is named after her."},
            {"url": ADA, "quote": "Ada is a structured, statically typed language, first standardised in 1983"}]
EVOLVED = "A language named after a poet's daughter who worked on an analytical engine was standardised when?"


@pytest.fixture(autouse=True)
def tiny_web(tmp_path: Any, settings: Any) -> None:
    settings.WEB_CORPUS_DIR = tmp_path / "corpora"
    build_tiny_corpus(settings.WEB_CORPUS_DIR)
    settings.WEB_CORPUS_DEFAULT = "tiny"


def qa(question: str = QUESTION, answer: str = "1983", evidence: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"question": question, "answer": answer, "evidence": evidence or EVIDENCE,
            "reasoning": "Ada is named after Lovelace; the Ada page gives the year."}


def explore(prompt: str, proposal: dict[str, Any], opens: tuple[str, ...] = (LOVELACE, ADA)) -> dict[str, Any]:
    return {"id": f"explore-{prompt}", "prompt": prompt, "reference_solution": [
        call("search", "start from the seed", query="Ada Lovelace"),
        *[call("open", url=url) for url in opens],
        call("propose_qa", **proposal),
    ]}


def evolve(seed: str, round_: int, proposal: dict[str, Any], opens: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"id": f"evolve-{seed}-{round_}", "prompt": script_key(stage_route("evolve", seed, round_)), "reference_solution": [
        *[call("open", url=url) for url in opens],
        call("evolve_qa", **{k: v for k, v in proposal.items() if k != "reasoning"},
             changed=["the poet's name became a description"]),
    ]}


def no_tool(seed: str, answer: str) -> dict[str, Any]:
    return {"id": f"no-tool-{seed}", "prompt": script_key(stage_route("no_tool", seed, 0)),
            "reference_solution": [call("answer", answer=answer)]}


def factory(seed: str, scripts: list[dict[str, Any]], **scene: Any) -> Any:
    scene = {"seed": seed, "max_evolutions": 0, "difficulty_check": "no_tool", "emit": False, **scene}
    prompt = scripts[0]["prompt"]
    with running_offline_model(scripts=scripts) as server:
        return run(config_for(prompt, scene_config=scene, scene="search2qa", max_steps=10), client(server.url))


def gates(result: Any) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in result.verifier_output["gates"]}


def test_a_pair_that_passes_every_gate_gets_reward_one_with_each_gate_listed() -> None:
    seed = "tiny pass"
    result = factory(seed, [explore("[s2q] explore the seed tiny pass", qa()),
                            evolve(seed, 1, qa(EVOLVED), opens=(BABBAGE,)), no_tool(seed, "1980")],
                     max_evolutions=1)
    assert result.outcome == "success", result.outcome_reason
    assert result.reward == 1.0
    out = result.verifier_output
    assert [g["name"] for g in out["gates"]] == ["evolution", "answer_not_in_question", "short_answer",
                                                 "evidence_opened", "evidence_quotes", "distinct_pages",
                                                 "answer_in_evidence", "no_tool_fails"]
    assert all(g["passed"] and g["reason"] for g in out["gates"])
    assert out["passed"] == out["total"] == 8 and out["failed"] == []
    assert gates(result)["answer_in_evidence"]["pages"] == [ADA]
    assert out["process"] == {"sources_opened": {"ok": True, "detail": "", "relaxed": False},
                              "answer_in_sources": {"ok": True, "detail": "", "relaxed": False}}
    # The last round's pair is the product; each round is kept with the pages it opened.
    assert out["qa"]["question"] == EVOLVED and out["qa"]["answer"] == "1983"
    assert [r["stage"] for r in out["rounds"]] == ["explore", "evolve"]
    assert out["rounds"][0]["opened"] == sorted([LOVELACE, ADA]) and out["rounds"][1]["opened"] == [BABBAGE]
    assert out["opened"] == sorted([LOVELACE, ADA, BABBAGE])
    assert gates(result)["distinct_pages"]["pages"] == sorted([LOVELACE, ADA])
    # The stages were sub-episodes of the same loop: their steps, outcomes and tokens are kept.
    assert [s["label"] for s in out["stages"]] == ["evolve-1", "no-tool"]
    assert out["stages"][0]["tools"] == ["open", "evolve_qa"] and out["stages"][0]["opened"] == [BABBAGE]
    assert out["stages"][1]["final_answer"] == "1980"
    assert result.llm_calls == 4 + 2 + 1  # explore, evolve, no-tool
    assert [s["tool"] for s in result.steps] == ["search", "open", "open", "propose_qa"]
    assert result.steps[0]["results"][0]["url"] == LOVELACE  # the web toolset's step extras


def test_an_answer_leaked_into_the_question_fails_and_the_solvers_are_not_run() -> None:
    seed = "tiny leak"
    leaked = qa("Which year, 1983, saw the language named after Lord Byron's daughter standardised?")
    result = factory(seed, [explore("[s2q] explore the seed tiny leak", leaked), no_tool(seed, "1980")])
    assert result.outcome == "failure" and result.reward == 0.0
    g = gates(result)
    assert not g["answer_not_in_question"]["passed"]
    assert g["answer_not_in_question"]["reason"] == "the question contains the answer '1983'"
    assert g["evidence_quotes"]["passed"] and g["distinct_pages"]["passed"]
    assert not g["no_tool_fails"]["passed"] and g["no_tool_fails"]["reason"].startswith("not run")
    assert result.verifier_output["stages"] == []
    assert "answer_not_in_question" in result.outcome_reason


def test_a_quote_from_a_page_never_opened_fails_the_evidence_gates() -> None:
    seed = "tiny unopened"
    cited = qa(evidence=[EVIDENCE[0], {"url": BABBAGE, "quote": "Charles Babbage designed the Difference Engine"}])
    result = factory(seed, [explore("[s2q] explore the seed tiny unopened", cited), no_tool(seed, "1980")])
    assert result.reward == 0.0
    g = gates(result)
    assert not g["evidence_opened"]["passed"] and g["evidence_opened"]["missing"] == [BABBAGE]
    assert not g["evidence_quotes"]["passed"]
    assert "its page was never opened" in g["evidence_quotes"]["reason"]
    # Only one page's quote is supported: not multi-hop.
    assert not g["distinct_pages"]["passed"] and g["distinct_pages"]["pages"] == [LOVELACE]


def test_a_quote_the_page_does_not_contain_fails_even_when_the_page_was_opened() -> None:
    seed = "tiny misquote"
    made_up = qa(evidence=[EVIDENCE[0], {"url": ADA, "quote": "Ada became a standard in the spring of 1983"}])
    result = factory(seed, [explore("[s2q] explore the seed tiny misquote", made_up), no_tool(seed, "1980")])
    g = gates(result)
    assert g["evidence_opened"]["passed"]
    assert not g["evidence_quotes"]["passed"] and "matches the page only" in g["evidence_quotes"]["reason"]
    assert result.reward == 0.0


def test_a_question_the_no_tool_solver_answers_fails_the_difficulty_gate() -> None:
    seed = "tiny easy"
    result = factory(seed, [explore("[s2q] explore the seed tiny easy", qa()), no_tool(seed, "It was 1983.")])
    g = gates(result)
    assert all(g[n]["passed"] for n in ("answer_not_in_question", "evidence_quotes", "distinct_pages"))
    assert not g["no_tool_fails"]["passed"]
    # Not an exact match, but the answer is in it: the solver knew it.
    assert g["no_tool_fails"]["reason"] == "a solver without tools answered it: 'It was 1983.'"
    assert result.reward == 0.0 and result.verifier_output["failed"] == ["no_tool_fails"]


def test_an_evolution_round_that_changes_the_answer_fails_and_the_earlier_pair_is_kept() -> None:
    seed = "tiny drift"
    result = factory(seed, [explore("[s2q] explore the seed tiny drift", qa()),
                            evolve(seed, 1, qa(EVOLVED, answer="1995")), no_tool(seed, "1980")], max_evolutions=2)
    g = gates(result)
    assert not g["evolution"]["passed"]
    assert g["evolution"]["reason"] == "round 1 changed the answer from '1983' to '1995'"
    assert result.verifier_output["qa"]["question"] == QUESTION
    assert [s["label"] for s in result.verifier_output["stages"]] == ["evolve-1"]  # round 2 never ran
    assert result.reward == 0.0


def test_quote_matching_is_fuzzy_but_not_a_paraphrase() -> None:
    page = "Ada is a structured, statically typed language, first standardised in\n1983 (Ada 83)."
    assert G.quote_score("ada is a structured statically typed language, first standardised in 1983", page) >= 0.9
    assert G.quote_score("Ada is a structured, statically typed language", page) == 1.0
    assert G.quote_score("The Ada language got its first standard in the year 1983", page) < 0.9
    assert G.normalize_answer("The  Tech Model-Railroad Club!") == "tech modelrailroad club"
    assert G.exact_match("the TMRC.", ["TMRC"]) and not G.exact_match("", ["TMRC"])
    assert G.covers("It was the TMRC, at MIT.", ["TMRC"]) and not G.covers("TMRCie", ["TMRC"])
    assert G.short_answer({"answer": " ".join(["word"] * 13)}, 12)["passed"] is False


def test_a_quote_whose_year_or_name_was_changed_does_not_occur_however_close_its_wording() -> None:
    page = ("Ada is a structured, statically typed language, first standardised in\n1983 (Ada 83). "
            "Named after Ada Lovelace.")
    year = "Ada is a structured, statically typed language, first standardised in 1984"
    assert G.quote_match(year, page) == (pytest.approx(0.993, abs=1e-3), ["1984"])  # the wording alone passes
    assert G.quote_score(year, page) == 0.0
    assert G.quote_match("named after Ada Byron", page)[1] == ["Byron"]
    # Whitespace and punctuation stay fuzzy, on the key tokens too.
    assert G.quote_match("Ada is a structured statically-typed language first standardised in 1,983", page)[1] == []
    assert G.quote_match("(Ada 83), named after Ada-Lovelace", page)[1] == []
    assert G.key_tokens("In 1983 “Ada” was named, after Lovelace's notes.") == [
        "In", "1983", "“Ada”", "Lovelace's"]


def test_the_leak_and_coverage_checks_fold_possessives_and_punctuation() -> None:
    assert not G.answer_not_in_question({"question": "Which language did Alan Kay's team build?",
                                         "answer": "Alan Kay"})["passed"]
    assert not G.answer_not_in_question({"question": "What happened on 2019-05-03?", "answer": "2019"})["passed"]
    assert not G.answer_not_in_question({"question": "Who wrote `PEP 680`?", "answer": "PEP 680"})["passed"]
    assert G.answer_not_in_question({"question": "Which language did his team build?", "answer": "Alan Kay"})["passed"]
    assert G.covers("The reply: Alan Kay’s.", ["Alan Kay"]) and not G.covers("Kayak", ["Kay"])


def test_answer_in_evidence_reads_the_opened_evidence_pages_only() -> None:
    pages = {ADA: "first standardised in 1983", LOVELACE: "Ada Lovelace"}
    pair = qa(answer="1983")
    ok = G.answer_in_evidence(pair, [ADA, LOVELACE], pages.get)
    assert ok["passed"] and ok["pages"] == [ADA]
    unopened = G.answer_in_evidence(pair, [LOVELACE], pages.get)
    assert not unopened["passed"] and unopened["reason"] == (
        "no opened evidence page (1 checked) contains the answer '1983' or an alias")
    assert G.answer_in_evidence({**pair, "answer": "1995", "aliases": ["1983"]}, [ADA], pages.get)["passed"]


def uniqueness(seed: str, unique: bool, reason: str) -> dict[str, Any]:
    return {"id": f"unique-{seed}", "prompt": script_key(stage_route("uniqueness", seed, 0)),
            "reference_solution": [call("judge_uniqueness", unique=unique, reason=reason)]}


@pytest.mark.parametrize("unique", [True, False])
def test_the_optional_uniqueness_judge_is_a_gate(unique: bool) -> None:
    seed = f"tiny unique {unique}"
    reason = "only one year fits" if unique else "Ada was also revised in 1995"
    result = factory(seed, [explore(f"[s2q] explore the seed {seed}", qa()), uniqueness(seed, unique, reason),
                            no_tool(seed, "1980")], uniqueness_check=True)
    g = gates(result)
    assert g["uniqueness"] == {"name": "uniqueness", "passed": unique, "reason": reason}
    assert result.reward == (1.0 if unique else 0.0)
    # A judge that says "not unique" spares the solvers.
    assert g["no_tool_fails"]["passed"] is unique
    assert [s["label"] for s in result.verifier_output["stages"]] == (
        ["uniqueness", "no-tool"] if unique else ["uniqueness"])


def test_on_the_live_web_the_gates_read_the_pages_the_run_fetched_not_the_web_again(fake_web: str) -> None:
    from tests.engines.test_web_live import FakeWeb

    seed, engine, lovelace = "live engine", f"{fake_web}/engine.html", f"{fake_web}/lovelace.html"
    proposal = {"question": "The engine Lord Byron's daughter wrote notes on was first described in which year?",
                "answer": "1837", "reasoning": "...", "evidence": [
                    {"url": lovelace, "quote": "Ada Lovelace, daughter of Lord Byron, wrote notes on the engine."},
                    {"url": engine, "quote": "It was first described in 1837 as the successor to the Difference "
                                             "Engine."}]}
    scripts = [explore("[s2q] explore the live web", proposal, opens=(engine, lovelace)), no_tool(seed, "1843")]
    result = factory(seed, scripts, web={"backend": "live"})
    assert result.reward == 1.0, result.verifier_output["gates"]
    assert [s.get("web_calls") is not None for s in result.steps] == [True, True, True, False]
    # One search and two opens reached the server; the quote checks read the recorded pages.
    assert len(FakeWeb.hits) == 3


def test_the_stages_share_the_tasks_wall_clock() -> None:
    seed = "tiny late"
    scripts = [explore("[s2q] explore the seed tiny late", qa()), evolve(seed, 1, qa(EVOLVED)), no_tool(seed, "1980")]
    with running_offline_model(scripts=scripts, faults="slow;seconds=2") as server:
        # Explore's four turns take 8 s of the 9 s clock: the evolve round gets the rest (at least
        # 1 s), less than its one 2 s turn, where alone it would have had 9 s.
        config = config_for(scripts[0]["prompt"], scene="search2qa", timeout_s=9.0, scene_config={
            "seed": seed, "max_evolutions": 1, "difficulty_check": "no_tool", "emit": False})
        result = run(config, client(server.url))
    g = gates(result)
    assert not g["evolution"]["passed"]
    assert "wall-clock timeout" in g["evolution"]["reason"]
    assert result.verifier_output["stages"][0]["label"] == "evolve-1"
    assert result.reward == 0.0
