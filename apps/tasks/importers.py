"""Parse and validate task files (JSONL or a JSON list) into Task field dicts. No DB access.

Two line shapes are accepted, detected per line:

* agent-data-platform (ADP): task_id, task_type (reasoning|code|web), description,
  expected_tools, max_steps, timeout, priority. task_type maps to a scene through
  `ADP_TASK_TYPE_SCENES`; `timeout` becomes `timeout_s`, `task_id` becomes `external_id`.
* trajplatform: scene, prompt, config (the scene config) and the Task model's own names for
  everything else (`TRAJPLATFORM_FIELDS`).

Either shape may carry `reference_solution` (the steps the offline model replays): it must be
a list of step objects and is then dropped, not stored on the Task.

Every problem is a `TaskImportError(line, field, reason)`; a file is checked to the end so
all of them are reported at once. Big files are read line by line: `check_file` keeps no
rows, `iter_tasks` yields them for a writer that streams into the database.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Iterator

from apps.engines.registry import SCENES, SceneConfigError, validate_scene_config
from trajplatform.redaction import unstorable_fields, unstorable_reason

ADP = "adp"
TRAJPLATFORM = "trajplatform"

ADP_TASK_TYPE_SCENES: dict[str, str] = {"code": "code_exec", "web": "gui", "reasoning": "deep_search"}

# Limits mirror the Task model's validators and check constraints.
EXTERNAL_ID_MAX = 200
MODEL_MAX = 200
INT32_MAX = 2**31 - 1

ADP_FIELDS = ("task_id", "task_type", "description", "expected_tools", "max_steps", "timeout", "priority")
TRAJPLATFORM_FIELDS = (
    "external_id",
    "scene",
    "prompt",
    "config",
    "expected_tools",
    "model",
    "temperature",
    "top_p",
    "max_steps",
    "step_timeout_s",
    "timeout_s",
    "max_tokens",
    "system_prompt_extra",
    "max_iterations",
    "quality_threshold",
    "samples_per_iteration",
    "priority",
)
# Allowed in either shape and dropped here: read by the offline model (apps/engines/offline_model.py).
IGNORED_FIELDS = ("reference_solution",)
_SHARED = frozenset(ADP_FIELDS) & frozenset(TRAJPLATFORM_FIELDS)
_ADP_ONLY = frozenset(ADP_FIELDS) - _SHARED
_TRAJPLATFORM_ONLY = frozenset(TRAJPLATFORM_FIELDS) - _SHARED


@dataclass(frozen=True, slots=True)
class TaskImportError:
    """One problem in an input file: the 1-based line its item starts on, the field, why.

    Items of a JSON list are located by the line their value starts on, like JSONL lines.
    """

    line: int
    field: str
    reason: str

    def format(self, source: str) -> str:
        return f"{source}:{self.line}: {self.field}: {self.reason}"


@dataclass
class ImportSummary:
    """What a pass over a file found: counts for the valid rows, and every error."""

    container: str = "jsonl"  # "jsonl" or "json" (a JSON list)
    task_count: int = 0
    by_scene: Counter = field(default_factory=Counter)
    by_shape: Counter = field(default_factory=Counter)
    errors: list[TaskImportError] = field(default_factory=list)
    sha256: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def source_format(self) -> str:
        """e.g. "jsonl/adp", "json/trajplatform", "jsonl/mixed" (both shapes in one file)."""
        shapes = sorted(self.by_shape)
        shape = shapes[0] if len(shapes) == 1 else ("mixed" if shapes else "empty")
        return f"{self.container}/{shape}"


class InvalidImport(ValueError):
    """Raised by `iter_tasks` on the first invalid item (the caller rolls back)."""

    def __init__(self, errors: list[TaskImportError]):
        self.errors = errors
        super().__init__("; ".join(e.format("input") for e in errors))


# -- field checks ---------------------------------------------------------------------------

_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_TYPE.get(type(value), type(value).__name__)


class _Invalid(Exception):
    def __init__(self, reason: str):
        self.reason = reason


def _string(value: Any, *, max_length: int | None = None, required: bool = False) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"must be a string, got {_json_type(value)}")
    if required and not value.strip():
        raise _Invalid("must not be empty")
    if max_length is not None and len(value) > max_length:
        raise _Invalid(f"must be at most {max_length} characters, got {len(value)}")
    if reason := unstorable_reason(value):
        raise _Invalid(reason)
    return value


def _integer(value: Any, lo: int, hi: int) -> int:
    # bool is a subclass of int in Python but not an integer in JSON terms.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"must be an integer, got {_json_type(value)}")
    if not lo <= value <= hi:
        raise _Invalid(f"must be between {lo} and {hi}, got {value}")
    return value


def _number(value: Any, lo: float, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(f"must be a number, got {_json_type(value)}")
    if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        bound = f"between {lo:g} and {hi:g}" if hi is not None else f"at least {lo:g}"
        raise _Invalid(f"must be {bound}, got {value!r}")
    return float(value)


def _nullable(check):  # type: ignore[no-untyped-def]
    return lambda value: None if value is None else check(value)


def _string_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise _Invalid(f"must be an array of strings, got {_json_type(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            got = "an empty string" if isinstance(item, str) else _json_type(item)
            raise _Invalid(f"must be an array of non-empty strings; item {i} is {got}")
        if reason := unstorable_reason(item):
            raise _Invalid(f"item {i} {reason}")
    return value


def _step_list(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _Invalid(f"must be a list of step objects, got {_json_type(value)}")
    if not value:
        raise _Invalid("must not be empty (the offline model needs at least one step)")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _Invalid(f"must be a list of step objects; item {i} is {_json_type(item)}")
    return value


# Output field -> check, for the values both shapes share (after renaming).
_CHECKS = {
    "external_id": lambda v: _string(v, max_length=EXTERNAL_ID_MAX),
    "prompt": lambda v: _string(v, required=True),
    "expected_tools": _string_list,
    "model": lambda v: _string(v, max_length=MODEL_MAX),
    "temperature": lambda v: _number(v, 0.0, 2.0),
    "top_p": _nullable(lambda v: _number(v, 0.0, 1.0)),
    "max_steps": lambda v: _integer(v, 1, 500),
    "step_timeout_s": lambda v: _number(v, 0.1),
    "timeout_s": lambda v: _number(v, 1.0),
    "max_tokens": _nullable(lambda v: _integer(v, 1, INT32_MAX)),
    "system_prompt_extra": lambda v: _string(v),
    "max_iterations": lambda v: _integer(v, 1, 20),
    "quality_threshold": lambda v: _integer(v, 0, 100),
    "samples_per_iteration": lambda v: _integer(v, 1, 64),
    "priority": lambda v: _integer(v, 1, 10),
}

# ADP input name -> our field name.
_ADP_RENAMES = {"task_id": "external_id", "description": "prompt", "timeout": "timeout_s"}


def _unknown_field_reason(name: str, allowed: Iterable[str], shape_label: str) -> str:
    allowed = list(allowed)
    hint = difflib.get_close_matches(name, allowed, n=1)
    if shape_label == "trajplatform" and name == "scene_config":
        hint = ["config"]
    suffix = f" (did you mean {hint[0]!r}?)" if hint else f"; allowed: {', '.join(allowed)}"
    return f"unknown field for the {shape_label} shape{suffix}"


def detect_shape(obj: dict[str, Any]) -> tuple[str | None, str]:
    """Return (ADP | TRAJPLATFORM, "") or (None, why neither)."""
    adp_keys = sorted(obj.keys() & _ADP_ONLY)
    own_keys = sorted(obj.keys() & _TRAJPLATFORM_ONLY)
    if adp_keys and own_keys:
        return None, (
            f"mixes agent-data-platform fields ({', '.join(adp_keys)}) with trajplatform fields "
            f"({', '.join(own_keys)}); use one shape per line"
        )
    if adp_keys:
        return ADP, ""
    if own_keys:
        return TRAJPLATFORM, ""
    return None, (
        "matches neither shape: expected task_id/task_type/description (agent-data-platform) "
        "or scene/prompt (trajplatform)"
    )


def validate_task(
    obj: Any, *, scene: str | None = None
) -> tuple[str | None, dict[str, Any] | None, list[tuple[str, str]]]:
    """Validate one decoded item; return (shape, Task field dict or None, [(field, reason)]).

    `scene` (the --scene option) sets the scene for the item, overriding its own scene or
    task_type. Field names in errors are the input's own names (task_id, not external_id).
    """
    if not isinstance(obj, dict):
        return None, None, [("line", f"must be a JSON object, got {_json_type(obj)}")]
    shape, why = detect_shape(obj)
    if shape is None:
        return None, None, [("shape", why)]

    errors: list[tuple[str, str]] = []
    out: dict[str, Any] = {}
    if shape == ADP:
        allowed, label = ADP_FIELDS, "agent-data-platform"
        required = ("task_id", "description") if scene else ("task_id", "task_type", "description")
    else:
        allowed, label = TRAJPLATFORM_FIELDS, "trajplatform"
        required = ("prompt",) if scene else ("scene", "prompt")

    for name in obj:
        if name not in allowed and name not in IGNORED_FIELDS:
            errors.append((name, _unknown_field_reason(name, allowed, label)))
    for name in required:
        if name not in obj:
            hint = " (or set the scene with --scene)" if name in ("scene", "task_type") else ""
            errors.append((name, f"required field is missing{hint}"))

    scene_id: str | None = scene
    if shape == ADP and "task_type" in obj:
        task_type = obj["task_type"]
        if not isinstance(task_type, str):
            errors.append(("task_type", f"must be a string, got {_json_type(task_type)}"))
        elif scene is None:
            scene_id = ADP_TASK_TYPE_SCENES.get(task_type)
            if scene_id is None:
                errors.append(
                    ("task_type", f"unknown task_type {task_type!r}; valid: {', '.join(ADP_TASK_TYPE_SCENES)} "
                     "(or set the scene with --scene)")
                )
    if shape == TRAJPLATFORM and "scene" in obj:
        value = obj["scene"]
        if not isinstance(value, str):
            errors.append(("scene", f"must be a string, got {_json_type(value)}"))
        elif scene is None:
            if value in SCENES:
                scene_id = value
            else:
                errors.append(("scene", f"unknown scene {value!r}; valid scenes: {', '.join(SCENES)}"))

    for name, value in obj.items():
        if name not in allowed or name in ("task_type", "scene", "config"):
            continue
        target = _ADP_RENAMES.get(name, name) if shape == ADP else name
        try:
            out[target] = _CHECKS[target](value)
        except _Invalid as exc:
            errors.append((name, exc.reason))
    if "reference_solution" in obj:
        try:
            _step_list(obj["reference_solution"])
        except _Invalid as exc:
            errors.append(("reference_solution", exc.reason))
    if shape == ADP and "task_id" in obj and isinstance(obj["task_id"], str) and not obj["task_id"].strip():
        errors.append(("task_id", "must not be empty"))

    config = obj.get("config", {}) if shape == TRAJPLATFORM else {}
    if not isinstance(config, dict):
        errors.append(("config", f"must be an object, got {_json_type(config)}"))
    elif scene_id is not None:
        # Text that cannot be stored first: its reason (a NUL byte, a lone surrogate) says more than
        # the schema pattern the same value also breaks.
        unstorable = [(f"config.{path}", reason) for path, reason in unstorable_fields(config)]
        if unstorable:
            errors.extend(unstorable)
        else:
            try:
                out["scene_config"] = validate_scene_config(scene_id, config)
            except SceneConfigError as exc:
                errors.extend((f, f"{r} (scene {scene_id} config schema)") for f, r in exc.errors)
    if scene_id is not None:
        out["scene"] = scene_id

    if errors:
        return shape, None, errors
    return shape, out, []


# -- reading files --------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_error_reason(exc: json.JSONDecodeError) -> str:
    return f"malformed JSON: {exc.msg} (column {exc.colno})"


def _skip_ws(text: str, idx: int) -> int:
    n = len(text)
    while idx < n and text[idx] in " \t\r\n\ufeff":
        idx += 1
    return idx


# A read item: (line, decoded value or _UNDECODED, errors). A decoded value can still carry
# errors (a repeated key).
_Item = tuple[int, Any, list[TaskImportError]]
_UNDECODED = object()


class _Reader:
    """Iterate the items of a binary file (JSONL, or one JSON list), hashing every byte read."""

    def __init__(self, fp: IO[bytes], summary: ImportSummary):
        self.fp = fp
        self.summary = summary
        self.hasher = hashlib.sha256()
        self._duplicate_keys: list[str] = []
        self._decoder = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=self._object)

    def _object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # json keeps the last of repeated keys silently; a repeated key is almost always a bug.
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen and key not in self._duplicate_keys:
                    self._duplicate_keys.append(key)
                seen.add(key)
        return obj

    def _decode(self, text: str, idx: int, line: int) -> tuple[Any, int, list[TaskImportError]]:
        """Decode one value at idx; raises json.JSONDecodeError / ValueError on bad syntax."""
        self._duplicate_keys.clear()
        obj, end = self._decoder.raw_decode(text, idx)
        errors = [TaskImportError(line, key, "duplicate key in one JSON object") for key in self._duplicate_keys]
        return obj, end, errors

    def items(self) -> Iterator[_Item]:
        lineno = 0
        pending: list[bytes] = []
        for raw in self.fp:
            self.hasher.update(raw)
            lineno += 1
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            stripped = raw.strip()
            if not stripped:
                pending.append(raw)
                continue
            if stripped.startswith(b"["):
                # A JSON list: needs the whole document; leading blank lines keep their numbers.
                self.summary.container = "json"
                pending.append(raw)
                yield from self._json_list(pending, first_line=lineno - len(pending) + 1)
                return
            yield self._jsonl(raw, lineno)
            break
        else:
            return
        for raw in self.fp:
            self.hasher.update(raw)
            lineno += 1
            if raw.strip():
                yield self._jsonl(raw, lineno)

    def _jsonl(self, raw: bytes, lineno: int) -> _Item:
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            return lineno, _UNDECODED, [TaskImportError(lineno, "line", f"not valid UTF-8 (byte {exc.start + 1})")]
        try:
            obj, end, errors = self._decode(text, _skip_ws(text, 0), lineno)
            rest = _skip_ws(text, end)
            if rest != len(text):
                raise json.JSONDecodeError("extra data after the JSON value (one object per line)", text, rest)
        except json.JSONDecodeError as exc:
            return lineno, _UNDECODED, [TaskImportError(lineno, "json", _json_error_reason(exc))]
        except (ValueError, RecursionError) as exc:
            return lineno, _UNDECODED, [TaskImportError(lineno, "json", f"malformed JSON: {exc}")]
        return lineno, obj, errors

    def _json_list(self, head: list[bytes], first_line: int) -> Iterator[_Item]:
        chunks = list(head)
        for raw in self.fp:
            self.hasher.update(raw)
            chunks.append(raw)
        data = b"".join(chunks)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = first_line + data.count(b"\n", 0, exc.start)
            yield line, _UNDECODED, [TaskImportError(line, "file", f"not valid UTF-8 (byte {exc.start + 1} of the list)")]
            return
        base = first_line - 1  # lines before the text we hold

        def error_at(pos: int, reason: str) -> _Item:
            line = base + text.count("\n", 0, pos) + 1
            return line, _UNDECODED, [TaskImportError(line, "json", reason)]

        idx = _skip_ws(text, 0) + 1  # past "["
        line, counted_to, index = base + 1, 0, 0
        while True:
            idx = _skip_ws(text, idx)
            if idx >= len(text):
                yield error_at(idx, "malformed JSON: the list is not closed with ']'")
                return
            if text[idx] == "]" and index == 0:
                break
            line += text.count("\n", counted_to, idx)
            counted_to = idx
            try:
                obj, end, errors = self._decode(text, idx, line)
            except json.JSONDecodeError as exc:
                yield error_at(exc.pos, _json_error_reason(exc))
                return
            except (ValueError, RecursionError) as exc:
                yield line, _UNDECODED, [TaskImportError(line, "json", f"malformed JSON: {exc}")]
                return
            yield line, obj, errors
            index += 1
            idx = _skip_ws(text, end)
            if idx < len(text) and text[idx] == ",":
                idx += 1
                continue
            if idx < len(text) and text[idx] == "]":
                break
            yield error_at(idx, "malformed JSON: expected ',' or ']' after a list item")
            return
        rest = _skip_ws(text, idx + 1)
        if rest != len(text):
            yield error_at(rest, "malformed JSON: extra data after the list")


def scan(
    fp: IO[bytes], *, scene: str | None = None, summary: ImportSummary | None = None
) -> Iterator[tuple[int, dict[str, Any] | None, list[TaskImportError]]]:
    """Yield (line, Task field dict or None, errors) for every item of a binary file.

    Counts, the duplicate-id check, the empty-file check and the file's sha256 land in
    `summary` (filled in as the iterator is consumed; complete once it is exhausted).
    """
    if scene is not None and scene not in SCENES:
        raise ValueError(f"unknown scene {scene!r}; valid scenes: {', '.join(SCENES)}")
    summary = summary if summary is not None else ImportSummary()
    reader = _Reader(fp, summary)
    first_seen: dict[str, int] = {}
    items = 0
    for line, value, read_errors in reader.items():
        items += 1
        if value is _UNDECODED:
            summary.errors.extend(read_errors)
            yield line, None, read_errors
            continue
        shape, fields, problems = validate_task(value, scene=scene)
        errors = read_errors + [TaskImportError(line, f, r) for f, r in problems]
        external_id = fields.get("external_id", "") if fields else (
            value.get("task_id" if shape == ADP else "external_id") if isinstance(value, dict) else None
        )
        if isinstance(external_id, str) and external_id:
            if external_id in first_seen:
                id_field = "task_id" if shape == ADP else "external_id"
                errors.append(TaskImportError(
                    line, id_field, f"duplicate {id_field} {external_id!r} (first on line {first_seen[external_id]})"
                ))
            else:
                first_seen[external_id] = line
        if errors:
            summary.errors.extend(errors)
            yield line, None, errors
            continue
        assert fields is not None and shape is not None
        summary.task_count += 1
        summary.by_scene[fields["scene"]] += 1
        summary.by_shape[shape] += 1
        yield line, fields, []
    summary.sha256 = reader.hasher.hexdigest()
    if items == 0:
        what = "the JSON list is empty" if summary.container == "json" else "the file is empty or only blank lines"
        error = TaskImportError(1, "file", f"no tasks: {what}")
        summary.errors.append(error)
        yield 1, None, [error]


def check_file(fp: IO[bytes], *, scene: str | None = None) -> ImportSummary:
    """Validate a whole file without keeping its rows; the summary lists every error."""
    summary = ImportSummary()
    for _ in scan(fp, scene=scene, summary=summary):
        pass
    return summary


def iter_tasks(fp: IO[bytes], *, scene: str | None = None, summary: ImportSummary | None = None) -> Iterator[dict[str, Any]]:
    """Yield Task field dicts; raise InvalidImport at the first invalid item.

    For the write pass after `check_file` passed: a file changed in between fails loudly
    instead of importing something that was not checked.
    """
    summary = summary if summary is not None else ImportSummary()
    for _line, fields, errors in scan(fp, scene=scene, summary=summary):
        if errors:
            raise InvalidImport(errors)
        assert fields is not None
        yield fields


def parse_tasks(fp: IO[bytes], *, scene: str | None = None) -> tuple[list[dict[str, Any]], ImportSummary]:
    """Read a (small) file into memory: (rows, summary); rows is empty when there are errors."""
    summary = ImportSummary()
    rows: list[dict[str, Any]] = []
    for _line, fields, _errors in scan(fp, scene=scene, summary=summary):
        if fields is not None and not summary.errors:
            rows.append(fields)
    return ([] if summary.errors else rows), summary
