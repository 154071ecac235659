"""Hostile programs on the local backend: each is contained, reported in its ExecResult, and
leaves the host as it was (no process of the sandbox user survives, host files untouched)."""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from django.conf import settings

from apps.engines.sandboxes import SandboxError, SandboxSpec, bwrap
from apps.engines.sandboxes import cgroups as sandbox_cgroups
from apps.engines.sandboxes.local import LocalBackend
from tests.engines.conftest import SANDBOX_UID, sandbox_user_processes, wait_for_no_sandbox_processes

pytestmark = pytest.mark.usefixtures("sandbox_settings")


@pytest.fixture
def hostile(settings: Any, sandbox_root_dir: Path) -> Iterator[Any]:
    """A small local sandbox (no DB rows needed here); afterwards the host must be clean."""
    assert sandbox_user_processes(sandbox_root_dir) == [], "an earlier sandbox test leaked processes"
    backend = LocalBackend(records=False)
    sandbox = backend.create(SandboxSpec(memory_mb=128, pids=48, max_file_mb=16, cpu=1))
    yield sandbox
    sandbox.destroy()
    assert wait_for_no_sandbox_processes() == []
    assert not (Path(settings.SANDBOX_ROOT) / sandbox.id).exists()


def test_network_is_unreachable_including_host_loopback(hostile: Any) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    try:
        result = hostile.run(
            ["python3", "-c", f"""
import socket
for host, port in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)):
    try:
        socket.create_connection((host, port), timeout=2)
        print("CONNECTED", host)
    except OSError as exc:
        print("blocked", host, exc.errno)
try:
    socket.getaddrinfo("pypi.org", 443)
    print("RESOLVED")
except OSError:
    print("no dns")
"""],
            timeout=30,
        )
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert result.exit_code == 0
    assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
    assert result.stdout.count("blocked") == 3 and "no dns" in result.stdout


def test_secrets_and_project_files_are_out_of_reach(hostile: Any) -> None:
    project_file = Path(settings.BASE_DIR) / "manage.py"
    database = Path(settings.DATABASES["default"]["NAME"])
    os.environ["TRAJ_TEST_HOST_SECRET"] = "leak-me"
    try:
        result = hostile.run(
            f"cat /etc/shadow; cat {project_file}; ls {settings.BASE_DIR}; ls /root; cat {database}; "
            "env; id -u; grep -c . /proc/self/status >/dev/null && grep CapEff /proc/self/status",
            timeout=30,
        )
    finally:
        del os.environ["TRAJ_TEST_HOST_SECRET"]
    assert "cat: /etc/shadow: No such file or directory" in result.stderr  # the sandbox's own /etc
    assert f"{database}: No such file or directory" in result.stderr
    assert f"{project_file}: No such file or directory" in result.stderr
    assert "/root': No such file or directory" in result.stderr
    assert "leak-me" not in result.stdout and "DJANGO" not in result.stdout and "OPENSANDBOX" not in result.stdout
    assert f"\n{SANDBOX_UID}\n" in result.stdout
    assert "CapEff:\t0000000000000000" in result.stdout


def test_the_hosts_etc_is_not_visible(hostile: Any) -> None:
    """Issue 36: a world-readable file in the host's /etc (a 0644 /etc/trajplatform.env: the secret
    key, the database URL) was readable by every sandbox; the sandbox has an /etc of its own."""
    probe = Path(f"/etc/trajplatform-probe-{uuid.uuid4().hex}")
    probe.write_text("SECRET_KEY=probe-secret\n")
    probe.chmod(0o644)
    try:
        result = hostile.run(f"cat {probe}; ls -A /etc; cat /etc/passwd; id -un; cat /etc/hostname; "
                             "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt; "
                             "python3 -c 'import ssl, sys; ssl.create_default_context(); print(sys.version_info[:2])'; "
                             "ls /etc/alternatives/awk >/dev/null && echo abc | awk '{print toupper($0)}'", timeout=30)
    finally:
        probe.unlink()
    assert f"cat: {probe}: No such file or directory" in result.stderr, result
    listing = result.stdout.split("\n")
    assert "probe-secret" not in result.stdout and probe.name not in listing
    for host_only in ("shadow", "gshadow", "resolv.conf", "ssh", "gitconfig", "machine-id", "pip.conf", "postgresql"):
        assert host_only not in listing, host_only
    assert f"sandbox:x:{SANDBOX_UID}:" in result.stdout and "\nsandbox\nsandbox\n" in result.stdout
    assert "(3, 11)\nABC\n" in result.stdout and result.exit_code == 0, result
    assert int(listing[listing.index("sandbox") + 2]) > 50  # the CA bundle


