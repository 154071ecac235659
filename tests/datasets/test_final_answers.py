"""Final answers as answers (issue 38 item 1), on episodes the real agent loop played with the offline
model: a code_exec episode with native tool calls and one in JSON-text tool mode, the toolace demo's
clarification (ask_user) and multi-turn episodes, and a multi_agent team. In the default mode no line of
any chat format holds a finish call, a finish tool or the loop's acknowledgement; with final_answer tool
they are kept; an option a format does not take is refused by name before anything is written (command,
API, console); a job keeps its options and writes what the card counted."""
from __future__ import annotations

import io
import json
import re
from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import CommandError, call_command

from apps.datasets.exporters import FORMATS, check_options, export_records, load_records, validate_line
from apps.datasets.exporters.answers import FINISH_ACK, NOT_EXECUTED
from apps.datasets.exporters.formats import split_thought
from apps.datasets.exporters.toolace import TOOLS_ANCHOR, parse_calls, tools_of
from apps.datasets.jobs import export_run
from apps.datasets.models import ExportJob
from apps.datasets.services import dataset_version_create
from apps.tasks.models import Trajectory
from tests.datasets.exporter_data import make_review, make_trajectory
from tests.datasets.version_data import export_dir, no_dedup  # noqa: F401 (export_dir is a fixture)
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import HELLO, HELLO_STEPS, call, canned, config_for, llm_env, run, scripted  # noqa: F401
from tests.engines.test_multi_agent import _stored_episode
from tests.engines.test_toolace import demo_task, solve
from tests.datasets.test_vision_export import episodes  # noqa: F401 (fixture: a real gui vision episode)
from tests.engines.test_gui import artifact_root  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]
TOOLACE = ("expense-reports.items.lunch", "calendar-email.schedule.budget")  # ask_user; a follow-up request
_played: dict[str, Any] = {}  # the real loop's episodes, played once for the module


def _store(task: Any, result: Any, **fields: Any) -> Trajectory:
    values = dict(messages=result.messages, tools=result.tools, steps=result.steps, final_answer=result.final_answer,
                  verifier_output=result.verifier_output, reward=result.reward, outcome=result.outcome)
    return make_trajectory(task, **{**values, **fields})


# tool_mode json: the model writes its actions as JSON in its text (no tools are sent)
JSON_REPLIES = (
    {"content": 'Writing.\n```json\n{"tool": "write_file", "arguments": {"path": "hello.txt", "content": "hello"}}\n```'},
    {"content": 'Done.\n{"tool": "finish", "arguments": {"answer": "hello.txt written"}}'},
)


def _hello(key: str, steps: tuple[Any, ...] = HELLO_STEPS) -> Any:
    if key not in _played:
        if key == "json":
            with canned(*JSON_REPLIES) as (_server, llm):
                _played[key] = run(config_for(HELLO, tool_mode="json"), llm)
        else:
            with scripted(HELLO, *steps) as (_server, llm):
                _played[key] = run(config_for(HELLO), llm)
        assert _played[key].outcome == "success", _played[key].outcome_reason
    return _played[key]


@pytest.fixture
def loop_ids(make_task: Any) -> dict[str, int]:
    """The real loop's episodes, stored: code_exec (native tool calls; a second rollout of the task that
    stored as failed, so the preference formats pair them; JSON-text tool mode), toolace's clarification
    and follow-up, and a multi_agent team."""
    ids: dict[str, int] = {}
    task = make_task(prompt=HELLO, external_id="hello")
    ids["native"] = _store(task, _hello("native"), reward=1.0).pk
    other = (call("write_file", "Write it.", path="hello.txt", content="bye\n"), call("finish", answer="gave up"))
    ids["native-failed"] = _store(task, _hello("failed", other), sample_index=1, outcome="failure", reward=0.0).pk
    ids["json"] = _store(make_task(prompt=HELLO, external_id="hello-json"), _hello("json")).pk
    for key in TOOLACE:
        config, solution = demo_task(key)
        if key not in _played:
            _played[key] = solve(config, solution)
        ids[key] = _store(make_task(scene="toolace", prompt=config["prompt"], scene_config=config["scene_config"],
                                    external_id=key), _played[key]).pk
    ids["multi_agent"] = _stored_episode(make_task).pk
    for n, pk in enumerate(ids.values()):
        make_review(Trajectory.objects.get(pk=pk), overall=60 + n)  # reward-score's score
    return ids


