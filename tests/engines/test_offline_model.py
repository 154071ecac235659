"""The offline scripted model: replay, honesty, tool checks, formats and fault injection.

Driven over loopback HTTP with the real openai SDK (retries off) or plain httpx, so what is
tested is what an agent loop would see.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
from django.conf import settings

from apps.engines.llm import ROUTE_HEADER as LLM_ROUTE_HEADER
from apps.engines.offline_model import (
    JUDGE_ROUTE,
    MODEL_NAME,
    ROUTE_HEADER,
    ReferenceSolutionError,
    ScriptedModel,
    load_scripts,
    parse_script,
    running_offline_model,
    script_key,
)
from apps.engines.generation import stage_route

EXAMPLES = Path(settings.BASE_DIR) / "examples" / "reference_solutions"
PRIMES = "Print the first ten primes."
CODE_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("write_file", "run_shell", "finish")
]


@pytest.fixture
def server() -> Iterator[Any]:
    with running_offline_model([EXAMPLES]) as srv:
        yield srv


def sdk(server: Any, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, default_headers=headers or None)


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], *, model: str = MODEL_NAME, tools: Any = CODE_TOOLS) -> Any:
    kwargs = {"tools": tools} if tools else {}
    return client.chat.completions.create(model=model, messages=messages, timeout=10, **kwargs)


def play(client: openai.OpenAI, prompt: str, turns: int, **kw: Any) -> list[Any]:
    """Run `turns` assistant turns, answering every tool call with a dummy tool result."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": prompt}]
    replies = []
    for _ in range(turns):
        reply = ask(client, messages, **kw)
        replies.append(reply)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
    return replies


def test_it_replays_a_three_step_solution_in_order(server: Any) -> None:
    replies = play(sdk(server), PRIMES, 3)

    calls = [r.choices[0].message.tool_calls[0] for r in replies]
    assert [c.function.name for c in calls] == ["write_file", "run_shell", "finish"]
    assert json.loads(calls[1].function.arguments) == {"command": "python3 primes.py"}
    assert json.loads(calls[2].function.arguments) == {"answer": "2 3 5 7 11 13 17 19 23 29"}
    assert all(r.model == MODEL_NAME and r.choices[0].finish_reason == "tool_calls" for r in replies)
    assert replies[0].choices[0].message.content.startswith("I'll write a small script")
    assert len({c.id for c in calls}) == 3
    assert server.model.chat_requests == 3


def test_replies_are_deterministic(server: Any) -> None:
    first, second = play(sdk(server), PRIMES, 1), play(sdk(server), PRIMES, 1)
    assert first[0].choices[0].message == second[0].choices[0].message


def test_it_says_the_script_is_over_after_the_last_step(server: Any) -> None:
    fourth = play(sdk(server), PRIMES, 4)[3].choices[0]
    assert fourth.message.tool_calls is None
    assert fourth.finish_reason == "stop"
    assert "no further steps" in fourth.message.content


def test_it_answers_an_unknown_prompt_honestly_without_a_tool_call(server: Any) -> None:
    choice = ask(sdk(server), [{"role": "user", "content": "Translate this poem into Latin."}]).choices[0]
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert "no script for this task" in choice.message.content
    assert server.model.stats["unknown_prompt"] == 1


def test_it_finds_the_script_inside_a_wrapped_prompt_and_by_marker(server: Any) -> None:
    wrapped = f"Task:\n   {PRIMES}\n\nYou are in /workspace. Use the tools."
    call = ask(sdk(server), [{"role": "user", "content": wrapped}]).choices[0].message.tool_calls[0]
    assert call.function.name == "write_file"

    parts = [{"type": "text", "text": "Do the task [script:fizzbuzz] please."}]
    call = ask(sdk(server), [{"role": "user", "content": parts}]).choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments)["path"] == "fizzbuzz.py"


def test_it_refuses_a_scripted_tool_the_request_does_not_offer(server: Any) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        ask(sdk(server), [{"role": "user", "content": PRIMES}], tools=CODE_TOOLS[1:])
    assert exc.value.body["code"] == "scripted_tool_not_offered"
    assert "write_file" in exc.value.body["message"]


