"""The deep_search scene driven end to end: the offline scripted model over loopback HTTP, the shared
loop, the web toolset over a tiny corpus; EM/F1 normalisation, sources_ok, report mode, explore."""
from __future__ import annotations

import re
import string
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.engines.scenes.deep_search.verify import contains_answer, exact_match, normalize_answer, token_f1
from apps.engines.offline_model import running_offline_model
from apps.engines.runtime import get_runtime
from tests.engines.test_agent import call, client, config_for, llm_env, run  # noqa: F401 (fixture)
from tests.engines.test_web_corpus import tiny_corpus  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("llm_env", "tiny_corpus")]

LOVELACE = "https://tiny.example/people/lovelace.html"
ADA = "https://tiny.example/languages/ada.md"
QUESTION = "[ds] In what year was the language named after Lord Byron's daughter first standardised?"


def episode(prompt: str, solution: list[dict[str, Any]], scene_config: dict[str, Any] | None = None,
            extra_scripts: list[dict[str, Any]] = (), **fields: Any):
    scene_config = {"expected_answer": "1983", "aliases": ["Ada 83"], **(scene_config or {})}
    scripts = [{"id": "main", "prompt": prompt, "reference_solution": solution}, *extra_scripts]
    with running_offline_model(scripts=scripts) as server:
        return run(config_for(prompt, scene_config, scene="deep_search", **fields), client(server.url),
                   sandbox_backend=None)


RESEARCH = [
    call("search", "who is Lord Byron's daughter", query="daughter of Lord Byron", k=3),
    call("open", url=LOVELACE),
    call("open", url=ADA),
    call("find", url=ADA, pattern=r"standardi[sz]ed in \d{4}"),
]


@pytest.mark.parametrize("prediction, golds, em, f1", [
    ("The Tech Model Railroad Club!", ["tech model railroad club"], True, 1.0),
    ("  An  ANSWER, with “quotes” ", ["answer with quotes"], True, 1.0),
    ("don’t panic", ["dont panic"], True, 1.0),
    ("1983", ["1983"], True, 1.0),
    ("in 1983", ["1983"], False, 0.6667),
    ("Ada 83", ["1983", "Ada 83"], True, 1.0),
    ("Babbage", ["Charles Babbage"], False, 0.6667),
    ("the", ["a"], False, 0.0),  # nothing left after normalising matches nothing
    ("", ["1983"], False, 0.0),
])
def test_normalised_exact_match_and_f1(prediction, golds, em, f1):
    assert exact_match(prediction, golds) is em
    assert token_f1(prediction, golds) == f1


def test_normalisation_is_search_r1s():
    assert normalize_answer("The  Quick, Brown FOX.") == "quick brown fox"
    assert normalize_answer("a theory of an atom") == "theory of atom"
    assert normalize_answer("`PEP 680`") == "pep 680" and normalize_answer("~UCSB~") == "ucsb"
    assert exact_match("`PEP 680`", ["PEP 680"]) and exact_match("~UCSB~", ["UCSB"])
    assert normalize_answer("$5 + 3 = <8> ^ | \\") == "5 3 8"
    assert normalize_answer("«Ada» — ¿the 1983 ‘standard’?") == "ada 1983 standard"  # the Unicode extra
    assert normalize_answer("5 € × 3°") == "5 € × 3°"  # symbols outside ASCII stay, as in Search-R1


def search_r1_normalize_answer(s):
    """Search-R1's reference (PeterGriffinJin/Search-R1, verl/utils/reward_score/qa_em.py), verbatim."""
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _without_unicode_punctuation(text: str) -> str:
    return "".join(ch for ch in text if ch in string.punctuation or not unicodedata.category(ch).startswith("P"))


# Strings rich in what normalisation acts on: ASCII punctuation, articles, case, whitespace, digits.
_PIECES = st.one_of(st.sampled_from(list(string.punctuation) + [" ", "\t", "\n", "a", "an", "the", "The", "AN"]),
                    st.text(alphabet=string.ascii_letters + string.digits, max_size=4))
ASCII_LIKE = st.lists(_PIECES, max_size=30).map("".join)


@settings(max_examples=200, deadline=None, database=None)
@given(ASCII_LIKE)
def test_the_normaliser_is_search_r1s_on_ascii_text(text: str) -> None:
    assert normalize_answer(text) == search_r1_normalize_answer(text)


