"""apps.tasks.importers: pure parsing and validation, no database."""
from __future__ import annotations

import io
import json
from typing import Any

import pytest

from apps.tasks.importers import (
    ADP_TASK_TYPE_SCENES,
    InvalidImport,
    TaskImportError,
    check_file,
    iter_tasks,
    parse_tasks,
    validate_task,
)


def _bytes(*lines: Any) -> io.BytesIO:
    return io.BytesIO("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode())


def _errors(obj: Any, **kw: Any) -> list[tuple[str, str]]:
    return validate_task(obj, **kw)[2]


def test_adp_task_types_map_to_scenes() -> None:
    assert ADP_TASK_TYPE_SCENES == {"code": "code_exec", "web": "gui", "reasoning": "deep_search"}


def test_it_maps_an_adp_line_to_task_fields() -> None:
    shape, fields, errors = validate_task(
        {"task_id": "t1", "task_type": "web", "description": "Find it", "expected_tools": ["browser"],
         "max_steps": 8, "timeout": 120, "priority": 9}
    )
    assert (shape, errors) == ("adp", [])
    assert fields == {"external_id": "t1", "scene": "gui", "prompt": "Find it", "expected_tools": ["browser"],
                      "max_steps": 8, "timeout_s": 120.0, "priority": 9, "scene_config": {}}


def test_it_fills_scene_config_defaults() -> None:
    _shape, fields, _ = validate_task({"scene": "search2qa", "prompt": "p", "config": {"seed": "https://a.test"}})
    assert fields is not None
    assert fields["scene_config"] == {"seed": "https://a.test", "qa_mode": "question", "max_evolutions": 2,
                                      "enable_evolution": True, "difficulty_check": "full"}


@pytest.mark.parametrize("field", ["priority", "max_steps", "max_iterations", "quality_threshold",
                                   "samples_per_iteration", "max_tokens"])
def test_a_boolean_is_not_an_integer(field: str) -> None:
    assert _errors({"scene": "gui", "prompt": "p", field: True}) == [(field, "must be an integer, got boolean")]


@pytest.mark.parametrize("field", ["temperature", "top_p", "step_timeout_s", "timeout_s"])
def test_a_boolean_is_not_a_number(field: str) -> None:
    assert _errors({"scene": "gui", "prompt": "p", field: False}) == [(field, "must be a number, got boolean")]


def test_an_integral_float_is_not_an_integer() -> None:
    assert _errors({"scene": "gui", "prompt": "p", "priority": 5.0}) == [("priority", "must be an integer, got number")]


def test_integers_are_accepted_for_number_fields() -> None:
    _shape, fields, errors = validate_task({"scene": "gui", "prompt": "p", "temperature": 1, "top_p": None})
    assert errors == [] and fields is not None
    assert fields["temperature"] == 1.0 and fields["top_p"] is None


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("temperature", 2.01, "must be between 0 and 2, got 2.01"),
        ("top_p", -0.1, "must be between 0 and 1, got -0.1"),
        ("max_steps", 501, "must be between 1 and 500, got 501"),
        ("step_timeout_s", 0.05, "must be at least 0.1, got 0.05"),
        ("timeout_s", 0, "must be at least 1, got 0"),
        ("max_tokens", 0, "must be between 1 and 2147483647, got 0"),
        ("max_iterations", 21, "must be between 1 and 20, got 21"),
        ("quality_threshold", -1, "must be between 0 and 100, got -1"),
        ("samples_per_iteration", 65, "must be between 1 and 64, got 65"),
        ("priority", 0, "must be between 1 and 10, got 0"),
        ("model", "m" * 201, "must be at most 200 characters, got 201"),
        ("external_id", "x" * 201, "must be at most 200 characters, got 201"),
        ("expected_tools", "browser", "must be an array of strings, got string"),
        ("expected_tools", ["browser", 3], "must be an array of non-empty strings; item 1 is integer"),
        ("prompt", "  ", "must not be empty"),
        ("system_prompt_extra", None, "must be a string, got null"),
        ("prompt", "a\x00b", "contains a NUL byte (U+0000) at character 1, which cannot be stored; remove it"),
        ("config", None, "must be an object, got null"),
    ],
)
def test_it_rejects_out_of_range_and_mistyped_values(field: str, value: Any, reason: str) -> None:
    obj = {"scene": "gui", "prompt": "p", field: value}
    assert _errors(obj) == [(field, reason)]


