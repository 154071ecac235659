"""A multi_agent version from the real loop (the offline model playing planner, coder and tester):
the card counts each roles choice, the export form and the API take it, the jobs write what the
card says, and every per-role line names its role and trajectory in a metadata column."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.datasets.exporters import validate_line
from apps.datasets.jobs import export_run
from apps.datasets.models import ExportJob
from apps.datasets.services import ExportError, dataset_version_create, export_start
from tests.datasets.version_data import export_dir, no_dedup  # noqa: F401 (export_dir is a fixture)
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import llm_env  # noqa: F401 - a fixture
from tests.engines.test_multi_agent import _stored_episode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]


def _lines(job: ExportJob) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(job.path).read_text(encoding="utf-8").splitlines()]


def test_roles_choices_are_counted_offered_and_written_with_a_metadata_column(
        make_task: Any, approver: Any, client: Any) -> None:
    lead = _stored_episode(make_task)
    coder, tester = lead.subtrajectories()
    version = dataset_version_create(dataset_name="team", actor=approver, filter_spec=no_dedup(validation_fraction=0))
    section = version.data_card["exportability"]
    # planner and coder are trainable (the tester is not): 2 views; the lead alone 1; all 3.
    assert section["formats"]["sft-trl"]["lines"]["all"] == 2
    assert section["roles"]["lead"]["sft-trl"] == 1 and section["roles"]["all"]["sft-trl"] == 3
    assert "rl-verl" not in section["roles"]["all"]  # a task-level format takes the episode whole
    assert "aitw" in section["not_applicable"]

    client.force_login(approver)
    page = client.get(f"/datasets/team/v{version.number}/").content.decode()
    form = page.split('id="export-form"')[1].split("</form>")[0]
    assert '<select name="roles"' in form and '<option value="lead">the lead only</option>' in form
    assert 'value="multiagent-agentjet"' in form and 'value="aitw"' not in form

    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(approver)
    url = f"/api/v1/datasets/team/versions/{version.number}/exports"
    refused = api.post(url, {"format": "rl-verl", "roles": "all"}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["details"]["fields"]["roles"] == [
        "roles: rl-verl takes each multi_agent episode whole (the lead's view or the whole record)"]
    for roles, expected in (("trainable", 2), ("lead", 1), ("all", 3)):
        started = api.post(url, {"format": "sft-trl", "roles": roles}, format="json")
        assert started.status_code == 202, started.json()
        assert (started.json()["roles"], started.json()["layout"]) == (roles, "jsonl")  # read back from the job
        job = export_run(started.json()["id"])
        assert job is not None and api.get(f"/api/v1/exports/{job.pk}").json()["roles"] == roles
        assert job is not None and job.status == "done", job and job.error
        lines = _lines(job)
        assert len(lines) == job.lines == expected
        assert all(validate_line("sft-trl", line) == [] for line in lines)
    # The last file (all roles): each view's role, own trajectory and the lead's id.
    assert [line["metadata"] for line in lines] == [
        {"role": "planner", "trajectory_id": lead.pk, "parent_trajectory_id": None},
        {"role": "coder", "trajectory_id": coder.pk, "parent_trajectory_id": lead.pk},
        {"role": "tester", "trajectory_id": tester.pk, "parent_trajectory_id": lead.pk},
    ]
    assert ExportJob.objects.filter(format="sft-trl").count() == 3  # one file per roles choice
    exports = client.get(f"/datasets/team/v{version.number}/?fragment=exports").content.decode()
    assert exports.count("roles: lead") == 1 and exports.count("roles: all") == 1  # the default is unmarked
    with pytest.raises(ExportError, match="roles: one of trainable, lead, all"):
        export_start(version=version, fmt="sft-trl", roles="everyone", actor=None, enqueue=False)
