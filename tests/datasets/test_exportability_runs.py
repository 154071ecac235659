"""Exportability measured by its own job (issue 41): a version is written, readable, with its
measurement queued in the same transaction; exports and publishing are refused by name meanwhile
(service, console, API, command); the job claims once, saves its tallies after each chunk and a
lost worker's run resumes after its last finished chunk with the card a single run writes, which
is what the measurement made in version creation wrote (the oracle below)."""
from __future__ import annotations

from collections import Counter
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from apps.datasets import exportability, jobs, services
from apps.datasets.management.commands.dataset_create import Command
from apps.datasets.exporters import FORMATS, export_records, load_records
from apps.datasets.exporters.roles import flatten
from apps.datasets.models import DatasetVersion, ExportabilityRun, ExportJob
from apps.datasets.services import ExportabilityPending, dataset_version_create
from tests.datasets.version_data import export_dir, mixed_code_spec, run_build  # noqa: F401 (export_dir: fixture)
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db

MEASURING = r"this version's exportability is still being measured \(0 of 13 members\); "


def _oracle(members: list[tuple[int, int, str]], scenes: set[str], chunk_size: int) -> dict[str, Any]:
    """exportability.measure as version creation ran it before it became a job (one pass, no state)."""
    scenes_ = sorted(scenes)
    applicable = [f for f in sorted(FORMATS) if not exportability.not_applicable_reason(f, scenes_)]
    formats = {f: {"lines": {"all": 0, "train": 0, "validation": 0}, "excluded": 0, "reasons": Counter(),
                   "by_scene": {}} for f in applicable}
    variants = exportability.ROLE_VARIANTS if "multi_agent" in scenes_ else ()
    roles = {v: {f: 0 for f in applicable if not exportability._whole_episode(f)} for v in variants}
    tool = {f: 0 for f in applicable if "tool" in FORMATS[f].final_answers}
    for split in ("train", "validation"):
        for chunk in exportability._chunks([(t, task) for t, task, s in members if s == split], chunk_size):
            records = list(load_records(chunk))
            scene_of = {}
            for r in records:
                scene_of[r["trajectory_id"]] = r["task"]["scene"]
                scene_of.update((c["trajectory_id"], r["task"]["scene"]) for c in flatten(r.get("subtrajectories") or []))
            for fmt in applicable:
                result = export_records(fmt, iter(records), exportability._Discard(), dry_run=True,
                                        options={"split": split})
                tally = formats[fmt]
                tally["lines"][split] += result.lines
                tally["lines"]["all"] += result.lines
                tally["excluded"] += len(result.excluded)
                if result.stale_prompts:
                    tally["stale_prompts"] = tally.get("stale_prompts", 0) + len(result.stale_prompts)
                for e in result.excluded:
                    kind = exportability.reason_kind(e["reason"])
                    tally["reasons"][kind] += 1
                    tally["by_scene"].setdefault(scene_of.get(e["trajectory_id"], ""), Counter())[kind] += 1
                if fmt in tool:
                    tool[fmt] += export_records(fmt, iter(records), exportability._Discard(), dry_run=True,
                                                options={"split": split, "final_answer": "tool"}).lines
                for variant in variants:
                    if fmt in roles[variant]:
                        roles[variant][fmt] += export_records(fmt, iter(records), exportability._Discard(),
                                                              dry_run=True, options={"split": split,
                                                                                     "roles": variant}).lines
    for tally in formats.values():
        tally["reasons"] = dict(tally["reasons"].most_common(exportability.MAX_REASONS))
        tally["by_scene"] = {s: {"excluded": sum(c.values()), "reasons": dict(c.most_common(exportability.MAX_REASONS))}
                             for s, c in sorted(tally["by_scene"].items())}
    out = {"options": {"roles": "trainable", "images": "files", "final_answer": "text"}, "formats": formats,
           "not_applicable": {f: exportability.not_applicable_reason(f, scenes_) for f in sorted(FORMATS)
                              if f not in formats},
           "final_answer": {"tool": tool}}
    if variants:
        out["roles"] = roles
    return out


@pytest.fixture
def enqueued(monkeypatch: Any) -> list[int]:
    sent: list[int] = []
    monkeypatch.setattr(services, "_enqueue_exportability", sent.append)
    return sent


@pytest.fixture
def small_chunks(settings: Any) -> int:
    settings.DATASET_EXPORT_CHUNK = 2  # 8 tasks, 13 members: 6 chunks or more, cut at task boundaries
    return 2


