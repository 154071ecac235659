"""The local backend: bubblewrap sandboxes on this machine, the platform's default.

A sandbox is a directory `SANDBOX_ROOT/<id>/` holding `meta.json` (root-only) and
`workspace/` (owned by the sandbox user), plus, where the host allows it, a cgroup per
controller. Nothing runs between commands: each `run` starts one fresh bubblewrap over the
workspace and everything it started is gone when it returns (its cost: docs/benchmarks.md).

The bubblewrap is built by `bwrap.py` (read its docstring for the exact chain): as `nobody`
(setpriv), every namespace unshared and a minimal read-only root with an /etc of its own
(etc.py, `SANDBOX_ROOT/etc-<digest>/`), born inside the sandbox's cgroups; each command's
rlimits are set by its own /bin/sh.

When bubblewrap or user namespaces are unavailable `create` refuses with
SandboxUnavailable, unless SANDBOX_ALLOW_UNISOLATED is set: then commands run as plain
processes (still as `nobody` with rlimits when we are root) and every sandbox records the
downgrade.
"""
from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.engines.sandboxes import bwrap, cgroups, seccomp
from apps.engines.sandboxes.etc import sandbox_etc
from apps.engines.sandboxes.pump import CommandPipes, pump_in_thread
from apps.engines.sandboxes.base import (
    PLATFORM_MCP_BUILTIN_PATH,
    PLATFORM_MCP_PATH,
    PLATFORM_MCP_PROFILE,
    PLATFORM_PYTHON_PATH,
    PLATFORM_PYTHON_PROFILE,
    WORKDIR,
    ExecResult,
    OutputCallback,
    OutputCollector,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxFileNotFound,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxSpecUnsupported,
    SandboxUnavailable,
    StdioCommand,
    logger,
)
from apps.engines.sandboxes.bwrap import (
    HOST_PATH,
    JOIN_FAILED_EXIT,
    LIMITS_FAILED_MARK,
    HostSupport,
    Outcome,
    RawSink,
    RunLimits,
    Running,
    shell_argv,
    stderr_starts,
    wrap_argv,
)

SANDBOX_ID_RE = re.compile(r"^lsb-[0-9a-f]{16}$")
# Local "images": named runtime profiles. All use the host's Debian /usr (python3 3.11).
# PLATFORM_PYTHON_PROFILE adds the platform's Python packages (read-only, on PYTHONPATH);
# PLATFORM_MCP_PROFILE those and the bundled MCP servers' packages (SANDBOX_MCP_PACKAGES).
PROFILES = ("default", "debian", "python", "python3", PLATFORM_PYTHON_PROFILE, PLATFORM_MCP_PROFILE)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# The platform's own MCP servers, which PLATFORM_MCP_PROFILE binds read-only (their source, no copy).
MCP_BUILTIN_SERVERS = str(Path(__file__).resolve().parents[1] / "scenes" / "toucan" / "servers")
FILE_OP_TIMEOUT = 120.0
# After a kill, how long we keep reading for the pipes to close before giving up on them.
DRAIN_AFTER_KILL = 5.0
# Commands of this process's sandboxes that may be starting (Popen, up to bubblewrap's exec) at
# once; the rest wait their turn. Starting is CPU work of this process under its GIL: 128
# rollouts whose model turns end together would otherwise start 128 commands at once, each
# waiting for the others (measured: fewer at once, each done sooner). Running is not limited.
_STARTING = threading.BoundedSemaphore(max(2, 2 * (os.cpu_count() or 1)))
EXIT_NOT_FOUND = 44
# A stdio command's first process: opens its environment and seccomp files as fds 3 and 4,
# which its bwrap reads (see `_stdio_command`), then execs the rest of its argv.
_OPEN_FDS_SCRIPT = f'exec 3<"$1" 4<"$2" || exit {JOIN_FAILED_EXIT}; shift 2; exec "$@"'
EXIT_IS_DIR = 45


def _now() -> datetime:
    return datetime.now(dt_timezone.utc)


