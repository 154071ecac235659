"""Read our `raw` export format back into Batch, Task, Trajectory and Review rows.

`trajectories_import(path_or_file=..., actor=...)` checks the whole file first and reports
every bad line as `FILE:LINE: reason`; only a clean file is written, in one transaction, with
one audit row. Tasks are recreated once per source task id (the file's lines of one task must
agree on its definition); each source batch name becomes a new batch of that name (refused if
a batch of that name exists), unless `batch_name` puts everything in one batch. The latest automatic and human review of each
trajectory come back too; a human review's reviewer must exist here (by username).
Imported tasks are `completed`: they are data, not work for the queue.
"""
from __future__ import annotations

import codecs
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any

import orjson
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q, TextField
from django.db.models.functions import Cast

from apps.datasets.exporters import export_records
from apps.datasets.exporters.chat import RenderError
from apps.datasets.exporters.formats import validate_raw
from apps.datasets.exporters.records import TASK_FIELDS, TIMESTAMP_FIELDS, review_columns
from apps.datasets.interchange import Image, InterchangeError, looks_like, to_raw_lines
from apps.reviews.models import Review
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.services import BatchNameTaken, batch_create
from trajplatform import artifacts, json_limits
from trajplatform.audit import audit_record
from trajplatform.redaction import unstorable_fields

MAX_ERRORS = 1000
CHUNK = 1000
# The levels a record converted from another tool's file adds around the file's values (which are
# checked against API_MAX_JSON_DEPTH themselves): config_snapshot.imported_from.kept.<field>, a
# message's provenance.<format>.<item>.
CONVERTED_NESTING = 8
TRAJECTORY_COPY_FIELDS = (
    "iteration", "sample_index", "status", "messages", "tools", "steps", "final_answer", "outcome",
    "outcome_reason", "reward", "verifier_output", "model", "config_snapshot", "prompt_tokens",
    "completion_tokens", "total_tokens", "error",
)


IMPORT_PERMISSION = "tasks.add_trajectory"


class RawImportError(ValueError):
    """The file has problems; `errors` lists them as `FILE:LINE: reason`; nothing was written.
    `field` names the import's option they are about (batch, outcome), "" when it is the file."""

    def __init__(self, errors: list[str], *, field: str = ""):
        self.errors = errors
        self.field = field
        super().__init__("\n".join(errors))


@dataclass
class RawImportResult:
    batches: list[Any] = field(default_factory=list)
    task_count: int = 0
    trajectory_count: int = 0
    review_count: int = 0
    # Lines whose content no longer matches their recorded content_sha256 (e.g. redacted on export).
    rehashed: int = 0
    sha256: str = ""
    # Imported trajectories a chat format cannot take as they are (FILE: id: format: reason).
    warnings: list[str] = field(default_factory=list)


class _LineError(Exception):
    pass


def _open(path_or_file: Any, unnamed: str = "input") -> tuple[IO[bytes], str, bool]:
    """(the file, its label in messages, whether this call opened it) of a path or an open binary file."""
    if isinstance(path_or_file, (str, Path)):
        path = Path(path_or_file)
        if not path.is_file():
            raise RawImportError([f"{path}: no such file"])
        return path.open("rb"), str(path), True
    return path_or_file, str(getattr(path_or_file, "name", "") or unnamed), False


