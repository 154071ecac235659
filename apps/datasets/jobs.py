"""Export jobs: write a version's split in one format, resumably, and put it in place atomically.

The members are exported in chunks cut at task boundaries (DPO exporters see every rollout of
a task together). Each finished chunk is kept in `<path>.parts/` with its line count,
exclusions and checksum; a run that was interrupted resumes from the first missing chunk.
The chunks are then concatenated into `<path>.tmp`, fsynced, and renamed to `<path>`: the
destination only ever holds a complete file. The folder is next to a path the user gave, so
nothing is written through a link planted there (trajplatform.safefiles): every file is created
new (O_EXCL|O_NOFOLLOW) and renamed into place, and `<path>.parts/` must be a real directory
owned by the exporting user, or the export fails naming it. Every exporter renders each record on its own
(or each task group, for DPO), so the concatenation is byte-identical to a single pass.

The Hugging Face layout (layout="hf", recorded as the job's format_version "<n>+hf") exports each
split's chunks the same way into `<path>.parts/<split>/`, then builds the Parquet shards and the
card (apps/datasets/hf_layout.py) in `.<name>.tmp-<pid>` beside `<path>` and renames that folder
to `<path>` only when it is complete; an interrupted run resumes from the finished chunks.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import F
from django.utils import timezone

from apps.datasets import exporters, hf_layout, services
from apps.datasets.models import DatasetVersion, ExportabilityRun, ExportJob, VersionBuild
from apps.datasets.selectors import member_rows
from apps.datasets.spec import DatasetError
from apps.tasks.models import Trajectory
from trajplatform.safefiles import UnsafePathError, atomic_output, open_regular, private_directory
from trajplatform.schedules import ensure_schedule
from trajplatform.workers import holder_alive

log = logging.getLogger(__name__)

PARTS_SUFFIX = ".parts"
MANIFEST = "manifest.json"
COPY_BUFFER = 1 << 20

# The export reaper (a django-q2 Schedule, like the rollout and pipeline reapers): the broker holds
# only "run export N", so a job whose message was lost (a cluster killed after taking it; on Redis
# nothing comes back) is found from the rows and dispatched again; the claim makes a repeat harmless.
EXPORT_STALE_S = 600.0  # a queued job older than this is dispatched again
EXPORT_MAX_CLAIMS = 3  # a job whose worker died this many times fails instead of running again
REAP_SCHEDULE_NAME = "datasets.reap_exports"
REAP_FUNC = "apps.datasets.jobs.reap_exports"
REAP_EVERY_MINUTES = 1
BUILD_MAX_CLAIMS = 3  # a version build whose worker died this many times fails
BUILD_PROGRESS_EVERY_S = 0.5  # progress rows (and socket messages) at most this often, plus each stage's end

HF_SPLITS = ("train", "validation")  # the splits a Hugging Face layout of split "all" writes, each on its own
# Formats whose lines carry their index in the file (verl's extra_info.index).
POSITIONAL_FORMATS = frozenset({"rl-verl"})

ExportProgress = Callable[[int, int], None]  # (members done, members total)


def _chunks(rows: list[tuple[int, int, str]], size: int) -> list[list[tuple[int, int, str]]]:
    """Consecutive runs of about `size` members, never splitting a task's rollouts."""
    chunks: list[list[tuple[int, int, str]]] = []
    current: list[tuple[int, int, str]] = []
    for row in rows:
        if len(current) >= size and row[1] != current[-1][1]:
            chunks.append(current)
            current = []
        current.append(row)
    if current:
        chunks.append(current)
    return chunks


@functools.cache
def _supports_start_index() -> bool:
    """Whether export_records accepts options["start_index"] (the first line's index)."""
    try:
        exporters.export_records("raw", iter(()), io.BytesIO(), options={"start_index": 0})
    except ValueError:
        return False
    return True


def _check_hashes(chunk: list[tuple[int, int, str]]) -> None:
    frozen = {pk: sha for pk, _, sha in chunk}
    current = dict(Trajectory.objects.filter(pk__in=list(frozen)).values_list("pk", "content_sha256"))
    for pk, sha in frozen.items():
        if pk not in current:
            raise DatasetError(f"trajectory #{pk} of the version no longer exists")
        if current[pk] != sha:
            raise DatasetError(
                f"trajectory #{pk} changed since the version was frozen (content hash {current[pk][:12]}… "
                f"!= {sha[:12]}…); its export would not match the version"
            )


