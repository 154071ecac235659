"""The MCP hub (apps/engines/mcp/): real fastmcp servers (mcp_test_server.py) inside real local
bubblewrap sandboxes, through the shared agent loop where the episode matters, and the replay of
a recorded envscaler trajectory without any server.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from apps.engines import registry as runtime_registry
from apps.engines.scenes.envscaler.runtime import SERVER_ENV
from apps.engines.llm import cache_identity
from apps.engines.mcp import (
    McpHub,
    McpReplayMiss,
    McpServerSpec,
    McpSession,
    McpSessionError,
    McpSpecError,
    McpStartError,
    Recording,
)
from apps.engines.mcp.records import RECORD_MAX_CHARS, call_record, list_record
from apps.engines.offline_model import running_offline_model
from apps.engines.runtime import SceneRuntime, ToolError
from apps.engines.sandboxes import PLATFORM_PYTHON_PROFILE, SandboxSpec, get_backend
from tests.engines.test_agent import (  # noqa: F401 - llm_env is a fixture
    assert_no_sandbox_left,
    call,
    client,
    config_for,
    llm_env,
    run,
    scripted,
)
from tests.engines.test_envscaler_runtime import _bwraps_using, counter
from tests.engines.test_gui_parts import artifact_storage  # noqa: F401 - a fixture
from trajplatform import artifacts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

SERVER_SOURCE = Path(__file__).with_name("mcp_test_server.py").read_bytes()
SERVER_PATH = "/workspace/mcp_test_server.py"


def spec(name: str, **fields: Any) -> McpServerSpec:
    return McpServerSpec(**{"name": name, "argv": ["python3", SERVER_PATH, name], "env": dict(SERVER_ENV), **fields})


def started(sandbox: Any, *specs: McpServerSpec) -> McpHub:
    sandbox.write_file(SERVER_PATH, SERVER_SOURCE)
    hub = McpHub(list(specs))
    hub.start(sandbox, lifetime=300)
    return hub


# --- specs --------------------------------------------------------------------------------------


def test_a_spec_round_trips_through_json_and_a_bad_one_names_its_field() -> None:
    full = spec("git", http_argv=["python3", "-m", "x", "--port={port}"], port=8123, allow_tools=["git_status"],
                deny_tools=["git_reset"], platform_tools=["git_log"], namespace="repo", call_timeout_s=5,
                package={"kind": "pypi", "name": "mcp-server-git", "version": "2026.10.19"})
    assert McpServerSpec.from_dict(json.loads(json.dumps(full.to_dict()))) == full
    assert full.agent_name("git_status") == "repo__git_status" and spec("git").agent_name("x") == "git__x"
    assert spec("envscaler", namespace="").agent_name("book") == "book"
    assert full.launch_argv("http") == ["python3", "-m", "x", "--port=8123"]
    with pytest.raises(McpSpecError, match="cannot be reached over http"):
        spec("time").launch_argv("http")
    for bad, message in ((dict(name="a__b"), "name must be"), (dict(transport="ws"), "transport must be one of"),
                         (dict(transport="http"), "serves HTTP and needs a port"),
                         (dict(deny_tools="wipe"), "deny_tools must be a list"),
                         (dict(call_timeout_s=0), "call_timeout_s must be a positive"),
                         (dict(package={"kind": "cargo"}), "package is")):
        with pytest.raises(McpSpecError, match=message):
            McpServerSpec(**{"name": "s", "argv": ["x"], **bad})
    with pytest.raises(McpSpecError, match="unknown fields in the MCP server spec 's': colour"):
        McpServerSpec.from_dict({"name": "s", "argv": ["x"], "colour": "red"})
    with pytest.raises(McpSpecError, match="share a namespace"):
        McpHub([spec("a", namespace="x"), spec("b", namespace="x")])


# --- one hub, two servers ----------------------------------------------------------------------------


def test_two_servers_behind_one_hub_calls_errors_timeouts_refusals_and_records(local_backend: Any,
                                                                              artifact_storage: Path) -> None:
    with local_backend.create(SandboxSpec(image=PLATFORM_PYTHON_PROFILE)) as sandbox:
        hub = started(sandbox, spec("alpha", platform_tools=["counter"], deny_tools=["wipe", "crash"]),
                      spec("beta", allow_tools=["echo", "nap"], call_timeout_s=1))
        tools = {t["function"]["name"]: t["function"] for t in hub.tools()}
        assert list(tools) == ["alpha__echo", "alpha__fail", "alpha__nap", "alpha__picture", "alpha__link",
                               "beta__echo", "beta__nap"]
        # Schemas are the server's own tools/list.
        assert tools["alpha__echo"]["parameters"]["required"] == ["text"]
        assert tools["alpha__echo"]["description"] == "Say the text back, with the server's name."

        first = hub.call_tool("alpha__echo", {"text": "hi"}, timeout=10)
        assert (first.output, first.extra["server"], first.extra["mcp_tool"]) == ("alpha: hi", "alpha", "echo")
        assert first.extra["is_error"] is False and "error" not in first.extra
        lists, (echo,) = first.extra["mcp_calls"][:2], first.extra["mcp_calls"][2:]
        # The servers' starts went on record (the next step carries them), then the call.
        assert [(r["server"], r["method"]) for r in lists] == [("alpha", "tools/list"), ("beta", "tools/list")]
        assert echo == {"server": "alpha", "method": "tools/call", "tool": "echo", "arguments": '{"text":"hi"}',
                        "args_sha256": echo["args_sha256"], "platform": False,
                        "content": [{"type": "text", "text": "alpha: hi"}], "is_error": False,
                        "duration_ms": echo["duration_ms"]}
        assert len(echo["args_sha256"]) == 64
        assert hub.call_tool("beta__echo", {"text": "hi"}).output == "beta: hi"

        refused = hub.call_tool("alpha__fail", {"message": "no such branch"})
        assert refused.output == "error: no such branch" and refused.extra["error"] == "no such branch"
        assert refused.extra["is_error"] is True and refused.extra["mcp_calls"][0]["is_error"] is True

        # The spec's 1 s cuts the loop's 10 s; the server lives on.
        slow = hub.call_tool("beta__nap", {"seconds": 5}, timeout=10)
        assert slow.timed_out and slow.output == "error: timed out: the MCP server 'beta' did not answer nap within 1s"
        assert slow.extra["mcp_calls"][0]["timed_out"] is True
        assert hub.call_tool("beta__nap", {"seconds": 0.1}).output == "slept 0.1"

        for hidden in ("alpha__wipe", "alpha__counter", "beta__fail"):
            with pytest.raises(ToolError, match=f"the tool {hidden} is not available to the agent"):
                hub.call_tool(hidden, {})
        with pytest.raises(ToolError, match="unknown tool 'gamma__echo'"):
            hub.call_tool("gamma__echo", {"text": "x"})
        # Platform-only: callable by the platform, never listed.
        assert json.loads(hub.call_platform("alpha", "counter", {}).text) == {"n": 1}
        with pytest.raises(ToolError, match="the platform cannot call 'wipe'"):
            hub.call_platform("alpha", "wipe", {})

        picture = hub.call_tool("alpha__picture", {})
        # The image went to the artifact store: the step gets its ref, the model its name.
        [image] = picture.images
        # what tests/engines/mcp_test_server.py's picture returns (a real 1x1 PNG)
        png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
        sha = hashlib.sha256(png).hexdigest()
        assert image == {"artifact": sha, "mime": "image/png", "bytes": 69} and artifacts.read(sha) == png
        assert picture.output == f"a picture\n[image (image/png, 69 bytes): artifact {sha[:12]}]"
        assert "error" not in picture.extra
        platform_call, picture_call = picture.extra["mcp_calls"]  # the platform's call went on the next step
        assert (platform_call["tool"], platform_call["platform"]) == ("counter", True)
        (block_text, block_image) = picture_call["content"]
        assert block_text == {"type": "text", "text": "a picture"} and "data" not in block_image
        assert block_image["bytes"] == 69 and block_image["sha256"] == block_image["artifact"] == sha
        assert hub.call_tool("alpha__link", {}).output == \
            "[resource link report <file:///workspace/report.txt>: the report]"
        workspace = str(sandbox.workspace)
        assert len(_bwraps_using(workspace)) == 2
    # The sandbox's destroy closed the hub: no server process is left.
    assert _bwraps_using(workspace) == []
    with pytest.raises(McpSessionError, match="is not running"):
        hub.call_tool("alpha__echo", {"text": "late"})


def _wait_until_exited(pid: int, within_s: float = 20.0) -> None:
    """Until the killed bwrap monitor has exited (a zombie or gone): its exit is what sends the
    sandboxed server its --die-with-parent SIGKILL, so from then on the server answers nothing."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"bwrap monitor {pid} still running {within_s} s after SIGKILL")


