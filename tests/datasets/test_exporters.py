"""Exporters: every format on awkward trajectories, validators, DPO pairing, redaction, determinism."""
from __future__ import annotations

import copy
import hashlib
import io
import json
from typing import Any

import orjson
import pytest
from django.test import override_settings

from apps.datasets.exporters import FORMATS, RAW_SCHEMA_VERSION, export_records, load_records, validate_line
from tests.datasets.exporter_data import (
    PROMPT,
    SYSTEM,
    TOOLS,
    call,
    failing_episode,
    make_review,
    make_trajectory,
    rich_episode,
)

pytestmark = pytest.mark.django_db
# Scene-specific formats (Exporter.scenes) are tested on their scenes' trajectories.
SINGLE = [name for name, e in FORMATS.items() if not e.pairwise and not e.scenes]


def export(fmt: str, ids: list[int], **options: Any) -> tuple[Any, list[dict[str, Any]], bytes]:
    buf = io.BytesIO()
    result = export_records(fmt, load_records(ids), buf, options=options or None)
    data = buf.getvalue()
    return result, [orjson.loads(line) for line in data.splitlines()], data


@pytest.fixture
def pair(make_task: Any) -> tuple[Any, Any]:
    """One task, a rich successful rollout and a failing one."""
    task = make_task(prompt=PROMPT)
    good = make_trajectory(task)
    bad = make_trajectory(task, episode=failing_episode, sample_index=1, outcome="failure", reward=0.0)
    return good, bad


# -- every format --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", SINGLE)
def test_every_single_record_format_writes_valid_lines(fmt: str, pair: tuple[Any, Any]) -> None:
    good, bad = pair
    if fmt == "reward-score":  # its lines carry a review score
        make_review(good, overall=80)
        make_review(bad, overall=20)
    result, lines, data = export(fmt, [good.pk, bad.pk])
    per_task = FORMATS[fmt].one_per_task
    assert result.lines == len(lines) == (1 if per_task else 2)
    assert [e["trajectory_id"] for e in result.excluded] == ([bad.pk] if per_task else [])
    assert result.sha256 == hashlib.sha256(data).hexdigest() and result.bytes == len(data)
    assert result.version == FORMATS[fmt].version
    for line in lines:
        assert validate_line(fmt, line) == []
    # Non-ASCII text is written as UTF-8, not as \u escapes.
    assert "premiers nombres premiers — merci ✓".encode() in data
    assert b"\\u" not in data


def test_sft_openai_keeps_parallel_calls_text_failed_calls_and_empty_observations(pair: tuple[Any, Any]) -> None:
    good, bad = pair
    _, (line, failing), _ = export("sft-openai", [good.pk, bad.pk])
    messages = line["messages"]
    assert [m["role"] for m in messages[:5]] == ["system", "user", "assistant", "tool", "tool"]
    turn = messages[2]
    assert turn["content"] == "Je vais écrire le fichier puis lister le dossier."
    assert [c["function"]["name"] for c in turn["tool_calls"]] == ["write_file", "run_shell"]
    assert all(isinstance(c["function"]["arguments"], str) for c in turn["tool_calls"])
    assert json.loads(turn["tool_calls"][0]["function"]["arguments"])["path"] == "primes.py"
    assert messages[4] == {"role": "tool", "tool_call_id": turn["tool_calls"][1]["id"], "content": ""}
    assert "SyntaxError" in messages[6]["content"]
    assert "reasoning_content" not in messages[7]
    # final_answer text (the default): the finish call is the answer message, its thought dropped
    # (OpenAI's format has no place for one), no acknowledgement, no finish tool
    assert messages[-2:] == [{"role": "tool", "tool_call_id": "i1s0_call_5", "content": "2 3 5 7 11 13 17 19 23 29"},
                             {"role": "assistant", "content": "2 3 5 7 11 13 17 19 23 29 ✓"}]
    assert line["parallel_tool_calls"] is True and line["tools"] == TOOLS[:3]
    assert failing["parallel_tool_calls"] is False
    assert failing["messages"][-1] == {"role": "assistant", "content": "I could not do it. Désolé."}


