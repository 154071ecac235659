"""The envscaler scene on the OpenSandbox backend: the environment's fastmcp server runs as a
background command inside the sandbox serving MCP over streamable HTTP, the platform resolves the
port's endpoint through the lifecycle API and connects fastmcp's Client to it.

Driven by the real opensandbox 1.1.1 SDK against the loopback fake (opensandbox_fake.py), whose
sandboxes share the host's loopback: each test picks a free port for the server and binds it to
127.0.0.1 (ENVSCALER_MCP_PORT / ENVSCALER_MCP_HOST). Not exercised here: a real execd's
reverse proxy, Docker or Kubernetes networking, and an image other than the host's /usr.
"""
from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from apps.engines.offline_model import running_offline_model
from apps.engines.runtime import get_runtime
from apps.engines.sandboxes import SandboxSpec
from apps.engines.sandboxes.base import SERVICE_HTTP, SERVICE_STDIO, ServiceFailed
from apps.engines.sandboxes.opensandbox import OpenSandboxBackend
from tests.engines.test_agent import (  # noqa: F401 - llm_env is a fixture
    assert_no_sandbox_left,
    call,
    client,
    config_for,
    llm_env,
    run,
    scripted,
)
from tests.engines.test_envscaler_runtime import COUNTER_ENV, SOLUTIONS, counter, scene_config, task_config

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mcp_port(settings: Any) -> int:
    port = free_port()
    settings.ENVSCALER_MCP_PORT = port
    settings.ENVSCALER_MCP_HOST = "127.0.0.1"  # the fake's sandboxes share the host's network
    settings.ENVSCALER_START_TIMEOUT_S = 30.0
    return port


def assert_destroyed(fake: Any, backend: Any, sandbox_id: str) -> None:
    sandbox = fake.sandboxes[sandbox_id]
    assert sandbox.state == "Terminated" and not sandbox.root.exists()
    assert sandbox.background and all(cmd.proc.returncode is not None for cmd in sandbox.background.values())
    assert_no_sandbox_left(backend)


def test_the_backends_say_how_a_long_lived_process_is_reached(opensandbox_backend: Any, local_backend: Any) -> None:
    with opensandbox_backend.create(SandboxSpec()) as remote, local_backend.create(SandboxSpec()) as local:
        assert (remote.service_transport, local.service_transport) == (SERVICE_HTTP, SERVICE_STDIO)


def test_a_bundled_task_runs_over_streamable_http_and_its_check_passes(
    opensandbox_backend: Any, fake: Any, mcp_port: int
) -> None:
    config = task_config("clinic-book-after-conflict")
    solution = SOLUTIONS[config["prompt"]]
    with running_offline_model(scripts=[solution]) as server:
        result = run(config, client(server.url), sandbox_backend=opensandbox_backend)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    assert result.sandbox["backend"] == "opensandbox"
    steps = result.steps
    assert [s["tool"] for s in steps] == [c["tool_calls"][0]["name"] for c in solution["reference_solution"]]
    assert steps[0]["output"].startswith("error: ValueError") and steps[0]["state_changed"] is False
    assert any(s.get("state_changed") for s in steps)
    for before, after in zip(steps, steps[1:-1]):
        assert after["state_before"] == before["state_after"]
    verifier = result.verifier_output
    assert verifier["method"] == "check_func" and verifier["error"] is None
    assert verifier["initial_state"] == steps[0]["state_before"]
    assert verifier["final_state"] == steps[-2]["state_after"]
    sandbox_id = result.sandbox["id"]
    # MCP went over HTTP through execd's reverse proxy to the server's port inside the sandbox.
    mcp = [(method, path) for sid, method, port, path in fake.forwarded if sid == sandbox_id and port == mcp_port]
    assert ("POST", "/mcp") in mcp
    assert not fake.execd_key_leaks
    assert_destroyed(fake, opensandbox_backend, sandbox_id)


def test_the_check_function_decides_a_failure(opensandbox_backend: Any, fake: Any, mcp_port: int) -> None:
    config = task_config("warehouse-move")
    with scripted(config["prompt"], call("get_stock", sku="SKU-200"), call("finish", answer="done")) as (_, llm):
        result = run(config, llm, sandbox_backend=opensandbox_backend)
    assert (result.outcome, result.reward) == ("failure", 0.0)
    assert result.verifier_output["check_result"] == "false"
    assert result.verifier_output["final_state"]["stock"]["SKU-200"]["location"] == "A2"
    assert_destroyed(fake, opensandbox_backend, result.sandbox["id"])


