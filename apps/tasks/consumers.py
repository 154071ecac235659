"""The live-log websocket: /ws/trajectories/<id>/ streams a trajectory's new log lines.

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

from apps.tasks.models import Trajectory, TrajectoryLog
from apps.tasks.services import trajectory_group_name

logger = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
# Larger numbers cannot match a row, and a query with one fails (SQLite: OverflowError;
# PostgreSQL: out of range) instead of finding nothing. The URL converter accepts any digits.
MAX_SEQ = 2**31 - 1  # TrajectoryLog.seq is a PositiveIntegerField
MAX_ID = 2**63 - 1  # BigAutoField


@database_sync_to_async
def _refusal_code(user: Any, trajectory_id: int) -> int | None:
    # Permission before existence: an outsider learns nothing about which ids exist.
    if user is None or not user.is_authenticated or not user.is_active:
        return CLOSE_FORBIDDEN
    if not user.has_perm("tasks.view_trajectory"):
        return CLOSE_FORBIDDEN
    if trajectory_id > MAX_ID or not Trajectory.objects.filter(pk=trajectory_id).exists():
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


class TrajectoryLogConsumer(AsyncJsonWebsocketConsumer):
    """Relays one trajectory's "log.lines" group messages to a permitted, signed-in client."""

    RESEND_LIMIT = 500
    # The in-memory channel layer lives inside one process, so lines appended by a worker
    # process never reach it. With that layer the consumer also tails the table at this
    # interval; with a shared layer (Redis) group messages are the only path. None: never.
    tail_poll_seconds: float | None = 1.0

    trajectory_id: int
    group_name: str | None = None
    last_seq: int = 0
    _tail_task: asyncio.Task | None = None

    async def connect(self) -> None:
        self.trajectory_id = int(self.scope["url_route"]["kwargs"]["trajectory_id"])
        code = await _refusal_code(self.scope.get("user"), self.trajectory_id)
        if code is not None:
            await self.accept()
            await self.close(code=code)
            return
        self.group_name = trajectory_group_name(self.trajectory_id)
        # Join before reading the last seq: a line committed in between is then both in
        # the group and after last_seq, and the client drops the duplicate by seq.
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        self.last_seq = await _last_seq(self.trajectory_id)
        await self.accept()
        if self.tail_poll_seconds and isinstance(self.channel_layer, InMemoryChannelLayer):
            self._tail_task = asyncio.ensure_future(self._tail(self.tail_poll_seconds))

    async def disconnect(self, code: int) -> None:
        if self._tail_task is not None:
            self._tail_task.cancel()
            self._tail_task = None
        if self.group_name is not None:
            await self.channel_layer.group_discard(self.group_name, self.channel_name)
            self.group_name = None

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