def test_it_serves_only_the_scripted_model(server: Any) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        ask(sdk(server), [{"role": "user", "content": PRIMES}], model="deepseek-chat")
    assert exc.value.body["code"] == "model_not_found"

    models = sdk(server).models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_it_plays_a_final_text_answer_from_a_task_jsonl_line(server: Any) -> None:
    prompt = "What is the sum of the integers from 1 to 100? Answer with the number only."
    choice = ask(sdk(server), [{"role": "user", "content": prompt}], tools=None).choices[0]
    assert (choice.message.content, choice.finish_reason, choice.message.tool_calls) == ("5050", "stop", None)


def test_usage_is_characters_over_four(server: Any) -> None:
    messages = [{"role": "user", "content": "A task without a script."}]
    reply = ask(sdk(server), messages, tools=None)
    text = reply.choices[0].message.content
    prompt_chars = len(json.dumps(messages, ensure_ascii=False) + json.dumps([]))
    assert reply.usage.prompt_tokens == -(-prompt_chars // 4)
    assert reply.usage.completion_tokens == -(-len(text) // 4)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


# -- loading --------------------------------------------------------------------------------


def test_task_jsonl_lines_without_a_solution_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        json.dumps({"scene": "code_exec", "prompt": "no script here"}) + "\n\n"
        + json.dumps({"task_id": "t7", "description": "Say hi.", "reference_solution": [{"content": "hi"}]}) + "\n"
    )
    [script] = load_scripts([path])
    assert (script.id, script.prompt, script.steps[0].content) == ("t7", "Say hi.", "hi")


@pytest.mark.parametrize(
    ("content", "where", "reason"),
    [
        ('{"prompt": "x"}\n{"prompt": "y", "reference_solution": []}\n', ":2:", "non-empty list of steps"),
        ('{"prompt": "y", "reference_solution": [{"content": "a"}, {"content": "b"}]}\n', ":1:", "only be the last step"),
        ('{"prompt": "y", "reference_solution": [{"tool_calls": [{"arguments": {}}]}]}\n', ":1:", "non-empty string `name`"),
        ('{"prompt": "y", "reference_solution": [{"tool_calls": []}]}\n', ":1:", "non-empty `tool_calls`"),
        ("{not json\n", ":1:", "malformed JSON"),
    ],
)
def test_a_broken_solution_file_is_reported_with_its_line(tmp_path: Path, content: str, where: str, reason: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ReferenceSolutionError) as exc:
        load_scripts([path])
    assert f"{path}{where}" in str(exc.value) and reason in str(exc.value)


def test_two_different_solutions_for_one_prompt_are_refused() -> None:
    a = parse_script({"prompt": "Same  task", "reference_solution": [{"content": "a"}]}, where="a", default_id="a")
    b = parse_script({"prompt": "Same task", "reference_solution": [{"content": "b"}]}, where="b", default_id="b")
    with pytest.raises(ReferenceSolutionError, match="different solution"):
        ScriptedModel([a, b])


# -- fault injection ------------------------------------------------------------------------


def test_429_carries_retry_after_for_the_first_n_requests(server: Any) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": PRIMES}], "tools": CODE_TOOLS}
    headers = {"X-Scripted-Fault": "429;retry_after=3;times=2"}
    responses = [httpx.post(f"{server.url}/chat/completions", json=body, headers=headers) for _ in range(3)]
    assert [r.status_code for r in responses] == [429, 429, 200]
    assert responses[0].headers["Retry-After"] == "3"
    assert responses[0].json()["error"]["type"] == "rate_limit_error"


def test_500_from_the_model_name_fails_then_recovers(server: Any) -> None:
    client = sdk(server)
    model = f"{MODEL_NAME}+fault=500;times=1"
    with pytest.raises(openai.InternalServerError):
        ask(client, [{"role": "user", "content": PRIMES}], model=model)
    reply = ask(client, [{"role": "user", "content": PRIMES}], model=model)
    assert reply.model == MODEL_NAME
    assert reply.choices[0].message.tool_calls[0].function.name == "write_file"


def test_malformed_fault_breaks_the_arguments_json(server: Any) -> None:
    call = ask(sdk(server, **{"X-Scripted-Fault": "malformed"}), [{"role": "user", "content": PRIMES}]).choices[0].message.tool_calls[0]
    assert call.function.name == "write_file"
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)