def test_a_server_killed_from_outside_is_an_infrastructure_error_and_close_leaves_nothing(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec(image=PLATFORM_PYTHON_PROFILE)) as sandbox:
        hub = started(sandbox, spec("alpha"))
        assert hub.call_tool("alpha__echo", {"text": "hi"}).output == "alpha: hi"
        (pid,) = _bwraps_using(str(sandbox.workspace))
        os.kill(pid, signal.SIGKILL)
        _wait_until_exited(pid)  # under load the server answered once more before its parent-death signal came
        with pytest.raises(McpSessionError, match="alpha"):
            hub.call_tool("alpha__echo", {"text": "again"}, timeout=20)
        hub.close()
        hub.close()  # idempotent
        assert _bwraps_using(str(sandbox.workspace)) == []


def test_a_server_killed_while_a_call_is_in_flight_ends_the_call_at_once_not_at_its_timeout(local_backend: Any) -> None:
    import threading
    import time

    from apps.engines.mcp import McpCallTimeout

    with local_backend.create(SandboxSpec(image=PLATFORM_PYTHON_PROFILE)) as sandbox:
        hub = started(sandbox, spec("alpha"))
        (pid,) = _bwraps_using(str(sandbox.workspace))
        threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
        began = time.monotonic()
        with pytest.raises(McpSessionError, match="alpha") as gone:
            hub.call_tool("alpha__nap", {"seconds": 60}, timeout=40)
        assert not isinstance(gone.value, McpCallTimeout) and time.monotonic() - began < 20
        hub.close()