def test_text_that_cannot_be_stored_is_reported_by_field_path() -> None:
    errors = _errors({"scene": "gui", "prompt": "a\ud800b", "config": {"start_url": "a\x00"}})
    assert [f for f, _ in errors] == ["prompt", "config.start_url"]
    assert "lone UTF-16 surrogate (U+D800)" in errors[0][1] and "NUL byte" in errors[1][1]


def test_it_reports_every_problem_of_one_line() -> None:
    errors = _errors({"scene": "gui", "prompt": 3, "priority": 11, "colour": "red"})
    assert {f for f, _ in errors} == {"prompt", "priority", "colour"}


def test_it_detects_mixed_and_unknown_shapes() -> None:
    (field, reason), = _errors({"task_id": "a", "scene": "gui", "prompt": "p"})
    assert field == "shape" and reason.startswith("mixes agent-data-platform fields (task_id) with trajplatform fields")
    (field, reason), = _errors({"max_steps": 3})
    assert field == "shape" and reason.startswith("matches neither shape")
    assert _errors([1]) == [("line", "must be a JSON object, got array")]


def test_unknown_fields_get_a_suggestion() -> None:
    assert _errors({"scene": "gui", "prompt": "p", "scene_config": {}}) == [
        ("scene_config", "unknown field for the trajplatform shape (did you mean 'config'?)")
    ]
    assert _errors({"task_id": "a", "task_type": "code", "description": "d", "timout": 5}) == [
        ("timout", "unknown field for the agent-data-platform shape (did you mean 'timeout'?)")
    ]


def test_scene_override_replaces_scene_and_task_type() -> None:
    _s, fields, errors = validate_task({"task_id": "a", "task_type": "poetry", "description": "d"}, scene="toucan")
    assert errors == [] and fields is not None and fields["scene"] == "toucan"
    _s, fields, errors = validate_task({"prompt": "p"}, scene="gui")
    assert errors == [] and fields is not None and fields["scene"] == "gui"
    assert _errors({"prompt": "p"}) == [("scene", "required field is missing (or set the scene with --scene)")]


def test_jsonl_line_numbers_count_blank_lines_bom_and_crlf() -> None:
    data = b'\xef\xbb\xbf{"scene": "gui", "prompt": "a"}\r\n\r\n\n{"scene": "gui", "prompt": "b", "priority": 0}\r\n'
    summary = check_file(io.BytesIO(data))
    assert summary.errors == [TaskImportError(4, "priority", "must be between 1 and 10, got 0")]
    assert summary.task_count == 1


def test_a_json_list_reports_the_line_each_item_starts_on() -> None:
    data = b'\n[\n  {"scene": "gui",\n   "prompt": "a"},\n\n  {"scene": "gui",\n   "prompt": "b", "priority": 99}\n]\n'
    summary = check_file(io.BytesIO(data))
    assert summary.errors == [TaskImportError(6, "priority", "must be between 1 and 10, got 99")]
    assert summary.container == "json"


def test_json_syntax_errors_point_at_their_line() -> None:
    assert check_file(io.BytesIO(b'[{"scene": "gui", "prompt": "a"},\n {"scene": "gui" "prompt": "b"}]')).errors == [
        TaskImportError(2, "json", "malformed JSON: Expecting ',' delimiter (column 18)")
    ]
    assert check_file(io.BytesIO(b'[{"scene": "gui", "prompt": "a"},]')).errors[0].reason.startswith(
        "malformed JSON: Expecting value"
    )
    assert check_file(io.BytesIO(b'{"scene": "gui", "prompt": "a"} {"x": 1}\n')).errors == [
        TaskImportError(1, "json", "malformed JSON: extra data after the JSON value (one object per line) (column 33)")
    ]


def test_nan_and_duplicate_keys_are_rejected() -> None:
    summary = check_file(_bytes('{"scene": "gui", "prompt": "a", "temperature": NaN}',
                                '{"scene": "gui", "prompt": "a", "prompt": "b"}'))
    assert summary.errors == [
        TaskImportError(1, "json", "malformed JSON: NaN is not valid JSON"),
        TaskImportError(2, "prompt", "duplicate key in one JSON object"),
    ]