def test_never_finish_keeps_calling_a_harmless_tool(server: Any) -> None:
    replies = play(sdk(server, **{"X-Scripted-Fault": "never_finish"}), PRIMES, 6)
    names = [r.choices[0].message.tool_calls[0].function.name for r in replies]
    assert names == ["write_file", "run_shell", "run_shell", "run_shell", "run_shell", "run_shell"]


def test_text_only_answers_without_tool_calls_even_when_tools_are_offered(server: Any) -> None:
    reply = ask(sdk(server, **{"X-Scripted-Fault": "text_only"}), [{"role": "user", "content": PRIMES}])
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


def test_slow_fault_delays_the_reply_and_server_faults_apply_to_every_request() -> None:
    model = ScriptedModel(load_scripts([EXAMPLES]), faults="slow;seconds=0.5")
    reply = model.chat({"model": MODEL_NAME, "messages": [{"role": "user", "content": PRIMES}], "tools": CODE_TOOLS}, {})
    assert reply.status == 200 and reply.delay_s == 0.5


def test_an_unknown_fault_is_a_bad_request(server: Any) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        ask(sdk(server, **{"X-Scripted-Fault": "explode"}), [{"role": "user", "content": PRIMES}])
    assert exc.value.body["code"] == "bad_fault_spec"


# -- the management command -----------------------------------------------------------------


def test_the_management_command_serves_the_bundled_solutions() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "trajplatform.settings"}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "offline_model", "--port", "0", "--solutions", str(EXAMPLES)],
        cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # As a terminal's foreground job has it (a background job of a script ignores SIGINT).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        banner = proc.stdout.readline()
        expected = f"{len(load_scripts([EXAMPLES]))} reference solution(s)"  # every bundled file, envscaler's too
        assert "offline stand-in" in banner and expected in banner, proc.stderr.read() if not banner else banner
        url = banner.rsplit(" at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        with httpx.Client() as client:  # a kept-alive connection is still open at Ctrl-C
            assert client.get(f"{url}/models").json()["data"][0]["id"] == MODEL_NAME
            # Ctrl-C: the server closes its connections and the command ends quietly.
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def test_the_management_command_rejects_a_missing_solutions_path(tmp_path: Path) -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="no such file"):
        call_command("offline_model", "--port", "0", "--solutions", str(tmp_path / "missing"))


def test_it_keeps_connections_alive_between_requests(server: Any) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        first = client.get("/models")
        second = client.post("/chat/completions", json={"model": MODEL_NAME, "messages": [
            {"role": "user", "content": PRIMES}], "tools": CODE_TOOLS})
        assert first.http_version == second.http_version == "HTTP/1.1"
        assert first.status_code == second.status_code == 200
        assert "close" not in first.headers.get("connection", "").lower()
        # One pooled connection served both requests.
        assert client._transport._pool.connections and len(client._transport._pool.connections) == 1


def test_it_serves_128_simultaneous_slow_requests_without_resetting_any() -> None:
    import asyncio

    with running_offline_model([EXAMPLES], faults="slow;seconds=1") as srv:
        async def one(client: httpx.AsyncClient) -> int:
            reply = await client.post("/chat/completions", json={"model": MODEL_NAME, "messages": [
                {"role": "user", "content": PRIMES}], "tools": CODE_TOOLS})
            return reply.status_code

        async def all_at_once() -> list[int]:
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(base_url=srv.url, timeout=30, limits=limits) as client:
                return await asyncio.gather(*(one(client) for _ in range(128)))

        statuses = asyncio.run(all_at_once())
    assert statuses == [200] * 128


# -- judge mode ----------------------------------------------------------------------------------

JUDGE_SYSTEM = "You review one trajectory of an AI agent. Score the trajectory."
JUDGE = {ROUTE_HEADER: JUDGE_ROUTE}


