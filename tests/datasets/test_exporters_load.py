"""Every export loads with Hugging Face `datasets` (the loader TRL and LLaMA-Factory use).

`datasets` is slow to import, so this is the one module that does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from apps.datasets.exporters import FORMATS, export_records, load_records
from tests.datasets.exporter_data import failing_episode, make_review, make_trajectory, rich_episode

pytestmark = pytest.mark.django_db


@pytest.fixture
def hf_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import datasets

    datasets.disable_progress_bars()
    return datasets


def test_every_format_loads_with_datasets_without_schema_errors(
    make_task: Any, reviewer: Any, tmp_path: Path, hf_datasets: Any
) -> None:
    verifier = {"command": "python3 -m pytest -q", "files": {"test_p.py": "def test(): pass\n"}}
    ids = []
    for n in range(3):
        task = make_task(prompt=f"Task {n}: print the primes ✓", external_id=f"t{n}",
                         scene_config={"verifier": verifier} if n else {})
        good = make_trajectory(task)
        bad = make_trajectory(task, episode=failing_episode, sample_index=1, outcome="failure", reward=0.0)
        make_review(good, overall=80 + n)
        make_review(bad, kind="human", verdict="reject", reviewer=reviewer)
        ids += [good.pk, bad.pk]
    messages, steps = rich_episode("x_")
    messages[3]["content"] = ""  # another empty observation, in a parallel pair
    ids.append(make_trajectory(make_task(prompt="Task 9"), messages=messages, steps=steps).pk)
    for fmt in FORMATS:
        path = tmp_path / f"{fmt}.jsonl"
        with path.open("wb") as fp:
            result = export_records(fmt, load_records(ids), fp)
        assert result.lines > 0, (fmt, result.excluded)
        loaded = hf_datasets.load_dataset("json", data_files=str(path), split="train",
                                          cache_dir=str(tmp_path / "cache"))
        assert loaded.num_rows == result.lines, fmt
        first = orjson.loads(path.read_bytes().splitlines()[0])
        assert set(loaded.column_names) == set(first), fmt
