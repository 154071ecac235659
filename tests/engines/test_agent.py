"""The shared agent loop, driven end to end: the offline scripted model over loopback HTTP, the
real local sandbox backend, the code_exec scene. Faults come from the offline model's fault
injection (model name "scripted-reference+fault=..."); retry waits are injected, not slept.
A small canned endpoint stands in where a reply the scripted model never gives is needed
(text JSON actions, reasoning_content, a tool the scene does not have).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from apps.engines.agent import EpisodeResult, parse_json_action, run_episode, truncate_text
from apps.engines.llm import LLMClient, Provider, cache_identity, reset_limiters
from apps.engines.models import SandboxRecord
from apps.engines.offline_model import MODEL_NAME, running_offline_model
from apps.engines.sandboxes import SandboxUnavailable, get_backend
from apps.engines.sandboxes.local import LocalBackend
from apps.engines.sandbox_records import records_destroyed
from apps.tasks.models import Task
from tests.engines.llm_servers import LoopbackServer, json_answer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

PROVIDER_ENV_VARS = [f"{p}_{v}" for p in ("GEMINI", "DEEPSEEK", "OPENAI", "VLLM") for v in ("API_KEY", "BASE_URL", "MODEL")]


# --- shared helpers (test_code_exec imports them) ----------------------------------------------


@pytest.fixture
def llm_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No provider from the environment, a private LLM cache, fast retries."""
    for name in PROVIDER_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    cache = {"BACKEND": "apps.engines.llm.LLMResponseCache",
             "LOCATION": str(tmp_path / "llm-cache"), "TIMEOUT": None}
    with override_settings(LLM_BASE_URL="", LLM_API_KEY="", LLM_MODEL="", LLM_PROVIDERS="", LLM_TIMEOUT_S=10.0,
                           LLM_MAX_RETRIES=2, CACHES={**settings.CACHES, "llm": cache}):
        reset_limiters()
        yield
    reset_limiters()


@pytest.fixture
def local() -> LocalBackend:
    return get_backend("local")


class Waits:
    """Records the retry waits the client asks for instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def asleep(self, seconds: float) -> None:
        self.delays.append(seconds)


def client(url: str, waits: Waits | None = None, api_key: str = "") -> LLMClient:
    waits = waits or Waits()
    return LLMClient([Provider("offline", url, MODEL_NAME, api_key)], asleep=waits.asleep, rand=lambda: 0.5,
                     limiters={})


def call(name: str, thought: str | None = None, **arguments: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"tool_calls": [{"name": name, "arguments": arguments}]}
    if thought is not None:
        step["thought"] = thought
    return step


def config_for(prompt: str, scene_config: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A real Task.config_snapshot() (unsaved task), plus loop-level extras like tool_mode."""
    extras = {k: fields.pop(k) for k in list(fields) if k in ("tool_mode",)}
    fields.setdefault("max_steps", 10)
    fields.setdefault("step_timeout_s", 10.0)
    fields.setdefault("timeout_s", 60.0)
    fields.setdefault("temperature", 0.0)
    task = Task(scene=fields.pop("scene", "code_exec"), prompt=prompt, scene_config=scene_config or {}, **fields)
    return {**task.config_snapshot(), **extras}


_samples = itertools.count()


def run(config: dict[str, Any], llm: LLMClient, **kw: Any) -> EpisodeResult:
    kw.setdefault("sandbox_backend", get_backend("local"))
    # A fresh sample identity per run: the LLM cache would otherwise replay an earlier run's
    # answers to the same prompt (which is what it is for).
    kw.setdefault("cache_key_extra", cache_identity(uuid.uuid4()))

    async def episode() -> EpisodeResult:
        try:
            return await run_episode(config=config, llm=llm, **kw)
        finally:
            await llm.aclose()  # this loop's HTTP sessions, as a worker's job closes them

    return asyncio.run(episode())


@contextmanager
def scripted(prompt: str, *steps: dict[str, Any], waits: Waits | None = None, api_key: str = "") -> Iterator[tuple[Any, LLMClient]]:
    with running_offline_model(scripts=[{"id": "s", "prompt": prompt, "reference_solution": list(steps)}]) as server:
        yield server, client(server.url, waits, api_key)


def assert_no_sandbox_left(backend: Any) -> None:
    assert backend.list() == []
    assert not SandboxRecord.objects.filter(state__in=SandboxRecord.LIVE).exists()


# A stored step's keys, in order (then what the step adds: error_kind, a tool's own keys, error, images).
STEP_KEYS = ["index", "turn", "tool_call_id", "tool", "arguments", "format", "thought", "observation", "llm",
             "output", "exit_code", "duration_ms", "truncated", "timed_out"]


def roles(result: EpisodeResult) -> list[str]:
    return [m["role"] for m in result.messages]


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, kind: str, message: str, data: dict[str, Any]) -> None:
        self.items.append((kind, message, data))

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.items]


# --- canned model: replies the scripted one never gives ---------------------------------------------


