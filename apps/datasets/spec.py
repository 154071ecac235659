"""The filter spec of a dataset version: validation with clear errors, normalization, selection.

A spec is a JSON object; every key is optional and unknown keys are errors:

    scenes: [scene, ...]            task scene in this list
    batches: [id or name, ...]      task batch; names are resolved to ids (every batch so named)
    models: [model, ...]            trajectory model in this list
    min_score: 0-100                latest automatic review's overall score >= this
    accepted_only: bool             latest human review's verdict is "accept"
    success_only: bool              outcome is success
    min_reward: number              reward >= this
    since / until: ISO date or datetime (UTC when naive)  finished_at in [since, until);
                                    a date-only `until` includes that whole day
    dedup: {exact: bool, near: bool, threshold: 0-1}
    validation_fraction: 0-0.5      share of tasks in the validation split
    split_seed: int                 seeds the split (default: the parent's, else 0)
    decontam: {test_sets: [name], ngram, ngram_threshold, embedding, cosine_threshold}
                                    drop members matching benchmark test sets (decontam.py)
    prefer_corrections: bool        a trajectory a reviewer corrected is replaced by its latest
                                    correction (default false); the correction is judged by its
                                    own reviews, else by its original's
    pass_rate: {gt, gte, lt, lte}   keep the tasks whose pass rate over their rollouts is in this
                                    band (0-1 bounds; e.g. {gt: 0, lt: 1}: neither always nor never
                                    solved, DAPO-style dynamic sampling); a task without a rollout
                                    that succeeded or failed has no pass rate and is left out

Scenes, batches, models and dates define the scope: trajectories outside it are not
considered. Inside it, every trajectory that fails a quality rule (or is a duplicate) is
listed in the data card with the reason.
"""
from __future__ import annotations

import math
from datetime import date, datetime, time, timedelta, timezone as dt_timezone
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_date, parse_datetime

from apps.datasets.decontam import DecontamError
from apps.datasets.decontam import validate_spec as validate_decontam
from apps.engines.registry import SCENES
from apps.tasks.models import Batch
from trajplatform.redaction import unstorable_fields

KNOWN_KEYS = (
    "scenes", "batches", "models", "min_score", "accepted_only", "success_only", "min_reward",
    "since", "until", "dedup", "validation_fraction", "split_seed", "decontam", "prefer_corrections", "pass_rate",
)
# Keys added after versions were stored: a stored spec without one had this value.
LATER_DEFAULTS = {"prefer_corrections": False, "pass_rate": None}
BAND_BOUNDS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
DEDUP_KEYS = ("exact", "near", "threshold")
MAX_VALIDATION_FRACTION = 0.5


class DatasetError(Exception):
    """Bad input to a dataset service; the message says what to change."""


