"""Near-duplicate dedup at scale: the partitioned (IVF) path against the exact all-pairs oracle, and embeddings
kept between versions (the store, the finished-iteration job)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from apps.datasets import dedup, embedding_jobs
from apps.datasets.services import dataset_version_create, dataset_version_publish
from apps.engines.models import TextEmbedding
from apps.tasks.signals import iteration_finished
from tests.datasets.test_dedup import CSV, LOOP, PRIMES, PRIMES_REWORDED, SYMPY
from tests.datasets.version_data import make_trajectory
from tests.engines.test_embedding_store import CountingEmbedder

THRESHOLD = 0.92  # the default (DATASET_DEDUP_THRESHOLD)


def generated(n_base: int, seed: int, dim: int = 384, *, with_bases: bool = False) -> Any:
    """Unit vectors shaped like prompt embeddings: tasks that share a topic (cosines 0.3-0.7 between
    them) and 0-3 paraphrases of each, spread around the threshold (cosines about 0.89-0.99).
    with_bases: also the index of the task each row paraphrases."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((20, dim)).astype(np.float32)
    base = rng.standard_normal((n_base, dim)).astype(np.float32) + 1.2 * topics[rng.integers(0, 20, n_base)]
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    rows, bases = [], []
    for k, b in enumerate(base):
        rows.append(b)
        bases.append(k)
        for _ in range(rng.integers(0, 4)):
            v = b + rng.uniform(0.15, 0.5) * rng.standard_normal(dim).astype(np.float32) / np.sqrt(dim)
            rows.append(v / np.linalg.norm(v))
            bases.append(k)
    vectors = np.stack(rows).astype(np.float32)
    return (vectors, bases) if with_bases else vectors


def pairs(neighbours: dedup.Neighbours) -> set[tuple[int, int]]:
    return {(i, j) for i, row in enumerate(neighbours.lists()) for j in row if i != j}


def search(vectors: np.ndarray, *, partitioned: bool, owners: int = 500) -> dedup.Neighbours:
    """near_prompts over vectors held here: all pairs, or partitions of about `owners` prompts."""
    return dedup.near_prompts(len(vectors), lambda rows: vectors[rows], THRESHOLD,
                              exact_max=0 if partitioned else len(vectors), owners=owners)


def test_partitioned_recall_against_the_exact_oracle_is_at_least_099_at_the_default_threshold() -> None:
    vectors = generated(3000, seed=7)
    exact = pairs(search(vectors, partitioned=False))
    found = search(vectors, partitioned=True)
    partitioned = pairs(found)
    assert len(vectors) > 6000 and len(exact) > 2000  # 13 or more partitions, near pairs to find
    assert len(partitioned & exact) / len(exact) >= 0.99
    assert partitioned <= exact  # every cosine is computed exactly: nothing below the threshold
    exact_sims = dict(zip(zip(*np.nonzero(vectors @ vectors.T >= THRESHOLD)), (vectors @ vectors.T)[
        vectors @ vectors.T >= THRESHOLD]))
    for p, (near, sims) in enumerate(map(found.of, range(0, len(vectors), 97))):
        for q, s in zip(near.tolist(), sims.tolist()):
            assert abs(exact_sims[(p * 97, q)] - s) < 1e-5  # each pair carries its own cosine


def test_the_exact_path_finds_every_pair_and_only_those() -> None:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((700, 32)).astype(np.float32)
    vectors[350:] = vectors[:350] + 0.25 * rng.standard_normal((350, 32))  # half of them near another
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = vectors @ vectors.T
    want = [np.nonzero(row >= THRESHOLD)[0].tolist() for row in sims]
    assert search(vectors, partitioned=False).lists() == want
    assert sum(len(r) > 1 for r in want) > 100


def test_a_crowd_is_found_whole_by_the_partitions() -> None:
    rng = np.random.default_rng(3)
    centre = rng.standard_normal(64)
    crowd = centre + 0.02 * rng.standard_normal((200, 64))  # 200 prompts all within the threshold
    others = rng.standard_normal((800, 64))
    vectors = np.concatenate([crowd, others]).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    assert search(vectors, partitioned=True, owners=50).lists() == search(vectors, partitioned=False).lists()


