"""The reward-hacking suite's stand-in model: the offline scripted model, except that it plays a
scripted call to a tool the request did not offer.

The offline model (apps.engines.offline_model) answers such a script with HTTP 400, which keeps
demos honest but hides what the platform does with the call. A twin that calls a tool which does
not exist needs the call to reach the loop, so this model offers every tool its scripts name
before the offline model's own logic runs; each call it played that the request did not offer is
listed in `model.unoffered`.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from apps.engines.offline_model import (
    MODEL_NAME,
    OfflineModelServer,
    Script,
    ScriptedModel,
    _offered_tools,
    parse_script,
)
from apps.engines.llm import LLMClient, Provider


class PermissiveScriptedModel(ScriptedModel):
    """ScriptedModel that plays calls to tools the request does not offer (see the module docstring): each
    request's `tools` get an entry for every tool name the scripts call, before the offline model
    answers it (so `requests` records the widened list)."""

    def __init__(self, scripts: Iterable[Script] = (), **kw: Any):
        super().__init__(scripts, **kw)
        self.unoffered: list[str] = []

    def chat(self, body: Any, headers: dict[str, str]) -> Any:
        tools = body.get("tools") if isinstance(body, dict) else None
        offered = set(_offered_tools(tools))
        named = {c.name for s in self.registry.by_hash.values() for step in s.steps for c in step.tool_calls}
        missing = sorted(named - offered)
        if missing:
            extra = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in missing]
            body = {**body, "tools": [*(tools or []), *extra]}
        reply = super().chat(body, headers)
        for choice in reply.body.get("choices", []):
            for c in choice["message"].get("tool_calls") or []:
                if c["function"]["name"] not in offered:
                    with self._lock:
                        self.unoffered.append(c["function"]["name"])
        return reply


@contextmanager
def running_standin(scripts: Iterable[dict[str, Any] | Script]) -> Iterator[OfflineModelServer]:
    """Serve PermissiveScriptedModel on a free loopback port in a background thread."""
    loaded = [s if isinstance(s, Script) else parse_script(s, where=f"scripts[{i}]", default_id=f"twin-{i}")
              for i, s in enumerate(scripts)]
    server = OfflineModelServer(PermissiveScriptedModel(loaded)).start()
    try:
        yield server
    finally:
        server.stop()


def standin_client(url: str) -> LLMClient:
    async def no_wait(_seconds: float) -> None:
        return None

    return LLMClient([Provider("offline", url, MODEL_NAME)], asleep=no_wait, rand=lambda: 0.5, limiters={})