def test_sft_trl_has_argument_objects_tool_names_and_reasoning(pair: tuple[Any, Any]) -> None:
    good, _ = pair
    _, (line,), _ = export("sft-trl", [good.pk])
    turn = line["messages"][2]
    assert turn["tool_calls"][1]["function"] == {"name": "run_shell", "arguments": {"command": "ls"}}
    assert line["messages"][3]["name"] == "write_file"
    assert line["messages"][7]["reasoning_content"] == "The dash broke it."
    # the finish turn's text kept as the answer's reasoning
    assert line["messages"][-1] == {"role": "assistant", "content": "2 3 5 7 11 13 17 19 23 29 ✓",
                                    "reasoning_content": "Done. Finishing."}
    _, (tool,), _ = export("sft-trl", [good.pk], final_answer="tool")
    assert tool["messages"][-2]["tool_calls"][0]["function"]["name"] == "finish"
    assert tool["messages"][-1]["content"] == "finish accepted; the episode ends"
    assert [t["function"]["name"] for t in tool["tools"]] == ["run_shell", "write_file", "read_file", "finish"]


def test_sharegpt_positions_parallel_calls_and_thoughts(pair: tuple[Any, Any]) -> None:
    good, bad = pair
    _, (line, failing), _ = export("sharegpt", [good.pk, bad.pk])
    turns = line["conversations"]
    assert [t["from"] for t in turns] == ["human"] + ["function_call", "observation"] * 4 + ["gpt"]
    first = turns[1]["value"]
    # LLaMA-Factory's default thought words, newlines included: its function formatter finds them
    # exactly and parses the rest as JSON.
    assert first.startswith("<think>\nJe vais écrire le fichier puis lister le dossier.\n</think>\n\n[")
    calls = json.loads(first.split("\n</think>\n\n", 1)[1])
    assert [c["name"] for c in calls] == ["write_file", "run_shell"] and calls[1]["arguments"] == {"command": "ls"}
    assert json.loads(turns[2]["value"]) == ["wrote 25 bytes to primes.py", ""]  # parallel results, one turn
    # the answer as the gpt turn, the text beside the finish call as its thought
    assert turns[-1]["value"] == "<think>\nDone. Finishing.\n</think>\n\n2 3 5 7 11 13 17 19 23 29 ✓"
    assert line["system"] == SYSTEM
    assert [t["name"] for t in json.loads(line["tools"])] == ["run_shell", "write_file", "read_file"]
    _, (tool,), _ = export("sharegpt", [good.pk], final_answer="tool")
    assert tool["conversations"][-1]["value"].startswith("<think>\nDone. Finishing.\n</think>\n\n{")
    assert json.loads(tool["conversations"][-1]["value"].split("</think>")[1])["name"] == "finish"  # ack dropped
    assert [t["name"] for t in json.loads(tool["tools"])] == ["run_shell", "write_file", "read_file", "finish"]
    assert [t["from"] for t in failing["conversations"]] == ["human", "function_call", "observation",
                                                            "function_call", "observation", "gpt"]


def test_sharegpt_tools_without_parameters_and_text_that_would_end_the_thought(make_task: Any) -> None:
    tools = TOOLS + [{"type": "function", "function": {"name": "list_env", "description": "List variables."}},
                     {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}]
    fine = make_trajectory(make_task(), tools=tools)
    closing = []
    for text in ("I think.\n</think>\n\nThen I act.", "I think.\n</think>\n"):  # the second with ours
        messages, steps = rich_episode("x_")
        messages[2]["content"] = text
        closing.append(make_trajectory(make_task(), messages=messages, steps=steps).pk)
    result, (line,), _ = export("sharegpt", [fine.pk, *closing])
    specs = {t["name"]: t for t in json.loads(line["tools"])}
    # LLaMA-Factory's default tool format reads parameters.properties of every tool.
    assert specs["list_env"]["parameters"] == {"type": "object", "properties": {}}
    assert specs["ping"]["parameters"] == {"type": "object", "properties": {}}
    assert specs["write_file"]["parameters"] == TOOLS[1]["function"]["parameters"]
    assert [e["trajectory_id"] for e in result.excluded] == closing
    assert all("thought end" in e["reason"] for e in result.excluded)