class Canned(LoopbackServer):
    """Answers chat completions with the given assistant messages in order; keeps the requests."""

    def __init__(self, messages: list[dict[str, Any]]):
        self.messages = messages
        self.requests: list[dict[str, Any]] = []
        super().__init__()

    def on_post(self, request: Any, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        self.requests.append(json.loads(raw))
        message = self.messages[min(len(self.requests), len(self.messages)) - 1]
        return json_answer({
            "id": "chatcmpl-canned", "object": "chat.completion", "created": 0, "model": "canned-model",
            "choices": [{"index": 0, "message": {"role": "assistant", **message},
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })


@contextmanager
def canned(*messages: dict[str, Any]) -> Iterator[tuple[Canned, LLMClient]]:
    with canned_as("canned", *messages) as served:
        yield served


def native_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


HELLO = "Create hello.txt containing hello."
HELLO_STEPS = (
    call("write_file", "Write it.", path="hello.txt", content="hello\n"),
    call("run_shell", command="cat hello.txt"),
    call("finish", "Done.", answer="hello.txt written"),
)


# --- the JSON-action parser ---------------------------------------------------------------------


def test_parse_json_action_reads_a_fenced_block_and_leaves_the_thought_around_it() -> None:
    text = 'I will list the files.\n```json\n{"tool": "run_shell", "arguments": {"command": "ls"}}\n```\n'
    action = parse_json_action(text)
    assert action is not None
    assert (action.name, action.arguments) == ("run_shell", {"command": "ls"})
    assert (text[: action.span[0]] + text[action.span[1]:]).strip() == "I will list the files."


def test_parse_json_action_accepts_bare_objects_and_the_usual_key_spellings() -> None:
    assert parse_json_action('ok {"name": "finish", "arguments": "{\\"answer\\": \\"42\\"}"}').arguments == {"answer": "42"}
    assert parse_json_action('{"action": "read_file", "action_input": {"path": "a"}}').name == "read_file"
    assert parse_json_action('{"function": {"name": "finish", "arguments": {"answer": "x"}}}').name == "finish"
    # A first object that is not an action is skipped.
    assert parse_json_action('data {"a": 1} then {"tool": "finish", "args": {"answer": "y"}}').arguments == {"answer": "y"}


def test_parse_json_action_finds_nothing_in_plain_text_or_broken_json() -> None:
    assert parse_json_action("I think the answer is 42.") is None
    assert parse_json_action('{"tool": "run_shell", "arguments": {"command": "ls"') is None
    assert parse_json_action('{"answer": 42}') is None
    assert parse_json_action(None) is None


def test_truncate_text_keeps_head_and_tail_around_a_marker() -> None:
    text = "H" * 5000 + "M" * 10000 + "T" * 5000
    cut, truncated = truncate_text(text, 8000)
    assert truncated and cut.startswith("H" * 100) and cut.endswith("T" * 100)
    assert "characters omitted" in cut and len(cut) < 8100
    assert truncate_text("short", 8000) == ("short", False)


# --- a normal run, as the worker sees it --------------------------------------------------------


def test_a_scripted_run_records_messages_steps_tokens_and_live_events_in_order(local: Any) -> None:
    events = Events()
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config_for(HELLO, system_prompt_extra="Prefer short files."), llm, on_event=events,
                     sandbox_backend=local)

    assert (result.outcome, result.reward, result.final_answer) == ("success", None, "hello.txt written")
    assert result.outcome_reason == "finished (no verifier)"
    assert roles(result) == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    system = result.messages[0]["content"]
    assert "/workspace" in system and "no network" in system and "finish(answer)" in system
    assert system.rstrip().endswith("## Hints\nPrefer short files.")
    assert result.messages[1] == {"role": "user", "content": HELLO}
    first_call = result.messages[2]["tool_calls"][0]
    assert json.loads(first_call["function"]["arguments"]) == {"path": "hello.txt", "content": "hello\n"}
    assert result.messages[3]["tool_call_id"] == first_call["id"] and result.messages[3]["name"] == "write_file"
    assert [t["function"]["name"] for t in result.tools] == ["run_shell", "write_file", "read_file", "finish"]

    shell = result.steps[1]
    assert shell["tool"] == "run_shell" and shell["exit_code"] == 0 and shell["duration_ms"] > 0
    assert "hello" in shell["output"] and shell["truncated"] is False and shell["timed_out"] is False
    assert shell["observation"].startswith("wrote 6 bytes")  # what the model saw before acting
    assert result.steps[0]["thought"] == "Write it." and result.steps[0]["exit_code"] is None  # no process ran
    assert result.steps[0]["llm"]["model"] == MODEL_NAME and result.steps[0]["llm"]["attempts"] == 1
    assert [s["index"] for s in result.steps] == [0, 1, 2]

    assert result.model == MODEL_NAME and result.provider == "offline" and result.llm_calls == 3
    assert result.total_tokens == result.prompt_tokens + result.completion_tokens > 0
    assert server.model.chat_requests == 3
    assert result.sandbox["destroyed"] is True and result.sandbox["backend"] == "local"
    assert_no_sandbox_left(local)

    kinds = events.kinds()
    assert kinds[0] == "system" and kinds[-1] == "result"
    assert kinds.index("action") < kinds.index("output")
    assert [k for k in kinds if k in ("thought", "action", "output")][:3] == ["thought", "action", "output"]
    assert events.items[-1][2]["outcome"] == "success"
    assert all(len(message) <= 200 for _, message, _ in events.items)


def test_with_on_sandbox_destroyed_the_caller_marks_the_record(local: Any) -> None:
    destroyed: list[Any] = []
    with scripted(HELLO, *HELLO_STEPS) as (_, llm):
        result = run(config_for(HELLO), llm, on_sandbox_destroyed=destroyed.append, sandbox_backend=local)
    assert result.outcome == "success" and result.sandbox["destroyed"] is True
    assert [sandbox.id for sandbox in destroyed] == [result.sandbox["id"]]
    assert local.list() == []  # the sandbox is gone ...
    record = SandboxRecord.objects.get(pk=result.sandbox["record_id"])
    assert record.state in SandboxRecord.LIVE  # ... its record is left to the caller
    assert records_destroyed(backend="local", external_ids=[result.sandbox["id"]], reason="destroyed") == 1
    assert_no_sandbox_left(local)


def test_an_episode_cancelled_hard_still_reports_its_sandbox_once_it_is_gone(local: Any) -> None:
    destroyed: list[Any] = []
    sandbox_ids: list[str] = []

    async def main() -> None:
        with scripted(HELLO, call("run_shell", command="sleep 30"), call("finish", answer="x")) as (_, llm):
            def on_event(kind: str, message: str, data: dict[str, Any]) -> None:
                if kind == "system" and "ready" in message:
                    sandbox_ids.append(data["id"])

            episode = asyncio.ensure_future(run_episode(
                config=config_for(HELLO), llm=llm, sandbox_backend=local, on_event=on_event,
                cache_key_extra={"sample": next(_samples)}, on_sandbox_destroyed=destroyed.append,
            ))
            for _ in range(500):  # until the command runs
                if sandbox_ids and local.list():
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            episode.cancel()  # as the worker's time limit does
            with pytest.raises(asyncio.CancelledError):
                await episode
            for _ in range(500):  # the shielded destroy goes on
                if destroyed:
                    break
                await asyncio.sleep(0.02)
            await llm.aclose()

    asyncio.run(main())
    assert [sandbox.id for sandbox in destroyed] == sandbox_ids and local.list() == []


def test_an_async_on_event_and_the_default_backend_work(local: Any) -> None:
    seen: list[str] = []

    async def on_event(kind: str, message: str, data: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        seen.append(kind)

    with scripted(HELLO, *HELLO_STEPS) as (_, llm):
        result = run(config_for(HELLO), llm, on_event=on_event, sandbox_backend=None)  # SANDBOX_BACKEND=local
    assert result.outcome == "success" and seen[-1] == "result" and "action" in seen
    assert_no_sandbox_left(local)


def test_a_failing_on_event_does_not_lose_the_episode(local: Any) -> None:
    def on_event(kind: str, message: str, data: dict[str, Any]) -> None:
        raise RuntimeError("log table is gone")

    with scripted(HELLO, *HELLO_STEPS) as (_, llm):
        result = run(config_for(HELLO), llm, on_event=on_event)
    assert result.outcome == "success"
    assert_no_sandbox_left(local)


def test_parallel_tool_calls_are_one_turn_and_calls_after_finish_are_not_executed(local: Any) -> None:
    prompt = "Make two files."
    both = {"tool_calls": [{"name": "write_file", "arguments": {"path": "a", "content": "1"}},
                           {"name": "write_file", "arguments": {"path": "b", "content": "2"}}]}
    end = {"tool_calls": [{"name": "finish", "arguments": {"answer": "done"}},
                          {"name": "run_shell", "arguments": {"command": "touch after-finish"}}]}
    with scripted(prompt, both, end) as (_, llm):
        result = run(config_for(prompt, max_steps=2), llm)
    assert result.outcome == "success" and result.llm_calls == 2
    assert [(s["tool"], s["turn"]) for s in result.steps] == [
        ("write_file", 1), ("write_file", 1), ("finish", 2), ("run_shell", 2)]
    assert result.steps[3]["error"].startswith("skipped") and result.steps[3]["exit_code"] is None
    # The stored step's keys in their order (apps.engines.steps.Step.to_record); a skipped call adds its error.
    assert [list(s) for s in result.steps] == [STEP_KEYS, STEP_KEYS, STEP_KEYS, [*STEP_KEYS, "error"]]
    assert roles(result)[-2:] == ["tool", "tool"]  # every tool call is answered
    assert_no_sandbox_left(local)


def test_the_same_sample_identity_replays_from_the_llm_cache(local: Any) -> None:
    identity = cache_identity(uuid.uuid4())
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        first = run(config_for(HELLO), llm, cache_key_extra=identity)
        again = run(config_for(HELLO), llm, cache_key_extra=identity)  # a retried trajectory: same UUID
        other = run(config_for(HELLO), llm, cache_key_extra=cache_identity(uuid.uuid4()))  # a new one
    assert first.cached_calls == 0 and again.cached_calls == again.llm_calls == 3 and other.cached_calls == 0
    assert server.model.chat_requests == 6  # the replay asked nothing
    assert again.messages == first.messages and again.outcome == "success"
    assert again.steps[0]["llm"]["cached"] is True and again.steps[0]["llm"]["attempts"] == 0
    assert_no_sandbox_left(local)


def test_an_explicit_replay_is_served_another_trajectorys_answers_and_recorded_as_such(local: Any) -> None:
    original, replaying = uuid.uuid4(), uuid.uuid4()
    events = Events()
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        first = run(config_for(HELLO), llm, cache_key_extra=cache_identity(original))
        replay = run({**config_for(HELLO), "replay_of": str(original)}, llm,
                     cache_key_extra=cache_identity(replaying), on_event=events)
        own = run(config_for(HELLO), llm, cache_key_extra=cache_identity(replaying))
    assert replay.cached_calls == replay.llm_calls == 3 and replay.messages == first.messages
    assert server.model.chat_requests == 6  # the replay asked nothing; the replaying trajectory alone asks anew
    assert own.cached_calls == 0
    assert [s["llm"].get("replay_of") for s in replay.steps] == [str(original)] * 3
    assert "replay_of" not in first.steps[0]["llm"]
    assert any(kind == "system" and f"explicit replay of trajectory {original}" in message
               for kind, message, _ in events.items)
    assert_no_sandbox_left(local)


def test_a_toucan_task_naming_an_unregistered_server_is_a_config_error(local: Any) -> None:
    config = {**config_for(HELLO), "scene": "toucan",
              "scene_config": {"target_servers": ["nowhere"], "target_tools": ["nowhere__x"]}}
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config, llm)
    assert (result.outcome, result.error_kind) == ("error", "config")
    assert result.outcome_reason.startswith("the scene's tools could not be listed:") and "nowhere" in result.outcome_reason
    assert server.model.chat_requests == 0
    assert_no_sandbox_left(local)


def test_a_replay_of_something_that_is_not_a_uuid_is_a_config_error(local: Any) -> None:
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run({**config_for(HELLO), "replay_of": "7"}, llm)
    assert (result.outcome, result.error_kind) == ("error", "config")
    assert result.outcome_reason == "replay_of must be a trajectory's UUID, got '7'"
    assert server.model.chat_requests == 0


def test_after_its_first_cache_miss_an_episode_stops_looking_its_requests_up(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    identity = cache_identity(uuid.uuid4())
    lookups: list[bool] = []
    real_get = LLMClient._acache_get

    async def counting_get(self: LLMClient, calls: Any) -> Any:
        hit = await real_get(self, calls)
        lookups.append(hit is not None)
        return hit

    monkeypatch.setattr(LLMClient, "_acache_get", counting_get)
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        first = run(config_for(HELLO), llm, cache_key_extra=identity)
        fresh = list(lookups)
        lookups.clear()
        again = run(config_for(HELLO), llm, cache_key_extra=identity)
    # A fresh episode: one lookup (a miss), then none; every reply was still stored, since the
    # replay is answered from the cache on every turn, each one looked up.
    assert first.llm_calls == 3 and fresh == [False]
    assert again.cached_calls == again.llm_calls == 3 and lookups == [True, True, True]
    assert server.model.chat_requests == 3 and again.messages == first.messages


def test_episodes_run_concurrently_on_one_event_loop(local: Any) -> None:
    """A's command waits for a file that only B's end creates: if sandbox calls blocked the
    event loop, B could never finish and A's command would time out."""
    waiting, quick = "Wait for the go signal.", "Do something quick."
    a_steps = (call("run_shell", command="while [ ! -e go ]; do sleep 0.02; done; echo released"),
               call("finish", answer="released"))
    a_sandbox: dict[str, str] = {}

    def a_events(kind: str, message: str, data: dict[str, Any]) -> None:
        if "record_id" in data:
            a_sandbox["id"] = data["id"]

    def b_events(kind: str, message: str, data: dict[str, Any]) -> None:
        if kind == "result":
            local.get(a_sandbox["id"]).write_file("go", b"")

    async def both(llm_a: LLMClient, llm_b: LLMClient) -> list[EpisodeResult]:
        try:
            return await asyncio.gather(
                run_episode(config=config_for(waiting, step_timeout_s=20.0), llm=llm_a, sandbox_backend=local,
                            on_event=a_events),
                run_episode(config=config_for(quick), llm=llm_b, sandbox_backend=local, on_event=b_events),
            )
        finally:
            await llm_a.aclose()
            await llm_b.aclose()

    with scripted(waiting, *a_steps) as (_, llm_a), scripted(quick, *HELLO_STEPS) as (_, llm_b):
        a, b = asyncio.run(both(llm_a, llm_b))
    assert b.outcome == "success"
    assert a.outcome == "success" and a.steps[0]["exit_code"] == 0 and "released" in a.steps[0]["output"]
    assert a.sandbox["id"] != b.sandbox["id"]
    assert_no_sandbox_left(local)


# --- LLM faults: errors, never thoughts -----------------------------------------------------------


def test_a_429_with_retry_after_is_waited_for_then_the_run_succeeds(local: Any, make_task: Any, client: Any) -> None:
    waits = Waits()
    with scripted(HELLO, *HELLO_STEPS, waits=waits) as (server, llm):
        result = run(config_for(HELLO, model=f"{MODEL_NAME}+fault=429;retry_after=3;times=1"), llm)
    assert result.outcome == "success"
    assert waits.delays == [3.0]
    assert result.steps[0]["llm"]["attempts"] == 2 and server.model.chat_requests == 4
    assert result.steps[0]["llm"]["rate_limited"] == 1 and "rate_limited" not in result.steps[-1]["llm"]
    # /metrics counts the 429 apart from the provider's other retried attempts, from the stored steps
    from django.utils import timezone

    from apps.tasks.models import Trajectory
    from tests.api.test_health_metrics import parse_prometheus

    Trajectory.objects.create(task=make_task(), iteration=1, sample_index=0, status="finished", outcome="success",
                              finished_at=timezone.now(), steps=result.steps)
    samples = parse_prometheus(client.get("/metrics").content.decode())
    provider = frozenset({("provider", result.steps[0]["llm"]["provider"])})
    assert samples[("trajplatform_llm_rate_limited", provider)] == samples[("trajplatform_llm_retries", provider)] == 1
    assert result.model == MODEL_NAME  # the model that answered, not the fault-laden name asked for
    assert result.requested_model.startswith(f"{MODEL_NAME}+fault=")
    assert_no_sandbox_left(local)


def test_a_persistent_500_ends_as_an_llm_error_and_is_not_recorded_as_a_thought(local: Any) -> None:
    waits, events = Waits(), Events()
    with scripted(HELLO, *HELLO_STEPS, waits=waits) as (server, llm):
        result = run(config_for(HELLO, model=f"{MODEL_NAME}+fault=500"), llm, on_event=events)
    assert result.outcome == "error" and result.error_kind == "llm" and result.retryable is True
    assert "LLM error" in result.outcome_reason and "HTTP 500" in result.outcome_reason
    assert "after 3 attempts" in result.outcome_reason and len(waits.delays) == 2
    assert roles(result) == ["system", "user"] and result.steps == [] and result.cancelled is False
    assert "thought" not in events.kinds() and "error" in events.kinds()
    assert result.model == "" and result.sandbox["destroyed"] is True
    assert server.model.chat_requests == 3
    assert_no_sandbox_left(local)


def test_a_model_slower_than_the_llm_timeout_is_an_error(local: Any) -> None:
    with override_settings(LLM_TIMEOUT_S=0.3, LLM_MAX_RETRIES=0):
        with scripted(HELLO, *HELLO_STEPS) as (_, llm):
            result = run(config_for(HELLO, model=f"{MODEL_NAME}+fault=slow;seconds=5"), llm)
    assert result.outcome == "error" and result.error_kind == "llm"
    assert "LLMTimeout" in result.outcome_reason and "timed out" in result.outcome_reason
    assert result.steps == []
    assert_no_sandbox_left(local)


# --- what the model does wrong: fed back, or a failure ----------------------------------------------


def test_malformed_tool_arguments_are_fed_back_and_the_agent_recovers(local: Any) -> None:
    prompt = "Say hi in a file."
    steps = (call("run_shell", command="echo probe"),
             call("write_file", path="hi.txt", content="hi"),
             call("finish", answer="ok"))
    with scripted(prompt, *steps) as (_, llm):
        result = run(config_for(prompt, model=f"{MODEL_NAME}+fault=malformed;times=1"), llm)
    assert result.outcome == "success"
    bad = result.steps[0]
    assert "not valid JSON" in bad["error"] and bad["output"].startswith("error: ")
    assert list(bad) == [*STEP_KEYS, "error_kind", "error"]
    assert bad["exit_code"] is None and isinstance(bad["arguments"], str)  # the raw text the model sent
    assert result.messages[3]["role"] == "tool" and result.messages[3]["content"] == bad["output"]
    assert "error" not in result.steps[1] and result.steps[1]["output"].startswith("wrote 2 bytes")
    assert_no_sandbox_left(local)


def test_malformed_arguments_every_time_end_as_a_failure_at_max_steps(local: Any) -> None:
    with scripted(HELLO, *HELLO_STEPS) as (_, llm):
        result = run(config_for(HELLO, max_steps=3, model=f"{MODEL_NAME}+fault=malformed"), llm)
    assert result.outcome == "failure" and result.outcome_reason == "max_steps (3) reached without finish"
    assert len(result.steps) == 3 and all("not valid JSON" in s["error"] for s in result.steps)
    assert result.final_answer == ""
    assert_no_sandbox_left(local)


def test_invalid_arguments_and_unknown_tools_are_tool_errors(local: Any) -> None:
    replies = (
        {"content": None, "tool_calls": [native_call("c1", "write_file", {"path": "a.txt"})]},
        {"content": None, "tool_calls": [native_call("c2", "browse", {"url": "http://x"})]},
        {"content": None, "tool_calls": [native_call("c3", "run_shell", [1, 2])]},
        {"content": None, "tool_calls": [native_call("c4", "finish", {"answer": "gave up"})]},
    )
    with canned(*replies) as (_, llm):
        result = run(config_for("Anything."), llm)
    assert result.outcome == "success" and result.model == "canned-model"
    errors = [s.get("error", "") for s in result.steps[:3]]
    assert "'content' is a required property" in errors[0]
    assert "unknown tool 'browse'" in errors[1] and "run_shell" in errors[1]
    assert "must be a JSON object" in errors[2]
    assert_no_sandbox_left(local)


SCHEMA_BREAKING_CALLS = (
    {"content": None, "tool_calls": [native_call("c1", "write_file", {"path": "a.txt"})]},
    {"content": None, "tool_calls": [native_call("c2", "run_shell", {"command": 5})]},
    {"content": None, "tool_calls": [native_call("c3", "run_shell", [1, 2])]},
    {"content": None, "tool_calls": [native_call("c4", "run_shell", '{"command": "ls"')]},
    {"content": None, "tool_calls": [native_call("c5", "finish", {"answer": "gave up"})]},
)


def test_a_step_records_parsed_arguments_and_whether_they_were_unparseable_or_broke_the_schema(local: Any) -> None:
    with canned(*SCHEMA_BREAKING_CALLS) as (_, llm):
        result = run(config_for("Anything."), llm)
    assert result.outcome == "success"
    steps = result.steps[:4]
    assert [s.get("error_kind") for s in steps] == [
        "invalid_arguments", "invalid_arguments", "invalid_arguments", "unparseable_arguments"]
    # The arguments as the model meant them, not the JSON text, whenever they parse.
    assert [s["arguments"] for s in steps[:3]] == [{"path": "a.txt"}, {"command": 5}, [1, 2]]
    assert steps[3]["arguments"] == '{"command": "ls"'  # only unparseable text stays a string
    assert "error_kind" not in result.steps[4]
    assert_no_sandbox_left(local)


def test_never_finishing_is_a_failure_naming_max_steps(local: Any) -> None:
    with scripted(HELLO, *HELLO_STEPS) as (_, llm):
        result = run(config_for(HELLO, max_steps=4, model=f"{MODEL_NAME}+fault=never_finish"), llm)
    assert result.outcome == "failure" and "max_steps (4)" in result.outcome_reason
    assert roles(result).count("assistant") == 4 and all(s["tool"] != "finish" for s in result.steps)
    assert result.reward is None and result.verifier_output == {}
    assert_no_sandbox_left(local)


def test_text_without_a_tool_call_gets_one_corrective_turn_then_is_an_error(local: Any) -> None:
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config_for(HELLO, model=f"{MODEL_NAME}+fault=text_only"), llm)
    assert result.outcome == "error" and result.error_kind == "model_output"
    assert "no tool call" in result.outcome_reason and "corrective" in result.outcome_reason
    assert roles(result) == ["system", "user", "assistant", "user", "assistant"]
    assert "did not call a tool" in result.messages[3]["content"]
    assert server.model.chat_requests == 2 and result.steps == []
    assert_no_sandbox_left(local)


def test_one_text_reply_is_corrected_and_the_run_goes_on(local: Any) -> None:
    prompt = "Write a file after looking around."
    steps = (call("run_shell", "Looking around first.", command="ls"),
             call("write_file", path="x.txt", content="x"),
             call("finish", answer="x written"))
    with scripted(prompt, *steps) as (_, llm):
        result = run(config_for(prompt, model=f"{MODEL_NAME}+fault=text_only;times=1"), llm)
    assert result.outcome == "success"
    assert roles(result)[2:5] == ["assistant", "user", "assistant"]
    assert result.messages[2]["content"] == "Looking around first." and "tool_calls" not in result.messages[2]
    assert [s["tool"] for s in result.steps] == ["write_file", "finish"]
    assert_no_sandbox_left(local)


def test_a_json_action_in_text_is_executed_on_the_same_loop(local: Any) -> None:
    prompt = "Answer in a file, then finish in text."
    steps = (call("write_file", path="answer.txt", content="42"),
             {"content": 'All set.\n```json\n{"tool": "finish", "arguments": {"answer": "42"}}\n```'})
    with scripted(prompt, *steps) as (_, llm):
        result = run(config_for(prompt), llm)
    assert result.outcome == "success" and result.final_answer == "42"
    finish = result.steps[1]
    assert finish["format"] == "json_text" and finish["thought"] == "All set." and finish["tool_call_id"] is None
    # The assistant's text is recorded as it was said; the result goes back as a user message.
    assert "tool_calls" not in result.messages[4] and result.messages[5]["role"] == "user"
    assert_no_sandbox_left(local)


def test_tool_mode_json_sends_no_tools_and_runs_text_actions(local: Any) -> None:
    replies = (
        {"content": 'Writing.\n```json\n{"tool": "write_file", "arguments": {"path": "n.txt", "content": "7"}}\n```'},
        {"content": '{"tool": "run_shell", "arguments": {"command": "cat n.txt; exit 4"}}'},
        {"content": "I am done."},  # no action: corrected
        {"content": '{"tool": "finish", "arguments": {"answer": "7"}}'},
    )
    with canned(*replies) as (server, llm):
        result = run(config_for("Write 7 to n.txt.", tool_mode="json"), llm)
    assert result.outcome == "success" and result.final_answer == "7"
    assert all("tools" not in body for body in server.requests)
    assert '"tool": "<tool name>"' in result.messages[0]["content"]
    shell = result.steps[1]
    assert shell["exit_code"] == 4 and "7" in shell["output"]  # the real status of `exit 4`
    assert roles(result) == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user",
                             "assistant", "user"]
    assert "JSON action" in result.messages[7]["content"]  # the corrective turn, in JSON terms
    assert_no_sandbox_left(local)


def test_reasoning_content_is_recorded_as_the_thought_but_not_sent_back(local: Any) -> None:
    replies = (
        {"content": None, "reasoning_content": "The file must exist first.",
         "tool_calls": [native_call("c1", "write_file", {"path": "r.txt", "content": "r"})]},
        {"content": "Finishing.", "tool_calls": [native_call("c2", "finish", {"answer": "r"})]},
    )
    with canned(*replies) as (server, llm):
        result = run(config_for("Write r.txt."), llm)
    assert result.outcome == "success"
    assert result.steps[0]["thought"] == "The file must exist first."
    assert result.steps[0]["reasoning_content"] == "The file must exist first."
    assert result.messages[2]["reasoning_content"] == "The file must exist first."
    assert all("reasoning_content" not in m for m in server.requests[1]["messages"])
    assert_no_sandbox_left(local)


# --- limits and cancel ------------------------------------------------------------------------------


def test_cancel_is_honoured_between_steps(local: Any) -> None:
    asked = {"n": 0}

    def should_cancel() -> bool:
        asked["n"] += 1
        return asked["n"] >= 3  # before set-up, before turn 1: no; before turn 2: yes

    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config_for(HELLO), llm, should_cancel=should_cancel)
    assert result.cancelled is True and result.outcome == "error" and result.outcome_reason == "cancelled"
    assert result.error_kind == "cancelled" and len(result.steps) == 1 and server.model.chat_requests == 1
    assert result.sandbox["destroyed"] is True
    assert_no_sandbox_left(local)


