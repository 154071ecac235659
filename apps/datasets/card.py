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


_COMPARED = re.compile(r"^(?P<label>.+?) (?P<value>-?\d+(?:\.\d+)?|none) (?P<op><=|>=|<|>) (?P<limit>-?\d+(?:\.\d+)?)$")
_MEASURED = re.compile(r"^(?P<label>[^()]*?[^\d\s.()-][^()]*?) (?P<value>-?\d+(?:\.\d+)?)(?: (?P<op><=|>=|<|>) (?P<limit>-?\d+(?:\.\d+)?))?$")
_REFERENCE = re.compile(r"(#|\bitem )[\w.-]+")


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"


def reason_summary(reasons: Iterable[str]) -> dict[str, int]:
    """Exclusion reasons counted by kind, each kind with its real numbers, most frequent first.

    A measured value against a limit is grouped by the limit and shown as the range measured:
    three "reward 0.2 < 0.5" style parts -> {"reward < 0.5 (reward 0–0.3)": 3}; a duplicate's
    "(prompt cosine 0.991, actions cosine 0.95, threshold 0.92)" -> the cosines' ranges; the ids a
    reason names ("#7", "item 12") are left out of the kind (the list of exclusions has them).
    """
    counts: Counter[tuple[Any, ...]] = Counter()
    measured: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    for reason in reasons:
        for part in (p.strip() for p in reason.split("; ")):
            if not part:
                continue
            details = re.findall(r"\(([^)]*)\)", part)
            main = _REFERENCE.sub(lambda m: f"{m.group(1)}…", _PARENTHESES.sub("", part)).strip()
            values: dict[str, list[float]] = {}
            compared = _COMPARED.match(main)
            if compared:
                main = f"{compared['label']} {compared['op']} {compared['limit']}"
                if compared["value"] != "none":
                    values[compared["label"]] = [float(compared["value"])]
            limits: dict[str, str] = {}  # a measured label -> its limit ("threshold 0.92" pieces go as they are)
            plain: list[str] = []
            for detail in details:
                for piece in (d.strip() for d in detail.split(",")):
                    m = _MEASURED.match(piece)
                    if m and m["op"]:
                        limits[m["label"]] = f"{m['op']} {m['limit']}"
                        values[m["label"]] = [float(m["value"])]
                    elif m and m["label"] == "threshold":
                        plain.append(piece)
                    elif m:
                        values[m["label"]] = [float(m["value"])]
            kind = (main, tuple(sorted(limits.items())), tuple(plain))
            counts[kind] += 1
            slot = measured.setdefault(kind, {})
            for label, vs in values.items():
                slot.setdefault(label, []).extend(vs)
    out = {}
    for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        main, limits, plain = kind[0], dict(kind[1]), list(kind[2])
        details = [f"{label} {_span(vs)}" + (f" {limits[label]}" if label in limits else "")
                   for label, vs in measured.get(kind, {}).items()] + plain
        out[f"{main} ({', '.join(details)})" if details else main] = n
    return out