def test_alpaca_pairs_each_model_turn_with_what_came_before(pair: tuple[Any, Any]) -> None:
    _, bad = pair
    _, (line,), _ = export("alpaca", [bad.pk])
    assert line["history"][0][0] == PROMPT
    assert line["history"][0][1].startswith("<tool_call>\n") and "nope.py" in line["history"][0][1]
    assert line["instruction"] == "<tool_response>\nerror: no such file: missing.txt\n</tool_response>"
    assert line["output"] == "I could not do it. Désolé." and line["system"] == SYSTEM and line["input"] == ""


def test_rl_record_has_reward_step_success_verifier_and_judge(pair: tuple[Any, Any], reviewer: Any) -> None:
    good, bad = pair
    make_review(good, overall=91)
    make_review(bad, kind="human", verdict="reject", reviewer=reviewer)
    _, (g, b), _ = export("rl", [good.pk, bad.pk])
    assert [s["success"] for s in g["steps"]] == [True, True, False, True, True]  # finish is the answer
    assert [s["success"] for s in b["steps"]] == [False, False]
    assert b["steps"][1]["error"] == "no such file: missing.txt"
    assert g["reward"] == 1.0 and b["reward"] == 0.0 and g["outcome"] == "success"
    assert g["prompt"] == g["messages"][:2] and g["prompt"][1]["content"] == PROMPT
    assert json.loads(g["verifier_output"])["stdout"] == "1 passed"
    assert g["judge"] == {"overall": 91.0, "scores": {"correctness": 91.0}, "judge_model": "judge-x",
                          "rubric_version": "v1"}
    assert b["judge"] is None and b["human_verdict"] == "reject"


