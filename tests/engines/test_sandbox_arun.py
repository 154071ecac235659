"""`Sandbox.arun` on the local backend: the event-loop path (no thread of its own) where the
sandbox allows it, the thread path where it does not, and the same results either way.

Whether the loop path is taken depends on the host (cgroup v1 for the sandbox's spawner
thread, pidfds); every test asserts what this host must do, and the fallback is forced where
a test needs it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import threading
import time
import weakref
from typing import Any, Callable

import pytest

from apps.engines.sandboxes import ExecResult, SandboxError, SandboxSpec, bwrap, local
from apps.engines.sandboxes import cgroups as sandbox_cgroups
from apps.engines.sandboxes.bwrap import RawSink
from apps.engines.sandboxes.local import LocalBackend, LocalSandbox
from tests.engines.conftest import sandbox_user_processes, wait_for_no_sandbox_processes

pytestmark = pytest.mark.usefixtures("sandbox_settings")


@pytest.fixture(autouse=True)
def fresh_handle_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which path a command takes depends on the live sandbox handles of the process
    (LOOP_COMMANDS_MAX_SANDBOXES): count only this test's, not those earlier tests left to the
    garbage collector."""
    monkeypatch.setattr(local, "_live_handles", weakref.WeakSet())


@pytest.fixture(params=["this host", "no spawner thread"])
def hosts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """This host as it is, then as one without the sandbox's spawner thread (no cgroup v1):
    the loop path where this host has it, and the thread path whatever it has."""
    if request.param == "no spawner thread":
        monkeypatch.setattr(sandbox_cgroups.SandboxCgroup, "thread_capable", property(lambda self: False))
    return request.param


def _same(result: ExecResult) -> ExecResult:
    return dataclasses.replace(result, duration_ms=0)


def _spy_execute(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """Record the thread of every `_execute` (the thread path) call."""
    calls: list[threading.Thread] = []
    real = LocalSandbox._execute

    def spy(self: LocalSandbox, *args: Any, **kwargs: Any) -> Any:
        calls.append(threading.current_thread())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LocalSandbox, "_execute", spy)
    return calls


def _loop_path_expected(sandbox: LocalSandbox) -> bool:
    """What this host gives a default (init-less) sandbox: the loop path with a v1 spawner thread."""
    return sandbox.cgroup.thread_capable and local.pidfd_supported()


def _setter(event: asyncio.Event) -> Callable[[str, str], None]:
    """An on_output that sets `event` from whichever thread calls it (the thread path's too)."""
    loop = asyncio.get_running_loop()
    return lambda stream, line: loop.call_soon_threadsafe(event.set)


async def _until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


