"""Pumping one running command's pipes from the thread that runs it.

A started command (`bwrap.Running`) has up to three pipes to serve until it is done: stdout
and stderr into the sink, and stdin when there is data for it (bwrap's --info-fd is read on
demand, see Running). Its deadline kills it; one second later, if it is still there, its
bwrap monitor is killed too; DRAIN_AFTER_KILL (the caller's `drain_after_kill`) after the
kill, pipes that something still holds open are abandoned. `CommandPipes` is what to do when
each pipe is ready; `pump_in_thread` waits on them in the calling thread (`LocalSandbox.run`).
"""
from __future__ import annotations

import logging
import os
import selectors
import time
from typing import Any

from apps.engines.sandboxes.bwrap import Running

logger = logging.getLogger("apps.engines.sandboxes")

READ_CHUNK = 65536
# After a deadline kill, how long before the bwrap monitor itself is killed (when the
# sandbox's pid 1 was unknown or did not take everything with it).
ESCALATE_AFTER_KILL = 1.0


class CommandPipes:
    """One command's pipes and what to do when each is ready; the drivers only wait."""

    def __init__(self, running: Running, sink: Any, stdin_data: bytes | None, *, label: str):
        proc = running.proc
        assert proc.stdout is not None and proc.stderr is not None
        self.running = running
        self.sink = sink
        self.label = label  # who the log lines are about ("sandbox lsb-...")
        self.outputs = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        self.open_outputs = set(self.outputs)
        self.pending = memoryview(stdin_data) if stdin_data is not None else None
        self.stdin_fd = -1
        self.timed_out = False
        if self.pending is not None:
            assert proc.stdin is not None
            if len(self.pending):
                self.stdin_fd = proc.stdin.fileno()
                os.set_blocking(self.stdin_fd, False)
            else:
                proc.stdin.close()

    def read(self, fd: int) -> bool:
        """Take what output `fd` has; False at its EOF: stop waiting on it."""
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:  # a spurious wake-up of a non-blocking fd
            return True
        if not data:
            self.open_outputs.discard(fd)
            return False
        self.sink.feed(self.outputs[fd], data)
        return True

    def write(self) -> bool:
        """Write the next piece of stdin; False once all of it is written (stdin is then closed)."""
        assert self.pending is not None and self.running.proc.stdin is not None
        try:
            written = os.write(self.stdin_fd, self.pending[:READ_CHUNK])
        except BlockingIOError:
            return True
        except BrokenPipeError:  # the command does not read it all: no more to write
            written = len(self.pending)
        self.pending = self.pending[written:]
        if len(self.pending):
            return True
        self.stdin_fd = -1
        self.running.proc.stdin.close()
        return False

    def expire(self) -> None:
        """The deadline: kill the sandbox (its pid 1, or the monitor while pid 1 is unknown)."""
        self.timed_out = True
        self.running.kill()

    def escalate(self) -> None:
        """ESCALATE_AFTER_KILL after the deadline kill: the monitor too, if not done already."""
        if not self.running.killed_monitor:
            self.running.kill_monitor()

    def give_up(self, drain_after_kill: float) -> None:
        """`drain_after_kill` after the kill something still holds the pipes: stop reading them."""
        logger.warning("%s: output pipes still open %.0fs after kill; abandoning them", self.label, drain_after_kill)
        self.open_outputs.clear()

    def finish(self) -> None:
        """Once pumping ends, however: take the info bwrap wrote, close our pipe ends.

        The info is written right after the clone, so it is there by now if the sandbox ever
        existed; `child_pid` None then means it never did (see `LocalSandbox._outcome`)."""
        running = self.running
        running.read_info()
        proc = running.proc
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def pump_in_thread(pipes: CommandPipes, deadline: float, drain_after_kill: float) -> bool:
    """Serve the pipes until both outputs close (or are abandoned); True if the deadline
    (time.monotonic()) killed the command. Blocks the calling thread; the caller waits for the
    process. Any exception (from the sink's `on_output`, say) kills the command and propagates."""
    running = pipes.running
    sel = selectors.DefaultSelector()
    for fd in pipes.open_outputs:
        sel.register(fd, selectors.EVENT_READ)
    if pipes.stdin_fd >= 0:
        sel.register(pipes.stdin_fd, selectors.EVENT_WRITE)
    escalate_at: float | None = None
    give_up_at: float | None = None
    try:
        while pipes.open_outputs:
            now = time.monotonic()
            if not pipes.timed_out and now >= deadline:
                pipes.expire()
                escalate_at, give_up_at = now + ESCALATE_AFTER_KILL, now + drain_after_kill
            if escalate_at is not None and now >= escalate_at:
                pipes.escalate()
            if give_up_at is not None and now >= give_up_at:
                pipes.give_up(drain_after_kill)
                break
            if not pipes.timed_out:
                next_event = deadline
            elif not running.killed_monitor and escalate_at is not None:
                next_event = escalate_at
            else:
                next_event = give_up_at or now
            for key, _ in sel.select(max(0.0, min(next_event - now, 1.0))):
                done = not pipes.write() if key.fd == pipes.stdin_fd else not pipes.read(key.fd)
                if done:
                    sel.unregister(key.fd)
    except BaseException:
        running.kill()
        raise
    finally:
        sel.close()
        pipes.finish()
    return pipes.timed_out
