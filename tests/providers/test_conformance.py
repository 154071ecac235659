"""Every profile's rules, and bundled tasks run end to end through every profile's stand-in.

The rollouts of one scene run at once on one event loop (one LLM client and stand-in per
profile), then each is checked: it succeeded, the stand-in refused nothing, what was sent
(reasoning echoed as the profile says, no reasoning or tool-call text or routing markers in
what went back, no parameter the profile says the provider ignores), what was stored (reasoning
as reasoning_content, visible text without it), the token counts and cache hits each step
records, and the cost (the stand-in's own usage priced by the profile's price list).
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from apps.engines import profiles
from apps.engines.agent import EpisodeResult, run_episode
from apps.engines.llm import LLMClient, Provider, cache_identity
from apps.engines.offline_model import MODEL_NAME, OfflineModelServer, ScriptedModel, ScriptRegistry, parse_script
from apps.engines.sandboxes import get_backend
from tests.engines.test_agent import config_for
from tests.engines.test_envscaler_runtime import SOLUTIONS, task_config
from tests.providers.standin import SERVED_MODEL, StandIn, running_standin

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

EXAMPLES = Path(settings.BASE_DIR) / "examples"
CODE = {r["external_id"]: r for r in map(json.loads, (EXAMPLES / "tasks" / "code_exec.jsonl").read_text().splitlines())}
GUI = {r["external_id"]: r for r in map(json.loads, (EXAMPLES / "tasks" / "gui.jsonl").read_text().splitlines())}
ENVSCALER_TASK = "clinic-book-after-conflict"

# How the self-hosted stand-ins send tool-call ids: some OpenAI-compatible servers send "" for
# every call, others number the calls of each reply from 0 (the same ids every turn).
SLOPPY_IDS = {"vllm": "empty", "ollama": "empty", "sglang": "repeat", "custom": "repeat"}
# Nothing a provider is sent may carry these: reasoning or tool-call text in content, test hooks.
MARKERS = ("<think>", "</think>", "<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "[pipeline:",
           "[trajplatform-judge]", "[script:")
# gui (a browser per episode) runs through the profiles whose rules differ most: DeepSeek's
# thinking echo, a server without parsers (text tool calls, <think> in content), OpenAI's
# max_completion_tokens and no reasoning. The other profiles run code_exec and envscaler.
GUI_PROFILES = ("deepseek", "vllm-noparser", "openai")


def standin_profiles() -> list[str]:
    return [pid for pid, p in profiles.all_profiles().items() if not p.routing_headers]


def model_of(profile: profiles.Profile) -> str:
    return profile.default_model or next(iter(profile.models), None) or SERVED_MODEL


LOUD = "Print three thousand digits, five times over, then finish."
LOUD_SCRIPT = {"id": "loud", "prompt": LOUD, "reference_solution": [
    *({"tool_calls": [{"name": "run_shell", "arguments": {"command": f"python3 -c \"print('{n}' * 3000)\""}}]}
      for n in range(1, 6)),
    {"tool_calls": [{"name": "finish", "arguments": {"answer": "printed"}}]}]}


def registry() -> ScriptRegistry:
    scripts = [{"id": r["external_id"], "prompt": r["prompt"], "reference_solution": r["reference_solution"]}
               for r in (*CODE.values(), *GUI.values())]
    scripts += [*SOLUTIONS.values(), LOUD_SCRIPT]
    return ScriptRegistry(parse_script(s, where=f"script {i}", default_id=f"s{i}") for i, s in enumerate(scripts))


def code_config() -> dict[str, Any]:
    row = CODE["code-001-merge-intervals"]
    return config_for(row["prompt"], row["config"], scene="code_exec", max_steps=row["max_steps"], timeout_s=300)


def gui_config() -> dict[str, Any]:
    row = GUI["gui-miniwob-click-button-s1"]
    return config_for(row["prompt"], row["config"], scene="gui", max_steps=row["max_steps"], timeout_s=300)


def rollouts(pids: list[str], config: dict[str, Any], *, extra_settings: dict[str, Any] | None = None
             ) -> dict[str, tuple[Any, EpisodeResult, str]]:
    """Run the task once through each profile's stand-in (and the offline model), all at once."""
    scripts = registry()
    with ExitStack() as stack:
        if extra_settings:
            stack.enter_context(override_settings(**extra_settings))
        servers: dict[str, Any] = {}
        clients: dict[str, LLMClient] = {}
        for pid in pids:
            profile = profiles.get(pid)
            if profile.routing_headers:  # the offline model is its own stand-in
                offline = OfflineModelServer(ScriptedModel(scripts)).start()
                stack.callback(offline.stop)
                servers[pid], model = offline, MODEL_NAME
            else:
                servers[pid] = stack.enter_context(running_standin(profile, ScriptedModel(scripts),
                                                                   ids=SLOPPY_IDS.get(pid, "given")))
                model = model_of(profile)
            clients[pid] = LLMClient([Provider(pid, servers[pid].url, model, "sk-standin", profile=pid)], limiters={})
        backend = get_backend("local")

        async def one(pid: str) -> EpisodeResult:
            try:
                return await run_episode(config=config, llm=clients[pid], sandbox_backend=backend,
                                         cache_key_extra=cache_identity(uuid.uuid4()))
            finally:
                await clients[pid].aclose()

        async def every() -> list[EpisodeResult]:
            return await asyncio.gather(*(one(pid) for pid in pids))

        results = asyncio.run(every())
        return {pid: (servers[pid], result, clients[pid].primary.model) for pid, result in zip(pids, results)}