def _write_json_atomic(path: Path, payload: Any) -> None:
    with atomic_output(path, force=True, mode="w", encoding="utf-8") as fh:
        fh.write(json.dumps(payload, sort_keys=True, default=str))


def _read_json(path: Path) -> Any:
    """A JSON file of ours in the parts folder; None when it is missing or unreadable."""
    try:
        with open_regular(path) as fh:
            return json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def _export_chunks(
    *, version: DatasetVersion, fmt: str, rows: list[tuple[int, int, str]], parts: Path, options: dict[str, Any],
    tick: Callable[[int], None],
) -> tuple[list[Path], int, list[dict[str, Any]], int]:
    """Export `rows` in chunks into `parts` (resuming the chunks a run with the same manifest
    finished); (the chunk files in order, lines, exclusions, chunks resumed). tick(n): n members done."""
    exporter = exporters.FORMATS[fmt]
    # Lines may carry their position in the file (verl's extra_info.index): chunks can only be
    # exported separately when the exporter can start counting where the previous chunk ended.
    chunked = fmt not in POSITIONAL_FORMATS or _supports_start_index()
    chunks = _chunks(rows, max(1, settings.DATASET_EXPORT_CHUNK) if chunked else max(1, len(rows)))
    manifest = {
        "version_id": version.pk, "format": fmt, "format_version": str(exporter.version), "options": options,
        "chunks": [hashlib.sha256(",".join(str(r[0]) for r in c).encode()).hexdigest() for c in chunks],
    }
    existing = None
    if os.path.lexists(parts):
        private_directory(parts)  # a link or someone else's folder is refused before anything in it is read
        existing = _read_json(parts / MANIFEST)
    if existing != manifest:
        shutil.rmtree(parts, ignore_errors=True)
        if os.path.lexists(parts):  # chunks of another export must not be taken for this one's
            raise UnsafePathError(errno.EEXIST, f"{parts} (an earlier export's chunks) cannot be removed; "
                                                "remove it and retry")
        private_directory(parts)
        _write_json_atomic(parts / MANIFEST, manifest)

    resumed = lines = 0
    excluded: list[dict[str, Any]] = []
    files = []
    for i, chunk in enumerate(chunks):
        data, meta = parts / f"{i:06d}.jsonl", parts / f"{i:06d}.json"
        files.append(data)
        facts = _read_json(meta) if data.is_file() and not data.is_symlink() else None
        if isinstance(facts, dict) and data.stat().st_size == facts.get("bytes"):
            resumed += 1
            lines += facts["lines"]
            excluded.extend(facts["excluded"])
            tick(len(chunk))
            continue
        _check_hashes(chunk)
        with atomic_output(data, force=True) as out:
            chunk_options = {**options, "start_index": lines} if _supports_start_index() else options
            result = exporters.export_records(fmt, exporters.load_records([r[0] for r in chunk]), out, options=chunk_options)
        # The meta file marks the chunk complete; written after its data is on disk.
        _write_json_atomic(meta, {"lines": result.lines, "excluded": list(result.excluded),
                                  "bytes": data.stat().st_size})
        lines += result.lines
        excluded.extend(result.excluded)
        tick(len(chunk))
    return files, lines, excluded, resumed


def _ticker(total: int, progress: ExportProgress | None) -> Callable[[int], None]:
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if progress:
            progress(done[0], total)
    return tick