@dataclass
class _Launch:
    """One command ready to start in a fresh bubblewrap (`LocalSandbox._launch`, `_execute`).

    `fds`: what bwrap reads (its --info-fd pipe's write end, the environment and seccomp
    memfds; none unisolated), passed to it and closed here once it started; `info_r`: the info
    pipe's read end (-1 unisolated), which becomes the Running's. `threaded`: started from the
    sandbox's CgroupThread (born in its cgroups) rather than by a shell that joins them.
    `oom_before`: the memory cgroup's OOM kills so far (None without cgroups).
    """

    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdin: bool
    fds: tuple[int, ...] = ()
    info_r: int = -1
    use_cgroup: bool = False
    threaded: bool = False
    oom_before: int | None = None

    def spawn(self) -> tuple[subprocess.Popen, float]:
        """Start it on the calling thread (the CgroupThread when `threaded`): (the process, the
        time.monotonic() it started at). Takes its turn in _STARTING first; the command's time
        starts once its turn came, so waiting for it does not eat the command's timeout."""
        with _STARTING:
            started = time.monotonic()
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
                pass_fds=self.fds,
            )
        return proc, started

    def spawned(self) -> None:
        """It started: bwrap has its copies of `fds`; ours go."""
        fds, self.fds = self.fds, ()
        for fd in fds:
            os.close(fd)

    def close(self) -> None:
        """It never started: close `fds` and the info pipe's read end."""
        self.spawned()
        if self.info_r >= 0:
            os.close(self.info_r)
            self.info_r = -1