def problems_of(pid: str, server: Any, result: EpisodeResult, model: str) -> list[str]:
    """What is wrong with one profile's rollout ([] when it conforms)."""
    problems: list[str] = []
    if (result.outcome, result.reward) != ("success", 1.0):
        return [f"{pid}: {result.outcome} {result.reward}: {result.outcome_reason}"]
    assistants = [m for m in result.messages if m["role"] == "assistant"]
    stored = json.dumps([m.get("content") for m in assistants])
    problems += [f"{pid}: stored content keeps {m}" for m in MARKERS[:5] if m in stored]
    if not isinstance(server, StandIn):
        return problems
    profile = server.profile
    if server.refusals:
        problems.append(f"{pid}: the stand-in refused {server.refusals}")
    conversation = StandIn.conversation(result.messages)
    sent = [r for r in server.requests if StandIn.conversation(r["messages"]) == conversation]
    for body in sent:
        text = json.dumps(body["messages"], ensure_ascii=False)
        problems += [f"{pid}: a request carried {m!r}" for m in MARKERS if m in text]
        problems += [f"{pid}: a request carried {p!r}, which the profile says it ignores"
                     for p in profile.ignored_params if p in body]
    if server.thinks():
        if not all(m.get("reasoning_content") for m in assistants):
            problems.append(f"{pid}: an assistant turn was stored without its reasoning")
        if profile.reasoning_echo != "never":
            last = [m for m in sent[-1]["messages"] if m["role"] == "assistant"]
            echoed = [m.get(profile.reasoning_echo_field) for m in last
                      if m.get("tool_calls") or profile.reasoning_echo == "always"]
            if not echoed or not all(echoed):
                problems.append(f"{pid}: the last request did not echo every tool turn's reasoning")
    served = [s for s in server.replies if s.conversation == conversation]
    by_turn = {s["turn"]: s["llm"] for s in result.steps}
    for turn, reply in enumerate(served, start=1):
        llm = by_turn.get(turn)
        if llm is not None and (llm["prompt_tokens"], llm["cached_tokens"]) != (reply.prompt_tokens, reply.cached_tokens):
            problems.append(f"{pid}: turn {turn} recorded {llm['prompt_tokens']}/{llm['cached_tokens']} prompt/cached "
                            f"tokens, the provider reported {reply.prompt_tokens}/{reply.cached_tokens}")
    if profile.cached_usage_paths and not any(s.cached_tokens for s in served[1:]):
        problems.append(f"{pid}: no cache hit reported after the first turn: requests are not append-only")
    expected = server.cost_usd(conversation, model)
    if abs(result.cost_usd - expected) > Decimal("0.000001"):
        problems.append(f"{pid}: cost {result.cost_usd}, the price list gives {expected}")
    if profile.model(model).priced and not result.cost_usd > 0:
        problems.append(f"{pid}: a priced model cost nothing")
    return problems


def assert_conforms(runs: dict[str, tuple[Any, EpisodeResult, str]]) -> None:
    problems = [p for pid, (server, result, model) in runs.items() for p in problems_of(pid, server, result, model)]
    assert problems == []


# --- the rules each stand-in enforces, one by one ------------------------------------------------


def _standin(pid: str) -> StandIn:
    return StandIn(profiles.get(pid), ScriptedModel(registry()))


def _body(model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages, **extra}


USER = {"role": "user", "content": CODE["code-001-merge-intervals"]["prompt"]}
CALL = {"id": "c1", "type": "function", "function": {"name": "run_shell", "arguments": "{\"command\": \"ls\"}"}}


