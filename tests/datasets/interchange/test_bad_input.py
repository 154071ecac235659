"""Hostile files: every value of the projects' real files (and the ATIF RFC's example) replaced by
a value of the wrong type, or removed. The readers answer each with errors naming the file and
the place (InterchangeError: a 400 from the API, the command's FILE:LINE list), never another
exception (a traceback, a 500); what they accept the raw importer accepts as well."""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.datasets.interchange import InterchangeError, to_raw_lines
from apps.datasets.raw_import import _check_file, _Checker, chat_shape_warnings
from apps.tasks.models import Batch, Trajectory
from tests.api.conftest import client_as, make_token  # noqa: F401 (fixtures: the API as an admin)
from tests.datasets.test_interchange import ATIF_RFC_EXAMPLE

FIXTURES = Path(__file__).parent / "fixtures"
WRONG = [None, True, -1, 10**30, "x", [], {}, [1]]  # a value of each other JSON type, and out of range
DOCUMENTS = [
    ("adp", "adp/agenttuning_alfworld-1.5.0.json"), ("adp", "adp/agenttuning-no-version.json"),
    ("adp", "adp/agenttuning_os-1.3.1.json"), ("adp", "adp/synatra-1.2.0.json"),
    ("atif", "atif/agenttuning_alfworld-ATIF-v1.7.json"), ("atif", "atif/synatra-ATIF-v1.7.json"), ("atif", "rfc"),
    ("mini-swe-agent", "mini_swe_agent/calc-textbased.traj.json"),
    ("mini-swe-agent", "mini_swe_agent/calc-toolcall.traj.json"),
]


def _places(obj: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a document (the first items of each list)."""
    if at:
        yield at
    children = obj.items() if isinstance(obj, dict) else enumerate(obj[:4]) if isinstance(obj, list) else ()
    for key, value in children:
        yield from _places(value, (*at, key))


def _variants(doc: Any) -> Iterator[tuple[str, Any]]:
    for place in _places(doc):
        for value in [*WRONG, "<removed>"]:
            changed = copy.deepcopy(doc)
            parent = changed
            for key in place[:-1]:
                parent = parent[key]
            if value == "<removed>":
                if not isinstance(parent, dict):
                    continue
                del parent[place[-1]]
            else:
                parent[place[-1]] = value
            yield f"{place} = {value!r}", changed


@pytest.mark.parametrize("fmt,name", DOCUMENTS)
def test_a_wrong_type_anywhere_is_an_error_naming_the_place_never_a_traceback(fmt: str, name: str) -> None:
    doc = ATIF_RFC_EXAMPLE if name == "rfc" else json.loads((FIXTURES / name).read_text())
    crashed, refused_later = [], []
    for where, changed in _variants(doc):
        try:
            raw = to_raw_lines(json.dumps(changed).encode(), fmt, label="f.json", outcome="success", images={})
        except InterchangeError as exc:
            assert exc.errors and all(e.startswith("f.json") for e in exc.errors), (where, exc.errors)
            continue
        except Exception as exc:  # noqa: BLE001 - the finding: what else a reader raised
            crashed.append(f"{where}: {type(exc).__name__}: {exc}")
            continue
        chat_shape_warnings(raw, "f.json")
        errors, _, _ = _check_file(io.BytesIO(raw), "f.raw", _Checker(None), "f")
        if errors:  # the reader let through what our own record refuses: the user reads our field names
            refused_later.append(f"{where}: {errors}")
    assert crashed == [] and refused_later == []


URL = "/api/v1/imports/trajectories"


@pytest.mark.django_db
def test_the_api_answers_wrong_types_with_a_400_listing_each_and_writes_nothing(client_as: Any) -> None:
    [doc] = json.loads((FIXTURES / "atif/agenttuning_alfworld-ATIF-v1.7.json").read_text())
    doc["trajectory_id"] = ["os_1"]
    doc["steps"][3]["tool_calls"] = True
    doc["steps"][4]["observation"]["results"][0]["source_call_id"] = []
    before = Trajectory.objects.count(), Batch.objects.count()
    response = client_as("admin").post(URL, {"file": SimpleUploadedFile("bad.json", json.dumps([doc]).encode()),
                                             "format": "atif", "outcome": "success"}, format="multipart")
    assert response.status_code == 400, response.content
    reasons = [e["reason"] for e in response.json()["error"]["details"]["errors"]]
    assert reasons == ["bad.json[0]: not ATIF: line.trajectory_id: a string or null",
                       "bad.json[0]: not ATIF: line.steps[3].tool_calls: a list or null",
                       "bad.json[0]: not ATIF: line.steps[3].observation.results[0].source_call_id: 'call_1' is no call "
                       "of this step",
                       "bad.json[0]: not ATIF: line.steps[4].observation.results[0].source_call_id: a string or null"]
    assert (Trajectory.objects.count(), Batch.objects.count()) == before
