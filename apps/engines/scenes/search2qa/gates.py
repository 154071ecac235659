"""The search2qa code gates: checks on a question-answer pair and the pages the run opened.

    gate = answer_not_in_question(qa)                 # {"name", "passed", "reason", ...}
    gate = evidence_opened(qa, opened)                # every evidence url was opened in the run
    scored = score_quotes(qa, opened, page_text)      # per evidence item: opened, score, changed
    gate = evidence_quotes(scored, 0.9)               # every quote occurs in its page
    gate = distinct_pages(scored, 0.9, 2)             # the supported facts span >= 2 pages
    gate = answer_in_evidence(qa, opened, page_text)  # an opened evidence page holds the answer
    gate = short_answer(qa, 12)
    covers("It was 1983.", ["1983"])                  # the difficulty gate's match

Nothing here calls a model. A quote "occurs" in a page when two things hold. Its wording:
rapidfuzz's partial ratio (the best alignment of the quote against any stretch of the page) of
the two, lowercased with whitespace collapsed, reaches the threshold, so a quote with a changed
quotation mark or a dropped comma still matches and a paraphrase does not. Its facts: every key
token of the quote — one with a digit (numbers, years, dates) or a capitalised one (names) — is a
token of the page's aligned stretch, up to punctuation ("1,000" is "1000", "Jean-Paul" is "Jean
Paul"), so a quote whose year, number or name was changed fails however close its wording is
(`changed` lists those tokens; its score is then 0).

Answers are compared in deep_search's normal form (apps/engines/scenes/deep_search/verify.py: Search-R1's,
with Unicode punctuation deleted too), so the factory and the solver it checks agree; containment
(the answer in a page, in the question, in the no-tool solver's reply) is `contains_answer`,
which also reads punctuation as a word break: "Alan Kay's team" holds "Alan Kay".
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rapidfuzz import fuzz

from apps.engines.scenes.deep_search.verify import contains_answer, is_punctuation
from apps.engines.scenes.deep_search.verify import exact_match as exact_match  # re-exported: one normal form
from apps.engines.scenes.deep_search.verify import normalize_answer as normalize_answer
from apps.engines.web.corpus import url_key

Gate = dict[str, Any]


def gate(name: str, passed: bool, reason: str, **details: Any) -> Gate:
    return {"name": name, "passed": bool(passed), "reason": reason, **details}


def _flat(text: str) -> str:
    return " ".join(text.lower().split())


def answers_of(qa: dict[str, Any]) -> list[str]:
    return [a for a in [qa.get("answer") or "", *(qa.get("aliases") or [])] if isinstance(a, str) and a.strip()]


def answer_not_in_question(qa: dict[str, Any]) -> Gate:
    """The answer and its aliases do not occur as whole words in the question (`contains_answer`:
    possessives and punctuation folded, so "Alan Kay's team" leaks "Alan Kay")."""
    question = qa.get("question") or ""
    leaked = [a for a in answers_of(qa) if contains_answer(question, [a])]
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


def _words(text: str, sep: str) -> list[str]:
    """Lowercased words, punctuation deleted (sep "") or read as a word break (sep " ")."""
    return "".join(sep if is_punctuation(ch) else ch for ch in text.lower()).split()


def key_tokens(quote: str) -> list[str]:
    """The quote's tokens that carry its facts: with a digit, or capitalised (a name)."""
    keys = []
    for token in quote.split():
        core = "".join(ch for ch in token if not is_punctuation(ch))
        if core and (core[0].isupper() or any(ch.isdigit() for ch in core)):
            keys.append(token)
    return keys


def quote_match(quote: str, page: str) -> tuple[float, list[str]]:
    """How well `quote`'s wording occurs in `page` (0..1, 1.0: verbatim up to case and
    whitespace) and which of its key tokens the page's aligned stretch lacks."""
    flat_quote, flat_page = _flat(quote), _flat(page)
    if not flat_quote or not flat_page:
        return 0.0, []
    if flat_quote in flat_page:
        return 1.0, []
    aligned = fuzz.partial_ratio_alignment(flat_quote, flat_page)
    pad = 10 + len(flat_quote) // 5  # the stretch may cut the first or last word of the quote
    stretch = flat_page[max(0, aligned.dest_start - pad):aligned.dest_end + pad]
    deleted, spaced = set(_words(stretch, "")), set(_words(stretch, " "))
    changed = [t for t in key_tokens(quote)
               if "".join(_words(t, "")) not in deleted and not set(_words(t, " ")) <= spaced]
    return aligned.score / 100.0, changed


