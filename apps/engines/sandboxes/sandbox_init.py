"""The local sandbox's init: one long-lived process inside the sandbox that runs its commands.

Starting a bubblewrap sandbox (user, mount and pid namespaces, a fresh root of tmpfs and
binds, /proc, /dev) costs about 6 ms of CPU; forking a shell inside an existing one about 1 ms.
So a local sandbox starts bubblewrap once, on its first command, with this program as the
sandbox's pid 1 (the host's /usr/bin/python3, standard library only, source passed with -c),
and every later command is a child of it. What a command sees is what a bubblewrap of its own
gave it: the same root, workspace, rlimits (its /bin/sh sets them), cgroups (the init was
born inside them) and no network. What a command leaves behind is removed before the next:

* when its main process exits (or the host asks for a kill), every other process in the
  sandbox is SIGKILLed, as the kernel does when a pid namespace's pid 1 exits: daemons,
  `setsid` and `nohup` children die with the command that started them;
* /tmp and /dev/shm are emptied after each command.

The init runs one command at a time. A second command of the same sandbox that arrives while
one runs gets a bubblewrap of its own, as before (`LocalSandbox._execute`). Inside the
sandbox's pid namespace the init is pid 1, which the kernel does not let sandboxed code
signal; it exits when the host closes its stdin and dies with the host process
(bubblewrap's --die-with-parent). If it dies anyway (e.g. the OOM killer), the command in
flight reports SIGKILL and the next command starts a new init.

The protocol, one command at a time over the init's stdin (host -> init) and stdout
(init -> host): frames of HEADER (kind, payload length) + payload.

    init:  READY                                once, when it is ready for commands
    host:  RUN {"argv", "cwd", "env", "stdin"}  JSON; "stdin": whether STDIN frames follow
    host:  STDIN bytes ... STDIN b""            the command's stdin, then its end
    host:  KILL                                 kill the command and everything it started
    init:  STDOUT bytes / STDERR bytes          the command's output as it comes
    init:  EXIT b"<code>"                       the end: 0-255, or 128+N for signal N

This module is both ends: `main()` runs in the sandbox (stdlib only, no Django), `InitProcess`
is the host's handle on it (used by local.py).
"""
from __future__ import annotations

# Only what the init needs (it starts once per sandbox, in a fresh interpreter, so every import
# is paid per sandbox): no json, subprocess or selectors in here; the host imports its own.
import _signal as signal  # the C module under `signal`: the same calls, without its enum import (4 ms)
import marshal
import os
import select
import struct
import sys
import time

HEADER = struct.Struct("!BI")
READY, RUN, STDIN, KILL, STDOUT, STDERR, EXIT = range(1, 8)
CHUNK = 65536
# marshal's format 4 (Python 3.4+): the request is plain lists, dicts and strings.
MARSHAL_VERSION = 4
# In the init's command line, so the host can tell the sandbox's init from a command.
MARK = "trajplatform-sandbox-init"
EMPTIED_AFTER_EACH_COMMAND = ("/tmp", "/dev/shm")