def test_verl_and_agentjet_write_one_task_line_with_the_verifier_as_ground_truth(make_task: Any) -> None:
    verifier = {"command": "python3 -m pytest -q", "files": {"test_p.py": "def test(): pass\n"}}
    task = make_task(prompt=PROMPT, scene_config={"verifier": verifier})
    t1 = make_trajectory(task, outcome="failure", reward=0.0)
    t2 = make_trajectory(task, sample_index=1)
    result, (verl,), _ = export("rl-verl", [t1.pk, t2.pk], split="validation")
    assert json.loads(verl["reward_model"]["ground_truth"]) == verifier
    assert verl["data_source"] == "trajplatform/code_exec" and verl["ability"] == "code_exec"
    assert verl["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    assert verl["extra_info"]["split"] == "validation" and verl["extra_info"]["index"] == 0
    assert verl["extra_info"]["trajectory_id"] == t1.pk
    assert "one line per task" in result.excluded[0]["reason"]
    _, (later,), _ = export("rl-verl", [t1.pk], start_index=40)  # a file written in chunks keeps counting
    assert later["extra_info"]["index"] == 40
    _, (aj,), _ = export("rl-agentjet", [t1.pk, t2.pk])
    assert aj["main_query"] == PROMPT and aj["init_messages"][-1]["content"] == PROMPT
    assert aj["task_id"] == str(task.pk) and json.loads(aj["metadata"]["answer"]) == verifier


def test_rl_task_shapes_need_a_ground_truth(make_task: Any) -> None:
    task = make_task()
    failed = make_trajectory(task, episode=failing_episode, outcome="failure", reward=0.0)
    result, lines, _ = export("rl-verl", [failed.pk])
    assert lines == [] and "no ground truth" in result.excluded[0]["reason"]


def test_include_system_false_drops_the_system_prompt(pair: tuple[Any, Any]) -> None:
    good, _ = pair
    for fmt in ("sft-openai", "sft-trl", "rl"):
        _, (line,), _ = export(fmt, [good.pk], include_system=False)
        assert line["messages"][0] == {"role": "user", "content": PROMPT}
    _, (line,), _ = export("sharegpt", [good.pk], include_system=False)
    assert "system" not in line


def test_raw_is_the_canonical_record(pair: tuple[Any, Any], reviewer: Any) -> None:
    good, _ = pair
    make_review(good, kind="human", verdict="accept", reviewer=reviewer)
    _, (line,), _ = export("raw", [good.pk])
    assert line["schema_version"] == RAW_SCHEMA_VERSION
    assert line["messages"] == good.messages and line["steps"] == good.steps and line["tools"] == good.tools
    assert line["content_sha256"] == good.content_sha256 and line["task"]["prompt"] == PROMPT
    assert line["reviews"]["auto"] is None
    assert line["reviews"]["human"]["verdict"] == "accept" and line["reviews"]["human"]["reviewer"] == reviewer.username


# -- exclusion -------------------------------------------------------------------------------


def test_unrenderable_and_invalid_records_are_excluded_with_reasons(make_task: Any) -> None:
    task = make_task()
    good = make_trajectory(task)
    messages, steps = rich_episode()
    messages[5]["tool_calls"][0]["function"]["arguments"] = '{"command": "ls"'  # cut off mid-object
    broken = make_trajectory(task, sample_index=1, messages=messages)
    lost = make_trajectory(task, sample_index=2, outcome="error", reward=None,
                           messages=rich_episode("lost_")[0][:6])  # the sandbox died: call_3 unanswered
    ids = [good.pk, broken.pk, lost.pk]
    result, lines, _ = export("sft-trl", ids)
    # lost ends on its unanswered call: a next-action sample (the call is the target), not refused
    assert result.lines == 2 and lines[-1]["messages"][-1]["tool_calls"][0]["id"] == "lost_call_3"
    reasons = {e["trajectory_id"]: e["reason"] for e in result.excluded}
    assert "arguments are not a JSON object" in reasons[broken.pk]
    result, _, _ = export("sft-openai", ids)
    reasons = {e["trajectory_id"]: e["reason"] for e in result.excluded}
    assert "invalid sft-openai line" in reasons[broken.pk] and "not a JSON object" in reasons[broken.pk]
    assert set(reasons) == {broken.pk}
    result, lines, _ = export("raw", ids)  # lossless: raw keeps them all
    assert result.lines == 3 and result.excluded == []


def test_unknown_format_and_options_are_refused(pair: tuple[Any, Any]) -> None:
    with pytest.raises(ValueError, match="unknown export format"):
        export_records("csv", [], io.BytesIO())
    with pytest.raises(ValueError, match="unknown export option"):
        export_records("raw", [], io.BytesIO(), options={"margin": 1})
    with pytest.raises(ValueError, match="dpo_min_margin"):
        export_records("dpo-trl", [], io.BytesIO(), options={"dpo_min_margin": -1})


# -- validators ------------------------------------------------------------------------------


def _set(path: str, value: Any) -> Any:
    def mutate(line: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = line
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return mutate


def _delete(path: str) -> Any:
    def mutate(line: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = line
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        del target[int(last) if isinstance(target, list) else last]
    return mutate


def _cut(path: str, n: int) -> Any:
    def mutate(line: dict[str, Any]) -> None:
        del line[path][n:]
    return mutate


def _swap(path: str, i: int, j: int) -> Any:
    def mutate(line: dict[str, Any]) -> None:
        items = line[path]
        items[i], items[j] = items[j], items[i]
    return mutate


BAD_LINES = [
    ("sft-openai", _set("messages.3.tool_call_id", "nope"), "answers no open tool call"),
    ("sft-openai", _set("messages.2.tool_calls.0.function.arguments", {"path": "x"}), "must be a JSON string"),
    ("sft-openai", _set("messages.2.tool_calls.0.function.arguments", "[1, 2]"), "not a JSON object"),
    ("sft-openai", _set("messages.2.tool_calls.0.function.name", "rm_rf"), "'rm_rf' is not in tools"),
    ("sft-openai", _cut("messages", 4), "tool call(s) i1s0_call_2 never answered"),  # a turn's calls half answered
    ("sft-openai", _delete("messages.4"), "before tool call(s) i1s0_call_2 were answered"),
    ("sft-openai", _swap("messages", 0, 1), "system message after the conversation started"),
    ("sft-openai", _delete("messages.1"), "must start with a user message"),
    ("sft-openai", _set("messages.7.reasoning_content", "hm"), "fields OpenAI does not accept"),
    ("sft-openai", _set("parallel_tool_calls", False), "several tool calls"),
    ("sft-openai", _set("tools.0.type", "plugin"), "tools[0]"),
    ("sft-trl", _set("messages.2.tool_calls.0.function.arguments", "{}"), "must be an object"),
    ("sft-trl", _set("messages.5.tool_calls.0.id", "i1s0_call_1"), "used twice"),
    ("sft-trl", _set("messages.1.content", ""), "non-empty string"),
    ("sft-trl", _cut("messages", 4), "tool call(s) i1s0_call_2 never answered"),
    ("sharegpt", _swap("conversations", 0, 1), "position 1"),
    ("sharegpt", _delete("conversations.9"), "even number of turns"),
    ("sharegpt", _set("conversations.3.value", "{not json"), "JSON object {name, arguments}"),
    ("sharegpt", _set("conversations.3.value", '{"name": "fly", "arguments": {}}'), "'fly' is not in tools"),
    ("sharegpt", _set("tools", []), "JSON list encoded as a string"),
    ("sharegpt", _set("conversations.2.from", "human"), "a function_call must be followed by its observation"),
    ("sharegpt", _set("conversations.1.value", '<think>x</think>{"name": "read_file", "arguments": {}}'),
     "LLaMA-Factory's thought words"),
    ("sharegpt", _set("tools", '[{"name": "read_file"}]'), "object schema with properties"),
    ("sharegpt", _set("tools", '[{"name": "read_file", "parameters": {"properties": {"n": {"enum": [1, 2]}}}}]'),
     "properties.n.enum: LLaMA-Factory's default tool format needs a list of strings"),
    ("sharegpt", _set("tools", '[{"name": "read_file", "parameters": {"properties": {"n": true}}}]'),
     "properties.n: must be an object schema"),
    ("alpaca", _set("output", ""), "line.output"),
    ("alpaca", _set("history.0", ["only one"]), "line.history"),
    ("rl", _set("prompt.1.content", "something else"), "leading messages"),
    ("rl", _set("steps.0.success", "yes"), "boolean success"),
    ("rl", _set("verifier_output", "{}x"), "JSON object encoded as a string"),
    ("rl", _set("outcome", "great"), "line.outcome"),
    ("rl-verl", _set("reward_model.ground_truth", ""), "ground_truth"),
    ("rl-verl", _set("prompt.1.role", "assistant"), "end with a user message"),
    ("rl-agentjet", _set("main_query", "another question"), "must end with main_query"),
    ("raw", _set("schema_version", "other/9"), "schema_version"),
    ("raw", _delete("messages"), "line.messages: missing"),
    ("raw", _set("reward", "high"), "line.reward"),
]


@pytest.mark.parametrize("fmt,mutate,expected", BAD_LINES, ids=[f"{f}-{e[:30]}" for f, _, e in BAD_LINES])
def test_validators_reject_bad_lines(fmt: str, mutate: Any, expected: str, pair: tuple[Any, Any]) -> None:
    good, _ = pair
    _, (line,), _ = export(fmt, [good.pk])
    assert validate_line(fmt, line) == []
    bad = copy.deepcopy(line)
    mutate(bad)
    problems = validate_line(fmt, bad)
    assert any(expected in p for p in problems), problems


def test_validators_reject_lines_that_are_not_objects() -> None:
    for fmt in FORMATS:
        assert validate_line(fmt, ["not", "an", "object"]), fmt


# -- DPO -------------------------------------------------------------------------------------


def _rollout(task: Any, n: int, **fields: Any) -> Any:
    fields.setdefault("episode", rich_episode if fields.get("outcome", "success") == "success" else failing_episode)
    return make_trajectory(task, sample_index=n, **fields)


def _calls(messages: list[dict[str, Any]]) -> list[str]:
    return [c["id"] for m in messages for c in m.get("tool_calls") or []]


def test_dpo_pairs_only_rollouts_of_the_same_task(make_task: Any) -> None:
    a, b = make_task(prompt="Task A: print primes"), make_task(prompt="Task B: sort a CSV file")
    a_good, a_bad = _rollout(a, 0), _rollout(a, 1, outcome="failure", reward=0.0)
    b_good, b_bad = _rollout(b, 0), _rollout(b, 1, outcome="failure", reward=0.0)
    for fmt in ("dpo-trl", "dpo-openai"):
        result, lines, _ = export(fmt, [a_good.pk, a_bad.pk, b_good.pk, b_bad.pk])
        assert result.lines == 2 and result.excluded == []
        prompts = [(line.get("prompt") or line["input"]["messages"])[1]["content"] for line in lines]
        assert prompts == [a.prompt, b.prompt]
        for line in lines:
            assert validate_line(fmt, line) == []
    # A task with only a success and another with only a failure: nothing to pair, never across.
    result, lines, _ = export("dpo-trl", [a_good.pk, b_bad.pk])
    assert lines == [] and {e["trajectory_id"] for e in result.excluded} == {a_good.pk, b_bad.pk}
    assert all("no other rollout" in e["reason"] for e in result.excluded)


def test_dpo_chooses_accepted_over_higher_reward_and_rejects_the_failed(make_task: Any, reviewer: Any) -> None:
    task = make_task(prompt=PROMPT)
    best_reward = _rollout(task, 0, reward=1.0)
    accepted = _rollout(task, 1, reward=0.8)
    make_review(accepted, kind="human", verdict="accept", reviewer=reviewer)
    failed = _rollout(task, 2, outcome="failure", reward=0.0)
    mediocre = _rollout(task, 3, outcome="failure", reward=0.5)
    result, (line,), _ = export("dpo-trl", [best_reward.pk, accepted.pk, failed.pk, mediocre.pk])
    assert _calls(line["chosen"])[0].startswith("i1s1_") and _calls(line["rejected"])[0].startswith("i1s2_")
    assert line["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    assert {e["trajectory_id"] for e in result.excluded} == {best_reward.pk, mediocre.pk}
    assert all("not selected" in e["reason"] for e in result.excluded)


def test_dpo_never_chooses_a_human_rejected_rollout(make_task: Any, reviewer: Any) -> None:
    task = make_task(prompt=PROMPT)
    top = _rollout(task, 0, reward=1.0)
    make_review(top, kind="human", verdict="reject", reviewer=reviewer)
    ok = _rollout(task, 1, reward=0.9)
    low = _rollout(task, 2, outcome="failure", reward=0.1)
    _, (line,), _ = export("dpo-trl", [top.pk, ok.pk, low.pk])
    assert _calls(line["chosen"])[0].startswith("i1s1_")
    assert _calls(line["rejected"])[0].startswith("i1s0_")  # the human-rejected one is the rejected side


def test_dpo_minimum_margin(make_task: Any) -> None:
    task = make_task(prompt=PROMPT)
    hi, lo = _rollout(task, 0, outcome="failure", reward=0.6), _rollout(task, 1, outcome="failure", reward=0.5)
    result, lines, _ = export("dpo-trl", [hi.pk, lo.pk])
    assert lines == [] and "margin 0.100 below the minimum 0.2" in result.excluded[0]["reason"]
    result, (line,), _ = export("dpo-trl", [hi.pk, lo.pk], dpo_min_margin=0.05)
    assert _calls(line["chosen"])[0].startswith("i1s0_")


def test_dpo_uses_the_judge_score_when_rewards_tie_or_are_missing(make_task: Any) -> None:
    task = make_task(prompt=PROMPT)
    a, b = _rollout(task, 0, reward=None), _rollout(task, 1, reward=None)
    make_review(a, overall=40)
    make_review(b, overall=90)
    _, (line,), _ = export("dpo-trl", [a.pk, b.pk])
    assert _calls(line["chosen"])[0].startswith("i1s1_") and _calls(line["rejected"])[0].startswith("i1s0_")
    result, lines, _ = export("dpo-trl", [a.pk, b.pk], dpo_min_margin=0.6)
    assert lines == [] and "margin 0.500" in result.excluded[0]["reason"]


def test_dpo_skips_errors_and_equal_rollouts(make_task: Any) -> None:
    task = make_task(prompt=PROMPT)
    a, b = _rollout(task, 0), _rollout(task, 1)
    err = _rollout(task, 2, outcome="error", reward=None)
    result, lines, _ = export("dpo-trl", [a.pk, b.pk, err.pk])
    assert lines == []
    reasons = {e["trajectory_id"]: e["reason"] for e in result.excluded}
    assert "not a preference signal" in reasons[err.pk] and "margin 0.000" in reasons[a.pk]


def test_dpo_prompt_is_the_shared_prefix_of_both_rollouts(make_task: Any) -> None:
    task = make_task(prompt=PROMPT)
    good = _rollout(task, 0)
    messages, steps = rich_episode("i1s0_")  # the same first turns, call ids included
    messages[7] = {"role": "assistant", "content": "I give up.", "tool_calls": None}
    del messages[8:]
    bad = make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, messages=messages, steps=steps[:3])
    _, (trl,), _ = export("dpo-trl", [good.pk, bad.pk])
    assert trl["prompt"] == export("sft-trl", [good.pk])[1][0]["messages"][:7]
    assert trl["rejected"] == [{"role": "assistant", "content": "I give up."}]
    assert trl["chosen"][0]["content"] == "修正します。"
    _, (oai,), _ = export("dpo-openai", [good.pk, bad.pk])
    assert len(oai["input"]["messages"]) == 7
    assert oai["preferred_output"][0]["content"] == "修正します。"
    assert oai["non_preferred_output"] == [{"role": "assistant", "content": "I give up."}]


def test_dpo_needs_records_grouped_by_task(make_task: Any) -> None:
    a, b = make_task(), make_task()
    ids = [_rollout(a, 0).pk, _rollout(b, 0).pk, _rollout(a, 1, outcome="failure", reward=0.0).pk]
    with pytest.raises(ValueError, match="not consecutive"):
        export("dpo-trl", ids)


# -- determinism, redaction, loading ---------------------------------------------------------


def test_re_exporting_gives_byte_identical_files(pair: tuple[Any, Any], reviewer: Any) -> None:
    good, bad = pair
    make_review(good, overall=88)
    make_review(bad, kind="human", verdict="reject", reviewer=reviewer)
    for fmt in (name for name, e in FORMATS.items() if not e.scenes):
        first = export(fmt, [good.pk, bad.pk])
        second = export(fmt, [good.pk, bad.pk])
        assert first[2] == second[2] and first[0].sha256 == second[0].sha256, fmt
        assert first[0].lines >= 1, fmt


SECRET = "zq-private-value-0123456789"


@override_settings(SOME_SERVICE_API_KEY=SECRET)
def test_exports_redact_secrets_keys_and_optionally_pii(make_task: Any) -> None:
    task = make_task(prompt=PROMPT)
    messages, steps = rich_episode()
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----"
    messages[6]["content"] = (f"token {SECRET}; key sk-abcdefghijklmnopqrstuvwx; "
                              "Authorization: Bearer abc.def.ghijklmnop\n"
                              f"{key}\nmail ana@example.org or call +1 415-555-0100")
    leaky = make_trajectory(task, messages=messages, steps=steps)
    make_review(leaky, overall=50)  # reward-score's lines carry a review score
    for fmt in SINGLE:
        _, _, data = export(fmt, [leaky.pk])
        text = data.decode()
        for secret in (SECRET, "sk-abcdefghijklmnopqrstuvwx", "abc.def.ghijklmnop", "b3BlbnNzaC1rZXktdjEAAAA"):
            assert secret not in text, (fmt, secret)
        assert "ana@example.org" in text or fmt.startswith("rl-")  # PII is kept unless asked for
    _, (line,), data = export("sft-openai", [leaky.pk], redact_pii=True)
    assert b"ana@example.org" not in data and b"415-555-0100" not in data
    assert "[REDACTED_EMAIL]" in line["messages"][6]["content"] and "[REDACTED_PHONE]" in line["messages"][6]["content"]
    with override_settings(EXPORT_REDACT_PII=True):
        assert b"ana@example.org" not in export("sft-trl", [leaky.pk])[2]


@override_settings(ODD_SERVICE_API_KEY='quo"te\\slash-ünï-0042')
def test_secrets_with_characters_json_escapes_are_still_redacted(make_task: Any) -> None:
    messages, steps = rich_episode()
    messages[4]["content"] = 'key=quo"te\\slash-ünï-0042 end'
    t = make_trajectory(make_task(), messages=messages, steps=steps)
    _, (line,), _ = export("sft-openai", [t.pk])
    assert line["messages"][4]["content"] == "key=[REDACTED] end"


def test_load_records_keeps_order_and_reads_chunks_in_few_queries(
    make_task: Any, reviewer: Any, django_assert_num_queries: Any
) -> None:
    task = make_task()
    ts = [make_trajectory(task, sample_index=i) for i in range(5)]
    make_review(ts[0], overall=30, status="pending")
    make_review(ts[0], kind="human", verdict="reject", reviewer=reviewer)
    make_review(ts[0], kind="human", verdict="accept", reviewer=reviewer)
    ids = [ts[3].pk, ts[0].pk, 999_999, ts[4].pk, ts[1].pk, ts[2].pk]
    with django_assert_num_queries(15):  # 3 chunks x (trajectories + reviews + preferences + pass rates + sub-episodes)
        records = list(load_records(ids, chunk_size=2))
    assert [r["trajectory_id"] for r in records] == [ts[3].pk, ts[0].pk, ts[4].pk, ts[1].pk, ts[2].pk]
    first = records[1]["reviews"]
    assert first["auto"] is None  # not done yet
    assert first["human"]["verdict"] == "accept"  # the latest human review


def test_tool_call_to_a_tool_that_was_not_offered_is_excluded(make_task: Any) -> None:
    task = make_task()
    messages, steps = failing_episode()
    messages[2]["tool_calls"] = [call("x1", "browse", url="https://example.com")]
    messages[3]["tool_call_id"] = "x1"
    t = make_trajectory(task, messages=messages, steps=steps, outcome="failure", reward=0.0)
    for fmt in ("sft-openai", "sft-trl", "sharegpt"):
        result, lines, _ = export(fmt, [t.pk])
        assert lines == [] and "'browse' is not in tools" in result.excluded[0]["reason"], fmt


DPO_BAD_LINES = [
    ("dpo-trl", lambda l: l.__setitem__("rejected", l["chosen"]), "chosen and rejected are identical"),
    ("dpo-trl", lambda l: l["chosen"].insert(0, {"role": "tool", "tool_call_id": "x", "content": ""}),
     "chosen: must start with an assistant message"),
    ("dpo-trl", lambda l: l["prompt"].append({"role": "assistant", "content": "hi"}), "prompt: must be"),
    ("dpo-trl", lambda l: l["chosen"].pop(1), "were answered"),
    ("dpo-trl", lambda l: l.__setitem__("tools", []), "is not in tools"),
    ("dpo-openai", lambda l: l["preferred_output"].append({"role": "assistant", "content": "more"}),
     "exactly one assistant message"),
    ("dpo-openai", lambda l: l["non_preferred_output"][0]["tool_calls"][0]["function"].__setitem__("arguments", "{"),
     "not a JSON object"),
    ("dpo-openai", lambda l: l["input"].__setitem__("prompt", []), "input.prompt: unexpected field"),
]


@pytest.mark.parametrize("fmt,mutate,expected", DPO_BAD_LINES, ids=[f"{f}-{e[:30]}" for f, _, e in DPO_BAD_LINES])
def test_dpo_validators_reject_bad_lines(fmt: str, mutate: Any, expected: str, pair: tuple[Any, Any]) -> None:
    good, bad = pair
    _, (line,), _ = export(fmt, [good.pk, bad.pk])
    assert validate_line(fmt, line) == []
    broken = copy.deepcopy(line)
    mutate(broken)
    problems = validate_line(fmt, broken)
    assert any(expected in p for p in problems), problems