def test_a_server_that_cannot_start_is_a_start_error_with_its_stderr_and_the_others_are_closed(
    local_backend: Any,
) -> None:
    with local_backend.create(SandboxSpec(image=PLATFORM_PYTHON_PROFILE)) as sandbox:
        broken = McpServerSpec(name="broken", argv=["python3", "-c", "import sys; sys.exit('no such package')"],
                               start_timeout_s=20)
        with pytest.raises(McpStartError, match="(?s)the MCP server 'broken' did not start.*no such package"):
            started(sandbox, spec("alpha"), broken)
        assert _bwraps_using(str(sandbox.workspace)) == []


def test_over_streamable_http_on_opensandbox_two_servers_each_on_its_port(opensandbox_backend: Any, fake: Any) -> None:
    from tests.engines.test_envscaler_opensandbox import free_port

    # The fake's sandboxes share the host's loopback: each server gets a free port of its own.
    over_http = spec("alpha", transport="http", argv=["python3", SERVER_PATH, "alpha", "{host}", "{port}"],
                     host="127.0.0.1", port=free_port(), start_timeout_s=30)
    stdio_too = spec("beta", http_argv=["python3", SERVER_PATH, "beta", "{host}", "{port}"], host="127.0.0.1",
                     port=free_port(), start_timeout_s=30)
    with opensandbox_backend.create(SandboxSpec(image=PLATFORM_PYTHON_PROFILE)) as sandbox:
        hub = started(sandbox, over_http, stdio_too)
        assert hub.call_tool("alpha__echo", {"text": "hi"}).output == "alpha: hi"
        assert hub.call_tool("beta__fail", {"message": "no"}).output == "error: no"
        commands = list(fake.sandboxes[sandbox.id].background.values())
        assert len(commands) == 2 and all(c.proc.returncode is None for c in commands)
    assert all(c.proc.returncode is not None for c in commands)
    with pytest.raises(McpStartError, match="cannot be reached over http"):
        with opensandbox_backend.create(SandboxSpec(image=PLATFORM_PYTHON_PROFILE)) as sandbox:
            started(sandbox, spec("stdio_only"))


