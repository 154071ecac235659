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

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.datasets.interchange import MAX_ERRORS, InterchangeError, to_raw_lines
from apps.datasets.raw_import import (
    RawImportError, _check_file, _Checker, chat_shape_warnings, interchange_import, trajectories_import,
)
from apps.tasks.models import Batch, Trajectory
from tests.api.conftest import client_as, make_token  # noqa: F401 (fixtures: the API as an admin)
from tests.datasets.test_interchange import ATIF_RFC_EXAMPLE
from tests.datasets.test_raw_import import _free_source_names, exported  # noqa: F401 (fixture)

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


# --- the file as text: encodings, nesting, NUL, size of the answer ------------------------------

def _convert(data: bytes, fmt: str = "atif") -> bytes:
    return to_raw_lines(data, fmt, label="f.json", outcome="success", images={})


def _errors(data: bytes, fmt: str = "atif") -> list[str]:
    with pytest.raises(InterchangeError) as caught:
        _convert(data, fmt)
    return caught.value.errors


def test_a_utf8_bom_is_read_and_other_encodings_and_a_broken_document_are_one_error_each() -> None:
    data = (FIXTURES / "atif/agenttuning_os-ATIF-v1.7.json").read_bytes()  # one list, indented over 127 lines
    assert _convert(b"\xef\xbb\xbf" + data) == _convert(data)
    assert _errors(data.decode().encode("utf-16")) == [
        "f.json: UTF-16 text (its byte order mark says so); save the file as UTF-8"]
    latin1 = data.replace(b'"agenttuning_os"', '"agenttuning_\u00e9"'.encode("latin-1"), 1)
    [error] = _errors(latin1)
    assert error == "f.json:7: not UTF-8 text (byte 0xe9 at offset 138); save the file as UTF-8"
    # before: one 'not valid JSON' per line of the indented document (127), none saying where it breaks
    assert _errors(data.replace(b'"os_1",', b'"os_1"', 1)) == [
        "f.json: not valid JSON (unexpected character, expected ',' or '}': line 5 column 5 (char 70))"]
    # JSONL keeps its per-line errors
    line = orjson.dumps(json.loads(data)[0])
    assert [e.split(": ")[0] for e in _errors(b"\n".join([line, b"{not json", line[:40]]))] == ["f.json:2", "f.json:3"]


def _nested(levels: int) -> bytes:
    """The ADP 1.5.0 sample with an action's kwargs nesting to `levels` levels in all."""
    [doc] = json.loads((FIXTURES / "adp/agenttuning_alfworld-1.5.0.json").read_text())
    doc["content"][3]["kwargs"] = {"a": "DEEP"}
    inner = levels - 5  # the list, the document, content, the item, kwargs
    return json.dumps([doc]).replace('"DEEP"', "[" * inner + "1" + "]" * inner).encode()


@pytest.mark.django_db
def test_nesting_past_the_limit_is_one_error_and_at_the_limit_the_file_imports(settings: Any) -> None:
    assert settings.API_MAX_JSON_DEPTH == 64
    # before: a RecursionError (orjson writes 254 levels at most, Python's json ~1000): a 500
    assert _errors(_nested(65), "adp") == [
        "f.json: JSON nested deeper than 64 levels (API_MAX_JSON_DEPTH); no trajectory nests that deep"]
    result = interchange_import(path_or_file=_upload("deep.json", _nested(64)), fmt="adp", actor=None,
                                outcome="success")
    assert result.trajectory_count == 1


def test_a_file_of_100k_bad_items_answers_with_the_first_thousand_errors() -> None:
    errors = _errors(orjson.dumps([{"id": "x", "content": [1] * 100_000}]), "adp")
    assert len(errors) == MAX_ERRORS + 1 and errors[-1] == f"f.json: stopped after {MAX_ERRORS} errors"


def _upload(name: str, data: bytes) -> io.BytesIO:
    upload = io.BytesIO(data)
    upload.name = name
    return upload


