"""How the local backend starts one command: host probing, the argv, the process plumbing.

One command is, from the outside in:

    [cgroups] started from a worker thread parked in the sandbox's cgroups (cgroup v1,
        `cgroups.CgroupThread`), so every process is born inside them; elsewhere a root
        `/bin/sh -c 'echo $$ > .../cgroup.procs; exec "$@"'` joins them first
    setpriv --reuid nobody --regid nogroup --clear-groups --no-new-privs   (when we are root;
        not needed from a CgroupThread, which dropped to exactly that itself: see
        `drop_thread_privileges`)
      bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session
            (from a CgroupThread also --share-net: the thread made the sandbox's network
            namespace, loopback only, before it dropped its privileges; see
            `enter_private_network`)
            --as-pid-1  (the monitor reaps pid 1 itself: no orphaned init, no zombie build-up)
            minimal read-only root: /usr bound read-only, the sandbox's own /etc (etc.py: a
            few files built once, never the host's) bound read-only, /bin /lib /lib64 /sbin
            symlinks, fresh /proc, a fresh /dev remounted read-only (its device nodes still
            work), size-capped tmpfs /tmp and /dev/shm, the workspace bound read-write at
            /workspace, `/` remounted read-only; --clearenv
            --args FD: the environment (--setenv pairs) read from a memfd, never in an argv
                that any host user can read in /proc/<pid>/cmdline
            --seccomp FD: the filter of seccomp.py, applied last, right before the exec
            --info-fd: tells us the sandbox's pid 1, which is what we kill on timeout
        /bin/sh -c 'ulimit -t -v -f -n -p -c ...; <command>'   (pid 1 of the sandbox: sets
            the rlimits with builtins inside the new user namespace, where RLIMIT_NPROC counts
            this sandbox's processes only, then runs the command as its child and reaps)

Privileges are dropped with `setpriv` rather than Popen(user=...): the latter forces a
fork() of the whole worker (costly for a worker holding a model), setpriv keeps the
vfork/posix_spawn path. A CgroupThread drops its own credentials instead (Linux keeps them per
thread; raw syscalls, not libc's process-wide setuid), so what it starts is born as `nobody`
with no_new_privs, and the setpriv exec per command is saved. Before that
the thread gives itself a network namespace of its own, so the sandbox's commands share one
loopback-only network (as a container's processes do) instead of bwrap creating and the
kernel tearing down one per command (docs/benchmarks.md has the figures). Commands
run as `nobody`, so the sandbox can read only what is world-readable under /usr and its own
/etc (not the host's /etc, root's home or the project).

When this module's probe finds no usable bubblewrap (or no setpriv while we are root), the
local backend refuses to create sandboxes unless SANDBOX_ALLOW_UNISOLATED is set.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import platform
import pwd
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.engines.sandboxes import seccomp
from apps.engines.sandboxes.base import WORKDIR, OutputCollector, logger

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_TMPFS_BYTES = 4 << 20
SHM_BYTES = 64 << 20


# --- what this host can do -----------------------------------------------------------------


@dataclass(frozen=True)
class HostSupport:
    """The result of probing bubblewrap once per process."""

    isolated: bool
    reason: str = ""  # why not isolated
    bwrap: str = ""
    setpriv: str = ""
    uid: int = 65534
    gid: int = 65534
    drop_privileges: bool = False
    bwrap_options: frozenset[str] = field(default_factory=frozenset)
    has_lib64: bool = False


_host: HostSupport | None = None
_host_lock = threading.Lock()


def _which(name: str) -> str:
    return shutil.which(name, path=HOST_PATH) or ""


def _sandbox_user() -> tuple[int, int, bool]:
    """(uid, gid, drop?) the commands run as: nobody when we are root, else ourselves."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid(), False
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid, True
    except KeyError:
        return 65534, 65534, True