# --- through the agent loop ------------------------------------------------------------------------


class HubRuntime(SceneRuntime):
    """A scene on the hub alone, as a registry-backed scene would be."""

    scene_id = "mcp_hub_test"

    def __init__(self) -> None:
        self.hubs: dict[str, McpHub] = {}

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        echo = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return [{"type": "function", "function": {"name": n, "description": n, "parameters": p}} for n, p in (
            ("alpha__echo", echo), ("alpha__crash", {"type": "object", "properties": {}}),
            ("finish", {"type": "object", "properties": {"answer": {"type": "string"}}}))]

    def system_prompt(self, config: dict[str, Any]) -> str:
        return "Use the tools."

    def sandbox_spec(self, config: dict[str, Any]) -> SandboxSpec:
        return SandboxSpec(image=PLATFORM_PYTHON_PROFILE, ttl=900)

    def setup(self, sandbox: Any, config: dict[str, Any]) -> None:
        hub = McpHub.for_episode([spec("alpha")], config)
        if not hub.replaying:
            sandbox.write_file(SERVER_PATH, SERVER_SOURCE)
        hub.start(sandbox, lifetime=300)
        self.hubs[sandbox.id] = hub

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> Any:
        return self.hubs[sandbox.id].call_tool(name, args, timeout=timeout)


def test_a_server_dying_mid_episode_ends_it_as_an_infrastructure_error_not_the_agents_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(runtime_registry._instances, HubRuntime.scene_id, HubRuntime())
    config = config_for("Echo, then crash.", scene=HubRuntime.scene_id)
    with scripted(config["prompt"], call("alpha__echo", text="hi"), call("alpha__crash"),
                  call("finish", answer="x")) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.error_kind, result.retryable) == ("error", "infrastructure", True)
    assert "calling crash on the MCP server 'alpha' failed" in result.outcome_reason
    echo, crash = result.steps
    assert echo["output"] == "alpha: hi" and echo["server"] == "alpha" and echo["mcp_tool"] == "echo"
    assert [r["method"] for r in echo["mcp_calls"]] == ["tools/list", "tools/call"]
    assert crash["error_kind"] == "infrastructure"
    assert_no_sandbox_left(get_backend("local"))


# --- recorded responses and replay ------------------------------------------------------------------


