"""The live-log websocket: /ws/trajectories/<id>/ streams a trajectory's new log lines;
/ws/batches/<id>/ a batch's progress (BatchProgressConsumer, at the end).

Protocol (JSON text frames):
  server -> client  {"type": "lines", "lines": [line, ...]}              new lines, as they commit
                    {"type": "lines", "lines": [...], "after": n, "more": bool}   reply to a resend
                    {"type": "error", "error": "..."}                     a bad client message
  client -> server  {"after": n}   re-send the lines with seq > n (at most RESEND_LIMIT per reply)

A line is `TrajectoryLog.as_message()`. The page backfills over HTTP first, then subscribes
and sends {"after": last_seq}, which closes the gap between the backfill and the subscribe.
A line can arrive more than once (a resend, the tail below and a group message may overlap):
clients key lines by seq.
A refused subscription is accepted and then closed with 4403 (not signed in, or no
tasks.view_trajectory) or 4404 (no such trajectory), so the browser sees why and stops
reconnecting; a close before accept would reach it only as a failed handshake.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer

from apps.tasks.models import Batch, Trajectory, TrajectoryLog
from apps.tasks.services import batch_group_name, batch_progress_message, trajectory_group_name

logger = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
# Larger numbers cannot match a row, and a query with one fails (SQLite: OverflowError;
# PostgreSQL: out of range) instead of finding nothing. The URL converter accepts any digits.
MAX_SEQ = 2**31 - 1  # TrajectoryLog.seq is a PositiveIntegerField
MAX_ID = 2**63 - 1  # BigAutoField


@database_sync_to_async
def _refusal_code(user: Any, pk: int, model: Any = Trajectory, permission: str = "tasks.view_trajectory") -> int | None:
    # Permission before existence: an outsider learns nothing about which ids exist.
    if user is None or not user.is_authenticated or not user.is_active:
        return CLOSE_FORBIDDEN
    if not user.has_perm(permission):
        return CLOSE_FORBIDDEN
    if pk > MAX_ID or not model.objects.filter(pk=pk).exists():
        return CLOSE_NOT_FOUND
    return None


@database_sync_to_async
def _lines_after(trajectory_id: int, after: int, limit: int) -> list[dict[str, Any]]:
    rows = TrajectoryLog.objects.filter(trajectory_id=trajectory_id, seq__gt=after).order_by("seq")[:limit]
    return [row.as_message() for row in rows]


@database_sync_to_async
def _last_seq(trajectory_id: int) -> int:
    last = (
        TrajectoryLog.objects.filter(trajectory_id=trajectory_id)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return last or 0


class _GroupConsumer(AsyncJsonWebsocketConsumer):
    """A subscription to one channels group, refused with a close code, with an optional tail
    of the database (`_tail`) while the channel layer is the in-memory one."""

    tail_poll_seconds: float | None = None
    group_name: str | None = None
    _tail_task: asyncio.Task | None = None

    async def _refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    def _start_tail(self) -> None:
        if self.tail_poll_seconds and isinstance(self.channel_layer, InMemoryChannelLayer):
            self._tail_task = asyncio.ensure_future(self._tail(self.tail_poll_seconds))

    async def _tail(self, interval: float) -> None:
        raise NotImplementedError

    async def disconnect(self, code: int) -> None:
        if self._tail_task is not None:
            self._tail_task.cancel()
            self._tail_task = None
        if self.group_name is not None:
            await self.channel_layer.group_discard(self.group_name, self.channel_name)
            self.group_name = None


class TrajectoryLogConsumer(_GroupConsumer):
    """Relays one trajectory's "log.lines" group messages to a permitted, signed-in client."""

    RESEND_LIMIT = 500
    # The in-memory channel layer lives inside one process, so lines appended by a worker
    # process never reach it. With that layer the consumer also tails the table at this
    # interval; with a shared layer (Redis) group messages are the only path. None: never.
    tail_poll_seconds: float | None = 1.0

    trajectory_id: int
    last_seq: int = 0

    async def connect(self) -> None:
        self.trajectory_id = int(self.scope["url_route"]["kwargs"]["trajectory_id"])
        code = await _refusal_code(self.scope.get("user"), self.trajectory_id)
        if code is not None:
            await self._refuse(code)
            return
        self.group_name = trajectory_group_name(self.trajectory_id)
        # Join before reading the last seq: a line committed in between is then both in
        # the group and after last_seq, and the client drops the duplicate by seq.
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        self.last_seq = await _last_seq(self.trajectory_id)
        await self.accept()
        self._start_tail()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if self.group_name is None:
            return  # refused and closing: ignore whatever the client still sends
        try:
            content = json.loads(text_data) if text_data is not None else None
        except ValueError:
            content = None
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        after = content.get("after") if isinstance(content, dict) else None
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= MAX_SEQ:
            await self.send_json({"type": "error", "error": 'expected {"after": <seq, an integer >= 0>}'})
            return
        lines = await _lines_after(self.trajectory_id, after, self.RESEND_LIMIT)
        self._note_sent(lines)
        await self.send_json(
            {"type": "lines", "lines": lines, "after": after, "more": len(lines) == self.RESEND_LIMIT}
        )

    async def log_lines(self, event: dict[str, Any]) -> None:
        """Group message from `trajectory_log_append`, sent after its transaction commits."""
        if event.get("trajectory") != self.trajectory_id:
            return
        lines = list(event.get("lines") or [])
        self._note_sent(lines)
        await self.send_json({"type": "lines", "lines": lines})

    def _note_sent(self, lines: list[dict[str, Any]]) -> None:
        if lines:
            self.last_seq = max(self.last_seq, max(int(line["seq"]) for line in lines))

    async def _tail(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                lines = await _lines_after(self.trajectory_id, self.last_seq, self.RESEND_LIMIT)
            except Exception:  # a locked or restarting database: try again next tick
                logger.warning("live log tail of trajectory %s failed", self.trajectory_id, exc_info=True)
                continue
            if lines:
                self._note_sent(lines)
                await self.send_json({"type": "lines", "lines": lines})


class SnapshotConsumer(_GroupConsumer):
    """Sends `snapshot()` (a sync read, run in a thread) on subscribe, on each group message
    naming its object and, with the in-memory layer, every `tail_poll_seconds` — only when it
    differs from the last one sent. Send-only: a client message gets an error reply."""

    tail_poll_seconds: float | None = 2.0
    object_kwarg = ""  # the URL kwarg with the object's id
    model: Any = None
    permission = ""

    object_id: int
    last_sent: dict[str, Any] | None = None

    def group_for(self, object_id: int) -> str:
        raise NotImplementedError

    def snapshot(self, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """The message to send, from a group event, or read from the database when None."""
        raise NotImplementedError

    async def connect(self) -> None:
        self.object_id = int(self.scope["url_route"]["kwargs"][self.object_kwarg])
        code = await _refusal_code(self.scope.get("user"), self.object_id, self.model, self.permission)
        if code is not None:
            await self._refuse(code)
            return
        self.group_name = self.group_for(self.object_id)
        # Join before reading: a change committed in between is read and sent again, never lost.
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.accept()
        await self._send_if_changed(await database_sync_to_async(self.snapshot)())
        self._start_tail()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if self.group_name is not None:
            await self.send_json({"type": "error", "error": "this socket only sends; it takes no messages"})

    async def _relay(self, event: dict[str, Any], key: str) -> None:
        if event.get(key) == self.object_id:
            await self._send_if_changed(self.snapshot(event))

    async def _send_if_changed(self, message: dict[str, Any]) -> None:
        if message != self.last_sent:
            self.last_sent = message
            await self.send_json(message)

    async def _tail(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                message = await database_sync_to_async(self.snapshot)()
            except Exception:  # a locked or restarting database: try again next tick
                logger.warning("%s tail of %s failed", type(self).__name__, self.object_id, exc_info=True)
                continue
            await self._send_if_changed(message)


class BatchProgressConsumer(SnapshotConsumer):
    """A batch's progress for its page: {"type": "progress", "batch": id, "counts": {state: n},
    "labels": {state: label}, "total": n, "final": n} (the states of apps.tasks.selectors.TASK_STATES) on subscribe and after every committed change of a task's state
    (`batch_progress_changed` group messages, "batch.progress"). Refusals as for the live log:
    4403 (not signed in, no tasks.view_task), 4404 (no such batch). The page keeps its 3 s HTTP
    polling while the socket is not open."""

    object_kwarg, model, permission = "batch_id", Batch, "tasks.view_task"

    def group_for(self, object_id: int) -> str:
        return batch_group_name(object_id)

    def snapshot(self, event: dict[str, Any] | None = None) -> dict[str, Any]:
        event = event or batch_progress_message(self.object_id)
        return {"type": "progress", "batch": self.object_id, "counts": event["counts"], "labels": event["labels"],
                "total": event["total"], "final": event["final"]}

    async def batch_progress(self, event: dict[str, Any]) -> None:
        """Group message from `batch_progress_changed`, sent after its transaction commits."""
        await self._relay(event, "batch")
