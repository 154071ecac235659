"""The search2qa stages' prompts and finish tools.

Every sub-episode's model calls are routed `pipeline:search2qa/<stage> key=seed=<slug> round=<n>`
(stage_route, sent by the client as a header to the offline stand-in only; the prompts carry no
marker): the offline scripted model answers a stage by the script written under that route
(apps.engines.offline_model.script_key), before any longer script the prompt quotes (an evolve prompt quotes the question a solver script answers). The explore stage is the task's own episode, so
its first user message is the task's prompt; the deep_search solver's prompt is the bare
question, exactly the emitted task's prompt, so the solver run that is attached to the task is
a faithful rollout of it.
"""
from __future__ import annotations

import json
import re
from typing import Any

from apps.engines.generation import stage_route as pipeline_route

STAGES = ("explore", "evolve", "no_tool", "uniqueness", "solve")

_EVIDENCE = {
    "type": "array", "minItems": 1, "maxItems": 10,
    "description": "one item per fact used: the page's url and a passage copied exactly from its text",
    "items": {"type": "object", "properties": {
        "url": {"type": "string", "minLength": 1},
        "quote": {"type": "string", "minLength": 1, "maxLength": 1000},
    }, "required": ["url", "quote"], "additionalProperties": False},
}
_ALIASES = {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 10,
            "description": "other correct spellings or names of the answer (optional)"}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


PROPOSE_QA = _tool(
    "propose_qa",
    "End the exploration with one question-answer pair built from the pages you opened. Call it once.",
    {"question": {"type": "string", "minLength": 1}, "answer": {"type": "string", "minLength": 1},
     "aliases": _ALIASES, "evidence": _EVIDENCE, "reasoning": {"type": "string"}},
    ["question", "answer", "evidence", "reasoning"],
)
EVOLVE_QA = _tool(
    "evolve_qa",
    "End this round with the evolved question; the answer must stay the same. Call it once.",
    {"question": {"type": "string", "minLength": 1}, "answer": {"type": "string", "minLength": 1},
     "aliases": _ALIASES,
     "changed": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                 "description": "what was removed or obfuscated, one item per change"},
     "evidence": _EVIDENCE},
    ["question", "answer", "changed", "evidence"],
)
ANSWER = _tool("answer", "Give your final answer to the question (a short phrase). Call it once.",
               {"answer": {"type": "string"}}, ["answer"])
JUDGE_UNIQUENESS = _tool(
    "judge_uniqueness",
    "Say whether the question has exactly one correct answer, and why. Call it once.",
    {"unique": {"type": "boolean"}, "reason": {"type": "string"}}, ["unique", "reason"],
)
FINISH_TOOLS = {"explore": PROPOSE_QA, "evolve": EVOLVE_QA, "no_tool": ANSWER, "uniqueness": JUDGE_UNIQUENESS}


def seed_slug(seed: str) -> str:
    """A stable, readable key for a seed: lowercase words joined by '-' (at most 60 characters)."""
    return re.sub(r"[^a-z0-9]+", "-", seed.lower()).strip("-")[:60] or "seed"


def stage_route(stage: str, seed: str, round_: int) -> str:
    return pipeline_route(f"search2qa/{stage}", f"seed={seed_slug(seed)} round={round_}")


def _rules(max_words: int, min_sources: int) -> str:
    return (f"- exactly one correct answer, at most {max_words} words (a name, term, number or date);\n"
            "- the answer (and any alias of it) must not appear in the question;\n"
            f"- answering needs facts from at least {min_sources} different pages you opened;\n"
            "- evidence: for each fact, the page's url and a passage copied exactly from the page text (its "
            "numbers, dates and names as the page has them);\n"
            "- the answer itself must appear in the text of one of the evidence pages.")


def explore_system(seed: str, mode: str, *, max_words: int, min_sources: int) -> str:
    if mode == "answer":
        goal = (f"The seed «{seed}» is the ANSWER. Find facts about it on linked pages and write a question whose "
                "single correct answer is the seed.")
    else:
        goal = (f"The seed «{seed}» is the TOPIC. Explore it and the pages it links to, and write a question about "
                "facts you found there.")
    return (
        "You build hard, multi-hop questions for a research benchmark from a web of documents.\n"
        f"{goal}\n"
        "Use search to find pages, open to read them (follow their numbered links to related pages) and find to "
        "locate a phrase in a page. Prefer a chain: a fact on one page leads to another page that holds the answer.\n"
        "When you have it, call propose_qa(question, answer, aliases, evidence, reasoning). The pair must have:\n"
        f"{_rules(max_words, min_sources)}"
    )


def _qa_block(qa: dict[str, Any]) -> str:
    evidence = "\n".join(f"- {e.get('url')}: \"{e.get('quote')}\"" for e in qa.get("evidence") or [])
    aliases = ", ".join(qa.get("aliases") or []) or "(none)"
    return f"Question: {qa['question']}\nAnswer: {qa['answer']}\nAliases: {aliases}\nEvidence:\n{evidence}"


EVOLVE_SYSTEM = (
    "You make benchmark questions harder without changing their answer (long-to-short evolution). Each round "
    "removes the most salient cues and obfuscates what remains, so that answering needs more search:\n"
    "- exact dates become periods (\"in the early 1960s\"), names become descriptions (\"a 19th-century "
    "mathematician\"), numbers become ranges, quoted titles become paraphrases;\n"
    "- drop keywords that lead a search engine straight to the answer page;\n"
    "- keep the question answerable and its answer unique; never put the answer in the question.\n"
    "You may search, open and find pages to check that the evolved question still leads to the same answer. "
    "Then call evolve_qa(question, answer, aliases, changed, evidence) with the same answer; evidence lists every "
    "page the evolved question relies on, with passages copied exactly from them."
)


def evolve_prompt(seed: str, round_: int, rounds: int, qa: dict[str, Any]) -> str:
    return f"Round {round_} of {rounds}. Evolve this question:\n\n{_qa_block(qa)}"


NO_TOOL_SYSTEM = ("Answer the question from what you know, without searching. Reply by calling "
                  "answer(answer) with a short answer: a name, term, number or date.")


def no_tool_prompt(seed: str, round_: int, question: str) -> str:
    return f"Question: {question}"


UNIQUENESS_SYSTEM = (
    "You check benchmark questions. Given a question, its intended answer and the evidence, decide whether the "
    "question has exactly one correct answer (not several plausible ones, not an ambiguous reading). Call "
    "judge_uniqueness(unique, reason).")


def uniqueness_prompt(seed: str, round_: int, qa: dict[str, Any]) -> str:
    return _qa_block(qa)


def final_answer_text(qa: dict[str, Any]) -> str:
    """The explore episode's final answer: the proposed pair, as JSON."""
    return json.dumps({"question": qa.get("question", ""), "answer": qa.get("answer", "")}, ensure_ascii=False)