def test_an_async_should_cancel_before_the_start_creates_no_sandbox(local: Any) -> None:
    async def should_cancel() -> bool:
        return True

    before = _last_record_pk()
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config_for(HELLO), llm, should_cancel=should_cancel)
    assert result.cancelled and result.outcome_reason == "cancelled" and server.model.chat_requests == 0
    assert result.sandbox == {} and not SandboxRecord.objects.filter(pk__gt=before).exists()


def test_the_token_budget_stops_the_run_as_a_failure(local: Any) -> None:
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config_for(HELLO, max_tokens=50), llm)
    assert result.outcome == "failure" and result.outcome_reason.startswith("token budget (50) exhausted")
    assert result.total_tokens >= 50 and server.model.chat_requests == 1 and len(result.steps) == 1
    assert_no_sandbox_left(local)


def test_the_wall_clock_limit_clips_a_command_and_fails_the_run(local: Any) -> None:
    prompt = "Wait a long time."
    with scripted(prompt, call("run_shell", command="sleep 30"), call("finish", answer="waited")) as (server, llm):
        result = run(config_for(prompt, timeout_s=0.5, step_timeout_s=20.0), llm)
    assert result.outcome == "failure" and result.outcome_reason == "wall-clock timeout (0.5s) reached without finish"
    step = result.steps[0]
    assert step["timed_out"] is True and step["exit_code"] is None
    killed_after = float(re.match(r"timed out: killed after ([\d.]+)s", step["output"]).group(1))
    assert killed_after <= 0.5  # clipped to the episode's clock, not the 20 s step limit
    assert server.model.chat_requests == 1
    assert_no_sandbox_left(local)