def _lines(fp: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(fp, start=1):
        if number == 1:
            line = line.removeprefix(codecs.BOM_UTF8)  # RFC 8259 lets a reader ignore it; Windows tools write it
        if line.strip():
            yield number, line


def _parse_time(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise _LineError(f"{name}: not an ISO 8601 timestamp") from None
    if parsed.tzinfo is None:
        raise _LineError(f"{name}: timestamp without a time zone")
    return parsed


class _Checker:
    """First pass: everything that could make the write fail, per line, without writing."""

    def __init__(self, batch_name: str | None) -> None:
        self.Task, self.Trajectory, self.Review = Task, Trajectory, Review
        self.batch_name = batch_name
        self.tasks: dict[int, tuple[int, dict[str, Any]]] = {}  # source task id -> (line, definition)
        self.max_iteration: dict[int, int] = {}
        self.samples: dict[tuple[int, int, int], int] = {}
        self.external_ids: dict[tuple[str, str], tuple[int, int]] = {}  # (batch, external id) -> (task, line)
        self.reviewers: dict[str, Any] = {}
        self.auto_fields, self.human_fields = review_columns()
        self.verdicts = {c[0] for c in Review._meta.get_field("verdict").choices}
        self.review_statuses = {c[0] for c in Review._meta.get_field("status").choices}

    def batch_for(self, task: dict[str, Any], default: str) -> str:
        return self.batch_name or task.get("batch") or default

    def check(self, number: int, line: bytes, default_batch: str) -> dict[str, Any]:
        try:  # before the parse: the checks, the record's JSON and the database's each recurse per level
            json_limits.check_depth(line, json_limits.max_depth() + CONVERTED_NESTING)
            record = orjson.loads(line)
        except json_limits.JSONTooDeep as exc:
            raise _LineError(f"{exc} (API_MAX_JSON_DEPTH)") from None
        except orjson.JSONDecodeError as exc:
            raise _LineError(f"not valid JSON ({exc})") from None
        if b"\\u0000" in line:  # escaped NUL: PostgreSQL's jsonb cannot store it; refused, as a task import does
            unstorable = unstorable_fields(record)
            if unstorable:
                raise _LineError("; ".join(f"{path}: {reason}" for path, reason in unstorable[:5]))
        problems = validate_raw(record)
        if problems:
            raise _LineError("; ".join(p.removeprefix("line.") for p in problems[:5]))
        task = record["task"]
        source_task = record["task_id"]
        definition = {f: task.get(f) for f in TASK_FIELDS}
        definition["batch"] = self.batch_for(task, default_batch)
        seen = self.tasks.get(source_task)
        if seen is None:
            self._check_task(definition, source_task, number)
            self.tasks[source_task] = (number, definition)
        elif seen[1] != definition:
            raise _LineError(f"task: task {source_task} differs from its definition on line {seen[0]}")
        key = (source_task, record["iteration"], record["sample_index"])
        if key in self.samples:
            raise _LineError(
                f"task {source_task} iteration {key[1]} sample {key[2]} is already on line {self.samples[key]}")
        self.samples[key] = number
        self.max_iteration[source_task] = max(self.max_iteration.get(source_task, 0), record["iteration"])
        self._check_trajectory(record)
        self._check_reviews(record["reviews"])
        return record

    def _check_task(self, definition: dict[str, Any], source_task: int, number: int) -> None:
        fields = {f: definition[f] for f in TASK_FIELDS}
        try:
            self.Task(**fields).clean_fields(exclude=["batch", "created_by"])
        except ValidationError as exc:
            raise _LineError("; ".join(f"task.{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None
        except (TypeError, ValueError) as exc:
            raise _LineError(f"task: {exc}") from None
        if definition["external_id"]:
            key = (definition["batch"], definition["external_id"])
            other = self.external_ids.get(key)
            if other is not None:
                raise _LineError(f"task.external_id: {key[1]!r} is also task {other[0]} (line {other[1]}) in batch "
                                 f"{key[0]!r}; external ids must be unique within a batch")
            self.external_ids[key] = (source_task, number)

    def _check_trajectory(self, record: dict[str, Any]) -> None:
        if record["status"] not in self.Trajectory.FINAL:
            raise _LineError(f"status: {record['status']!r}; only finished or cancelled trajectories can be imported")
        if (record["status"] == "finished") != (record["outcome"] in ("success", "failure", "error")):
            raise _LineError("outcome: a finished trajectory needs success, failure or error; others none")
        try:
            Decimal(record["cost_usd"])
        except InvalidOperation:
            raise _LineError("cost_usd: not a decimal number") from None
        for name in TIMESTAMP_FIELDS:
            _parse_time(record.get(name), name)
        values = {f: record[f] for f in TRAJECTORY_COPY_FIELDS}
        try:
            self.Trajectory(**values, cost_usd=Decimal(record["cost_usd"])).clean_fields(exclude=["task"])
        except ValidationError as exc:
            raise _LineError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None

    def _check_reviews(self, reviews: dict[str, Any]) -> None:
        for kind in ("auto", "human"):
            review = reviews.get(kind)
            if review is None:
                continue
            if not isinstance(review, dict):
                raise _LineError(f"reviews.{kind}: must be an object or null")
            overall = review.get("overall")
            if overall is not None and (isinstance(overall, bool) or not isinstance(overall, (int, float))
                                        or not 0 <= overall <= 100):
                raise _LineError(f"reviews.{kind}.overall: must be a number from 0 to 100 or null")
            if review.get("status") == "judge_failed" and overall is not None:
                raise _LineError(f"reviews.{kind}.overall: a failed judge carries no score")
            if review.get("verdict") and review["verdict"] not in self.verdicts:
                raise _LineError(f"reviews.{kind}.verdict: {review['verdict']!r} is not one of {sorted(self.verdicts)}")
            if review.get("status", "done") not in self.review_statuses:
                raise _LineError(f"reviews.{kind}.status: {review.get('status')!r} is unknown")
            names = self.auto_fields if kind == "auto" else self.human_fields
            try:
                self.Review(kind=kind, **_review_values(review, names)).clean_fields(
                    exclude=["trajectory", "reviewer"])
            except ValidationError as exc:
                raise _LineError("; ".join(f"reviews.{kind}.{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) \
                    from None
            if kind == "human":
                self.reviewer(review.get("reviewer"))

    def reviewer(self, username: Any) -> Any:
        if not isinstance(username, str) or not username:
            raise _LineError("reviews.human.reviewer: a human review needs the reviewer's username")
        if username not in self.reviewers:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise _LineError(f"reviews.human.reviewer: no user named {username!r} here; create the account first")
            self.reviewers[username] = user
        return self.reviewers[username]


def _check_file(fp: IO[bytes], label: str, checker: _Checker, default_batch: str) -> tuple[list[str], str, int]:
    errors: list[str] = []
    digest = hashlib.sha256()
    count = 0
    for number, line in _lines(_hashing(fp, digest)):
        count += 1
        try:
            checker.check(number, line, default_batch)
        except _LineError as exc:
            errors.append(f"{label}:{number}: {exc}")
            if len(errors) >= MAX_ERRORS:
                errors.append(f"{label}: stopped after {MAX_ERRORS} errors")
                break
    if not errors and count == 0:
        errors.append(f"{label}: no trajectories in the file")
    return errors, digest.hexdigest(), count


def _hashing(fp: IO[bytes], digest: Any) -> Iterator[bytes]:
    for line in fp:
        digest.update(line)
        yield line


def trajectories_import(*, path_or_file: Any, actor: Any, batch_name: str | None = None) -> RawImportResult:
    """Import a raw export (JSONL) all or nothing; raises RawImportError listing every bad line."""
    if actor is not None and getattr(actor, "is_authenticated", False) and not actor.has_perm(IMPORT_PERMISSION):
        raise PermissionDenied(f"importing trajectories needs the {IMPORT_PERMISSION} permission (admin role): "
                               "an import writes tasks, outcomes and human verdicts as they are in the file")
    if batch_name is not None and (not batch_name.strip() or len(batch_name) > 200):
        raise RawImportError(["batch name: must be 1-200 characters"], field="batch")
    fp, label, owned = _open(path_or_file)
    try:
        default_batch = Path(label).stem or "import"
        checker = _Checker(batch_name)
        errors, sha256, _ = _check_file(fp, label, checker, default_batch)
        if errors:
            raise RawImportError(errors)
        # Batch names are unique: an import never adds to an existing batch.
        taken = sorted(Batch.objects.filter(name__in={d["batch"][:200] for _, d in checker.tasks.values()})
                       .values_list("name", flat=True))
        if taken:
            raise RawImportError([f"batch {name!r} already exists; give the import a new batch name"
                                  for name in taken], field="batch")
        fp.seek(0)
        result = RawImportResult(sha256=sha256)
        user = actor if getattr(actor, "is_authenticated", False) else None
        with transaction.atomic():
            batches: dict[str, Batch] = {}
            tasks: dict[int, Task] = {}
            for source_task, (_, definition) in checker.tasks.items():
                name = definition["batch"]
                if name not in batches:
                    try:  # race-safe: a concurrent import of the same name loses here, not with an IntegrityError
                        batches[name], _ = batch_create(
                            name=name, created_by=user, source_name=Path(label).name, source_sha256=sha256,
                            source_format="raw", notes="imported by import_trajectories")
                    except BatchNameTaken:
                        raise RawImportError([f"batch {name[:200]!r} already exists; give the import a new batch "
                                              "name"], field="batch") from None
                fields = {f: definition[f] for f in TASK_FIELDS}
                tasks[source_task] = Task(batch=batches[name], created_by=user, status=Task.Status.COMPLETED,
                                          current_iteration=checker.max_iteration[source_task], **fields)
            Task.objects.bulk_create(list(tasks.values()), batch_size=CHUNK)
            for batch in batches.values():
                batch.task_count = sum(1 for t in tasks.values() if t.batch_id == batch.pk)
                batch.save(update_fields=["task_count"])
            pending: list[tuple[Trajectory, dict[str, Any]]] = []
            for _, line in _lines(fp):
                record = orjson.loads(line)
                trajectory = Trajectory(task=tasks[record["task_id"]], cost_usd=Decimal(record["cost_usd"]),
                                        **{f: record[f] for f in TRAJECTORY_COPY_FIELDS},
                                        **{f: _parse_time(record[f], f) for f in TIMESTAMP_FIELDS})
                trajectory.content_sha256 = trajectory.compute_content_sha256()
                result.rehashed += trajectory.content_sha256 != record["content_sha256"]
                pending.append((trajectory, record["reviews"]))
                if len(pending) >= CHUNK:
                    result.review_count += _flush(pending, checker, Trajectory, Review)
                    result.trajectory_count += len(pending)
                    pending = []
            result.review_count += _flush(pending, checker, Trajectory, Review)
            result.trajectory_count += len(pending)
            result.batches = list(batches.values())
            result.task_count = len(tasks)
            audit_record(
                "datasets.trajectories_import", actor=actor, target=result.batches[0],
                data={"source_name": Path(label).name, "source_sha256": sha256,
                      "batches": [b.pk for b in result.batches], "tasks": result.task_count,
                      "trajectories": result.trajectory_count, "reviews": result.review_count,
                      "rehashed": result.rehashed},
            )
        return result
    finally:
        if owned:
            fp.close()


def _review_values(data: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Model field values from an exported review (absent fields keep the model's defaults)."""
    values = {f: data[f] for f in names if f in data and (data[f] is not None or f in ("overall", "finished_at"))}
    if "finished_at" in values:
        values["finished_at"] = _parse_time(values["finished_at"], "finished_at")
    return values


def _flush(pending: list[tuple[Any, dict[str, Any]]], checker: _Checker, Trajectory: Any, Review: Any) -> int:
    if not pending:
        return 0
    Trajectory.objects.bulk_create([t for t, _ in pending], batch_size=CHUNK)
    reviews = []
    for trajectory, by_kind in pending:
        for kind, names in (("auto", checker.auto_fields), ("human", checker.human_fields)):
            data = by_kind.get(kind)
            if not data:
                continue
            values = _review_values(data, names)
            reviewer = checker.reviewer(data.get("reviewer")) if kind == "human" else None
            reviews.append(Review(trajectory=trajectory, kind=kind, reviewer=reviewer, **values))
    Review.objects.bulk_create(reviews, batch_size=CHUNK)
    return len(reviews)


# --- other tools' formats (apps.datasets.interchange) ------------------------------------------


def interchange_import(*, path_or_file: Any, fmt: str, actor: Any, batch_name: str | None = None,
                       outcome: str | None = None, scene: str | None = None) -> Any:
    """Import a file of trajectories — ours (`raw`) or another tool's (ATIF / ADP / mini-swe-agent,
    converted to raw lines first) — through the raw importer: all or nothing, one audit row; then
    store the images the file carried and record which stored artifacts the new trajectories use.
    `path_or_file` is a path or a binary file object (an upload); RawImportError lists the problems."""
    images: dict[str, Image] = {}
    warnings: list[str] = []
    if fmt != "raw":
        fp, label, owned = _open(path_or_file, unnamed="upload")
        try:
            data = fp.read()
        finally:
            if owned:
                fp.close()
        try:
            raw = to_raw_lines(data, fmt, label=label, outcome=outcome, scene=scene, images=images, warnings=warnings)
        except InterchangeError as exc:
            raise RawImportError(exc.errors, field=exc.field) from None
        except RenderError as exc:
            raise RawImportError([str(exc)]) from None
        warnings += chat_shape_warnings(raw, Path(label).name)
        path_or_file = io.BytesIO(raw)
        path_or_file.name = f"{Path(label).stem}.{fmt}"
    else:
        _refuse_other_formats(path_or_file)
    # Images are stored only once the raw importer has accepted the file, inside its transaction:
    # a refused file leaves nothing behind, a storage failure undoes the import.
    with transaction.atomic():
        result = trajectories_import(path_or_file=path_or_file, actor=actor, batch_name=batch_name)
        _keep_images(images, result.batches)
    result.warnings = warnings
    return result


def _refuse_other_formats(path_or_file: Any) -> None:
    """One error for a file given as raw whose first line is no JSON but which, read whole, is another
    format (an indented ATIF or ADP document): not one 'not valid JSON' per line of it."""
    fp, label, owned = _open(path_or_file)
    try:
        first = next((line for _, line in _lines(fp)), b"")
        try:
            orjson.loads(first)
            return
        except orjson.JSONDecodeError:
            pass
        fp.seek(0)
        try:
            whole = orjson.loads(fp.read().removeprefix(codecs.BOM_UTF8))
        except orjson.JSONDecodeError:
            return  # the per-line errors say where it is not JSON
        what, reader = looks_like(whole)
        if reader is not None and reader != "raw":
            raise RawImportError([f"{label}: {what}, not a raw export (JSONL of our records); import it with format "
                                  f"{reader}"], field="format")
    finally:
        if owned:
            fp.close()
        else:
            fp.seek(0)


CHAT_FORMATS = ("sft-trl", "sft-openai", "sharegpt")


def chat_shape_warnings(raw: bytes, label: str) -> list[str]:
    """Per trajectory and chat format, why the file's shape cannot become that format's
    conversation (an episode that ends on an action, as next-action datasets do): said at import,
    not found out at export."""
    lines = [line for line in raw.splitlines() if line.strip()]
    warnings = []
    for start in range(0, len(lines), CHUNK):  # a chunk of records at a time: a big file is not all parsed at once
        records = [orjson.loads(line) for line in lines[start:start + CHUNK]]
        names = {r["trajectory_id"]: r["task"].get("external_id") or f"trajectory {r['trajectory_id']}"
                 for r in records}
        for fmt in CHAT_FORMATS:
            for excluded in export_records(fmt, records, _Nowhere(), dry_run=True).excluded:
                warnings.append(f"{label}: {names.get(excluded['trajectory_id'])}: not exportable as {fmt}: "
                                f"{excluded['reason'].removeprefix(f'{fmt}: ')}")
    if len(warnings) > MAX_ERRORS:
        warnings[MAX_ERRORS:] = [f"{label}: ... and {len(warnings) - MAX_ERRORS} more"]
    return warnings


class _Nowhere(io.RawIOBase):
    """Where the warnings' trial exports write: only their refusals are read."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return len(data)


def _keep_images(images: dict[str, Image], batches: list[Any]) -> None:
    """Store the imported images and record the stored artifacts the new trajectories' messages and
    steps name (screenshots of our own exports come back with their uses, so deleting the original
    episode keeps them); on failure, remove the files this call wrote (their rows roll back)."""
    files = artifacts.storage()
    written: list[str] = []
    try:
        for sha, image in images.items():
            name = artifacts.file_name(sha, image.mime)
            if not files.exists(name):
                written.append(name)
            artifacts.store(image.data, image.mime, width=image.width, height=image.height)
        # only rows whose JSON names an artifact are read back (the database does the scan)
        rows = (Trajectory.objects.filter(task__batch__in=batches)
                .annotate(messages_text=Cast("messages", TextField()), steps_text=Cast("steps", TextField()))
                .filter(Q(messages_text__contains="artifact") | Q(steps_text__contains="artifact"))
                .only("pk", "messages", "steps"))
        artifacts.link_trajectories({t.pk: [t.messages, t.steps] for t in rows.iterator(chunk_size=500)})
    except Exception:
        for name in written:
            files.delete(name)
        raise