@settings(max_examples=200, deadline=None, database=None)
@given(st.one_of(st.text(), st.lists(st.one_of(_PIECES, st.text(max_size=3)), max_size=20).map("".join)))
def test_the_normaliser_is_search_r1s_after_deleting_unicode_punctuation(text: str) -> None:
    """Any text: ours is the reference applied to the text without its non-ASCII punctuation (the
    one documented extra, docs/web.md)."""
    assert normalize_answer(text) == search_r1_normalize_answer(_without_unicode_punctuation(text))


@pytest.mark.parametrize("text, answer, found", [
    ("Released on 2019-05-03 in Berlin.", "2019", True),        # a year inside an ISO date
    ("Alan Kay's team at PARC", "Alan Kay", True),              # before a possessive
    ("It was O'Brien, not Obrian.", "OBrien", True),            # Search-R1's form: punctuation deleted
    ("The Tech Model Railroad Club (TMRC)", "tech model railroad club", True),
    ("In 20190503 nothing happened", "2019", False),            # whole words only
    ("Kayak club", "Kay", False),
    ("anything", "", False),
])
def test_contains_answer_finds_whole_words_with_punctuation_as_a_break(text, answer, found):
    assert contains_answer(text, [answer]) is found


def test_a_correct_sourced_answer_gets_reward_one():
    result = episode(QUESTION, [*RESEARCH, call("finish", answer="1983", sources=[ADA, LOVELACE])])
    assert result.outcome == "success", result.outcome_reason
    assert result.reward == 1.0
    out = result.verifier_output
    assert out["em"] == 1.0 and out["f1"] == 1.0 and out["sources_ok"] is True
    assert out["sources"] == [
        {"url": ADA, "opened": True, "exists": True, "contains_answer": True},
        {"url": LOVELACE, "opened": True, "exists": True, "contains_answer": False},
    ]
    search, opened = result.steps[0], result.steps[1]
    assert search["results"][0]["rank"] == 1 and search["results"][0]["url"] == LOVELACE
    assert opened["url"] == LOVELACE and opened["offset"] == 0 and len(opened["content_sha256"]) == 64
    assert result.steps[3]["matches"][0]["line"].startswith("Ada is a structured")
    assert result.sandbox == {} or not result.sandbox.get("id")  # no sandbox for the corpus backend


def test_a_wrong_answer_gets_zero_with_f1_as_partial_credit():
    result = episode(QUESTION, [*RESEARCH, call("finish", answer="in 1983", sources=[ADA])])
    assert result.outcome == "failure" and result.reward == 0.0
    assert result.verifier_output["em"] == 0.0 and result.verifier_output["f1"] == 0.6667
    assert "does not match" in result.verifier_output["note"]


def test_citing_a_page_not_opened_fails_when_sources_are_required():
    solution = [call("search", query="Ada language 1983"), call("finish", answer="1983", sources=[ADA])]
    result = episode(QUESTION, solution)
    assert result.reward == 0.0 and result.verifier_output["em"] == 1.0
    assert result.verifier_output["sources_ok"] is False
    assert result.verifier_output["sources"][0]["opened"] is False
    relaxed = episode(QUESTION, solution, {"require_sources": False})
    assert relaxed.reward == 1.0 and relaxed.verifier_output["sources_ok"] is False


def test_citing_a_page_that_does_not_exist_or_nothing_fails():
    made_up = episode(QUESTION, [*RESEARCH, call("finish", answer="1983", sources=["https://tiny.example/made-up"])])
    assert made_up.reward == 0.0
    assert made_up.verifier_output["sources"] == [
        {"url": "https://tiny.example/made-up", "opened": False, "exists": False, "contains_answer": False}]
    nothing = episode(QUESTION, [*RESEARCH, call("finish", answer="1983", sources=[])])
    assert nothing.reward == 0.0 and "no source cited" in nothing.verifier_output["note"]


def test_the_agents_mistakes_go_back_to_it():
    solution = [call("open", url="https://tiny.example/nope"), call("find", url=ADA, pattern="(bad"),
                *RESEARCH, call("finish", answer="1983", sources=[ADA])]
    result = episode(QUESTION, solution)
    assert result.steps[0]["error"].startswith("no page at https://tiny.example/nope")
    assert "not a regular expression" in result.steps[1]["error"]
    assert result.reward == 1.0