# --- scenes and infrastructure --------------------------------------------------------------------


def test_a_scene_without_an_engine_is_an_honest_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.engines import registry

    monkeypatch.delitem(registry.RUNTIMES, "gui")  # a registered scene whose engine is not there
    monkeypatch.setattr(registry, "_instances", {})
    before = _last_record_pk()
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        gui = run(config_for(HELLO, scene="gui"), llm)
        bogus = run({**config_for(HELLO), "scene": "teleport"}, llm)
    assert (gui.outcome, gui.outcome_reason, gui.error_kind) == ("error", "scene gui has no engine yet", "config")
    assert bogus.outcome == "error" and "unknown scene 'teleport'" in bogus.outcome_reason
    assert gui.messages == [] and gui.steps == [] and server.model.chat_requests == 0
    assert not SandboxRecord.objects.filter(pk__gt=before).exists()


def _last_record_pk() -> int:
    """The newest SandboxRecord's pk (0 when none): the records a test writes are those after it
    (PostgreSQL's shared test database can hold rows other tests' leftover threads committed)."""
    return SandboxRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


class _BrokenBackend(LocalBackend):
    def _create(self, spec: Any, labels: dict[str, str]) -> Any:
        raise SandboxUnavailable("no bubblewrap on this host")


def test_a_sandbox_that_cannot_be_created_is_an_infrastructure_error() -> None:
    before = _last_record_pk()
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config_for(HELLO), llm, sandbox_backend=_BrokenBackend())
    assert result.outcome == "error" and result.error_kind == "infrastructure" and result.retryable
    assert result.outcome_reason.startswith("infrastructure: sandbox creation failed")
    # The first model turn overlaps the sandbox's creation: at most that one call, and no step ran.
    assert "no bubblewrap" in result.outcome_reason and server.model.chat_requests <= 1 and result.steps == []
    assert SandboxRecord.objects.get(pk__gt=before).state == SandboxRecord.State.FAILED


