"""ask_user turns in every chat format, and the `toolace` format (ToolACE's row, bracket-syntax calls
parsed back), on a trajectory the real loop produced (the demo's missing-parameter task)."""
from __future__ import annotations

import io
import json
from typing import Any

import orjson
import pytest

from apps.datasets.exporters import export_records, load_records, validate_line
from apps.datasets.exporters.toolace import parse_calls, render_calls, tools_of
from tests.datasets.exporter_data import make_trajectory
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import llm_env  # noqa: F401 - a fixture
from tests.engines.test_toolace import demo_task, solve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]
QUESTION = "The amount is missing.\n\nWhat amount should I enter for the lunch?"
CALL = '[add_expense(report_id="R-7", category="meals", amount=23.4, date="2026-11-21")]'


def export(fmt: str, ids: list[int], **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    buf = io.BytesIO()
    result = export_records(fmt, load_records(ids), buf, options=options or None)
    return result, [orjson.loads(line) for line in buf.getvalue().splitlines()]


_episodes: dict[str, Any] = {}  # one real episode for the module's tests (each stores it anew)


@pytest.fixture
def lunch(make_task: Any) -> Any:
    """The lunch task's trajectory as the real loop wrote it, stored."""
    config, solution = demo_task("expense-reports.items.lunch")
    if "lunch" not in _episodes:
        _episodes["lunch"] = solve(config, solution)
    result = _episodes["lunch"]
    assert result.reward == 1.0, result.outcome_reason
    task = make_task(scene="toolace", prompt=config["prompt"], scene_config=config["scene_config"])
    return make_trajectory(task, messages=result.messages, tools=result.tools, steps=result.steps,
                           final_answer=result.final_answer, verifier_output=result.verifier_output)


def test_ask_user_is_an_assistant_question_and_a_user_reply_in_every_chat_format(lunch: Any) -> None:
    for fmt in ("sft-openai", "sft-trl", "sharegpt", "rl", "toucan", "toolace", "kto-trl"):
        result, lines = export(fmt, [lunch.pk])
        assert result.lines == 1 and validate_line(fmt, lines[0]) == [], (fmt, result.excluded)
        # no tool and no call of that name in the conversation (the system prompt may mention it; the rl
        # record's per-step summary keeps the platform's step)
        text = json.dumps({k: v for k, v in lines[0].items() if k not in ("steps", "step_success", "verifier_output")})
        assert '"ask_user"' not in text and '\\"ask_user\\"' not in text, fmt
    _, [openai] = export("sft-openai", [lunch.pk])
    messages = openai["messages"]
    assert [m["role"] for m in messages[:5]] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2] == {"role": "assistant", "content": QUESTION}
    assert messages[3] == {"role": "user", "content": "The amount is 23.4."}
    _, [sharegpt] = export("sharegpt", [lunch.pk])
    turns = sharegpt["conversations"]
    assert [t["from"] for t in turns[:4]] == ["human", "gpt", "human", "function_call"]
    assert turns[2]["value"] == "The amount is 23.4."
    _, [raw] = export("raw", [lunch.pk])  # the lossless record keeps the tool call
    assert raw["steps"][0]["tool"] == "ask_user" and raw["steps"][0]["simulated_user"] is True


def test_a_follow_up_request_is_a_human_turn_after_the_models_answer(make_task: Any) -> None:
    config, solution = demo_task("calendar-email.schedule.budget")
    if "budget" not in _episodes:
        _episodes["budget"] = solve(config, solution)
    result = _episodes["budget"]
    task = make_task(scene="toolace", prompt=config["prompt"], scene_config=config["scene_config"])
    stored = make_trajectory(task, messages=result.messages, tools=result.tools, steps=result.steps,
                             final_answer=result.final_answer)
    _, [sharegpt] = export("sharegpt", [stored.pk])
    assert validate_line("sharegpt", sharegpt) == []
    # final_answer text: each finish is the model's answer, the user's follow-up the next human turn
    assert [t["from"] for t in sharegpt["conversations"]] == [
        "human", "function_call", "observation", "gpt", "human", "function_call", "observation", "gpt"]
    assert sharegpt["conversations"][3:5] == [{"from": "gpt", "value": "Budget review is booked."},
                                              {"from": "human", "value": "Thanks. What else is on my calendar that day?"}]
    assert sharegpt["conversations"][-1]["value"].endswith(result.final_answer) and result.final_answer
    _, [tool] = export("sharegpt", [stored.pk], final_answer="tool")  # ShareGPT's tool form: the first finish
    assert [t["from"] for t in tool["conversations"]] == [  # answers (a human turn cannot follow an observation)
        "human", "function_call", "observation", "gpt", "human", "function_call", "observation", "function_call"]
    _, [row] = export("toolace", [stored.pk])
    assert validate_line("toolace", row) == []
    assert [t["from"] for t in row["conversations"]] == [
        "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"]


def test_the_toolace_row_has_tools_in_the_system_prompt_and_bracket_calls_that_parse_back(lunch: Any) -> None:
    result, [row] = export("toolace", [lunch.pk])
    assert result.lines == 1 and validate_line("toolace", row) == []
    assert [t["name"] for t in tools_of(row["system"])] == [
        "create_report", "add_expense", "get_report", "list_reports", "submit_report"]
    assert row["conversations"] == [
        {"from": "user", "value": lunch.task.prompt},
        {"from": "assistant", "value": QUESTION},
        {"from": "user", "value": "The amount is 23.4."},
        {"from": "assistant", "value": CALL},
        {"from": "tool", "value": '[{"name": "add_expense", "results": {"report_id": "R-7", "items": 3, "total": 109.9}}]'},
        {"from": "assistant", "value": "Added the 23.4 lunch to R-7."},
    ]
    assert parse_calls(CALL) == [("add_expense", {"report_id": "R-7", "category": "meals", "amount": 23.4,
                                                  "date": "2026-11-21"})]


def test_bracket_syntax_round_trips_nested_values_and_refuses_what_is_not_a_call_list() -> None:
    calls = [("f", {"a": 1, "b": "x \"q\" é\n", "c": [True, None, 2.5], "d": {"k": [1, {"z": False}]}}), ("g", {})]
    text = render_calls(calls)
    assert text == '[f(a=1, b="x \\"q\\" é\\n", c=[True, None, 2.5], d={"k": [1, {"z": False}]}), g()]'
    assert parse_calls(text) == calls
    for not_calls in ("[1, 2]", "The answer is [f(a=1)]", "[f(1)]", "[f(a=__import__('os'))]", "[]", "[f(**x)]"):
        assert parse_calls(not_calls) is None, not_calls


@pytest.mark.parametrize("mutate, expected", [
    (lambda row: row["conversations"][3].update(value='[add_expense(report_id="R-7", amount=23.4'),
     "a tool turn must follow the assistant's calls"),
    (lambda row: row["conversations"][3].update(value='[refund(report_id="R-7")]'),
     "calls functions not in the system prompt: refund"),
    (lambda row: row["conversations"][3].update(value="[add_expense(report_id='R-7')]"),
     "do not round-trip"),
    (lambda row: row.update(system="no tools here"), "must embed the function list"),
    (lambda row: row["conversations"].pop(), "must end with the assistant"),
])
def test_the_toolace_validator_rejects_broken_rows(lunch: Any, mutate: Any, expected: str) -> None:
    _, [row] = export("toolace", [lunch.pk])
    mutate(row)
    assert any(expected in p for p in validate_line("toolace", row)), validate_line("toolace", row)