def test_retired_names_are_refused_as_the_provider_refuses_them() -> None:
    deepseek = profiles.get("deepseek")
    retired = next(iter(deepseek.retired))
    reply = _standin("deepseek").chat(_body(retired, [USER]), {})
    assert (reply.status, reply.body["error"]["message"]) == (400, "Model Not Exist")
    assert _standin("vllm").chat(_body("not-served", [USER]), {}).status == 404


def test_reasoning_not_echoed_where_required_and_echoed_where_forbidden_is_a_400() -> None:
    deepseek = _standin("deepseek")
    model = model_of(deepseek.profile)
    conversation = StandIn.conversation([USER])
    without = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    reply = deepseek.chat(_body(model, without), {})
    assert reply.status == 400 and "must be passed back" in reply.body["error"]["message"]
    echoed = [USER, {**without[1], "reasoning_content": StandIn.reasoning_for(conversation, 1)}, without[2]]
    assert deepseek.check(_body(model, echoed)) is None
    openai = _standin("openai")
    refused = openai.check(_body(model_of(openai.profile), echoed))
    assert refused is not None and refused.status == 400 and "reasoning_content" in refused.body["error"]["message"]


def test_unpaired_tool_results_the_window_and_max_tokens_are_refused() -> None:
    vllm = _standin("vllm")
    unanswered = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "user", "content": "?"}]
    assert "did not have response messages" in vllm.check(_body(SERVED_MODEL, unanswered)).body["error"]["message"]
    empty = [USER, {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": ""}]},
             {"role": "tool", "tool_call_id": "", "content": "ok"}]
    assert "empty or repeated" in vllm.check(_body(SERVED_MODEL, empty)).body["error"]["message"]
    window = profiles.get("vllm").model(SERVED_MODEL).context_window
    long = [{"role": "user", "content": "x" * (4 * window)}]
    assert vllm.check(_body(SERVED_MODEL, long)).body["error"]["code"] == "context_length_exceeded"
    openai = _standin("openai")
    refused = openai.check(_body(model_of(openai.profile), [USER], max_tokens=10))
    assert refused is not None and "max_completion_tokens" in refused.body["error"]["message"]


def test_a_noparser_standin_writes_think_and_tool_calls_into_the_content() -> None:
    reply = _standin("vllm-noparser").chat(_body(SERVED_MODEL, [USER], tools=code_config_tools()), {})
    message = reply.body["choices"][0]["message"]
    assert reply.status == 200 and "tool_calls" not in message
    assert message["content"].startswith("<think>") and "<tool_call>" in message["content"]
    deepseek = _standin("deepseek").chat(_body(model_of(profiles.get("deepseek")), [USER], tools=code_config_tools()), {})
    assert deepseek.body["choices"][0]["message"]["reasoning_content"] and "<think>" not in json.dumps(deepseek.body)


def code_config_tools() -> list[dict[str, Any]]:
    from apps.engines.runtime import get_runtime

    return get_runtime("code_exec").tools(code_config())


# --- bundled tasks through every profile ---------------------------------------------------------


@pytest.fixture
def every_profile() -> Iterator[list[str]]:
    yield [*standin_profiles(), profiles.offline().id]


def test_a_code_task_succeeds_through_every_profile(every_profile: list[str]) -> None:
    assert_conforms(rollouts(every_profile, code_config()))


def test_an_envscaler_task_succeeds_through_every_profile(every_profile: list[str]) -> None:
    assert_conforms(rollouts(every_profile, task_config(ENVSCALER_TASK, timeout_s=300)))


def test_a_gui_task_succeeds_through_the_profiles_that_differ_most(artifact_root: Path) -> None:
    assert_conforms(rollouts(list(GUI_PROFILES), gui_config()))


def test_a_window_too_small_for_the_episode_is_met_by_eliding_old_observations() -> None:
    """The stand-ins refuse a request over the window (their own count: 4 characters a token);
    five 3,000-character outputs do not fit 4,000 tokens, so the loop must elide the oldest."""
    small = {"default_context_window": 4000, "default_max_output": 500}
    pids = ["vllm", "vllm-noparser"]
    runs = rollouts(pids, config_for(LOUD, scene="code_exec", max_steps=8, timeout_s=300),
                    extra_settings={"LLM_PROFILES": json.dumps({pid: small for pid in pids})})
    for pid, (server, result, _) in runs.items():
        assert (result.outcome, server.refusals) == ("success", []), (pid, result.outcome_reason)
        elided = [m for m in result.messages if m["role"] == "tool" and m["content"].startswith("[observation elided")]
        assert elided, pid
        assert any(s["llm"]["context"].get("elided") for s in result.steps)
        # Without eliding, the first request plus the five outputs would have passed the window.
        assert server.replies[0].prompt_tokens + 5 * 3000 // 4 > 4000 > max(r.prompt_tokens for r in server.replies)