def test_a_configured_api_key_never_appears_in_the_result(local: Any) -> None:
    key = "zq-live-8Hc2Lm4Qx7Vt1Rb9Pn3Kd6Wf"
    prompt = "Show the key."
    # The command assembles the secrets, so only the sandbox's output carries them whole.
    steps = (call("run_shell", f"The key is {key}.",
                  command=f"echo {key[:10]}''{key[10:]}; echo sk-abcdefghij''klmnopqrstuvwx >&2"),
             call("finish", answer=f"key {key}"))
    with override_settings(LLM_API_KEY=key):
        with scripted(prompt, *steps, api_key=key) as (server, llm):
            result = run(config_for(prompt), llm)
            sent = json.dumps(list(server.model.requests))
        dumped = json.dumps([result.messages, result.steps, result.final_answer, result.outcome_reason,
                             result.verifier_output], default=str)
    assert result.outcome == "success"
    assert key not in dumped and "sk-abcdefghijklmnopqrstuvwx" not in dumped
    assert key not in sent and "sk-abcdefghijklmnopqrstuvwx" not in sent  # nor sent on to the provider
    assert "[REDACTED]" in result.steps[0]["output"] and "[REDACTED]" in result.final_answer
    assert_no_sandbox_left(local)


class _SlowBrokenBackend(LocalBackend):
    def _create(self, spec: Any, labels: dict[str, str]) -> Any:
        time.sleep(0.3)
        raise SandboxUnavailable("no bubblewrap on this host")


