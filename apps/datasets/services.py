"""Writes for datasets: build a version from a filter spec, publish it, start exports.

Each service is one transaction writing its own audit row. Building a version reads and
embeds outside the transaction (it can take a while) and writes the version, its members and
its data card in one short transaction at the end: a failure leaves nothing behind.
"""
from __future__ import annotations

import array
import bisect
import hashlib
import json
import logging
import math
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.urls import reverse
from django.utils import timezone

from apps.datasets import card as card_stats, decontam, dedup as dedup_mod, exportability, hf_layout, templates
from apps.datasets.exporters import FORMATS
from apps.datasets.exporters.records import pass_rate, task_pass_counts
from apps.datasets.exporters.vision import card_images
from apps.datasets.models import (
    Dataset, DatasetMember, DatasetVersion, ExportabilityRun, ExportJob, TemplateCheck, VersionBuild,
)
from apps.datasets.selectors import trajectories_with_reviews
from apps.datasets.spec import LATER_DEFAULTS, DatasetError, FilterSpecError, quality_reasons, validate_filter_spec
from apps.engines.corpora import scene_corpus_licences
from apps.reviews.models import Correction
from apps.tasks.models import Task, Trajectory
from trajplatform import schedules
from trajplatform.audit import audit_record
from trajplatform.realtime import send_to_groups
from trajplatform.webhooks import webhook_emit

__all__ = [
    "DatasetError", "FilterSpecError", "ExportError", "dataset_version_create", "dataset_version_publish",
    "export_start", "export_path", "exporter_formats", "publish_warnings", "version_build_start",
]

log = logging.getLogger(__name__)

CREATE_PERMISSION = "datasets.add_datasetversion"
PUBLISH_PERMISSION = "datasets.publish_datasetversion"
EXPORT_PERMISSION = "datasets.add_datasetversion"
EXPORT_JOB = "apps.datasets.jobs.run_export"
BUILD_JOB = "apps.datasets.jobs.run_version_build"
EXPORTABILITY_JOB = "apps.datasets.jobs.run_exportability"
# An exportability run resumes after its finished chunks, so each claim moves it on: a 1M-member
# version outlasting Q_TIMEOUT is killed, reaped and continued, more than a build's 3 times if need be.
EXPORTABILITY_MAX_CLAIMS = 5
CARD_SCHEMA = 1
READ_CHUNK = 500
MEMBER_BULK = 2000
SPLITS = ("all", "train", "validation")

Progress = Callable[[str, int, int], None]  # (stage, done, total)


class ExportError(DatasetError):
    """An export that cannot start or cannot finish; nothing was put in place. `field` names the
    export option a refusal is about (format, split, layout, roles), "" when it is none of them:
    the API answers it under error.details.fields.<field>, the console form under that field."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def _require(actor: Any, permission: str, what: str) -> None:
    """Users need the permission; actor None is the operator's command line (trusted)."""
    if actor is not None and not actor.has_perm(permission):
        raise PermissionDenied(f"{what} needs the {permission} permission (approver role or above)")


def exporter_formats() -> dict[str, Any]:
    """The registered exporters (imported lazily: the module is large and optional at start-up)."""
    return FORMATS


# --- building a version -----------------------------------------------------------------------

@dataclass(slots=True)
class _Row:
    """One passing trajectory as the scan reads it (the preview's sample; a version keeps _Rows)."""

    trajectory_id: int
    task_id: int
    scene: str
    batch_id: int | None
    model: str
    outcome: str
    reward: float | None
    score: float | None
    verdict: str
    usage_tokens: int
    corrects: int | None = None  # prefer_corrections: the original trajectory this correction replaces


# _Rows' numeric columns: (its name, the _Row field, array typecode); None is NaN ("d") or -1 ("q")
_NUMERIC = (("ids", "trajectory_id", "q"), ("task_id", "task_id", "q"), ("batch_id", "batch_id", "q"),
            ("reward", "reward", "d"), ("score", "score", "d"), ("usage_tokens", "usage_tokens", "q"),
            ("corrects", "corrects", "q"))
_LABELLED = ("scene", "model", "outcome", "verdict")  # stored as codes into one list of labels each


class _Rows:
    """The scan's passing trajectories as numpy columns, in (task, id) order: about 60 bytes a row
    instead of a million objects; with the pass rates of the tasks in scope (sorted task ids, their
    passes and rollouts)."""

    def __init__(self, columns: dict[str, Any], codes: dict[str, Any], labels: dict[str, list[str]],
                 rates: tuple[Any, Any, Any]) -> None:
        self.columns, self.codes, self.labels, self.rates = columns, codes, labels, rates
        self.ids, self.task_id = columns["ids"], columns["task_id"]

    @classmethod
    def collect(cls, rows: Any, rates: tuple[Any, Any, Any] | None = None) -> _Rows:
        """The _Rows of an iterable of _Row (read once, one row at a time)."""
        import numpy as np  # deferred: numpy (0.13 s) where versions are built

        numeric = {name: array.array(code) for name, _, code in _NUMERIC}
        codes = {name: array.array("i") for name in _LABELLED}
        seen: dict[str, dict[str, int]] = {name: {} for name in _LABELLED}
        for r in rows:
            for name, field, code in _NUMERIC:
                value = getattr(r, field)
                numeric[name].append((math.nan if code == "d" else -1) if value is None else value)
            for name in _LABELLED:
                codes[name].append(seen[name].setdefault(getattr(r, name), len(seen[name])))
        if rates is None:
            rates = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32))
        return cls({name: np.frombuffer(values, dtype=np.float64 if values.typecode == "d" else np.int64).copy()
                    for name, values in numeric.items()},
                   {name: np.frombuffer(values, dtype=np.int32).copy() for name, values in codes.items()},
                   {name: list(seen[name]) for name in _LABELLED}, rates)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, index: Any) -> _Rows:
        """The rows at `index` (a boolean mask or positions), in that order."""
        return _Rows({name: values[index] for name, values in self.columns.items()},
                     {name: values[index] for name, values in self.codes.items()}, self.labels, self.rates)

    def head(self, n: int) -> list[_Row]:
        return [self.row(i) for i in range(min(n, len(self)))]

    def row(self, i: int) -> _Row:
        values = {field: self.nullable(name, slice(i, i + 1))[0] for name, field, _ in _NUMERIC}
        return _Row(**values, **{name: self.labels[name][self.codes[name][i]] for name in _LABELLED})

    def nullable(self, name: str, index: Any = slice(None)) -> list[Any]:
        """A numeric column as Python values, None where the trajectory has none."""
        values = self.columns[name][index]
        if values.dtype.kind == "f":
            return [None if math.isnan(v) else v for v in values.tolist()]
        return [None if v < 0 else v for v in values.tolist()] if name in ("batch_id", "corrects") else values.tolist()

    def labelled(self, name: str, mask: Any = None) -> list[str]:
        """A labelled column (scene, model, outcome, verdict) as its labels."""
        labels, codes = self.labels[name], self.codes[name] if mask is None else self.codes[name][mask]
        return [labels[c] for c in codes.tolist()]

    def tasks(self) -> Any:
        """The rows' tasks, ascending and once each."""
        import numpy as np  # deferred: numpy (0.13 s) where versions are built

        return np.unique(self.task_id)

    def corrections(self) -> list[tuple[int, int]]:
        """(original, correction) of each row that is a reviewer's correction."""
        corrects = self.columns["corrects"]
        chosen = corrects >= 0
        return list(zip(corrects[chosen].tolist(), self.ids[chosen].tolist()))

    def pass_counts(self, task_ids: Any) -> tuple[Any, Any, Any]:
        """(known, passed, rollouts) of these tasks (ascending): known False where a task has no rollout."""
        import numpy as np  # deferred: numpy (0.13 s) where versions are built

        tasks, passed, rollouts = self.rates
        at = np.searchsorted(tasks, task_ids).clip(0, max(len(tasks) - 1, 0)) if len(tasks) else None
        if at is None:
            zeros = np.zeros(len(task_ids), dtype=np.int32)
            return zeros.astype(bool), zeros, zeros
        known = tasks[at] == task_ids
        return known, np.where(known, passed[at], 0), np.where(known, rollouts[at], 0)


