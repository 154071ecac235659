"""Reply normalisation and the reasoning echo (apps.engines.replies), on the real profiles."""
from __future__ import annotations

import json
from typing import Any

import pytest

from apps.engines import profiles
from apps.engines.replies import api_messages, normalize_reply, parse_text_tool_calls, split_think


def call(call_id: Any, name: str = "run_shell", **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_missing_empty_and_repeated_ids_get_unique_ones_and_the_providers_are_kept() -> None:
    used: set[str] = set()
    first = normalize_reply({"content": None, "tool_calls": [call(""), call(""), call(None), call("a")]},
                            profiles.get("vllm"), turn=1, used_ids=used)
    ids = [c["id"] for c in first.message["tool_calls"]]
    assert ids == ["call_1_0", "call_1_1", "call_1_2", "a"] and first.provider_ids == ["", "", None, "a"]
    again = normalize_reply({"content": None, "tool_calls": [call("a"), call("call_2_0")]},
                            profiles.get("vllm"), turn=2, used_ids=used)
    assert [c["id"] for c in again.message["tool_calls"]] == ["call_2_0", "call_2_1"]
    assert len(used) == 6


def test_reasoning_is_read_from_the_profiles_fields_and_stored_as_reasoning_content() -> None:
    reply = normalize_reply({"content": "Done.", "reasoning": "r1", "reasoning_content": "r2"},
                            profiles.get("vllm"), turn=1, used_ids=set())
    assert reply.message == {"role": "assistant", "content": "Done.", "reasoning_content": "r1"}
    deepseek = normalize_reply({"content": "x", "reasoning_content": "why"}, profiles.get("deepseek"),
                               turn=1, used_ids=set())
    assert deepseek.message["reasoning_content"] == "why" and "reasoning" not in deepseek.message


def test_think_blocks_leave_the_content_when_the_profile_says_they_come_there() -> None:
    assert split_think("<think>a</think>\nAnswer <think>b</think>") == ("Answer", "a\n\nb")
    assert split_think("opened by the template</think>Answer") == ("Answer", "opened by the template")
    reply = normalize_reply({"content": "<think>plan</think>Hi"}, profiles.get("vllm-noparser"), turn=1, used_ids=set())
    assert reply.message == {"role": "assistant", "content": "Hi", "reasoning_content": "plan"}
    # A profile without think tags keeps them: there they are the model's visible text.
    kept = normalize_reply({"content": "<think>plan</think>Hi"}, profiles.get("deepseek"), turn=1, used_ids=set())
    assert kept.message["content"] == "<think>plan</think>Hi"


@pytest.mark.parametrize("fmt, text", [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls"}}\n</tool_call>\n'
               '<tool_call>{"name": "finish", "arguments": {"answer": "ok"}}</tool_call>'),
    ("llama_json", 'Let me look.<|python_tag|>{"name": "run_shell", "parameters": {"command": "ls"}}; '
                   '{"name": "finish", "parameters": {"answer": "ok"}}'),
    ("mistral", 'Let me look.[TOOL_CALLS][{"name": "run_shell", "arguments": {"command": "ls"}}, '
                '{"name": "finish", "arguments": {"answer": "ok"}}]'),
    ("mistral", 'Let me look.[TOOL_CALLS]run_shell[ARGS]{"command": "ls"}[TOOL_CALLS]finish[ARGS]{"answer": "ok"}'),
])
def test_text_tool_calls_are_read_by_format_and_leave_the_content(fmt: str, text: str) -> None:
    calls, rest, bad = parse_text_tool_calls(text, fmt)
    assert bad == "" and rest == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("run_shell", {"command": "ls"}), ("finish", {"answer": "ok"})]


def test_a_noparser_reply_becomes_a_native_message_with_reasoning_and_calls() -> None:
    raw = {"content": '<think>Check first.</think>\nI will list.\n<tool_call>{"name": "run_shell", '
                      '"arguments": {"command": "ls"}}</tool_call>'}
    reply = normalize_reply(raw, profiles.get("vllm-noparser"), turn=3, used_ids=set())
    assert reply.text_tool_format == "hermes" and reply.provider_ids == [""]
    assert reply.message == {"role": "assistant", "content": "I will list.", "reasoning_content": "Check first.",
                             "tool_calls": [{"id": "call_3_0", "type": "function", "function": {
                                 "name": "run_shell", "arguments": '{"command": "ls"}'}}]}
    # A broken call stays in the text (the loop then corrects the model), it is not half-read.
    broken = normalize_reply({"content": "<tool_call>{not json</tool_call>"}, profiles.get("vllm-noparser"),
                             turn=1, used_ids=set())
    assert "tool_calls" not in broken.message and broken.unparsed.startswith("<tool_call>")


HISTORY = [
    {"role": "system", "content": "s"}, {"role": "user", "content": "u"},
    {"role": "assistant", "content": None, "reasoning_content": "r1", "tool_calls": [call("c1")]},
    {"role": "tool", "tool_call_id": "c1", "content": "out"},
    {"role": "assistant", "content": "text only", "reasoning_content": "r2"},
]


def test_reasoning_goes_back_as_each_profile_says() -> None:
    deepseek = api_messages(HISTORY, profiles.get("deepseek"))  # tool_turns
    assert deepseek[2]["reasoning_content"] == "r1" and "reasoning_content" not in deepseek[4]
    openrouter = api_messages(HISTORY, profiles.get("openrouter"))  # tool_turns, under `reasoning`
    assert openrouter[2]["reasoning"] == "r1" and "reasoning_content" not in openrouter[2]
    never = api_messages(HISTORY, profiles.get("openai"))
    assert all("reasoning_content" not in m and "reasoning" not in m for m in never)
    assert HISTORY[2]["reasoning_content"] == "r1"  # the record is untouched


def test_llama_json_without_arguments_is_text_not_a_call() -> None:
    calls, rest, _ = parse_text_tool_calls('The record is {"name": "Bob"}.', "llama_json")
    assert calls == [] and rest == 'The record is {"name": "Bob"}.'