def probe_host() -> HostSupport:
    """Check bwrap, setpriv and user namespaces by starting one empty sandbox."""
    uid, gid, drop = _sandbox_user()
    bwrap, setpriv = _which("bwrap"), _which("setpriv")
    base = dict(uid=uid, gid=gid, drop_privileges=drop, bwrap=bwrap, setpriv=setpriv,
                has_lib64=os.path.isdir("/usr/lib64"))
    if drop and not setpriv:
        return HostSupport(isolated=False, reason="setpriv (util-linux) is not installed", **base)
    if not bwrap:
        return HostSupport(isolated=False, reason="bubblewrap is not installed (apt-get install bubblewrap)", **base)
    try:
        help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return HostSupport(isolated=False, reason=f"cannot run {bwrap}: {exc}", **base)
    options = frozenset(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, re.M))
    missing = {"--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--info-fd", "--args",
               "--seccomp"} - options
    if missing:
        return HostSupport(isolated=False, reason=f"{bwrap} is too old (lacks {', '.join(sorted(missing))})", **base)
    if not seccomp.supported():
        return HostSupport(isolated=False, reason=f"no seccomp filter for {platform.machine()} (x86_64, aarch64)",
                           **base)
    host = HostSupport(isolated=True, bwrap_options=options, **base)
    fds = command_fds({})
    argv = wrap_argv(host, workspace=None, cwd="/", fds=fds) + ["/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/", env={"PATH": HOST_PATH},
                              pass_fds=fds)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return HostSupport(isolated=False, reason=f"bubblewrap probe failed: {exc}", **base)
    finally:
        for fd in fds:
            os.close(fd)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        return HostSupport(
            isolated=False,
            reason=f"bubblewrap cannot create its namespaces here ({detail}); unprivileged user namespaces "
            "may be disabled (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, AppArmor)",
            **base,
        )
    return host


def host_support() -> HostSupport:
    """`probe_host()` once per process."""
    global _host
    with _host_lock:
        if _host is None:
            _host = probe_host()
            if not _host.isolated:
                logger.warning("local sandboxes: no isolation available: %s", _host.reason)
        return _host


# Raw syscall numbers: libc's setresuid() and friends change every thread of the process (POSIX
# semantics); the kernel's calls change only the calling thread, which is what we want here.
_CRED_SYSCALLS = {
    "x86_64": {"setgroups": 116, "setresuid": 117, "setresgid": 119},
    "aarch64": {"setgroups": 159, "setresuid": 147, "setresgid": 149},
}
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def thread_privileges_droppable(host: HostSupport) -> bool:
    """Whether `drop_thread_privileges` can replace setpriv here (root, a known architecture)."""
    return host.drop_privileges and os.geteuid() == 0 and platform.machine() in _CRED_SYSCALLS


def drop_thread_privileges(uid: int, gid: int) -> None:
    """Make the calling thread, and only it, what `setpriv --reuid --regid --clear-groups
    --no-new-privs` makes a process: no supplementary groups, gid and uid (real, effective,
    saved) set, capabilities gone with the uid, no_new_privs. Irreversible for the thread.

    Then reads the thread's credentials back from /proc and raises OSError unless they are
    exactly that: a thread that starts sandbox processes must never be half-dropped."""
    numbers = _CRED_SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(errno.ENOSYS, f"no per-thread credential calls known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    # syscall() and prctl() are variadic and read longs: pass longs, not ctypes' default int.
    long = ctypes.c_long
    steps = (
        ("setgroups", (long(numbers["setgroups"]), long(0), ctypes.c_void_p(None))),
        ("setresgid", (long(numbers["setresgid"]), long(gid), long(gid), long(gid))),
        ("setresuid", (long(numbers["setresuid"]), long(uid), long(uid), long(uid))),
    )
    for name, args in steps:
        if libc.syscall(*args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{name} in the spawner thread failed: {os.strerror(err)}")
    if libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), *(ctypes.c_ulong(v) for v in (1, 0, 0, 0))) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(NO_NEW_PRIVS) in the spawner thread failed: {os.strerror(err)}")
    status = dict(line.split(":", 1) for line in Path("/proc/thread-self/status").read_text().splitlines()
                  if ":" in line)
    want = {"Uid": [str(uid)] * 4, "Gid": [str(gid)] * 4, "Groups": [], "NoNewPrivs": ["1"],
            "CapEff": ["0" * 16], "CapPrm": ["0" * 16]}
    got = {key: status.get(key, "?").split() for key in want}
    if got != want:
        raise OSError(errno.EPERM, f"the spawner thread's credentials are {got}, not {want}")


