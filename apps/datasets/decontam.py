"""Decontamination: drop members whose prompts or answers match a benchmark's test items.

Test sets are files the operator puts in DATASET_TESTSET_DIR (nothing is downloaded): NAME.jsonl
(one JSON object per line; its text is the string values of the fields in TEXT_FIELDS, its id
the first of ID_FIELDS present, else the line number) or NAME.txt (one item per line). A filter
spec names them:

    "decontam": {"test_sets": ["gsm8k-test", "humaneval"], "ngram": 13, "ngram_threshold": 0.5,
                 "embedding": true, "cosine_threshold": 0.9}

A member is checked on two texts: its task's prompt and its answer (the final answer and the
text of its assistant turns). It matches a test item when

* **n-gram overlap**: at least `ngram_threshold` of the item's word n-grams (lower-cased `\\w+`
  words, n = `ngram`; an item shorter than n words is one gram of all its words) occur in
  either text, or
* **embedding similarity** (with `embedding`): the cosine of the all-MiniLM-L6-v2 embeddings
  (the bundled model dedup.py uses, read from the embedding store and embedded only when
  missing there) of the prompt, or of the answer, and of the item reaches `cosine_threshold`.

Matched members are excluded from the version (stage "decontam") with the benchmark, the item
and the score; the data card lists them and counts them per benchmark.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import orjson
from django.conf import settings

from apps.datasets import dedup as dedup_mod
from apps.engines.embeddings import embed_stored
from apps.tasks.models import Trajectory

KEYS = ("test_sets", "ngram", "ngram_threshold", "embedding", "cosine_threshold")
TEXT_FIELDS = ("question", "prompt", "problem", "instruction", "input", "query", "text", "answer", "solution",
               "output", "canonical_solution", "response")
ID_FIELDS = ("id", "task_id", "instance_id", "question_id", "problem_id", "idx")
DEFAULTS = {"ngram": 13, "ngram_threshold": 0.5, "embedding": True, "cosine_threshold": 0.9}
MAX_ITEMS = 200_000
_WORD = re.compile(r"\w+")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class DecontamError(ValueError):
    """A decontamination spec or test set that cannot be used; the message says which and why."""


def validate_spec(raw: Any) -> dict[str, Any] | None:
    """The normalized `decontam` part of a filter spec (None: off), or DecontamError."""
    if raw is None or raw == {}:
        return None
    if not isinstance(raw, dict):
        raise DecontamError("must be an object {test_sets, ngram, ngram_threshold, embedding, cosine_threshold}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise DecontamError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    names = raw.get("test_sets")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and _NAME.match(n) for n in names):
        raise DecontamError("test_sets: a non-empty list of test set names (files in DATASET_TESTSET_DIR, "
                            "letters, digits, '.', '_' and '-')")
    spec = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None}, "test_sets": sorted(set(names))}
    n = spec["ngram"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 50:
        raise DecontamError("ngram: a whole number from 1 to 50")
    for key in ("ngram_threshold", "cosine_threshold"):
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise DecontamError(f"{key}: a number above 0, at most 1")
        spec[key] = float(value)
    if not isinstance(spec["embedding"], bool):
        raise DecontamError("embedding: true or false")
    for name in spec["test_sets"]:
        test_set_path(name)  # refuse a missing file now, before any work
    return spec


def test_set_path(name: str) -> Path:
    base = Path(settings.DATASET_TESTSET_DIR)
    for suffix in (".jsonl", ".txt"):
        path = base / f"{name}{suffix}"
        if path.is_file():
            return path
    raise DecontamError(f"test set {name!r}: no {name}.jsonl or {name}.txt in DATASET_TESTSET_DIR ({base})")


@dataclass
class Item:
    benchmark: str
    item_id: str
    text: str


@dataclass
class TestSet:
    name: str
    sha256: str
    items: list[Item]


def load_test_set(name: str) -> TestSet:
    """Read one test set file; DecontamError names the file and line of anything unreadable."""
    path = test_set_path(name)
    data = path.read_bytes()
    items: list[Item] = []
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(items) >= MAX_ITEMS:
            raise DecontamError(f"{path.name}: more than {MAX_ITEMS} items")
        if path.suffix == ".txt":
            items.append(Item(name, str(number), raw.decode("utf-8", errors="replace").strip()))
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise DecontamError(f"{path.name}:{number}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise DecontamError(f"{path.name}:{number}: not a JSON object")
        text = "\n".join(str(obj[f]) for f in TEXT_FIELDS if isinstance(obj.get(f), str) and obj[f].strip())
        if not text:
            raise DecontamError(f"{path.name}:{number}: none of the text fields {', '.join(TEXT_FIELDS)}")
        item_id = next((str(obj[f]) for f in ID_FIELDS if obj.get(f) not in (None, "")), str(number))
        items.append(Item(name, item_id, text))
    if not items:
        raise DecontamError(f"{path.name}: no items")
    return TestSet(name, hashlib.sha256(data).hexdigest(), items)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def grams(tokens: Sequence[str], n: int) -> set[str]:
    if not tokens:
        return set()
    if len(tokens) < n:
        return {" ".join(tokens)}
    return {" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@dataclass
class Member:
    trajectory_id: int
    prompt: str
    answer: str


@dataclass
class Match:
    benchmark: str
    item_id: str
    method: str  # "ngram" | "embedding"
    score: float
    field: str  # "prompt" | "answer"

    def reason(self, spec: dict[str, Any]) -> str:
        if self.method == "ngram":
            return (f"contaminated: {self.field} matches {self.benchmark} item {self.item_id} "
                    f"({spec['ngram']}-gram overlap {self.score:.2f} >= {spec['ngram_threshold']:g})")
        return (f"contaminated: {self.field} matches {self.benchmark} item {self.item_id} "
                f"(MiniLM cosine {self.score:.3f} >= {spec['cosine_threshold']:g})")


@dataclass
class DecontamResult:
    matches: dict[int, Match] = field(default_factory=dict)
    test_sets: dict[str, dict[str, Any]] = field(default_factory=dict)


def check(members: Iterable[Member], spec: dict[str, Any], *, embedder: dedup_mod.Embedder | None = None,
          block: int = 1024) -> DecontamResult:
    """The members that match a test item (the strongest match of each) and the test sets read.

    Members are taken `block` at a time (the n-grams, then the embeddings of the block), so memory
    holds the test items and one block, whatever the number of members."""
    result = DecontamResult()
    items: list[Item] = []
    for name in spec["test_sets"]:
        test_set = load_test_set(name)
        result.test_sets[name] = {"file": test_set_path(name).name, "sha256": test_set.sha256,
                                  "items": len(test_set.items)}
        items += test_set.items
    n = spec["ngram"]
    index: dict[str, list[int]] = {}
    sizes: list[int] = []
    for k, item in enumerate(items):
        item_grams = grams(words(item.text), n)
        sizes.append(len(item_grams))
        for g in item_grams:
            index.setdefault(g, []).append(k)
    embed = embedder or dedup_mod.sentence_embedder
    item_vectors = None
    chunk: list[Member] = []
    for member in members:
        chunk.append(member)
        if len(chunk) == block:
            item_vectors = _check_block(chunk, items, index, sizes, spec, embed, item_vectors, result)
            chunk = []
    if chunk:
        _check_block(chunk, items, index, sizes, spec, embed, item_vectors, result)
    return result


def _check_block(members: list[Member], items: list[Item], index: dict[str, list[int]], sizes: list[int],
                 spec: dict[str, Any], embedder: Any, item_vectors: Any, result: DecontamResult) -> Any:
    """Check one block of members; returns the items' vectors (embedded on the first block that needs them)."""
    n = spec["ngram"]
    for member in members:
        for where, text in (("prompt", member.prompt), ("answer", member.answer)):
            hits: dict[int, int] = {}
            for g in grams(words(text), n):
                for k in index.get(g, ()):
                    hits[k] = hits.get(k, 0) + 1
            for k, count in hits.items():
                score = count / sizes[k]
                if score >= spec["ngram_threshold"]:
                    _keep_best(result, member.trajectory_id,
                               Match(items[k].benchmark, items[k].item_id, "ngram", score, where))
    if not (spec["embedding"] and items):
        return item_vectors
    texts = [(m, where, text) for m in members for where, text in (("prompt", m.prompt), ("answer", m.answer))
             if text.strip()]
    if not texts:
        return item_vectors
    if item_vectors is None:
        # Through the embedding store: a test set's items, and prompts seen by an earlier version,
        # are embedded once.
        item_vectors = embed_stored([item.text for item in items], embedder=embedder)
    threshold = spec["cosine_threshold"]
    cosines = embed_stored([t for _, _, t in texts], embedder=embedder) @ item_vectors.T
    best = cosines.argmax(axis=1)
    for row, (member, where, _) in enumerate(texts):
        k = int(best[row])
        score = float(cosines[row, k])
        if score >= threshold:
            _keep_best(result, member.trajectory_id, Match(items[k].benchmark, items[k].item_id, "embedding", score, where))
    return item_vectors


