"""Per-sandbox cgroups for the local backend: discovery, limits, join, kill, removal.

Memory and process-count limits that cover a whole sandbox (every process, /tmp included)
need a cgroup; rlimits are per process. `detect()` looks at what this process can really
do, once: for each controller (memory, pids, cpu) it finds the hierarchy it is mounted in
(cgroup v1 per-controller mounts, or the v2 unified tree), the cgroup this process lives in
there, and tries to create a child directory and write a limit into it. What works is used;
what does not is reported as a downgrade with the reason, never silently skipped.

On cgroup v2 a cgroup that holds processes cannot hand controllers to children ("no
internal processes"), so a worker that sits in a non-root cgroup with other processes gets
no v2 limits unless it is started in a delegated subtree (systemd `Delegate=yes`).
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
import queue
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")

logger = logging.getLogger("apps.engines.sandboxes")

CONTROLLERS = ("memory", "pids", "cpu")
PARENT_NAME = "trajplatform-sandboxes"
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupSupport:
    """Which controllers this process can put a sandbox under, and where."""

    parents: dict[str, str] = field(default_factory=dict)  # controller -> parent directory
    versions: dict[str, int] = field(default_factory=dict)  # controller -> 1 or 2
    problems: dict[str, str] = field(default_factory=dict)  # controller -> why it is unavailable

    @property
    def enforced(self) -> tuple[str, ...]:
        return tuple(c for c in CONTROLLERS if c in self.parents)

    def describe(self) -> str:
        parts = [f"{c}: cgroup v{self.versions[c]} under {self.parents[c]}" for c in self.enforced]
        parts += [f"{c}: unavailable ({why})" for c, why in self.problems.items()]
        return "; ".join(parts)


def _parse_mountinfo(text: str) -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) for every cgroup mount."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype = rfields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append((fstype, fields[3], fields[4].replace("\\040", " "), set(rfields[2].split(","))))
    return mounts


def _parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """(v1 controller -> path, v2 path or None) from /proc/<pid>/cgroup."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        else:
            for name in controllers.split(","):
                v1[name] = path
    return v1, v2


def _under(mount_point: str, mount_root: str, path: str) -> Path:
    if mount_root != "/" and path.startswith(mount_root):
        path = path[len(mount_root):] or "/"
    return Path(mount_point) / path.lstrip("/")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _probe(parent: Path, controller: str, version: int) -> None:
    """Create the parent (if needed) and a throwaway child, write a limit, remove it."""
    parent.mkdir(exist_ok=True)
    if version == 2:
        _enable_v2(parent.parent, controller)
        _enable_v2(parent, controller)
    probe = parent / f"probe-{os.getpid()}-{threading.get_ident()}"
    probe.mkdir(exist_ok=True)
    try:
        limit_file, value = {
            (1, "memory"): ("memory.limit_in_bytes", str(64 << 20)),
            (1, "pids"): ("pids.max", "64"),
            (1, "cpu"): ("cpu.cfs_quota_us", str(CPU_PERIOD_US)),
            (2, "memory"): ("memory.max", str(64 << 20)),
            (2, "pids"): ("pids.max", "64"),
            (2, "cpu"): ("cpu.max", f"{CPU_PERIOD_US} {CPU_PERIOD_US}"),
        }[(version, controller)]
        _write(probe / limit_file, value)
    finally:
        probe.rmdir()


def _enable_v2(directory: Path, controller: str) -> None:
    current = (directory / "cgroup.subtree_control").read_text().split()
    if controller not in current:
        _write(directory / "cgroup.subtree_control", f"+{controller}")