@pytest.fixture
def spec(make_task: Any) -> dict[str, Any]:
    """13 members, 8 tasks: rl-verl excludes the unverified ones with reasons, so the tallies carry
    counters across chunks."""
    return mixed_code_spec(make_task)


@pytest.fixture
def queued(spec: Any, approver: Any, enqueued: list[int], django_capture_on_commit_callbacks: Any) -> Any:
    """A version built as the workers build it: written, its exportability queued for them."""
    with django_capture_on_commit_callbacks(execute=True):
        version = dataset_version_create(dataset_name="measured", actor=approver, filter_spec=spec,
                                         wait_exportability=False)
    return version


def _members(version: DatasetVersion) -> tuple[list[tuple[int, int, str]], set[str]]:
    rows = version.members.order_by("position").values_list("trajectory_id", "trajectory__task_id", "split",
                                                            "trajectory__task__scene")
    return [r[:3] for r in rows], {r[3] for r in rows}


def test_the_version_is_written_and_readable_while_its_exportability_is_queued(queued: Any, enqueued: list[int],
                                                                               approver: Any, client: Any) -> None:
    run = ExportabilityRun.objects.get(version=queued)
    assert (run.status, run.done, run.total, enqueued) == ("queued", 0, 13, [run.pk])
    assert queued.counts["members"] == 13 and queued.members.count() == 13
    assert "exportability" not in queued.data_card and queued.data_card["by_scene"] == {"code_exec": 13}
    event = AuditEvent.objects.get(action="datasets.exportability_queue")
    assert (event.target_id, event.data["members"], event.data["on"]) == (str(run.pk), 13, "workers")
    client.force_login(approver)
    page = client.get(reverse("datasets:version_detail", args=["measured", 1])).content.decode()
    assert "measuring exportability: <span data-done>0</span> of <span data-total>13</span> members" in page
    assert 'id="export-form"' not in page and "Publish (it can never change" not in page
    assert 'id="exportability"' not in page  # no per-format table yet


def test_a_build_on_the_workers_is_done_when_the_version_is_written(spec: Any, approver: Any, enqueued: list[int],
                                                                    django_capture_on_commit_callbacks: Any) -> None:
    build = services.version_build_start(dataset_name="built", filter_spec=spec, actor=approver)
    with django_capture_on_commit_callbacks(execute=True):
        version = run_build(build.pk)
    build.refresh_from_db()
    run = ExportabilityRun.objects.get(version=version)
    assert (build.status, build.version, run.status, enqueued) == ("done", version, "queued", [run.pk])
    assert "exportability" not in version.data_card


def test_exports_and_publishing_are_refused_by_name_while_measuring(queued: Any, approver: Any, client: Any) -> None:
    with pytest.raises(ExportabilityPending, match=MEASURING + "exports open when it is done$"):
        services.export_start(version=queued, fmt="sft-openai", actor=approver, enqueue=False)
    with pytest.raises(ExportabilityPending, match=MEASURING):
        services.check_exportable(queued, "raw", "all")
    with pytest.raises(ExportabilityPending, match=MEASURING + r"it can be published when it is done"):
        services.dataset_version_publish(version=queued, actor=approver)
    client.force_login(approver)
    url = reverse("datasets:version_detail", args=["measured", 1])
    page = client.post(reverse("datasets:version_export", args=["measured", 1]),
                       {"format": "sft-openai", "split": "all"}, follow=True).content.decode()
    assert "still being measured (0 of 13 members); exports open when it is done" in page
    page = client.post(reverse("datasets:version_publish", args=["measured", 1]), follow=True)
    assert page.redirect_chain[-1][0] == url
    assert "still being measured (0 of 13 members); it can be published" in page.content.decode()
    api = client.post("/api/v1/datasets/measured/versions/1/exports", {"format": "sft-openai"},
                      content_type="application/json")
    assert api.status_code == 400
    assert "still being measured (0 of 13 members)" in api.json()["error"]["message"]
    api = client.post("/api/v1/datasets/measured/versions/1/publish")
    assert api.status_code == 400 and "it can be published when it is done" in api.json()["error"]["message"]
    detail = client.get("/api/v1/datasets/measured/versions/1").json()
    assert detail["exportability"] == {"status": "queued", "done": 0, "total": 13, "error": ""}
    assert detail["export_formats"] == [] and detail["status"] == "draft"
    assert not ExportJob.objects.exists()
    assert DatasetVersion.objects.get(pk=queued.pk).status == "draft"
    call_command("dataset_stats", "measured", "--version", "1", stdout=(out := StringIO()))
    assert "still being measured (0 of 13 members)" in out.getvalue()