def test_through_the_servers_proxy_with_the_api_key(fake: Any, mcp_port: int, settings: Any, db: Any) -> None:
    settings.OPENSANDBOX_URL = fake.url
    settings.OPENSANDBOX_API_KEY = fake.api_key
    backend = OpenSandboxBackend(use_server_proxy=True)
    config = counter("Bump by 2 and note it.", {"n": 1}, "def check(env):\n    return env.n == 3 and env.note == 'x'\n")
    try:
        with scripted(config["prompt"], call("bump", by=2), call("set_note", text="x"), call("read"),
                      call("finish", answer="3")) as (_, llm):
            result = run(config, llm, sandbox_backend=backend)
        assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
        assert json.loads(result.steps[2]["output"]) == {"n": 3, "note": "x"}
        sandbox_id = result.sandbox["id"]
        proxied = f"/v1/sandboxes/{sandbox_id}/proxy/{mcp_port}/mcp"
        assert ("POST", proxied) in fake.requests
        assert_destroyed(fake, backend, sandbox_id)
    finally:
        backend.close()


def test_an_environment_that_fails_to_start_is_a_setup_error_with_its_output(
    opensandbox_backend: Any, fake: Any, mcp_port: int
) -> None:
    env = dict(COUNTER_ENV, code=COUNTER_ENV["code"] + "\nraise RuntimeError('no start')\n")
    config = config_for("Start a broken env.", scene_config(env, {}), scene="envscaler")
    with scripted(config["prompt"], call("finish", answer="x")) as (_, llm):
        result = run(config, llm, sandbox_backend=opensandbox_backend)
    assert (result.outcome, result.error_kind) == ("error", "config")
    assert "the environment did not start" in result.outcome_reason
    assert "exited (exit code 1) before it answered" in result.outcome_reason
    assert "RuntimeError: no start" in result.outcome_reason
    assert_destroyed(fake, opensandbox_backend, result.sandbox["id"])


def test_a_service_that_never_listens_fails_within_its_ready_timeout(opensandbox_backend: Any, fake: Any) -> None:
    port = free_port()
    with opensandbox_backend.create(SandboxSpec()) as sandbox:
        with pytest.raises(ServiceFailed, match=rf"did not answer at .*/proxy/{port} within 1s \(HTTP 502"):
            sandbox.start_service(["sh", "-c", "echo waiting; sleep 60"], port=port, lifetime=120, ready_timeout=1)
        (command,) = fake.sandboxes[sandbox.id].background.values()
        assert command.content == "sh -c 'echo waiting; sleep 60'"
    # It was interrupted when the wait gave up (and the sandbox is gone now anyway).
    assert command.proc.returncode is not None
    assert command.id in fake.interrupts


def test_the_mcp_server_runs_in_the_background_and_dies_with_the_sandbox(
    opensandbox_backend: Any, fake: Any, mcp_port: int
) -> None:
    runtime = get_runtime("envscaler")
    config = counter("Just set up.", {"n": 3})
    sandbox = opensandbox_backend.create(runtime.sandbox_spec(config))
    try:
        runtime.setup(sandbox, config)
        assert runtime.execute_tool("bump", {"by": 4}, sandbox, config, timeout=10).output == '{"n": 7}'
        (command,) = fake.sandboxes[sandbox.id].background.values()
        assert command.proc.returncode is None
    finally:
        sandbox.destroy()
    assert sandbox.id not in runtime._episodes
    assert_destroyed(fake, opensandbox_backend, sandbox.id)


def test_the_fakes_background_commands_answer_the_sdks_status_and_logs_calls(opensandbox_backend: Any) -> None:
    import time

    from opensandbox.models.execd import RunCommandOpts

    with opensandbox_backend.create(SandboxSpec()) as sandbox:
        commands = sandbox._sdk_handle().commands
        execution = commands.run("echo one; echo two >&2; sleep 0.5; exit 3", opts=RunCommandOpts(background=True))
        assert execution.complete is not None and execution.error is None  # started, not finished
        assert commands.get_command_status(execution.id).running is True
        deadline = time.monotonic() + 20
        while (status := commands.get_command_status(execution.id)).running and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (status.running, status.exit_code, status.error) == (False, 3, "exit status 3")
        assert status.finished_at is not None and status.started_at <= status.finished_at
        logs = commands.get_background_command_logs(execution.id)
        assert (logs.content, logs.cursor) == ("one\ntwo\n", 2)
        assert commands.get_background_command_logs(execution.id, cursor=1).content == "two\n"
