"""Export jobs: queueing on commit, CAS claims, atomic files, checksums, resumption, card counts."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from apps.datasets import exporters
from apps.datasets.jobs import export_run, run_export
from apps.datasets.models import ExportJob
from apps.datasets.selectors import export_checksums
from apps.datasets.services import (
    ExportError, dataset_version_create, dataset_version_publish, export_path, export_start, split_of,
)
from apps.tasks.models import Trajectory
from tests.datasets.version_data import (  # noqa: F401 (export_dir is a fixture)
    export_dir, loader_failing_on_call, make_trajectory, no_dedup,
)
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db


def published_version(make_task: Any, approver: Any, name: str, tasks: int, *, prompt_end: str = "",
                      failed_too: bool = False, **filters: Any) -> Any:
    """A published version of dataset `name`: `tasks` code tasks with a good rollout each (and a
    failed one with failed_too), no dedup, `filters` for the rest of the filter spec."""
    task_ids = []
    for i in range(tasks):
        task = make_task(prompt=f"Write program number {i}{prompt_end}")
        task_ids.append(task.pk)
        make_trajectory(task, code=f"print({i})", score=90, reward=1.0)
        if failed_too:
            make_trajectory(task, code=f"print({i}) # wrong", outcome="failure", reward=0.0, score=30)
    if filters.get("validation_fraction"):
        # Task ids differ between databases and runs: move the seed on until both splits hold a
        # task, so the split tests never meet an empty split (an empty split is refused by name).
        seed = filters.get("split_seed", 0)
        while len({split_of(t, seed, filters["validation_fraction"]) for t in task_ids}) < 2:
            seed += 1
        filters["split_seed"] = seed
    v = dataset_version_create(dataset_name=name, actor=approver, filter_spec=no_dedup(**filters))
    return dataset_version_publish(version=v, actor=approver)


@pytest.fixture
def version(make_task: Any, approver: Any) -> Any:
    """Six tasks, two rollouts each (one good, one failed): pairs for DPO, lines for SFT."""
    return published_version(make_task, approver, "code", 6, prompt_end=" ✓", failed_too=True,
                             validation_fraction=0.3, split_seed=3)


def _lines(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_export_job(version: Any, fmt: str, split: str = "all", **kw: Any) -> ExportJob:
    job = export_start(version=version, fmt=fmt, split=split, actor=None, enqueue=False, **kw)
    return export_run(job.pk) or ExportJob.objects.get(pk=job.pk)


def test_export_start_enqueues_the_job_on_commit_and_writes_an_audit_row(
        version: Any, approver: Any, django_capture_on_commit_callbacks: Any) -> None:
    from django_q.models import OrmQ

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        job = export_start(version=version, fmt="sft-openai", split="all", actor=approver)
    # the job's enqueue and the version page's export-state event (tests/console/test_export_states_ws.py)
    assert len(callbacks) == 2 and OrmQ.objects.count() == 1
    assert job.status == "queued" and job.requested_by == approver
    assert Path(job.path) == export_path(version, "sft-openai", "all")
    assert AuditEvent.objects.filter(action="datasets.export_start", target_id=str(job.pk)).count() == 1
    # Asking again while it is queued returns the same job instead of queueing twice.
    assert export_start(version=version, fmt="sft-openai", split="all", actor=approver).pk == job.pk


def test_the_job_writes_the_file_records_its_checksum_and_runs_once(version: Any) -> None:
    job = export_start(version=version, fmt="sft-openai", split="all", actor=None, enqueue=False)
    result = run_export(job.pk)
    assert result["status"] == "done"
    assert run_export(job.pk) == {"job": job.pk, "skipped": "already claimed"}  # a second delivery
    job.refresh_from_db()
    path = Path(job.path)
    assert path.is_file() and not Path(f"{path}.tmp").exists() and not Path(f"{path}.parts").exists()
    assert job.sha256 == _sha(path) and job.bytes == path.stat().st_size
    assert AuditEvent.objects.filter(action="datasets.export_finish", target_id=str(job.pk)).count() == 1
    assert export_checksums(version)[0]["sha256"] == job.sha256


@pytest.mark.parametrize("fmt", ["sft-openai", "sft-trl", "sharegpt", "raw"])
@pytest.mark.parametrize("split", ["all", "train", "validation"])
def test_card_counts_equal_the_lines_in_the_file(version: Any, fmt: str, split: str) -> None:
    job = run_export_job(version, fmt, split)
    assert job.status == "done", job.error
    lines = _lines(job.path)
    assert job.lines == len(lines)
    assert job.members == version.counts[split if split != "all" else "members"]
    assert job.lines + len(job.excluded) == job.members  # one line per member, or a listed exclusion
    assert job.excluded == []  # these trajectories are all renderable


def test_dpo_pairs_stay_within_a_task_and_the_split(version: Any) -> None:
    job = run_export_job(version, "dpo-trl", "train")
    assert job.status == "done", job.error
    assert job.lines == version.counts["train"] // 2  # one pair per task (a good and a failed rollout)
    prompts = [json.dumps(line["prompt"], ensure_ascii=False) for line in _lines(job.path)]
    assert len(set(prompts)) == len(prompts)


def test_re_exporting_a_version_gives_byte_identical_files(version: Any, tmp_path: Path) -> None:
    first = run_export_job(version, "sft-trl", "all")
    again = run_export_job(version, "sft-trl", "all", force=True)  # same server-side path, rewritten
    elsewhere = run_export_job(version, "sft-trl", "all", out_path=tmp_path / "copy.jsonl")
    assert first.sha256 == again.sha256 == elsewhere.sha256 == _sha(tmp_path / "copy.jsonl")
    # Without force, the finished export is returned instead of a new job.
    assert export_start(version=version, fmt="sft-trl", split="all", actor=None, enqueue=False).pk == again.pk


def test_an_interrupted_export_resumes_from_its_finished_chunks(
        version: Any, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.DATASET_EXPORT_CHUNK = 4  # 12 members -> 3 chunks at task boundaries
    reference = run_export_job(version, "sft-openai", "all", out_path=tmp_path / "reference.jsonl")
    real_load = exporters.load_records
    monkeypatch.setattr(exporters, "load_records", loader_failing_on_call(2, RuntimeError("worker lost")))
    out = tmp_path / "resumed.jsonl"
    failed = run_export_job(version, "sft-openai", "all", out_path=out)
    assert failed.status == "failed" and "worker lost" in failed.error
    assert not out.exists() and (tmp_path / "resumed.jsonl.parts").is_dir()
    assert AuditEvent.objects.filter(action="datasets.export_fail", target_id=str(failed.pk)).count() == 1

    monkeypatch.setattr(exporters, "load_records", real_load)
    resumed = run_export_job(version, "sft-openai", "all", out_path=out)
    assert resumed.status == "done" and resumed.resumed_chunks == 1
    assert resumed.sha256 == reference.sha256 == _sha(out)
    assert not (tmp_path / "resumed.jsonl.parts").exists()


def test_a_trajectory_changed_after_freezing_fails_the_export_and_writes_no_file(version: Any) -> None:
    member = version.members.order_by("position").first()
    t = Trajectory.objects.get(pk=member.trajectory_id)
    t.final_answer = "edited later"
    t.save()
    job = run_export_job(version, "raw", "all")
    assert job.status == "failed" and f"trajectory #{t.pk} changed since the version was frozen" in job.error
    assert not Path(job.path).exists()


def test_it_refuses_unknown_formats_splits_and_a_changed_exporter(version: Any, monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="unknown format"):
        export_start(version=version, fmt="csv", split="all", actor=None)
    with pytest.raises(ExportError, match="unknown split"):
        export_start(version=version, fmt="raw", split="test", actor=None)
    existing = tmp_path / "exists.jsonl"
    existing.write_text("keep me")
    with pytest.raises(ExportError, match="already exists; pass --force"):
        export_start(version=version, fmt="raw", split="all", actor=None, out_path=existing)
    assert existing.read_text() == "keep me"
    from dataclasses import replace

    monkeypatch.setitem(exporters.FORMATS, "raw", replace(exporters.FORMATS["raw"], version="999"))
    with pytest.raises(ExportError, match="frozen with raw exporter"):
        export_start(version=version, fmt="raw", split="all", actor=None)
    assert not ExportJob.objects.exists()


def test_exporting_needs_the_approver_role(version: Any, reviewer: Any) -> None:
    from django.core.exceptions import PermissionDenied

    with pytest.raises(PermissionDenied):
        export_start(version=version, fmt="raw", split="all", actor=reviewer)


class _Killed(BaseException):
    """What a kill -9 leaves behind: the job's code stops where it is, nothing marks the row."""


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_reaper_puts_an_export_whose_worker_died_back_in_the_queue_and_it_resumes(
        version: Any, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any) -> None:
    import socket

    from django_q.models import OrmQ

    from apps.datasets import jobs

    settings.DATASET_EXPORT_CHUNK = 4  # 12 members -> 3 chunks
    reference = run_export_job(version, "sft-openai", "all", out_path=tmp_path / "reference.jsonl")
    real_load = exporters.load_records
    monkeypatch.setattr(exporters, "load_records", loader_failing_on_call(2, _Killed()))
    out = tmp_path / "killed.jsonl"
    job = export_start(version=version, fmt="sft-openai", split="all", actor=None, enqueue=False, out_path=out)
    with pytest.raises(_Killed):
        export_run(job.pk)
    job.refresh_from_db()
    assert job.status == "running" and job.claims == 1 and (tmp_path / "killed.jsonl.parts").is_dir()
    assert jobs.reap_exports() == {"requeued": 0, "failed": 0, "dispatched": 0}  # its worker (this process) lives

    ExportJob.objects.filter(pk=job.pk).update(worker=f"{socket.gethostname()}:{_dead_pid()}")
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs.reap_exports()["requeued"] == 1
    job.refresh_from_db()
    assert job.status == "queued" and job.worker == "" and OrmQ.objects.count() == 1  # dispatched after commit
    event = AuditEvent.objects.get(action="datasets.export_requeue", target_id=str(job.pk))
    assert event.data["outcome"] == "requeued" and "is gone" in event.data["reason"]

    monkeypatch.setattr(exporters, "load_records", real_load)
    resumed = export_run(job.pk)
    assert resumed.status == "done" and resumed.resumed_chunks == 1 and resumed.claims == 2
    assert resumed.sha256 == reference.sha256 == _sha(out)


