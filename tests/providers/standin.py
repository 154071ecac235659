"""A loopback stand-in for one provider profile: the offline scripted model's answers, dressed and
policed the way that provider documents (docs/llm.md, "The loop and the profile").

    with running_standin(profiles.get("deepseek"), scripts) as standin:
        Provider("deepseek", standin.url, "deepseek-v4-flash")
        standin.refusals, standin.requests, standin.replies

It is the offline model's HTTP server (apps.engines.offline_model.OfflineModelServer) around a
different request -> reply object: every request is first checked against the profile's rules
(a 400 or 404 with the provider's kind of message when one is broken), then answered by the
ScriptedModel as model `scripted-reference`, then dressed: reasoning where the profile says it
arrives, tool calls written as text when the profile has no parser, ids as sloppy servers send
them (`ids`), usage with cache hits in the profile's own fields.
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from apps.engines.offline_model import MODEL_NAME, OfflineModelServer, Reply, ScriptedModel, _text_of
from apps.engines.profiles import Profile

SERVED_MODEL = "qwen3-8b"  # what a self-hosted stand-in (a profile without model names) serves
CACHE_BLOCK = 64  # cache hits are counted in blocks of this many tokens (DeepSeek's unit)
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def approx_tokens(text: str) -> int:
    """The stand-in's own count (the offline model's): a token per 4 characters of the JSON."""
    return max(1, math.ceil(len(text) / 4)) if text else 0


def _error(status: int, message: str, code: str) -> Reply:
    return Reply(status, {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": None}})


def _set_path(usage: dict[str, Any], path: str, value: int) -> None:
    *parents, leaf = path.split(".")
    node = usage
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _common_prefix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # the longest prefix both share, by bisection (string compares run in C)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Served:
    """One answered request: what the stand-in reported (for the cost check)."""

    conversation: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class StandIn:
    """The request -> reply logic of one profile's stand-in (thread-safe enough: one lock)."""

    def __init__(self, profile: Profile, scripted: ScriptedModel, *, ids: str = "given"):
        self.profile = profile
        self.scripted = scripted
        self.registry = scripted.registry
        self.ids = ids  # "given" | "empty" (every id "") | "repeat" (call_<n>, the same every reply)
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.refusals: list[tuple[int, str]] = []
        self.replies: list[Served] = []
        self.last_prompt: dict[str, str] = {}  # conversation -> its last request's messages JSON
        self.url = ""

    # -- what the provider says it accepts

    def thinks(self) -> bool:
        """The stand-in returns reasoning wherever the profile says it arrives."""
        return bool(self.profile.reasoning_fields or self.profile.think_tags)

    @staticmethod
    def reasoning_for(conversation: str, turn: int) -> str:
        return f"Turn {turn} of {conversation[:8]}: what do I know, what should I do next?"

    def check(self, body: dict[str, Any]) -> Reply | None:
        profile, name = self.profile, str(body.get("model"))
        if profile.replacement(name):
            return _error(400, "Model Not Exist", "invalid_request_error")
        if profile.models and not profile.knows(name):
            return _error(400, "Model Not Exist", "invalid_request_error")
        if not profile.models and name != SERVED_MODEL:
            return _error(404, f"The model `{name}` does not exist.", "model_not_found")
        if profile.max_tokens_param != "max_tokens" and "max_tokens" in body:
            return _error(400, f"Unsupported parameter: 'max_tokens' is not supported with this model. "
                               f"Use '{profile.max_tokens_param}' instead.", "unsupported_parameter")
        messages = body["messages"]
        if problem := self._pairing(messages):
            return _error(400, problem, "invalid_request_error")
        if problem := self._echo(messages):
            return _error(400, problem, "invalid_request_error")
        prompt = approx_tokens(json.dumps(messages, ensure_ascii=False) + json.dumps(body.get("tools") or []))
        window = profile.model(name).context_window
        wanted = int(body.get(profile.max_tokens_param) or 0)
        if prompt + wanted > window:
            return _error(400, f"This model's maximum context length is {window} tokens. However, you requested "
                               f"{prompt + wanted} tokens ({prompt} in the messages, {wanted} in the completion).",
                          "context_length_exceeded")
        return None

    @staticmethod
    def _pairing(messages: list[dict[str, Any]]) -> str:
        """OpenAI's rule, which every OpenAI-compatible server shares: each assistant tool call is
        answered by a tool message with its id before anything else, and a tool message answers one."""
        open_ids: list[str] = []
        seen: set[str] = set()
        for m in messages:
            role = m.get("role")
            if role == "tool":
                if m.get("tool_call_id") not in open_ids:
                    return (f"Invalid parameter: messages with role 'tool' must be a response to a preceding message "
                            f"with 'tool_calls' (tool_call_id {m.get('tool_call_id')!r})")
                open_ids.remove(m["tool_call_id"])
                continue
            if open_ids:
                return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                        f"'tool_call_id'. The following tool_call_ids did not have response messages: {open_ids}")
            if role == "assistant":
                for call in m.get("tool_calls") or []:
                    if not call.get("id") or call["id"] in seen:
                        return f"Invalid 'messages': tool call id {call.get('id')!r} is empty or repeated"
                    seen.add(call["id"])
                    open_ids.append(call["id"])
        return ""

    def _echo(self, messages: list[dict[str, Any]]) -> str:
        rule, fld = self.profile.reasoning_echo, self.profile.reasoning_echo_field
        conversation = self.conversation(messages)
        turn = 0
        for m in messages:
            if m.get("role") != "assistant":
                continue
            turn += 1
            present = [k for k in dict.fromkeys((*REASONING_KEYS, fld)) if k and k in m]
            if rule == "never":
                if present:
                    return f"Invalid 'messages': unknown field {present[0]!r} in an assistant message"
                continue
            required = self.thinks() and (rule == "always" or m.get("tool_calls"))
            if required and m.get(fld) != self.reasoning_for(conversation, turn):
                return f"The {fld} in the thinking mode must be passed back to the API."
        return ""

    @staticmethod
    def conversation(messages: list[dict[str, Any]]) -> str:
        first = next((m for m in messages if m.get("role") == "user"), {})
        return hashlib.sha256(_text_of(first.get("content")).encode()).hexdigest()[:16]

    # -- the offline model's answer, dressed as the provider sends it

    def models(self) -> Reply:
        names = list(self.profile.models) or [SERVED_MODEL]
        return Reply(200, {"object": "list", "data": [{"id": n, "object": "model", "owned_by": self.profile.id}
                                                      for n in names]})

    def chat(self, body: Any, headers: dict[str, str]) -> Reply:
        with self.lock:
            self.requests.append(body)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "the body must be a JSON object with a `messages` list", "invalid_request_error")
        refused = self.check(body)
        if refused is not None:
            with self.lock:
                self.refusals.append((refused.status, refused.body["error"]["message"]))
            return refused
        reply = self.scripted.chat({**body, "model": MODEL_NAME}, {})
        if reply.status != 200:
            return reply
        return self.dress(body, reply)

    def dress(self, body: dict[str, Any], reply: Reply) -> Reply:
        profile = self.profile
        messages = body["messages"]
        conversation = self.conversation(messages)
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        choice = reply.body["choices"][0]
        message = dict(choice["message"])
        calls = [dict(c) for c in message.pop("tool_calls", None) or []]
        content = message.get("content") or ""
        if self.thinks():
            reasoning = self.reasoning_for(conversation, turn)
            if profile.reasoning_fields:
                message[profile.reasoning_fields[0]] = reasoning
            else:
                content = f"<think>\n{reasoning}\n</think>\n\n{content}"
        if calls and profile.text_tool_format:
            content = (content + "\n" + render_text_calls(calls, profile.text_tool_format)).strip()
            calls = []
            choice = {**choice, "finish_reason": "stop"}
        for n, call in enumerate(calls):
            if self.ids == "empty":
                call["id"] = ""
            elif self.ids == "repeat":
                call["id"] = f"call_{n}"
        message["content"] = content or None
        if calls:
            message["tool_calls"] = calls
        prompt_json = json.dumps(messages, ensure_ascii=False)
        usage = dict(reply.body["usage"])
        with self.lock:
            previous = self.last_prompt.get(conversation, "")
            self.last_prompt[conversation] = prompt_json
        cached = min(usage["prompt_tokens"], approx_tokens(prompt_json[:_common_prefix(previous, prompt_json)])
                     // CACHE_BLOCK * CACHE_BLOCK)
        if profile.cached_usage_paths:
            _set_path(usage, profile.cached_usage_paths[0], cached)
            if profile.cached_usage_paths[0] == "prompt_cache_hit_tokens":
                usage["prompt_cache_miss_tokens"] = usage["prompt_tokens"] - cached
        else:
            cached = 0
        with self.lock:
            self.replies.append(Served(conversation, usage["prompt_tokens"], cached, usage["completion_tokens"]))
        out = {**reply.body, "model": body["model"], "choices": [{**choice, "message": message}], "usage": usage}
        return Reply(200, out)

    def cost_usd(self, conversation: str, model: str) -> Decimal:
        """What the provider's price list says the conversation's calls cost."""
        spec = self.profile.model(model)
        total = Decimal(0)
        for served in self.replies:
            if served.conversation != conversation:
                continue
            cached_price = spec.price_cached_input if spec.price_cached_input is not None else spec.price_input
            total += (Decimal(served.prompt_tokens - served.cached_tokens) * (spec.price_input or 0)
                      + Decimal(served.cached_tokens) * (cached_price or 0)
                      + Decimal(served.completion_tokens) * (spec.price_output or 0)) / Decimal(1_000_000)
        return total


def render_text_calls(calls: list[dict[str, Any]], fmt: str) -> str:
    """Tool calls as a model writes them when no server-side parser reads them."""
    def arguments(call: dict[str, Any]) -> Any:
        raw = call["function"]["arguments"]
        try:
            return json.loads(raw)
        except (TypeError, json.JSONDecodeError):
            return raw

    if fmt == "hermes":
        return "\n".join(
            f"<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': arguments(c)})}\n</tool_call>"
            for c in calls)
    if fmt == "llama_json":
        return "<|python_tag|>" + "; ".join(
            json.dumps({"name": c["function"]["name"], "parameters": arguments(c)}) for c in calls)
    if fmt == "mistral":
        return "[TOOL_CALLS]" + json.dumps([{"name": c["function"]["name"], "arguments": arguments(c)} for c in calls])
    raise ValueError(fmt)


@contextmanager
def running_standin(profile: Profile, scripted: ScriptedModel, *, ids: str = "given") -> Iterator[StandIn]:
    standin = StandIn(profile, scripted, ids=ids)
    server = OfflineModelServer(standin).start()  # type: ignore[arg-type]  # the same two methods
    standin.url = server.url
    try:
        yield standin
    finally:
        server.stop()