def write_export(
    *, version: DatasetVersion, fmt: str, split: str, path: Path, progress: ExportProgress | None = None,
    options: dict[str, Any] | None = None, layout: str = "jsonl",
) -> dict[str, Any]:
    """Write the export at `path` (resuming from `path.parts/`): the JSONL file, or with layout="hf"
    the Hugging Face layout's directory (hf_layout.py); returns its facts."""
    services.check_exportable(version, fmt, split)
    if hf_layout.check_layout(layout) == "hf":
        return _write_hf(version=version, fmt=fmt, split=split, path=path, progress=progress, options=options)
    rows = member_rows(version, split)
    options = dict(options or {})
    if split != "all":
        options.setdefault("split", split)
    options.setdefault("image_dir", str(path.with_name(f"{path.stem}_images")))  # vision formats' image files
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = path.with_name(path.name + PARTS_SUFFIX)
    files, lines, excluded, resumed = _export_chunks(version=version, fmt=fmt, rows=rows, parts=parts,
                                                     options=options, tick=_ticker(len(rows), progress))
    digest = hashlib.sha256()
    size = 0
    # force: export_start refused an existing file unless asked; whatever is at `path` now (a
    # link planted since) is replaced by the rename, never written through.
    with atomic_output(path, force=True) as out:
        for chunk_file in files:
            with open_regular(chunk_file) as src:
                while block := src.read(COPY_BUFFER):
                    digest.update(block)
                    size += len(block)
                    out.write(block)
    shutil.rmtree(parts, ignore_errors=True)
    return {"sha256": digest.hexdigest(), "lines": lines, "bytes": size, "members": len(rows),
            "excluded": excluded, "resumed_chunks": resumed}


def _write_hf(
    *, version: DatasetVersion, fmt: str, split: str, path: Path, progress: ExportProgress | None,
    options: dict[str, Any] | None,
) -> dict[str, Any]:
    """The Hugging Face layout: each split's chunks exported as JSONL in `path.parts/<split>/`
    (resumable), then Parquet shards and the card built in a folder beside `path` and renamed to it."""
    names = HF_SPLITS if split == "all" else (split,)
    rows = {name: member_rows(version, name) for name in names}
    base = dict(options or {})
    if fmt in hf_layout.IMAGE_FORMATS:
        base["images"] = "base64"  # the layout embeds the screenshots (datasets.Image)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = private_directory(path.with_name(path.name + PARTS_SUFFIX))
    tick = _ticker(sum(len(r) for r in rows.values()), progress)
    files: dict[str, list[Path]] = {}
    excluded: list[dict[str, Any]] = []
    resumed = 0
    for name in names:
        files[name], _, split_excluded, split_resumed = _export_chunks(
            version=version, fmt=fmt, rows=rows[name], parts=parts / name, options={**base, "split": name}, tick=tick)
        excluded += split_excluded
        resumed += split_resumed
    card = version.data_card or {}
    exporter = exporters.FORMATS[fmt]
    info = {
        "title": f"{version.dataset.name} v{version.number} ({fmt})", "description": exporter.description,
        "dataset": version.dataset.name, "version": version.number, "format": fmt,
        "format_version": hf_layout.format_version(exporter.version, "hf"),
        "members": sum(len(r) for r in rows.values()), "excluded": len(excluded),
        "reasons": Counter(e["reason"] for e in excluded).most_common(10),
        "licences": card.get("licences") or [], "models": card.get("by_model") or {},
    }
    tmp, old = hf_layout.temp_dir_for(path), path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    private_directory(tmp)
    try:
        facts = hf_layout.write_layout(target=tmp, fmt=fmt, splits=files, shard_rows=settings.DATASET_HF_SHARD_ROWS,
                                       info=info)
        # export_start refused an existing `path` unless forced: the old layout leaves by a rename
        # only once the new one is complete, and a link at `path` is renamed, never followed.
        if os.path.lexists(path):
            os.rename(path, old)
        os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if os.path.lexists(old):
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    shutil.rmtree(parts, ignore_errors=True)
    return {"sha256": facts["sha256"], "lines": facts["rows"], "bytes": facts["bytes"], "members": info["members"],
            "excluded": excluded, "resumed_chunks": resumed}


