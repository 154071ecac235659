"""Local backend specifics: refusing without isolation, recorded downgrades, cgroups, cleanup."""
from __future__ import annotations

import asyncio
import gc
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from apps.engines.models import SandboxRecord
from apps.engines.sandboxes import SandboxError, SandboxNotFound, SandboxSpec, SandboxUnavailable, get_backend
from apps.engines.sandboxes import cgroups as sandbox_cgroups
from apps.engines.sandboxes import bwrap, etc, local
from tests.engines.conftest import SANDBOX_UID, sandbox_user_processes, wait_for_no_sandbox_processes

pytestmark = pytest.mark.usefixtures("sandbox_settings")


@pytest.fixture
def no_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process sees a host without bwrap (the real probe runs against a PATH lacking it)."""
    real_which = bwrap._which
    monkeypatch.setattr(bwrap, "_which", lambda name: "" if name == "bwrap" else real_which(name))
    bwrap.reset_host_support()
    yield
    bwrap.reset_host_support()


def test_it_refuses_without_bubblewrap_and_says_how_to_fix_it(db: Any, no_bubblewrap: Any) -> None:
    # the rows this call writes: on PostgreSQL the shared test database can hold rows another test's
    # leftover thread committed (its CI pass saw 3 records for this one refusal)
    before = SandboxRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    with pytest.raises(SandboxUnavailable) as excinfo:
        get_backend("local").create(SandboxSpec())
    message = str(excinfo.value)
    assert "bubblewrap is not installed" in message
    assert "apt-get install bubblewrap" in message and "SANDBOX_ALLOW_UNISOLATED=1" in message
    record = SandboxRecord.objects.get(pk__gt=before)
    assert record.state == SandboxRecord.State.FAILED and "bubblewrap" in record.last_error


def unused_uid() -> int:
    """A uid that no account and no process of this machine has. Unisolated, the sandbox's
    RLIMIT_NPROC counts every process of its uid on the machine: as `nobody` the limit was used up
    by other sandboxes' processes (other test runs, a worker) and the command failed with "Cannot fork"."""
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            taken.update(int(uid) for uid in status.read_text().split("Uid:", 1)[1].split("\n", 1)[0].split())
        except (OSError, IndexError, ValueError):
            continue
    return next(uid for uid in range(64000, 65000) if uid not in taken)


