"""The export API's `layout` option: "hf" queues a Hugging Face layout export under DATASET_EXPORT_DIR
(a folder, not downloadable as one file), an unknown layout is refused by field name; the writer itself
is tested on the real loop's episodes in tests/datasets/test_hf_layout.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.datasets.models import ExportJob
from tests.api.test_reviews_datasets_api import export_dir  # noqa: F401 - a fixture
from tests.datasets.version_data import make_trajectory
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db


def test_an_hf_layout_export_through_the_api(client_as: Any, make_task: Any, export_dir: Path,  # noqa: F811
                                             django_capture_on_commit_callbacks: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.datasets import services as dataset_services
    from apps.datasets.jobs import run_export

    for i in range(3):
        make_trajectory(make_task(prompt=f"Program {i}"), code=f"print({i})", score=90)
    from apps.datasets.services import dataset_version_create

    approver = client_as("approver")
    dataset_version_create(dataset_name="hf-ds", filter_spec={"dedup": {"near": False}}, actor=None)
    bad = approver.post("/api/v1/datasets/hf-ds/versions/1/exports", {"format": "sft-trl", "layout": "zip"},
                        format="json")
    assert bad.status_code == 400 and "layout" in str(bad.json()), bad.json()
    assert not ExportJob.objects.exists()

    queued: list[int] = []
    monkeypatch.setattr(dataset_services, "_enqueue_export", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        started = approver.post("/api/v1/datasets/hf-ds/versions/1/exports", {"format": "sft-trl", "layout": "hf"},
                                format="json")
    assert started.status_code == 202, started.json()
    job = started.json()
    assert queued == [job["id"]] and job["layout"] == "hf" and job["format_version"].endswith("+hf")
    assert AuditEvent.objects.get(action="datasets.export_start").data["layout"] == "hf"
    run_export(job["id"])
    polled = approver.get(f"/api/v1/exports/{job['id']}").json()
    assert polled["status"] == "done" and polled["lines"] == 3 and polled["download_url"] is None, polled
    folder = export_dir / "hf-ds" / "v1" / "sft-trl-all.hf"
    assert (folder / "README.md").is_file() and sorted(p.name for p in (folder / "data").iterdir()) == [
        "train-00000-of-00001.parquet"]
    assert approver.get(f"/api/v1/exports/{job['id']}/download").status_code == 404
    # the JSONL export of the same format and split is its own job and file
    with django_capture_on_commit_callbacks(execute=True):
        jsonl = approver.post("/api/v1/datasets/hf-ds/versions/1/exports", {"format": "sft-trl"}, format="json")
    assert jsonl.status_code == 202 and jsonl.json()["id"] != job["id"] and jsonl.json()["layout"] == "jsonl"
    # asking again for the finished layout returns the done job instead of a new one
    again = approver.post("/api/v1/datasets/hf-ds/versions/1/exports", {"format": "sft-trl", "layout": "hf"},
                          format="json")
    assert again.json()["id"] == job["id"]