def test_writes_outside_the_workspace_fail_and_tmp_is_fresh_per_command(hostile: Any) -> None:
    marker = f"escape-{uuid.uuid4().hex}"
    result = hostile.run(
        f"for p in /{marker} /usr/{marker} /etc/{marker} /proc/sys/kernel/hostname /workspace/../{marker}; do "
        f"  (echo x > $p) 2>/dev/null && echo WROTE $p || echo refused $p; done; echo tmp > /tmp/{marker} && echo tmp ok",
        timeout=30,
    )
    nested = hostile.run("mkdir -p /tmp/d/e /dev/shm/s && touch /tmp/d/e/f /tmp/.hidden /dev/shm/s/g && echo made",
                         timeout=30)
    second = hostile.run(f"cat /tmp/{marker}; ls -A /tmp /dev/shm", timeout=30)
    assert "WROTE" not in result.stdout, result.stdout
    assert result.stdout.count("refused") == 5 and "tmp ok" in result.stdout
    assert nested.stdout == "made\n"
    # /tmp and /dev/shm do not survive the command: the next one finds them empty.
    assert "No such file" in second.stderr and second.stdout == "/dev/shm:\n\n/tmp:\n"
    for base in ("/", "/usr", "/etc", "/tmp", str(settings.SANDBOX_ROOT)):
        assert not (Path(base) / marker).exists()


def test_symlinks_planted_in_the_workspace_do_not_reach_host_files(hostile: Any) -> None:
    planted = hostile.run("ln -s /etc/shadow shadow; ln -s /etc/hostname-sbx-target host-target", timeout=30)
    assert planted.ok
    before = Path("/etc/hostname").read_bytes()
    with pytest.raises(SandboxError, match="no such file"):  # the sandbox's /etc has no shadow
        hostile.read_file("shadow")
    with pytest.raises(SandboxError):
        hostile.write_file("host-target", b"overwritten")
    assert not Path("/etc/hostname-sbx-target").exists()
    assert Path("/etc/hostname").read_bytes() == before


def test_fork_bomb_is_capped_and_reported(hostile: Any) -> None:
    result = hostile.run(
        ["python3", "-c", """
import os, time
n = 0
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    except OSError as exc:
        print("fork failed after", n, exc.strerror)
        break
"""],
        timeout=30,
    )
    assert result.exit_code == 0
    assert "fork failed after" in result.stdout and "Resource temporarily unavailable" in result.stdout
    assert int(result.stdout.split()[3]) < 48
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_fork_bomb_without_cgroups_does_not_starve_other_sandboxes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fallback when the host has no pids cgroup: RLIMIT_NPROC, set inside the sandbox's
    # user namespace, counts that sandbox's processes only, although every sandbox runs as
    # the same host uid. A bomb in one sandbox must leave another able to fork.
    monkeypatch.setattr(sandbox_cgroups, "support", lambda: sandbox_cgroups.CgroupSupport(
        problems={c: "disabled by the test" for c in sandbox_cgroups.CONTROLLERS}))
    backend = LocalBackend(records=False)
    bomb = backend.create(SandboxSpec(pids=24))
    other = backend.create(SandboxSpec(pids=24))
    try:
        assert any("no pids cgroup" in d and "RLIMIT_NPROC=24" in d for d in bomb.downgrades)
        results: dict[str, Any] = {}
        gate = bomb.workspace / "release"

        def run_bomb() -> None:
            results["bomb"] = bomb.run(["python3", "-c", f"""
import os, time
n = 0
while True:
    try:
        if os.fork() == 0:
            while not os.path.exists({str(gate)!r}.replace({str(bomb.workspace)!r}, "/workspace")):
                time.sleep(0.05)
            os._exit(0)
        n += 1
    except OSError:
        print("bomb stopped at", n, flush=True)
        break
while not os.path.exists("/workspace/release"):
    time.sleep(0.05)
"""], timeout=60, on_output=lambda stream, line: results.setdefault("capped", threading.Event()).set())

        thread = threading.Thread(target=run_bomb)
        results["capped"] = threading.Event()
        thread.start()
        assert results["capped"].wait(30), "the bomb never hit its limit"
        # The bomb's processes are all alive now; another sandbox of the same uid still forks.
        meanwhile = other.run("for i in 1 2 3 4 5 6 7 8; do sleep 0.1 & done; wait; echo forked fine", timeout=30)
        gate.write_text("go")
        thread.join(60)
    finally:
        gate_path = bomb.workspace / "release"
        if bomb.workspace.exists():
            gate_path.write_text("go")
        bomb.destroy()
        other.destroy()
    assert meanwhile.ok and meanwhile.stdout == "forked fine\n"
    assert "bomb stopped at" in results["bomb"].stdout
    assert int(results["bomb"].stdout.split()[3]) < 24
    assert wait_for_no_sandbox_processes() == []