def test_a_replay_whose_agent_asks_something_unrecorded_ends_as_an_error_naming_the_call(
    make_task: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apps.tasks.models import Trajectory

    monkeypatch.setitem(runtime_registry._instances, HubRuntime.scene_id, HubRuntime())
    config = config_for("Echo hi.", scene=HubRuntime.scene_id)
    changed = config_for("Echo something else.", scene=HubRuntime.scene_id)  # a prompt change: asked anew
    scripts = [{"id": "hi", "prompt": config["prompt"],
                "reference_solution": [call("alpha__echo", text="hi"), call("finish", answer="hi")]},
               {"id": "other", "prompt": changed["prompt"],
                "reference_solution": [call("alpha__echo", text="other"), call("finish", answer="other")]}]
    original = uuid.uuid4()
    with running_offline_model(scripts=scripts) as server:
        recorded = run(config, client(server.url), cache_key_extra=cache_identity(original))
        assert recorded.outcome == "success", recorded.outcome_reason
        Trajectory.objects.create(uuid=original, task=make_task(), iteration=1, steps=recorded.steps)
        monkeypatch.setattr(McpSession, "__init__", _no_session)
        replay = run({**changed, "replay_of": str(original)}, client(server.url))
    assert replay.outcome == "error" and not replay.retryable
    assert (f'replay of trajectory {original}: no recorded response for echo {{"text":"other"}} on server '
            "'alpha' (a replay never calls the server)") in replay.outcome_reason
    assert_no_sandbox_left(get_backend("local"))


def _no_session(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a replay started an MCP session")


def test_a_replay_of_a_recorded_envscaler_trajectory_starts_no_server_and_reproduces_its_steps(
    make_task: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apps.tasks.models import Trajectory

    config = counter("Bump by 2, note it, read it.", {"n": 1},
                     "def check(env):\n    return env.n == 3 and env.note == 'x'\n")
    original = uuid.uuid4()
    steps = (call("bump", by=2), call("set_note", text="x"), call("read"), call("bump", by="two"),
             call("get_current_time", timezone="UTC"), call("finish", answer="3"))
    with running_offline_model(scripts=[{"id": "c", "prompt": config["prompt"],
                                         "reference_solution": list(steps)}]) as server:
        recorded = run(config, client(server.url), cache_key_extra=cache_identity(original))
        assert (recorded.outcome, recorded.reward) == ("success", 1.0), recorded.outcome_reason
        Trajectory.objects.create(uuid=original, task=make_task(scene="envscaler"), iteration=1,
                                  steps=recorded.steps, verifier_output=recorded.verifier_output)
        asked = server.model.chat_requests

        monkeypatch.setattr(McpSession, "__init__", _no_session)
        replay = run({**config, "replay_of": str(original)}, client(server.url))
        assert server.model.chat_requests == asked  # the model's answers were replayed too
    assert (replay.outcome, replay.reward) == ("success", 1.0), replay.outcome_reason

    def without_llm(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in step.items() if k != "llm"} for step in items]

    assert without_llm(replay.steps) == without_llm(recorded.steps)
    assert replay.verifier_output == recorded.verifier_output
    assert replay.final_answer == recorded.final_answer
    # What was recorded: the start, the state reads, every call; the bad argument never reached the server.
    calls = [(r["tool"], r.get("platform", False)) for s in recorded.steps for r in s.get("mcp_calls", [])]
    assert calls[:4] == [("", False), ("envscaler_state", True), ("bump", False), ("envscaler_state", True)]
    assert ("get_current_time", False) in calls and "mcp_calls" not in recorded.steps[3]
    assert recorded.steps[3]["error"].startswith("invalid arguments for bump")
    assert [r["tool"] for r in recorded.verifier_output["mcp_calls"]] == ["envscaler_check", "envscaler_state"]
    assert_no_sandbox_left(get_backend("local"))


def test_an_unrecorded_call_in_a_replay_is_an_error_naming_it_never_a_live_call() -> None:
    listed = list_record("alpha", [{"name": "echo", "description": "", "input_schema": {"type": "object"}}])
    hub_records = [listed, {**_echo_record("hi"), "content": [{"type": "text", "text": "alpha: hi"}]}]
    hub = McpHub([spec("alpha")], recording=Recording(hub_records, source="trajectory T"))

    class NoSandbox:
        def add_cleanup(self, callback: Any) -> None:
            pass

    hub.start(NoSandbox(), lifetime=10)
    assert hub.call_tool("alpha__echo", {"text": "hi"}).output == "alpha: hi"
    with pytest.raises(McpReplayMiss, match=r"replay of trajectory T: no recorded response for echo "
                                            r'\{"text":"hi"\} on server \'alpha\' \(a replay never calls the server\)'):
        hub.call_tool("alpha__echo", {"text": "hi"})  # recorded once, asked twice
    with pytest.raises(McpReplayMiss, match=r'echo \{"text":"other"\}'):
        hub.call_tool("alpha__echo", {"text": "other"})
    cut = Recording([{**_echo_record("big"), "truncated": True}], source="trajectory T")
    with pytest.raises(McpReplayMiss, match=f"was cut at {RECORD_MAX_CHARS} characters"):
        cut.take("alpha", "tools/call", "echo", {"text": "big"})


def _echo_record(text: str) -> dict[str, Any]:
    return {**call_record("alpha", "echo", {"text": text}, platform=False), "is_error": False, "duration_ms": 3}


def test_a_replay_of_a_trajectory_without_records_is_refused_before_anything_runs(make_task: Any) -> None:
    from apps.tasks.models import Trajectory

    old = Trajectory.objects.create(task=make_task(scene="envscaler"), iteration=1, steps=[{"tool": "bump"}])
    with pytest.raises(McpReplayMiss, match="has no recorded tool responses"):
        Recording.of_trajectory(str(old.uuid))
    missing = uuid.uuid4()
    with pytest.raises(McpReplayMiss, match=f"replay_of names no stored trajectory: {missing}"):
        Recording.of_trajectory(str(missing))