def test_the_first_model_call_overlaps_the_sandbox_start_and_is_cancelled_when_the_sandbox_fails() -> None:
    # The model takes 5 s; the sandbox fails after 0.3 s: the episode ends then, not 5 s later,
    # and the unanswered call is not counted as made.
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        started = time.monotonic()
        result = run(config_for(HELLO, model=f"{MODEL_NAME}+fault=slow;seconds=5"), llm,
                     sandbox_backend=_SlowBrokenBackend())
        elapsed = time.monotonic() - started
    assert result.outcome_reason.startswith("infrastructure: sandbox creation failed")
    assert elapsed < 4 and result.llm_calls == 0 and result.steps == []
    assert server.model.chat_requests == 1  # it was asked while the sandbox was being made


# --- replies normalised, reasoning echoed by profile, the context budget ------------------------------


@contextmanager
def canned_as(profile: str, *messages: dict[str, Any], model: str = "canned-model") -> Iterator[tuple[Canned, LLMClient]]:
    """The canned endpoint, configured as a provider of that profile (named after it)."""
    server = Canned(list(messages))
    try:
        yield server, LLMClient([Provider(profile, server.url, model, "")], limiters={})
    finally:
        server.close()


def test_empty_and_repeated_tool_call_ids_are_replaced_so_every_result_pairs_with_its_call(local: Any) -> None:
    replies = (
        {"content": None, "tool_calls": [native_call("", "write_file", {"path": "a.txt", "content": "a"}),
                                         native_call("", "run_shell", {"command": "cat a.txt"})]},
        {"content": None, "tool_calls": [native_call("", "finish", {"answer": "a"})]},
    )
    with canned(*replies) as (server, llm):
        result = run(config_for("Write a.txt."), llm)
    assert result.outcome == "success"
    calls = [c["id"] for m in result.messages if m["role"] == "assistant" for c in m["tool_calls"]]
    answered = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
    assert calls == answered == ["call_1_0", "call_1_1", "call_2_0"]
    assert [s["tool_call_id"] for s in result.steps] == calls
    assert [s["provider_tool_call_id"] for s in result.steps] == ["", "", ""]
    # What the provider was sent pairs too.
    sent = server.requests[1]["messages"]
    assert [c["id"] for c in sent[2]["tool_calls"]] == [sent[3]["tool_call_id"], sent[4]["tool_call_id"]]
    assert_no_sandbox_left(local)


