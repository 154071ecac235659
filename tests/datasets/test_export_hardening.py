"""Exports next to a user's path never write through a link planted there (issue 36, item 3):
`<out>.tmp`, the chunk files in `<out>.parts/`, `<out>.parts` itself and the vision image folder."""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.datasets import exporters
from apps.datasets.models import ExportJob
from tests.datasets.test_export_jobs import published_version, run_export_job
from tests.datasets.version_data import loader_failing_on_call
from tests.test_images import artifact_store, png_bytes  # noqa: F401 (artifact_store is a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def version(make_task: Any, approver: Any) -> Any:
    return published_version(make_task, approver, "hardening", 3)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim" / "authorized_keys"
    path.parent.mkdir()
    path.write_text("ssh-ed25519 AAAA precious\n")
    return path


def _run(version: Any, out: Path, **kw: Any) -> ExportJob:
    return run_export_job(version, "sft-openai", out_path=out, **kw)


def test_dataset_export_replaces_a_link_planted_at_out_tmp_and_leaves_its_target(
        version: Any, tmp_path: Path, victim: Path) -> None:
    out = tmp_path / "train.jsonl"
    os.symlink(victim, tmp_path / "train.jsonl.tmp")
    call_command("dataset_export", "hardening", "--format", "sft-openai", "--out", str(out), "--no-progress",
                 stdout=io.StringIO(), stderr=io.StringIO())
    assert victim.read_text() == "ssh-ed25519 AAAA precious\n"
    assert out.is_file() and not out.is_symlink() and len(out.read_text().splitlines()) == 3
    assert not os.path.lexists(tmp_path / "train.jsonl.tmp")


def test_a_resumed_export_replaces_links_planted_at_its_chunk_paths(
        version: Any, tmp_path: Path, victim: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.DATASET_EXPORT_CHUNK = 1  # 3 members -> 3 chunks
    reference = _run(version, tmp_path / "reference.jsonl")
    real_load = exporters.load_records
    monkeypatch.setattr(exporters, "load_records", loader_failing_on_call(2, RuntimeError("worker lost")))
    out = tmp_path / "train.jsonl"
    assert _run(version, out).status == "failed"
    parts = tmp_path / "train.jsonl.parts"
    for name in ("000001.jsonl.tmp", "000001.json.tmp", "000002.jsonl.tmp"):
        (parts / name).unlink(missing_ok=True)
        os.symlink(victim, parts / name)
    monkeypatch.setattr(exporters, "load_records", real_load)
    resumed = _run(version, out)
    assert resumed.status == "done", resumed.error
    assert resumed.sha256 == reference.sha256 and victim.read_text() == "ssh-ed25519 AAAA precious\n"


def test_an_export_refuses_a_parts_folder_that_is_a_link_and_writes_nothing(
        version: Any, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "train.jsonl"
    os.symlink(elsewhere, tmp_path / "train.jsonl.parts")
    job = _run(version, out)
    assert job.status == "failed" and "train.jsonl.parts is a symbolic link" in job.error
    assert list(elsewhere.iterdir()) == [] and not out.exists() and not os.path.lexists(f"{out}.tmp")


def test_the_image_folder_next_to_a_vision_export_may_not_be_a_link(tmp_path: Path, artifact_store: Path) -> None:
    from apps.datasets.exporters.vision import ImageSink
    from trajplatform import artifacts
    from trajplatform.safefiles import UnsafePathError

    ref = artifacts.store(png_bytes(8, 8), "image/png", width=8, height=8)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "train_images")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        ImageSink({"images": "files", "image_dir": str(tmp_path / "train_images")})(ref["artifact"])
    assert list(elsewhere.iterdir()) == []
    sink = ImageSink({"images": "files", "image_dir": str(tmp_path / "real_images")})
    assert sink(ref["artifact"]) == f"real_images/{ref['artifact']}.png"
    assert (tmp_path / "real_images" / f"{ref['artifact']}.png").read_bytes() == artifacts.read(ref["artifact"])


def test_dataset_export_without_force_still_refuses_an_existing_file(version: Any, tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    out.write_text("mine\n")
    with pytest.raises(CommandError, match="already exists"):
        call_command("dataset_export", "hardening", "--format", "sft-openai", "--out", str(out), "--no-progress",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert out.read_text() == "mine\n"


def test_a_link_planted_at_out_is_refused_and_with_force_replaced_never_followed(
        version: Any, tmp_path: Path, victim: Path) -> None:
    out = tmp_path / "train.jsonl"
    os.symlink(tmp_path / "nowhere.jsonl", out)  # dangling: out "does not exist", yet something is there
    with pytest.raises(CommandError, match="already exists"):
        call_command("dataset_export", "hardening", "--format", "sft-openai", "--out", str(out), "--no-progress",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert not (tmp_path / "nowhere.jsonl").exists()
    out.unlink()
    os.symlink(victim, out)
    call_command("dataset_export", "hardening", "--format", "sft-openai", "--out", str(out), "--force",
                 "--no-progress", stdout=io.StringIO(), stderr=io.StringIO())
    assert victim.read_text() == "ssh-ed25519 AAAA precious\n"
    assert not out.is_symlink() and len(out.read_text().splitlines()) == 3
    assert ExportJob.objects.get().path == str(out)
