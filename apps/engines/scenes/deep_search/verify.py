"""deep_search grading: Search-R1's normalised exact match, SQuAD token F1, cited sources, report checks.

    normalize_answer("The Tech Model Railroad Club!")   -> "tech model railroad club"
    exact_match(prediction, golds) / token_f1(prediction, golds)  over expected_answer + aliases
    contains_answer("born 2019-05-03 in Teignmouth", ["2019"])   -> True

Normalisation is Search-R1's (verl/utils/reward_score/qa_em.py, also ASearcher's): lowercase,
every character of string.punctuation deleted, the articles a/an/the removed, whitespace
collapsed. The one extra: Unicode punctuation (categories P*: dashes, curly quotes, «», ¿) is
deleted too. Symbols outside ASCII (€, ×, °) are kept, as Search-R1 keeps them.

`contains_answer` (a page or a question holds an answer as whole words) looks in two forms of
the text: Search-R1's (punctuation deleted) and one where punctuation separates words, so a year
inside an ISO date ("2019" in "2019-05-03") and a name before a possessive ("Alan Kay" in
"Alan Kay's team") are found.
"""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from typing import Any, Iterable

from apps.engines.web.corpus import url_key

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


def is_punctuation(ch: str) -> bool:
    """string.punctuation (Search-R1's set) or any Unicode punctuation character."""
    return ch in _ASCII_PUNCTUATION or unicodedata.category(ch).startswith("P")


def _normal_form(text: str, punctuation: str) -> str:
    text = "".join(punctuation if is_punctuation(ch) else ch for ch in text.lower())
    return " ".join(_ARTICLES.sub(" ", text).split())


def normalize_answer(text: str) -> str:
    return _normal_form(text, "")


def _spaced(text: str) -> str:
    """The normal form with punctuation read as a word break instead of deleted."""
    return _normal_form(text, " ")


def contains_answer(text: str, answers: Iterable[str]) -> bool:
    """Some answer occurs as whole words in `text`, in Search-R1's normal form or with punctuation
    read as a word break (see the module docstring). An empty answer occurs nowhere."""
    answers = list(answers)
    forms = ((normalize_answer, f" {normalize_answer(text)} "), (_spaced, f" {_spaced(text)} "))
    return any((n := norm(a)) and f" {n} " in haystack for a in answers for norm, haystack in forms)


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
    entries = []
    for url in dict.fromkeys(cited):
        text = page_text(url)
        entries.append({
            "url": url,
            "opened": url_key(url) in opened_keys,
            "exists": text is not None,
            "contains_answer": text is not None and contains_answer(text, golds),
        })
    return entries


def word_count(text: str) -> int:
    return len(re.findall(r"\w+", text))