def test_once_measured_the_card_equals_the_oracle_and_exports_open(queued: Any, approver: Any, client: Any) -> None:
    result = jobs.run_exportability(ExportabilityRun.objects.get(version=queued).pk)
    assert result["status"] == "done" and result["version"] == queued.pk
    queued.refresh_from_db()
    members, scenes = _members(queued)
    assert queued.data_card["exportability"] == _oracle(members, scenes, 2000)
    run = ExportabilityRun.objects.get(version=queued)
    assert (run.status, run.done, run.tallies, run.claims) == ("done", 13, "", 1)
    assert AuditEvent.objects.filter(action="datasets.exportability_finish", target_id=str(run.pk)).count() == 1
    job = services.export_start(version=queued, fmt="sft-openai", actor=approver, enqueue=False)
    assert jobs.export_run(job.pk).lines == 13
    client.force_login(approver)
    page = client.get(reverse("datasets:version_detail", args=["measured", 1])).content.decode()
    assert 'id="export-form"' in page and 'id="exportability-state"' not in page
    assert client.get("/api/v1/datasets/measured/versions/1").json()["exportability"]["status"] == "done"
    assert services.dataset_version_publish(version=queued, actor=approver).is_published


def test_a_second_delivery_measures_nothing(queued: Any, monkeypatch: Any) -> None:
    run = ExportabilityRun.objects.get(version=queued)
    chunks: list[str] = []
    real = exportability._add_chunk
    monkeypatch.setattr(exportability, "_add_chunk", lambda t, split, records: (chunks.append(split), real(t, split, records)))
    assert jobs.run_exportability(run.pk)["status"] == "done"
    measured = len(chunks)
    assert jobs.run_exportability(run.pk) == {"run": run.pk, "skipped": "already claimed or taken over"}
    assert len(chunks) == measured and ExportabilityRun.objects.get(pk=run.pk).claims == 1


class _Killed(BaseException):
    """The worker's process dying mid-chunk (nothing after it runs: not an Exception the job catches)."""


def test_a_lost_worker_s_run_resumes_after_its_last_finished_chunk(queued: Any, small_chunks: int, monkeypatch: Any,
                                                                   enqueued: list[int], settings: Any,
                                                                   django_capture_on_commit_callbacks: Any) -> None:
    run = ExportabilityRun.objects.get(version=queued)
    members, scenes = _members(queued)
    plan = exportability.plan(members, small_chunks)
    assert len(plan) >= 6
    real = exportability._add_chunk
    measured: list[list[int]] = []

    def dies_at_the_fourth(tallies: dict[str, Any], split: str, records: list[dict[str, Any]]) -> None:
        if len(measured) == 3:
            raise _Killed
        measured.append([r["trajectory_id"] for r in records])
        real(tallies, split, records)

    monkeypatch.setattr(exportability, "_add_chunk", dies_at_the_fourth)
    with pytest.raises(_Killed):
        jobs.run_exportability(run.pk)
    run.refresh_from_db()
    assert (run.status, run.chunks_done, run.done) == ("running", 3, sum(len(ids) for _, ids in plan[:3]))
    assert "exportability" not in DatasetVersion.objects.get(pk=queued.pk).data_card
    # The reaper finds it past the job timeout and puts it back in the queue.
    ExportabilityRun.objects.filter(pk=run.pk).update(
        started_at=timezone.now() - timezone.timedelta(seconds=settings.Q_CLUSTER["timeout"] + 60))
    enqueued.clear()
    with django_capture_on_commit_callbacks(execute=True):
        report = jobs.reap_exports()
    assert report["exportability_requeued"] == 1 and enqueued == [run.pk]
    monkeypatch.setattr(exportability, "_add_chunk", lambda t, split, records: (
        measured.append([r["trajectory_id"] for r in records]), real(t, split, records)))
    assert jobs.run_exportability(run.pk)["status"] == "done"
    assert measured == [ids for _, ids in plan]  # each chunk measured once, in order
    card = DatasetVersion.objects.get(pk=queued.pk).data_card["exportability"]
    assert card == exportability.measure(members, scenes, chunk_size=small_chunks) == _oracle(members, scenes, 2)
    assert ExportabilityRun.objects.get(pk=run.pk).claims == 2
    requeue = AuditEvent.objects.get(action="datasets.exportability_requeue")
    assert (requeue.data["outcome"], requeue.data["chunks_done"]) == ("requeued", 3)