def test_the_reaper_fails_an_export_after_its_claims_and_leaves_live_ones_alone(version: Any) -> None:
    import socket
    from datetime import timedelta

    from django.utils import timezone

    from apps.datasets import jobs

    dying = export_start(version=version, fmt="sft-openai", split="all", actor=None, enqueue=False)
    ExportJob.objects.filter(pk=dying.pk).update(status="running", started_at=timezone.now(),
                                                 claims=jobs.EXPORT_MAX_CLAIMS,
                                                 worker=f"{socket.gethostname()}:{_dead_pid()}")
    elsewhere = export_start(version=version, fmt="sharegpt", split="all", actor=None, enqueue=False)
    ExportJob.objects.filter(pk=elsewhere.pk).update(status="running", started_at=timezone.now(), claims=1,
                                                     worker="another-machine:4242")
    assert jobs.reap_exports() == {"requeued": 0, "failed": 1, "dispatched": 0}
    dying.refresh_from_db()
    assert dying.status == "failed" and f"gave up after {jobs.EXPORT_MAX_CLAIMS} runs" in dying.error
    assert ExportJob.objects.get(pk=elsewhere.pk).status == "running"  # another host's, within the job timeout

    ExportJob.objects.filter(pk=elsewhere.pk).update(started_at=timezone.now() - timedelta(days=1))
    assert jobs.reap_exports()["requeued"] == 1  # past django-q2's timeout, from any host
    assert ExportJob.objects.get(pk=elsewhere.pk).status == "queued"