CASES = {
    "both streams, non-zero exit": dict(cmd="echo out; echo err >&2; printf 'no newline'; exit 7", timeout=30),
    "argv, cwd and env": dict(cmd=["sh", "-c", 'pwd; echo "$GREETING"'], timeout=30, cwd="sub", env={"GREETING": "hi"}),
    "reads stdin: there is none": dict(cmd="cat; echo after-stdin", timeout=30),
    "a signal ends it": dict(cmd=["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                             timeout=30),
    "output beyond the cap": dict(cmd=["python3", "-c", "import sys\nfor i in range(5000): print(f'line {i:05d}')\n"
                                       "print('x' * 3000, file=sys.stderr)"], timeout=60, max_output_bytes=2000),
}


@pytest.mark.parametrize("case", CASES)
def test_arun_gives_what_run_gives(local_backend: Any, hosts: str, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs = dict(CASES[case])
    with local_backend.create(SandboxSpec()) as sandbox:
        sandbox.run("mkdir -p sub", timeout=30)
        lines_run: list[tuple[str, str]] = []
        lines_arun: list[tuple[str, str]] = []
        expected = sandbox.run(**kwargs, on_output=lambda s, l: lines_run.append((s, l)))
        calls = _spy_execute(monkeypatch)
        got = asyncio.run(sandbox.arun(**kwargs, on_output=lambda s, l: lines_arun.append((s, l))))
    assert _same(got) == _same(expected) and lines_arun == lines_run
    assert (calls == []) == _loop_path_expected(sandbox)
    if case == "output beyond the cap":
        assert got.truncated and "bytes of stdout omitted" in got.stdout and lines_arun[-1][1].startswith("[output trunc")
    if case == "both streams, non-zero exit":
        assert (got.exit_code, got.stdout, got.stderr) == (7, "out\nno newline\n", "err\n")


def test_arun_checks_its_arguments_like_run(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec()) as sandbox:
        for bad in (dict(cmd=" ", timeout=5), dict(cmd="true", timeout=0), dict(cmd="true", timeout=5, env={"1x": "y"}),
                    dict(cmd="true", timeout=5, max_output_bytes=0)):
            with pytest.raises(SandboxError) as sync_error:
                sandbox.run(**bad)
            with pytest.raises(SandboxError) as async_error:
                asyncio.run(sandbox.arun(**bad))
            assert str(async_error.value) == str(sync_error.value)


def test_arun_runs_on_the_loop_without_a_thread_where_the_host_allows(
    local_backend: Any, hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy_execute(monkeypatch)
    to_thread_calls: list[Any] = []
    real_to_thread = asyncio.to_thread

    async def spy_to_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
        to_thread_calls.append(getattr(fn, "__func__", fn))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy_to_thread)
    with local_backend.create(SandboxSpec()) as sandbox:
        callback_threads: set[int] = set()

        async def main() -> list[ExecResult]:
            return [await sandbox.arun(f"echo {n}; echo two", timeout=30,
                                       on_output=lambda s, l: callback_threads.add(threading.get_ident()))
                    for n in ("one", "again")]

        first, second = asyncio.run(main())
        capable = _loop_path_expected(sandbox)
    assert first.ok and first.stdout == "one\ntwo\n" and second.stdout == "again\ntwo\n"
    if capable:
        # No pool thread for the command: not the thread path, callbacks on the loop's thread.
        # Not even a hop to start the spawner thread: it started with the sandbox.
        assert calls == [] and callback_threads == {threading.get_ident()}
        assert to_thread_calls == []
    else:
        # No CgroupThread (cgroup v2 or none): run() in a worker thread.
        assert len(calls) == 2 and all(thread is not threading.current_thread() for thread in calls)
        assert len(to_thread_calls) == 2
        assert callback_threads and threading.get_ident() not in callback_threads


def test_arun_takes_the_thread_path_while_the_process_holds_many_sandboxes(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy_execute(monkeypatch)
    monkeypatch.setattr(local, "LOOP_COMMANDS_MAX_SANDBOXES", 2)
    sandboxes = [local_backend.create(SandboxSpec()) for _ in range(3)]
    try:
        expected_loop = _loop_path_expected(sandboxes[0])
        crowded = asyncio.run(sandboxes[0].arun("echo crowded", timeout=30))
        # Three live handles: a worker with many rollouts; the command went to a worker thread.
        assert crowded.ok and crowded.stdout == "crowded\n"
        assert len(calls) == 1 and calls[0] is not threading.current_thread()
        sandboxes.pop().destroy()
        calls.clear()
        quiet = asyncio.run(sandboxes[0].arun("echo quiet", timeout=30))
        # Two left: on the loop where this host allows it.
        assert quiet.ok and quiet.stdout == "quiet\n"
        assert (calls == []) == expected_loop
    finally:
        for sandbox in sandboxes:
            sandbox.destroy()


def test_a_spawner_thread_that_cannot_join_sends_arun_down_the_thread_path(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> None:
        raise PermissionError(1, "drop_thread_privileges in the spawner thread failed: Operation not permitted")

    monkeypatch.setattr(bwrap, "drop_thread_privileges", refuse)
    calls = _spy_execute(monkeypatch)
    with local_backend.create(SandboxSpec()) as sandbox:
        capable = _loop_path_expected(sandbox)
        result = asyncio.run(sandbox.arun("id -u", timeout=30))
        later = asyncio.run(sandbox.arun("echo later", timeout=30))
        assert not sandbox._loop_capable()
    assert result.ok and result.stdout == "65534\n" and later.stdout == "later\n"
    # Where the thread was to be used, its failure is remembered: both commands took the thread path.
    assert sandbox._thread_failed == capable and len(calls) == 2


def test_an_arun_past_its_deadline_is_killed_with_everything_it_started(local_backend: Any, hosts: str) -> None:
    with local_backend.create(SandboxSpec()) as sandbox:
        started = time.monotonic()
        result = asyncio.run(sandbox.arun("echo started; sleep 300 & setsid sleep 301 & sleep 302; echo never",
                                          timeout=1))
        elapsed = time.monotonic() - started
        assert wait_for_no_sandbox_processes() == []
        after = asyncio.run(sandbox.arun("echo still here", timeout=30))
    assert result.timed_out and result.exit_code is None and result.killed_by == "timeout"
    assert result.stdout == "started\n" and "wall-clock timeout of 1s" in result.stderr
    assert 1.0 <= elapsed < 10 and 1000 <= result.duration_ms
    assert after.ok and after.stdout == "still here\n"


@pytest.mark.parametrize("handle", ["the same handle", "another handle"])
def test_destroy_while_an_arun_is_in_flight_ends_it_as_destroyed(db: Any, handle: str) -> None:
    # Without records: the destroy runs in a worker thread (as the agent's does), which must not
    # write the test's database.
    sandbox = LocalBackend(records=False).create(SandboxSpec())
    destroy = sandbox.destroy if handle == "the same handle" else lambda: LocalBackend(records=False).destroy(sandbox.id)

    async def main() -> ExecResult:
        up = asyncio.Event()
        task = asyncio.create_task(sandbox.arun("echo up; sleep 300", timeout=600, on_output=_setter(up)))
        await asyncio.wait_for(up.wait(), 30)
        await asyncio.to_thread(destroy)
        return await asyncio.wait_for(task, 30)

    result = asyncio.run(main())
    assert result.exit_code == 137 and result.killed_by == "destroyed" and result.stdout == "up\n"
    assert wait_for_no_sandbox_processes() == [] and not sandbox._procs


def test_cancelling_the_awaiting_task_kills_the_command(db: Any, hosts: str) -> None:
    # Without records: the thread path's destroy runs in a worker thread (no test database there).
    with LocalBackend(records=False).create(SandboxSpec()) as sandbox:
        loop_path = _loop_path_expected(sandbox)

        async def main() -> ExecResult:
            up = asyncio.Event()
            task = asyncio.create_task(sandbox.arun("echo up; sleep 300 & sleep 301", timeout=600,
                                                    on_output=_setter(up)))
            await asyncio.wait_for(up.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if loop_path:
                # Killed at once (well before the monitor's escalation, DRAIN_AFTER_KILL later),
                # and reaped on this loop as soon as it exits.
                await _until(lambda: not sandbox_user_processes() and not sandbox._procs, timeout=local.DRAIN_AFTER_KILL / 2)
            else:
                # The thread path cannot take a command back: it runs on until the sandbox goes.
                await asyncio.sleep(0.5)
                assert sandbox_user_processes() and sandbox._procs
                await asyncio.to_thread(sandbox.destroy)
                return await asyncio.sleep(0, ExecResult(exit_code=0, stdout="usable\n", stderr=""))
            return await sandbox.arun("echo usable", timeout=30)

        after = asyncio.run(main())
        assert after.ok and after.stdout == "usable\n"
    assert wait_for_no_sandbox_processes() == []


class _Turn:
    """Stands for local._STARTING: one turn, and how many starts have asked for it."""

    def __init__(self) -> None:
        self.semaphore = threading.BoundedSemaphore(1)
        self.asked = 0

    def __enter__(self) -> None:
        self.asked += 1
        self.semaphore.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.semaphore.release()


def test_cancelling_while_the_command_starts_leaves_nothing_behind(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test holds the only turn to start: the first arun's start waits for it on the spawner
    # thread (it starts, and is killed, when the turn comes); the second's is still queued
    # behind it (it never starts).
    turn = _Turn()
    monkeypatch.setattr(local, "_STARTING", turn)
    popens: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        popens.append(args[0])
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    with local_backend.create(SandboxSpec()) as sandbox:
        if not _loop_path_expected(sandbox):
            # The thread path waits for its turn in a worker thread: nothing to take back here.
            assert not sandbox._loop_capable()
            return

        async def main() -> None:
            turn.semaphore.acquire()
            try:
                first = asyncio.create_task(sandbox.arun("echo first; sleep 300", timeout=600))
                second = asyncio.create_task(sandbox.arun("echo second; sleep 300", timeout=600))
                await _until(lambda: turn.asked == 1)  # the loop runs on while they wait
                first.cancel()
                second.cancel()
                for task in (first, second):
                    with pytest.raises(asyncio.CancelledError):
                        await task
            finally:
                turn.semaphore.release()
            await _until(lambda: len(popens) == 1 and not sandbox_user_processes())

        asyncio.run(main())
        time.sleep(0.2)
        assert len(popens) == 1 and turn.asked == 1  # the queued start was skipped
        assert wait_for_no_sandbox_processes() == [] and not sandbox._procs
        assert sandbox.run("echo usable", timeout=30).stdout == "usable\n"


def test_many_concurrent_aruns_on_one_loop(local_backend: Any, hosts: str) -> None:
    sandboxes = [local_backend.create(SandboxSpec()) for _ in range(4)]
    try:
        async def main() -> tuple[list[ExecResult], float]:
            started = time.monotonic()
            results = await asyncio.gather(*[
                sb.arun(f"sleep 0.5; echo {n}-{i}; echo e{i} >&2", timeout=60)
                for n, sb in enumerate(sandboxes) for i in range(8)
            ])
            return results, time.monotonic() - started

        results, elapsed = asyncio.run(main())
    finally:
        for sb in sandboxes:
            sb.destroy()
    expected = [(f"{n}-{i}\n", f"e{i}\n") for n in range(4) for i in range(8)]
    assert [(r.stdout, r.stderr) for r in results] == expected and all(r.ok for r in results)
    assert elapsed < 32 * 0.5 / 2  # they overlapped
    assert wait_for_no_sandbox_processes() == []


def test_on_output_streams_lines_while_the_command_runs(local_backend: Any, hosts: str) -> None:
    # The command prints "first", then waits for a file that only the callback's reaction
    # creates: buffered output could never release it.
    with local_backend.create(SandboxSpec()) as sandbox:
        seen: list[tuple[str, str]] = []
        gates: list[Any] = []
        loop: list[asyncio.AbstractEventLoop] = []

        def on_output(stream: str, line: str) -> None:
            seen.append((stream, line))
            if line == "first":  # on the loop's thread, or a worker thread on the thread path
                gates.append(asyncio.run_coroutine_threadsafe(sandbox.arun("touch gate", timeout=30), loop[0]))

        async def main() -> ExecResult:
            loop.append(asyncio.get_running_loop())
            result = await sandbox.arun(
                "echo first; while [ ! -e gate ]; do sleep 0.05; done; echo second; echo done >&2",
                timeout=20, on_output=on_output,
            )
            await asyncio.gather(*map(asyncio.wrap_future, gates))
            return result

        result = asyncio.run(main())
    assert not result.timed_out and result.ok and result.stdout == "first\nsecond\n"
    assert [line for stream, line in seen if stream == "stdout"] == ["first", "second"] and ("stderr", "done") in seen


def test_an_on_output_that_raises_kills_the_command_and_the_error_reaches_the_caller(local_backend: Any) -> None:
    def explode(stream: str, line: str) -> None:
        raise RuntimeError(f"callback failed on {line!r}")

    with local_backend.create(SandboxSpec()) as sandbox:
        with pytest.raises(RuntimeError, match="callback failed on 'boom'"):
            asyncio.run(asyncio.wait_for(sandbox.arun("echo boom; sleep 300", timeout=600, on_output=explode), 30))
        assert wait_for_no_sandbox_processes() == []


def test_the_loop_path_writes_stdin_larger_than_a_pipe(local_backend: Any) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: many times a pipe's buffer
    with local_backend.create(SandboxSpec()) as sandbox:
        sink = RawSink()
        outcome = asyncio.run(sandbox._aexecute(["sh", "-c", "cat > in.bin; wc -c < in.bin"], timeout=60,
                                                cwd="/workspace", env={}, sink=sink, stdin_data=data))
        if outcome is None:
            # No loop path on this host: nothing ran.
            assert not _loop_path_expected(sandbox)
            return
        assert outcome.exit_code == 0 and bytes(sink.stdout).strip() == str(len(data)).encode()
        assert sandbox.read_file("in.bin") == data