def export_run(job_id: int, *, progress: ExportProgress | None = None) -> ExportJob | None:
    """Run a queued export job; a no-op (None) if another worker already claimed it."""
    claimed = ExportJob.objects.filter(pk=job_id, status=ExportJob.Status.QUEUED).update(
        status=ExportJob.Status.RUNNING, started_at=timezone.now(), worker=f"{socket.gethostname()}:{os.getpid()}",
        claims=F("claims") + 1,
    )
    if not claimed:
        return None
    job = ExportJob.objects.select_related("version__dataset").get(pk=job_id)
    services.export_state_changed(job.version_id)
    facts = _to_an_end(
        lambda: write_export(version=job.version, fmt=job.format, split=job.split, path=Path(job.path),
                             progress=progress, layout=job.layout,
                             options=services.export_options(job)),
        fail=lambda error: services.export_fail(job=job, error=error), expected=(DatasetError, UnsafePathError),
        interrupted="interrupted; finished chunks are kept and a re-run resumes from them", what=f"export #{job_id}")
    if isinstance(facts, ExportJob):
        return facts  # failed
    return services.export_finish(job=job, **facts)


def _to_an_end(work: Callable[[], Any], *, fail: Callable[[str], Any], expected: tuple[type[BaseException], ...],
               interrupted: str, what: str, passes: tuple[type[BaseException], ...] = ()) -> Any:
    """work()'s result, or fail(reason)'s: an expected error (bad input) with its message, an
    unexpected one with its type, an interrupt recorded and raised again; `passes` are raised as they are."""
    try:
        return work()
    except passes:
        raise
    except expected as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        fail(interrupted)
        raise
    except Exception as exc:  # an unexpected failure still ends the job with a readable reason
        log.exception("%s failed", what)
        return fail(f"{type(exc).__name__}: {exc}")


def run_export(job_id: int) -> dict[str, Any]:
    """django-q2 entry point: run one export job (expects to be delivered more than once)."""
    job = export_run(job_id)
    if job is None:
        return {"job": job_id, "skipped": "already claimed"}
    return {"job": job.pk, "status": job.status, "lines": job.lines, "sha256": job.sha256, "error": job.error}


class BuildTakenOver(Exception):
    """The build this job runs is no longer its own (reaped as lost, then taken by another worker)."""


