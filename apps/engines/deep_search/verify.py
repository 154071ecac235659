"""deep_search grading: Search-R1's normalised exact match, SQuAD token F1, cited sources, report checks.

    normalize_answer("The Tech Model Railroad Club!")   -> "tech model railroad club"
    exact_match(prediction, golds) / token_f1(prediction, golds)  over expected_answer + aliases

Normalisation is Search-R1's / ASearcher's (lowercase, punctuation deleted, articles a/an/the
removed, whitespace collapsed), with Unicode punctuation (dashes, curly quotes) deleted too.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Any, Iterable

from apps.engines.web.corpus import url_key

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Iterable[str]) -> bool:
    normalized = normalize_answer(prediction)
    return bool(normalized) and any(normalized == normalize_answer(gold) for gold in golds)


def token_f1(prediction: str, golds: Iterable[str]) -> float:
    """The best SQuAD token F1 of the prediction against any gold answer."""
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        expected = normalize_answer(gold).split()
        common = Counter(predicted) & Counter(expected)
        same = sum(common.values())
        if not same:
            continue
        precision, recall = same / len(predicted), same / len(expected)
        best = max(best, 2 * precision * recall / (precision + recall))
    return round(best, 4)


def check_sources(cited: list[str], opened: set[str], page_text: Any, golds: list[str]) -> list[dict[str, Any]]:
    """One entry per cited URL: was it opened in this episode, does the web have it, does it hold an answer.

    `page_text(url)` returns the page's text or None when the backend has no such page."""
    opened_keys = {url_key(u) for u in opened}
    normalized_golds = [g for g in (normalize_answer(g) for g in golds) if g]
    entries = []
    for url in dict.fromkeys(cited):
        text = page_text(url)
        normalized = f" {normalize_answer(text)} " if text is not None else ""
        entries.append({
            "url": url,
            "opened": url_key(url) in opened_keys,
            "exists": text is not None,
            "contains_answer": bool(normalized_golds) and any(f" {g} " in normalized for g in normalized_golds),
        })
    return entries


def word_count(text: str) -> int:
    return len(re.findall(r"\w+", text))