def _keep_best(result: DecontamResult, trajectory_id: int, match: Match) -> None:
    # n-gram evidence wins over similarity; within a method, the higher score.
    old = result.matches.get(trajectory_id)
    rank = (match.method == "ngram", match.score)
    if old is None or rank > (old.method == "ngram", old.score):
        result.matches[trajectory_id] = match


def members_of(trajectory_ids: Sequence[int], chunk: int = 500) -> Iterable[Member]:
    """The prompt and answer texts of these trajectories, read in chunks."""
    for start in range(0, len(trajectory_ids), chunk):
        rows = Trajectory.objects.filter(pk__in=trajectory_ids[start:start + chunk]).values_list(
            "pk", "task__prompt", "final_answer", "messages")
        for pk, prompt, final_answer, messages in rows.iterator(chunk_size=chunk):
            said = [m.get("content") for m in messages or [] if isinstance(m, dict) and m.get("role") == "assistant"
                    and isinstance(m.get("content"), str)]
            yield Member(pk, prompt or "", "\n".join([final_answer or "", *said]).strip())


def card_section(spec: dict[str, Any], result: DecontamResult) -> dict[str, Any]:
    by_benchmark: dict[str, int] = {}
    for match in result.matches.values():
        by_benchmark[match.benchmark] = by_benchmark.get(match.benchmark, 0) + 1
    return {**spec, "model": dedup_mod.EMBEDDING_MODEL_NAME if spec["embedding"] else None,
            "compared": "task prompt and answer (final answer and assistant text) against each test item",
            "test_set_files": result.test_sets, "excluded": len(result.matches),
            "excluded_by_benchmark": dict(sorted(by_benchmark.items()))}
