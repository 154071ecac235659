"""The search2qa code gates: checks on a question-answer pair and the pages the run opened.

    gate = answer_not_in_question(qa)                 # {"name", "passed", "reason", ...}
    gate = evidence_opened(qa, opened)                # every evidence url was opened in the run
    scored = score_quotes(qa, opened, page_text)      # per evidence item: opened, fuzzy score
    gate = evidence_quotes(scored, 0.9)               # every quote occurs (fuzzily) in its page
    gate = distinct_pages(scored, 0.9, 2)             # the supported facts span >= 2 pages
    gate = short_answer(qa, 12)
    covers("It was 1983.", ["1983"])                  # the difficulty gate's match

Nothing here calls a model. A quote "occurs" in a page when rapidfuzz's partial ratio (the best
alignment of the quote against any stretch of the page) of the two, lowercased with whitespace
collapsed, reaches the threshold: a quote with a changed quotation mark or a dropped comma still
matches, a paraphrase does not. Answers are compared in the Search-R1 / ASearcher normal form
(lowercase, punctuation and the articles a/an/the removed, whitespace collapsed), deep_search's
`normalize_answer` and `exact_match`, so the factory and the solver it checks agree.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rapidfuzz import fuzz

from apps.engines.deep_search.verify import exact_match as exact_match  # re-exported: one normal form
from apps.engines.deep_search.verify import normalize_answer
from apps.engines.web.corpus import url_key

Gate = dict[str, Any]


def gate(name: str, passed: bool, reason: str, **details: Any) -> Gate:
    return {"name": name, "passed": bool(passed), "reason": reason, **details}


def _flat(text: str) -> str:
    return " ".join(text.lower().split())


def answers_of(qa: dict[str, Any]) -> list[str]:
    return [a for a in [qa.get("answer") or "", *(qa.get("aliases") or [])] if isinstance(a, str) and a.strip()]


def answer_not_in_question(qa: dict[str, Any]) -> Gate:
    """The answer and its aliases, normalised, do not occur as whole words in the normalised question."""
    question = f" {normalize_answer(qa.get('question') or '')} "
    leaked = [a for a in answers_of(qa) if (n := normalize_answer(a)) and f" {n} " in question]
    if leaked:
        return gate("answer_not_in_question", False, f"the question contains the answer {leaked[0]!r}", leaked=leaked)
    return gate("answer_not_in_question", True, "neither the answer nor an alias occurs in the question")


def short_answer(qa: dict[str, Any], max_words: int) -> Gate:
    words = len((qa.get("answer") or "").split())
    if words == 0:
        return gate("short_answer", False, "the answer is empty", words=0)
    if words > max_words:
        return gate("short_answer", False, f"the answer has {words} words; at most {max_words}", words=words)
    return gate("short_answer", True, f"{words} word(s), at most {max_words}", words=words)


def quote_score(quote: str, page: str) -> float:
    """How well `quote` occurs in `page`, 0..1 (1.0: verbatim up to case and whitespace)."""
    quote, page = _flat(quote), _flat(page)
    if not quote or not page:
        return 0.0
    if quote in page:
        return 1.0
    return fuzz.partial_ratio(quote, page) / 100.0


def _evidence(qa: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in qa.get("evidence") or [] if isinstance(e, dict)]


def _keys(urls: Iterable[str]) -> set[str]:
    return {url_key(u) for u in urls}


def evidence_opened(qa: dict[str, Any], opened: Iterable[str]) -> Gate:
    opened = _keys(opened)
    evidence = _evidence(qa)
    missing = sorted({e.get("url", "") for e in evidence if url_key(e.get("url") or "") not in opened})
    if not evidence:
        return gate("evidence_opened", False, "the pair cites no evidence", missing=[])
    if missing:
        return gate("evidence_opened", False, f"{len(missing)} evidence page(s) were never opened in this run: "
                    f"{', '.join(missing[:3])}", missing=missing)
    return gate("evidence_opened", True, f"all {len(evidence)} evidence item(s) cite pages opened in this run",
                missing=[])


def score_quotes(qa: dict[str, Any], opened: Iterable[str], page_text: Callable[[str], str]) -> list[dict[str, Any]]:
    """Per evidence item: url, opened, score (0..1; 0 for a page never opened: it is not looked up).
    URLs compare by `url_key` (no fragment, no trailing slash, scheme and host lowercased)."""
    opened = _keys(opened)
    scored = []
    pages: dict[str, str] = {}
    for e in _evidence(qa):
        url, quote = e.get("url") or "", e.get("quote") or ""
        item = {"url": url, "quote": quote[:200], "opened": url_key(url) in opened, "score": 0.0}
        if item["opened"]:
            if url not in pages:
                pages[url] = page_text(url)
            item["score"] = round(quote_score(quote, pages[url]), 3)
        scored.append(item)
    return scored


def evidence_quotes(scored: list[dict[str, Any]], threshold: float) -> Gate:
    if not scored:
        return gate("evidence_quotes", False, "the pair cites no evidence", items=[])
    bad = [s for s in scored if not (s["opened"] and s["score"] >= threshold)]
    if bad:
        first = bad[0]
        why = ("its page was never opened" if not first["opened"]
               else f"it matches the page only {first['score']:.2f} < {threshold:.2f}")
        return gate("evidence_quotes", False, f"{len(bad)} quote(s) do not occur in an opened page; e.g. the quote "
                    f"from {first['url']}: {why}", items=scored)
    return gate("evidence_quotes", True, f"all {len(scored)} quote(s) occur in the pages opened "
                f"(fuzzy >= {threshold:.2f})", items=scored)


def distinct_pages(scored: list[dict[str, Any]], threshold: float, minimum: int) -> Gate:
    pages = sorted({url_key(s["url"]) for s in scored if s["opened"] and s["score"] >= threshold})
    if len(pages) < minimum:
        return gate("distinct_pages", False, f"the supported evidence spans {len(pages)} page(s); at least "
                    f"{minimum} needed (multi-hop)", pages=pages)
    return gate("distinct_pages", True, f"the supported evidence spans {len(pages)} pages", pages=pages)


def covers(prediction: str, answers: Iterable[str]) -> bool:
    """Search-R1's substring match: a normalised answer occurs as whole words in the normalised
    prediction ("It was 1983." covers "1983"). The difficulty gate uses it, so a solver that
    knows the answer cannot slip through by wrapping it in a sentence."""
    normalized = f" {normalize_answer(prediction or '')} "
    return any((n := normalize_answer(a)) and f" {n} " in normalized for a in answers)