# --- the sandbox -------------------------------------------------------------------------------


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox: a workspace directory on this host, plus its cgroups."""

    backend: "LocalBackend"

    def __init__(self, backend: "LocalBackend", sandbox_id: str, spec: SandboxSpec, labels: dict[str, str], *,
                 meta: dict[str, Any]):
        super().__init__(
            backend, sandbox_id, spec, labels,
            created_at=_parse_time(meta.get("created_at")),
            expires_at=_parse_time(meta.get("expires_at")),
            downgrades=meta.get("downgrades", []),
        )
        self.meta = meta
        self.dir = backend.root / sandbox_id
        self.workspace = self.dir / "workspace"
        self.cgroup = cgroups.SandboxCgroup.from_json(meta.get("cgroup"))
        self.isolated = bool(meta.get("isolated", True))
        self._procs: set[Running] = set()
        self._procs_lock = threading.Lock()
        self._destroying = False
        self._thread_failed = False
        self._spawner: cgroups.CgroupThread | None = None

    # -- limits and argv -----------------------------------------------------------------

    def _limits(self, timeout: float) -> RunLimits:
        spec = self.spec
        memory = spec.memory_mb << 20
        # With a memory cgroup the real limit is the cgroup's; the address-space rlimit is
        # only a backstop, generous because runtimes (V8, the JVM, Go) reserve far more
        # virtual memory than they use.
        address_space: int | None = memory * 8 if "memory" in self.cgroup.paths else memory
        if spec.address_space_mb:
            address_space = spec.address_space_mb << 20
        elif spec.address_space_mb is None and "memory" in self.cgroup.paths:
            address_space = None  # _create refused None without a memory cgroup
        cpu_seconds = int(math.ceil(timeout * max(1.0, spec.cpu))) + 1
        return RunLimits(
            address_space=address_space,
            cpu_seconds=cpu_seconds,
            file_size=spec.max_file_mb << 20,
            open_files=spec.open_files,
            processes=spec.pids,
        )

    def _env(self, env: dict[str, str]) -> dict[str, str]:
        home = WORKDIR if self.isolated else str(self.workspace)
        base = {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "TMPDIR": "/tmp", "USER": "sandbox"}
        if self.spec.image == PLATFORM_PYTHON_PROFILE:
            base["PYTHONPATH"] = PLATFORM_PYTHON_PATH if self.isolated else platform_python_packages()
        elif self.spec.image == PLATFORM_MCP_PROFILE:
            paths = ((PLATFORM_PYTHON_PATH, PLATFORM_MCP_PATH, PLATFORM_MCP_BUILTIN_PATH) if self.isolated
                     else (platform_python_packages(), platform_mcp_packages(), MCP_BUILTIN_SERVERS))
            base["PYTHONPATH"] = f"{paths[0]}:{paths[1]}/python:{paths[2]}"
        return {**base, **env}

    def _ro_binds(self) -> tuple[tuple[str, str], ...]:
        if self.spec.image == PLATFORM_PYTHON_PROFILE:
            return ((platform_python_packages(), PLATFORM_PYTHON_PATH),)
        if self.spec.image == PLATFORM_MCP_PROFILE:
            return ((platform_python_packages(), PLATFORM_PYTHON_PATH), (platform_mcp_packages(), PLATFORM_MCP_PATH),
                    (MCP_BUILTIN_SERVERS, PLATFORM_MCP_BUILTIN_PATH))
        return ()

    def _host_cwd(self, cwd: str) -> str:
        """Unisolated mode only: the in-sandbox path /workspace/x is workspace/x on the host."""
        if cwd == WORKDIR or cwd.startswith(WORKDIR + "/"):
            return str(self.workspace) + cwd[len(WORKDIR):]
        return cwd

    def _gone(self) -> bool:
        # destroy() renames meta.json away before it kills anything, so this is already true
        # while the sandbox is being torn down.
        return self.destroyed or self._destroying or not (self.dir / "meta.json").exists()

    def _cgroup_thread(self) -> cgroups.CgroupThread:
        if self._spawner is None:
            host = self.backend.host()
            prepare = None
            if bwrap.thread_privileges_droppable(host):

                def prepare() -> None:
                    bwrap.prepare_spawner_thread(host)

            self._spawner = cgroups.CgroupThread(self.cgroup, name=f"sandbox-cgroup-{self.id}", prepare=prepare)
        return self._spawner

    def _release_cgroups(self) -> None:
        """Take our thread out of the sandbox's cgroups (they cannot be removed while it is in)."""
        if self._spawner is not None:
            self._spawner.stop()

    def _check_alive(self) -> None:
        if self._gone():
            self._release_cgroups()
            raise SandboxNotFound(f"local sandbox {self.id} does not exist (destroyed?)")

    # -- running -----------------------------------------------------------------------------

    def _execute(
        self,
        command: str | list[str],
        *,
        timeout: float,
        cwd: str,
        env: dict[str, str],
        sink: Any,
        stdin_data: bytes | None = None,
    ) -> Outcome:
        """Run one command in a fresh bubblewrap (unisolated: a plain process), pump its output
        into `sink`, enforce the deadline. Blocks the calling thread (`arun` runs it in a worker thread)."""
        self._check_alive()
        launch = self._launch(command, timeout=timeout, cwd=cwd, env=env, stdin=stdin_data is not None)
        if isinstance(launch, Outcome):
            return launch
        try:
            if launch.threaded:
                try:
                    proc, started = self._cgroup_thread().call(launch.spawn)
                except cgroups.CgroupJoinError as exc:
                    launch.close()
                    self._cgroup_thread_failed(exc)
                    launch = self._launch(command, timeout=timeout, cwd=cwd, env=env, stdin=stdin_data is not None)
                    assert isinstance(launch, _Launch) and not launch.threaded
                    proc, started = launch.spawn()
            else:
                proc, started = launch.spawn()
        except OSError as exc:
            launch.close()
            raise SandboxError(f"could not start a command in sandbox {self.id}: {exc}") from exc
        launch.spawned()
        running = Running(proc, launch.info_r)
        with self._procs_lock:
            self._procs.add(running)
        try:
            timed_out = pump_in_thread(CommandPipes(running, sink, stdin_data, label=f"sandbox {self.id}"),
                                       started + timeout, DRAIN_AFTER_KILL)
            exit_code = proc.wait()
        finally:
            running.close_info()
            with self._procs_lock:
                self._procs.discard(running)
            if proc.poll() is None:
                running.kill()
                try:
                    proc.wait(timeout=DRAIN_AFTER_KILL)
                except subprocess.TimeoutExpired:
                    running.kill_monitor()
                    proc.wait()
        join_failed = launch.use_cgroup and not launch.threaded and running.child_pid is None
        return self._outcome(exit_code, timed_out, started, sink, launch.oom_before, join_failed)

    def _launch(self, command: str | list[str], *, timeout: float, cwd: str, env: dict[str, str],
                stdin: bool) -> "_Launch | Outcome":
        """A command of a fresh bubblewrap (or, unisolated, a plain process), ready to start: its
        argv, environment, info pipe, and whether the sandbox's CgroupThread starts it. An
        Outcome instead when it cannot run at all (an unisolated cwd that does not exist)."""
        host = self.backend.host()
        limits = self._limits(timeout)
        use_cgroup = self.isolated and bool(self.cgroup.paths)
        threaded = use_cgroup and self.cgroup.thread_capable and not self._thread_failed
        if not self.isolated:
            popen_cwd = self._host_cwd(cwd)
            if not os.path.isdir(popen_cwd):
                return Outcome(exit_code=1, timed_out=False, duration_ms=0, note=f"cwd {cwd} does not exist")
            return _Launch(argv=wrap_argv(host, workspace=None, cwd=cwd) + shell_argv(command, limits),
                           env={"PATH": SANDBOX_PATH, **self._env(env)}, cwd=popen_cwd, stdin=stdin)
        # join: a root shell joins the cgroups first. Started from the sandbox's CgroupThread,
        # which may have dropped privileges itself: then no setpriv, and its network is ready.
        procs = [str(Path(d) / "cgroup.procs") for d in self.cgroup.directories] if use_cgroup and not threaded else None
        dropped = threaded and self._cgroup_thread().prepare is not None
        etc = self.backend.etc_dir(host)
        fds = bwrap.command_fds(self._env(env))
        try:
            info_r, info_w = os.pipe()
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        os.set_blocking(info_r, False)  # read on demand (Running.read_info)
        argv = wrap_argv(host, workspace=str(self.workspace), cwd=cwd, fds=fds, info_fd=info_w,
                         cgroup_procs=procs, tmp_bytes=self.spec.memory_mb << 20, ro_binds=self._ro_binds(),
                         from_spawner=dropped, etc=etc)
        return _Launch(argv=argv + shell_argv(command, limits), env={"PATH": HOST_PATH, "LANG": "C.UTF-8"}, cwd="/",
                       stdin=stdin, fds=(*fds, info_w), info_r=info_r, use_cgroup=use_cgroup, threaded=threaded,
                       oom_before=self.cgroup.oom_kills() if use_cgroup else None)

    def _cgroup_thread_failed(self, exc: cgroups.CgroupJoinError) -> None:
        """The spawner thread could not join the cgroups: this handle joins per command from now on."""
        logger.warning("sandbox %s: cgroup thread unavailable (%s); joining per command", self.id, exc)
        self._thread_failed = True

    def _outcome(self, exit_code: int, timed_out: bool, started: float, sink: Any, oom_before: int | None,
                 join_failed: bool = False) -> Outcome:
        duration_ms = int((time.monotonic() - started) * 1000)
        oom = (self.cgroup.oom_kills() - oom_before) if oom_before is not None else 0
        if timed_out:
            return Outcome(exit_code=None, timed_out=True, duration_ms=duration_ms, oom_kills=oom)
        if exit_code == JOIN_FAILED_EXIT and (join_failed or stderr_starts(sink, LIMITS_FAILED_MARK)):
            # Never run a command without the limits the sandbox promises: it did not run.
            self._check_alive()
            raise SandboxError(
                f"sandbox {self.id}: could not apply the sandbox's cgroups or rlimits; the command did not run"
            )
        # 128+N is how bwrap and sh report "killed by signal N"; keep that shape everywhere.
        code = 128 - exit_code if exit_code < 0 else exit_code
        return Outcome(exit_code=code, timed_out=False, duration_ms=duration_ms, oom_kills=oom)

    def start_in_background(self) -> None:
        """Get ready for the first command now rather than when it comes (the caller does other
        things meanwhile: an agent waits for the model's first turn); a command that comes sooner
        waits for what is still starting.

        That is the sandbox's spawner thread: its join of the cgroups (an RCU grace period), its
        credentials and its network namespace. A worker whose episodes all start together would
        otherwise pay them in the burst of everyone's first command."""
        if self.isolated and self.cgroup.paths and self.cgroup.thread_capable and not self._thread_failed:
            self._cgroup_thread().start()

    def _stdio_command(self, argv: list[str], *, lifetime: float, cwd: str, env: dict[str, str]) -> StdioCommand:
        # The same chain as `_execute` (cgroup join, nobody, bwrap, the limits shell), started by
        # the caller's process API: the process joins the cgroups itself (no spawner thread),
        # dies with its parent (--die-with-parent) and is killed by destroy (cgroup or workspace).
        # That API cannot pass fds: the environment and the seccomp filter go into root-only
        # files of the sandbox's directory, which a first shell opens as fds 3 and 4 for bwrap.
        self._check_alive()
        host = self.backend.host()
        limits = self._limits(lifetime)
        if self.isolated:
            procs = [str(Path(d) / "cgroup.procs") for d in self.cgroup.directories] if self.cgroup.paths else None
            etc = self.backend.etc_dir(host)
            files = []
            for suffix, data in (("env", bwrap.setenv_args(self._env(env))), ("seccomp", seccomp.program())):
                path = self.dir / f"stdio-{secrets.token_hex(8)}.{suffix}"
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
                    fh.write(data)
                files.append(str(path))
            head = wrap_argv(host, workspace=str(self.workspace), cwd=cwd, fds=(3, 4), cgroup_procs=procs,
                             tmp_bytes=self.spec.memory_mb << 20, ro_binds=self._ro_binds(), etc=etc)
            return StdioCommand(argv=["/bin/sh", "-c", _OPEN_FDS_SCRIPT, "fds", *files] + head + shell_argv(argv, limits),
                                env={"PATH": HOST_PATH, "LANG": "C.UTF-8"}, cwd="/")
        head = wrap_argv(host, workspace=None, cwd=cwd)
        return StdioCommand(argv=head + shell_argv(argv, limits), env={"PATH": SANDBOX_PATH, **self._env(env)},
                            cwd=self._host_cwd(cwd))

    def destroy(self, *, record: bool = True) -> None:
        self._run_cleanups()
        if not self.destroyed:
            self._destroying = True
            self.kill_running()
            self._release_cgroups()
        super().destroy(record=record)

    def kill_running(self) -> None:
        """Kill the commands this handle has running (used by destroy)."""
        with self._procs_lock:
            running = list(self._procs)
        for item in running:
            item.kill()

    def _run(
        self,
        command: str | list[str],
        *,
        timeout: float,
        cwd: str,
        env: dict[str, str],
        on_output: OutputCallback | None,
        max_output_bytes: int,
    ) -> ExecResult:
        collector = OutputCollector(max_output_bytes, on_output)
        outcome = self._execute(command, timeout=timeout, cwd=cwd, env=env, sink=collector)
        return self._result(collector, outcome, timeout)

    def _result(self, collector: OutputCollector, outcome: Outcome, timeout: float) -> ExecResult:
        """The ExecResult of a finished command: its output, and what ended it if not itself."""
        collector.close()
        killed_by: str | None = None
        note = outcome.note
        if outcome.timed_out:
            killed_by = "timeout"
            note = f"[sandbox] killed: wall-clock timeout of {timeout:g}s"
        elif outcome.oom_kills:
            killed_by = "memory"
            note = f"[sandbox] out of memory: the kernel killed a process at the {self.spec.memory_mb} MiB limit"
        elif outcome.exit_code == 128 + signal.SIGXCPU:
            killed_by = "cpu"
            note = "[sandbox] killed: CPU time limit reached"
        elif outcome.exit_code == 128 + signal.SIGKILL and self._gone():
            killed_by = "destroyed"
            note = "[sandbox] killed: the sandbox was destroyed"
        return collector.result(
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            duration_ms=outcome.duration_ms,
            killed_by=killed_by,
            extra_stderr=note,
        )

    # -- files -------------------------------------------------------------------------------------

    def _file_op(self, script: str, args: list[str], stdin_data: bytes | None = None) -> tuple[int | None, RawSink]:
        sink = RawSink()
        outcome = self._execute(["/bin/sh", "-c", script, "sh", *args], timeout=FILE_OP_TIMEOUT, cwd=WORKDIR,
                                env={}, sink=sink, stdin_data=stdin_data)
        if outcome.timed_out:
            raise SandboxError(f"file operation in sandbox {self.id} timed out after {FILE_OP_TIMEOUT:g}s")
        return outcome.exit_code, sink

    def _in_sandbox(self, path: str) -> str:
        return path if self.isolated else self._host_cwd(path)

    def _write_file(self, path: str, data: bytes, mode: int) -> None:
        # Written by a process inside the sandbox, as the sandbox user: a symlink the sandboxed
        # code planted resolves inside the sandbox's view, never to a host file.
        if not (path == WORKDIR or path.startswith(WORKDIR + "/")):
            raise SandboxError(
                f"cannot write {path}: local sandboxes keep files only under {WORKDIR} "
                "(the rest of the file system is read-only or fresh on every command)"
            )
        code, sink = self._file_op(
            'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" -- "$1"',
            [self._in_sandbox(path), format(mode, "o")],
            stdin_data=data,
        )
        if code != 0:
            raise SandboxError(f"writing {path} failed: {sink.stderr.decode(errors='replace').strip() or f'exit {code}'}")

    def _read_file(self, path: str, max_bytes: int | None) -> bytes:
        reader = 'exec cat -- "$1"' if max_bytes is None else f'exec head -c {int(max_bytes)} -- "$1"'
        code, sink = self._file_op(
            f'[ -e "$1" ] || exit {EXIT_NOT_FOUND}; [ -d "$1" ] && exit {EXIT_IS_DIR}; {reader}',
            [self._in_sandbox(path)],
        )
        if code == EXIT_NOT_FOUND:
            raise SandboxFileNotFound(f"{path}: no such file in sandbox {self.id}")
        if code == EXIT_IS_DIR:
            raise SandboxError(f"{path} is a directory")
        if code != 0:
            raise SandboxError(f"reading {path} failed: {sink.stderr.decode(errors='replace').strip() or f'exit {code}'}")
        return bytes(sink.stdout)

    def _relabel(self, labels: dict[str, str], expires_at: datetime | None, env: dict[str, str]) -> None:
        super()._relabel(labels, expires_at, env)
        self.meta.update(labels=dict(labels), env=dict(env), expires_at=_format_time(expires_at))
        self.backend._write_meta(self.dir, self.meta)