@pytest.mark.django_db
def test_a_nul_character_is_refused_where_it_is_and_nothing_is_written(exported: tuple[list[int], Path]) -> None:
    [doc] = json.loads((FIXTURES / "atif/agenttuning_os-ATIF-v1.7.json").read_text())
    doc["steps"][2]["observation"]["results"][0]["content"] = "binary\u0000output"
    before = Trajectory.objects.count(), Batch.objects.count()
    # before: PostgreSQL's jsonb refused it inside the write (DataError: a 500); SQLite stored it
    with pytest.raises(RawImportError) as caught:
        interchange_import(path_or_file=_upload("nul.json", json.dumps([doc]).encode()), fmt="atif", actor=None,
                           outcome="success")
    assert caught.value.errors == ["nul.json[0]: steps[2].observation.results[0].content: contains a NUL byte "
                                   "(U+0000) at character 6, which cannot be stored; remove it"]
    _, path = exported
    _free_source_names()
    lines = path.read_bytes().splitlines()
    record = orjson.loads(lines[1])
    record["final_answer"] = "\u0000"
    lines[1] = orjson.dumps(record)
    with pytest.raises(RawImportError) as caught:
        trajectories_import(path_or_file=_upload("nul.jsonl", b"\n".join(lines) + b"\n"), actor=None)
    assert caught.value.errors == ["nul.jsonl:2: final_answer: contains a NUL byte (U+0000) at character 0, which "
                                   "cannot be stored; remove it"]
    assert (Trajectory.objects.count(), Batch.objects.count()) == (before[0], before[1])


@pytest.mark.django_db
def test_a_raw_export_with_a_utf8_bom_imports(exported: tuple[list[int], Path]) -> None:
    _, path = exported
    _free_source_names()
    result = trajectories_import(path_or_file=_upload("bom.jsonl", b"\xef\xbb\xbf" + path.read_bytes()), actor=None)
    assert result.trajectory_count == 4


def test_two_calls_of_one_step_with_one_id_are_answered_in_order() -> None:
    [doc] = json.loads((FIXTURES / "atif/agenttuning_os-ATIF-v1.7.json").read_text())
    step = next(s for s in doc["steps"] if s.get("tool_calls"))
    first = step["tool_calls"][0]
    step["tool_calls"] = [first, {**first, "arguments": {"command": "pwd"}}]
    step["observation"] = {"results": [{"source_call_id": first["tool_call_id"], "content": "first"},
                                       {"source_call_id": first["tool_call_id"], "content": "second"}]}
    [line] = _convert(json.dumps([doc]).encode()).splitlines()
    messages = orjson.loads(line)["messages"]
    turn = next(i for i, m in enumerate(messages) if m.get("tool_calls") and len(m["tool_calls"]) == 2)
    ids = [c["id"] for c in messages[turn]["tool_calls"]]
    # before: both results named the renamed second call; the first call stayed unanswered
    assert [(m["tool_call_id"], m["content"]) for m in messages[turn + 1:turn + 3]] == [
        (ids[0], "first"), (ids[1], "second")]
    assert len(set(ids)) == 2


def test_an_image_part_of_a_mini_swe_agent_message_is_refused_not_dropped() -> None:
    doc = json.loads((FIXTURES / "mini_swe_agent/calc-toolcall.traj.json").read_text())
    doc["messages"][1]["content"] = [{"type": "text", "text": doc["messages"][1]["content"]},
                                     {"type": "image_url", "image_url": {"url": "screenshots/1.png"}}]
    # before: the text kept and the image silently gone from the trajectory (the turn trained without it)
    assert _errors(json.dumps(doc).encode(), "mini-swe-agent") == [
        "f.json:1: messages[1].content: the image 'screenshots/1.png' is a path or link; only images inlined as "
        "data:image/...;base64 URLs can be imported (nothing is fetched)"]


@pytest.mark.django_db
def test_an_unknown_scene_is_an_error_of_the_option_and_a_file_of_another_format_given_as_raw_one_error(
        client_as: Any) -> None:  # noqa: F811
    data = (FIXTURES / "atif/agenttuning_os-ATIF-v1.7.json").read_bytes()
    # before: 'os.atif:1: task.scene: Value 'nope' is not a valid choice.' - a line of our own raw file
    response = client_as("admin").post(URL, {"file": SimpleUploadedFile("os.json", data), "format": "atif",
                                             "outcome": "success", "scene": "nope"}, format="multipart")
    assert response.status_code == 400, response.content
    [reason] = response.json()["error"]["details"]["fields"]["scene"]
    assert reason.startswith("unknown scene 'nope'; valid scenes: ") and "code_exec" in reason
    # before: one 'not valid JSON' per line of the indented document (127)
    response = client_as("admin").post(URL, {"file": SimpleUploadedFile("os.json", data)}, format="multipart")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["details"]["fields"] == {"format": [
        "os.json: an ATIF trajectory (ATIF-v1.7), not a raw export (JSONL of our records); import it with format "
        "atif"]}