def enter_private_network() -> None:
    """Move the calling thread, and only it, into a new network namespace whose only device
    is a loopback that is up: what bwrap's --unshare-net gives one command. What the thread
    starts is born in it, so commands started with --share-net share this namespace (one
    network per sandbox, unreachable from the host and from other sandboxes) instead of
    paying for one each. Needs CAP_SYS_ADMIN: call it before `drop_thread_privileges`.

    Raises OSError unless the thread ends up outside the process's namespace with lo up."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(CLONE_NEWNET)) != 0:  # per thread: namespaces belong to tasks
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET) in the spawner thread failed: {os.strerror(err)}")
    if os.readlink("/proc/thread-self/ns/net") == os.readlink(f"/proc/{os.getpid()}/ns/net"):
        raise OSError(errno.EPERM, "the spawner thread is still in the worker's network namespace")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # created in the new namespace
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
    if not flags & IFF_UP:
        raise OSError(errno.EIO, "the sandbox network's loopback did not come up")


def spawner_keeps_network(host: HostSupport) -> bool:
    """Whether a spawner thread makes the sandbox's network and bwrap keeps it (--share-net)."""
    return "--share-net" in host.bwrap_options


def prepare_spawner_thread(host: HostSupport) -> None:
    """What a sandbox's spawner thread (cgroups.CgroupThread) does once, still root, before
    it starts commands: the sandbox's network namespace (where bwrap can keep it), then down
    to what setpriv would make a command. `wrap_argv(..., from_spawner=True)` relies on both."""
    if spawner_keeps_network(host):
        enter_private_network()
    drop_thread_privileges(host.uid, host.gid)


def reset_host_support() -> None:
    """Forget the probe results (tests, or after installing bubblewrap)."""
    global _host
    with _host_lock:
        _host = None


# --- argv --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunLimits:
    """The rlimits of one command, applied by the sandbox's own shell (see `shell_argv`)."""

    address_space: int | None  # bytes; None: unlimited (a memory cgroup bounds the sandbox)
    cpu_seconds: int
    file_size: int
    open_files: int
    processes: int

    def ulimit_commands(self) -> str:
        """dash `ulimit` builtins (units: -v KiB, -f 512-byte blocks; no -H/-S sets both).

        The soft CPU limit is a second below the hard one: SIGXCPU (exit 152) tells "cpu" apart
        from the OOM killer's SIGKILL, and a process that ignores it dies a second later. Soft
        before hard, since a new hard limit may not be below the current soft one.
        """
        return (
            f"ulimit -S -t {self.cpu_seconds} && ulimit -H -t {self.cpu_seconds + 1} && "
            f"ulimit -v {'unlimited' if self.address_space is None else self.address_space // 1024} && ulimit -f {self.file_size // 512} && "
            f"ulimit -n {self.open_files} && ulimit -p {self.processes} && ulimit -c 0"
        )


