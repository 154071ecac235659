"""The TextEmbedding rows behind apps.engines.embeddings.embed_stored (`install`, from EnginesConfig.ready).

Vectors are float32 little-endian bytes on both databases. A row is inserted once and never
edited; two workers storing the same text at once both offer it and the first row stays (the same
text under the same model gives the same vector, so which one wins does not matter).
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

from apps.engines import embeddings
from apps.engines.models import TextEmbedding

# Lookups go by this many hashes per query (under SQLite's 999 variables).
LOOKUP_CHUNK = 900
INSERT_BATCH = 500


class RowStore:
    """embeddings.EmbeddingStore over the TextEmbedding table."""

    def lookup(self, shas: Sequence[str], model: str) -> Iterator[tuple[str, Any]]:
        """(sha256, float32 vector) of the hashes stored under `model`, LOOKUP_CHUNK per query."""
        import numpy as np  # deferred: numpy (0.13 s) only where vectors are read, not when the apps load

        wanted = list(dict.fromkeys(shas))
        for start in range(0, len(wanted), LOOKUP_CHUNK):
            rows = TextEmbedding.objects.filter(
                model=model, sha256__in=wanted[start:start + LOOKUP_CHUNK]).values_list("sha256", "vector")
            for sha, blob in rows:
                yield sha, np.frombuffer(blob, dtype="<f4")

    def known(self, shas: Sequence[str], model: str) -> set[str]:
        """Which of the hashes are stored under `model` (no vector read), LOOKUP_CHUNK per query."""
        wanted = list(dict.fromkeys(shas))
        found: set[str] = set()
        for start in range(0, len(wanted), LOOKUP_CHUNK):
            found.update(TextEmbedding.objects.filter(
                model=model, sha256__in=wanted[start:start + LOOKUP_CHUNK]).values_list("sha256", flat=True))
        return found

    def save(self, shas: Sequence[str], vectors: Any, model: str) -> int:
        """Insert these vectors under `model`, skipping hashes already stored; returns how many were offered."""
        import numpy as np  # deferred: numpy (0.13 s) only where vectors are written, not when the apps load

        array = np.asarray(vectors, dtype="<f4")
        if array.ndim != 2 or array.shape[0] != len(shas):
            raise ValueError(f"{len(shas)} texts but vectors of shape {array.shape}")
        TextEmbedding.objects.bulk_create(
            (TextEmbedding(sha256=sha, model=model, dim=array.shape[1], vector=array[i].tobytes())
             for i, sha in enumerate(shas)),
            batch_size=INSERT_BATCH, ignore_conflicts=True,
        )
        return len(shas)


def install() -> None:
    """Make the TextEmbedding table the store embed_stored uses, in this process."""
    embeddings.install_store(RowStore())
