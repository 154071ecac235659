"""import_trajectories: raw exports read back, all or nothing, with per-line errors."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import CommandError, call_command

from apps.datasets.exporters import export_records, load_records
from apps.datasets.raw_import import RawImportError, trajectories_import
from apps.reviews.models import Review
from apps.tasks.models import Batch, Task, Trajectory
from tests.datasets.exporter_data import failing_episode, make_review, make_trajectory
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db


def raw_export(ids: list[int]) -> bytes:
    buf = io.BytesIO()
    result = export_records("raw", load_records(ids), buf)
    assert result.excluded == []
    return buf.getvalue()


@pytest.fixture
def exported(make_task: Any, reviewer: Any, tmp_path: Path) -> tuple[list[int], Path]:
    verifier = {"command": "python3 -m pytest -q", "files": {"test_p.py": "def test(): pass\n"}}
    first_batch, other_batch = Batch.objects.create(name="fixture batch"), Batch.objects.create(name="second batch")
    t1 = make_task(prompt="Écris primes.py ✓", batch=first_batch, external_id="primes",
                   scene_config={"verifier": verifier})
    t2 = make_task(prompt="Sort the CSV", batch=other_batch, external_id="csv", temperature=0.2, max_steps=9)
    ids = []
    for task in (t1, t2):
        good = make_trajectory(task, started_at="2026-11-20T10:00:00+00:00", finished_at="2026-11-20T10:01:00+00:00")
        bad = make_trajectory(task, episode=failing_episode, sample_index=1, outcome="failure", reward=0.25,
                              cost_usd="0.001250")
        make_review(good, overall=87.5)
        make_review(bad, kind="human", verdict="reject", reviewer=reviewer)
        ids += [good.pk, bad.pk]
    path = tmp_path / "export.jsonl"
    path.write_bytes(raw_export(ids))
    return ids, path


def _free_source_names() -> None:
    """Rename the exported batches, so importing under the source batch names is allowed."""
    for batch in Batch.objects.all():
        batch.name = f"{batch.name} (before import)"
        batch.save(update_fields=["name"])


def test_source_batch_names_that_exist_are_refused_and_nothing_is_written(exported: tuple[list[int], Path]) -> None:
    _, path = exported
    counts = (Batch.objects.count(), Task.objects.count(), Trajectory.objects.count())
    with pytest.raises(RawImportError) as refused:
        trajectories_import(path_or_file=path, actor=None)
    assert refused.value.errors == [f"batch {n!r} already exists; give the import a new batch name"
                                    for n in ("fixture batch", "second batch")]
    assert refused.value.field == "batch"  # the API answers it under its batch field, the command names --batch
    assert (Batch.objects.count(), Task.objects.count(), Trajectory.objects.count()) == counts


def _without_ids(data: bytes) -> list[dict[str, Any]]:
    records = []
    for line in data.splitlines():
        record = orjson.loads(line)
        del record["trajectory_id"], record["task_id"]
        records.append(record)
    return records


def test_round_trip_export_import_export_is_identical(exported: tuple[list[int], Path], admin_user_role: Any) -> None:
    ids, path = exported
    before = set(Trajectory.objects.values_list("pk", flat=True))
    _free_source_names()
    result = trajectories_import(path_or_file=path, actor=admin_user_role)
    assert (result.trajectory_count, result.task_count, result.review_count, result.rehashed) == (4, 2, 4, 0)
    assert sorted(b.name for b in result.batches) == ["fixture batch", "second batch"]
    new_ids = list(Trajectory.objects.exclude(pk__in=before).order_by("pk").values_list("pk", flat=True))
    again = raw_export(new_ids)
    original = path.read_bytes()
    assert _without_ids(again) == _without_ids(original)
    # Renumbering the ids is the only difference, byte for byte.
    renumbered = again
    for old, new in sorted(zip(ids, new_ids), reverse=True):
        renumbered = renumbered.replace(f'"trajectory_id":{new},'.encode(), f'"trajectory_id":{old},'.encode())
    old_tasks = [orjson.loads(l)["task_id"] for l in original.splitlines()]
    new_tasks = [orjson.loads(l)["task_id"] for l in again.splitlines()]
    for old, new in set(zip(old_tasks, new_tasks)):
        renumbered = renumbered.replace(f'"task_id":{new},'.encode(), f'"task_id":{old},'.encode())
    assert renumbered == original
    imported = Trajectory.objects.get(pk=new_ids[0])
    assert imported.content_sha256 == Trajectory.objects.get(pk=ids[0]).content_sha256
    assert imported.task.status == Task.Status.COMPLETED and imported.task.current_iteration == 1
    event = AuditEvent.objects.get(action="datasets.trajectories_import")
    assert event.actor == admin_user_role and event.data["trajectories"] == 4 and event.data["reviews"] == 4


def test_a_batch_name_taken_by_a_concurrent_import_is_refused_not_an_integrity_error(
    exported: tuple[list[int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another import creates "restored" after this one checked the names: the unique name makes
    this one fail cleanly (batch_create), writing nothing."""
    from apps.datasets import raw_import

    _, path = exported
    result_class = raw_import.RawImportResult

    def names_checked_then_a_concurrent_import_commits(*args: Any, **kwargs: Any) -> Any:
        Batch.objects.create(name="restored")
        return result_class(*args, **kwargs)

    monkeypatch.setattr(raw_import, "RawImportResult", names_checked_then_a_concurrent_import_commits)
    counts = (Task.objects.count(), Trajectory.objects.count())
    with pytest.raises(RawImportError) as refused:
        trajectories_import(path_or_file=path, actor=None, batch_name="restored")
    assert refused.value.errors == ["batch 'restored' already exists; give the import a new batch name"]
    assert refused.value.field == "batch"
    assert (Task.objects.count(), Trajectory.objects.count()) == counts