def _scope(spec: dict[str, Any]) -> Any:
    qs = Trajectory.objects.filter(status=Trajectory.Status.FINISHED)
    if spec["scenes"]:
        qs = qs.filter(task__scene__in=spec["scenes"])
    if spec["batches"]:
        qs = qs.filter(task__batch_id__in=spec["batches"])
    if spec["models"]:
        qs = qs.filter(model__in=spec["models"])
    if spec["since"]:
        qs = qs.filter(finished_at__gte=spec["since"])
    if spec["until"]:
        qs = qs.filter(finished_at__lt=spec["until"])
    return qs


# Corrections of corrections followed at most this deep (each step is one query).
MAX_CORRECTION_CHAIN = 20
SCAN_FIELDS = ("id", "task_id", "task__scene", "task__batch_id", "model", "outcome", "reward", "review_overall",
               "human_verdict", "total_tokens")


def _with_corrections(spec: dict[str, Any], qs: Any) -> Any:
    """Under prefer_corrections, each row of `qs` whose trajectory was corrected becomes its latest
    correction's row (its own score and verdict, else the original's), with `corrects` set to the
    original's id; a corrected trajectory is never also a row of its own."""
    if not spec.get("prefer_corrections"):
        yield from qs.iterator(chunk_size=2000)
        return
    latest = dict(Correction.objects.filter(original__in=_scope(spec)).order_by("created_at", "id")
                  .values_list("original_id", "corrected_id"))
    frontier = set(latest.values())
    for _ in range(MAX_CORRECTION_CHAIN):  # a correction of a correction: follow it to the newest
        later = dict(Correction.objects.filter(original_id__in=frontier).order_by("created_at", "id")
                     .values_list("original_id", "corrected_id"))
        if not later:
            break
        latest = {original: later.get(corrected, corrected) for original, corrected in latest.items()}
        frontier = set(later.values())
    corrected_rows = {v["id"]: v for v in trajectories_with_reviews(Trajectory.objects.filter(
        pk__in=set(latest.values()), status=Trajectory.Status.FINISHED)).values(*SCAN_FIELDS)}
    for v in qs.exclude(correction_of__isnull=False).iterator(chunk_size=2000):
        replacement = corrected_rows.get(latest.get(v["id"]))
        if replacement is None:
            yield v
            continue
        yield {**replacement, "corrects": v["id"],
               "review_overall": v["review_overall"] if replacement["review_overall"] is None
               else replacement["review_overall"],
               "human_verdict": replacement["human_verdict"] or v["human_verdict"]}