def test_memory_bomb_is_killed_and_reported(hostile: Any) -> None:
    result = hostile.run(
        ["python3", "-c", "chunks = []\nwhile True: chunks.append(bytearray(8 << 20))"], timeout=60
    )
    assert result.exit_code != 0 and not result.timed_out
    # With a memory cgroup the kernel OOM-kills it; without one the address-space limit
    # turns the allocation into MemoryError. Either way it is named in the result.
    assert result.killed_by == "memory" or "MemoryError" in result.stderr, result
    if result.killed_by == "memory":
        assert result.exit_code == 137 and "out of memory" in result.stderr


def test_infinite_cpu_loop_is_killed_at_the_deadline(hostile: Any) -> None:
    result = hostile.run(["python3", "-c", "while True: pass"], timeout=2)
    assert result.timed_out and result.killed_by == "timeout" and result.exit_code is None
    assert "wall-clock timeout of 2s" in result.stderr


def test_a_gigabyte_on_stdout_is_drained_and_capped(hostile: Any) -> None:
    calls = []
    result = hostile.run(
        "yes | head -c 1000000000; echo finished >&2",
        timeout=120,
        max_output_bytes=65536,
        on_output=lambda stream, line: calls.append(stream),
    )
    assert result.exit_code == 0 and not result.timed_out
    assert result.truncated
    assert len(result.stdout) < 65536 + 200
    assert "bytes of stdout omitted" in result.stdout
    assert result.stderr == "finished\n"
    assert calls.count("stdout") <= 65536 // 2 + 1  # live lines stop at the cap too


def test_daemons_die_with_the_command(hostile: Any, settings: Any) -> None:
    result = hostile.run(
        "(setsid sleep 301 &); nohup sleep 302 >/dev/null 2>&1 & sleep 303 </dev/null >/dev/null 2>&1 & echo started",
        timeout=20,
    )
    # If a daemon kept the sandbox alive, the run would wait for it and time out.
    assert result.ok and not result.timed_out and result.stdout == "started\n"
    # Between commands nothing is left.
    assert wait_for_no_sandbox_processes() == []
    assert hostile.run("ps -e -o comm= | grep -c sleep || true", timeout=30).stdout == "0\n"


def test_proc_shows_only_the_sandbox(hostile: Any, settings: Any) -> None:
    host_pid = os.getpid()
    result = hostile.run(
        f"ls /proc | grep -E '^[0-9]+$' | wc -l; tr '\\0' '\\n' < /proc/1/cmdline | sed -n '1p;$p' | paste -sd' '; "
        f"test -e /proc/{host_pid} && echo SEES-HOST-PID-$((40+2)); ls /proc/1/root/; cat /proc/1/root/etc/shadow; "
        "echo 1 > /proc/sysrq-trigger; echo 0 > /proc/sys/kernel/randomize_va_space; "
        "cat /proc/self/mountinfo | grep -c ' /workspace '",
        timeout=30,
    )
    lines = result.stdout.splitlines()
    assert int(lines[0]) < 10  # only the sandbox's own few processes
    # pid 1 is the sandbox's own: the command's shell, never the host's.
    assert lines[1].startswith("/bin/sh ")
    assert "SEES-HOST-PID-42" not in result.stdout
    assert "workspace" in result.stdout and "work\n" not in result.stdout  # /proc/1/root is the sandbox root
    assert "/proc/1/root/etc/shadow: No such file or directory" in result.stderr  # the sandbox's own /etc
    assert "sysrq-trigger" in result.stderr and "randomize_va_space" in result.stderr
    assert Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0"


