"""Reads about corpora used by more than one caller (data cards, the scene runtimes)."""
from __future__ import annotations

from apps.engines.models import Corpus


def corpus_licences(names: list[str]) -> list[dict[str, str]]:
    """The licences of the registered corpora among `names` (a selector for data cards), each once."""
    seen: set[tuple[str, str]] = set()
    out: list[dict[str, str]] = []
    for row in Corpus.objects.filter(name__in=names).order_by("name"):
        for entry in row.licences:
            key = (row.name, entry.get("source", ""))
            if key not in seen:
                seen.add(key)
                out.append({"corpus": row.name, **entry})
    return out
