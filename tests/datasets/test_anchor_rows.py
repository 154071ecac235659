"""The toucan, toolace and aitw formats against real rows of the released datasets
(tests/datasets/anchor_rows/, SOURCES.md): our rows, rendered from episodes the real agent loop
played, have the released rows' columns and types and load through the same loader code
(tests/datasets/anchor_loaders.py). The aitw rows of the mobile demo are checked in
tests/engines/test_mobile_export.py (it runs the demo through the worker)."""
from __future__ import annotations

import io
import json
from typing import Any

import orjson
import pytest

from apps.datasets.exporters import export_records, load_records, validate_line
from apps.datasets.exporters.toolace import parse_calls, render_calls, tools_of
from apps.datasets.exporters.toucan import KEYS as TOUCAN_KEYS
from tests.datasets.anchor_loaders import (
    AITW_FEATURES, TOUCAN_FEATURES, anchor_rows, load_aitw, load_toolace, load_toucan,
)
from tests.datasets.exporter_data import make_trajectory
from tests.datasets.test_toolace_export import lunch  # noqa: F401 - a fixture
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import llm_env  # noqa: F401 - a fixture
from tests.reward_hacking.conftest import scripted_episode  # noqa: F401 - a fixture
from tests.reward_hacking.test_toucan import COMMIT, episode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]