def test_fewer_prompts_than_partitions_hold_and_none_at_all() -> None:
    vectors = generated(5, seed=2)
    assert search(vectors, partitioned=True, owners=1).lists() == search(vectors, partitioned=False).lists()
    empty = search(np.zeros((0, 8), np.float32), partitioned=False)
    assert empty.lists() == [] and len(empty.indptr) == 1


def _candidates(seed: int) -> tuple[list[dedup.Candidate], dict[str, np.ndarray]]:
    """Ranked candidates over generated prompts and action sequences, with the table of their vectors."""
    rng = np.random.default_rng(seed)
    prompts, task_of = generated(1500, seed=seed, with_bases=True)
    actions, way_of = generated(3000, seed=seed + 1, with_bases=True)
    ways: dict[int, list[int]] = {}
    for a, way in enumerate(way_of):
        ways.setdefault(way, []).append(a)
    table: dict[str, np.ndarray] = {}
    out = []
    for i in range(len(prompts) * 2):
        # a rollout of a task does it one of two ways (the task's own), each worded like a paraphrase
        p = int(rng.integers(0, len(prompts)))
        choices = ways[2 * task_of[p] + int(rng.integers(0, 2))]
        a = choices[int(rng.integers(0, len(choices)))]
        table[f"p{p}"], table[f"a{a}"] = prompts[p], actions[a]
        out.append(dedup.Candidate(trajectory_id=i + 1, task_id=p, prompt=f"p{p}", actions=f"a{a}",
                                   norm_hash=f"h{i}", outcome="success" if rng.random() < 0.8 else "failure"))
    return out, table


def test_partitioned_and_exact_dedup_drop_the_same_members(settings: Any, monkeypatch: Any) -> None:
    ranked, table = _candidates(11)

    def stand_in(texts: Any) -> np.ndarray:
        return np.stack([table[t] for t in texts])

    settings.DATASET_DEDUP_EXACT_MAX = 10**9
    exact = dedup.dedup(ranked, threshold=THRESHOLD, embedder=stand_in)
    settings.DATASET_DEDUP_EXACT_MAX = 0
    monkeypatch.setattr(dedup, "PARTITION_OWNERS", 400)  # 8 or more partitions
    ann = dedup.dedup(ranked, threshold=THRESHOLD, embedder=stand_in)
    assert exact.near_removed > 100
    agree = len(set(exact.excluded) & set(ann.excluded)) / len(set(exact.excluded) | set(ann.excluded))
    assert agree >= 0.99


@pytest.mark.django_db
def test_the_bundled_model_data_dedups_the_same_on_the_partitioned_path(make_task: Any, approver: Any, settings: Any) -> None:
    primes, reworded, csv = make_task(prompt=PRIMES), make_task(prompt=PRIMES_REWORDED), make_task(prompt=CSV)
    make_trajectory(primes, code=LOOP, score=90)
    make_trajectory(reworded, code=LOOP.replace("print(*primes)", "print(*primes) "), score=70, id_prefix="x")
    make_trajectory(primes, code=SYMPY, score=50, answer="2 3 5 7 11 13 17 19 23 29")
    make_trajectory(csv, code=LOOP, score=40)
    make_trajectory(primes, code=LOOP + "# " + "x" * 80, outcome="failure", reward=0.0, score=20, id_prefix="f")

    def outcome(name: str) -> tuple[list[int], list[dict[str, Any]]]:
        v = dataset_version_create(dataset_name=name, actor=approver, filter_spec={})
        return list(v.members.order_by("position").values_list("trajectory_id", flat=True)), v.data_card["excluded"]

    exact = outcome("exact")
    settings.DATASET_DEDUP_EXACT_MAX = 0
    ann = outcome("ann")
    assert ann == exact and len(exact[1]) == 1 and exact[1][0]["reason"].startswith("near duplicate of")