def test_a_server_without_parsers_gets_its_think_blocks_and_text_tool_calls_out_of_the_content(local: Any) -> None:
    replies = (
        {"content": '<think>Write it first.</think>\nWriting.\n<tool_call>\n{"name": "write_file", "arguments": '
                    '{"path": "q.txt", "content": "q"}}\n</tool_call>'},
        {"content": '<think>Done now.</think><tool_call>{"name": "finish", "arguments": {"answer": "q"}}</tool_call>'},
    )
    with canned_as("vllm-noparser", *replies) as (server, llm):
        result = run(config_for("Write q.txt."), llm)
    assert result.outcome == "success" and result.final_answer == "q"
    first = result.messages[2]
    assert first["content"] == "Writing." and first["reasoning_content"] == "Write it first."
    assert first["tool_calls"][0]["function"]["name"] == "write_file"
    assert result.messages[3] == {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "name": "write_file",
                                  "content": result.steps[0]["output"]}
    assert [s["format"] for s in result.steps] == ["hermes_text", "hermes_text"]
    assert result.steps[0]["thought"] == "Writing." and result.steps[0]["reasoning_content"] == "Write it first."
    assert list(result.steps[0]) == [*STEP_KEYS[:9], "reasoning_content", "provider_tool_call_id", *STEP_KEYS[9:]]
    stored = json.dumps(result.messages)
    assert "<think>" not in stored and "<tool_call>" not in stored
    # Qwen3's template drops earlier thinking: the profile sends none back.
    assert "reasoning_content" not in server.requests[1]["messages"][2]
    # The exporters' reasoning option decides whether trainers see it; never as visible text.
    from apps.datasets.exporters.chat import render_messages

    plain = render_messages({"messages": result.messages}, arguments="string")
    kept = render_messages({"messages": result.messages}, arguments="string", reasoning=True)
    assert "Write it first." not in json.dumps(plain) and kept[2]["reasoning_content"] == "Write it first."
    assert_no_sandbox_left(local)