class Frames:
    """Frames read from a file descriptor: `read()` adds what one read completes to `ready`."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()
        self.ready: list[tuple[int, bytes]] = []

    def read(self) -> bool:
        """One read(); False at end of file."""
        data = os.read(self.fd, CHUNK + HEADER.size)
        if not data:
            return False
        self.buf += data
        while len(self.buf) >= HEADER.size:
            kind, size = HEADER.unpack_from(self.buf)
            end = HEADER.size + size
            if len(self.buf) < end:
                break
            self.ready.append((kind, bytes(self.buf[HEADER.size:end])))
            del self.buf[:end]
        return True

    def take(self) -> list[tuple[int, bytes]]:
        taken, self.ready = self.ready, []
        return taken


def frame(kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# --- inside the sandbox ----------------------------------------------------------------------


def _kill_everything_else() -> None:
    """SIGKILL every process in the sandbox but this one (what pid 1's exit would do)."""
    me = os.getpid()
    if me != 1:  # never outside a sandbox's own pid namespace (see main)
        return
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


def _reap() -> None:
    """Collect every exited child, and wait (briefly) for the killed ones to exit."""
    give_up = time.monotonic() + 2.0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > give_up:
                return
            time.sleep(0.001)


def _empty(directory: str, *, remove: bool = False) -> None:
    """Delete what `directory` holds (and the directory itself with `remove`), as far as we may."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                _empty(entry.path, remove=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
    if remove:
        os.rmdir(directory)


def _spawn(request: dict) -> tuple[int, int, int, int]:
    """Start the command in its own session; (pid, stdin fd or -1, stdout fd, stderr fd)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if request["stdin"]:
        in_r, in_w = os.pipe()
        os.set_blocking(in_w, False)
    else:
        in_r, in_w = os.open("/dev/null", os.O_RDONLY), -1
    try:
        os.chdir(request["cwd"])  # the init is single-threaded: chdir, spawn, chdir back
        try:
            pid = os.posix_spawn(
                request["argv"][0], request["argv"], request["env"],
                file_actions=[(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                              (os.POSIX_SPAWN_DUP2, err_w, 2)],
                setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # Python ignores these; commands must not
            )
        finally:
            os.chdir("/")
    except OSError:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    return pid, in_w, out_r, err_r


def _run(request: dict, host: Frames, wake: int) -> None:
    out = sys.stdout.fileno()
    try:
        pid, stdin_fd, out_r, err_r = _spawn(request)
    except OSError as exc:
        what = f" {exc.filename}" if exc.filename else ""
        write_all(out, frame(STDERR, f"sandbox: cannot start the command:{what}: {exc.strerror}\n".encode()))
        write_all(out, frame(EXIT, b"1"))
        return
    poller = select.poll()
    streams = {out_r: STDOUT, err_r: STDERR}
    for fd in (out_r, err_r, host.fd, wake):
        poller.register(fd, select.POLLIN)
    pending = bytearray()
    stdin_ended = False
    code: int | None = None

    def close_stdin() -> None:
        nonlocal stdin_fd
        if stdin_fd >= 0:
            poller.unregister(stdin_fd)
            os.close(stdin_fd)
            stdin_fd = -1

    def handle(frames: list[tuple[int, bytes]]) -> None:
        nonlocal stdin_ended
        for kind, payload in frames:
            if kind == KILL:
                _kill_everything_else()
            elif kind == STDIN and stdin_fd >= 0:
                if payload:
                    pending.extend(payload)
                    poller.register(stdin_fd, select.POLLOUT)
                else:
                    stdin_ended = True
                    if not pending:
                        close_stdin()

    if stdin_fd >= 0:
        poller.register(stdin_fd, 0)  # watched for writing only while there is something to write
    handle(host.take())  # what came with the RUN frame
    while streams or code is None:
        for fd, _ in poller.poll(-1 if streams else 50):
            if fd == host.fd:
                if not host.read():  # the host is gone: so is the sandbox
                    _kill_everything_else()
                    sys.exit(0)
                handle(host.take())
            elif fd == wake:
                os.read(wake, 4096)
            elif fd == stdin_fd:
                try:
                    del pending[:os.write(fd, pending[:CHUNK])]
                except BrokenPipeError:
                    pending.clear()
                    stdin_ended = True
                if not pending:
                    if stdin_ended:
                        close_stdin()
                    else:
                        poller.register(fd, 0)
            elif fd in streams:
                data = os.read(fd, CHUNK)
                if data:
                    write_all(out, frame(streams[fd], data))
                else:
                    poller.unregister(fd)
                    os.close(fd)
                    del streams[fd]
        if code is None:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                # Its pid namespace would end here: what it left running dies, its pipes close.
                _kill_everything_else()
    close_stdin()
    _reap()
    for directory in EMPTIED_AFTER_EACH_COMMAND:
        _empty(directory)
    write_all(out, frame(EXIT, str(128 - code if code < 0 else code).encode()))


def main() -> None:
    if os.getpid() != 1:
        # It kills every process it can see; only pid 1 of a sandbox's pid namespace sees just
        # the sandbox's own.
        sys.exit(f"{MARK}: refusing to run as pid {os.getpid()}; this is pid 1 of a sandbox only")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes poll() through the wakeup fd
    signal.set_wakeup_fd(wake_w)
    host = Frames(sys.stdin.fileno())
    write_all(sys.stdout.fileno(), frame(READY))
    while True:
        if not host.ready and not host.read():
            _kill_everything_else()
            return
        if host.ready:
            kind, payload = host.ready.pop(0)
            if kind == RUN:
                _run(marshal.loads(payload), host, wake_r)
                _reap()


# --- on the host -------------------------------------------------------------------------------


class InitGone(Exception):
    """The init died or never became ready."""


class InitProcess:
    """The host's handle on one sandbox's init: the Popen of the bubblewrap that runs it.

    `run` is synchronous and holds no thread but the caller's; callers serialize (LocalSandbox
    takes a lock around it)."""

    READY_TIMEOUT = 30.0

    def __init__(self, proc: "subprocess.Popen[bytes]"):
        self.proc = proc
        self.frames = Frames(proc.stdout.fileno())  # type: ignore[union-attr]
        self.dead = False

    @classmethod
    def start(cls, argv: list[str], *, env: dict[str, str]) -> "InitProcess":
        import selectors
        import subprocess

        proc = _popen_in_spawner_thread(
            [*argv, sys_python(), "-I", "-S", "-c", SOURCE, MARK],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd="/", env=env, start_new_session=True,
        )
        init = cls(proc)
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
            answered = bool(sel.select(cls.READY_TIMEOUT)) and init.frames.read()
        if not answered or init.frames.take()[:1] != [(READY, b"")]:
            init.kill()
            detail = proc.stderr.read().decode(errors="replace").strip()[-500:]  # type: ignore[union-attr]
            init.close()
            raise InitGone(detail or "it did not answer")
        return init

    def kill(self) -> None:
        """SIGKILL bubblewrap's monitor: with --die-with-parent the whole sandbox goes."""
        self.dead = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """Stop it (closing its stdin ends it) and reap bubblewrap."""
        import subprocess

        self.dead = True
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()

    def run(self, argv: list[str], *, cwd: str, env: dict[str, str], stdin_data: bytes | None, sink: object,
            deadline: float, drain_after_kill: float) -> tuple[int | None, bool]:
        """Run one command; `sink.feed(stream, bytes)` gets its output. Returns (exit code, timed
        out). At `deadline` the command is killed; if the init does not confirm within
        `drain_after_kill`, or dies, the init is killed and the exit code is 128+SIGKILL."""
        import selectors

        if self.dead or self.proc.poll() is not None:  # e.g. the OOM killer took it while idle
            self.dead = True
            raise InitGone("the sandbox's init is gone")
        stdin_fd, stdout_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()  # type: ignore[union-attr]
        request = {"argv": list(argv), "cwd": cwd, "env": dict(env), "stdin": stdin_data is not None}
        out = bytearray(frame(RUN, marshal.dumps(request, MARSHAL_VERSION)))
        if stdin_data is not None:
            for start in range(0, len(stdin_data), CHUNK):
                out += frame(STDIN, stdin_data[start:start + CHUNK])
            out += frame(STDIN)
        timed_out = False
        give_up_at: float | None = None
        os.set_blocking(stdin_fd, False)
        with selectors.DefaultSelector() as sel:
            sel.register(stdout_fd, selectors.EVENT_READ)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
            try:
                while True:
                    now = time.monotonic()
                    if not timed_out and now >= deadline:
                        timed_out = True
                        give_up_at = now + drain_after_kill
                        if stdin_fd not in sel.get_map():
                            sel.register(stdin_fd, selectors.EVENT_WRITE)
                        out += frame(KILL)
                    if give_up_at is not None and now >= give_up_at:
                        self.kill()
                        return 128 + signal.SIGKILL, timed_out
                    until = give_up_at if timed_out else deadline
                    for key, _ in sel.select(max(0.0, min(until - now, 1.0))):  # type: ignore[operator]
                        if key.fd == stdin_fd:
                            try:
                                del out[:os.write(stdin_fd, out)]
                            except BrokenPipeError:
                                out.clear()
                            if not out:
                                sel.unregister(stdin_fd)
                            continue
                        if not self.frames.read():  # the init died (OOM killer, a destroy)
                            self.kill()
                            return 128 + signal.SIGKILL, timed_out
                        for kind, payload in self.frames.take():
                            if kind == STDOUT:
                                sink.feed("stdout", payload)  # type: ignore[attr-defined]
                            elif kind == STDERR:
                                sink.feed("stderr", payload)  # type: ignore[attr-defined]
                            elif kind == EXIT:
                                return int(payload), timed_out
            except OSError:  # its pipes broke: as if it had died
                self.kill()
                return 128 + signal.SIGKILL, timed_out
            except BaseException:
                self.kill()  # an interrupted exchange leaves the protocol out of step
                raise


def _popen_in_spawner_thread(argv: list[str], **kwargs: Any) -> "subprocess.Popen[bytes]":
    """Popen from one thread that lives as long as the process.

    bubblewrap's --die-with-parent is a parent-death signal, which Linux sends when the
    *thread* that started the process exits, not the process: an init started from a pool or
    short-lived thread would die with it. (After a fork the child gets a thread of its own.)"""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    with _spawners_lock:
        spawner = _spawners.get(os.getpid())
        if spawner is None:
            spawner = _spawners[os.getpid()] = ThreadPoolExecutor(1, thread_name_prefix="sandbox-init-spawner")
    return spawner.submit(subprocess.Popen, argv, **kwargs).result()


def sys_python() -> str:
    """The interpreter that runs the init inside the sandbox: the host's Debian python3 under
    /usr (bound read-only into every local sandbox)."""
    return "/usr/bin/python3"


if __name__ == "__main__":  # in the sandbox: `python3 -I -S -c SOURCE`
    main()
else:
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from typing import Any

    _spawners_lock = threading.Lock()
    _spawners: dict[int, ThreadPoolExecutor] = {}  # by process id

    with open(__file__, encoding="utf-8") as _source:
        SOURCE = _source.read()