def test_the_reaper_dispatches_a_queued_export_whose_message_was_lost(
        version: Any, django_capture_on_commit_callbacks: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone
    from django_q.models import OrmQ

    from apps.datasets import jobs

    lost = export_start(version=version, fmt="sft-openai", split="all", actor=None, enqueue=False)
    fresh = export_start(version=version, fmt="sharegpt", split="all", actor=None, enqueue=False)
    ExportJob.objects.filter(pk=lost.pk).update(created_at=timezone.now() - timedelta(seconds=jobs.EXPORT_STALE_S + 5))
    assert jobs.reap_exports() == {"requeued": 0, "failed": 0, "dispatched": 1}
    [message] = OrmQ.objects.all()
    assert message.task["args"] == (lost.pk,)
    assert run_export(lost.pk)["status"] == "done" and ExportJob.objects.get(pk=fresh.pk).status == "queued"


def test_migrate_registers_the_export_reaper() -> None:
    from django_q.models import Schedule

    from apps.datasets import jobs

    assert Schedule.objects.filter(name=jobs.REAP_SCHEDULE_NAME, func=jobs.REAP_FUNC).exists()


def test_an_empty_split_is_refused_by_name_before_any_job(make_task: Any, approver: Any) -> None:
    empty = published_version(make_task, approver, "no-validation", 2, validation_fraction=0.0)
    assert empty.counts["validation"] == 0
    with pytest.raises(ExportError, match="the validation split of this version has no member") as refused:
        export_start(version=empty, fmt="sft-trl", split="validation", actor=None, enqueue=False)
    assert refused.value.field == "split"  # the API answers it under error.details.fields.split
    assert not ExportJob.objects.filter(version=empty).exists()