def test_a_run_taken_over_by_another_worker_writes_nothing(queued: Any, monkeypatch: Any) -> None:
    run = ExportabilityRun.objects.get(version=queued)
    real = services.exportability_progress

    def reaped_meanwhile(**kwargs: Any) -> bool:
        ExportabilityRun.objects.filter(pk=run.pk).update(worker="elsewhere:1")
        return real(**kwargs)

    monkeypatch.setattr(services, "exportability_progress", reaped_meanwhile)
    assert jobs.run_exportability(run.pk) == {"run": run.pk, "skipped": "already claimed or taken over"}
    assert "exportability" not in DatasetVersion.objects.get(pk=queued.pk).data_card


def test_a_failed_measurement_ends_readable_and_keeps_refusing(queued: Any, approver: Any, monkeypatch: Any) -> None:
    def broken(ids: Any) -> Any:
        raise RuntimeError("the trajectory store went away")

    monkeypatch.setattr(exportability, "load_records", broken)
    run = ExportabilityRun.objects.get(version=queued)
    result = jobs.run_exportability(run.pk)
    assert (result["status"], result["error"]) == ("failed", "RuntimeError: the trajectory store went away")
    with pytest.raises(ExportabilityPending, match=r"measurement failed \(RuntimeError: the trajectory store went "
                                                   r"away\); exporting needs its counts: build the version again"):
        services.export_start(version=queued, fmt="raw", actor=approver, enqueue=False)
    with pytest.raises(ExportabilityPending, match="publishing needs its counts"):
        services.dataset_version_publish(version=queued, actor=approver)
    assert AuditEvent.objects.filter(action="datasets.exportability_fail", target_id=str(run.pk)).exists()


def test_the_reaper_dispatches_a_stale_queued_run_and_fails_one_lost_too_often(
        queued: Any, enqueued: list[int], settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    run = ExportabilityRun.objects.get(version=queued)
    ExportabilityRun.objects.filter(pk=run.pk).update(created_at=timezone.now() - timezone.timedelta(hours=1))
    enqueued.clear()
    assert jobs.reap_exports()["exportability_dispatched"] == 1 and enqueued == [run.pk]
    ExportabilityRun.objects.filter(pk=run.pk).update(
        status="running", worker="gone:1", claims=services.EXPORTABILITY_MAX_CLAIMS,
        started_at=timezone.now() - timezone.timedelta(seconds=settings.Q_CLUSTER["timeout"] + 60))
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs.reap_exports()["exportability_failed"] == 1
    run.refresh_from_db()
    assert run.status == "failed" and "past the job timeout; gave up after 5 runs" in run.error


def test_the_command_measures_in_process_with_progress(spec: Any, enqueued: list[int]) -> None:
    out, err = StringIO(), StringIO()
    call_command("dataset_create", "cli", "--no-near-dedup", "--publish", stdout=out, stderr=err)
    version = DatasetVersion.objects.get(dataset__name="cli")
    assert version.is_published and version.data_card["exportability"]["formats"]["sft-openai"]["lines"]["all"] == 13
    assert "exportability [" in err.getvalue() and "13/13 100%" in err.getvalue()
    assert ExportabilityRun.objects.get(version=version).status == "done" and enqueued == []
    event = AuditEvent.objects.get(action="datasets.exportability_queue")
    assert event.data["on"] == "in-process"


def test_the_command_leaves_it_to_the_workers_with_no_wait(spec: Any, enqueued: list[int],
                                                           django_capture_on_commit_callbacks: Any) -> None:
    out = StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("dataset_create", "cli", "--no-near-dedup", "--no-wait", "--no-progress", stdout=out)
    run = ExportabilityRun.objects.get(version__dataset__name="cli")
    assert run.status == "queued" and enqueued == [run.pk]
    assert "exportability: queued for the workers (13 members)" in out.getvalue()
    with pytest.raises(CommandError, match="--publish needs the exportability counts"):
        call_command("dataset_create", "cli2", "--no-near-dedup", "--no-wait", "--publish")
    assert not DatasetVersion.objects.filter(dataset__name="cli2").exists()
    help_text = Command().create_parser("manage.py", "dataset_create").format_help()
    assert "--no-wait" in help_text and "resumes it from its last finished chunk" in help_text