def test_a_process_a_command_leaves_behind_cannot_rewrite_the_verifiers_files_later(
    hostile: Any, settings: Any
) -> None:
    # Issue 20, 9(a): with the removed SANDBOX_LOCAL_INIT, a command could ptrace the sandbox's
    # long-lived init, neutralise its kills and leave a process that rewrote the verifier's files
    # after the command ended (a failing check reported PASSED). There is one way to run a
    # command now, whatever that old setting says: the command's own shell is pid 1 of a fresh
    # sandbox, and everything in it dies with it.
    settings.SANDBOX_LOCAL_INIT = True
    hostile.write_file("check.py", b"assert False\n")
    result = hostile.run(
        ["python3", "-c", """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
attached = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH to the sandbox's pid 1 (stops it if allowed)
print("attach", attached, ctypes.get_errno(), flush=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1.5)
        with open("/workspace/check.py", "w") as fh:
            fh.write("assert True\\n")
    os._exit(0)
print("left a writer behind", flush=True)
"""],
        timeout=30,
    )
    assert result.ok and "left a writer behind" in result.stdout, result
    assert "attach -1 1\n" in result.stdout  # EPERM: the seccomp filter refuses ptrace (9b)
    assert hostile.run("cat /proc/1/cmdline | tr '\\0' ' '", timeout=30).stdout.startswith("/bin/sh -c")
    time.sleep(2.5)
    assert hostile.read_file("check.py") == b"assert False\n"
    assert wait_for_no_sandbox_processes() == []


def test_dev_holds_nothing_and_dev_shm_is_capped(hostile: Any) -> None:
    # Issue 20, 9(c): /dev was a writable tmpfs without a size (only the memory cgroup bounded
    # it). It is read-only now (its device nodes still work); /dev/shm is the capped place.
    result = hostile.run(
        "head -c 1048576 /dev/zero > /dev/stash && echo STORED-IN-DEV; mkdir /dev/d && echo MADE-DIR; "
        # Files under the sandbox's 16 MiB file-size rlimit, until /dev/shm is full.
        "i=0; while head -c 15728640 /dev/zero > /dev/shm/f$i; do i=$((i+1)); done; "
        "echo shm full at $(cat /dev/shm/* | wc -c); rm -f /dev/shm/*; "
        "echo x > /dev/null && head -c 4 /dev/urandom | wc -c",
        timeout=60,
    )
    assert "STORED-IN-DEV" not in result.stdout and "MADE-DIR" not in result.stdout, result
    assert "/dev/stash: Read-only file system" in result.stderr, result
    assert f"shm full at {bwrap.SHM_BYTES}\n" in result.stdout and "No space left on device" in result.stderr, result
    assert result.stdout.endswith("4\n")


def _cmdlines_holding(secret: str) -> list[str]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except OSError:
                continue
            if secret.encode() in cmdline and entry.name != str(os.getpid()):
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_env_values_never_appear_in_a_command_line(settings: Any, sandbox_root_dir: Path) -> None:
    # Issue 20, 9(d): the spec's and each command's env travelled in bwrap's argv (--setenv),
    # readable by any host user in ps or /proc/<pid>/cmdline. Now bwrap reads them from an fd.
    spec_secret, command_secret = f"spec-{uuid.uuid4().hex}", f"cmd-{uuid.uuid4().hex}"
    backend = LocalBackend(records=False)
    with backend.create(SandboxSpec(env={"SPEC_TOKEN": spec_secret})) as sandbox:
        seen: dict[str, list[str]] = {}

        def on_output(stream: str, line: str) -> None:
            if line == "running":  # the command is running: look at every process on the host
                seen["cmdlines"] = _cmdlines_holding(spec_secret) + _cmdlines_holding(command_secret)
                (sandbox.workspace / "go").write_text("")

        result = sandbox.run('echo running; while [ ! -e go ]; do sleep 0.05; done; echo "$SPEC_TOKEN $CMD_TOKEN"',
                             timeout=30, env={"CMD_TOKEN": command_secret}, on_output=on_output)
        assert result.ok and result.stdout == f"running\n{spec_secret} {command_secret}\n", result
        assert seen["cmdlines"] == []

        command = sandbox.stdio_command(["sh", "-c", 'echo "$SPEC_TOKEN $CMD_TOKEN"; read line; echo "$line"'],
                                        lifetime=30, env={"CMD_TOKEN": command_secret})
        assert spec_secret not in " ".join(command.argv) and command_secret not in " ".join(command.argv)
        assert spec_secret not in str(command.env) and command_secret not in str(command.env)
        proc = subprocess.Popen(command.argv, env=command.env, cwd=command.cwd, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            first = proc.stdout.readline()
            running = _cmdlines_holding(spec_secret) + _cmdlines_holding(command_secret)
            out, err = proc.communicate(b"bye\n", timeout=30)
        finally:
            proc.kill()
            proc.wait()
        assert first.decode() == f"{spec_secret} {command_secret}\n", err
        assert out == b"bye\n" and running == []
        # What the stdio command's files held is readable by root alone.
        for path in sandbox.dir.glob("stdio-*"):
            assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_uid == os.getuid()
    assert wait_for_no_sandbox_processes() == []
