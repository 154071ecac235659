"""dataset_create, dataset_export, dataset_stats, dataset_compare and show_trajectory."""
from __future__ import annotations

import hashlib
import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from apps.datasets import exporters
from apps.datasets.models import DatasetVersion, ExportJob
from tests.datasets.version_data import export_dir, loader_failing_on_call, make_trajectory  # noqa: F401

pytestmark = pytest.mark.django_db


def run(*args: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def trajectories(make_task: Any) -> list[Any]:
    out = []
    for i in range(4):
        task = make_task(prompt=f"Task {i}: print {i}.")
        out.append(make_trajectory(task, code=f"print({i})", score=50 + 10 * i, model="m1" if i % 2 else "m2"))
        out.append(make_trajectory(task, code=f"print({i}) # bad", outcome="failure", reward=0.0, score=20))
    return out


def test_dataset_create_builds_and_publishes_a_version_from_flags(trajectories: Any) -> None:
    out, err = run("dataset_create", "demo", "--success-only", "--min-score", "60", "--no-near-dedup",
                   "--validation-fraction", "0", "--publish", "--notes", "first cut")
    v = DatasetVersion.objects.get(dataset__name="demo", number=1)
    assert v.status == "published" and v.notes == "first cut"
    assert v.filter_spec["success_only"] is True and v.filter_spec["min_score"] == 60.0
    assert v.counts["members"] == 3  # scores 60, 70, 80 succeed; 50 is below, failures excluded
    assert "demo v1 (published): 3 trajectories from 3 tasks (train 3, validation 0)" in out
    assert "100%" in err  # the progress bar ran to the end

    run("dataset_create", "demo", "--no-near-dedup", "--model", "m1")
    v2 = DatasetVersion.objects.get(dataset__name="demo", number=2)
    assert v2.parent == v and v2.filter_spec["models"] == ["m1"]


def test_dataset_create_takes_a_json_filter_and_reports_bad_input(trajectories: Any, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"scenes": ["code_exec"], "dedup": {"near": False}}))
    run("dataset_create", "fromfile", "--filter", f"@{spec}")
    assert DatasetVersion.objects.get(dataset__name="fromfile").counts["members"] == 8
    with pytest.raises(CommandError, match="min_score: must be between 0 and 100"):
        run("dataset_create", "bad", "--min-score", "300")
    with pytest.raises(CommandError, match="not valid JSON"):
        run("dataset_create", "bad", "--filter", "{nope")
    with pytest.raises(CommandError, match="scenes: unknown scene"):
        run("dataset_create", "bad", "--scene", "chess")
    with pytest.raises(CommandError, match="no user named"):
        run("dataset_create", "bad", "--user", "ghost")
    with pytest.raises(CommandError, match="has no version 9"):
        run("dataset_create", "fromfile", "--parent", "9")
    assert not DatasetVersion.objects.filter(dataset__name="bad").exists()


def test_dataset_create_as_a_user_without_the_role_fails(trajectories: Any, reviewer: Any) -> None:
    with pytest.raises(CommandError, match="approver"):
        run("dataset_create", "demo", "--no-near-dedup", "--user", reviewer.username)


def test_dataset_export_writes_refuses_to_overwrite_and_forces(trajectories: Any, tmp_path: Path) -> None:
    run("dataset_create", "demo", "--no-near-dedup")
    out_path = tmp_path / "demo.jsonl"
    out, _ = run("dataset_export", "demo", "--version", "1", "--format", "sft-openai", "--out", str(out_path))
    sha = hashlib.sha256(out_path.read_bytes()).hexdigest()
    assert f"sha256 {sha}" in out and f"{len(out_path.read_text().splitlines())} lines" in out
    with pytest.raises(CommandError, match="already exists; pass --force"):
        run("dataset_export", "demo", "--version", "1", "--format", "sft-openai", "--out", str(out_path))
    out_path.write_text("tampered")
    run("dataset_export", "demo", "--version", "1", "--format", "sft-openai", "--out", str(out_path), "--force")
    assert hashlib.sha256(out_path.read_bytes()).hexdigest() == sha  # re-export: the same bytes
    with pytest.raises(CommandError, match="unknown format"):
        run("dataset_export", "demo", "--format", "csv", "--out", str(tmp_path / "x.jsonl"))
    with pytest.raises(CommandError, match="no dataset named"):
        run("dataset_export", "nope", "--format", "raw", "--out", str(tmp_path / "x.jsonl"))
    with pytest.raises(CommandError, match="does not exist"):
        run("dataset_export", "demo", "--format", "raw", "--out", str(tmp_path / "missing-dir" / "x.jsonl"))


def test_dataset_export_resumes_after_a_crash(trajectories: Any, tmp_path: Path, settings: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    settings.DATASET_EXPORT_CHUNK = 2
    run("dataset_create", "demo", "--no-near-dedup")
    real_load = exporters.load_records
    monkeypatch.setattr(exporters, "load_records", loader_failing_on_call(3, OSError("disk unplugged")))
    out_path = tmp_path / "demo.jsonl"
    with pytest.raises(CommandError, match="export failed: OSError: disk unplugged"):
        run("dataset_export", "demo", "--format", "raw", "--out", str(out_path))
    assert not out_path.exists()
    monkeypatch.setattr(exporters, "load_records", real_load)
    out, _ = run("dataset_export", "demo", "--format", "raw", "--out", str(out_path))
    assert "2 chunk(s) resumed" in out
    run("dataset_export", "demo", "--format", "raw", "--out", str(tmp_path / "clean.jsonl"))
    assert out_path.read_bytes() == (tmp_path / "clean.jsonl").read_bytes()


def test_dataset_stats_and_compare_print_the_card_and_the_overlap(trajectories: Any, tmp_path: Path) -> None:
    run("dataset_create", "demo", "--no-near-dedup")
    run("dataset_create", "demo", "--no-near-dedup", "--success-only")
    run("dataset_export", "demo", "--version", "1", "--format", "sft-trl", "--out", str(tmp_path / "a.jsonl"))
    job = ExportJob.objects.get()
    out, _ = run("dataset_stats", "demo", "--version", "1")
    assert "demo v1 — draft" in out and "members 8" in out and f"sha256 {job.sha256}" in out
    assert "score histogram" in out and "turns" in out
    data = json.loads(run("dataset_stats", "demo", "--version", "2", "--json")[0])
    assert data["counts"]["members"] == 4 and data["exports"] == [] and len(data["excluded"]) == 4
    out, _ = run("dataset_compare", "demo", "1", "2")
    assert "overlap: 4 trajectories in both, 4 only in v1, 0 only in v2" in out
    assert "success_only: False -> True" in out
    with pytest.raises(CommandError, match="has no version 7"):
        run("dataset_compare", "demo", "1", "7")


def test_show_trajectory_prints_the_steps(trajectories: Any) -> None:
    t = trajectories[0]
    out, _ = run("show_trajectory", str(t.pk))
    assert f"trajectory #{t.pk}" in out and "latest automatic review score: 50" in out
    assert "step 1" in out and "write_file(" in out and "result: wrote main.py" in out
    assert "finish(" in out
    with pytest.raises(CommandError, match="no trajectory #999999"):
        run("show_trajectory", "999999")
