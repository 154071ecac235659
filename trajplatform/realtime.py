"""Realtime events: messages sent to channels groups (the consoles' websockets), after commit."""
from __future__ import annotations

from typing import Any, Callable

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer


def send_to_groups(groups: dict[str, Any], message: Callable[[Any], dict[str, Any]]) -> None:
    """Send `message(key)` to each channels group of {group name: key} (call it after commit).

    With the in-memory layer, which lives in this process only, groups nobody here has joined
    are skipped before their message is built (all of them, in a worker process: consumers
    elsewhere tail the database instead)."""
    layer = get_channel_layer()
    if layer is None:
        return
    if isinstance(layer, InMemoryChannelLayer):
        groups = {group: key for group, key in groups.items() if layer.groups.get(group)}
    messages = [(group, message(key)) for group, key in groups.items()]
    if not messages:
        return

    async def send_all() -> None:  # one hop into async code for all the groups
        for group, body in messages:
            await layer.group_send(group, body)

    async_to_sync(send_all)()
