"""`SceneRuntime.aexecute_tool`, which the agent loop awaits: code_exec's run_shell awaits
`Sandbox.arun`; everything else goes through the default, `execute_tool` in a worker thread."""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest

from apps.engines.scenes.code_exec.runtime import CodeExecRuntime
from apps.engines.runtime import SceneRuntime, ToolError, ToolResult
from apps.engines.sandboxes import SandboxSpec
from apps.engines.sandboxes.local import LocalSandbox

pytestmark = pytest.mark.usefixtures("sandbox_settings")

CONFIG: dict[str, Any] = {"step_timeout_s": 30}


def test_run_shell_awaits_arun_and_answers_as_execute_tool_does(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = CodeExecRuntime()
    with local_backend.create(SandboxSpec()) as sandbox:
        calls = [("echo out; echo err >&2; exit 3", None), ("sleep 5", 0.5)]
        expected = [runtime.execute_tool("run_shell", {"command": c}, sandbox, CONFIG, timeout=t) for c, t in calls]
        runs: list[str] = []
        real_run = LocalSandbox.run
        monkeypatch.setattr(LocalSandbox, "run", lambda self, *a, **k: runs.append(a[0]) or real_run(self, *a, **k))

        async def main() -> list[ToolResult]:
            return [await runtime.aexecute_tool("run_shell", {"command": c}, sandbox, CONFIG, timeout=t)
                    for c, t in calls]

        got = asyncio.run(main())
    assert [dataclasses.replace(r, duration_ms=0) for r in got] == [
        dataclasses.replace(r, duration_ms=0) for r in expected]
    assert got[0].output.startswith("exit_code: 3") and got[1].timed_out and got[1].extra == {"killed_by": "timeout"}
    assert runs == []  # never Sandbox.run: arun (which runs `_run` in a worker thread)


def test_run_shell_refuses_the_same_commands_either_way(local_backend: Any) -> None:
    runtime = CodeExecRuntime()
    with local_backend.create(SandboxSpec()) as sandbox:
        for command in ("  ", "echo \0"):
            with pytest.raises(ToolError) as sync_error:
                runtime.execute_tool("run_shell", {"command": command}, sandbox, CONFIG)
            with pytest.raises(ToolError) as async_error:
                asyncio.run(runtime.aexecute_tool("run_shell", {"command": command}, sandbox, CONFIG))
            assert str(async_error.value) == str(sync_error.value)


def test_the_file_tools_take_the_default_worker_thread(local_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = CodeExecRuntime()
    threads: list[int] = []
    real_execute_tool = CodeExecRuntime.execute_tool

    def spy(self: CodeExecRuntime, *args: Any, **kwargs: Any) -> ToolResult:
        threads.append(threading.get_ident())
        return real_execute_tool(self, *args, **kwargs)

    monkeypatch.setattr(CodeExecRuntime, "execute_tool", spy)
    with local_backend.create(SandboxSpec()) as sandbox:
        async def main() -> tuple[ToolResult, ToolResult]:
            wrote = await runtime.aexecute_tool("write_file", {"path": "a.txt", "content": "hello"}, sandbox, CONFIG)
            read = await runtime.aexecute_tool("read_file", {"path": "a.txt"}, sandbox, CONFIG)
            with pytest.raises(ToolError, match="no such file"):
                await runtime.aexecute_tool("read_file", {"path": "missing.txt"}, sandbox, CONFIG)
            return wrote, read

        wrote, read = asyncio.run(main())
    assert wrote.output == "wrote 5 bytes to /workspace/a.txt" and read.output == "hello"
    assert len(threads) == 3 and threading.get_ident() not in threads


def test_the_default_runs_execute_tool_in_a_worker_thread() -> None:
    class Echo(SceneRuntime):
        scene_id = "echo-test"

        def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                         timeout: float | None = None) -> ToolResult:
            if name != "echo":
                raise ToolError(f"unknown tool {name!r}")
            return ToolResult(output=f"{args['text']} (timeout {timeout}) in {threading.get_ident()}")

    async def main() -> ToolResult:
        with pytest.raises(ToolError, match="unknown tool"):
            await Echo().aexecute_tool("other", {}, None, {}, timeout=1)
        return await Echo().aexecute_tool("echo", {"text": "hi"}, None, {}, timeout=2.5)

    result = asyncio.run(main())
    assert result.output.startswith("hi (timeout 2.5) in ") and not result.output.endswith(f" {threading.get_ident()}")


def test_in_thread_closes_the_worker_threads_database_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sandbox.arun and the agent's sync calls share it: a worker
    # thread that touched the ORM (sandbox records) must not keep its connection past CONN_MAX_AGE.
    from apps.engines.sandboxes import base

    closed_in: list[int] = []
    monkeypatch.setattr(base, "close_old_connections", lambda: closed_in.append(threading.get_ident()))

    def work(x: int) -> tuple[int, int]:
        return x * 2, threading.get_ident()

    def fail() -> None:
        raise ValueError("boom")

    async def main() -> tuple[int, int]:
        with pytest.raises(ValueError, match="boom"):
            await base.in_thread(fail)
        return await base.in_thread(work, 21)

    value, ran_in = asyncio.run(main())
    assert value == 42 and ran_in != threading.get_ident()
    assert len(closed_in) == 2 and ran_in in closed_in and threading.get_ident() not in closed_in