def _judge_request(evidence: Any) -> list[dict[str, Any]]:
    block = f"<evidence>{json.dumps(evidence)}</evidence>" if evidence is not None else "no evidence here"
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"## Task\n{PRIMES}\n\n## Evidence\n{block}"}]


def test_judge_mode_scores_from_the_evidence_and_says_it_is_the_stand_in(server: Any) -> None:
    evidence = {"dimensions": ["tool_usage", "completeness"], "outcome": "failure", "reward": None,
                "checks": {"limit_exhausted": {"fired": True}, "verifier": {"fired": True},
                           "sensitive_data": {"fired": False}}}
    reply = ask(sdk(server, **JUDGE), _judge_request(evidence), tools=None)
    assert reply.model == MODEL_NAME and not reply.choices[0].message.tool_calls
    verdict = json.loads(reply.choices[0].message.content)
    assert set(verdict["scores"]) == {"tool_usage", "completeness"}
    assert {v["score"] for v in verdict["scores"].values()} == {30.0}  # failure 40, one check (not the verifier) -10
    assert "offline stand-in, not a language model" in verdict["summary"]
    assert "limit_exhausted" in verdict["scores"]["completeness"]["rationale"]
    # A reward sets the base; the same request gets the same answer (deterministic).
    evidence.update(reward=1.0, checks={})
    first = ask(sdk(server, **JUDGE), _judge_request(evidence), tools=None).choices[0].message.content
    assert first == ask(sdk(server, **JUDGE), _judge_request(evidence), tools=None).choices[0].message.content
    assert {v["score"] for v in json.loads(first)["scores"].values()} == {100.0}


def test_judge_mode_without_evidence_gives_no_scores(server: Any) -> None:
    content = ask(sdk(server, **JUDGE), _judge_request(None), tools=None).choices[0].message.content
    assert "no scores" in content and "{" not in content


def test_judge_mode_obeys_injected_faults(server: Any) -> None:
    with pytest.raises(openai.InternalServerError):
        ask(sdk(server, **JUDGE), _judge_request({"dimensions": ["a"]}), model=f"{MODEL_NAME}+fault=500", tools=None)


def test_without_the_judge_route_the_same_request_is_not_judged(server: Any) -> None:
    evidence = {"dimensions": ["a"], "outcome": "success", "reward": 1.0}
    message = ask(sdk(server), _judge_request(evidence)).choices[0].message  # the task's own script instead
    assert message.tool_calls and "scores" not in (message.content or "")


# -- routed pipeline stages -------------------------------------------------------------------------


def test_a_routed_pipeline_stage_gets_its_keyed_script_and_a_repair_turn_its_own(tmp_path: Path) -> None:
    scripts = tmp_path / "stages.json"
    scripts.write_text(json.dumps([
        {"id": "q", "prompt": script_key(stage_route("demo/question", "s1")), "reference_solution": [{"content": "first"}]},
        {"id": "q-r1", "prompt": script_key(stage_route("demo/question", "s1", 1)), "reference_solution": [{"content": "fixed"}]},
    ]))
    prompt = [{"role": "user", "content": "Write a question about intervals."}]
    with running_offline_model([scripts]) as srv:
        routed = sdk(srv, **{ROUTE_HEADER: stage_route("demo/question", "s1")})
        assert ask(routed, prompt, tools=None).choices[0].message.content == "first"
        repair = prompt + [{"role": "assistant", "content": "first"}, {"role": "user", "content": "rejected: x"}]
        repaired = sdk(srv, **{ROUTE_HEADER: stage_route("demo/question", "s1", repair=1)})
        assert ask(repaired, repair, tools=None).choices[0].message.content == "fixed"
        assert "no script" in ask(sdk(srv), prompt, tools=None).choices[0].message.content
        assert [r["route"] for r in srv.model.requests] == ["pipeline:demo/question key=s1",
                                                              "pipeline:demo/question key=s1 repair=1", ""]


def test_the_route_header_is_the_clients() -> None:
    assert ROUTE_HEADER == LLM_ROUTE_HEADER
