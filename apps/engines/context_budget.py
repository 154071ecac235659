"""The context budget of one model request: count its tokens, and fit it under the model's window.

    counter = TokenCounter.for_model("Qwen/Qwen3-8B")
    fitted = fit(messages, tools, counter=counter, limit=window - output_budget, elidable=[3, 5, 7])

Counting. When the model's tokenizer is on this machine it is used, never downloaded: a
`tokenizer.json` in the directory the model name points to (servers that serve a local path),
or in the Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)
under `models--ORG--NAME/snapshots/*/` (a name without an org matches any org). It is read with
the `tokenizers` library. Otherwise the count is an estimate meant never to fall short: ASCII
text at CHARS_PER_TOKEN (3.0) characters a token — English prose is about 4 with the BPE
vocabularies of current models and JSON, code and shell output 3 to 3.5, so 3.0 overcounts them
— every other character one token (CJK text runs 1 to 1.5 characters a token), MESSAGE_TOKENS (4)
per message for the chat template's role and separators, IMAGE_TOKENS (1,000) per image. The
tools' JSON schemas count as text. The loop then multiplies by what the server reported last
time: `correction` (the previous request's usage.prompt_tokens over its count, when above 1).

Fitting. A request over `limit` (the model's context window minus the output budget) has its
oldest observations elided — tool results, text-path results, screenshots, oldest first; the
task and the system prompt never — each replaced by a marker that says what was removed,
until it is under ELIDE_TO (85%) of the limit, so the next turns extend the request again
instead of eliding one observation per turn (each elision breaks the provider's prompt cache
from that message on). A request that does not fit with every elidable observation elided raises
ContextOverflow: the episode ends as a config error naming the numbers, before any request.
"""
from __future__ import annotations

import functools
import glob
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHARS_PER_TOKEN = 3.0
MESSAGE_TOKENS = 4
IMAGE_TOKENS = 1000
ELIDE_TO = 0.85
ELIDED_MARK = "[observation elided to fit the model's context window"


class ContextOverflow(Exception):
    """The request cannot be fitted under the limit."""

    def __init__(self, tokens: int, limit: int, detail: str):
        super().__init__(detail)
        self.tokens, self.limit = tokens, limit


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def tokenizer_file(model: str) -> str | None:
    """The local tokenizer.json for a model name, or None (nothing is downloaded)."""
    if not model:
        return None
    direct = Path(model) / "tokenizer.json"
    if os.path.isabs(model) and direct.is_file():
        return str(direct)
    org, _, name = model.rpartition("/")
    pattern = f"models--{glob.escape(org) if org else '*'}--{glob.escape(name)}"
    found = sorted(glob.glob(str(_hub_cache() / pattern / "snapshots" / "*" / "tokenizer.json")))
    return found[-1] if found else None


@functools.lru_cache(maxsize=32)
def _load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer  # deferred: heavy (tokenizers), only when a tokenizer file is named

    return Tokenizer.from_file(path)


def estimate_tokens(text: str) -> int:
    """The calibrated estimate for a text without its tokenizer (see the module docstring)."""
    if not text:
        return 0
    other = sum(1 for ch in text if ord(ch) > 127) if not text.isascii() else 0
    return math.ceil((len(text) - other) / CHARS_PER_TOKEN) + other


def _message_text(message: dict[str, Any]) -> tuple[str, int]:
    """(the text a message contributes, its images)."""
    parts: list[str] = []
    images = 0
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                images += 1
    elif content is not None:
        parts.append(str(content))
    for key, value in message.items():
        if key in ("content", "role"):
            continue
        parts.append(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return "\n".join(parts), images


@dataclass
class TokenCounter:
    """Counts a request's tokens with the model's tokenizer, else the estimate."""

    model: str
    tokenizer_path: str | None = None
    correction: float = 1.0  # usage.prompt_tokens / our count of the last request, when above 1

    @classmethod
    def for_model(cls, model: str) -> "TokenCounter":
        return cls(model, tokenizer_file(model))

    @property
    def method(self) -> str:
        return "tokenizer" if self.tokenizer_path else "estimate"

    def text(self, text: str) -> int:
        if not text:
            return 0
        if self.tokenizer_path:
            return len(_load_tokenizer(self.tokenizer_path).encode(text, add_special_tokens=False).ids)
        return estimate_tokens(text)

    def message(self, message: dict[str, Any]) -> int:
        text, images = _message_text(message)
        return MESSAGE_TOKENS + self.text(text) + images * IMAGE_TOKENS

    def raw_request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        tools_tokens = self.text(json.dumps(tools, ensure_ascii=False)) if tools else 0
        return tools_tokens + sum(self.message(m) for m in messages)

    def request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        return math.ceil(self.raw_request(messages, tools) * self.correction)

    def observe(self, counted_raw: int, reported: int) -> None:
        """Learn from the server's usage.prompt_tokens for a request we counted `counted_raw`."""
        if counted_raw > 0 and reported > 0:
            self.correction = max(1.0, reported / counted_raw)


def elided_text(message: dict[str, Any]) -> str:
    text, images = _message_text({"content": message.get("content")})
    what = f"{len(text)} characters" + (f" and {images} image(s)" if images else "")
    name = f" of {message['name']}" if message.get("name") else ""
    return f"{ELIDED_MARK}: {what}{name} removed]"


def is_elided(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(ELIDED_MARK)


def fit(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    counter: TokenCounter,
    limit: int,
    elidable: list[int],
    sent: Any = None,
) -> tuple[int, list[int]]:
    """Elide observations of `messages` (in place; `elidable` are their indices, oldest first)
    until the request fits; returns (its token count, the indices elided now). `sent(messages)`
    gives the form the request takes (the reasoning echo) for counting; default: as stored."""
    view = sent or (lambda ms: ms)
    tokens = counter.request(view(messages), tools)
    if tokens <= limit:
        return tokens, []
    target = int(limit * ELIDE_TO)
    elided: list[int] = []
    for index in elidable:
        if tokens <= target:
            break
        message = messages[index]
        if is_elided(message):
            continue
        messages[index] = replaced = {**message, "content": elided_text(message)}
        elided.append(index)
        # Observations are sent as stored (the echo rule touches assistant turns only).
        tokens -= math.floor((counter.message(message) - counter.message(replaced)) * counter.correction)
    if tokens > limit:
        raise ContextOverflow(tokens, limit, (
            f"the request needs about {tokens} tokens ({counter.method}) with every earlier observation elided, "
            f"more than the {limit} the model's context allows after the output budget"))
    return tokens, elided