def test_deepseek_thinking_gets_the_reasoning_of_tool_turns_back_in_every_later_request(local: Any) -> None:
    replies = (
        {"content": None, "reasoning_content": "Need the file.",
         "tool_calls": [native_call("c1", "write_file", {"path": "d.txt", "content": "d"})]},
        {"content": None, "reasoning_content": "Check it.", "tool_calls": [native_call("c2", "run_shell", {"command": "cat d.txt"})]},
        {"content": None, "reasoning_content": "Finish.", "tool_calls": [native_call("c3", "finish", {"answer": "d"})]},
    )
    with canned_as("deepseek", *replies, model="deepseek-v4-flash") as (server, llm):
        result = run(config_for("Write d.txt."), llm)
    assert result.outcome == "success"
    last = server.requests[2]["messages"]
    assert [m.get("reasoning_content") for m in last if m["role"] == "assistant"] == ["Need the file.", "Check it."]
    # Each request extends the one before it byte for byte (what the provider's prompt cache needs).
    for before, after in zip(server.requests, server.requests[1:]):
        assert json.dumps(after["messages"]).startswith(json.dumps(before["messages"])[:-1])
    assert_no_sandbox_left(local)


def test_each_request_is_a_byte_identical_extension_of_the_previous_one(local: Any) -> None:
    with scripted(HELLO, *HELLO_STEPS) as (server, llm):
        result = run(config_for(HELLO), llm)
    assert result.outcome == "success"
    bodies = [json.dumps(r["body"]["messages"]) for r in server.model.requests]
    assert len(bodies) == 3
    for before, after in zip(bodies, bodies[1:]):
        assert after.startswith(before[:-1]) and len(after) > len(before)
    assert all(s["llm"]["prompt_tokens"] > 0 and "elided" not in s["llm"]["context"] for s in result.steps)
    assert_no_sandbox_left(local)


def _loud(n: int) -> dict[str, Any]:
    return native_call(f"c{n}", "run_shell", {"command": f"python3 -c \"print('{n}' * 3000)\""})


def test_the_context_budget_elides_the_oldest_observations_with_a_marker(local: Any) -> None:
    replies = tuple({"content": None, "tool_calls": [_loud(n)]} for n in range(1, 6)) + (
        {"content": None, "tool_calls": [native_call("c9", "finish", {"answer": "ok"})]},)
    small = json.dumps({"custom": {"default_context_window": 4500, "default_max_output": 500}})
    with override_settings(LLM_PROFILES=small), canned(*replies) as (server, llm):
        result = run(config_for("Print a lot.", max_steps=8), llm)
    assert result.outcome == "success", result.outcome_reason
    tools = [m for m in result.messages if m["role"] == "tool"]
    elided = [m for m in tools if m["content"].startswith("[observation elided to fit the model's context window")]
    assert elided and tools[0] in elided and tools[-1] not in elided  # oldest first, never the latest
    assert re.search(r": 30\d\d characters of run_shell removed\]$", elided[0]["content"])
    notes = [s["llm"]["context"] for s in result.steps]
    assert any(n.get("elided") for n in notes) and all(n["tokens"] <= n["limit"] == 4000 for n in notes)
    assert all(len(json.dumps(r["messages"])) / 3 <= 4000 for r in server.requests)
    assert "1" * 3000 in result.steps[0]["output"]  # the step keeps what the model saw then
    assert_no_sandbox_left(local)


def test_an_episode_that_cannot_fit_the_context_is_a_config_error_before_any_request(local: Any) -> None:
    tiny = json.dumps({"custom": {"default_context_window": 600, "default_max_output": 400}})
    with override_settings(LLM_PROFILES=tiny), canned({"content": "never asked"}) as (server, llm):
        result = run(config_for("Do it."), llm)
    assert (result.outcome, result.error_kind) == ("error", "config")
    assert "does not fit the context" in result.outcome_reason and "200 the model's context allows" in result.outcome_reason
    assert server.requests == []
    assert_no_sandbox_left(local)