def export(fmt: str, ids: list[int], **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    buf = io.BytesIO()
    result = export_records(fmt, load_records(ids), buf, options=options or None)
    return result, [orjson.loads(line) for line in buf.getvalue().splitlines()]


def _types(row: dict[str, Any]) -> dict[str, str]:
    return {k: type(v).__name__ for k, v in row.items()}


# -- toucan -------------------------------------------------------------------------------------


@pytest.fixture
def toucan_trajectory(scripted_episode: Any, make_task: Any) -> Any:  # noqa: F811
    """The bundled git + time task played by the real loop against the real MCP servers, stored
    with a judge review of Toucan's two response dimensions."""
    from apps.reviews.models import Review

    result = episode(scripted_episode, COMMIT, COMMIT["reference_solution"])
    assert (result.outcome, result.reward) == ("success", 1.0), result.verifier_output
    config = {**COMMIT["config"], "question_quality_assessment": {
        **{d: {"reasoning": "clear", "rating": "high", "score": 5} for d in
           ("tool_selection_difficulty", "tool_selection_uniqueness", "question_quality", "scenario_realism",
            "verifiable", "stability")}, "overall_score": 5.0}}
    task = make_task(scene="toucan", prompt=COMMIT["prompt"], scene_config=config)
    stored = make_trajectory(task, messages=result.messages, tools=result.tools, steps=result.steps,
                             final_answer=result.final_answer, verifier_output=result.verifier_output,
                             reward=result.reward, outcome=result.outcome)
    Review.objects.create(trajectory=stored, kind="auto", status="done", overall=90.0, judge_model="judge-x",
                          scores={"completeness": {"score": 100, "rationale": "answered"},
                                  "conciseness": {"score": 75, "rationale": "one extra call"}})
    return stored


def test_toucan_rows_have_the_released_columns_and_load_as_toucan_users_read_them(toucan_trajectory: Any) -> None:
    real = anchor_rows("toucan_rows.jsonl")
    result, [row] = export("toucan", [toucan_trajectory.pk])
    assert result.excluded == [] and validate_line("toucan", row) == []
    # the card's nine columns, every one a string; the real rows' columns with their types
    assert list(TOUCAN_FEATURES) == list(TOUCAN_KEYS) and set(row) == set(TOUCAN_FEATURES)
    assert set(_types(row).values()) == {"str"}
    for r in real:
        assert {k: _types(row)[k] for k in r} == _types(r)
    ours = load_toucan(row)
    for r in real:
        theirs = load_toucan(r)
        assert theirs["turns"][-1][0] == "assistant" and any(k == "tool_call" for k, _ in theirs["turns"])
    # Toucan's conventions: one assistant message per call with content "", a function result named
    # like the call, tools named <server>-<tool>, the answer as the last assistant text, no finish
    kinds = [k for k, _ in ours["turns"]]
    assert kinds == ["user", "tool_call", "tool_response", "tool_call", "tool_response", "assistant"], kinds
    assert [v["name"] for k, v in ours["turns"] if k == "tool_call"] == ["git-git_log", "time-convert_time"]
    assert {t["name"] for t in ours["tools"]} >= {"git-git_log", "time-convert_time"}
    assert "finish" not in {t["name"] for t in ours["tools"]} and "finish accepted" not in row["messages"]
    assert ours["turns"][-1][1] == toucan_trajectory.final_answer.strip()
    assert row["target_tools"] == "git_log, convert_time" and ours["desired_tools_used"] == 1.0
    assert row["subset_name"] == "single-turn-original" and len(row["uuid"]) == 36
    rqa = ours["response_quality_assessment"]
    assert rqa["completeness"]["score"] == 5 and rqa["conciseness"]["score"] == 4 and rqa["overall_score"] == 4.5
    assert (rqa["desired_tools_used_percentage"], rqa["order_correctness"]) == (1.0, True)
    assert ours["question_quality_assessment"]["verifiable"]["score"] == 5
    servers = {s["server_name"]: [t["name"] for t in s["remote_server_response"]["tools"]]
               for s in ours["metadata"]["mcp_servers"]}
    # Toucan's converter names a tool server_name.lower().replace(" ", "-") + "-" + name: the same names
    assert {f"{s.lower().replace(' ', '-')}-{n}" for s, tools in servers.items() for n in tools} == {
        t["name"] for t in ours["tools"]}
    # a re-export gives the same row (the uuid comes from the content, not from the run)
    assert export("toucan", [toucan_trajectory.pk])[1] == [row]


def test_toucan_without_a_judge_review_or_a_pipeline_assessment_writes_empty_strings(toucan_trajectory: Any) -> None:
    from apps.reviews.models import Review

    Review.objects.filter(trajectory=toucan_trajectory).delete()
    toucan_trajectory.task.scene_config = COMMIT["config"]
    toucan_trajectory.task.save(update_fields=["scene_config"])
    _, [row] = export("toucan", [toucan_trajectory.pk])
    assert validate_line("toucan", row) == []
    assert (row["question_quality_assessment"], row["response_quality_assessment"]) == ("", "")
    assert json.loads(row["metadata"])["tool_call_accuracy"] == {"desired_tools_used_percentage": 1.0,
                                                                 "order_correctness": True}
    assert load_toucan(row)["question_quality_assessment"] is None


def test_the_toucan_validator_holds_real_rows_and_rejects_ours_broken(toucan_trajectory: Any) -> None:
    for r in anchor_rows("toucan_rows.jsonl"):  # projections: only the five columns left out are missing
        assert sorted(validate_line("toucan", r)) == sorted(
            f"line.{k}: missing" for k in TOUCAN_KEYS if k not in r), r["uuid"]
    _, [row] = export("toucan", [toucan_trajectory.pk])
    messages = json.loads(row["messages"])
    for mutate, problem in [
        (lambda r: r.update(messages=messages), "line.messages: must be a string"),
        (lambda r: r.update(target_tools="git_push"), "not among available_tools: git_push"),
        (lambda r: r.update(question="another question"), "must be the first user message"),
        (lambda r: r.update(uuid="7"), "line.uuid: must be a UUID"),
        (lambda r: r.update(subset_name="mine"), "line.subset_name"),
        (lambda r: r.update(response_quality_assessment="{"), "not JSON text"),
        (lambda r: r.update(messages=json.dumps(messages[:-1])), "must end on the assistant's answer"),
        (lambda r: r.update(messages=json.dumps([*messages[:-1], {"role": "tool", "content": "x"}])), "role"),
        (lambda r: r.pop("metadata"), "line.metadata: missing"),
    ]:
        bad = dict(row)
        mutate(bad)
        assert any(problem in p for p in validate_line("toucan", bad)), (problem, validate_line("toucan", bad))


# -- toolace ------------------------------------------------------------------------------------


def test_toolace_rows_load_like_the_released_row(lunch: Any) -> None:  # noqa: F811
    [real] = anchor_rows("toolace_rows.json")
    assert validate_line("toolace", real) == []
    theirs = load_toolace(real)
    assert [c["name"] for m in theirs["messages"] for c in m.get("tool_calls", [])] == [
        "GetCompetitions", "Get Manager Placeholder Image"]
    result, [row] = export("toolace", [lunch.pk])
    assert result.excluded == [] and validate_line("toolace", row) == []
    assert set(row) == set(real) and _types(row) == _types(real)
    ours = load_toolace(row)
    # ToolACE's function shape and words: parameters of type dict, ToolACE's types, required: null
    assert {k for t in ours["tools"] for k in t} == {k for t in theirs["tools"] for k in t}
    assert all(t["parameters"]["type"] == "dict" and t["required"] is None for t in ours["tools"])
    types = {p["type"] for t in ours["tools"] for p in t["parameters"]["properties"].values()}
    assert types <= {"string", "int", "float", "boolean", "array", "dict"} and "float" in types, types
    # the system prompt is ToolACE's own text around the function list
    real_head, real_tail = real["system"].split(json.dumps(tools_of(real["system"]), ensure_ascii=False))
    head, tail = row["system"].split(json.dumps(tools_of(row["system"]), ensure_ascii=False))
    assert (head, tail) == (real_head, real_tail)
    assert [m["role"] for m in ours["messages"]][-2:] == ["tool", "assistant"]


def test_toolace_keeps_tool_names_with_spaces(lunch: Any) -> None:  # noqa: F811
    """The real lunch episode with its tool renamed as ToolACE's tools are named ("Add Expense")."""
    rename = {"add_expense": "Add Expense"}
    messages = json.loads(json.dumps(lunch.messages))
    for m in messages:
        for call in m.get("tool_calls") or []:
            call["function"]["name"] = rename.get(call["function"]["name"], call["function"]["name"])
        if m.get("name"):
            m["name"] = rename.get(m["name"], m["name"])
    tools = [{**t, "function": {**t["function"], "name": rename.get(t["function"]["name"], t["function"]["name"])}}
             for t in lunch.tools]
    steps = [{**s, "tool": rename.get(s.get("tool"), s.get("tool"))} for s in lunch.steps]
    renamed = make_trajectory(lunch.task, messages=messages, tools=tools, steps=steps, final_answer=lunch.final_answer,
                              verifier_output=lunch.verifier_output, sample_index=1)
    result, [row] = export("toolace", [renamed.pk])
    assert result.excluded == [] and validate_line("toolace", row) == []
    calls = [t["value"] for t in row["conversations"] if t["value"].startswith("[Add Expense(")]
    assert calls == ['[Add Expense(report_id="R-7", category="meals", amount=23.4, date="2026-11-21")]']
    assert parse_calls(calls[0]) == [("Add Expense", {"report_id": "R-7", "category": "meals", "amount": 23.4,
                                                      "date": "2026-11-21"})]
    assert "Add Expense" in {t["name"] for t in load_toolace(row)["tools"]}


def test_bracket_calls_with_names_toolace_uses_round_trip_and_names_that_cannot_are_refused() -> None:
    calls = [("Market Trends API", {"trend_type": "MOST_ACTIVE", "country": "us"}), ("GetCompetitions", {}),
             ("f", {"a": [1, ")"], "b": {"k": "(x, y)"}})]
    assert parse_calls(render_calls(calls)) == calls
    assert parse_calls('[Get Manager Placeholder Image(sport="football")]') == [
        ("Get Manager Placeholder Image", {"sport": "football"})]
    for not_calls in ('[a, b(x=1)]', '[f(a=1) g()]', '[f(a=1),]', '["quoted"(a=1)]', '[x=(a=1)]'):
        assert parse_calls(not_calls) is None, not_calls


# -- aitw (the real rows; ours in tests/engines/test_mobile_export.py) ---------------------------------


def test_the_real_aitw_rows_pass_our_validator_and_load() -> None:
    real = anchor_rows("aitw_rows.json")
    for r in real:
        assert {k: type(v) for k, v in r.items()} == AITW_FEATURES
        assert validate_line("aitw", r) == [], r["step_id"]
    [steps] = load_aitw(real).values()
    assert [s["action"] for s in steps] == ["DUAL_POINT", "DUAL_POINT"] and steps[0]["gesture"] == "tap"
    broken = {**real[0], "results/action_type": 8}
    assert any("not one of AitW's action types" in p for p in validate_line("aitw", broken))
    assert any("unexpected field" in p for p in validate_line("aitw", {**real[0], "steps": []}))