def test_report_mode_checks_citations_and_length():
    report = "Ada Lovelace, daughter of Lord Byron, worked with Charles Babbage. " * 3
    sc = {"output": "report", "report": {"min_words": 10, "max_words": 60, "min_sources": 2}}
    good = episode("[ds] write a short report on Ada Lovelace", [
        call("open", url=LOVELACE), call("open", url="https://tiny.example/people/babbage.html"),
        call("finish", report=report, sources=[LOVELACE, "https://tiny.example/people/babbage.html"])], sc)
    assert good.reward == 1.0, good.verifier_output
    assert good.final_answer == report
    assert good.verifier_output["checks"] == {"cited_pages_opened": True, "enough_sources": True, "length_ok": True}
    finish_schema = next(t for t in get_runtime("deep_search").tools({"scene_config": sc})
                         if t["function"]["name"] == "finish")
    assert finish_schema["function"]["parameters"]["required"] == ["report", "sources"]
    short = episode("[ds] write a short report on Babbage", [
        call("open", url=LOVELACE), call("finish", report="Too short.", sources=[LOVELACE])], sc)
    assert short.reward == 0.0
    assert short.verifier_output["checks"] == {"cited_pages_opened": True, "enough_sources": False, "length_ok": False}


def test_explore_runs_a_sub_episode_whose_opened_pages_count():
    sub_prompt = "[deep_search/explore] Research this and report what you found, with the pages you read:\n" \
                 "Who was Lord Byron's daughter and what is named after her?"
    explorer = {"id": "explorer", "prompt": sub_prompt, "reference_solution": [
        call("search", query="Lord Byron daughter"), call("open", url=LOVELACE), call("open", url=ADA),
        call("finish", answer="Ada Lovelace; the Ada language (standardised 1983) is named after her.",
             sources=[LOVELACE, ADA])]}
    result = episode(QUESTION, [
        call("explore", question="Who was Lord Byron's daughter and what is named after her?"),
        call("finish", answer="1983", sources=[ADA])], {"explore": True}, extra_scripts=[explorer])
    assert result.outcome == "success", result.outcome_reason
    explore = result.steps[0]
    assert explore["output"].startswith("Ada Lovelace; the Ada language")
    assert explore["explore"]["outcome"] == "success" and explore["explore"]["opened"] == [ADA, LOVELACE]
    assert result.reward == 1.0 and result.verifier_output["sources"][0]["opened"] is True
    assert result.llm_calls == 2 + 4
    # the explorer itself gets no explore tool and is not graded
    child = result.subepisodes[0]
    assert "explore" not in [t["function"]["name"] for t in child.tools] and child.reward is None


def test_no_expected_answer_means_no_reward():
    result = episode("[ds] anything", [call("finish", answer="x", sources=[])], {"expected_answer": "", "aliases": []})
    assert result.reward is None and result.outcome == "success"


def test_browse_has_a_reader_model_read_the_page_and_counts_as_reading_it():
    question = "When was the language first standardised?"
    reader = {"id": "reader", "prompt": f"[web/browse url={ADA}] {question}",
              "reference_solution": [{"content": 'It was standardised as "Ada 83" (1983).'}]}
    result = episode(QUESTION, [call("browse", url=ADA, question=question),
                                call("finish", answer="1983", sources=[ADA])], {"browse": True},
                     extra_scripts=[reader])
    assert result.outcome == "success", result.outcome_reason
    browse = result.steps[0]
    assert browse["output"].endswith('It was standardised as "Ada 83" (1983).')
    assert browse["url"] == ADA and len(browse["content_sha256"]) == 64
    assert browse["browse"]["question"] == question and browse["browse"]["usage"]["total_tokens"] > 0
    assert result.llm_calls == 3  # two agent turns and the reader
    assert result.total_tokens >= browse["browse"]["usage"]["total_tokens"]
    assert result.reward == 1.0 and result.verifier_output["sources"][0]["opened"] is True
    assert "browse" not in [t["function"]["name"] for t in get_runtime("deep_search").tools({"scene_config": {}})]


def test_a_corpus_that_is_not_built_ends_the_episode_as_a_config_error(settings, tmp_path):
    settings.WEB_CORPUS_DIR = tmp_path / "nothing-here"
    result = episode(QUESTION, [*RESEARCH, call("finish", answer="1983", sources=[ADA])])
    assert result.outcome == "error" and result.steps == [] and result.llm_calls == 0
    assert "corpus 'tiny' is not built" in result.outcome_reason and "corpus_build tiny" in result.outcome_reason