class FilterSpecError(DatasetError):
    """An invalid filter spec; `errors` maps each offending key to its reason."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{key}: {reason}" for key, reason in errors.items()))


def _string_list(value: Any, key: str, errors: dict[str, str]) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        errors[key] = "must be a list of non-empty strings"
        return []
    return sorted({v.strip() for v in value})


def _number(value: Any, key: str, errors: dict[str, str], lo: float | None = None, hi: float | None = None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        try:
            value = float(value) if isinstance(value, str) else None
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            errors[key] = "must be a number"
            return None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        errors[key] = f"must be between {lo:g} and {hi:g}" if lo is not None and hi is not None else (
            f"must be at least {lo:g}" if lo is not None else f"must be at most {hi:g}")
        return None
    return float(value)


def _bool(value: Any, key: str, errors: dict[str, str], default: bool = False) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        errors[key] = "must be true or false"
        return default
    return value


def _moment(value: Any, key: str, errors: dict[str, str], end: bool) -> datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime.combine(value + timedelta(days=1) if end else value, time.min)
    elif isinstance(value, str):
        text = value.strip()
        try:
            # A bare date first: fromisoformat (inside parse_datetime) would read it as midnight.
            day = parse_date(text) if len(text) == 10 else None
            moment = None if day is not None else parse_datetime(text)
        except ValueError:
            moment = day = None
        if moment is None and day is not None:
            moment = datetime.combine(day + timedelta(days=1) if end else day, time.min)
        if moment is None:
            errors[key] = f"{value!r} is not an ISO date (2026-11-01) or datetime (2026-11-01T12:00:00Z)"
            return None
    else:
        errors[key] = "must be an ISO date or datetime string"
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt_timezone.utc)
    return moment.astimezone(dt_timezone.utc)


# Database ids are 64-bit signed integers: a larger one would overflow the query (SQLite).
MAX_ID = 2**63 - 1


def _batches(value: Any, errors: dict[str, str]) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        errors["batches"] = "must be a list of batch ids or names"
        return []
    ids: set[int] = set()
    names: set[str] = set()
    for item in value:
        if isinstance(item, str) and item.strip().isascii() and item.strip().isdigit():
            item = int(item.strip())
        if isinstance(item, int) and not isinstance(item, bool) and 0 < item <= MAX_ID:
            ids.add(item)
        elif isinstance(item, int) and not isinstance(item, bool) and item > MAX_ID:
            errors["batches"] = f"{item} is not a batch id (ids are at most {MAX_ID})"
            return []
        elif isinstance(item, str) and item.strip():
            names.add(item.strip())
        else:
            errors["batches"] = f"{item!r} is neither a batch id nor a batch name"
            return []
    found_ids = set(Batch.objects.filter(pk__in=ids).values_list("pk", flat=True)) if ids else set()
    by_name: dict[str, list[int]] = {}
    for pk, name in Batch.objects.filter(name__in=names).values_list("pk", "name") if names else []:
        by_name.setdefault(name, []).append(pk)
    missing = [str(i) for i in sorted(ids - found_ids)] + sorted(n for n in names if n not in by_name)
    if missing:
        errors["batches"] = f"no such batch: {', '.join(missing)}"
        return []
    return sorted(found_ids | {pk for pks in by_name.values() for pk in pks})


def _band(value: Any, errors: dict[str, str]) -> dict[str, float] | None:
    """The pass-rate band {gt|gte: lower, lt|lte: upper} (bounds 0-1), or None."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        errors["pass_rate"] = "must be an object of bounds, e.g. {\"gt\": 0, \"lt\": 1} (gt, gte, lt, lte)"
        return None
    unknown = sorted(set(value) - set(BAND_BOUNDS))
    if unknown:
        errors["pass_rate"] = f"unknown bound(s) {', '.join(unknown)}; bounds: {', '.join(BAND_BOUNDS)}"
        return None
    if {"gt", "gte"} <= set(value) or {"lt", "lte"} <= set(value):
        errors["pass_rate"] = "give one lower bound (gt or gte) and one upper bound (lt or lte) at most"
        return None
    band: dict[str, float] = {}
    for key in BAND_BOUNDS:
        if key in value:
            number = _number(value[key], f"pass_rate.{key}", errors, 0.0, 1.0)
            if number is None:
                errors.setdefault(f"pass_rate.{key}", "must be a number")
                return None
            band[key] = number
    lower = band.get("gt", band.get("gte"))
    upper = band.get("lt", band.get("lte"))
    if lower is not None and upper is not None and (lower > upper or (lower == upper and ("gt" in band or "lt" in band))):
        errors["pass_rate"] = f"the band {band_text(band)} holds no pass rate"
        return None
    return band


def band_text(band: dict[str, float]) -> str:
    """A band as it reads: {gt: 0, lt: 1} -> "0 < p < 1"; {gte: 0.5} -> "p >= 0.5"."""
    lower = next((f"{band[k]:g} {'<' if k == 'gt' else '<='} " for k in ("gt", "gte") if k in band), "")
    upper = next((f" {'<' if k == 'lt' else '<='} {band[k]:g}" for k in ("lt", "lte") if k in band), "")
    if lower and upper:
        return f"{lower}p{upper}"
    if lower:
        return f"p {'>' if 'gt' in band else '>='} {band.get('gt', band.get('gte')):g}"
    return f"p{upper}"


def in_band(rate: float, band: dict[str, float]) -> bool:
    return (("gt" not in band or rate > band["gt"]) and ("gte" not in band or rate >= band["gte"])
            and ("lt" not in band or rate < band["lt"]) and ("lte" not in band or rate <= band["lte"]))


def validate_filter_spec(raw: Any, *, default_seed: int = 0) -> dict[str, Any]:
    """The normalized spec (JSON-serializable, every key present) or FilterSpecError."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FilterSpecError({"filter_spec": "must be a JSON object"})
    unstorable = unstorable_fields(raw)  # a NUL byte reaches PostgreSQL as a DataError otherwise
    if unstorable:
        raise FilterSpecError(dict(unstorable))
    errors: dict[str, str] = {}
    unknown = sorted(set(raw) - set(KNOWN_KEYS))
    if unknown:
        errors["filter_spec"] = f"unknown key(s) {', '.join(unknown)}; known: {', '.join(KNOWN_KEYS)}"
    scenes = _string_list(raw.get("scenes"), "scenes", errors)
    bad_scenes = [s for s in scenes if s not in SCENES]
    if bad_scenes:
        errors["scenes"] = f"unknown scene(s) {', '.join(bad_scenes)}; scenes: {', '.join(SCENES)}"
    since = _moment(raw.get("since"), "since", errors, end=False)
    until = _moment(raw.get("until"), "until", errors, end=True)
    if since and until and since >= until:
        errors["until"] = "must be after since"
    dedup_raw = raw.get("dedup") or {}
    if not isinstance(dedup_raw, dict):
        errors["dedup"] = "must be an object {exact, near, threshold}"
        dedup_raw = {}
    elif set(dedup_raw) - set(DEDUP_KEYS):
        errors["dedup"] = f"unknown key(s) {', '.join(sorted(set(dedup_raw) - set(DEDUP_KEYS)))}"
    threshold = _number(dedup_raw.get("threshold"), "dedup.threshold", errors, 0.0, 1.0)
    seed = raw.get("split_seed")
    seed = default_seed if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**31) <= seed < 2**31:
        errors["split_seed"] = "must be an integer (32-bit)"
        seed = 0
    spec = {
        "scenes": scenes,
        "batches": _batches(raw.get("batches"), errors),
        "models": _string_list(raw.get("models"), "models", errors),
        "min_score": _number(raw.get("min_score"), "min_score", errors, 0.0, 100.0),
        "accepted_only": _bool(raw.get("accepted_only"), "accepted_only", errors),
        "success_only": _bool(raw.get("success_only"), "success_only", errors),
        "min_reward": _number(raw.get("min_reward"), "min_reward", errors),
        "since": since.isoformat() if since else None,
        "until": until.isoformat() if until else None,
        "dedup": {
            "exact": _bool(dedup_raw.get("exact"), "dedup.exact", errors, True),
            "near": _bool(dedup_raw.get("near"), "dedup.near", errors, True),
            "threshold": threshold if threshold is not None else settings.DATASET_DEDUP_THRESHOLD,
        },
        "validation_fraction": _number(
            raw.get("validation_fraction", settings.DATASET_VALIDATION_FRACTION), "validation_fraction", errors,
            0.0, MAX_VALIDATION_FRACTION,
        ),
        "split_seed": seed,
        "decontam": None,
        "prefer_corrections": _bool(raw.get("prefer_corrections"), "prefer_corrections", errors),
        "pass_rate": _band(raw.get("pass_rate"), errors),
    }
    try:
        spec["decontam"] = validate_decontam(raw.get("decontam"))
    except DecontamError as exc:
        errors["decontam"] = str(exc)
    if errors:
        raise FilterSpecError(errors)
    return spec


def quality_reasons(row: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """Why a trajectory in scope fails the spec's quality rules (empty: it passes)."""
    reasons = []
    if row["outcome"] == "error":
        reasons.append("outcome error (an infrastructure or model failure, not agent behaviour)")
    elif spec["success_only"] and row["outcome"] != "success":
        reasons.append(f"outcome {row['outcome'] or 'none'}, success required")
    if spec["min_reward"] is not None and (row["reward"] is None or row["reward"] < spec["min_reward"]):
        reasons.append(f"reward {row['reward']:g} < {spec['min_reward']:g}" if row["reward"] is not None
                       else f"no reward (min_reward {spec['min_reward']:g})")
    if spec["min_score"] is not None and (row["review_overall"] is None or row["review_overall"] < spec["min_score"]):
        reasons.append(f"score {row['review_overall']:g} < {spec['min_score']:g}" if row["review_overall"] is not None
                       else f"no automatic review (min_score {spec['min_score']:g})")
    if spec["accepted_only"] and row["human_verdict"] != "accept":
        verdict = row["human_verdict"] or "no human verdict"
        reasons.append(f"{verdict}, a human accept required")
    band = spec.get("pass_rate")
    if band:
        rate = row.get("task_pass_rate") or {"rate": None, "passed": 0, "rollouts": 0}
        if rate["rate"] is None:
            reasons.append(f"task has no pass rate: no rollout succeeded or failed (pass_rate {band_text(band)})")
        elif not in_band(rate["rate"], band):
            reasons.append(f"task pass rate {rate['rate']:g} outside {band_text(band)} "
                           f"({rate['passed']} of {rate['rollouts']} rollouts passed)")
    return reasons