@pytest.mark.django_db
def test_a_second_version_of_the_same_members_embeds_nothing(make_task: Any, approver: Any) -> None:
    embed = CountingEmbedder()
    for n in range(4):
        make_trajectory(make_task(prompt=f"Task number {n}: print {n} squared."), code=f"print({n}**2)", score=50 + n)
    v1 = dataset_version_create(dataset_name="d", actor=approver, filter_spec={}, embedder=embed)
    assert len(embed.seen) == 8  # 4 prompts + 4 action sequences
    v2 = dataset_version_create(dataset_name="d2", actor=approver, filter_spec={}, embedder=embed)
    assert len(embed.seen) == 8
    assert v1.counts == v2.counts and v1.counts["members"] == 4


@pytest.mark.django_db
def test_the_embedding_job_fills_the_store_that_version_creation_reads(make_task: Any, approver: Any) -> None:
    embed = CountingEmbedder()
    task = make_task(prompt=PRIMES)
    kept = make_trajectory(task, code=LOOP, score=90)
    copy = make_trajectory(task, code=LOOP.replace("n=2", "n=1"), score=10, id_prefix="z")
    done = embedding_jobs.embed_trajectories([kept.pk, copy.pk, kept.pk], embedder=embed)
    assert done == {"trajectories": 2, "texts": 3}  # one prompt, two action sequences
    assert TextEmbedding.objects.filter(model=embed.model_name).count() == 3
    embedding_jobs.embed_trajectories([kept.pk, copy.pk], embedder=embed)  # delivered twice: nothing new
    assert len(embed.seen) == 3
    v = dataset_version_create(dataset_name="d", actor=approver, filter_spec={}, embedder=embed)
    assert len(embed.seen) == 3
    assert v.counts["members"] == 2  # different actions (hash vectors): both kept


@pytest.mark.django_db
def test_a_published_version_s_members_are_read_from_the_store_for_the_next(make_task: Any, approver: Any) -> None:
    embed = CountingEmbedder()
    task = make_task(prompt=CSV)
    make_trajectory(task, code="print(sum(1 for _ in open('sales.csv')))", score=70)
    make_trajectory(make_task(prompt=PRIMES), code=LOOP, score=60)
    dataset_version_publish(version=dataset_version_create(dataset_name="d", actor=approver, filter_spec={},
                                                           embedder=embed), actor=approver)
    seen = len(embed.seen)
    assert seen == 4
    make_trajectory(task, code="import csv\nprint(sum(float(r[1]) for r in csv.reader(open('sales.csv'))))",
                    score=80, id_prefix="n")
    dataset_version_create(dataset_name="d", actor=approver, filter_spec={}, embedder=embed)
    assert len(embed.seen) == seen + 1  # only the new action sequence (the prompt and the anchor's are stored)


@pytest.mark.django_db  # the signal's other receiver (reviews) queues on the database broker
def test_a_finished_iteration_queues_its_embedding_once_on_the_signal(monkeypatch: Any, settings: Any) -> None:
    queued: list[tuple[Any, ...]] = []
    monkeypatch.setattr(embedding_jobs, "enqueue", lambda *args, **kwargs: queued.append(args))
    iteration_finished.send(sender=None, task_id=12, iteration=3)
    assert queued == [(embedding_jobs.EMBED_JOB, 12, 3)]
    settings.DATASET_EMBED_ON_FINISH = False
    iteration_finished.send(sender=None, task_id=13, iteration=1)
    assert len(queued) == 1


@pytest.mark.django_db
def test_the_job_embeds_only_the_iteration_s_finished_trajectories(make_task: Any, monkeypatch: Any) -> None:
    task = make_task(prompt=PRIMES)
    first = make_trajectory(task, code=LOOP, iteration=1)
    make_trajectory(task, code=SYMPY, iteration=2)
    running = make_trajectory(task, code="print(2)", iteration=1)
    running.status, running.outcome = "running", ""
    running.save(update_fields=["status", "outcome"])
    asked: list[list[int]] = []
    monkeypatch.setattr(embedding_jobs, "embed_trajectories", lambda ids, **kw: asked.append(list(ids)) or {})
    embedding_jobs.embed_iteration(task.pk, 1)
    assert asked == [[first.pk]]
