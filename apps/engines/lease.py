"""An episode's sandbox, from its creation to its destruction (the agent loop's `SandboxLease`).

The sandbox is made and set up while the model answers the first turn (`start`: neither needs
the other); the first tool call waits for it (`ready`). It is destroyed in every case (`destroy`,
shielded, so a hard cancel of the episode still lets it run to its end); its SandboxRecord is
marked by the destroy, or by the caller when it passes `on_destroyed`, as a worker does to write
it with the episode's result. A sub-episode working in its parent's sandbox (`shared`) neither
makes nor destroys one. The synchronous sandbox calls run in worker threads.
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from apps.engines.runtime import InfrastructureError, SceneRuntime, SetupError
from apps.engines.runtime import in_thread as _in_thread
from apps.engines.sandboxes import (
    SandboxError,
    SandboxNotFound,
    SandboxSpecUnsupported,
    SandboxUnavailable,
    acquire,
    get_backend,
)
from apps.engines.steps import ERROR, Stop

logger = logging.getLogger("apps.engines.agent")

# How long the liveness probe after an unexplained sandbox error may take.
PROBE_TIMEOUT_S = 15.0
# Sandboxes an event loop makes (and sets up) at once. A worker starting a hundred episodes
# together would otherwise run a hundred creations (database rows, directories, cgroups) in
# as many threads, all wanting the interpreter lock the loop needs to send the first model
# requests; a few at a time finish as soon, the model answers the first turn meanwhile.
# The same for destroying them: episodes that end together would queue their destroys'
# database writes behind each other and ahead of storing their results.
SANDBOXES_AT_ONCE = {"start": 4, "destroy": 4}
_sandbox_slots: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]]" = (
    weakref.WeakKeyDictionary()
)

# The lost-sandbox errors: the episode ends as a retryable infrastructure error.
LOST = (SandboxNotFound, SandboxUnavailable, InfrastructureError)


def _sandbox_slot(what: str) -> asyncio.Semaphore:
    """This event loop's semaphore for sandbox "start" or "destroy" (SANDBOXES_AT_ONCE)."""
    slots = _sandbox_slots.setdefault(asyncio.get_running_loop(), {})
    if what not in slots:
        slots[what] = asyncio.Semaphore(SANDBOXES_AT_ONCE[what])
    return slots[what]


def lost(exc: BaseException, when: str) -> Stop:
    """The end of an episode whose sandbox (or a tool server, a sub-episode's LLM) failed under it."""
    # An InfrastructureError names its own trouble (a tool server, a sub-episode's LLM): not the sandbox.
    what = "failed" if isinstance(exc, InfrastructureError) else "sandbox lost"
    return Stop(ERROR, f"infrastructure: {what} {when}: {exc}", kind="infrastructure", retryable=True)


Emit = Callable[[str, str, "dict[str, Any] | None"], Awaitable[None]]


