"""Compact dedup (numpy members, vectors read per prompt-neighbour component) against the previous
implementation, kept here as the oracle: the same exclusions, the same reasons, exact path and ANN."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest

from apps.datasets import dedup
from apps.engines import embeddings
from tests.datasets.test_dedup_ann import THRESHOLD, _candidates


def reference_dedup(ranked: Sequence[dedup.Candidate], *, anchors: Sequence[dedup.Candidate] = (),
                    threshold: float, embedder: Any) -> dict[int, str]:
    """The clustering as it was before members became arrays: every text and vector held at once."""
    def label(c: dedup.Candidate) -> str:
        where = f" published in v{c.published_in}" if c.published_in is not None else ""
        return f"trajectory #{c.trajectory_id}{where}"

    def unique(texts: Any) -> tuple[dict[str, int], np.ndarray]:
        index: dict[str, int] = {}
        for text in texts:
            index.setdefault(text, len(index))
        return index, np.asarray(embedder(list(index)), dtype=np.float32)

    excluded: dict[int, str] = {}
    anchor_ids = {a.trajectory_id for a in anchors}
    survivors, by_hash = [], {}
    for c in list(anchors) + [c for c in ranked if c.trajectory_id not in anchor_ids]:
        kept = by_hash.get(c.norm_hash)
        if kept is not None and c.published_in is None:
            excluded[c.trajectory_id] = f"exact duplicate of {label(kept)}"
            continue
        by_hash.setdefault(c.norm_hash, c)
        survivors.append(c)
    prompt_index, prompt_vecs = unique(c.prompt for c in survivors)
    action_index, action_vecs = unique(c.actions for c in survivors)
    neighbours = dedup.near_prompts(len(prompt_vecs), lambda rows: prompt_vecs[rows], threshold).lists()
    kept_by_prompt: dict[tuple[int, str], list[tuple[dedup.Candidate, int]]] = {}
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
                    excluded[c.trajectory_id] = (
                        f"near duplicate of {label(other)} (prompt cosine {prompt_sim:.3f}, "
                        f"actions cosine {float(sims[best]):.3f}, threshold {threshold:g})")
                    continue
        kept_by_prompt.setdefault((p, c.outcome), []).append((c, a))
    return excluded


def _with_copies_and_anchors(seed: int) -> tuple[list[dedup.Candidate], list[dedup.Candidate], Any]:
    """Generated candidates where one in 20 is an exact copy of an earlier one and one in 10 an anchor."""
    ranked, table = _candidates(seed)
    rng = np.random.default_rng(seed + 5)
    for i in range(20, len(ranked), 20):
        ranked[i].norm_hash = ranked[int(rng.integers(0, i))].norm_hash
    anchors = [dedup.Candidate(**{**vars(c), "published_in": 1 + k % 3}) for k, c in enumerate(ranked[5::10])]
    return ranked, anchors, lambda texts: np.stack([table[t] for t in texts])


@pytest.mark.parametrize("exact_max", [10**9, 0], ids=["exact", "partitioned"])
def test_compact_dedup_excludes_exactly_what_the_previous_implementation_did(settings: Any, monkeypatch: Any,
                                                                             exact_max: int) -> None:
    settings.DATASET_DEDUP_EXACT_MAX = exact_max
    monkeypatch.setattr(dedup, "PARTITION_OWNERS", 400)  # 8 or more partitions on the partitioned path
    ranked, anchors, stand_in = _with_copies_and_anchors(11)
    want = reference_dedup(ranked, anchors=anchors, threshold=THRESHOLD, embedder=stand_in)
    got = dedup.dedup(ranked, anchors=anchors, threshold=THRESHOLD, embedder=stand_in)
    assert got.excluded == want
    assert got.near_removed > 100 and got.exact_removed > 50
    assert got.near_removed + got.exact_removed == len(want)
    assert not set(want) & {a.trajectory_id for a in anchors}


def test_components_are_read_in_chunks_with_the_same_result(settings: Any, monkeypatch: Any) -> None:
    ranked, anchors, stand_in = _with_copies_and_anchors(23)
    whole = dedup.dedup(ranked, anchors=anchors, threshold=THRESHOLD, embedder=stand_in)
    monkeypatch.setattr(dedup, "ACTION_CHUNK", 3)
    reads: list[int] = []
    real = embeddings.KeyedVectors.vectors
    monkeypatch.setattr(embeddings.KeyedVectors, "vectors", lambda self, keys: reads.append(len(keys)) or real(self, keys))
    chunked = dedup.dedup(ranked, anchors=anchors, threshold=THRESHOLD, embedder=stand_in)
    assert chunked.excluded == whole.excluded
    assert len(reads) > 100 and max(reads[1:]) < len(ranked) // 10  # the prompts once, then small action reads


def test_a_member_alone_in_its_component_reads_no_action_vector(monkeypatch: Any) -> None:
    rng = np.random.default_rng(1)
    far = rng.standard_normal((6, 32)).astype(np.float32)
    far /= np.linalg.norm(far, axis=1, keepdims=True)
    table = {f"p{i}": v for i, v in enumerate(far)} | {f"a{i}": v for i, v in enumerate(far)}
    # p0 is done twice the same way (a near duplicate); p1..p5 once each; p1 twice but with two outcomes
    ranked = [dedup.Candidate(trajectory_id=t, task_id=p, prompt=f"p{p}", actions=f"a{a}", norm_hash=f"h{t}",
                              outcome=o)
              for t, p, a, o in [(1, 0, 0, "success"), (2, 0, 0, "success"), (3, 1, 1, "success"),
                                 (4, 1, 1, "failure"), (5, 2, 2, "success"), (6, 3, 3, "success")]]
    asked: list[bytes] = []
    real = embeddings.KeyedVectors.vectors
    monkeypatch.setattr(embeddings.KeyedVectors, "vectors",
                        lambda self, keys: asked.extend(bytes(k).ljust(32, b"\0") for k in keys) or real(self, keys))
    result = dedup.dedup(ranked, threshold=THRESHOLD, embedder=lambda texts: np.stack([table[t] for t in texts]))
    assert result.excluded.keys() == {2}
    assert len(asked) == 5  # the four distinct prompts, then one action sequence: p0's, done twice
    assert asked[4:] == [bytes.fromhex(embeddings.text_sha256("a0"))]


@pytest.mark.django_db
def test_keyed_vectors_store_the_missing_and_read_back_even_a_digest_ending_in_zero() -> None:
    from tests.engines.test_embedding_store import CountingEmbedder

    text = next(t for t in (f"text {i}" for i in range(5000)) if bytes.fromhex(embeddings.text_sha256(t))[-1] == 0)
    embed = CountingEmbedder()
    keyed = embeddings.KeyedVectors(embed)
    keys = keyed.keys([text, "other", text])
    assert keyed.embedded == 2 and len(embed.seen) == 2
    again = embeddings.KeyedVectors(embed)
    assert np.array_equal(again.keys([text, "other"]), keys[:2]) and again.embedded == 0
    vectors = again.vectors(keys)
    assert vectors.shape[0] == 3 and np.array_equal(vectors[0], vectors[2])
    assert np.array_equal(vectors[0], np.asarray(embed([text]), dtype=np.float32)[0])


def test_members_are_ranked_by_score_then_reward_then_a_human_accept_then_the_oldest_id() -> None:
    import random

    from apps.datasets import services

    pick = random.Random(4)
    rows = [services._Row(trajectory_id=i, task_id=1, scene="code_exec", batch_id=None, model="m", outcome="success",
                          reward=pick.choice([None, 0.0, 0.5, 1.0]), score=pick.choice([None, 50.0, 90.0]),
                          verdict=pick.choice(["accept", "reject", ""]), usage_tokens=0)
            for i in pick.sample(range(1, 10_000), 300)]

    def best_first(r: Any) -> tuple:  # the documented order, as one Python sort key
        return (-(r.score if r.score is not None else -1.0), -(r.reward if r.reward is not None else float("-inf")),
                0 if r.verdict == "accept" else 1, r.trajectory_id)

    ranked = services._ranked(services._Rows.collect(rows)).tolist()
    assert ranked == [r.trajectory_id for r in sorted(rows, key=best_first)]
    assert services._ranked(services._Rows.collect([])).tolist() == []