def quote_score(quote: str, page: str) -> float:
    """How well `quote` occurs in `page`, 0..1: its wording's fuzzy score, 0 when a number, date
    or name of it is not the page's (quote_match)."""
    score, changed = quote_match(quote, page)
    return 0.0 if changed else score


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


def score_quotes(qa: dict[str, Any], opened: Iterable[str],
                 page_text: Callable[[str], str | None]) -> list[dict[str, Any]]:
    """Per evidence item: url, opened, score (0..1; 0 for a page never opened: it is not looked up,
    and for a quote whose numbers or names the page does not have: those are in `changed`).
    URLs compare by `url_key` (no fragment, no trailing slash, scheme and host lowercased)."""
    opened = _keys(opened)
    scored = []
    for e in _evidence(qa):
        url, quote = e.get("url") or "", e.get("quote") or ""
        item = {"url": url, "quote": quote[:200], "opened": url_key(url) in opened, "score": 0.0, "changed": []}
        if item["opened"]:
            score, item["changed"] = quote_match(quote, page_text(url) or "")
            item["score"] = 0.0 if item["changed"] else round(score, 3)
        scored.append(item)
    return scored


def evidence_quotes(scored: list[dict[str, Any]], threshold: float) -> Gate:
    if not scored:
        return gate("evidence_quotes", False, "the pair cites no evidence", items=[])
    bad = [s for s in scored if not (s["opened"] and s["score"] >= threshold)]
    if bad:
        first = bad[0]
        why = ("its page was never opened" if not first["opened"] else
               f"the page does not say {', '.join(map(repr, first['changed'][:3]))} there" if first["changed"] else
               f"it matches the page only {first['score']:.2f} < {threshold:.2f}")
        return gate("evidence_quotes", False, f"{len(bad)} quote(s) do not occur in an opened page; e.g. the quote "
                    f"from {first['url']}: {why}", items=scored)
    return gate("evidence_quotes", True, f"all {len(scored)} quote(s) occur in the pages opened "
                f"(fuzzy >= {threshold:.2f}, numbers and names as the page has them)", items=scored)


def distinct_pages(scored: list[dict[str, Any]], threshold: float, minimum: int) -> Gate:
    pages = sorted({url_key(s["url"]) for s in scored if s["opened"] and s["score"] >= threshold})
    if len(pages) < minimum:
        return gate("distinct_pages", False, f"the supported evidence spans {len(pages)} page(s); at least "
                    f"{minimum} needed (multi-hop)", pages=pages)
    return gate("distinct_pages", True, f"the supported evidence spans {len(pages)} pages", pages=pages)


def answer_in_evidence(qa: dict[str, Any], opened: Iterable[str], page_text: Callable[[str], str | None]) -> Gate:
    """The answer (or an alias) occurs as whole words in the text of an evidence page opened in
    the run: a pair whose quotes are true but whose answer no page gives fails."""
    opened = _keys(opened)
    answers = answers_of(qa)
    urls = [u for u in dict.fromkeys(e.get("url") or "" for e in _evidence(qa)) if url_key(u) in opened]
    pages = [u for u in urls if contains_answer(page_text(u) or "", answers)]
    if not answers:
        return gate("answer_in_evidence", False, "the pair has no answer", pages=[])
    if not pages:
        return gate("answer_in_evidence", False, f"no opened evidence page ({len(urls)} checked) contains the answer "
                    f"{answers[0]!r} or an alias", pages=[])
    return gate("answer_in_evidence", True, f"the answer occurs in {len(pages)} opened evidence page(s)", pages=pages)


def covers(prediction: str, answers: Iterable[str]) -> bool:
    """Search-R1's substring match: a normalised answer occurs as whole words in the normalised
    prediction ("It was 1983." covers "1983"). The difficulty gate uses it, so a solver that
    knows the answer cannot slip through by wrapping it in a sentence."""
    return contains_answer(prediction or "", answers)