def test_batch_name_puts_everything_in_one_batch(exported: tuple[list[int], Path]) -> None:
    _, path = exported
    result = trajectories_import(path_or_file=str(path), actor=None, batch_name="restored")
    assert [b.name for b in result.batches] == ["restored"] and result.batches[0].task_count == 2
    assert result.batches[0].source_format == "raw"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _write(path: Path, records: list[Any]) -> None:
    path.write_bytes(b"".join(r if isinstance(r, bytes) else orjson.dumps(r) + b"\n" for r in records))


def test_bad_lines_are_all_reported_and_nothing_is_written(exported: tuple[list[int], Path]) -> None:
    _, path = exported
    records = _lines(path)
    records[0]["schema_version"] = "trajplatform.raw/0"
    records[1]["status"] = "running"
    records[1]["outcome"] = ""
    records[2]["reviews"]["human"] = {"verdict": "accept", "reviewer": "ghost", "rationale": "x"}
    records[3]["sample_index"] = 0  # the same sample as line 3 of that task
    bad = path.with_name("bad.jsonl")
    _write(bad, [*records, b"{not json\n", orjson.dumps({**records[2], "reward": "high"}) + b"\n"])
    counts = (Batch.objects.count(), Task.objects.count(), Trajectory.objects.count(), Review.objects.count())
    with pytest.raises(RawImportError) as info:
        trajectories_import(path_or_file=bad, actor=None)
    errors = info.value.errors
    assert errors[0].startswith(f"{bad}:1: ") and "schema_version" in errors[0]
    assert errors[1].startswith(f"{bad}:2: ") and "only finished or cancelled" in errors[1]
    assert errors[2].startswith(f"{bad}:3: ") and "no user named 'ghost'" in errors[2]
    assert errors[3].startswith(f"{bad}:4: ") and "already on line 3" in errors[3]
    assert errors[4].startswith(f"{bad}:5: ") and "not valid JSON" in errors[4]
    assert errors[5].startswith(f"{bad}:6: ") and "reward" in errors[5]
    assert (Batch.objects.count(), Task.objects.count(), Trajectory.objects.count(), Review.objects.count()) == counts
    assert not AuditEvent.objects.filter(action="datasets.trajectories_import").exists()


def test_conflicting_task_definitions_and_external_ids_are_refused(exported: tuple[list[int], Path]) -> None:
    _, path = exported
    records = _lines(path)
    records[1]["task"]["prompt"] = "something else"
    bad = path.with_name("bad.jsonl")
    _write(bad, records)
    with pytest.raises(RawImportError, match=r"bad.jsonl:2: task: task \d+ differs from its definition on line 1"):
        trajectories_import(path_or_file=bad, actor=None)
    records = _lines(path)
    for r in records[2:]:
        r["task"]["external_id"] = "primes"
    _write(bad, records)
    _free_source_names()
    trajectories_import(path_or_file=bad, actor=None)  # two source batches: fine
    with pytest.raises(RawImportError, match="external ids must be unique within a batch"):
        trajectories_import(path_or_file=bad, actor=None, batch_name="one")


def test_edited_content_is_hashed_again(exported: tuple[list[int], Path]) -> None:
    _, path = exported
    records = _lines(path)
    records[0]["final_answer"] = "edited"
    edited = path.with_name("edited.jsonl")
    _write(edited, records)
    _free_source_names()
    result = trajectories_import(path_or_file=edited, actor=None)
    assert result.rehashed == 1
    t = Trajectory.objects.get(final_answer="edited")
    assert t.content_sha256 == t.compute_content_sha256()


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    with pytest.raises(RawImportError, match="no trajectories"):
        trajectories_import(path_or_file=empty, actor=None)
    with pytest.raises(RawImportError, match="no such file"):
        trajectories_import(path_or_file=tmp_path / "missing.jsonl", actor=None)


def test_command_imports_and_reports_errors(exported: tuple[list[int], Path], capsys: Any) -> None:
    _, path = exported
    out = io.StringIO()
    call_command("import_trajectories", str(path), "--batch", "cmd", stdout=out)
    assert "imported 4 trajectories, 2 tasks and 4 reviews" in out.getvalue()
    bad = path.with_name("bad.jsonl")
    bad.write_bytes(path.read_bytes() + b"[1, 2]\n")
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 problem"):
        call_command("import_trajectories", str(bad), stdout=io.StringIO(), stderr=err)
    assert f"{bad}:5: " in err.getvalue()
    with pytest.raises(CommandError, match="no user named"):
        call_command("import_trajectories", str(path), "--user", "nobody-here")