def _build_progress(build: VersionBuild) -> services.Progress:
    """dataset_version_create's progress callback for a build: written at most every
    BUILD_PROGRESS_EVERY_S and at each stage's end; raises BuildTakenOver when the row is no
    longer this worker's, which stops the build."""
    last = [0.0]

    def progress(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < BUILD_PROGRESS_EVERY_S:
            return
        last[0] = now
        if not services.version_build_progress(build=build, stage=stage, done=done, total=total):
            raise BuildTakenOver(f"version build #{build.pk} is no longer this worker's")

    return progress


def version_build_run(build_id: int) -> VersionBuild | None:
    """Run a queued version build (services.dataset_version_create); None if another worker
    already claimed it. Ends done (with its version) or failed with a readable reason."""
    claimed = VersionBuild.objects.filter(pk=build_id, status=VersionBuild.Status.QUEUED).update(
        status=VersionBuild.Status.RUNNING, started_at=timezone.now(), heartbeat_at=timezone.now(), stage="starting",
        done=0, total=0, worker=f"{socket.gethostname()}:{os.getpid()}", claims=F("claims") + 1,
    )
    if not claimed:
        return None
    build = VersionBuild.objects.select_related("parent", "requested_by").get(pk=build_id)
    services.build_state_changed(build.pk)
    if build.requested_by is None:  # only signed-in users queue builds; an account deleted since has no rights
        return services.version_build_fail(build=build, error="the account that asked for this build no longer exists")
    try:
        result = _to_an_end(
            lambda: services.dataset_version_create(
                dataset_name=build.dataset_name, filter_spec=build.filter_spec, actor=build.requested_by,
                parent=build.parent, notes=build.notes, progress=_build_progress(build), build=build,
                wait_exportability=False),
            fail=lambda error: services.version_build_fail(build=build, error=error),
            expected=(DatasetError, PermissionDenied), interrupted="interrupted; build the version again",
            what=f"version build #{build_id}", passes=(BuildTakenOver,))
    except BuildTakenOver:
        return None
    if isinstance(result, VersionBuild):
        return result  # failed
    build.refresh_from_db()
    return build


def run_version_build(build_id: int) -> dict[str, Any]:
    """django-q2 entry point: run one version build (expects to be delivered more than once)."""
    build = version_build_run(build_id)
    if build is None:
        return {"build": build_id, "skipped": "already claimed or taken over"}
    return {"build": build.pk, "status": build.status, "version": build.version_id, "error": build.error}


def run_exportability(run_id: int) -> dict[str, Any]:
    """django-q2 entry point: measure one version's exportability (expects to be delivered more than once)."""
    run = services.exportability_measure(run_id)
    if run is None:
        return {"run": run_id, "skipped": "already claimed or taken over"}
    return {"run": run.pk, "status": run.status, "version": run.version_id, "error": run.error}


def _export_worker_gone(job: ExportJob | VersionBuild | ExportabilityRun) -> str:
    """Why a running job's (an export's or a version build's) worker is gone ("" while it may still run): its process on this host
    has exited (or its pid now belongs to a younger process), or, from any host, it has run past
    django-q2's job timeout, after which the cluster has killed it."""
    host, _, pid = job.worker.partition(":")
    if host == socket.gethostname() and pid != str(os.getpid()) and not holder_alive(job.worker, job.started_at):
        return f"its worker {job.worker} is gone"
    if services._lost(job):
        return f"running since {job.started_at:%Y-%m-%d %H:%M:%S} UTC, past the job timeout"
    return ""


def reap_exports() -> dict[str, int]:
    """Put running exports whose worker is gone back in the queue (they resume from their finished
    chunks), failing those taken EXPORT_MAX_CLAIMS times; dispatch again the queued ones older than
    EXPORT_STALE_S (a lost broker message). The same for version builds (which start over) and
    exportability runs (which resume after their finished chunks).
    Counts by outcome."""
    report = {"requeued": 0, "failed": 0, "dispatched": 0}
    for job in ExportJob.objects.filter(status=ExportJob.Status.RUNNING).only("pk", "worker", "started_at", "status"):
        reason = _export_worker_gone(job)
        outcome = services.export_requeue(job_id=job.pk, reason=reason, max_claims=EXPORT_MAX_CLAIMS) if reason else ""
        if outcome:
            report[outcome] += 1
    stale_before = timezone.now() - timedelta(seconds=EXPORT_STALE_S)
    for pk in ExportJob.objects.filter(status=ExportJob.Status.QUEUED, created_at__lt=stale_before).values_list("pk", flat=True):
        services._enqueue_export(pk)
        report["dispatched"] += 1
    for build in VersionBuild.objects.filter(status=VersionBuild.Status.RUNNING).only("pk", "worker", "started_at", "status"):
        reason = _export_worker_gone(build)
        outcome = services.version_build_requeue(build_id=build.pk, reason=reason, max_claims=BUILD_MAX_CLAIMS) if reason else ""
        if outcome:
            report[f"builds_{outcome}"] = report.get(f"builds_{outcome}", 0) + 1
    for pk in VersionBuild.objects.filter(status=VersionBuild.Status.QUEUED, created_at__lt=stale_before).values_list("pk", flat=True):
        services._enqueue_build(pk)
        report["builds_dispatched"] = report.get("builds_dispatched", 0) + 1
    for run in ExportabilityRun.objects.filter(status=ExportabilityRun.Status.RUNNING).only(
            "pk", "worker", "started_at", "status"):
        reason = _export_worker_gone(run)
        outcome = services.exportability_requeue(run_id=run.pk, reason=reason,
                                                 max_claims=services.EXPORTABILITY_MAX_CLAIMS) if reason else ""
        if outcome:
            report[f"exportability_{outcome}"] = report.get(f"exportability_{outcome}", 0) + 1
    for pk in ExportabilityRun.objects.filter(status=ExportabilityRun.Status.QUEUED, created_at__lt=stale_before
                                              ).values_list("pk", flat=True):
        services._enqueue_exportability(pk)
        report["exportability_dispatched"] = report.get("exportability_dispatched", 0) + 1
    if any(report.values()):
        log.info("export reaper: %s", report)
    return report


def ensure_export_schedules(*, minutes: int = REAP_EVERY_MINUTES, using: str = "default") -> Any:
    """Register the export reaper's django-q2 Schedule (idempotent); returns it."""
    return ensure_schedule(name=REAP_SCHEDULE_NAME, func=REAP_FUNC, minutes=minutes, using=using)
