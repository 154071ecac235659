"""`dataset_export --layout hf`: Parquet shards per split and a README.md card, on a version of episodes
the real agent loop played (the toolace demo's tasks with the offline model). `datasets.load_dataset(DIR)`
gives the splits and rows of the JSONL export exactly; verl's RLHFDataset reads the rl-verl shards the way
its code does (datasets' parquet loader, then `tokenizer.apply_chat_template(row["prompt"])`); an existing
DIR is refused unless --force and nothing partial is left on a failure. The mobile demo's images as
datasets.Image: tests/engines/test_mobile_export.py."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from django.core.management import CommandError, call_command

from apps.datasets import hf_layout
from apps.datasets.exporters import export_records, load_records
from apps.datasets.models import DatasetMember, ExportJob
from tests.datasets.consumer_data import TOOL_CHAT_TEMPLATE, byte_tokenizer
from tests.datasets.exporter_data import make_trajectory
from tests.datasets.test_exporters_load import hf_datasets  # noqa: F401 - a fixture
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import llm_env  # noqa: F401 - a fixture
from tests.engines.test_toolace import demo_task, solve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]
TASKS = ("expense-reports.items.lunch", "expense-reports.items.supplies", "calendar-email.mail.offsite",
         "calendar-email.schedule.budget")
_episodes: dict[str, Any] = {}  # the real loop's episodes, played once for the module


@pytest.fixture
def version(make_task: Any, approver: Any) -> Any:
    """A version of the four demo tasks' episodes, both splits holding members."""
    from apps.datasets.services import dataset_version_create

    for key in TASKS:
        config, solution = demo_task(key)
        if key not in _episodes:
            _episodes[key] = solve(config, solution)
        result = _episodes[key]
        assert result.outcome != "error", result.outcome_reason
        task = make_task(scene="toolace", prompt=config["prompt"], scene_config=config["scene_config"], external_id=key)
        make_trajectory(task, messages=result.messages, tools=result.tools, steps=result.steps,
                        final_answer=result.final_answer, verifier_output=result.verifier_output,
                        reward=result.reward, outcome=result.outcome)
    for seed in range(20):  # a split seed that puts tasks in both splits (the split is by task, seeded)
        created = dataset_version_create(dataset_name=f"hf{seed}", actor=approver, filter_spec={
            "scenes": ["toolace"], "dedup": {"near": False}, "validation_fraction": 0.5, "split_seed": seed})
        splits = set(DatasetMember.objects.filter(version=created).values_list("split", flat=True))
        if splits == {"train", "validation"}:
            return created
    raise AssertionError("no split seed of 20 gave both splits")


def export(version: Any, fmt: str, out: Path, *args: str) -> str:
    stdout, stderr = io.StringIO(), io.StringIO()
    call_command("dataset_export", version.dataset.name, "--version", str(version.number), "--format", fmt,
                 "--out", str(out), "--no-progress", *args, stdout=stdout, stderr=stderr)
    return stdout.getvalue() + stderr.getvalue()


def jsonl_lines(version: Any, fmt: str, split: str) -> list[dict[str, Any]]:
    ids = list(DatasetMember.objects.filter(version=version, split=split).order_by("position")
               .values_list("trajectory_id", flat=True))
    buf = io.BytesIO()
    export_records(fmt, load_records(ids), buf, options={"split": split})
    return [orjson.loads(line) for line in buf.getvalue().splitlines()]


def card(path: Path) -> tuple[dict[str, Any], str]:
    _, front, body = (path / "README.md").read_text(encoding="utf-8").split("---\n", 2)
    return yaml.safe_load(front), body


def test_the_layout_loads_with_datasets_with_its_splits_features_and_rows(
    version: Any, tmp_path: Path, hf_datasets: Any,  # noqa: F811
) -> None:
    for fmt in ("sft-trl", "toolace", "toucan", "sharegpt", "rl", "raw"):
        out = tmp_path / fmt
        printed = export(version, fmt, out, "--layout", "hf")
        assert f"wrote {out}" in printed, printed
        loaded = hf_datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
        assert set(loaded) == {"train", "validation"}, fmt
        meta, body = card(out)
        assert meta["configs"] == [{"config_name": "default", "data_files": [
            {"split": "train", "path": "data/train-*"}, {"split": "validation", "path": "data/validation-*"}]}]
        for split in ("train", "validation"):
            expected = jsonl_lines(version, fmt, split)
            assert expected, (fmt, split)
            # the rows are the JSONL export's lines, decoded exactly (no struct padded with other rows' keys)
            assert [dict(row) for row in loaded[split]] == expected, (fmt, split)
            assert sorted(p.name for p in (out / "data").glob(f"{split}-*")) == [f"{split}-00000-of-00001.parquet"]
        split_info = {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]}
        assert split_info == {s: loaded[s].num_rows for s in loaded}
        assert meta["dataset_info"]["features"] == hf_datasets.DatasetInfo(
            features=loaded["train"].features)._to_yaml_dict()["features"]
        assert "license" not in meta and "No corpus licence is recorded" in body and fmt in meta["tags"]
    job = ExportJob.objects.filter(format="sft-trl").get()
    assert job.format_version.endswith("+hf") and job.lines == sum(
        len(jsonl_lines(version, "sft-trl", s)) for s in ("train", "validation"))
    trl = hf_datasets.load_dataset(str(tmp_path / "sft-trl"), cache_dir=str(tmp_path / "cache"))["train"]
    # messages whose keys differ by role are Json features: each message exactly as written
    assert isinstance(trl.features["messages"], hf_datasets.List)
    assert isinstance(trl.features["messages"].feature, hf_datasets.Json)
    toucan = hf_datasets.load_dataset(str(tmp_path / "toucan"), cache_dir=str(tmp_path / "cache"))["train"]
    assert all(f == hf_datasets.Value("string") for f in toucan.features.values())  # as the released dataset
    json.loads(toucan[0]["messages"])