# --- the backend ---------------------------------------------------------------------------------


def platform_python_packages() -> str:
    """The host directory of the platform's Python packages (SANDBOX_PYTHON_PACKAGES, else ours)."""
    return getattr(settings, "SANDBOX_PYTHON_PACKAGES", "") or sysconfig.get_paths()["purelib"]


def platform_mcp_packages() -> str:
    """The host directory of the bundled MCP servers (SANDBOX_MCP_PACKAGES, else the virtualenv's
    mcp-packages, where `make install` puts them: python/ and, with npm, node/node_modules)."""
    path = getattr(settings, "SANDBOX_MCP_PACKAGES", "") or os.path.join(sys.prefix, "mcp-packages")
    if not os.path.isdir(os.path.join(path, "python")):
        raise SandboxUnavailable(f"the sandbox profile {PLATFORM_MCP_PROFILE!r} needs the bundled MCP servers' packages "
                                 f"in {path} (SANDBOX_MCP_PACKAGES): run `make install`")
    return path


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None


def _format_time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class LocalBackend(SandboxBackend):
    """Bubblewrap sandboxes under SANDBOX_ROOT on this machine."""

    name = "local"

    def __init__(self, *, records: bool = True, root: str | os.PathLike | None = None,
                 allow_unisolated: bool | None = None):
        super().__init__(records=records)
        self._root = Path(root) if root is not None else None
        self._allow_unisolated = allow_unisolated

    @property
    def root(self) -> Path:
        return self._root if self._root is not None else Path(settings.SANDBOX_ROOT)

    @property
    def allow_unisolated(self) -> bool:
        if self._allow_unisolated is not None:
            return self._allow_unisolated
        return bool(getattr(settings, "SANDBOX_ALLOW_UNISOLATED", False))

    def host(self) -> HostSupport:
        return bwrap.host_support()

    def etc_dir(self, host: HostSupport) -> str:
        """The sandbox's own /etc (etc.py), under SANDBOX_ROOT; built once per process and root."""
        try:
            return str(sandbox_etc(self.root, host.uid, host.gid))
        except OSError as exc:
            raise SandboxUnavailable(f"cannot build the sandbox's /etc under SANDBOX_ROOT {self.root}: {exc}") from exc

    def check(self) -> list[str]:
        problems = []
        host = self.host()
        if not host.isolated:
            problems.append(f"no isolation: {host.reason}" + ("" if self.allow_unisolated else " (create will refuse)"))
        cg = cgroups.support()
        problems += [f"{c}: {why}" for c, why in cg.problems.items()]
        try:
            self._ensure_root(host)
            if host.isolated:
                self.etc_dir(host)
        except SandboxError as exc:
            problems.append(str(exc))
        return problems

    # -- helpers ---------------------------------------------------------------------------------

    def _ensure_root(self, host: HostSupport) -> Path:
        root = self.root
        try:
            root.mkdir(mode=0o711, parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot create SANDBOX_ROOT {root}: {exc.strerror or exc}") from exc
        if host.drop_privileges:
            # bwrap runs as the sandbox user and must be able to reach the workspace.
            for part in [root, *root.parents]:
                st = part.stat()
                if st.st_uid == host.uid:
                    ok = st.st_mode & stat.S_IXUSR
                elif st.st_gid == host.gid:
                    ok = st.st_mode & stat.S_IXGRP
                else:
                    ok = st.st_mode & stat.S_IXOTH
                if not ok:
                    raise SandboxUnavailable(
                        f"SANDBOX_ROOT {root}: the sandbox user (uid {host.uid}) cannot enter {part} "
                        f"(mode {stat.S_IMODE(st.st_mode):o}); use a path whose parents are world-searchable, "
                        "e.g. /var/tmp/trajplatform-sandboxes"
                    )
        return root

    def _write_meta(self, directory: Path, meta: dict[str, Any]) -> None:
        tmp = directory / f".meta.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(meta, fh)
        os.replace(tmp, directory / "meta.json")

    def _read_meta(self, sandbox_id: str) -> dict[str, Any]:
        if not SANDBOX_ID_RE.match(sandbox_id):
            raise SandboxNotFound(f"no local sandbox {sandbox_id!r} (not a local sandbox id)")
        try:
            return json.loads((self.root / sandbox_id / "meta.json").read_text())
        except FileNotFoundError:
            raise SandboxNotFound(f"no local sandbox {sandbox_id} under {self.root}") from None
        except (OSError, ValueError) as exc:
            raise SandboxNotFound(f"local sandbox {sandbox_id} is unreadable: {exc}") from None

    def _sandbox_from_meta(self, meta: dict[str, Any]) -> LocalSandbox:
        spec_data = meta.get("spec", {})
        spec = SandboxSpec(
            image=meta.get("image") or None,
            env=meta.get("env", {}),
            cpu=spec_data.get("cpu", 1.0),
            memory_mb=spec_data.get("memory_mb", 1024),
            pids=spec_data.get("pids", 256),
            max_file_mb=spec_data.get("max_file_mb", 512),
            open_files=spec_data.get("open_files", 1024),
            network="none",
            ttl=timedelta(seconds=spec_data["ttl_s"]) if spec_data.get("ttl_s") else None,
            address_space_mb=spec_data.get("address_space_mb", 0),
            labels={k: v for k, v in meta.get("labels", {}).items() if not k.startswith("trajplatform.io/")},
        )
        return LocalSandbox(self, meta["id"], spec, meta.get("labels", {}), meta=meta)

    # -- hooks -------------------------------------------------------------------------------------

    def _create(self, spec: SandboxSpec, labels: dict[str, str]) -> LocalSandbox:
        if spec.entrypoint is not None:
            raise SandboxSpecUnsupported(
                f"the local backend runs commands in a sandbox, not an image's entrypoint {list(spec.entrypoint)!r}; "
                "use the opensandbox backend")
        if spec.network != "none":
            raise SandboxSpecUnsupported(
                f"the local backend supports only network='none' (got {spec.network!r}): sharing the host "
                "network would expose every service on its loopback; use the opensandbox backend for egress"
            )
        host = self.host()
        downgrades: list[str] = []
        if not host.isolated:
            if host.drop_privileges and not host.setpriv:
                raise SandboxUnavailable(
                    f"local sandboxes are unavailable: {host.reason}; without setpriv commands would run as root, "
                    "which is refused even with SANDBOX_ALLOW_UNISOLATED"
                )
            if not self.allow_unisolated:
                raise SandboxUnavailable(
                    f"local sandboxes need bubblewrap and user namespaces: {host.reason}. Install bubblewrap "
                    "(apt-get install bubblewrap) and allow unprivileged user namespaces, or set "
                    "SANDBOX_ALLOW_UNISOLATED=1 to run agent commands WITHOUT isolation (development only)."
                )
            downgrades.append(
                f"UNISOLATED: {host.reason}; commands run as plain host processes"
                + (f" (uid {host.uid}, rlimits only)" if host.drop_privileges else " as the worker's own user")
            )
        if not host.drop_privileges:
            downgrades.append(f"not started as root: commands run as the worker's uid {host.uid}, not a dedicated user")
        image = spec.image or "default"
        if image not in PROFILES:
            downgrades.append(
                f"image {image!r} is not available locally; using the host's /usr (profile 'default', "
                f"profiles: {', '.join(PROFILES)})"
            )
        root = self._ensure_root(host)
        if host.isolated:
            self.etc_dir(host)  # built now: a failure refuses the sandbox, not its first command
        sandbox_id = f"lsb-{secrets.token_hex(8)}"
        directory = root / sandbox_id
        directory.mkdir(mode=0o711)
        cgroup = cgroups.SandboxCgroup({}, {})
        try:
            workspace = directory / "workspace"
            workspace.mkdir(mode=0o700)
            os.chown(workspace, host.uid, host.gid)
            if host.isolated:
                cg = cgroups.support()
                if cg.enforced:
                    cgroup = cgroups.SandboxCgroup.create(
                        cg, sandbox_id, memory_bytes=spec.memory_mb << 20, pids=spec.pids, cpu=spec.cpu
                    )
                for controller, why in cg.problems.items():
                    fallback = {
                        "memory": f"per-process address-space rlimit of {spec.memory_mb} MiB and a /tmp of the same size",
                        "pids": f"RLIMIT_NPROC={spec.pids}, counted per sandbox (user namespace)",
                        "cpu": "no CPU share limit; CPU time is capped per command (RLIMIT_CPU)",
                    }[controller]
                    downgrades.append(f"no {controller} cgroup ({why}); fallback: {fallback}")
            else:
                downgrades.append(f"no cgroups: RLIMIT_NPROC={spec.pids} is shared by every process of uid {host.uid}")
            if spec.address_space_mb is None and "memory" not in cgroup.paths:
                raise SandboxSpecUnsupported(
                    "the sandbox asks for no address-space limit (a browser reserves ~88 GiB), which the local "
                    "backend gives only where a memory cgroup bounds the sandbox; this host has none, so the "
                    "sandbox is refused rather than run unbounded"
                )
            now = _now()
            meta = {
                "id": sandbox_id,
                "created_at": now.isoformat(),
                "expires_at": _format_time(now + spec.ttl) if spec.ttl else None,
                "labels": labels,
                "env": spec.env,
                "image": spec.image or "",
                "spec": spec.limits(),
                "uid": host.uid,
                "gid": host.gid,
                "isolated": host.isolated,
                "cgroup": cgroup.to_json(),
                "downgrades": downgrades,
                "host": socket.gethostname(),
            }
            self._write_meta(directory, meta)
        except BaseException:
            cgroup.remove(timeout=0.5)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        sandbox = self._sandbox_from_meta(meta)
        sandbox.start_in_background()
        return sandbox

    def _get(self, sandbox_id: str) -> LocalSandbox:
        return self._sandbox_from_meta(self._read_meta(sandbox_id))

    def _list(self, labels: dict[str, str]) -> list[SandboxInfo]:
        infos = []
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        for name in entries:
            if not SANDBOX_ID_RE.match(name):
                continue
            try:
                meta = self._read_meta(name)
            except SandboxNotFound:
                continue
            infos.append(
                SandboxInfo(
                    id=name,
                    backend=self.name,
                    labels=meta.get("labels", {}),
                    state="running",
                    created_at=_parse_time(meta.get("created_at")),
                    expires_at=_parse_time(meta.get("expires_at")),
                    image=meta.get("image", ""),
                )
            )
        return infos

    def _destroy(self, sandbox_id: str) -> bool:
        if not SANDBOX_ID_RE.match(sandbox_id):
            return False
        directory = self.root / sandbox_id
        if not directory.exists():
            return False
        # First make it invisible to get/list/run (and say why commands die), then kill.
        try:
            os.replace(directory / "meta.json", directory / "meta.destroying")
        except FileNotFoundError:
            pass  # a destroy that crashed half-way; finish it
        try:
            meta = json.loads((directory / "meta.destroying").read_text())
        except (OSError, ValueError):
            meta = {}
        workspace = directory / "workspace"
        cgroup = cgroups.SandboxCgroup.from_json(meta.get("cgroup"))
        # Only the sandbox user's processes: a worker's cgroup thread shows up here too.
        uid = meta.get("uid") if isinstance(meta.get("uid"), int) else None
        if cgroup.paths:
            cgroup.kill(uid)
        if not cgroup.thread_capable:
            # Without cgroups, or when a root shell joins them per command (which the uid
            # filter spares for its first milliseconds), find the sandbox's bwrap by its bind.
            _kill_processes_using(str(workspace))
        left = cgroup.remove(uid=uid)
        if left:
            logger.warning("sandbox %s: cgroups left behind: %s", sandbox_id, "; ".join(left))
        for attempt in range(3):
            try:
                shutil.rmtree(directory)
                break
            except FileNotFoundError:
                break
            except OSError:
                # Something was still writing; kill again and retry.
                cgroup.kill(uid)
                if not cgroup.thread_capable:
                    _kill_processes_using(str(workspace))
                time.sleep(0.05)
        else:
            shutil.rmtree(directory, ignore_errors=True)
        return True


def _kill_processes_using(workspace: str) -> int:
    """SIGKILL every bwrap whose command line binds `workspace`, and every process whose cwd is
    inside it (unisolated mode). Returns how many were signalled.

    Killing a sandbox's bwrap monitor ends the sandbox (--die-with-parent + PID namespace);
    this is how a sandbox without cgroups is emptied from another process or after a crash.
    """
    killed = 0
    needle = workspace.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        hit = bool(args) and os.path.basename(args[0]) == b"bwrap" and needle in args
        if not hit:
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                hit = cwd == workspace or cwd.startswith(workspace + "/")
            except OSError:
                pass
        if not hit:
            continue
        # Kill the sandbox's pid 1 (the monitor's child) so the monitor reaps it; the monitor
        # itself only when it has no child yet (see Running.kill).
        targets = [pid]
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children and os.path.basename(args[0]) == b"bwrap":
                targets = [int(c) for c in children]
        except (OSError, ValueError):
            pass
        for target in targets:
            try:
                os.kill(target, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed
