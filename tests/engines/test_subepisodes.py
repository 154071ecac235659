"""The shared loop's episode context and sub-episodes (apps/engines/runtime.py `current_episode`,
`EpisodeContext.run_subepisode`), driven end to end: the offline scripted model over loopback
HTTP and the real local sandbox. A lead runtime (code_exec's tools plus `delegate`) hands an
instruction to a sub-episode of the same loop, in the same sandbox, and reads its answer."""
from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from apps.engines.scenes.code_exec.runtime import CodeExecRuntime
from apps.engines.llm import cache_identity
from apps.engines.offline_model import running_offline_model
from apps.engines.registry import RUNTIMES, register_runtime
from apps.engines.runtime import EpisodeContext, SceneRuntime, ToolError, ToolResult, current_episode
from apps.engines.sandboxes import get_backend
from tests.engines.test_agent import call, client, config_for, llm_env, run  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

LEAD = "subtest_lead"
PLAIN = "subtest_plain"

DELEGATE = {"type": "function", "function": {
    "name": "delegate", "description": "Hand an instruction to a worker; returns its answer.",
    "parameters": {"type": "object", "properties": {"instruction": {"type": "string"},
                                                     "own_sandbox": {"type": "boolean"}},
                   "required": ["instruction"], "additionalProperties": False}}}


class LeadRuntime(CodeExecRuntime):
    """code_exec plus `delegate`: a sub-episode of the same scene (so, by default, the same sandbox)."""

    scene_id = LEAD
    seen: list[dict[str, Any]] = []

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        return [*super().tools(config), DELEGATE]

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        if name != "delegate":
            return super().execute_tool(name, args, sandbox, config, timeout=timeout)
        ctx = current_episode()
        ctx.state["delegations"] = ctx.state.get("delegations", 0) + 1
        child = ctx.run_subepisode(
            {**config, "prompt": args["instruction"], "max_steps": 4},
            label="worker", share_sandbox=not args.get("own_sandbox"))
        if child.outcome != "success":
            raise ToolError(f"the worker did not finish: {child.outcome_reason}")
        return ToolResult(output=child.final_answer, extra={"sub": {
            "outcome": child.outcome, "steps": len(child.steps), "tokens": child.total_tokens,
            "sandbox": child.sandbox, "depth_seen": child.verifier_output.get("depth")}})

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        ctx = current_episode()
        if ctx.depth:  # the worker: say what it saw of itself
            return None, {}
        LeadRuntime.seen.append({"depth": ctx.depth, "label": ctx.label, "state": dict(ctx.state),
                                 "tools": [s["tool"] for s in ctx.steps], "sandbox": ctx.sandbox is sandbox})
        return 1.0, {"exit_code": 0, "delegations": ctx.state.get("delegations", 0)}


class PlainRuntime(SceneRuntime):
    """No sandbox; `nest` delegates to itself, to reach the depth limit."""

    scene_id = PLAIN

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        nest = {"type": "function", "function": {"name": "nest", "parameters": {"type": "object", "properties": {}}}}
        finish = {"type": "function", "function": {"name": "finish", "parameters": {
            "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
        return [nest, finish]

    def system_prompt(self, config: dict[str, Any]) -> str:
        return "nest or finish"

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        ctx = current_episode()
        child = ctx.run_subepisode({**config, "prompt": f"level {ctx.depth + 1}"}, label="nest")
        return ToolResult(output=f"{child.outcome}; inner: {child.steps[0]['output']}")


@pytest.fixture(autouse=True)
def runtimes() -> Any:
    register_runtime(LEAD, LeadRuntime)
    register_runtime(PLAIN, PlainRuntime)
    LeadRuntime.seen = []
    yield
    RUNTIMES.pop(LEAD, None)
    RUNTIMES.pop(PLAIN, None)


LEAD_PROMPT = "[lead] have the worker write the greeting, then check it"
WORKER_PROMPT = "[worker] write hello to greeting.txt"


def scripts(*, own_sandbox: bool = False) -> list[dict[str, Any]]:
    delegate = {"instruction": WORKER_PROMPT}
    if own_sandbox:
        delegate["own_sandbox"] = True
    return [
        {"id": "lead", "prompt": LEAD_PROMPT, "reference_solution": [
            call("delegate", "let the worker do it", **delegate),
            call("run_shell", command="cat greeting.txt"),
            call("finish", answer="checked"),
        ]},
        {"id": "worker", "prompt": WORKER_PROMPT, "reference_solution": [
            call("write_file", path="greeting.txt", content="hello"),
            call("finish", answer="written"),
        ]},
    ]


def test_a_sub_episode_runs_the_same_loop_in_the_parents_sandbox_and_its_answer_is_the_tools_result() -> None:
    events: list[tuple[str, str]] = []
    with running_offline_model(scripts=scripts()) as server:
        result = run(config_for(LEAD_PROMPT, scene=LEAD), client(server.url),
                     on_event=lambda kind, message, data: events.append((kind, message)))
    assert result.outcome == "success", result.outcome_reason
    delegate, cat = result.steps[0], result.steps[1]
    assert delegate["tool"] == "delegate" and delegate["output"] == "written"
    assert delegate["sub"]["outcome"] == "success" and delegate["sub"]["steps"] == 2
    assert delegate["sub"]["sandbox"] == {}  # it made no sandbox of its own
    assert cat["output"].rstrip().endswith("hello")  # the worker's file, in the lead's sandbox
    # The child's tokens are in the parent's totals: 3 lead calls + 2 worker calls.
    assert result.llm_calls == 5
    assert result.total_tokens > delegate["sub"]["tokens"] > 0
    # The runtime saw its own episode (steps, per-episode state) in verify, at depth 0.
    assert LeadRuntime.seen == [{"depth": 0, "label": "", "state": {"delegations": 1},
                                 "tools": ["delegate", "run_shell", "finish"], "sandbox": True}]
    assert result.verifier_output["delegations"] == 1
    # The worker's live log is the parent's, labelled; its end is not the parent's result.
    worker_lines = [m for k, m in events if m.startswith("[worker#0] ")]
    assert any("write_file" in m for m in worker_lines)
    assert [k for k, _ in events].count("result") == 1 and events[-1][0] == "result"
    assert get_backend("local").list() == []


def test_a_sub_episode_with_its_own_sandbox_does_not_see_the_parents_files() -> None:
    with running_offline_model(scripts=scripts(own_sandbox=True)) as server:
        result = run(config_for(LEAD_PROMPT, scene=LEAD), client(server.url))
    delegate, cat = result.steps[0], result.steps[1]
    assert delegate["sub"]["sandbox"]["destroyed"] is True  # its own, made and destroyed
    assert delegate["sub"]["sandbox"]["id"]
    assert "No such file" in cat["output"]
    assert get_backend("local").list() == []


def test_a_retried_episode_replays_its_sub_episodes_from_the_cache() -> None:
    identity = cache_identity(uuid.uuid4())
    with running_offline_model(scripts=scripts()) as server:
        first = run(config_for(LEAD_PROMPT, scene=LEAD), client(server.url), cache_key_extra=identity)
        again = run(config_for(LEAD_PROMPT, scene=LEAD), client(server.url), cache_key_extra=identity)
        other = run(config_for(LEAD_PROMPT, scene=LEAD), client(server.url))
    assert first.cached_calls == 0 and first.llm_calls == 5
    assert again.llm_calls == 5 and again.cached_calls == 5
    assert other.cached_calls == 0
    assert [s["output"] for s in again.steps] == [s["output"] for s in first.steps]


def test_the_token_budget_passes_down() -> None:
    with running_offline_model(scripts=scripts()) as server:
        # Enough for the lead's first call only: the worker starts with what is left and stops.
        probe = run(config_for(LEAD_PROMPT, scene=LEAD), client(server.url))
        first_call = probe.steps[0]["llm"]["usage"]["total_tokens"]
        result = run(config_for(LEAD_PROMPT, scene=LEAD, max_tokens=first_call + 1), client(server.url))
    delegate = result.steps[0]
    assert delegate["error"].startswith("the worker did not finish: token budget (1) exhausted")
    assert result.outcome == "failure" and "token budget" in result.outcome_reason


def test_sub_episodes_nest_three_deep_at_most() -> None:
    steps = [call("nest"), call("finish", answer="done")]
    prompts = ["[plain] top", "level 1", "level 2", "level 3"]
    with running_offline_model(scripts=[{"id": f"p{i}", "prompt": p, "reference_solution": steps}
                                        for i, p in enumerate(prompts)]) as server:
        result = run(config_for("[plain] top", scene=PLAIN), client(server.url))
    # top -> level 1 -> level 2 -> level 3, whose nest is refused (told to its model, which
    # finishes); each level reports its child's outcome and first step up.
    assert result.outcome == "success"
    assert result.steps[0]["output"] == (
        "success; inner: success; inner: success; inner: error: sub-episodes nest at most 3 deep")


def test_current_episode_outside_an_episode_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="not inside an episode"):
        current_episode()


def test_run_subepisode_on_the_event_loop_is_refused() -> None:
    class Host:
        loop = None

    async def main() -> None:
        Host.loop = asyncio.get_running_loop()
        with pytest.raises(RuntimeError, match="await arun_subepisode"):
            EpisodeContext(Host()).run_subepisode({}, label="x")

    asyncio.run(main())


IDLE, THREAD_LEAD = "subtest_idle", "subtest_thread_lead"
CHILD_RESULTS: list[Any] = []


class IdleRuntime(SceneRuntime):
    """A role that only waits: its episode runs until a limit or a cancel."""

    scene_id = IDLE

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
                for name in ("wait", "finish")]

    def system_prompt(self, config: dict[str, Any]) -> str:
        return "wait"

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        return ToolResult(output="waited")


class ThreadLeadRuntime(IdleRuntime):
    """Its `wait` runs a long sub-episode from the worker thread the loop runs tools in."""

    scene_id = THREAD_LEAD

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        from apps.engines.offline_model import MODEL_FAULT_PREFIX

        child = current_episode().run_subepisode(
            {**config, "scene": IDLE, "prompt": "[idle] keep waiting", "max_steps": 60,
             "model": MODEL_FAULT_PREFIX + "slow;seconds=0.2"}, label="idle")
        CHILD_RESULTS.append(child)
        return ToolResult(output=child.outcome)


def test_a_sub_episode_stops_when_its_episode_is_stopped_from_outside() -> None:
    import contextlib
    import time

    from apps.engines.agent import run_episode

    register_runtime(IDLE, IdleRuntime)
    register_runtime(THREAD_LEAD, ThreadLeadRuntime)
    CHILD_RESULTS.clear()
    scripts = [{"id": "lead", "prompt": "[lead] wait for the idler", "reference_solution": [call("wait"), call("finish")]},
               {"id": "idle", "prompt": "[idle] keep waiting", "reference_solution": [call("wait")] * 60}]
    try:
        with running_offline_model(scripts=scripts) as server:
            llm = client(server.url)

            async def main() -> None:
                # The worker stops an episode on its time limit by cancelling it; the loop goes on
                # running other episodes, so nothing else would stop the sub-episode.
                episode = asyncio.create_task(run_episode(
                    config=config_for("[lead] wait for the idler", scene=THREAD_LEAD),
                    llm=llm, cache_key_extra=cache_identity(uuid.uuid4())))
                await asyncio.sleep(1.0)
                episode.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await episode
                deadline = time.monotonic() + 6  # 60 slow turns would take 12 s
                while not CHILD_RESULTS and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await llm.aclose()

            asyncio.run(main())
    finally:
        RUNTIMES.pop(IDLE, None)
        RUNTIMES.pop(THREAD_LEAD, None)
    [child] = CHILD_RESULTS
    assert child.cancelled and child.outcome == "error" and child.outcome_reason == "cancelled"
    assert child.llm_calls < 20