def export(fmt: str, ids: list[int], **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    buf = io.BytesIO()
    result = export_records(fmt, load_records(ids), buf, options=options or None)
    return result, [orjson.loads(line) for line in buf.getvalue().splitlines()]


def finish_traces(value: Any, where: str = "line") -> list[str]:
    """Where a line holds a finish call, a finish tool or the loop's acknowledgement, looking inside
    the JSON text a format embeds (sharegpt's tools and calls, toucan's columns, verl's tools), a
    thought's wrapping, ToolACE's bracket calls and the tools of its system prompt."""
    found: list[str] = []
    if isinstance(value, dict):
        if value.get("name") == "finish" or value.get("tool") == "finish":
            found.append(where)
        for key, item in value.items():
            found += finish_traces(item, f"{where}.{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            found += finish_traces(item, f"{where}[{n}]")
    elif isinstance(value, str):
        if FINISH_ACK in value or NOT_EXECUTED in value:
            found.append(f"{where}: the acknowledgement")
        if TOOLS_ANCHOR in value:
            found += finish_traces(tools_of(value), f"{where} (tools)")
        for n, block in enumerate(re.findall(r"<tool_call>\n(.*?)\n</tool_call>", value, re.S)):  # alpaca's calls
            found += finish_traces(orjson.loads(block), f"{where} <tool_call> {n}")
        body = split_thought(value)[1].strip()
        if body[:1] in "[{":
            try:
                found += finish_traces(orjson.loads(body), f"{where} (JSON)")
            except orjson.JSONDecodeError:
                found += [f"{where} (call)" for name, _ in parse_calls(body) or [] if name == "finish"]
    return found


def _chat_formats(final_answer: str) -> list[str]:
    return [f for f, e in FORMATS.items() if final_answer in e.final_answers]


def test_no_default_chat_line_holds_a_finish_call_a_finish_tool_or_the_acknowledgement(
        loop_ids: dict[str, int]) -> None:
    ids = list(loop_ids.values())
    for fmt in _chat_formats("text"):
        result, lines = export(fmt, ids)
        if fmt not in ("qa-verl", "sft-openai-vision", "sharegpt-vision", "trl-vision"):  # other scenes' formats
            assert lines, (fmt, result.excluded)
        for line in lines:
            assert validate_line(fmt, line) == [], fmt
            assert finish_traces(line) == [], (fmt, finish_traces(line))
        assert not any("did not accept" in e["reason"] or "gave no answer" in e["reason"] for e in result.excluded), (
            fmt, result.excluded)
    # the raw record keeps the episode as it ran
    _, [raw] = export("raw", [loop_ids["native"]])
    assert raw["messages"][-1]["content"] == FINISH_ACK and finish_traces(raw)


def test_a_real_vision_episode_ends_on_its_answer_in_the_vision_formats(episodes: list[int]) -> None:  # noqa: F811
    """The gui loop's MiniWoB++ episode (chromium, screenshots in the artifact store), as run and text-only."""
    for fmt in ("sft-openai-vision", "sharegpt-vision", "trl-vision", "sft-openai", "sharegpt"):
        result, lines = export(fmt, episodes, images="base64")
        assert len(lines) == 2, (fmt, result.excluded)
        for line in lines:
            assert validate_line(fmt, line) == [] and finish_traces(line) == [], (fmt, finish_traces(line))
        _, tool = export(fmt, episodes, images="base64", final_answer="tool")
        assert len(tool) == 2 and all(finish_traces(line) for line in tool), fmt
    _, [openai, _] = export("sft-openai-vision", episodes, images="base64")
    answer = Trajectory.objects.get(pk=episodes[0]).final_answer
    assert openai["messages"][-1] == {"role": "assistant", "content": answer}


def test_the_answer_is_the_last_assistant_message_with_its_thought_where_the_format_has_a_place(
        loop_ids: dict[str, int]) -> None:
    native = Trajectory.objects.get(pk=loop_ids["native"])
    _, [openai] = export("sft-openai", [native.pk])
    assert openai["messages"][-1] == {"role": "assistant", "content": native.final_answer}
    assert [m["role"] for m in openai["messages"]][-3:] == ["assistant", "tool", "assistant"]
    _, [trl] = export("sft-trl", [native.pk])
    assert trl["messages"][-1] == {"role": "assistant", "content": native.final_answer, "reasoning_content": "Done."}
    _, [sharegpt] = export("sharegpt", [native.pk])
    assert sharegpt["conversations"][-1] == {"from": "gpt", "value": f"<think>\nDone.\n</think>\n\n{native.final_answer}"}
    _, [rl] = export("rl", [native.pk])
    assert [s["tool"] for s in rl["steps"]] == ["write_file", "run_shell"] and rl["final_answer"] == native.final_answer
    # JSON-text tool mode: the action in the text and its "[finish result]" user message become the answer
    json_mode = Trajectory.objects.get(pk=loop_ids["json"])
    assert json_mode.messages[-1]["content"] == f"[finish result]\n{FINISH_ACK}"
    _, [text] = export("sft-openai", [json_mode.pk])
    assert text["messages"][-1] == {"role": "assistant", "content": json_mode.final_answer}
    assert not any(m["role"] == "user" and "[finish result]" in m["content"] for m in text["messages"])


def test_a_clarification_is_the_assistant_asking_and_the_user_answering_then_the_answer(
        loop_ids: dict[str, int]) -> None:
    lunch = Trajectory.objects.get(pk=loop_ids[TOOLACE[0]])
    _, [openai] = export("sft-openai", [lunch.pk])
    roles = [m["role"] for m in openai["messages"]]
    assert roles[:5] == ["system", "user", "assistant", "user", "assistant"] and roles[-1] == "assistant"
    assert "tool_calls" not in openai["messages"][2] and openai["messages"][3]["content"] == "The amount is 23.4."
    assert openai["messages"][-1]["content"] == lunch.final_answer
    assert {t["function"]["name"] for t in openai["tools"]}.isdisjoint({"ask_user", "finish"})
    # a follow-up request: the first finish is the answer before the user's next turn, the last ends it
    budget = Trajectory.objects.get(pk=loop_ids[TOOLACE[1]])
    _, [trl] = export("sft-trl", [budget.pk])
    users = [i for i, m in enumerate(trl["messages"]) if m["role"] == "user"]
    assert len(users) == 2 and trl["messages"][users[1] - 1] == {"role": "assistant",
                                                                 "content": "Budget review is booked."}
    assert trl["messages"][-1]["content"] == budget.final_answer


def test_final_answer_tool_keeps_the_finish_call_its_acknowledgement_and_the_tool(loop_ids: dict[str, int]) -> None:
    ids = list(loop_ids.values())
    for fmt in _chat_formats("tool"):
        result, lines = export(fmt, ids, final_answer="tool")
        if not lines:
            assert fmt in ("qa-verl", "sft-openai-vision", "sharegpt-vision", "trl-vision"), (fmt, result.excluded)
            continue
        assert all(validate_line(fmt, line) == [] for line in lines), fmt
        assert any(finish_traces(line) for line in lines), fmt
    _, [openai] = export("sft-openai", [loop_ids["native"]], final_answer="tool")
    assert openai["messages"][-2]["tool_calls"][0]["function"]["name"] == "finish"
    assert openai["messages"][-1] == {"role": "tool", "tool_call_id": openai["messages"][-2]["tool_calls"][0]["id"],
                                      "content": FINISH_ACK}  # the loop's own text, as answers.FINISH_ACK has it
    assert "finish" in {t["function"]["name"] for t in openai["tools"]}


def test_an_option_a_format_does_not_take_is_refused_by_name() -> None:
    for fmt in ("raw", "atif", "adp", "mini-swe-agent", "qa", "aitw"):
        with pytest.raises(ValueError, match=rf"^final_answer: {fmt} does not take this option"):
            check_options(fmt, {"final_answer": "text"})
    for fmt in ("toucan", "toolace"):
        with pytest.raises(ValueError, match=rf"^final_answer: {fmt} writes the final answer as text only"):
            export_records(fmt, iter(()), io.BytesIO(), options={"final_answer": "tool"})
    with pytest.raises(ValueError, match=r"^final_answer: one of text, tool$"):
        check_options("sft-trl", {"final_answer": "json"})
    assert check_options("sft-trl", None)["final_answer"] == "text" and check_options("raw", None)["final_answer"] is None


def test_every_door_refuses_a_bad_final_answer_before_any_write_and_a_job_keeps_its_options(
        loop_ids: dict[str, int], approver: Any, client: Any, tmp_path: Path, export_dir: Path) -> None:  # noqa: F811
    from rest_framework.test import APIClient

    version = dataset_version_create(dataset_name="answers", actor=approver, filter_spec=no_dedup(
        validation_fraction=0))
    section = version.data_card["exportability"]
    stats = StringIO()
    call_command("dataset_stats", "answers", stdout=stats)
    [tool_line] = [line for line in stats.getvalue().splitlines() if "with final_answer tool" in line]
    assert f" sft-trl {section['final_answer']['tool']['sft-trl']}," in tool_line
    out = tmp_path / "raw.jsonl"
    with pytest.raises(CommandError, match=r"final_answer: raw does not take this option"):
        call_command("dataset_export", "answers", "--format", "raw", "--final-answer", "tool", "--out", str(out),
                     "--no-progress", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError, match=r"final_answer: toucan writes the final answer as text only"):
        call_command("dataset_export", "answers", "--format", "toucan", "--final-answer", "tool", "--out", str(out),
                     "--no-progress", stdout=StringIO(), stderr=StringIO())
    api = APIClient()
    api.force_authenticate(approver)
    url = f"/api/v1/datasets/answers/versions/{version.number}/exports"
    refused = api.post(url, {"format": "raw", "final_answer": "tool"}, format="json")
    assert refused.status_code == 400
    [message] = refused.json()["error"]["details"]["fields"]["final_answer"]
    assert message.startswith("final_answer: raw does not take this option")
    assert api.post(url, {"format": "sft-trl", "final_answer": "json"}, format="json").status_code == 400
    client.force_login(approver)
    page = client.post(f"/datasets/answers/v{version.number}/export/",
                       {"format": "toolace", "split": "all", "final_answer": "tool"}, follow=True).content.decode()
    assert "final_answer: toolace writes the final answer as text only" in page
    assert not ExportJob.objects.exists() and not out.exists() and not any(export_dir.rglob("*.jsonl"))

    # the console offers the choice; the tool form is a file of its own, counted on the card
    form = client.get(f"/datasets/answers/v{version.number}/").content.decode().split('id="export-form"')[1]
    assert '<select name="final_answer"' in form and '<option value="tool">' in form
    for final_answer in (None, "tool"):
        body = {"format": "sft-trl"} | ({"final_answer": final_answer} if final_answer else {})
        started = api.post(url, body, format="json")
        assert started.status_code == 202, started.json()
        assert started.json()["final_answer"] == final_answer
        job = export_run(started.json()["id"])
        assert job is not None and job.status == "done", job and job.error
        assert Path(job.path).name == ("sft-trl-all.final-tool.jsonl" if final_answer else "sft-trl-all.jsonl")
        lines = [json.loads(line) for line in Path(job.path).read_text(encoding="utf-8").splitlines()]
        counted = section["final_answer"]["tool"]["sft-trl"] if final_answer else section["formats"]["sft-trl"][
            "lines"]["all"]
        assert len(lines) == job.lines == counted
        assert bool(any(finish_traces(line) for line in lines)) is bool(final_answer)
        assert job.options == ({"final_answer": "tool"} if final_answer else {})
    page = client.get(f"/datasets/answers/v{version.number}/").content.decode()
    assert "final answer: tool</span>" in page  # the exports table marks the tool form
    row = page.split('<tr data-format="sft-trl">')[1].split("</tr>")[0]  # the card's table counts the tool form
    assert row.endswith(f"<td>{section['final_answer']['tool']['sft-trl']}</td>")
    assert page.split('<tr data-format="raw">')[1].split("</tr>")[0].endswith("<td>-</td>")
    explicit = api.post(url, {"format": "sft-trl", "final_answer": "text"}, format="json").json()
    assert explicit["final_answer"] is None and re.search(r"/sft-trl-all\.jsonl$", ExportJob.objects.get(
        pk=explicit["id"]).path)  # the format's default: the same file as without the option
