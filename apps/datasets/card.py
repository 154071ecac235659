"""Data card statistics: counts, histograms and quantiles over a version's members (pure functions)."""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Iterable, Sequence

QUANTILES = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)
SCORE_BINS = 10


def counts_by(values: Iterable[Any]) -> dict[str, int]:
    """Value -> count, most frequent first, ties by name (a stable order for the card)."""
    counter = Counter("" if v is None else str(v) for v in values)
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank quantiles p0, p10, p50, p90, p99, p100 (None when empty)."""
    data = sorted(values)
    out: dict[str, float | None] = {}
    for q in QUANTILES:
        key = f"p{round(q * 100)}"
        if not data:
            out[key] = None
            continue
        rank = max(1, math.ceil(q * len(data)))
        out[key] = data[rank - 1]
    out["mean"] = round(sum(data) / len(data), 3) if data else None
    return out


def histogram(values: Sequence[float | None], *, lo: float | None = None, hi: float | None = None,
              bins: int = SCORE_BINS) -> dict[str, Any]:
    """Equal-width bins over [lo, hi] (default: the data's range); the last bin includes hi.

    `missing` counts None values (e.g. no review yet) so the bins plus missing add up to the total.
    """
    present = [float(v) for v in values if v is not None]
    missing = len(values) - len(present)
    if lo is None or hi is None:
        if not present:
            return {"bins": [], "missing": missing}
        lo = min(present) if lo is None else lo
        hi = max(present) if hi is None else hi
        if lo >= 0 and hi <= 1:  # rewards: keep the conventional 0-1 axis
            lo, hi = 0.0, 1.0
    if hi <= lo:
        return {"bins": [[lo, hi, len(present)]], "missing": missing}
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in present:
        i = min(bins - 1, max(0, int((v - lo) / width)))
        counts[i] += 1
    edges = [round(lo + i * width, 6) for i in range(bins + 1)]
    return {"bins": [[edges[i], edges[i + 1], counts[i]] for i in range(bins)], "missing": missing}


def message_stats(messages: Any) -> tuple[int, int]:
    """(assistant turns, approximate text tokens = characters / 4) of one conversation."""
    turns = 0
    chars = 0
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            chars += len(str(message))
            continue
        if message.get("role") == "assistant":
            turns += 1
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif content is not None:
            chars += len(str(content))
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                chars += len(str(function.get("name") or "")) + len(str(function.get("arguments") or ""))
    return turns, math.ceil(chars / 4)


_PARENTHESES = re.compile(r"\s*\([^)]*\)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def reason_kinds(reason: str) -> list[str]:
    """The kinds of an exclusion reason, for counting: one per "; " part, numbers as N.

    "score 40 < 80; outcome failure, success required" -> ["score N < N", "outcome failure, success required"]
    """
    return [_NUMBER.sub("N", _PARENTHESES.sub("", part)).strip() for part in reason.split("; ") if part.strip()]