class SandboxLease:
    def __init__(self, *, backend: Any, trajectory: Any, emit: Emit, shared: Any = None,
                 on_destroyed: Callable[[Any], None] | None = None):
        self.backend = backend  # a backend, a backend name, or None for SANDBOX_BACKEND
        self.trajectory = trajectory
        self.emit = emit
        self.sandbox: Any = shared
        self.owned = shared is None
        self.on_destroyed = on_destroyed
        # EpisodeResult.sandbox: id, backend, record_id, downgrades, destroyed (empty without one)
        self.info: dict[str, Any] = {}
        self.task: asyncio.Task[None] | None = None

    def start(self, runtime: SceneRuntime, config: dict[str, Any]) -> None:
        """Make and set up the sandbox in the background (a few at a time per event loop)."""
        self.task = asyncio.create_task(self._start(runtime, config))

    async def _start(self, runtime: SceneRuntime, config: dict[str, Any]) -> None:
        async with _sandbox_slot("start"):
            await self._start_now(runtime, config)

    async def _start_now(self, runtime: SceneRuntime, config: dict[str, Any]) -> None:
        if not self.owned:
            return  # a sub-episode working in its parent's sandbox, which is set up
        try:
            spec = runtime.sandbox_spec(config)
        except SandboxError as exc:
            raise Stop(ERROR, f"invalid sandbox settings: {exc}", kind="config") from None
        if spec is None:
            return
        backend = self.backend
        try:
            if isinstance(backend, str):
                backend = get_backend(backend)
            self.sandbox = await _in_thread(acquire, spec, trajectory=self.trajectory, backend=backend)
        except SandboxSpecUnsupported as exc:
            await self.emit("error", f"sandbox not available for this task: {exc}", {"error_kind": "config"})
            raise Stop(ERROR, f"sandbox not available for this task: {exc}", kind="config") from None
        except Exception as exc:
            if not isinstance(exc, (SandboxError, OSError)):
                logger.exception("sandbox creation failed")
            await self.emit("error", f"sandbox creation failed: {exc}", {"error_kind": "infrastructure"})
            raise Stop(ERROR, f"infrastructure: sandbox creation failed: {exc}", kind="infrastructure",
                       retryable=True) from None
        sandbox = self.sandbox
        self.info.update({
            "id": sandbox.id, "backend": sandbox.backend_name, "record_id": sandbox.record_id,
            "downgrades": list(sandbox.downgrades), "destroyed": False,
        })
        await self.emit("system", f"sandbox {sandbox.backend_name}:{sandbox.id} ready", dict(self.info))
        try:
            await _in_thread(runtime.setup, sandbox, config)
        except LOST as exc:
            raise lost(exc, "during set-up") from None
        except (SetupError, SandboxError) as exc:
            await self.emit("error", f"set-up failed: {exc}", {"error_kind": "config"})
            raise Stop(ERROR, f"set-up failed: {exc}", kind="config") from None
        await self.emit("system", "set-up done", {})

    def failed(self) -> bool:
        """Whether making or setting up the sandbox has already failed."""
        return self.task is not None and self.task.done() and self.task.exception() is not None

    async def ready(self) -> None:
        """Wait for the sandbox; raises what made or set it up raised (a Stop)."""
        if self.task is not None:
            await self.task

    async def settled(self) -> None:
        """Wait for the start to end, however it ends (it may still hand over a sandbox to destroy)."""
        if self.task is not None and not self.task.done():
            await asyncio.wait([self.task])

    async def alive(self) -> bool:
        """Whether the sandbox still runs a command (after an error that did not say)."""
        if self.sandbox is None:
            return False
        try:
            await _in_thread(self.sandbox.run, "true", timeout=PROBE_TIMEOUT_S)
            return True
        except SandboxError:
            return False

    async def destroy(self) -> None:
        sandbox = self.sandbox
        if sandbox is None or not self.owned:
            return
        try:
            # Shielded: a hard cancel of the episode still lets the destroy run to its end.
            async with _sandbox_slot("destroy"):
                destroying = asyncio.ensure_future(_in_thread(sandbox.destroy, record=self.on_destroyed is None))
                if self.on_destroyed is not None:
                    # From the future, so that a cancelled episode still reports it once it is gone.
                    destroying.add_done_callback(self._report_destroyed)
                await asyncio.shield(destroying)
            self.info["destroyed"] = True
            await self.emit("system", f"sandbox {sandbox.id} destroyed", {"id": sandbox.id})
        except Exception as exc:
            # The reconciler reaps it (its TTL and its finished owner); say so, don't hide it.
            logger.warning("destroying sandbox %s failed: %s", sandbox.id, exc)
            self.info["destroy_error"] = str(exc)

    def _report_destroyed(self, destroying: asyncio.Future[Any]) -> None:
        assert self.on_destroyed is not None  # only added then
        if not destroying.cancelled() and destroying.exception() is None:
            try:
                self.on_destroyed(self.sandbox)
            except Exception:
                logger.exception("on_sandbox_destroyed failed; the reconciler will mark sandbox %s", self.sandbox.id)
