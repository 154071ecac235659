"""The template check on templates nobody here wrote: the tool chat templates vLLM ships
(tests/datasets/chat_templates/vllm/, sources in its SOURCES.md), on sft-trl lines of episodes the real
agent loop played (code_exec with the scripted model, the toolace demo's tasks with the offline model)
and the rich episode. What each template must report is derived from the lines' shapes and what the
template's source does with them, so every "missing" a template gets is checked to be true, and a
template that renders everything passes."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from django.core.management import CommandError, call_command

from apps.datasets import templates
from apps.datasets.exporters import export_records, load_records
from tests.datasets.exporter_data import make_trajectory
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import HELLO, HELLO_STEPS, config_for, llm_env, run, scripted  # noqa: F401
from tests.engines.test_toolace import demo_task, solve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

VLLM = Path(__file__).parent / "chat_templates" / "vllm"
TASKS = ("expense-reports.items.lunch", "expense-reports.items.supplies", "calendar-email.mail.offsite",
         "calendar-email.schedule.budget")
_episodes: dict[str, Any] = {}  # the real loop's episodes, played once for the module


@pytest.fixture
def lines_file(make_task: Any, tmp_path: Path) -> Path:
    """sft-trl lines: the rich episode, a code_exec episode and four toolace episodes of the real loop."""
    ids = [make_trajectory(make_task(prompt="Écris primes.py ✓")).pk]
    if "hello" not in _episodes:
        with scripted(HELLO, *HELLO_STEPS) as (_server, llm):
            _episodes["hello"] = run(config_for(HELLO), llm)
    for key in TASKS:
        if key not in _episodes:
            _episodes[key] = solve(*demo_task(key))
    for key, result in _episodes.items():
        assert result.outcome == "success", (key, result.outcome_reason)
        config = demo_task(key)[0] if key in TASKS else config_for(HELLO)
        task = make_task(scene=config["scene"], prompt=config["prompt"], scene_config=config["scene_config"],
                         external_id=key)
        ids.append(make_trajectory(task, messages=result.messages, tools=result.tools, steps=result.steps,
                                   final_answer=result.final_answer, outcome=result.outcome).pk)
    path = tmp_path / "sft-trl.jsonl"
    with path.open("wb") as fp:
        result = export_records("sft-trl", load_records(ids), fp)
    assert result.lines == 6, result.excluded
    return path


def vllm(name: str) -> templates.ChatTemplate:
    return templates.load_template(str(VLLM / f"tool_chat_template_{name}.jinja"))


# --- what the lines hold, read off the lines ------------------------------------------------------

def parallel_calls(line: dict[str, Any]) -> bool:
    return any(len(m.get("tool_calls") or []) > 1 for m in line["messages"])


def text_beside_calls(line: dict[str, Any]) -> list[int]:
    return [i for i, m in enumerate(line["messages"]) if m.get("tool_calls") and (m.get("content") or "").strip()]


def without_content_key(line: dict[str, Any]) -> bool:
    return any("content" not in m for m in line["messages"])


def users_not_alternating(line: dict[str, Any]) -> bool:
    """Mistral's parallel template: after the system message, the messages that are neither tool
    results nor tool calls must go user, assistant, user, ..."""
    rest = [m for m in line["messages"][1:] if m["role"] != "tool" and "tool_calls" not in m]
    return any((m["role"] == "user") != (n % 2 == 0) for n, m in enumerate(rest))


def calls(line: dict[str, Any]) -> list[tuple[int, int]]:
    return [(i, j) for i, m in enumerate(line["messages"]) for j, _ in enumerate(m.get("tool_calls") or [])]


# --- per template: (the record's expected problems or error, the template's properties) -----------

Expect = Callable[[dict[str, Any]], Any]
RENDERS_ALL: Expect = lambda line: []  # noqa: E731


def refuses_parallel(line: dict[str, Any]) -> Any:
    return "TemplateError: This model only supports single tool-calls at once!" if parallel_calls(line) else []


def deepseek(line: dict[str, Any]) -> Any:
    # `message['content'] is none` on a tool-call turn: sft-trl leaves out a content the turn never had.
    return "UndefinedError: 'dict object' has no attribute 'content'" if without_content_key(line) else []


def mistral(line: dict[str, Any]) -> Any:
    # No branch for the system message; a tool-call turn is written '[TOOL_CALLS]' + its text, the calls not at all.
    # The tool list goes before the last user message, so the turns before it join (templates.turns) and a call
    # name there is found in the tool list: only the calls after the last user message are sure to be reported.
    last_user = max(i for i, m in enumerate(line["messages"]) if m["role"] == "user")
    names = [f"messages: messages[{i}] tool call {j} name" for i, j in calls(line) if i > last_user]
    return ["messages: messages[0] (system) content is missing from the rendered text", *names], \
        [f"messages: messages[{i}] tool call {j} " for i, j in calls(line)]


def mistral_parallel(line: dict[str, Any]) -> Any:
    if users_not_alternating(line):
        return "TemplateError: After the optional system message, conversation roles must alternate " \
               "user/assistant/user/assistant/..."
    # The system message is written only into a last message that is the user's.
    return ["messages: messages[0] (system) content is missing from the rendered text"]


def phi4_mini(line: dict[str, Any]) -> Any:
    # `{% elif message.tool_calls %}`: a turn with text has its text written and its calls dropped.
    return [f"messages: messages[{i}] tool call {j} name" for i, j in calls(line) if i in text_beside_calls(line)]


TEXT = templates.TEXT_ON_CALL_TURNS
CASES: dict[str, tuple[Expect, set[str]]] = {
    "hermes": (RENDERS_ALL, {TEXT}),  # arguments before the name, results through tojson
    "granite": (RENDERS_ALL, {TEXT}),
    "toolace": (RENDERS_ALL, {TEXT}),  # calls in bracket syntax, values through "%sr" | format
    "internlm2_tool": (RENDERS_ALL, set()),  # arguments through |string: Python's repr
    "hunyuan_a13b": (RENDERS_ALL, set()),  # prints the clock (strftime_now) into the first turn
    "llama4_json": (RENDERS_ALL, set()),
    "qwen3coder": (RENDERS_ALL, set()),  # one <parameter=...> block per argument
    "llama3.1_json": (refuses_parallel, {TEXT}),
    "llama3.2_json": (refuses_parallel, {TEXT}),
    "deepseekv3": (deepseek, set()),
    "mistral": (mistral, set()),
    "mistral_parallel": (mistral_parallel, {TEXT}),
    "phi4_mini": (phi4_mini, set()),
}


def test_every_vllm_tool_template_is_covered() -> None:
    assert {p.name.removeprefix("tool_chat_template_").removesuffix(".jinja") for p in VLLM.glob("*.jinja")} \
        == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_vllm_template_reports_exactly_what_it_drops(name: str, lines_file: Path) -> None:
    expect, properties = CASES[name]
    lines = [orjson.loads(raw) for raw in lines_file.read_bytes().splitlines()]
    report = templates.check_file(lines_file, "sft-trl", vllm(name))
    for line, record in zip(lines, report.records):
        expected = expect(line)
        if isinstance(expected, str):
            assert record.render_error == expected and len(record.problems) == 1, (record.line, record.problems)
            continue
        # Every expected problem is reported, and nothing else but what the dropped calls hold.
        expected, allowed = expected if isinstance(expected, tuple) else (expected, [])
        for prefix in expected:
            assert any(p.startswith(prefix) for p in record.problems), (record.line, prefix, record.problems)
        allowed = tuple(expected) + tuple(allowed) + tuple(f"{p.removesuffix(' name')} (" for p in expected
                                                           if p.endswith(" name"))
        unexplained = [p for p in record.problems if not p.startswith(allowed)]
        assert unexplained == [], (name, record.line, unexplained)
    reasoning = sum(1 for line in lines for m in line["messages"] if m.get("reasoning_content"))
    summary = report.summary()
    found = {p["property"] for p in summary["properties"]}
    # None of these templates has a reasoning field: each turn's reasoning_content is the template's property.
    reasoning_properties = {templates.NO_REASONING, templates.EARLIER_REASONING}
    assert found - reasoning_properties == properties, summary["properties"]
    if reasoning and not summary["render_errors"]:
        assert summary["reasoning_stripped"] == reasoning and found & reasoning_properties
    if TEXT in properties:
        turns = sum(len(text_beside_calls(line)) for line, r in zip(lines, report.records) if not r.render_error)
        assert next(p["turns"] for p in summary["properties"] if p["property"] == TEXT) == turns


def test_hermes_results_written_as_html_safe_json_and_arguments_before_the_name_are_found(
    lines_file: Path, tmp_path: Path
) -> None:
    """Jinja's own tojson (not transformers') escapes < > & ' for HTML; a template serving that way
    still writes every result."""
    text = (VLLM / "tool_chat_template_hermes.jinja").read_text(encoding="utf-8")
    html_safe = "message.content|tojson" + "".join(
        f"|replace({c!r}, {e!r})" for c, e in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("'", "\\u0027")))
    assert text.count("message.content|tojson") == 1
    path = tmp_path / "hermes_html_safe.jinja"
    path.write_text(text.replace("message.content|tojson", html_safe), encoding="utf-8")
    report = templates.check_file(lines_file, "sft-trl", templates.load_template(str(path)))
    assert report.failed == 0, report.summary()["failures"]
    rich = orjson.loads(lines_file.read_bytes().splitlines()[0])
    assert "'" in rich["messages"][6]["content"]  # the SyntaxError quotes '—': that template writes \u0027


def test_a_template_that_drops_earlier_reasoning_says_so_once_and_keeps_the_turn_checked(
    lines_file: Path, tmp_path: Path
) -> None:
    """Qwen 3 renders reasoning_content only after the last user message: a turn before a later user
    message loses it (the template's property) but its text and calls are still found in its turn."""
    line = orjson.loads(lines_file.read_bytes().splitlines()[0])
    line["messages"] += [{"role": "user", "content": "Et 31 ?"},
                         {"role": "assistant", "content": "31 est premier.", "reasoning_content": "31 = 31 × 1."}]
    path = tmp_path / "follow-up.jsonl"
    path.write_bytes(orjson.dumps(line) + b"\n")
    qwen3 = templates.load_template(str(VLLM.parent / "qwen3.jinja"))
    report = templates.check_file(path, "sft-trl", qwen3)
    [record] = report.records
    assert record.ok, record.problems
    # stripped: the earlier turn's reasoning and the first answer's thought (final_answer text keeps it there)
    assert (record.reasoning_kept, record.reasoning_stripped) == (1, 2)
    assert record.properties == {templates.EARLIER_REASONING: 2}


def test_turns_follow_the_template_where_it_rewrites_earlier_text(lines_file: Path) -> None:
    """Where the template writes the same text whatever follows, each message gets its own turn; where it
    does not (tools before the last user message, Mistral), turns join, never splitting a message."""
    line = orjson.loads(lines_file.read_bytes().splitlines()[5])  # calendar: two user messages
    messages, tools = line["messages"], line["tools"]
    for name, joined in (("hermes", 0), ("mistral", 4)):  # 4: no finish acknowledgement among them (final_answer text)
        template = vllm(name)
        tokenizer = templates.tokenizer_for(template)

        def render(conversation: list[dict[str, Any]], template: Any = template, tokenizer: Any = tokenizer) -> str:
            return tokenizer.apply_chat_template(conversation, tools=tools, chat_template=template.text,
                                                 tokenize=False)

        text = render(messages)
        spans = templates.turns(render, messages, text)
        assert spans[-1][1] == len(text) and spans[0][0] == 0
        assert sum(1 for k in range(1, len(spans)) if spans[k] == spans[k - 1]) == joined, (name, spans)
        for (start, end), message in zip(spans, messages):
            if message["role"] in ("user", "tool"):
                assert templates._find(text, templates._forms(message["content"].strip()), start, end), (name, message)


def test_dataset_export_names_a_template_error_and_each_property_once(
    lines_file: Path, tmp_path: Path, settings: Any
) -> None:
    settings.DATASET_CHAT_TEMPLATE_DIR = VLLM
    settings.DATASET_EXPORT_DIR = tmp_path / "exports"
    call_command("dataset_create", "vllm-tpl", "--no-near-dedup", "--validation-fraction", "0",
                 stdout=io.StringIO(), stderr=io.StringIO())
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="record check"):
        call_command("dataset_export", "vllm-tpl", "--format", "sft-trl", "--out", str(tmp_path / "a.jsonl"),
                     "--check-template", "tool_chat_template_hermes", "--check-template",
                     "tool_chat_template_llama3.1_json", "--no-progress", stdout=out, stderr=err)
    lines = [json.loads(raw) for raw in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()]
    refused = [n for n, line in enumerate(lines, start=1) if parallel_calls(line)]
    beside = sum(len(text_beside_calls(line)) for line in lines)
    assert refused and beside, "the toolace demo has parallel calls and text beside calls"
    stdout, stderr = out.getvalue(), err.getvalue()
    assert f"template tool_chat_template_hermes (" in stdout and f"{len(lines)}/{len(lines)} records pass" in stdout
    assert stdout.count("by design drops the assistant's text on turns that call tools") == 2  # once per template
    assert f"tool_chat_template_hermes by design drops the assistant's text on turns that call tools: {beside} " \
           f"turn(s)" in stdout
    assert stderr.count("only supports single tool-calls") == 1, stderr
    assert (f"tool_chat_template_llama3.1_json: the template cannot render {len(refused)} of {len(lines)} record(s) "
            f"(line {', '.join(map(str, refused))}): TemplateError: This model only supports single tool-calls at "
            "once!") in stderr
    assert "missing" not in stderr