def test_unisolated_mode_must_be_asked_for_and_is_recorded(db: Any, no_bubblewrap: Any, settings: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    settings.SANDBOX_ALLOW_UNISOLATED = True
    uid = unused_uid()
    if bwrap._sandbox_user()[2]:  # as root the commands drop to the sandbox user: one of the test's own
        monkeypatch.setattr(bwrap, "_sandbox_user", lambda: (uid, uid, True))
    else:
        uid = os.getuid()
    with get_backend("local").create(SandboxSpec(memory_mb=256)) as sandbox:
        assert sandbox.downgrades[0].startswith("UNISOLATED: bubblewrap is not installed")
        record = SandboxRecord.objects.get(external_id=sandbox.id)
        assert record.downgrades == sandbox.downgrades
        sandbox.write_file("sub/hello.txt", b"hi")
        result = sandbox.run(
            "id -u; cat hello.txt; echo; grep 'Max processes' /proc/self/limits | tr -s ' ' | cut -d' ' -f3",
            timeout=30, cwd="sub",
        )
        assert sandbox.read_file("sub/hello.txt") == b"hi"
    # Still not root and still limited, but with no namespaces at all.
    assert result.stdout.split() == [str(uid), "hi", str(SandboxSpec().pids)]


@pytest.mark.parametrize("placement", ["cgroup thread", "join per command"])
def test_processes_land_in_the_sandbox_cgroups_or_the_downgrade_is_recorded(
    local_backend: Any, placement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cgroup v1: a worker thread parked in the cgroups starts the commands (born inside);
    # otherwise (v2, or the thread cannot move) a root shell joins them before exec'ing bwrap.
    if placement == "join per command":
        monkeypatch.setattr(sandbox_cgroups.SandboxCgroup, "thread_capable", property(lambda self: False))
    support = sandbox_cgroups.support()
    with local_backend.create(SandboxSpec(memory_mb=200, pids=40)) as sandbox:
        members: dict[str, set[int]] = {}

        def on_output(stream: str, line: str) -> None:
            # The command waits here; from the host, its processes must be in every cgroup.
            for controller, path in sandbox.cgroup.paths.items():
                members[controller] = {int(pid) for pid in (Path(path) / "cgroup.procs").read_text().split()}
            sandbox.write_file("gate", b"")

        result = sandbox.run("echo ready; while [ ! -e gate ]; do sleep 0.05; done", timeout=30, on_output=on_output)
        assert result.ok
        record = SandboxRecord.objects.get(external_id=sandbox.id)
        for controller in sandbox_cgroups.CONTROLLERS:
            if controller in support.enforced:
                path = Path(sandbox.cgroup.paths[controller])
                assert path.name == sandbox.id
                limit_file = {
                    ("memory", 1): "memory.limit_in_bytes", ("memory", 2): "memory.max",
                    ("pids", 1): "pids.max", ("pids", 2): "pids.max",
                    ("cpu", 1): "cpu.cfs_quota_us", ("cpu", 2): "cpu.max",
                }[(controller, support.versions[controller])]
                expected = {"memory": str(200 << 20), "pids": "40", "cpu": "100000"}[controller]
                assert (path / limit_file).read_text().split()[0] == expected
                assert len(members[controller]) >= 2, members  # the shell and its sleep, at least
            else:
                assert any(d.startswith(f"no {controller} cgroup") for d in record.downgrades), record.downgrades
        paths = dict(sandbox.cgroup.paths)
    assert not any(Path(p).exists() for p in paths.values())


def test_cgroup_detection_reports_instead_of_failing() -> None:
    support = sandbox_cgroups.detect(
        mountinfo=(
            "40 31 0:36 / /nonexistent/pids rw,relatime - cgroup cgroup rw,pids\n"
            "41 31 0:38 / /nonexistent/unified rw,relatime - cgroup2 cgroup2 rw\n"
        ),
        proc_cgroup="8:pids:/some/where\n0::/worker.service\n",
    )
    assert support.enforced == ()
    assert set(support.problems) == {"memory", "pids", "cpu"}
    assert "cgroup v1 /nonexistent/pids/some/where/trajplatform-sandboxes" in support.problems["pids"]
    assert "/nonexistent/unified/worker.service" in support.problems["memory"]


def test_network_other_than_none_is_refused_locally(local_backend: Any) -> None:
    with pytest.raises(SandboxError, match="only network='none'"):
        local_backend.create(SandboxSpec(network="open"))


def test_an_opensandbox_image_name_is_recorded_as_a_downgrade(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec(image="python:3.12-slim")) as sandbox:
        assert any("image 'python:3.12-slim' is not available locally" in d for d in sandbox.downgrades)
        assert sandbox.run("python3 -c 'import sys; print(sys.version_info[0])'", timeout=30).stdout == "3\n"
    with local_backend.create(SandboxSpec(image="python")) as sandbox:
        assert not any("image" in d for d in sandbox.downgrades)


def test_a_sandbox_root_the_sandbox_user_cannot_enter_is_a_clear_error(db: Any) -> None:
    parent = Path(tempfile.mkdtemp(prefix="trajplatform-private-"))  # mode 0700
    try:
        backend = local.LocalBackend(root=parent / "sandboxes")
        with pytest.raises(SandboxUnavailable, match=r"cannot enter .*mode 700"):
            backend.create(SandboxSpec())
    finally:
        shutil.rmtree(parent)


def test_destroy_from_another_handle_kills_a_running_command(local_backend: Any) -> None:
    sandbox = local_backend.create(SandboxSpec())
    cgroup_dirs = [Path(p) for p in sandbox.cgroup.paths.values()]
    results: list[Any] = []
    started = threading.Event()
    thread = threading.Thread(target=lambda: results.append(
        sandbox.run("echo up; sleep 300", timeout=600, on_output=lambda s, l: started.set())))
    thread.start()
    assert started.wait(30)
    assert local.LocalBackend().destroy(sandbox.id) is True  # a different backend object and handle
    thread.join(30)
    assert not thread.is_alive(), "the command outlived its sandbox"
    assert results[0].exit_code == 137 and results[0].killed_by == "destroyed"
    assert not (Path(settings.SANDBOX_ROOT) / sandbox.id).exists()
    # Removed although this handle's cgroup thread was still parked in them.
    assert not any(d.exists() for d in cgroup_dirs)
    with pytest.raises(SandboxNotFound):
        sandbox.run("true", timeout=5)
    assert wait_for_no_sandbox_processes() == []


def test_a_cgroup_thread_evicted_from_its_cgroups_refuses_to_start_commands(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec()) as sandbox:
        if not sandbox.cgroup.thread_capable:
            # No cgroup v1 here: commands join per command, and what is missing is recorded.
            assert sandbox.downgrades or sandbox.cgroup.paths
            return
        # Commands run in the sandbox's init; the thread serves a second command running beside one.
        sandbox._cgroup_thread().call(lambda: None)  # parks the thread in the cgroups
        assert sandbox.cgroup.evict_threads(uid=SANDBOX_UID) >= 1
        with pytest.raises(sandbox_cgroups.CgroupJoinError, match="no longer in"):
            sandbox._cgroup_thread().call(lambda: "would start a command outside the limits")
        # The handle falls back to joining per command, still inside the limits.
        assert sandbox.run("true", timeout=30).ok


def test_a_new_sandbox_starts_its_spawner_thread_before_the_first_command(local_backend: Any) -> None:
    # Its cgroup join (an RCU grace period), credentials and network namespace are made while
    # the caller does other things (an agent waits for the model's first turn), not in the
    # first command's time.
    with local_backend.create(SandboxSpec()) as sandbox:
        if not sandbox.cgroup.thread_capable:
            assert sandbox._spawner is None  # commands join the cgroups each: nothing to start
            return
        spawner = sandbox._spawner
        assert spawner is not None and spawner.running
        thread = spawner._thread
        assert thread is not None and thread.is_alive()
        assert sandbox.run("true", timeout=30).ok
        assert sandbox._spawner is spawner and spawner._thread is thread  # the first command used it
    thread.join(5)
    assert not thread.is_alive()  # destroy let it go


def test_a_command_outlives_the_spawner_threads_idle_time(local_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The commands the spawner thread starts get bubblewrap's parent-death signal when that
    # thread exits: it must not idle out while one of them still runs (it did, at 30 s: exit 137).
    monkeypatch.setattr(sandbox_cgroups.CgroupThread, "IDLE_EXIT", 0.2)
    with local_backend.create(SandboxSpec()) as sandbox:
        if not sandbox.cgroup.thread_capable:
            assert sandbox._spawner is None  # each command joins the cgroups: no thread to outlive
            return
        result = sandbox.run("sleep 1.2; echo still here", timeout=30)
        assert (result.exit_code, result.stdout, result.killed_by) == (0, "still here\n", None)
        thread = sandbox._spawner._thread
        assert thread is not None
        thread.join(5)  # idle and childless now: it goes
        assert not thread.is_alive() and not sandbox._spawner.running
        assert sandbox.run("echo again", timeout=30).stdout == "again\n"  # and comes back on demand


def test_a_dropped_handle_is_not_kept_by_its_spawner_thread(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec()) as sandbox:
        other = local_backend.get(sandbox.id)
        assert other.run("true", timeout=30).ok and asyncio.run(other.arun("true", timeout=30)).ok
        spawner, handle = other._spawner, weakref.ref(other)
        del other
        gc.collect()
        # The thread, still up for its idle time, no longer holds the last function it ran.
        assert handle() is None and (spawner is None or spawner.running)


def test_cgroup_thread_submit_returns_before_the_thread_is_in_and_failures_reach_the_future() -> None:
    joined = threading.Event()

    def slow_prepare() -> None:
        joined.wait(10)

    thread = sandbox_cgroups.CgroupThread(sandbox_cgroups.SandboxCgroup({}, {}), name="t-slow", prepare=slow_prepare)
    assert not thread.running
    started = time.monotonic()
    thread.start()  # up, though still preparing
    assert thread.running
    future = thread.submit(threading.get_native_id)
    skipped = thread.submit(lambda: pytest.fail("a cancelled request ran"))
    assert time.monotonic() - started < 1 and not future.done()
    assert skipped.cancel()
    joined.set()
    assert future.result(10) != threading.get_native_id()  # ran on the spawner thread
    assert thread.call(lambda: "again") == "again"
    thread.stop()
    assert not thread.running

    def failing_prepare() -> None:
        raise PermissionError(1, "no")

    broken = sandbox_cgroups.CgroupThread(sandbox_cgroups.SandboxCgroup({}, {}), name="t-broken",
                                          prepare=failing_prepare)
    futures = [broken.submit(lambda: "never") for _ in range(3)]
    for f in futures:
        with pytest.raises(sandbox_cgroups.CgroupJoinError, match="no"):
            f.result(10)
    with pytest.raises(sandbox_cgroups.CgroupJoinError):  # a fresh thread, which fails again
        broken.call(lambda: "never")


def _status(path: str) -> dict[str, list[str]]:
    return {key: value.split() for key, value in
            (line.split(":", 1) for line in Path(path).read_text().splitlines() if ":" in line)}


DROPPED = {"NoNewPrivs": ["1"], "CapEff": ["0" * 16], "CapPrm": ["0" * 16]}


def test_drop_thread_privileges_changes_only_the_calling_thread() -> None:
    seen: dict[str, Any] = {}

    def drop() -> None:
        bwrap.drop_thread_privileges(SANDBOX_UID, SANDBOX_UID)
        seen["status"] = _status("/proc/thread-self/status")
        try:
            Path("/etc/shadow").read_bytes()
            seen["shadow"] = "read"
        except PermissionError:
            seen["shadow"] = "denied"

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join(10)
    status = seen["status"]
    assert status["Uid"] == [str(SANDBOX_UID)] * 4 and status["Gid"] == [str(SANDBOX_UID)] * 4
    assert status["Groups"] == [] and {k: status[k] for k in DROPPED} == DROPPED and seen["shadow"] == "denied"
    # Only that thread: this one (and the process) is still root with its capabilities.
    me = _status("/proc/thread-self/status")
    assert me["Uid"] == ["0"] * 4 and me["NoNewPrivs"] == ["0"] and me["CapEff"] != ["0" * 16]
    assert Path("/etc/shadow").read_bytes()


def _spy_wrap_argv(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    argvs: list[list[str]] = []
    real_wrap_argv = local.wrap_argv
    monkeypatch.setattr(local, "wrap_argv", lambda *a, **k: argvs.append(real_wrap_argv(*a, **k)) or argvs[-1])
    return argvs


def test_commands_run_dropped_and_from_the_spawner_thread_without_setpriv(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = bwrap.host_support()
    argvs = _spy_wrap_argv(monkeypatch)
    with local_backend.create(SandboxSpec()) as sandbox:
        secret = sandbox.workspace / "root-only"  # root's, 0600: what /etc/shadow was on the host's /etc
        secret.write_text("x")
        secret.chmod(0o600)
        result = sandbox.run("grep -E '^(NoNewPrivs|CapEff|CapPrm):' /proc/self/status; cat root-only", timeout=30)
        # Either way: the sandbox user, no capabilities, no way back up.
        assert {k: v.split() for k, v in (line.split(":", 1) for line in result.stdout.splitlines())} == DROPPED
        assert "Permission denied" in result.stderr
        # From the cgroup v1 spawner thread (which dropped itself) no setpriv exec; else setpriv.
        assert argvs and any(host.setpriv in argv for argv in argvs) == (not sandbox.cgroup.thread_capable)
        if sandbox.cgroup.thread_capable:
            thread = _status(f"/proc/self/task/{sandbox._spawner._thread.native_id}/status")
            assert thread["Uid"] == [str(host.uid)] * 4 and thread["NoNewPrivs"] == ["1"]
    assert _status("/proc/thread-self/status")["Uid"] == ["0"] * 4


@pytest.mark.parametrize("failing", ["drop_thread_privileges", "enter_private_network"])
def test_a_spawner_thread_that_cannot_prepare_leaves_the_work_to_setpriv_and_bwrap(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    def refuse(*args: Any) -> None:
        raise PermissionError(1, f"{failing} in the spawner thread failed: Operation not permitted")

    monkeypatch.setattr(bwrap, failing, refuse)
    host = bwrap.host_support()
    argvs = _spy_wrap_argv(monkeypatch)
    with local_backend.create(SandboxSpec()) as sandbox:
        result = sandbox.run("id -u; grep -E '^(NoNewPrivs|CapEff):' /proc/self/status; readlink /proc/self/ns/net",
                             timeout=30)
        # The thread never started a command half-prepared: the handle joins per command, with
        # setpriv, and bwrap makes each command's network namespace.
        assert sandbox._thread_failed == sandbox.cgroup.thread_capable
        assert argvs and host.setpriv in argvs[-1] and "--share-net" not in argvs[-1]
        lines = result.stdout.split()
        assert lines[0] == str(SANDBOX_UID) and lines[1:5] == ["CapEff:", "0" * 16, "NoNewPrivs:", "1"]
        assert lines[5] != _netns("self")


def _netns(task: str) -> str:
    return str(Path(f"/proc/{task}/ns/net").readlink())


def test_enter_private_network_moves_only_the_calling_thread_to_a_loopback_only_network() -> None:
    seen: dict[str, Any] = {}

    def enter() -> None:
        bwrap.enter_private_network()
        seen["ns"] = _netns("thread-self")
        seen["devices"] = [line.split(":")[0].strip() for line in
                           Path("/proc/thread-self/net/dev").read_text().splitlines()[2:]]
        with socket.socket() as server:  # the loopback is up: a listener there answers
            server.bind(("127.0.0.1", 0))
            server.listen()
            with socket.create_connection(server.getsockname(), timeout=5):
                seen["loopback"] = "up"

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(10)
    assert seen["devices"] == ["lo"] and seen["loopback"] == "up"
    # Only that thread moved: this one is still in the process's (the host's) namespace.
    assert seen["ns"] != _netns("thread-self") == _netns("self")


def test_a_sandboxs_commands_share_one_network_that_nothing_else_reaches(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    argvs = _spy_wrap_argv(monkeypatch)
    script = ("readlink /proc/self/ns/net; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
              "python3 -c 'import socket, sys; socket.create_connection((\"127.0.0.1\", int(sys.argv[1])), 2)' {port} "
              "2>/dev/null && echo reached || echo refused")
    with socket.socket() as host_server:  # a service on the worker's loopback
        host_server.bind(("127.0.0.1", 0))
        host_server.listen()
        port = host_server.getsockname()[1]
        with local_backend.create(SandboxSpec()) as one, local_backend.create(SandboxSpec()) as other:
            first, second, third = (sandbox.run(script.format(port=port), timeout=30).stdout.split()
                                    for sandbox in (one, one, other))
            shared = one.cgroup.thread_capable
    # Loopback only, and the worker's loopback is not it.
    assert [first[1:], second[1:], third[1:]] == [["lo", "refused"]] * 3
    assert _netns("self") not in {first[0], second[0], third[0]} and first[0] != third[0]
    # From the spawner thread, one network per sandbox (bwrap keeps it); else one per command.
    assert (first[0] == second[0]) == shared
    assert any("--share-net" in argv for argv in argvs) == shared


def _one_turn_to_start(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One turn in local._STARTING, and a Popen that fails for a command with FAIL_START in its
    command line; returns [the most starts that were ever under way at once]."""
    monkeypatch.setattr(local, "_STARTING", threading.BoundedSemaphore(1))
    starting: list[int] = []
    most = [0]
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        starting.append(1)
        most[0] = max(most[0], len(starting))
        try:
            if any("FAIL_START" in arg for arg in args[0]):
                raise OSError(24, "Too many open files")
            time.sleep(0.01)  # widen the window in which a second start would overlap
            return real_popen(*args, **kwargs)
        finally:
            starting.pop()

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    return most


def test_commands_take_turns_to_start_and_a_failed_start_gives_its_turn_back(
    local_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    most = _one_turn_to_start(monkeypatch)
    with local_backend.create(SandboxSpec()) as sandbox:
        with pytest.raises(SandboxError, match="could not start a command.*Too many open files"):
            sandbox.run("true FAIL_START", timeout=30)
        results: list[Any] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(sandbox.run(f"echo {i}", timeout=30)), daemon=True)
            for i in range(6)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    # The failed start gave its turn back (else these would wait forever); one started at a time.
    assert sorted(int(r.stdout) for r in results) == list(range(6)) and most[0] == 1


def test_aruns_take_turns_to_start_without_blocking_the_loop(local_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # arun's commands wait for their turn in worker threads, never on the event loop.
    most = _one_turn_to_start(monkeypatch)
    turn = local._STARTING
    sandboxes = [local_backend.create(SandboxSpec()) for _ in range(3)]
    try:
        async def main() -> tuple[list[Any], float]:
            with pytest.raises(SandboxError, match="could not start a command.*Too many open files"):
                await sandboxes[0].arun("true FAIL_START", timeout=30)
            # Held by the test: nobody may start, yet the loop must keep running.
            assert turn.acquire(timeout=5)
            release = threading.Timer(10, turn.release)  # never hang the test on a blocked loop
            release.start()
            tasks = [asyncio.create_task(sb.arun(f"echo {i}", timeout=30)) for i in range(4) for sb in sandboxes]
            slept = time.monotonic()
            await asyncio.sleep(0.2)
            slept = time.monotonic() - slept
            release.cancel()
            assert slept < 5, "the loop waited for the turn"
            assert not any(task.done() for task in tasks)
            turn.release()
            return await asyncio.gather(*tasks), slept

        results, slept = asyncio.run(main())
    finally:
        for sb in sandboxes:
            sb.destroy()
    # The failed start gave its turn back; one started at a time; the loop was never blocked.
    assert sorted(int(r.stdout) for r in results) == sorted(list(range(4)) * 3) and most[0] == 1


def test_a_crashed_worker_leaves_no_sandbox_process_running(local_backend: Any) -> None:
    # A worker process dies (SIGKILL, OOM, deploy) mid-command: --die-with-parent takes the
    # sandbox's processes with it; the workspace stays for the reconciler.
    root = Path(settings.SANDBOX_ROOT)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(settings.BASE_DIR)!r})
        from apps.engines.sandboxes.local import LocalBackend
        from apps.engines.sandboxes.base import SandboxSpec
        sandbox = LocalBackend(records=False, root={str(root)!r}, allow_unisolated=False).create(SandboxSpec())
        print(sandbox.id, flush=True)
        sandbox.run("sleep 300 & setsid sleep 301 & echo running; wait", timeout=600,
                    on_output=lambda s, l: print(l, flush=True))
    """)
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        sandbox_id = worker.stdout.readline().strip()
        assert worker.stdout.readline().strip() == "running"
        assert any("sleep 30" in cmd for _, cmd in sandbox_user_processes())
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        assert wait_for_no_sandbox_processes() == []
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.stdout.close()
    assert (root / sandbox_id).exists()
    assert local.LocalBackend(records=False).destroy(sandbox_id) is True


def test_the_sandbox_sees_only_its_own_env(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec(env={"GREETING": "hi"})) as sandbox:
        result = sandbox.run("env | sort", timeout=30)
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines()}
    assert names <= {"PATH", "HOME", "LANG", "TMPDIR", "USER", "GREETING", "PWD", "SHLVL", "_"}
    assert "GREETING=hi" in result.stdout


def test_invalid_arguments_are_refused_before_anything_runs(local_backend: Any) -> None:
    with pytest.raises(SandboxError, match="labels|label key"):
        SandboxSpec(labels={"bad key!": "x"})
    with pytest.raises(SandboxError, match="reserved"):
        SandboxSpec(labels={"trajplatform.io/managed": "false"})
    with pytest.raises(SandboxError, match="ttl"):
        SandboxSpec(ttl=-5)
    with local_backend.create(SandboxSpec()) as sandbox:
        with pytest.raises(SandboxError, match="timeout"):
            sandbox.run("true", timeout=0)
        with pytest.raises(SandboxError, match="empty"):
            sandbox.run("  ", timeout=5)
        with pytest.raises(SandboxError, match="env name"):
            sandbox.run("true", timeout=5, env={"1BAD": "x"})
        with pytest.raises(SandboxError, match="only under /workspace"):
            sandbox.write_file("/etc/passwd", b"root::0:0::/:/bin/sh")


def test_by_default_every_command_gets_a_fresh_bubblewrap(local_backend: Any) -> None:
    with local_backend.create(SandboxSpec()) as sandbox:
        first = sandbox.run("echo $$ $PPID; cat /proc/1/cmdline | tr '\\0' ' '", timeout=30)
        # The command's shell is pid 1 of its own sandbox; nothing waits between commands.
        assert first.stdout.startswith("1 0\n/bin/sh -c")
        assert wait_for_no_sandbox_processes() == []


def test_an_entrypoint_is_refused_locally_with_the_reason(sandbox_settings) -> None:
    from apps.engines.sandboxes import SandboxSpecUnsupported, get_backend

    with pytest.raises(SandboxSpecUnsupported, match="not an image's entrypoint"):
        get_backend("local", records=False).create(SandboxSpec(entrypoint=("/init",)))
    with pytest.raises(SandboxError, match="entrypoint must be a non-empty list"):
        SandboxSpec(entrypoint="/init")


def test_the_sandbox_etc_takes_only_world_readable_files_and_links_that_stay_in_usr(tmp_path: Path) -> None:
    host = tmp_path / "etc"
    (host / "python3.11").mkdir(parents=True)
    (host / "python3.11" / "sitecustomize.py").write_text("# ok\n")
    (host / "python3.11" / "private.py").write_text("TOKEN = 'x'\n")
    (host / "python3.11" / "private.py").chmod(0o600)
    (host / "ssl" / "certs").mkdir(parents=True)
    (host / "ssl" / "certs" / "ca-certificates.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (host / "ssl" / "private").mkdir()
    (host / "ssl" / "private" / "key.pem").write_text("key")
    (host / "alternatives").mkdir()
    for name, target in {"awk": "/usr/bin/mawk", "ABORT.7.gz": "/usr/share/postgresql/15/man/man7/ABORT.7.gz",
                         "leak": "/root/.ssh/id_rsa", "up": "../trajplatform.env"}.items():
        (host / "alternatives" / name).symlink_to(target)
    (host / "localtime").symlink_to("/usr/share/zoneinfo/Etc/UTC")
    (host / "trajplatform.env").write_text("DJANGO_SECRET_KEY=x\n")
    (host / "passwd").write_text("root:x:0:0::/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n")
    entries = {e.path: e for e in etc.etc_entries(SANDBOX_UID, SANDBOX_UID, etc=host)}
    assert sorted(entries) == ["alternatives", "alternatives/awk", "group", "hostname", "hosts", "localtime",
                               "nsswitch.conf", "passwd", "python3.11", "python3.11/sitecustomize.py", "ssl",
                               "ssl/certs", "ssl/certs/ca-certificates.crt"]
    assert entries["passwd"].data.decode().splitlines() == [
        "root:x:0:0:root:/root:/usr/sbin/nologin", f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/workspace:/bin/sh"]
    assert entries["alternatives/awk"].target == "/usr/bin/mawk"


def test_the_sandbox_etc_is_built_once_atomically_and_refuses_a_planted_entry(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    root.mkdir()
    first = etc.sandbox_etc(root, SANDBOX_UID, SANDBOX_UID)
    assert etc.sandbox_etc(root, SANDBOX_UID, SANDBOX_UID) == first
    assert [p.name for p in root.iterdir()] == [first.name]  # no staging directory left
    assert (first / "passwd").stat().st_mode & 0o777 == 0o644 and first.stat().st_mode & 0o777 == 0o755
    other = tmp_path / "other"
    other.mkdir()
    (other / first.name).symlink_to(tmp_path)  # a link where the build goes is never used
    with pytest.raises(OSError, match="not a directory this process built"):
        etc.sandbox_etc(other, SANDBOX_UID, SANDBOX_UID)
