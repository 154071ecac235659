"""The mobile_agent demo as `make demo` runs it (`synthesize --wait --start-offline-model` over
examples/tasks/mobile_agent.jsonl, through the worker), and its trajectories through the aitw format
(Android in the Wild's action records) and the general formats."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from apps.datasets.exporters import FORMATS, export_records, load_records, validate_line
from apps.datasets.exporters.aitw import COMPLETE, DUAL_POINT, IMPOSSIBLE, TYPE
from apps.datasets.models import DatasetMember
from apps.tasks.models import Trajectory
from tests.datasets.test_exporters_load import hf_datasets  # noqa: F401 - a fixture
from tests.datasets.anchor_loaders import AITW_FEATURES, anchor_rows, load_aitw
from tests.engines.test_gui import artifact_root  # noqa: F401 - a fixture
from tests.tasks.test_synthesize import offline_only  # noqa: F401 - a fixture

DEMO = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "mobile_agent.jsonl"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("offline_only", "artifact_root")]


def export(fmt: str, records: list[dict[str, Any]], **options: Any) -> tuple[list[dict[str, Any]], Any]:
    out = io.BytesIO()
    result = export_records(fmt, records, out, options=options or None)
    return [json.loads(line) for line in out.getvalue().splitlines()], result


def test_the_demo_runs_through_the_worker_and_exports_as_aitw(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               hf_datasets: Any):  # noqa: F811
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")
    out = io.StringIO()
    call_command("synthesize", "--tasks", str(DEMO), "--batch", "demo-mobile", "--once", "--wait",
                 "--start-offline-model", stdout=out, stderr=out)
    trajectories = {t.task.external_id: t for t in Trajectory.objects.filter(task__batch__name="demo-mobile")
                    .select_related("task")}
    assert len(trajectories) == sum(1 for line in DEMO.read_text().splitlines() if line.strip())
    for external_id, t in trajectories.items():
        assert t.reward == (0.0 if external_id.endswith("-wrong") else 1.0), (external_id, t.outcome_reason)
        assert t.verifier_output["device"]["simulated"] is True
        assert t.artifact_uses.count() >= 2  # the screenshots are kept with the trajectory
    records = list(load_records([t.id for t in trajectories.values()]))
    lines, result = export("aitw", records, image_dir=str(tmp_path / "aitw_images"))
    assert result.excluded == [] and all(validate_line("aitw", line) == [] for line in lines)
    # Android in the Wild's rows: one per step, its eighteen features with their types, as the real rows
    real = anchor_rows("aitw_rows.json")
    assert all({k: type(v) for k, v in line.items()} == AITW_FEATURES == {k: type(v) for k, v in real[0].items()}
               for line in lines)
    episodes = load_aitw(lines, image_root=tmp_path)  # every screenshot opens, at the row's size
    assert len(episodes) == len(records) and len(lines) == sum(len(e) for e in episodes.values())
    by_goal: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_goal.setdefault(line["goal_info"], []).append(line)
    wifi = sorted(by_goal["Turn off Wi-Fi."], key=lambda r: r["step_id"])
    tap, done = wifi
    assert tap["results/action_type"] == DUAL_POINT and tap["results/yx_touch"] == tap["results/yx_lift"]
    assert tap["results/yx_touch"] == [round(236 / 1280, 4), round(626 / 720, 4)]
    assert (tap["image/width"], tap["image/height"], tap["episode_length"]) == (720, 1280, 2)
    initial = trajectories["mobile-wifi-off"].verifier_output["initial_screenshot"]["artifact"]
    assert tap["image/encoded"] == f"aitw_images/{initial}" and (tmp_path / "aitw_images" / f"{initial}.png").is_file()
    assert done["results/action_type"] == COMPLETE and done["image/encoded"] != tap["image/encoded"]
    assert done["results/yx_touch"] == [-1.0, -1.0] and tap["device_type"] == "SIMULATED"
    zhang = sorted(by_goal["Add a contact named 张三 with the phone number 138-0013-8000."], key=lambda r: r["step_id"])
    assert [s["results/type_action"] for s in zhang if s["results/action_type"] == TYPE] == ["张三", "138-0013-8000"]
    assert all(s["results/action_type"] in (TYPE, DUAL_POINT, COMPLETE, IMPOSSIBLE) for s in zhang)  # no open_app row
    nfc = by_goal["Turn on NFC."]
    assert max(nfc, key=lambda r: r["step_id"])["results/action_type"] == IMPOSSIBLE
    scroll = sorted(by_goal["What is Zoe's phone number? Look it up in Contacts."], key=lambda r: r["step_id"])
    swipe = next(s for s in scroll if s["results/yx_touch"] != s["results/yx_lift"])
    assert swipe["results/yx_touch"][0] > swipe["results/yx_lift"][0]  # scrolling down: the finger goes up
    assert episodes[swipe["episode_id"]][swipe["step_id"]]["gesture"] == "swipe"
    inline, _ = export("aitw", records, images="base64")
    assert [{k: v for k, v in r.items() if k != "image/encoded"} for r in inline] == [
        {k: v for k, v in r.items() if k != "image/encoded"} for r in lines]
    load_aitw(inline, inline=True)  # the base64 screenshots decode at the rows' size
    for fmt in ("sft-trl", "raw", "rl", "sharegpt"):
        _, other = export(fmt, records)
        assert other.excluded == [], (fmt, other.excluded[:2])
    # make demo's dataset and its exports (near-dedup, which make demo runs, keeps all 12: skipped here for time)
    call_command("dataset_create", "demo-mobile", "--batch", "demo-mobile", "--success-only", "--publish",
                 "--no-near-dedup", "--no-progress", stdout=out, stderr=out)
    for fmt in ("aitw", "sharegpt-vision"):
        path = tmp_path / f"demo-mobile.{fmt}.jsonl"
        call_command("dataset_export", "demo-mobile", "--version", "1", "--format", fmt, "--out", str(path),
                     "--no-progress", stdout=out, stderr=out)
        exported = [json.loads(line) for line in path.read_text().splitlines()]
        episodes = {line["episode_id"] for line in exported} if fmt == "aitw" else exported
        assert len(episodes) == len(trajectories) - 1, (fmt, out.getvalue()[-2000:])  # the wrong one is not a success
    assert len(list((tmp_path / "demo-mobile.sharegpt-vision_images").glob("*.png"))) > 20
    # the Hugging Face layout: the screenshots embedded as datasets.Image features
    splits = set(DatasetMember.objects.filter(version__dataset__name="demo-mobile").values_list("split", flat=True))
    for fmt, column in (("aitw", "image/encoded"), ("sharegpt-vision", "images"), ("trl-vision", "images")):
        out_dir = tmp_path / f"demo-mobile.{fmt}.hf"
        call_command("dataset_export", "demo-mobile", "--version", "1", "--format", fmt, "--out", str(out_dir),
                     "--layout", "hf", "--no-progress", stdout=out, stderr=out)
        loaded = hf_datasets.load_dataset(str(out_dir), cache_dir=str(tmp_path / "hf-cache"))
        assert set(loaded) == splits, fmt
        rows = [row for split in loaded.values() for row in split]
        if fmt == "aitw":
            assert loaded["train"].features[column] == hf_datasets.Image()
            jsonl = [json.loads(line) for line in (tmp_path / "demo-mobile.aitw.jsonl").read_text().splitlines()]
            assert sorted((r["episode_id"], r["step_id"]) for r in rows) == sorted(
                (r["episode_id"], r["step_id"]) for r in jsonl)
            assert all(row[column].size == (row["image/width"], row["image/height"]) for row in rows)
        else:
            assert loaded["train"].features[column] == hf_datasets.List(hf_datasets.Image())
            assert sum(len(row[column]) for row in rows) > 20 and all(
                image.size == (720, 1280) for row in rows for image in row[column])
    vision = [name for name in FORMATS if name.endswith("-vision")]  # the gui issue's multimodal formats
    assert vision
    for fmt in vision:
        lines, other = export(fmt, records, images="base64")
        assert other.excluded == [] and len(lines) == len(records), (fmt, other.excluded[:1])
        assert "data:image/png;base64," in json.dumps(lines[0])


def test_aitw_is_mobile_agent_only_and_refuses_an_unlabelled_episode():
    record = {"trajectory_id": 1, "task_id": 1, "task": {"scene": "mobile_agent", "prompt": "x"},
              "steps": [], "verifier_output": {}}
    device = {**record, "trajectory_id": 3, "verifier_output": {"device": {"mode": "device", "simulated": False}}}
    _, result = export("aitw", [record, {**record, "trajectory_id": 2, "task": {"scene": "gui", "prompt": "x"}},
                                device], images="base64")
    assert [e["reason"] for e in result.excluded] == [
        "aitw: the trajectory does not say which device ran it (no verifier_output.device)",
        "aitw: for mobile_agent trajectories, not gui",
        "aitw: the device episode does not say its Android API level (scene_config.android_api_level)"]