def data_fd(data: bytes) -> int:
    """A memfd holding `data`, read from its start; close-on-exec (Popen's pass_fds hands it on)."""
    fd = os.memfd_create("trajplatform-sandbox", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def setenv_args(env: dict[str, str]) -> bytes:
    """`env` as the NUL-separated bwrap arguments `--args FD` reads (names and values hold no NUL)."""
    return b"".join(b"--setenv\0%s\0%s\0" % (key.encode(), value.encode()) for key, value in env.items())


def command_fds(env: dict[str, str]) -> tuple[int, int]:
    """The two fds a sandbox command's bwrap reads (`wrap_argv`'s `fds`): its environment for
    --args, the seccomp filter for --seccomp. The caller passes them on and closes them."""
    env_fd = data_fd(setenv_args(env))
    try:
        return env_fd, data_fd(seccomp.program())
    except BaseException:
        os.close(env_fd)
        raise


def wrap_argv(
    host: HostSupport,
    *,
    workspace: str | None,
    cwd: str,
    fds: tuple[int, int] | None = None,
    info_fd: int | None = None,
    cgroup_procs: list[str] | None = None,
    tmp_bytes: int = 64 << 20,
    ro_binds: tuple[tuple[str, str], ...] = (),
    from_spawner: bool = False,
    etc: str | None = None,
) -> list[str]:
    """Everything before the sandbox's shell: cgroup join, privilege drop, bwrap (if isolated).

    `fds` (isolated only, required there): the command's environment and seccomp filter, as
    `command_fds` makes them, open in the process that runs this argv.
    `ro_binds` are (host path, sandbox path) pairs bound read-only (a runtime profile's extras,
    such as the platform's Python packages). `from_spawner`: started from a thread that ran
    `prepare_spawner_thread`, so it already did what setpriv does (no setpriv) and is in the
    sandbox's own network namespace, which bwrap keeps (--share-net) rather than making one.
    `etc`: the directory bound read-only at /etc (etc.sandbox_etc: the sandbox's own, never the
    host's); None: no /etc at all (the host probe).
    """
    argv: list[str] = []
    if cgroup_procs:
        # Still root, before anything of the sandbox exists: move this process into the
        # sandbox's cgroups, then exec the rest, which is born inside them.
        argv += ["/bin/sh", "-c", _JOIN_SCRIPT, "join", str(len(cgroup_procs)), *cgroup_procs]
    if host.drop_privileges and not from_spawner:
        argv += [host.setpriv, f"--reuid={host.uid}", f"--regid={host.gid}", "--clear-groups", "--no-new-privs", "--"]
    if host.isolated:
        argv += [host.bwrap, "--unshare-all", "--unshare-user"]
        if from_spawner and spawner_keeps_network(host):
            argv.append("--share-net")
        if "--disable-userns" in host.bwrap_options:
            argv.append("--disable-userns")
        argv += ["--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox"]
        sized = "--size" in host.bwrap_options
        argv += (["--size", str(ROOT_TMPFS_BYTES)] if sized else []) + ["--tmpfs", "/"]
        argv += ["--ro-bind", "/usr", "/usr"]
        if etc is not None:
            argv += ["--ro-bind", etc, "/etc"]
        for source, target in ro_binds:
            argv += ["--ro-bind", source, target]
        argv += ["--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin", "--symlink", "usr/lib", "/lib"]
        if host.has_lib64:
            argv += ["--symlink", "usr/lib64", "/lib64"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += (["--size", str(SHM_BYTES)] if sized else []) + ["--tmpfs", "/dev/shm"]
        # /dev itself is a tmpfs without a size: read-only, nothing can be stored there (writes
        # to its device nodes are not stores, and still work); /dev/shm is the sized place.
        argv += ["--remount-ro", "/dev"]
        argv += (["--size", str(tmp_bytes)] if sized else []) + ["--tmpfs", "/tmp"]
        if workspace is None:
            argv += ["--tmpfs", WORKDIR]
        else:
            argv += ["--bind", workspace, WORKDIR]
        if fds is None:
            raise ValueError("an isolated command needs its environment and seccomp fds (command_fds)")
        env_fd, seccomp_fd = fds
        argv += ["--remount-ro", "/", "--chdir", cwd, "--clearenv", "--args", str(env_fd), "--seccomp", str(seccomp_fd)]
        if info_fd is not None:
            argv += ["--info-fd", str(info_fd)]
        argv.append("--")
    return argv


JOIN_FAILED_EXIT = 125
JOIN_FAILED_MARK = "trajplatform-sandbox: cannot join cgroup"
_JOIN_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    f'echo $$ 2>/dev/null > "$1" || {{ echo "{JOIN_FAILED_MARK} $1" >&2; exit {JOIN_FAILED_EXIT}; }}; '
    'shift; n=$((n-1)); done; exec "$@"'
)
LIMITS_FAILED_MARK = "trajplatform-sandbox: cannot set limits"


def shell_argv(command: str | list[str], limits: RunLimits | None) -> list[str]:
    """The sandbox's pid 1: /bin/sh sets the rlimits with builtins, then runs the command.

    Builtins cost no exec, and set inside the sandbox's user namespace RLIMIT_NPROC counts
    this sandbox's processes only (the kernel charges rlimit counts per user namespace), not
    every process the shared sandbox uid has on the host. The command is not exec'd: sh
    stays pid 1, reaps orphans, and the program keeps normal signal semantics. A shell
    string is appended to the script after a newline, so it runs exactly as `sh -c` would.
    """
    prefix = ""
    if limits is not None:
        prefix = f'{limits.ulimit_commands()} || {{ echo "{LIMITS_FAILED_MARK}" >&2; exit {JOIN_FAILED_EXIT}; }}\n'
    if isinstance(command, str):
        return ["/bin/sh", "-c", prefix + command]
    return ["/bin/sh", "-c", prefix + '"$@"', "sh", *command]


# --- process plumbing ----------------------------------------------------------------------


class RawSink:
    """Collects stdout bytes as-is (file reads) and stderr as text."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()

    def feed(self, stream: str, data: bytes) -> None:
        if stream == "stdout":
            self.stdout += data
        elif len(self.stderr) < 65536:
            self.stderr += data[: 65536 - len(self.stderr)]


def stderr_starts(sink: Any, mark: str) -> bool:
    captured = sink.streams["stderr"].head if isinstance(sink, OutputCollector) else sink.stderr
    return bytes(captured[: len(mark)]) == mark.encode()


@dataclass
class Outcome:
    exit_code: int | None
    timed_out: bool
    duration_ms: int
    oom_kills: int = 0
    note: str = ""


class Running:
    """One started command: the Popen of bwrap's monitor and, once known, the sandbox's pid 1.

    `info_fd` is the (non-blocking) read end of bwrap's --info-fd, which names pid 1 right
    after the clone. It is read on demand (`read_info`: before a kill, and once the command
    is done), not watched: nothing needs pid 1 sooner, and a watched fd costs every command
    system calls on the thread that pumps it.
    """

    def __init__(self, proc: subprocess.Popen, info_fd: int = -1):
        self.proc = proc
        self.info_fd = info_fd
        self._info = b""
        self._info_lock = threading.Lock()  # a kill from destroy() may read it beside the pump
        self.child_pid: int | None = None
        self.killed_monitor = False

    def take_info(self, data: bytes) -> bool:
        """Feed bytes read from bwrap's --info-fd; False once there is nothing more to read."""
        if not data:
            return False
        self._info += data
        try:
            info = json.loads(self._info)
        except ValueError:
            return True
        pid = info.get("child-pid") if isinstance(info, dict) else None
        self.child_pid = pid if isinstance(pid, int) else None
        return False

    def read_info(self) -> None:
        """Take what bwrap has written to --info-fd so far; never blocks. `child_pid` stays None
        until the info is complete (and for good if the sandbox never existed)."""
        with self._info_lock:
            while self.child_pid is None and self.info_fd >= 0:
                try:
                    if not self.take_info(os.read(self.info_fd, 4096)):
                        return
                except BlockingIOError:
                    return

    def close_info(self) -> None:
        with self._info_lock:
            if self.info_fd >= 0:
                os.close(self.info_fd)
                self.info_fd = -1

    def kill(self) -> None:
        """SIGKILL the sandbox.

        Killing pid 1 of the sandbox's PID namespace makes the kernel kill everything else in
        it, and bwrap's monitor (our child) reaps it and exits. Killing the monitor instead
        would work too (--die-with-parent) but leaves pid 1 as an orphan zombie for the host's
        init to reap, still counted in the sandbox's pids cgroup. The monitor is the fallback
        while pid 1 is unknown (the first milliseconds) and in unisolated mode.
        """
        if self.proc.poll() is not None:
            return
        self.read_info()
        if self.child_pid is not None:
            try:
                # Safe from pid reuse: while the monitor lives it has not reaped pid 1.
                os.kill(self.child_pid, signal.SIGKILL)
                return
            except ProcessLookupError:
                pass
        self.kill_monitor()

    def kill_monitor(self) -> None:
        self.killed_monitor = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