def detect(
    *,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
    parent_name: str = PARENT_NAME,
) -> CgroupSupport:
    """Find, per controller, a writable place for sandbox cgroups (see the module docstring)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    mounts = _parse_mountinfo(mountinfo)
    v1_paths, v2_path = _parse_proc_cgroup(proc_cgroup)
    parents: dict[str, str] = {}
    versions: dict[str, int] = {}
    problems: dict[str, str] = {}
    v2_mount = next(((root, point) for fstype, root, point, _ in mounts if fstype == "cgroup2"), None)
    for controller in CONTROLLERS:
        v1_mount = next(
            ((root, point) for fstype, root, point, opts in mounts if fstype == "cgroup" and controller in opts), None
        )
        errors: list[str] = []
        if v1_mount and controller in v1_paths:
            parent = _under(v1_mount[1], v1_mount[0], v1_paths[controller]) / parent_name
            try:
                _probe(parent, controller, 1)
                parents[controller], versions[controller] = str(parent), 1
                continue
            except OSError as exc:
                errors.append(f"cgroup v1 {parent}: {exc.strerror or exc}")
        if v2_mount and v2_path is not None:
            ours = _under(v2_mount[1], v2_mount[0], v2_path)
            try:
                available = (ours / "cgroup.controllers").read_text().split()
            except OSError as exc:
                available = []
                errors.append(f"cgroup v2 {ours}: {exc.strerror or exc}")
            if controller in available:
                parent = ours / parent_name
                try:
                    _probe(parent, controller, 2)
                    parents[controller], versions[controller] = str(parent), 2
                    continue
                except OSError as exc:
                    hint = (
                        " (this cgroup holds processes, so it cannot delegate controllers; start the worker in "
                        "a delegated cgroup, e.g. systemd Delegate=yes)"
                        if exc.errno in (errno.EBUSY, errno.EOPNOTSUPP)
                        else ""
                    )
                    errors.append(f"cgroup v2 {ours}: cannot delegate {controller}: {exc.strerror or exc}{hint}")
            elif not errors:
                errors.append(f"cgroup v2 {ours}: controller {controller} not available here")
        if not errors:
            errors.append(f"no cgroup hierarchy with the {controller} controller is mounted")
        problems[controller] = "; ".join(errors)
    return CgroupSupport(parents=parents, versions=versions, problems=problems)


_detected: CgroupSupport | None = None
_detect_lock = threading.Lock()


def support() -> CgroupSupport:
    """`detect()` once per process; the result is logged the first time."""
    global _detected
    with _detect_lock:
        if _detected is None:
            try:
                _detected = detect()
            except OSError as exc:
                _detected = CgroupSupport(problems={c: f"cannot read cgroup state: {exc}" for c in CONTROLLERS})
            if _detected.problems:
                logger.warning("sandbox cgroups: %s", _detected.describe())
            else:
                logger.info("sandbox cgroups: %s", _detected.describe())
        return _detected


class SandboxCgroup:
    """The cgroup directories (one per v1 controller, or one v2 directory) of one sandbox."""

    def __init__(self, paths: dict[str, str], versions: dict[str, int]):
        self.paths = dict(paths)
        self.versions = dict(versions)

    @classmethod
    def create(cls, cg: CgroupSupport, name: str, *, memory_bytes: int, pids: int, cpu: float) -> "SandboxCgroup":
        """Make the directories and write the limits; on any failure nothing is left behind."""
        made = cls({}, {})
        try:
            for controller in cg.enforced:
                path = Path(cg.parents[controller]) / name
                version = cg.versions[controller]
                if not path.exists():
                    path.mkdir()
                made.paths[controller] = str(path)
                made.versions[controller] = version
                if controller == "memory":
                    if version == 1:
                        _write(path / "memory.limit_in_bytes", str(memory_bytes))
                        # No swap either, where the kernel accounts it (memsw >= limit).
                        if (path / "memory.memsw.limit_in_bytes").exists():
                            try:
                                _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
                            except OSError:
                                pass
                    else:
                        _write(path / "memory.max", str(memory_bytes))
                        if (path / "memory.swap.max").exists():
                            _write(path / "memory.swap.max", "0")
                elif controller == "pids":
                    _write(path / "pids.max", str(pids))
                elif controller == "cpu":
                    quota = max(1000, int(cpu * CPU_PERIOD_US))
                    if version == 1:
                        _write(path / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                        _write(path / "cpu.cfs_quota_us", str(quota))
                    else:
                        _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        except OSError:
            made.remove(timeout=0.5)
            raise
        return made

    def to_json(self) -> dict[str, Any]:
        return {"paths": self.paths, "versions": self.versions}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "SandboxCgroup":
        data = data or {}
        return cls(data.get("paths") or {}, {k: int(v) for k, v in (data.get("versions") or {}).items()})

    @property
    def directories(self) -> list[Path]:
        return sorted({Path(p) for p in self.paths.values()})

    def join(self, pid: int) -> None:
        """Move `pid` (and the children it will have) into every directory."""
        for directory in self.directories:
            _write(directory / "cgroup.procs", str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.directories:
            try:
                found |= {int(x) for x in (directory / "cgroup.procs").read_text().split()}
            except OSError:
                continue
        return found

    def kill(self, uid: int | None = None) -> None:
        """SIGKILL every sandbox process in the sandbox's cgroups.

        With `uid`, only processes running as that user are signalled: on cgroup v1 a worker
        process shows up in `cgroup.procs` while one of its threads sits in the cgroup (see
        `CgroupThread`), and it must never be killed. Our own process is always spared.
        """
        if uid is None:
            for directory in self.directories:
                kill_file = directory / "cgroup.kill"
                if kill_file.exists():
                    try:
                        _write(kill_file, "1")
                    except OSError:
                        pass
        # v1 has no cgroup.kill: signal until none is left (a fork racing the loop lands in
        # the cgroup too, so it is caught on the next pass).
        for _ in range(50):
            targets = [pid for pid in self.pids() if pid != os.getpid() and (uid is None or _uid_of(pid) == uid)]
            if not targets:
                return
            for pid in targets:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this sandbox's memory cgroup so far."""
        path = self.paths.get("memory")
        if not path:
            return 0
        name = "memory.oom_control" if self.versions.get("memory") == 1 else "memory.events"
        try:
            for line in (Path(path) / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def evict_threads(self, uid: int) -> int:
        """Move worker threads (a task whose process does not run as the sandbox user) up to the
        parent cgroup.

        A CgroupThread of some worker may still sit in the sandbox's cgroups when another
        process destroys the sandbox; the directories cannot be removed while it is there.
        The thread notices on its next use (`CgroupThread.call` checks its membership). The
        thread itself runs as the sandbox user (it dropped its credentials), so it is told apart
        by its process: a worker's main thread is not the sandbox user.
        """
        moved = 0
        for directory in self.directories:
            try:
                tids = (directory / "tasks").read_text().split()
            except OSError:
                continue
            for tid in tids:
                if _uid_of(_tgid_of(int(tid))) not in (uid, None):
                    try:
                        _write(directory.parent / "tasks", tid)
                        moved += 1
                    except OSError:
                        pass
        return moved

    def remove(self, timeout: float = 2.0, uid: int | None = None) -> list[str]:
        """Remove the directories (killing stragglers first); returns what could not be removed."""
        deadline = time.monotonic() + timeout
        left: list[str] = []
        if uid is not None and self.thread_capable:
            self.evict_threads(uid)
        for directory in self.directories:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        left.append(f"{directory}: {exc.strerror or exc}")
                        break
                    self.kill(uid)
                    time.sleep(0.02)
        return left

    @property
    def thread_capable(self) -> bool:
        """cgroup v1 everywhere: threads can be moved one by one (see CgroupThread)."""
        return bool(self.paths) and all(v == 1 for v in self.versions.values())


def _status_number(pid: int, key: str) -> int | None:
    """The first number of a line of /proc/<pid>/status (None if gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _uid_of(pid: int) -> int | None:
    return _status_number(pid, "Uid")


def _tgid_of(tid: int) -> int:
    """The process (thread group) a thread belongs to; the tid itself if unknown."""
    return _status_number(tid, "Tgid") or tid


class CgroupJoinError(OSError):
    """A CgroupThread could not move itself into the sandbox's cgroups."""


def _has_children() -> bool:
    """Whether the calling thread has child processes that are not reaped yet (running, or
    exited and waiting for their parent's wait). Linux lists them per thread."""
    try:
        return bool(Path("/proc/thread-self/children").read_text().strip())
    except OSError:  # no CONFIG_PROC_CHILDREN: never leave while something may still run
        return True


class CgroupThread:
    """A thread that lives in one sandbox's cgroup v1 hierarchies; what it starts is born there.

    Moving a task between cgroups waits for an RCU grace period (the cgroup threadgroup lock),
    10-20 ms on a busy host. Paying that once per sandbox instead of once per command is the
    point: v1 lets a single thread of the worker join the sandbox's cgroups, and a child it
    spawns inherits that thread's cgroups at birth, with no migration at all. The worker's
    memory stays charged to the worker (v1 charges the mm owner, the main thread).

    The thread exits after IDLE_EXIT seconds without work and without a child process still
    running (leaving the cgroups, so they can be removed) and is started again on demand:
    a process it started gets bwrap's parent-death signal when the thread exits, so a command
    that runs longer than IDLE_EXIT keeps it. `submit(fn)` queues fn to run on it and returns
    a `concurrent.futures.Future`; `call(fn)` runs fn there and returns its result. `prepare`, if given, runs on the thread once it is inside (the local backend
    drops the thread's credentials there); if joining or `prepare` fails, the thread leaves and
    every function queued for it fails with CgroupJoinError.
    """

    IDLE_EXIT = 30.0

    def __init__(self, cgroup: SandboxCgroup, name: str, prepare: Callable[[], None] | None = None):
        self.cgroup = cgroup
        self.name = name
        self.prepare = prepare
        self._lock = threading.Lock()
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is up: `submit` then only queues."""
        return self._queue is not None

    def start(self) -> None:
        """Start the thread unless it is up (`Thread.start` waits until the new thread runs,
        i.e. until it got the GIL, milliseconds on a busy worker)."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._queue is None:
            # The join (an RCU grace period) and `prepare` are not waited for: they happen on
            # the new thread, which fails what was queued for it if they fail.
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._loop, args=(self._queue,), name=self.name, daemon=True)
            self._thread.start()

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        """Queue `fn` to run on the thread inside the cgroups; returns its future without
        waiting for the thread to join them, nor for `fn` (but it starts the thread if it is
        not up: see `start`).

        The future fails with CgroupJoinError if the thread cannot join the cgroups (or was
        evicted from them). A future cancelled before the thread takes it up is skipped: `fn`
        then never runs.
        """
        future: Future[T] = Future()
        with self._lock:
            self._start_locked()
            assert self._queue is not None
            self._queue.put((fn, future))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the thread inside the cgroups; CgroupJoinError if the thread cannot join them."""
        return self.submit(fn).result()

    def _inside(self) -> bool:
        """Whether this thread is (still) in every one of the sandbox's cgroups."""
        try:
            text = Path("/proc/thread-self/cgroup").read_text()
        except OSError:
            return False
        mine = {}
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                for name in parts[1].split(","):
                    mine[name] = parts[2]
        return all(
            path.endswith(mine.get(controller, "\0")) and mine.get(controller, "").endswith("/" + Path(path).name)
            for controller, path in self.cgroup.paths.items()
        )

    def _leave(self, requests: queue.Queue, error: CgroupJoinError, taken: tuple | None = None) -> None:
        """The thread cannot serve (never got in, or was evicted): fail `taken` (the request in
        hand) and everything queued, and go.

        Unhooked first, under the lock, so that nothing more is queued here; the next `submit`
        starts a fresh thread."""
        with self._lock:
            if self._queue is requests:
                self._queue = self._thread = None
        item = taken
        while True:
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(error)
            try:
                item = requests.get_nowait()
            except queue.Empty:
                return

    def _loop(self, requests: queue.Queue) -> None:
        tid = str(threading.get_native_id())
        try:
            for directory in self.cgroup.directories:
                _write(directory / "tasks", tid)
        except OSError as exc:
            message = f"cannot move thread {tid} into {self.cgroup.directories}: {exc.strerror}"
            self._leave(requests, CgroupJoinError(exc.errno, message))
            return
        if self.prepare is not None:
            try:
                self.prepare()
            except OSError as exc:
                # The thread ends here, which takes it out of the cgroups.
                self._leave(requests, CgroupJoinError(exc.errno, f"thread {tid} in {self.cgroup.directories}: {exc}"))
                return
        while True:
            try:
                item = requests.get(timeout=self.IDLE_EXIT)
            except queue.Empty:
                if _has_children():
                    # What it started dies with it (a parent-death signal is sent when the
                    # *thread* that forked exits: bwrap's --die-with-parent), so it stays
                    # while a command it started still runs, however long that takes.
                    continue
                with self._lock:
                    if not requests.empty():
                        continue
                    if self._queue is requests:
                        self._queue = self._thread = None
                return
            if item is None:
                return
            fn, future = item
            if not self._inside():
                # Evicted by a destroy from elsewhere: never start a command outside the limits.
                error = CgroupJoinError(errno.ESTALE, f"thread {tid} is no longer in {self.cgroup.directories}")
                self._leave(requests, error, taken=item)
                return
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it ran
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed back to the caller's thread
                future.set_exception(exc)
            # Not kept while the thread waits for the next one: `fn` may hold its caller (a
            # sandbox handle, which must be collectable once dropped).
            del item, fn, future

    def stop(self) -> None:
        """Let the thread leave the cgroups now (before they are removed)."""
        with self._lock:
            requests, thread = self._queue, self._thread
            self._queue = self._thread = None
        if requests is not None and thread is not None:
            requests.put(None)
            thread.join(5)
