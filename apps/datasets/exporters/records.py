"""Canonical trajectory records: the `raw` format, read from the database in chunks.

A record is a plain JSON-ready dict (see RAW_SCHEMA_VERSION). It carries everything the
other formats render from and everything `import_trajectories` needs to recreate the rows:
the trajectory's content and metadata, its task's definition, and its latest done automatic
review and latest human review, and under `task.pass_rate` the task's pass rate over its
rollouts (`task_pass_rates`). Bookkeeping (worker, claim token, heartbeats, attempts) and
columns the database sets itself (`created_at`) are left out, so a record exported, imported
and exported again is the same record apart from its ids.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

import orjson
from django.db.models import Count, Q, QuerySet, TextField
from django.db.models.functions import Cast

from apps.datasets.record_schema import RAW_SCHEMA_VERSION, TASK_FIELDS
from apps.reviews.models import Preference, Review
from apps.tasks.models import Trajectory

TRAJECTORY_FIELDS = (
    "iteration", "sample_index", "status", "messages", "tools", "steps", "final_answer", "outcome",
    "outcome_reason", "reward", "verifier_output", "model", "config_snapshot", "prompt_tokens",
    "completion_tokens", "total_tokens", "cost_usd", "content_sha256", "error", "started_at", "finished_at",
)
TIMESTAMP_FIELDS = ("started_at", "finished_at")
# Review columns worth carrying, by kind; read only those the Review model has (it grows).
AUTO_REVIEW_FIELDS = (
    "status", "overall", "scores", "checks", "verdict", "rationale", "judge_model", "rubric_version", "error",
    "suggestions", "finished_at",
)
HUMAN_REVIEW_FIELDS = ("status", "verdict", "rationale", "overall", "scores", "step_flags", "finished_at")


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # NaN/Infinity, which Python's json writes and orjson refuses
        return json.loads(text)


def json_values(queryset: QuerySet, fields: Iterable[str]) -> Iterator[dict[str, Any]]:
    """`queryset.values(*fields)`, with JSON columns read as text and parsed by orjson.

    Django parses JSON columns with the standard library, which is most of the cost of
    reading trajectories; this reads the same rows several times faster.
    """
    model = queryset.model
    plain: list[str] = []
    casts: dict[str, Any] = {}
    for name in fields:
        field = model._meta.get_field(name.split("__")[0])
        for part in name.split("__")[1:]:
            field = field.related_model._meta.get_field(part)
        if field.get_internal_type() == "JSONField":
            casts[f"json__{name}"] = Cast(name, output_field=TextField())
        else:
            plain.append(name)
    for row in queryset.annotate(**casts).values(*plain, *casts):
        for alias in casts:
            row[alias[6:]] = _loads(row.pop(alias))
        yield row


def review_columns() -> tuple[list[str], list[str]]:
    """(auto fields, human fields) restricted to the columns the Review model has today."""
    have = {f.name for f in Review._meta.concrete_fields}
    return [f for f in AUTO_REVIEW_FIELDS if f in have], [f for f in HUMAN_REVIEW_FIELDS if f in have]


def _iso(value: Any) -> Any:
    return value.isoformat() if value is not None and hasattr(value, "isoformat") else value


def _latest_reviews(ids: list[int]) -> dict[int, dict[str, Any]]:
    """trajectory id -> {"auto": latest done automatic review, "human": latest human review}."""
    auto_fields, human_fields = review_columns()
    wanted = sorted(set(auto_fields) | set(human_fields) | {"kind", "status"})
    queryset = Review.objects.filter(trajectory_id__in=ids).order_by("trajectory_id", "-created_at", "-id")
    out: dict[int, dict[str, Any]] = {}
    for row in json_values(queryset, ["trajectory_id", "reviewer__username", *wanted]):
        slot = out.setdefault(row["trajectory_id"], {"auto": None, "human": None})
        if row["kind"] == "auto" and slot["auto"] is None and row["status"] == "done":
            slot["auto"] = {f: _iso(row[f]) for f in auto_fields}
        elif row["kind"] == "human" and slot["human"] is None:
            slot["human"] = {f: _iso(row[f]) for f in human_fields}
            slot["human"]["reviewer"] = row["reviewer__username"] or ""
    _add_preferences(ids, out)
    return out


def _add_preferences(ids: list[int], out: dict[int, dict[str, Any]]) -> None:
    """People's picks between rollouts (the console's "prefer A over B") under reviews.preferences of
    both trajectories, newest first; records of trajectories without one keep their shape."""
    rows = (Preference.objects.filter(Q(chosen_id__in=ids) | Q(rejected_id__in=ids))
            .order_by("-created_at", "-id").values_list("chosen_id", "rejected_id", "reviewer__username", "created_at"))
    for chosen, rejected, reviewer, at in rows:
        pick = {"chosen": chosen, "rejected": rejected, "reviewer": reviewer, "at": _iso(at)}
        for trajectory_id in {chosen, rejected} & set(ids):
            slot = out.setdefault(trajectory_id, {"auto": None, "human": None})
            slot.setdefault("preferences", []).append(pick)


def _record(row: dict[str, Any], reviews: dict[str, Any] | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema_version": RAW_SCHEMA_VERSION,
        "trajectory_id": row["id"],
        "task_id": row["task_id"],
        "task": {f: row[f"task__{f}"] for f in TASK_FIELDS},
        "reviews": reviews or {"auto": None, "human": None},
    }
    record["task"]["batch"] = row["task__batch__name"] or ""
    for f in TRAJECTORY_FIELDS:
        record[f] = row[f]
    record["cost_usd"] = str(row["cost_usd"])
    for f in TIMESTAMP_FIELDS:
        record[f] = _iso(row[f])
    return record


def _row_fields() -> list[str]:
    return ["id", "task_id", "task__batch__name", *(f"task__{f}" for f in TASK_FIELDS), *TRAJECTORY_FIELDS]


SUBTRAJECTORY_FIELDS = (
    "id", "parent_id", "label", "role", "parent_step", "messages", "tools", "steps", "final_answer", "outcome",
    "outcome_reason", "reward", "total_tokens", "content_sha256",
)
MAX_SUBTRAJECTORY_DEPTH = 4


def _subtrajectories(parent_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """parent id -> its sub-episodes' records (apps.tasks.models.Trajectory.parent), nested ones
    under theirs; one query per level of nesting."""
    out: dict[int, list[dict[str, Any]]] = {}
    found: dict[int, dict[str, Any]] = {}
    parents = list(parent_ids)
    for _ in range(MAX_SUBTRAJECTORY_DEPTH):
        if not parents:
            break
        rows = json_values(Trajectory.all_objects.filter(parent_id__in=parents).order_by("id"), SUBTRAJECTORY_FIELDS)
        parents = []
        for row in rows:
            parent_id = row.pop("parent_id")
            child = {"trajectory_id": row.pop("id"), **row, "subtrajectories": []}
            found[child["trajectory_id"]] = child
            siblings = found[parent_id]["subtrajectories"] if parent_id in found else out.setdefault(parent_id, [])
            siblings.append(child)
            parents.append(child["trajectory_id"])
    return out


PASS_OUTCOMES = ("success", "failure")


def pass_rate(passed: int, rollouts: int) -> dict[str, Any]:
    """{"rate": passed / rollouts (None without rollouts), "passed", "rollouts"}."""
    return {"rate": round(passed / rollouts, 6) if rollouts else None, "passed": passed, "rollouts": rollouts}


def task_pass_counts(task_ids: Iterable[int] | QuerySet) -> Iterator[tuple[int, int, int]]:
    """(task id, passes, rollouts) of each task with a rollout, streamed (task_pass_rates' counts;
    a version's scan keeps them as arrays). One query (task_ids may be a subquery)."""
    rows = (Trajectory.objects.filter(task_id__in=task_ids, status=Trajectory.Status.FINISHED,
                                      outcome__in=PASS_OUTCOMES, correction_of__isnull=True)
            .order_by().values("task_id").annotate(rollouts=Count("id"), passed=Count("id", filter=Q(outcome="success")))
            .values_list("task_id", "passed", "rollouts"))
    return rows.iterator(chunk_size=5000)


def task_pass_rates(task_ids: Iterable[int] | QuerySet) -> dict[int, dict[str, Any]]:
    """task id -> its pass rate over its rollouts: the task's own finished trajectories (not a
    multi_agent role's sub-episode, not a reviewer's correction) whose outcome is success or
    failure, success counting as a pass; an outcome error (infrastructure, not the model) is no
    rollout. Tasks without such a rollout are absent. One query (task_ids may be a subquery)."""
    return {task_id: pass_rate(passed, rollouts) for task_id, passed, rollouts in task_pass_counts(task_ids)}


def load_records(trajectory_ids: Sequence[int], *, chunk_size: int = 500) -> Iterator[dict[str, Any]]:
    """Canonical records for these trajectories, in the given order, one chunk in memory.

    Each chunk costs five queries (trajectories with their task and batch; their reviews; people's
    preferences between them; their tasks' pass rates; their sub-episodes, one more per level of
    nesting). A trajectory with sub-episodes (multi_agent's
    roles, apps/datasets/exporters/roles.py) carries them under `subtrajectories`; others have
    no such key, so their records are what they were. Ids that no longer exist are skipped.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    fields = _row_fields()
    iterator = iter(trajectory_ids)
    while chunk := list(islice(iterator, chunk_size)):
        rows = {row["id"]: row for row in json_values(Trajectory.objects.filter(pk__in=chunk).order_by(), fields)}
        reviews = _latest_reviews(list(rows))
        children = _subtrajectories(list(rows))
        rates = task_pass_rates({row["task_id"] for row in rows.values()})
        for trajectory_id in chunk:
            row = rows.get(trajectory_id)
            if row is not None:
                record = _record(row, reviews.get(trajectory_id))
                record["task"]["pass_rate"] = rates.get(row["task_id"]) or pass_rate(0, 0)
                if trajectory_id in children:
                    record["subtrajectories"] = children[trajectory_id]
                yield record
