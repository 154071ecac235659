"""Worker identity and liveness: the names claims are stamped with, and whether their holder runs.

A job that claims rows (rollouts, pipeline runs, exports) stamps them with `worker_name()` plus a
token of its own, and registers that name in `_live_runners` while it runs. A reaper on the same
host asks `holder_alive(worker, claimed_at)` to tell a claim whose process is gone (or whose pid
a later process reuses) from one still held."""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# The names of the claim holders running in this process (host:pid:token): a claim with this
# process's pid but another token was left by a dead process whose pid this one reuses.
_live_runners: set[str] = set()
_live_runners_lock = threading.Lock()


def _process_started_at(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), from /proc; None if unknown (or it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie: dead, only not waited for yet
            return float("inf")
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def holder_alive(worker: str, claimed_at: Any) -> bool:
    """Whether the process that claimed a row as `worker` (host:pid:token, on this host) may
    still run: its pid exists and that process is not younger than the claim. A pid reused by a
    later process (in a restarted container pids start over) counts as dead."""
    try:
        pid = int(worker.split(":")[1])
    except (IndexError, ValueError):
        return True  # not a name this module wrote: leave it to the heartbeat
    if pid == os.getpid():
        with _live_runners_lock:
            return worker in _live_runners
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    started = _process_started_at(pid)
    if started is None or claimed_at is None:
        return True
    return started <= claimed_at.timestamp() + 1.0  # /proc's boot time has a 1 s resolution
