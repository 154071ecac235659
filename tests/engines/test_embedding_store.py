"""The embedding store: each text embedded once per model, vectors kept as float32 bytes, stand-ins
(embedders without a model name) never stored; toucan's question dedup reads earlier questions from it."""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np
import pytest

from apps.engines import embeddings
from apps.engines.models import TextEmbedding
from apps.engines.scenes.toucan import questions

pytestmark = pytest.mark.django_db


def hash_vector(text: str, dim: int = 16) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class CountingEmbedder:
    """A deterministic embedder under a model name of its own; records every text it was asked for."""

    def __init__(self, model_name: str = "test-hash-16") -> None:
        self.model_name = model_name
        self.seen: list[str] = []

    def __call__(self, texts: Sequence[str]) -> Any:
        self.seen += list(texts)
        return np.stack([hash_vector(t) for t in texts])


def test_each_text_is_embedded_once_and_read_back_bit_for_bit() -> None:
    embed = CountingEmbedder()
    first = embeddings.embed_stored(["alpha", "beta", "alpha"], embedder=embed)
    assert embed.seen == ["alpha", "beta"]  # a text repeated in one call is embedded once
    assert first.shape == (3, 16) and first.dtype == np.float32
    again = embeddings.embed_stored(["beta", "gamma", "alpha"], embedder=embed)
    assert embed.seen == ["alpha", "beta", "gamma"]
    assert np.array_equal(again[0], first[1]) and np.array_equal(again[2], first[0])
    row = TextEmbedding.objects.get(sha256=embeddings.text_sha256("alpha"), model="test-hash-16")
    assert row.dim == 16 and np.array_equal(np.frombuffer(bytes(row.vector), dtype="<f4"), hash_vector("alpha"))
    assert TextEmbedding.objects.filter(model="test-hash-16").count() == 3


def test_the_store_is_keyed_by_model_too() -> None:
    a, b = CountingEmbedder("model-a"), CountingEmbedder("model-b")
    embeddings.embed_stored(["same text"], embedder=a)
    embeddings.embed_stored(["same text"], embedder=b)
    assert a.seen == b.seen == ["same text"]
    assert TextEmbedding.objects.filter(sha256=embeddings.text_sha256("same text")).count() == 2


def test_a_stand_in_without_a_model_name_is_called_and_never_stored() -> None:
    calls: list[list[str]] = []

    def stand_in(texts: Sequence[str]) -> Any:
        calls.append(list(texts))
        return np.stack([hash_vector(t) for t in texts])

    embeddings.embed_stored(["x", "y"], embedder=stand_in)
    embeddings.embed_stored(["x"], embedder=stand_in)
    assert calls == [["x", "y"], ["x"]]
    assert not TextEmbedding.objects.exists()


def test_a_row_stored_meanwhile_by_another_worker_is_kept() -> None:
    embed = CountingEmbedder()
    other = np.ones(16, dtype="<f4") / 4.0
    TextEmbedding.objects.create(sha256=embeddings.text_sha256("raced"), model=embed.model_name, dim=16,
                                 vector=other.tobytes())
    from apps.engines.embedding_store import RowStore

    RowStore().save([embeddings.text_sha256("raced")], np.stack([hash_vector("raced")]), embed.model_name)
    assert TextEmbedding.objects.filter(model=embed.model_name).count() == 1
    assert np.array_equal(embeddings.embed_stored(["raced"], embedder=embed)[0], other)
    assert embed.seen == []


def test_vectors_of_the_wrong_shape_are_refused_and_nothing_is_written() -> None:
    from apps.engines.embedding_store import RowStore

    with pytest.raises(ValueError, match="2 texts but vectors of shape"):
        RowStore().save(["a" * 64, "b" * 64], np.zeros((3, 16)), "m")
    assert not TextEmbedding.objects.exists()


def test_toucan_question_dedup_embeds_earlier_questions_once() -> None:
    embed = CountingEmbedder()
    earlier = ["List the open issues of the repository.", "Which files changed in the last commit?"]
    questions.dedup_questions([("a", "Show the newest release notes.")], earlier, embedder=embed)
    assert sorted(embed.seen) == sorted(["Show the newest release notes.", *earlier])
    verdicts = questions.dedup_questions([("b", "Count the stars of the project.")], earlier, embedder=embed)
    assert verdicts == {"b": None}
    assert embed.seen[3:] == ["Count the stars of the project."]  # the earlier ones were read