def _pass_counts(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(task ids ascending, passes, rollouts) of the tasks in scope with a rollout, as arrays."""
    import numpy as np  # deferred: numpy (0.13 s) where versions are built

    columns = (array.array("q"), array.array("q"), array.array("q"))
    for row in task_pass_counts(_scope(spec).values("task_id")):
        for column, value in zip(columns, row):
            column.append(value)
    tasks, passed, rollouts = (np.frombuffer(c, dtype=np.int64).copy() for c in columns)
    order = np.argsort(tasks, kind="stable")
    return tasks[order], passed[order].astype(np.int32), rollouts[order].astype(np.int32)


def _scan(spec: dict[str, Any]) -> tuple[_Rows, list[dict[str, Any]], int]:
    """(rows passing the quality rules, excluded with reasons, trajectories in scope)."""
    excluded: list[dict[str, Any]] = []
    scanned = 0
    qs = trajectories_with_reviews(_scope(spec)).order_by("task_id", "id").values(*SCAN_FIELDS)
    rates = _pass_counts(spec)
    lookup = _Rows.collect((), rates)
    task_rate: list[Any] = [None, None]  # the task last looked up and its pass rate (rows come by task)

    def passing() -> Any:
        nonlocal scanned
        for v in _with_corrections(spec, qs):
            scanned += 1
            if v["task_id"] != task_rate[0]:
                known, passed, rollouts = lookup.pass_counts([v["task_id"]])
                task_rate[:] = v["task_id"], pass_rate(int(passed[0]), int(rollouts[0])) if known[0] else None
            v["task_pass_rate"] = task_rate[1]
            reasons = quality_reasons(v, spec)
            if reasons:
                excluded.append({"trajectory_id": v["id"], "task_id": v["task_id"], "stage": "filter",
                                 "reason": "; ".join(reasons)})
                continue
            yield _Row(trajectory_id=v["id"], task_id=v["task_id"], scene=v["task__scene"], batch_id=v["task__batch_id"],
                       model=v["model"], outcome=v["outcome"], reward=v["reward"], score=v["review_overall"],
                       verdict=v["human_verdict"] or "", usage_tokens=v["total_tokens"], corrects=v.get("corrects"))

    rows = _Rows.collect(passing(), rates)
    return rows, excluded, scanned


def version_preview(filter_spec: Any, *, sample: int = 10) -> dict[str, Any]:
    """What a version with this filter spec would select before dedup and the split (the console's
    version builder): counts and the first `sample` passing rows; writes nothing. FilterSpecError
    on a bad spec."""
    spec = validate_filter_spec(filter_spec)
    rows, excluded, scanned = _scan(spec)
    return {"spec": spec, "scanned": scanned, "passing": len(rows), "excluded": len(excluded),
            "sample": rows.head(sample), "tasks": len(rows.tasks()), "corrections": len(rows.corrections())}


@dataclass
class _DedupInputs:
    """What dedup and the card read of each trajectory, as numpy arrays aligned with `ids` (sorted):
    no message and no text is kept (the action sequence is the key of its stored vector)."""

    ids: Any  # int64, ascending
    found: Any  # bool: the trajectory exists (an anchor may have been deleted since)
    task_id: Any  # int64
    norm_hash: Any  # S16: dedup.NORM_DIGEST bytes of the normalized hash
    action: Any  # S32: the key of the action sequence's vector (near dedup on), else None
    outcome: Any  # int32 code: outcomes[code] is the outcome
    outcomes: list[str]
    turns: Any  # int32
    text_tokens: Any  # int64

    def at(self, trajectory_ids: Any) -> Any:
        """The rows of these trajectory ids."""
        import numpy as np  # deferred: numpy (0.13 s) where versions are built

        return np.searchsorted(self.ids, np.asarray(trajectory_ids, dtype=np.int64))

    def has(self, trajectory_ids: Any) -> Any:
        """Whether each of these trajectory ids was asked for and found."""
        at = self.at(trajectory_ids).clip(0, max(len(self.ids) - 1, 0))
        return (self.ids[at] == trajectory_ids) & self.found[at] if len(self.ids) else at.astype(bool)


def _dedup_inputs(ids: Any, keyed: Any, progress: Progress | None) -> _DedupInputs:
    """The dedup inputs of the trajectories `ids` (sorted), streamed READ_CHUNK at a time; with
    `keyed` (a KeyedVectors: near dedup on), each chunk's action sequences are keyed and the ones
    missing from the store embedded before the next chunk is read."""
    import numpy as np  # deferred: numpy (0.13 s) where versions are built

    n = len(ids)
    out = _DedupInputs(
        ids=np.asarray(ids, dtype=np.int64), found=np.zeros(n, dtype=bool), task_id=np.zeros(n, dtype=np.int64),
        norm_hash=np.zeros(n, dtype=f"S{dedup_mod.NORM_DIGEST}"),
        action=np.zeros(n, dtype="S32") if keyed is not None else None, outcome=np.zeros(n, dtype=np.int32),
        outcomes=[], turns=np.zeros(n, dtype=np.int32), text_tokens=np.zeros(n, dtype=np.int64))
    codes: dict[str, int] = {}
    for start in range(0, n, READ_CHUNK):
        chunk = out.ids[start:start + READ_CHUNK].tolist()
        rows, actions = [], []
        for pk, task_id, messages, tools, outcome in Trajectory.objects.filter(pk__in=chunk).values_list(
                "pk", "task_id", "messages", "tools", "outcome").iterator(chunk_size=READ_CHUNK):
            i = start + bisect.bisect_left(chunk, pk)
            rows.append(i)
            out.task_id[i] = task_id
            out.turns[i], out.text_tokens[i] = card_stats.message_stats(messages)
            out.norm_hash[i] = bytes.fromhex(dedup_mod.normalized_hash(messages, tools))[:dedup_mod.NORM_DIGEST]
            out.outcome[i] = codes.setdefault(outcome, len(codes))
            if keyed is not None:
                actions.append(dedup_mod.action_sequence(messages))
        out.found[rows] = True
        if keyed is not None and rows:
            out.action[rows] = keyed.keys(actions)
        if progress:
            progress("reading", min(start + READ_CHUNK, n), n)
    out.outcomes = list(codes)
    return out


def _prompts(task_ids: Any, keyed: Any) -> tuple[Any, Any]:
    """(the tasks, ascending; the key of each one's prompt vector), READ_CHUNK tasks at a time; a
    task that is gone has the empty prompt."""
    import numpy as np  # deferred: numpy (0.13 s) where versions are built

    ordered = np.unique(np.asarray(task_ids, dtype=np.int64))
    keys = np.zeros(len(ordered), dtype="S32")
    for start in range(0, len(ordered), READ_CHUNK):
        chunk = ordered[start:start + READ_CHUNK].tolist()
        found = dict(Task.objects.filter(pk__in=chunk).values_list("pk", "prompt"))
        keys[start:start + len(chunk)] = keyed.keys([found.get(t, "") for t in chunk])
    return ordered, keys


def _anchors(dataset: Dataset | None) -> dict[int, int]:
    """Trajectory id -> first published version number, over the dataset's published versions."""
    if dataset is None:
        return {}
    anchors: dict[int, int] = {}
    rows = DatasetMember.objects.filter(
        version__dataset=dataset, version__status=DatasetVersion.Status.PUBLISHED
    ).order_by("version__number", "position").values_list("trajectory_id", "version__number")
    for trajectory_id, number in rows.iterator(chunk_size=5000):
        anchors.setdefault(trajectory_id, number)
    return anchors


def _ranked(rows: _Rows) -> Any:
    """The rows' trajectory ids best first: automatic score, then reward, then a human accept, then
    the oldest id (numpy's sort over four columns, not a million key tuples)."""
    import numpy as np  # deferred: numpy (0.13 s) where versions are built

    score, reward = rows.columns["score"], rows.columns["reward"]
    score = np.where(np.isnan(score), -1.0, score)
    reward = np.where(np.isnan(reward), -np.inf, reward)
    verdicts = rows.labels["verdict"]
    accept = verdicts.index("accept") if "accept" in verdicts else -1
    not_accepted = (rows.codes["verdict"] != accept).astype(np.int8)
    return rows.ids[np.lexsort((rows.ids, not_accepted, -reward, -score))]


def _dedup_members(rows: _Rows, anchors: dict[int, int], inputs: _DedupInputs, keyed: Any
                   ) -> dedup_mod.Members:
    """The members dedup works on, in its order: the anchors still there (first published first),
    then the rows best-ranked first (an anchor's own row is the anchor)."""
    import numpy as np  # deferred: numpy (0.13 s) where versions are built

    anchor_ids = np.fromiter(anchors, dtype=np.int64, count=len(anchors))
    numbers = np.fromiter(anchors.values(), dtype=np.int32, count=len(anchors))
    there = inputs.has(anchor_ids)
    anchor_ids, numbers = anchor_ids[there], numbers[there]
    ranked = _ranked(rows)
    ranked = ranked[~np.isin(ranked, anchor_ids)]
    ids = np.concatenate([anchor_ids, ranked])
    at = inputs.at(ids)
    members = dedup_mod.Members(
        trajectory_id=ids, published_in=np.concatenate([numbers, np.full(len(ranked), -1, dtype=np.int32)]),
        outcome=inputs.outcome[at], norm_hash=inputs.norm_hash[at], prompt=None, action=None)
    if keyed is not None:
        tasks, prompt_keys = _prompts(inputs.task_id[at], keyed)
        members.prompt = prompt_keys[np.searchsorted(tasks, inputs.task_id[at])]
        members.action = inputs.action[at]
    return members


def _write_members(version: DatasetVersion, ids: Any, validation: Any) -> None:
    """The version's members in order, MEMBER_BULK at a time, each with its trajectory's content
    hash as it is now (read with the chunk) and its split."""
    for start in range(0, len(ids), MEMBER_BULK):
        chunk = ids[start:start + MEMBER_BULK].tolist()
        shas = dict(Trajectory.objects.filter(pk__in=chunk).values_list("pk", "content_sha256"))
        DatasetMember.objects.bulk_create(
            [DatasetMember(version=version, position=start + k, trajectory_id=trajectory_id,
                           content_sha256=shas.get(trajectory_id, ""),
                           split=DatasetMember.Split.VALIDATION if is_val else DatasetMember.Split.TRAIN)
             for k, (trajectory_id, is_val) in enumerate(zip(chunk, validation[start:start + MEMBER_BULK].tolist()))])


def split_of(task_id: int, seed: int, validation_fraction: float) -> str:
    """Deterministic per task (all rollouts of a task land in one split; DPO groups stay whole).

    The same seed puts a task in the same split in every version, so versions never leak a
    validation task into training.
    """
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    return DatasetMember.Split.VALIDATION if point < validation_fraction else DatasetMember.Split.TRAIN


def _card(
    *, dataset_name: str, number: int, parent: DatasetVersion | None, spec: dict[str, Any], members: _Rows,
    validation: Any, excluded: list[dict[str, Any]], scanned: int, dedup_result: dedup_mod.DedupResult,
    exporter_versions: dict[str, str], diff: dict[str, Any] | None, turns: Any, text_tokens: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The version's counts and data card; `validation` (bool), `turns` and `text_tokens`: each
    member's, in order."""
    n_val = int(validation.sum())
    tasks = members.tasks()
    counts = {
        "members": len(members),
        "train": len(members) - n_val,
        "validation": n_val,
        "tasks": len(tasks),
        "in_scope": scanned,
        "excluded": len(excluded),
        "excluded_by_filter": sum(1 for e in excluded if e["stage"] == "filter"),
        "excluded_as_duplicates": sum(1 for e in excluded if e["stage"] == "dedup"),
        "excluded_as_contaminated": sum(1 for e in excluded if e["stage"] == "decontam"),
        "corrections_preferred": len(members.corrections()),
    }
    data_card = {
        "schema": CARD_SCHEMA,
        "dataset": dataset_name,
        "version": number,
        "parent": parent.number if parent else None,
        "filter_spec": spec,
        "counts": counts,
        "by_scene": card_stats.counts_by(members.labelled("scene")),
        "by_model": card_stats.counts_by(members.labelled("model")),
        "by_outcome": card_stats.counts_by(members.labelled("outcome")),
        "by_split_and_outcome": {
            DatasetMember.Split.TRAIN: card_stats.counts_by(members.labelled("outcome", ~validation)),
            DatasetMember.Split.VALIDATION: card_stats.counts_by(members.labelled("outcome", validation)),
        },
        "score_histogram": card_stats.histogram(members.nullable("score"), lo=0.0, hi=100.0),
        "reward_histogram": card_stats.histogram(members.nullable("reward")),
        "turns": card_stats.quantiles(turns.tolist()),
        "text_tokens": card_stats.quantiles(text_tokens.tolist()),
        "usage_tokens": card_stats.quantiles(members.nullable("usage_tokens")),
        "images": card_images(members.ids.tolist()),  # screenshots kept (the vision exports')
        "split": {"unit": "task", "seed": spec["split_seed"], "validation_fraction": spec["validation_fraction"]},
        "dedup": {
            **spec["dedup"],
            "model": dedup_mod.EMBEDDING_MODEL_NAME if spec["dedup"]["near"] else None,
            "compared": "task prompt and action sequence; both cosines >= threshold, same outcome",
            "exact_removed": dedup_result.exact_removed,
            "near_removed": dedup_result.near_removed,
        },
        # prefer_corrections: the members that are a reviewer's correction, in place of their original
        "corrections": {
            "preferred": spec["prefer_corrections"],
            "replaced": [{"original": original, "corrected": corrected}
                         for original, corrected in members.corrections()],
        },
        "pass_rates": _pass_rates(members),
        "exporter_versions": exporter_versions,
        # the documents web-scene episodes read (the offline corpora), with the licences they are under
        "licences": scene_corpus_licences(
            Task.objects.filter(pk__in=tasks.tolist()).values_list("scene", "scene_config")),
        "excluded": excluded,
        "excluded_reasons": card_stats.reason_summary(e["reason"] for e in excluded),
        "diff": diff,
    }
    return counts, data_card


def _pass_rates(members: _Rows) -> dict[str, Any]:
    """The card's pass rates: per member task {passed, rollouts} and their distribution (tasks)."""
    tasks = members.tasks()
    known, passed, rollouts = members.pass_counts(tasks)
    rates = [pass_rate(p, r)["rate"] if k else None
             for k, p, r in zip(known.tolist(), passed.tolist(), rollouts.tolist())]
    known_rates = [r for r in rates if r is not None]
    return {
        "unit": "task", "rollouts": "the task's finished trajectories that succeeded or failed; a pass is a success",
        "tasks": {str(t): [p, r] for t, p, r in zip(tasks.tolist(), passed.tolist(), rollouts.tolist())},
        "histogram": card_stats.histogram(rates, lo=0.0, hi=1.0),
        "never": sum(1 for r in known_rates if r == 0), "always": sum(1 for r in known_rates if r == 1),
        "between": sum(1 for r in known_rates if 0 < r < 1), "unknown": len(rates) - len(known_rates),
    }


def _diff(parent: DatasetVersion | None, member_ids: list[int], excluded: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What changed against the parent: added and removed trajectories, each with why."""
    if parent is None:
        return None
    parent_ids = list(parent.members.order_by("position").values_list("trajectory_id", flat=True))
    parent_set, ours = set(parent_ids), set(member_ids)
    parent_excluded = {e["trajectory_id"]: e["reason"] for e in (parent.data_card or {}).get("excluded", [])}
    our_excluded = {e["trajectory_id"]: e["reason"] for e in excluded}
    added = [
        {"trajectory_id": t, "reason": (f"was excluded from v{parent.number}: {parent_excluded[t]}"
                                        if t in parent_excluded else "new in the selection")}
        for t in member_ids if t not in parent_set
    ]
    removed = [
        {"trajectory_id": t, "reason": our_excluded.get(t, "outside this version's scope (scene, batch, model, "
                                                              "dates) or no longer a finished trajectory")}
        for t in parent_ids if t not in ours
    ]
    return {"parent": parent.number, "added": added, "removed": removed, "kept": len(parent_set & ours)}


def _spec_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Filter spec keys whose value differs from the parent's: {key: {from, to}}."""
    old = {**LATER_DEFAULTS, **old}
    return {k: {"from": old.get(k), "to": new.get(k)} for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def _version_request(dataset_name: str, filter_spec: Any, actor: Any, parent: DatasetVersion | None
                     ) -> tuple[Dataset | None, DatasetVersion | None, dict[str, Any]]:
    """(the dataset or None if new, the parent, the validated spec) of a version request; raises
    PermissionDenied, DatasetError or FilterSpecError for one that cannot be built."""
    _require(actor, CREATE_PERMISSION, "creating a dataset version")
    try:
        validate_slug(dataset_name or "")
    except ValidationError:
        raise DatasetError(f"dataset name {dataset_name!r} must be a slug (letters, digits, - and _)") from None
    if len(dataset_name) > Dataset._meta.get_field("name").max_length:
        raise DatasetError("dataset name is longer than 100 characters")
    dataset = Dataset.objects.filter(name=dataset_name).first()
    if parent is not None:
        if dataset is None or parent.dataset_id != dataset.pk:
            raise DatasetError(f"parent {parent} is not a version of dataset {dataset_name!r}")
    elif dataset is not None:
        parent = dataset.versions.filter(status=DatasetVersion.Status.PUBLISHED).order_by("-number").first()
    return dataset, parent, validate_filter_spec(filter_spec, default_seed=parent.split_seed if parent else 0)


def dataset_version_create(
    *,
    dataset_name: str,
    filter_spec: dict[str, Any] | None,
    actor: Any,
    parent: DatasetVersion | None = None,
    notes: str = "",
    embedder: dedup_mod.Embedder | None = None,
    progress: Progress | None = None,
    build: VersionBuild | None = None,
    wait_exportability: bool = True,
) -> DatasetVersion:
    """Select, dedup, split and freeze a new draft version of the dataset (created if new).

    `parent`: the version this one derives from (same dataset); None means the dataset's
    latest published version, if any. Raises FilterSpecError / DatasetError on bad input and
    PermissionDenied without datasets.add_datasetversion; writes nothing in either case.
    `build`: the running VersionBuild this call works for (the worker's job); it is marked done
    in the transaction that writes the version, or the version is not written.
    The version is written with its exportability measurement queued (ExportabilityRun, in the
    same transaction); `wait_exportability` (the command, direct callers) measures it in this
    process once the version is committed and returns the version with the card's section;
    False (the build job) leaves it to the workers, enqueued on commit.
    """
    import numpy as np  # deferred: numpy (0.13 s) where versions are built

    dataset, parent, spec = _version_request(dataset_name, filter_spec, actor, parent)
    formats = exporter_formats()
    exporter_versions = {name: str(exporter.version) for name, exporter in sorted(formats.items())}

    rows, excluded, scanned = _scan(spec)
    if progress:
        progress("scanned", scanned, scanned)
    anchors = _anchors(dataset)
    dedup_spec = spec["dedup"]
    needs_text = np.unique(np.concatenate([
        rows.ids, np.fromiter(anchors if dedup_spec["exact"] or dedup_spec["near"] else (), dtype=np.int64)]))
    keyed = dedup_mod.KeyedVectors(embedder) if dedup_spec["near"] else None
    inputs = _dedup_inputs(needs_text, keyed, progress)
    result = dedup_mod.dedup_members(_dedup_members(rows, anchors, inputs, keyed), keyed=keyed, exact=dedup_spec["exact"],
                                     near=dedup_spec["near"], threshold=dedup_spec["threshold"])
    if progress:
        progress("dedup", len(rows), len(rows))
    duplicate = np.isin(rows.ids, np.fromiter(result.excluded, dtype=np.int64, count=len(result.excluded)))
    excluded.extend(
        {"trajectory_id": trajectory_id, "task_id": task_id, "stage": "dedup", "reason": result.excluded[trajectory_id]}
        for trajectory_id, task_id in zip(rows.ids[duplicate].tolist(), rows.task_id[duplicate].tolist())
    )
    members = rows.take(~duplicate)  # still in (task, id) order
    del rows, duplicate
    decontam_card = None
    if spec["decontam"]:
        members, decontam_card = _decontaminate(members, spec["decontam"], excluded, embedder, progress)
    excluded.sort(key=lambda e: (e["task_id"], e["trajectory_id"]))
    member_at = inputs.at(members.ids)
    turns, text_tokens = inputs.turns[member_at], inputs.text_tokens[member_at]
    del inputs, member_at
    tasks = members.tasks()
    validation = np.fromiter(
        (split_of(t, spec["split_seed"], spec["validation_fraction"]) == DatasetMember.Split.VALIDATION
         for t in tasks.tolist()), dtype=bool, count=len(tasks))[np.searchsorted(tasks, members.task_id)]
    diff = _diff(parent, members.ids.tolist(), excluded)
    if diff is not None:
        diff["filter_spec_changed"] = _spec_changes(parent.filter_spec or {}, spec)
    with transaction.atomic():
        if dataset is None:
            try:
                with transaction.atomic():
                    dataset = Dataset.objects.create(name=dataset_name, created_by=actor if _is_user(actor) else None)
            except IntegrityError:
                dataset = Dataset.objects.get(name=dataset_name)
            else:
                audit_record("datasets.dataset_create", actor=actor, target=dataset, data={"name": dataset_name},
                             actor_repr=None if _is_user(actor) else "manage.py dataset_create")
        # Lock the dataset row: version numbers are handed out one at a time.
        dataset = Dataset.objects.select_for_update().get(pk=dataset.pk)
        number = (dataset.versions.aggregate(n=Max("number"))["n"] or 0) + 1
        counts, data_card = _card(
            dataset_name=dataset.name, number=number, parent=parent, spec=spec, members=members, validation=validation,
            excluded=excluded, scanned=scanned, dedup_result=result, exporter_versions=exporter_versions, diff=diff,
            turns=turns, text_tokens=text_tokens,
        )
        data_card["decontam"] = decontam_card
        version = DatasetVersion.objects.create(
            dataset=dataset, number=number, parent=parent, filter_spec=spec, counts=counts, data_card=data_card,
            exporter_versions=exporter_versions, split_seed=spec["split_seed"], notes=notes,
            created_by=actor if _is_user(actor) else None,
        )
        _write_members(version, members.ids, validation)
        audit_record(
            "datasets.version_create", actor=actor, target=version,
            actor_repr=None if _is_user(actor) else "manage.py dataset_create",
            data={"filter_spec": spec, "counts": counts, "parent": parent.number if parent else None,
                  "added": len(diff["added"]) if diff else None, "removed": len(diff["removed"]) if diff else None},
        )
        # Every applicable format rendered and validated on every member (no files) tells what each
        # export would write: measured after the version is written, by its own resumable job.
        run = _exportability_queue(version, total=len(members), enqueue=not wait_exportability)
        if build is not None:
            _version_build_done(build, version)
    if wait_exportability:
        exportability_measure(run.pk, progress=progress)
        version.refresh_from_db()
    return version


# --- building a version on the workers ----------------------------------------------------------

def version_build_start(*, dataset_name: str, filter_spec: Any, actor: Any, parent: DatasetVersion | None = None,
                        notes: str = "") -> VersionBuild:
    """Queue a build of a new draft version (the console's builder, the API); a worker runs
    dataset_version_create after commit. The request is checked first (permission, name,
    parent, filter spec): a bad one raises as dataset_version_create would and queues nothing."""
    _version_request(dataset_name, filter_spec, actor, parent)
    with transaction.atomic():
        build = VersionBuild.objects.create(
            dataset_name=dataset_name, filter_spec=filter_spec if filter_spec is not None else {}, parent=parent,
            notes=notes, requested_by=actor if _is_user(actor) else None)
        audit_record("datasets.version_build_start", actor=actor, target=build,
                     data={"dataset": dataset_name, "filter_spec": build.filter_spec,
                           "parent": parent.number if parent else None})
        build_state_changed(build.pk)
        transaction.on_commit(lambda: _enqueue_build(build.pk))
    return build


def _enqueue_build(build_id: int) -> None:
    schedules.enqueue(BUILD_JOB, build_id, group="dataset-builds")


def build_group_name(build_id: int) -> str:
    """The channels group a version build's progress is sent to (its page's websocket)."""
    return f"version-build-{build_id}"


def build_state_message(build_id: int) -> dict[str, Any]:
    """{"type": "build.state", "build": id, "status", "stage", "done", "total", "error", "version_url"}."""
    build = VersionBuild.objects.filter(pk=build_id).select_related("version__dataset").first()
    if build is None:
        return {"type": "build.state", "build": build_id, "status": "missing"}
    return build_state(build)


def build_state(build: VersionBuild) -> dict[str, Any]:
    """build_state_message of a build already read (with its version and dataset)."""
    version_url = None
    if build.version_id is not None:
        version_url = reverse("datasets:version_detail", kwargs={"name": build.version.dataset.name,
                                                                 "number": build.version.number})
    return {"type": "build.state", "build": build.pk, "status": build.status, "stage": build.stage,
            "done": build.done, "total": build.total, "error": build.error, "version_url": version_url}


def build_state_changed(build_id: int) -> None:
    """A build was created, progressed or ended: after commit, its group hears."""
    transaction.on_commit(lambda: send_to_groups({build_group_name(build_id): build_id}, build_state_message),
                          robust=True)


def version_build_progress(*, build: VersionBuild, stage: str, done: int, total: int) -> bool:
    """Record a running build's progress (and heartbeat); False when the build is no longer this
    worker's (reaped, or taken over): the job then stops."""
    updated = VersionBuild.objects.filter(pk=build.pk, status=VersionBuild.Status.RUNNING, worker=build.worker).update(
        stage=stage[:40], done=max(0, done), total=max(0, total), heartbeat_at=timezone.now())
    if updated:
        build_state_changed(build.pk)
    return bool(updated)


def _version_build_done(build: VersionBuild, version: DatasetVersion) -> None:
    """Inside dataset_version_create's transaction: the build this worker runs is done with
    `version`; a build no longer this worker's rolls the version back."""
    updated = VersionBuild.objects.filter(pk=build.pk, status=VersionBuild.Status.RUNNING, worker=build.worker).update(
        status=VersionBuild.Status.DONE, version=version, finished_at=timezone.now(), stage="done", error="")
    if not updated:
        raise DatasetError(f"version build #{build.pk} is no longer this worker's; its version was not kept")
    audit_record("datasets.version_build_finish", target=build, actor_repr="version build job",
                 data={"version": str(version), "members": (version.counts or {}).get("members")})
    build_state_changed(build.pk)


def version_build_fail(*, build: VersionBuild, error: str) -> VersionBuild:
    """Record a failed build (bad filter, no permission any more, an unexpected error): no version."""
    return _job_fail(build, error=error, action="datasets.version_build_fail", actor_repr="version build job",
                     data={}, changed=lambda: build_state_changed(build.pk))


def _job_fail(row: Any, *, error: str, action: str, actor_repr: str, data: dict[str, Any],
              changed: Callable[[], None]) -> Any:
    """An active worker job's row (a build, an exportability run) failed with `error`: one audit row
    and its page told, unless it had already ended; the row as it now is."""
    model = type(row)
    with transaction.atomic():
        updated = model.objects.filter(pk=row.pk, status__in=model.ACTIVE).update(
            status=model.Status.FAILED, error=error[:5000], finished_at=timezone.now())
        if updated:
            audit_record(action, target=row, actor_repr=actor_repr, data={"error": error[:1000], **data})
            changed()
    row.refresh_from_db()
    return row


def version_build_requeue(*, build_id: int, reason: str, max_claims: int) -> str:
    """The reaper's: a running build whose worker is gone goes back to the queue (dispatched after
    commit; it starts over), or fails once `max_claims` workers have taken it. "requeued",
    "failed", or "" when the build moved on meanwhile."""
    return _requeue_lost(
        VersionBuild, job_id=build_id, reason=reason, max_claims=max_claims, retry="build the version again to retry",
        action="datasets.version_build_requeue", actor_repr="version build reaper",
        changed=lambda build: build_state_changed(build.pk), enqueue=_enqueue_build)


def _decontaminate(members: _Rows, decontam_spec: dict[str, Any], excluded: list[dict[str, Any]],
                   embedder: dedup_mod.Embedder | None, progress: Progress | None) -> tuple[_Rows, dict[str, Any]]:
    """(members left, the card's decontam section); matches are appended to excluded (stage decontam)."""
    import numpy as np  # deferred: numpy (0.13 s) where versions are built

    try:
        found = decontam.check(decontam.members_of(members.ids.tolist()), decontam_spec, embedder=embedder)
    except decontam.DecontamError as exc:
        raise DatasetError(f"decontam: {exc}") from None
    if progress:
        progress("decontam", len(members), len(members))
    for trajectory_id, task_id in zip(members.ids.tolist(), members.task_id.tolist()):
        match = found.matches.get(trajectory_id)
        if match is not None:
            excluded.append({"trajectory_id": trajectory_id, "task_id": task_id, "stage": "decontam",
                             "reason": match.reason(decontam_spec), "benchmark": match.benchmark,
                             "item": match.item_id})
    matched = np.fromiter(found.matches, dtype=np.int64, count=len(found.matches))
    return members.take(~np.isin(members.ids, matched)), decontam.card_section(decontam_spec, found)


def _is_user(actor: Any) -> bool:
    return actor is not None and getattr(actor, "is_authenticated", False)


# --- measuring exportability on the workers --------------------------------------------------------

class ExportabilityPending(ExportError):
    """A version whose exportability is not measured yet (or whose measurement failed): its exports
    and its publishing wait for the counts."""


def _exportability_queue(version: DatasetVersion, *, total: int, enqueue: bool) -> ExportabilityRun:
    """Inside dataset_version_create's transaction: the version's exportability run, queued (and
    enqueued on commit unless the caller measures it in-process)."""
    run = ExportabilityRun.objects.create(version=version, total=total)
    audit_record("datasets.exportability_queue", target=run, actor_repr="dataset version create",
                 data={"version": str(version), "members": total, "on": "workers" if enqueue else "in-process"})
    export_state_changed(version.pk)
    if enqueue:
        transaction.on_commit(lambda: _enqueue_exportability(run.pk))
    return run


def _enqueue_exportability(run_id: int) -> None:
    schedules.enqueue(EXPORTABILITY_JOB, run_id, group="dataset-exportability")


def exportability_pending(version: DatasetVersion) -> ExportabilityRun | None:
    """The version's exportability run while it is not done (queued, running or failed), else None
    (measured, or a version made before runs existed: its card says what it has)."""
    return ExportabilityRun.objects.filter(version_id=version.pk).exclude(status=ExportabilityRun.Status.DONE).first()


def exportability_refusal(run: ExportabilityRun, *, what: str, when_done: str) -> str:
    """Why `what` (exports, publishing) must wait for this run that is not done; `when_done` says
    what happens once it is."""
    if run.status == ExportabilityRun.Status.FAILED:
        return (f"this version's exportability measurement failed ({run.error}); {what} needs its counts: "
                "build the version again")
    return (f"this version's exportability is still being measured ({run.done} of {run.total} members); "
            f"{when_done}")


def exportability_state(version_id: int) -> dict[str, Any] | None:
    """{"status", "done", "total", "error"} of the version's exportability run (None: it has none)."""
    return (ExportabilityRun.objects.filter(version_id=version_id).values("status", "done", "total", "error")
            .first())


class RunTakenOver(Exception):
    """The exportability run a job measures is no longer its own (reaped as lost, then taken by another worker)."""


def _run_members(version_id: int) -> tuple[list[tuple[int, int, str]], set[str]]:
    """A version's members as exportability.measure reads them ((trajectory id, task id, split) in
    position order) and their scenes."""
    rows = DatasetMember.objects.filter(version_id=version_id).order_by("position").values_list(
        "trajectory_id", "trajectory__task_id", "split", "trajectory__task__scene")
    members, scenes = [], set()
    for trajectory_id, task_id, split, scene in rows.iterator(chunk_size=5000):
        members.append((trajectory_id, task_id, split))
        scenes.add(scene)
    return members, scenes


def exportability_measure(run_id: int, *, progress: Progress | None = None) -> ExportabilityRun | None:
    """Measure a queued exportability run (exportability.measure, resumed after its finished chunks)
    and put the section in its version's card; None if another worker already claimed it or took it
    over. The workers' job (jobs.run_exportability) and dataset_version_create's in-process
    measurement (the command) both run this. Ends done, or failed with a readable reason;
    interrupted, it goes back to the queue (a worker resumes it)."""
    claimed = ExportabilityRun.objects.filter(pk=run_id, status=ExportabilityRun.Status.QUEUED).update(
        status=ExportabilityRun.Status.RUNNING, started_at=timezone.now(), heartbeat_at=timezone.now(),
        worker=f"{socket.gethostname()}:{os.getpid()}", claims=F("claims") + 1)
    if not claimed:
        return None
    run = ExportabilityRun.objects.get(pk=run_id)
    export_state_changed(run.version_id)

    def saved(chunks_done: int, done: int, tallies: dict[str, Any]) -> None:
        run.done = done
        if not exportability_progress(run=run, chunks_done=chunks_done, done=done, tallies=json.dumps(tallies)):
            raise RunTakenOver(f"exportability run #{run.pk} is no longer this worker's")

    try:
        members, scenes = _run_members(run.version_id)
        if len(members) != run.total:
            raise DatasetError(f"the version has {len(members)} members; its measurement was queued for {run.total}")
        section = exportability.measure(members, scenes, progress=progress, saved=saved, start=run.chunks_done,
                                        tallies=json.loads(run.tallies) if run.tallies else None)
    except RunTakenOver:
        return None
    except KeyboardInterrupt:
        exportability_requeue(run_id=run.pk, reason="interrupted", max_claims=EXPORTABILITY_MAX_CLAIMS)
        raise
    except DatasetError as exc:
        return exportability_fail(run=run, error=str(exc))
    except Exception as exc:  # an unexpected failure still ends the run with a readable reason
        log.exception("exportability run #%s failed", run_id)
        return exportability_fail(run=run, error=f"{type(exc).__name__}: {exc}")
    if not exportability_finish(run=run, section=section):
        return None
    run.refresh_from_db()
    return run


def exportability_progress(*, run: ExportabilityRun, chunks_done: int, done: int, tallies: str) -> bool:
    """Record a finished chunk of a running measurement (its tallies so far, heartbeat); False when
    the run is no longer this worker's (reaped, or taken over): the job then stops."""
    updated = ExportabilityRun.objects.filter(
        pk=run.pk, status=ExportabilityRun.Status.RUNNING, worker=run.worker).update(
        chunks_done=chunks_done, done=done, tallies=tallies, heartbeat_at=timezone.now())
    if updated:
        export_state_changed(run.version_id)
    return bool(updated)


def exportability_finish(*, run: ExportabilityRun, section: dict[str, Any]) -> bool:
    """Put a finished measurement in its version's card (`exportability`) and mark the run done,
    in one transaction; False (nothing written) when the run is no longer this worker's."""
    with transaction.atomic():
        # The version first, as publishing locks it: whichever comes second sees the other's result.
        version = DatasetVersion.objects.select_for_update().get(pk=run.version_id)
        updated = ExportabilityRun.objects.filter(
            pk=run.pk, status=ExportabilityRun.Status.RUNNING, worker=run.worker).update(
            status=ExportabilityRun.Status.DONE, done=run.total, tallies="", finished_at=timezone.now(), error="")
        if not updated:
            return False
        version.data_card = {**(version.data_card or {}), "exportability": section}
        version.save(update_fields=["data_card"])
        audit_record("datasets.exportability_finish", target=run, actor_repr="exportability job",
                     data={"version": str(version), "members": run.total, "claims": run.claims,
                           "lines": {f: t["lines"]["all"] for f, t in section["formats"].items()}})
        export_state_changed(version.pk)
    return True


def exportability_fail(*, run: ExportabilityRun, error: str) -> ExportabilityRun:
    """Record a failed measurement (its version stays, without counts: exports and publishing refuse)."""
    return _job_fail(run, error=error, action="datasets.exportability_fail", actor_repr="exportability job",
                     data={"done": run.done, "total": run.total}, changed=lambda: export_state_changed(run.version_id))


def exportability_requeue(*, run_id: int, reason: str, max_claims: int) -> str:
    """The reaper's (and an interrupted command's): a running measurement whose worker is gone goes
    back to the queue, dispatched after commit (it resumes after its finished chunks), or fails once
    `max_claims` workers have taken it. "requeued", "failed", or "" when it moved on meanwhile."""
    return _requeue_lost(
        ExportabilityRun, job_id=run_id, reason=reason, max_claims=max_claims,
        retry="build the version again to retry", action="datasets.exportability_requeue",
        actor_repr="export reaper", changed=lambda run: export_state_changed(run.version_id),
        enqueue=_enqueue_exportability, data=lambda run: {"chunks_done": run.chunks_done, "done": run.done})


# --- publishing ---------------------------------------------------------------------------------

def dataset_version_publish(*, version: DatasetVersion, actor: Any) -> DatasetVersion:
    """Publish a draft version: from now on it, its members and its card never change.

    Members of the version's own scenes that their scene's format would exclude do not stop it;
    they are warned about (`publish_warnings`, shown by the console, the API and the command) and
    recorded in the audit row. A version whose exportability is not measured yet is refused
    (ExportabilityPending): the warnings need its counts."""
    _require(actor, PUBLISH_PERMISSION, "publishing a dataset version")
    with transaction.atomic():
        locked = DatasetVersion.objects.select_for_update().select_related("dataset").get(pk=version.pk)
        if locked.is_published:
            return locked  # repeat click: no-op, no audit row
        pending = exportability_pending(locked)
        if pending is not None:
            raise ExportabilityPending(exportability_refusal(
                pending, what="publishing", when_done="it can be published when it is done (its warnings need the counts)"))
        locked.status = DatasetVersion.Status.PUBLISHED
        locked.published_at = timezone.now()
        locked.save(update_fields=["status", "published_at"])
        audit_record("datasets.version_publish", actor=actor, target=locked,
                     actor_repr=None if _is_user(actor) else "manage.py dataset_create",
                     data={"members": locked.counts.get("members"), "counts": locked.counts,
                           "warnings": publish_warnings(locked)})
    return locked


def publish_warnings(version: DatasetVersion) -> list[str]:
    """What publishing warns about: members of the version's own scenes excluded by their scene's format."""
    return exportability.publish_warnings(version.data_card or {})


# --- exports ------------------------------------------------------------------------------------

def export_path(version: DatasetVersion, fmt: str, split: str, layout: str = "jsonl",
                roles: str = "trainable", final_answer: str | None = None) -> Path:
    """Where the server-side export of (version, format, split[, roles choice, final_answer]) lives (a
    folder for layout "hf"); ExportJob.roles reads the roles choice back from the name (after the
    final_answer mark, which ExportJob.options keeps)."""
    suffix = (f"{FINAL_ANSWER_MARK}{final_answer}" if final_answer else "") + (
        "" if roles == "trainable" else f"{ExportJob.ROLES_MARK}{roles}")
    name = f"{fmt}-{split}{suffix}" + (".hf" if layout == "hf" else ".jsonl")
    return Path(settings.DATASET_EXPORT_DIR) / version.dataset.name / f"v{version.number}" / name


FINAL_ANSWER_MARK = ".final-"  # `<format>-<split>.final-tool[.roles-lead].jsonl`: one file per choice


def export_options(job: ExportJob) -> dict[str, Any]:
    """The export options a job was started with other than the defaults (its roles choice and
    ExportJob.options: final_answer)."""
    return {**({"roles": job.roles} if job.roles != "trainable" else {}), **(job.options or {})}


def _final_answer_option(version: DatasetVersion, fmt: str, final_answer: str | None) -> str | None:
    """The final_answer an export keeps (None: the format's default), or ExportError naming the
    option when the format does not take that value or would write no line of the version so."""
    if final_answer is None:
        return None
    refused = exportability.final_answer_refusal(version.data_card or {}, fmt, final_answer)
    if refused:
        raise ExportError(refused, field="final_answer")
    return None if final_answer == FORMATS[fmt].final_answers[0] else final_answer


def check_exportable(version: DatasetVersion, fmt: str, split: str) -> Any:
    """The exporter for fmt, or ExportError naming the field: an unknown format or split, a
    changed exporter, an empty split, or a format that does not apply or would write no line."""
    formats = exporter_formats()
    if fmt not in formats:
        raise ExportError(f"unknown format {fmt!r}; formats: {', '.join(sorted(formats))}", field="format")
    if split not in SPLITS:
        raise ExportError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}", field="split")
    exporter = formats[fmt]
    frozen = (version.exporter_versions or {}).get(fmt)
    if frozen is not None and frozen != str(exporter.version):
        raise ExportError(
            f"{version} was frozen with {fmt} exporter {frozen}, but {exporter.version} is installed; "
            "its files would differ from the version's record. Create a new version to export with it.",
            field="format")
    if frozen is None:
        raise ExportError(f"{version} was frozen before the {fmt} exporter existed; create a new version",
                          field="format")
    pending = exportability_pending(version)
    if pending is not None:
        raise ExportabilityPending(exportability_refusal(pending, what="exporting",
                                                         when_done="exports open when it is done"))
    card = version.data_card or {}
    empty = exportability.empty_split(card, split)
    if empty:
        raise ExportError(empty, field="split")
    refused = exportability.refusal(card, fmt, split)
    if refused:
        raise ExportError(refused, field="format")
    return exporter


def export_start(
    *, version: DatasetVersion, fmt: str, split: str = "all", actor: Any, out_path: str | Path | None = None,
    force: bool = False, enqueue: bool = True, layout: str = "jsonl", roles: str = "trainable",
    final_answer: str | None = None,
) -> ExportJob:
    """Queue an export of one split of a version in one format; the job runs after commit.

    layout "jsonl" writes one file; "hf" the Hugging Face layout, a folder (apps/datasets/hf_layout.py),
    recorded as the job's format_version "<exporter version>+hf".

    Without out_path the file goes under DATASET_EXPORT_DIR; a finished export of the same
    file (same exporter version) is returned instead of a new job unless force, and an export
    already queued or running for it is returned as is. With out_path (the dataset_export
    command), an existing file is refused unless force. roles (multi_agent versions, server-side
    exports): whose views the per-role formats write, "trainable" / "lead" / "all". final_answer
    (the chat formats; None: the format's default): "text" ends each episode on the answer as an
    assistant message, "tool" keeps the finish call (exporters/answers.py). Options the format or
    the version cannot take are refused by name before the job is made; the job keeps the others.
    """
    _require(actor, EXPORT_PERMISSION, "exporting a dataset version")
    exporter = check_exportable(version, fmt, split)
    try:
        format_version = hf_layout.format_version(exporter.version, layout)
    except DatasetError as exc:
        raise ExportError(str(exc), field="layout") from None
    refused = exportability.roles_refusal(version.data_card or {}, fmt, roles)
    if refused:
        raise ExportError(refused, field="roles")
    final_answer = _final_answer_option(version, fmt, final_answer)
    options = {"final_answer": final_answer} if final_answer else {}
    in_export_dir = out_path is None
    if out_path is not None and roles != "trainable":
        raise ExportError("roles: a command-line export writes the default views (trainable roles)", field="roles")
    if out_path is None:
        path = export_path(version, fmt, split, layout, roles, final_answer)
    else:
        # The folder is resolved, the file name is not: a link planted at the name is replaced by
        # the export (with force), never followed to overwrite its target.
        given = Path(out_path).expanduser()
        path = given.parent.resolve() / given.name
    if not in_export_dir and layout == "hf":
        if (path.exists() or path.is_symlink()) and not force:
            raise ExportError(f"{path} already exists; pass --force to replace it")
        if path.exists() and not path.is_dir():
            raise ExportError(f"{path} is a file; the Hugging Face layout writes a directory")
        if not path.parent.is_dir():
            raise ExportError(f"directory {path.parent} does not exist")
    elif not in_export_dir:
        if path.is_dir():
            raise ExportError(f"{path} is a directory; give a file path")
        if (path.exists() or path.is_symlink()) and not force:
            raise ExportError(f"{path} already exists; pass --force to overwrite it")
        if not path.parent.is_dir():
            raise ExportError(f"directory {path.parent} does not exist")
    with transaction.atomic():
        active = ExportJob.objects.select_for_update().filter(path=str(path), status__in=ExportJob.ACTIVE).first()
        if active is not None and _lost(active):
            ExportJob.objects.filter(pk=active.pk, status=ExportJob.Status.RUNNING).update(
                status=ExportJob.Status.FAILED, finished_at=timezone.now(),
                error=f"worker lost: running since {active.started_at:%Y-%m-%d %H:%M:%S} UTC, past the job timeout")
            export_state_changed(active.version_id)
            active = None
        if active is not None:
            if not (force and not in_export_dir):
                if in_export_dir and active.version_id == version.pk and active.format == fmt:
                    return active
                raise ExportError(f"export #{active.pk} to {path} is already {active.status}")
            # A forced re-run from the command line takes over from a run that was killed.
            ExportJob.objects.filter(pk=active.pk, status__in=ExportJob.ACTIVE).update(
                status=ExportJob.Status.FAILED, finished_at=timezone.now(), error="superseded by a forced re-run")
            export_state_changed(active.version_id)
        if in_export_dir and not force:
            done = ExportJob.objects.filter(
                version=version, format=fmt, split=split, format_version=format_version,
                status=ExportJob.Status.DONE, path=str(path),
            ).order_by("-finished_at").first()
            if done is not None and (path.is_dir() if layout == "hf" else path.is_file()):
                return done
        job = ExportJob.objects.create(
            version=version, format=fmt, format_version=format_version, split=split, path=str(path),
            in_export_dir=in_export_dir, requested_by=actor if _is_user(actor) else None, options=options,
        )
        audit_record("datasets.export_start", actor=actor, target=job,
                     actor_repr=None if _is_user(actor) else "manage.py dataset_export",
                     data={"version": str(version), "format": fmt, "split": split, "path": str(path),
                           "layout": layout, "options": export_options(job)})
        export_state_changed(version.pk)
        if enqueue:
            transaction.on_commit(lambda: _enqueue_export(job.pk))
    return job


def export_group_name(version_id: int) -> str:
    """The channels group that a version's export states are sent to (its page's websocket)."""
    return f"version-exports-{version_id}"


def export_states_message(version_id: int) -> dict[str, Any]:
    """{"type": "export.states", "version": id, "jobs": [[job id, status], ...] (by id),
    "exportability": {"status", "done", "total", "error"} of its measurement, None without one}."""
    jobs = ExportJob.objects.filter(version_id=version_id).order_by("pk").values_list("pk", "status")
    return {"type": "export.states", "version": version_id, "jobs": [list(row) for row in jobs],
            "exportability": exportability_state(version_id)}


def export_state_changed(version_id: int) -> None:
    """An export of this version, or its exportability measurement, was created or changed state
    (or progressed): after commit, its group hears."""
    transaction.on_commit(lambda: send_to_groups({export_group_name(version_id): version_id}, export_states_message),
                          robust=True)  # the change stands whatever happens to its event: logged, not raised


def _lost(job: ExportJob | VersionBuild) -> bool:
    """A running export (or build) older than the worker's job timeout: django-q2 has given up on it."""
    timeout = settings.Q_CLUSTER.get("timeout") or 3600
    return (job.status == ExportJob.Status.RUNNING and job.started_at is not None
            and job.started_at < timezone.now() - timedelta(seconds=timeout))


def export_requeue(*, job_id: int, reason: str, max_claims: int) -> str:
    """The export reaper's: a running export whose worker is gone goes back to the queue and is
    dispatched after commit (its finished chunks are kept, so the next run resumes from them), or
    fails once `max_claims` workers have taken it. Returns "requeued", "failed", or "" when the
    job moved on meanwhile."""
    return _requeue_lost(
        ExportJob, job_id=job_id, reason=reason, max_claims=max_claims, retry="ask for the export again to retry",
        action="datasets.export_requeue", actor_repr="export reaper", changed=lambda job: export_state_changed(
            job.version_id), enqueue=_enqueue_export, on_failed=_export_ready, data=lambda job: {"path": job.path})


def _requeue_lost(model: Any, *, job_id: int, reason: str, max_claims: int, retry: str, action: str,
                  actor_repr: str, changed: Callable[[Any], None], enqueue: Callable[[int], None],
                  on_failed: Callable[[Any], None] | None = None, data: Callable[[Any], dict] | None = None) -> str:
    """A reaper's transition of a running row (an export, a version build) whose worker is gone:
    back to queued and dispatched after commit, or failed once `max_claims` workers took it."""
    with transaction.atomic():
        job = model.objects.select_for_update().filter(pk=job_id, status=model.Status.RUNNING).first()
        if job is None:
            return ""
        if job.claims >= max_claims:
            job.status, job.finished_at = model.Status.FAILED, timezone.now()
            job.error = f"{reason}; gave up after {job.claims} runs ({retry})"
            outcome = "failed"
        else:
            job.status, job.started_at, job.worker = model.Status.QUEUED, None, ""
            outcome = "requeued"
        job.save(update_fields=["status", "finished_at", "error", "started_at", "worker"])
        audit_record(action, target=job, actor_repr=actor_repr,
                     data={"reason": reason, "outcome": outcome, "claims": job.claims, **(data(job) if data else {})})
        changed(job)
        if outcome == "requeued":
            transaction.on_commit(lambda: enqueue(job.pk))
        elif on_failed is not None:
            on_failed(job)
    return outcome


def _enqueue_export(job_id: int) -> None:
    schedules.enqueue(EXPORT_JOB, job_id, group="dataset-exports")


def export_finish(*, job: ExportJob, sha256: str, lines: int, bytes: int, members: int,
                  excluded: list[dict[str, Any]], resumed_chunks: int) -> ExportJob:
    """Record a completed export (called by the job after the file is renamed into place)."""
    with transaction.atomic():
        updated = ExportJob.objects.filter(pk=job.pk, status=ExportJob.Status.RUNNING).update(
            status=ExportJob.Status.DONE, sha256=sha256, lines=lines, bytes=bytes, members=members,
            excluded=excluded, resumed_chunks=resumed_chunks, finished_at=timezone.now(), error="",
        )
        job.refresh_from_db()
        if updated:
            export_state_changed(job.version_id)
            audit_record("datasets.export_finish", target=job, actor_repr=_job_actor(job),
                         data={"sha256": sha256, "lines": lines, "bytes": bytes, "members": members,
                               "excluded": len(excluded), "path": job.path})
            _export_ready(job)
    return job


def export_fail(*, job: ExportJob, error: str) -> ExportJob:
    """Record a failed export; the destination file was not touched."""
    with transaction.atomic():
        updated = ExportJob.objects.filter(pk=job.pk, status__in=ExportJob.ACTIVE).update(
            status=ExportJob.Status.FAILED, error=error[:5000], finished_at=timezone.now())
        job.refresh_from_db()
        if updated:
            export_state_changed(job.version_id)
            audit_record("datasets.export_fail", target=job, actor_repr=_job_actor(job),
                         data={"error": error[:1000], "path": job.path})
            _export_ready(job)
    return job


def _export_ready(job: ExportJob) -> None:
    """The export.ready webhook (delivered after commit) for a job that just finished or failed."""
    webhook_emit("export.ready", {
        "export": job.pk, "dataset": job.version.dataset.name, "version": job.version.number, "format": job.format,
        "split": job.split, "status": job.status, "sha256": job.sha256, "lines": job.lines, "bytes": job.bytes,
        "error": job.error, "download_url": f"/api/v1/exports/{job.pk}/download" if job.status == "done"
        and job.in_export_dir else None,
    })


def _job_actor(job: ExportJob) -> str:
    return "export job" if job.in_export_dir else "manage.py dataset_export"


# --- rendered validation (chat templates) -------------------------------------------------------

def template_check_run(*, job: ExportJob, template_name: str, actor: Any, by_name: bool = False) -> Any:
    """Render a finished export through a chat template and record the result (TemplateCheck + audit row).

    Raises ExportError for an export that is not done, a format no template renders, or a
    template that cannot be loaded; the check itself reads the file outside the transaction.
    by_name (the API): only a name in DATASET_CHAT_TEMPLATE_DIR, never a path.
    """
    _require(actor, EXPORT_PERMISSION, "checking an export against a chat template")
    if job.status != ExportJob.Status.DONE:
        raise ExportError(f"export #{job.pk} is {job.status}; only a finished export can be checked")
    try:
        template = templates.load_template(template_name, by_name=by_name)
        report = templates.check_file(job.path, job.format, template)
    except templates.TemplateError as exc:
        raise ExportError(str(exc)) from None
    except OSError as exc:
        raise ExportError(f"cannot read {job.path}: {exc.strerror}") from None
    summary = report.summary()
    with transaction.atomic():
        check = TemplateCheck.objects.create(
            version=job.version, export=job, template=template.name, template_sha256=template.sha256,
            format=job.format, records=summary["records"], passed=summary["passed"], failed=summary["failed"],
            summary=summary, created_by=actor if _is_user(actor) else None,
        )
        audit_record("datasets.template_check", actor=actor, target=check,
                     actor_repr=None if _is_user(actor) else "manage.py dataset_export",
                     data={"export": job.pk, "template": template.name, "template_sha256": template.sha256,
                           "records": summary["records"], "failed": summary["failed"]})
    return check, report
