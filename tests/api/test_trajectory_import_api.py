"""POST /api/v1/imports/trajectories: the import command's service over the API (issue 30's
interchange, reachable from the API): files a real export wrote, all or nothing, admins only."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.tasks.models import Batch, Task, Trajectory
from tests.datasets.test_interchange import ATIF_RFC_EXAMPLE
from tests.datasets.test_raw_import import _free_source_names, exported  # noqa: F401 (fixture)
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db
URL = "/api/v1/imports/trajectories"


def _counts() -> tuple[int, int, int]:
    return Batch.objects.count(), Task.objects.count(), Trajectory.objects.count()


def test_an_admin_imports_a_raw_export_and_gets_the_counts(client_as: Any, exported: tuple[list[int], Path]) -> None:
    _, path = exported
    before = _counts()
    upload = SimpleUploadedFile("export.jsonl", path.read_bytes(), content_type="application/x-ndjson")
    response = client_as("admin").post(URL, {"file": upload, "batch": "from the api"}, format="multipart")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["tasks"], body["trajectories"], body["reviews"], body["rehashed"]) == (2, 4, 4, 0)
    [batch] = body["batches"]
    assert batch["name"] == "from the api" and Batch.objects.get(pk=batch["id"]).tasks.count() == 2
    assert _counts() == (before[0] + 1, before[1] + 2, before[2] + 4)
    event = AuditEvent.objects.get(action="datasets.trajectories_import")
    assert event.actor.username.startswith("admin") and event.data["trajectories"] == 4


def test_a_bad_file_is_a_400_naming_each_line_and_writes_nothing(client_as: Any,
                                                                 exported: tuple[list[int], Path]) -> None:
    _, path = exported
    _free_source_names()
    lines = path.read_bytes().splitlines()
    broken = b"\n".join([lines[0], b"{not json", lines[1][: len(lines[1]) // 2]]) + b"\n"
    before = _counts()
    response = client_as("admin").post(URL, {"file": SimpleUploadedFile("broken.jsonl", broken)}, format="multipart")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    reasons = [e["reason"] for e in error["details"]["errors"]]
    assert error["code"] == "invalid" and reasons and all(r.startswith("broken.jsonl:") for r in reasons)
    assert {r.split(":")[1] for r in reasons} == {"2", "3"}
    assert _counts() == before and not AuditEvent.objects.filter(action="datasets.trajectories_import").exists()


def test_another_tool_s_atif_file_comes_in_with_its_outcome(client_as: Any) -> None:
    upload = SimpleUploadedFile("trajectory.json", json.dumps(ATIF_RFC_EXAMPLE).encode())
    missing = client_as("admin").post(URL, {"file": upload, "format": "atif"}, format="multipart")
    assert missing.status_code == 400 and "outcome" in missing.json()["error"]["message"]
    upload.seek(0)
    response = client_as("admin").post(URL, {"file": upload, "format": "atif", "outcome": "success"},
                                       format="multipart")
    assert response.status_code == 201, response.content
    [t] = Trajectory.objects.all()
    assert t.outcome == "success" and t.config_snapshot["imported_from"]["format"] == "atif"
    assert t.config_snapshot["imported_from"]["file"] == "trajectory.json"


@pytest.mark.parametrize("role", ["viewer", "reviewer", "approver"])
def test_only_admins_import_and_a_refusal_writes_nothing(client_as: Any, exported: tuple[list[int], Path],
                                                          role: str) -> None:
    _, path = exported
    before = _counts()
    response = client_as(role).post(URL, {"file": SimpleUploadedFile("e.jsonl", path.read_bytes()), "batch": "x"},
                                    format="multipart")
    assert response.status_code == 403 and _counts() == before


def test_the_service_refuses_a_user_without_the_permission_even_from_the_command(
        exported: tuple[list[int], Path], make_user: Any) -> None:
    from django.core.exceptions import PermissionDenied

    from apps.datasets.raw_import import interchange_import

    _, path = exported
    with pytest.raises(PermissionDenied, match="tasks.add_trajectory"):
        interchange_import(path_or_file=path, fmt="raw", actor=make_user("approver"), batch_name="y")
    assert not Batch.objects.filter(name="y").exists()


def test_a_json_body_is_a_415_that_says_so(client_as: Any) -> None:
    response = client_as("admin").post(URL, {"file": "not a file"}, format="json")
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