def test_verl_reads_the_rl_verl_shards_as_its_dataset_does(version: Any, tmp_path: Path,
                                                           hf_datasets: Any) -> None:  # noqa: F811
    """verl is not installed: its RLHFDataset's reading (verl/utils/dataset/rl_dataset.py,
    volcengine/verl 00080f11): datasets.load_dataset("parquet", data_files=file)["train"], then per row
    tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True) and extra_info.get("index")."""
    import pandas as pd

    out = tmp_path / "verl"
    export(version, "rl-verl", out, "--layout", "hf", "--split", "train")
    [shard] = sorted((out / "data").glob("*.parquet"))
    assert shard.name == "train-00000-of-00001.parquet"
    tokenizer = byte_tokenizer(tmp_path / "tok", TOOL_CHAT_TEMPLATE)
    frame = hf_datasets.load_dataset("parquet", data_files=str(shard), cache_dir=str(tmp_path / "cache"))["train"]
    expected = jsonl_lines(version, "rl-verl", "train")
    assert len(frame) == len(expected) > 0
    for row, line in zip(frame, expected):
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        assert line["prompt"][-1]["content"] in prompt and prompt.endswith("<|im_start|>assistant\n")
        assert row["extra_info"].get("index", 0) == line["extra_info"]["index"]
        assert row["reward_model"] == line["reward_model"] and row["data_source"] == line["data_source"]
    pandas_rows = pd.read_parquet(shard)  # the older verl read the same files with pandas
    assert list(pandas_rows["data_source"]) == [line["data_source"] for line in expected]


def test_shards_follow_the_setting_and_an_existing_directory_is_refused_unless_forced(
    version: Any, tmp_path: Path, settings: Any, hf_datasets: Any,  # noqa: F811
) -> None:
    settings.DATASET_HF_SHARD_ROWS = 1
    out = tmp_path / "sharded"
    export(version, "sft-trl", out, "--layout", "hf", "--split", "train")
    rows = len(jsonl_lines(version, "sft-trl", "train"))
    assert sorted(p.name for p in (out / "data").iterdir()) == [
        f"train-{i:05d}-of-{rows:05d}.parquet" for i in range(rows)]
    assert hf_datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"].num_rows == rows
    with pytest.raises(CommandError, match="already exists; pass --force"):
        export(version, "sft-trl", out, "--layout", "hf", "--split", "train")
    (out / "stale.txt").write_text("from before")
    settings.DATASET_HF_SHARD_ROWS = 10000
    export(version, "sft-trl", out, "--layout", "hf", "--split", "train", "--force")
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in (out / "data").iterdir()) == ["train-00000-of-00001.parquet"]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(CommandError, match="is a file; the Hugging Face layout writes a directory"):
        export(version, "sft-trl", a_file, "--layout", "hf", "--force")
    with pytest.raises(CommandError, match="--check-template renders a JSONL export"):
        export(version, "sft-trl", tmp_path / "t", "--layout", "hf", "--check-template", "x")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp folder left


def test_a_failure_leaves_nothing_partial_and_a_rerun_resumes(version: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "layout"
    export(version, "toolace", out, "--layout", "hf")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real = hf_layout.write_layout

    def failing(**kwargs: Any) -> Any:
        real(**kwargs)  # the whole layout written into the temp folder, then the disk "fills"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf_layout, "write_layout", failing)
    with pytest.raises(CommandError, match="No space left on device"):
        export(version, "toolace", out, "--layout", "hf", "--force")
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []
    assert (tmp_path / "layout.parts").is_dir()  # the finished chunks stay for the re-run
    monkeypatch.setattr(hf_layout, "write_layout", real)
    printed = export(version, "toolace", out, "--layout", "hf", "--force")
    assert "chunk(s) resumed" in printed and not (tmp_path / "layout.parts").exists()
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # same bytes


def test_the_card_names_the_hubs_license_of_the_corpora() -> None:
    assert hf_layout.hub_license([]) == {}
    assert hf_layout.hub_license([{"corpus": "wiki", "licence": "CC BY-SA 4.0"}]) == {"license": "cc-by-sa-4.0"}
    assert hf_layout.hub_license([{"licence": "CC BY-SA 4.0"}, {"licence": "Apache 2.0"}]) == {
        "license": ["apache-2.0", "cc-by-sa-4.0"]}
    assert hf_layout.hub_license([{"licence": "our site's terms"}, {"licence": "MIT"}]) == {
        "license": "other", "license_name": "MIT; our site's terms"}


def test_feature_shapes_merge_as_documented() -> None:
    rows = [{"a": {"x": 1}, "b": [1], "c": "s", "d": {"k": 1}}, {"a": {"x": 2.5}, "b": [], "c": None, "d": {"j": 1}},
            {"a": {"x": 3}, "b": [2], "c": "t", "d": {}}]
    shapes = hf_layout.row_shape(rows)
    assert shapes == {"a": ("struct", (("x", ("float",)),)), "b": ("list", ("int",)), "c": ("str",),
                      "d": hf_layout.JSON}
    assert hf_layout.merge(("str",), ("int",)) == hf_layout.JSON
    assert hf_layout.shape_of(2 ** 70) == hf_layout.JSON and hf_layout.shape_of(True) == ("bool",)