def test_invalid_utf8_is_reported() -> None:
    summary = check_file(io.BytesIO(b'{"scene": "gui", "prompt": "caf\xe9"}\n'))
    assert summary.errors == [TaskImportError(1, "line", "not valid UTF-8 (byte 32)")]


def test_duplicate_ids_name_the_first_line() -> None:
    summary = check_file(_bytes(
        {"task_id": "x", "task_type": "code", "description": "a"},
        {"task_id": "y", "task_type": "code", "description": "b"},
        {"task_id": "x", "task_type": "web", "description": "c"},
    ))
    assert summary.errors == [TaskImportError(3, "task_id", "duplicate task_id 'x' (first on line 1)")]


def test_empty_external_ids_may_repeat() -> None:
    summary = check_file(_bytes({"scene": "gui", "prompt": "a"}, {"scene": "gui", "prompt": "b", "external_id": ""}))
    assert summary.ok and summary.task_count == 2


@pytest.mark.parametrize("data, reason", [
    (b"", "no tasks: the file is empty or only blank lines"),
    (b"\n  \n", "no tasks: the file is empty or only blank lines"),
    (b" [ ] ", "no tasks: the JSON list is empty"),
])
def test_an_empty_input_is_an_error(data: bytes, reason: str) -> None:
    assert check_file(io.BytesIO(data)).errors == [TaskImportError(1, "file", reason)]


def test_summary_counts_and_format() -> None:
    data = _bytes({"task_id": "a", "task_type": "code", "description": "d"}, {"scene": "gui", "prompt": "p"})
    summary = check_file(data)
    assert summary.ok
    assert summary.source_format == "jsonl/mixed"
    assert dict(summary.by_scene) == {"code_exec": 1, "gui": 1}
    assert len(summary.sha256) == 64


def test_parse_tasks_returns_rows_or_errors() -> None:
    rows, summary = parse_tasks(_bytes({"scene": "gui", "prompt": "p"}))
    assert summary.ok and [r["prompt"] for r in rows] == ["p"]
    rows, summary = parse_tasks(_bytes({"scene": "gui", "prompt": "p"}, {"scene": "gui"}))
    assert rows == [] and summary.errors == [TaskImportError(2, "prompt", "required field is missing")]


def test_iter_tasks_raises_on_the_first_invalid_item() -> None:
    rows = iter_tasks(_bytes({"scene": "gui", "prompt": "p"}, {"scene": "gui"}))
    assert next(rows)["prompt"] == "p"
    with pytest.raises(InvalidImport):
        next(rows)


def test_an_unknown_override_scene_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="valid scenes"):
        check_file(_bytes({"scene": "gui", "prompt": "p"}), scene="teleport")


def test_a_reference_solution_is_accepted_and_dropped() -> None:
    steps = [{"tool_calls": [{"name": "finish", "arguments": {"answer": "done"}}]}]
    summary = check_file(_bytes(
        {"scene": "code_exec", "prompt": "p", "reference_solution": steps},
        {"task_id": "a", "task_type": "reasoning", "description": "d", "reference_solution": [{"content": "42"}]},
    ))
    assert summary.ok and summary.task_count == 2
    rows, _ = parse_tasks(_bytes({"scene": "code_exec", "prompt": "p", "reference_solution": steps}))
    assert "reference_solution" not in rows[0]


@pytest.mark.parametrize("value, reason", [
    ({"steps": []}, "must be a list of step objects, got object"),
    ("write the file", "must be a list of step objects, got string"),
    ([], "must not be empty (the offline model needs at least one step)"),
    ([{"content": "x"}, "finish"], "must be a list of step objects; item 1 is string"),
])
def test_a_reference_solution_that_is_not_a_list_of_steps_is_rejected(value: Any, reason: str) -> None:
    summary = check_file(_bytes({"scene": "gui", "prompt": "ok"}, {"scene": "gui", "prompt": "p", "reference_solution": value}))
    assert [e.format("tasks.jsonl") for e in summary.errors] == [f"tasks.jsonl:2: reference_solution: {reason}"]
