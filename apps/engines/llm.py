"""The LLM client: chat completions against any OpenAI-compatible endpoint, sync and asyncio.

    client = LLMClient()                       # providers from settings (resolve_providers)
    result = client.chat(messages, tools=tools, temperature=0.7,
                         cache_key_extra=cache_identity(trajectory.uuid))
    result.message      # {"role": "assistant", "content": ..., "tool_calls": [...]} (plain dicts)
    result.provider, result.model, result.usage, result.cost_usd, result.cached, result.attempts
    result = await client.achat(...)           # the same, on openai.AsyncOpenAI

What it does around the openai SDK (which runs with max_retries=0; the retries are ours):

* Providers: `resolve_providers()` (below) turns settings into an ordered list; the first is
  the primary, the rest are fallbacks tried only after the primary has failed all its retries.
  Every result names the provider and model that produced it. There is no silent switch to the
  offline scripted model: it is used only when nothing else is configured, or when it is named
  in LLM_PROVIDERS.
* Retries: 429, 5xx, 408/409, timeouts, connection errors and unparseable responses are
  retried up to LLM_MAX_RETRIES times. The wait is the server's Retry-After (or
  retry-after-ms) when it sends one, else exponential backoff with jitter:
  base = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**(attempt-1)), wait = base * (0.5 + 0.5 * random()).
  A Retry-After longer than MAX_RETRY_AFTER_S is not waited for: the call fails with
  LLMRateLimited(retry_after=...) so the job can be re-queued instead of holding a worker.
* Adaptive concurrency: one AIMD limiter per provider (shared by every client in the process)
  caps requests in flight: the limit halves on a 429 (once per congestion window) and grows by
  one after `increase_every` consecutive successes, between 1 and LLM_MAX_CONCURRENCY.
* Cache: successful responses are stored in caches["llm"] under sha256 of the canonical JSON of
  (model, messages, tools, tool_choice, temperature, top_p, max_tokens, cache_key_extra). A
  resumed batch or a replay gets the stored answer without an HTTP request (`cached=True`,
  `attempts=0`). `cache_key_extra` must differ between samples that should differ: pass the
  trajectory's identity, `cache_identity(trajectory.uuid)`, or every sample of a task at
  temperature > 0 would replay the first one's answers. Never a primary key: the cache is
  shared by every database on the machine (or the Redis), and a fresh database numbers its
  rows from 1 again, so a new trajectory would be served another database's answers. A
  retried or resumed trajectory (same UUID) replays its own answers; replaying another
  trajectory's is explicit (the episode's `replay_of` config key, recorded as such).
  Without Redis the cache is one SQLite file (LLMResponseCache). A reply is stored before
  chat/achat return it (see _cache_io).
  `cache_lookup=False` skips the lookup and still stores the reply: the agent passes it once
  its episode has had a miss, since every later request carries that fresh reply and cannot
  have been cached (`use_cache=False` neither reads nor writes).
* Providers' profiles (apps/engines/profiles.py, profiles.json, docs/llm.md) say what each
  provider accepts: the request is shaped by it (shape_request), cached input tokens are read
  from its usage fields, and the offline stand-in alone gets the route header (llm_route).
* Cost: `cost_usd` = (uncached input x input + cached input x cached-input + output x output
  price) per million tokens, from the profile's model (settings.LLM_PRICES, if defined, adds or
  overrides entries, longest model-name prefix wins). Unknown models and the offline model cost
  0. On a cache hit cost_usd is what the response cost when it was produced; nothing was paid
  again.
* Secrets: API keys never appear in errors, logs or results. Errors are raised without the SDK
  exception chained (its request carries the Authorization header), their text goes through
  `trajplatform.redaction.redact`, and a RedactingFilter sits on this module's logger and on
  the "openai" logger.

Errors are `LLMError` subclasses: LLMRateLimited, LLMTimeout, LLMUnavailable (5xx, connection
failure, every provider down), LLMBadRequest (other 4xx: not retried), LLMResponseInvalid.
`err.retryable` tells a job whether trying again later can help.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import hashlib
import itertools
import json
import logging
import os
import pickle
import random
import sqlite3
import ssl
import threading
import time
import uuid
import weakref
import zlib
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any
from urllib.parse import urlparse

import httpcore2  # noqa: F401  (httpx2 imports it on an event loop's first request, ~15 ms of its time)
import httpx2
import openai
from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.core.cache.backends.filebased import FileBasedCache
from django.core.exceptions import ImproperlyConfigured

from apps.engines import profiles
from trajplatform.redaction import install_log_filter, redact, register_secret

logger = logging.getLogger(__name__)
install_log_filter(__name__)
install_log_filter("openai")

OFFLINE_MODEL = "scripted-reference"
OFFLINE_API_KEY = "offline-no-key"
CACHE_VERSION = 1

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
MAX_RETRY_AFTER_S = 120.0
INCREASE_EVERY = 10

# -- providers ------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Provider:
    """One OpenAI-compatible endpoint, the model to ask for there, and the profile
    (apps/engines/profiles.json) saying what the endpoint accepts; `profile` defaults to the
    provider's name when that is a profile id, else "custom"."""

    name: str
    base_url: str
    model: str
    api_key: str = ""
    profile: str = ""

    def __post_init__(self) -> None:
        register_secret(self.api_key)
        if not self.profile:
            object.__setattr__(self, "profile", self.name if self.name in profiles.all_profiles() else "custom")

    @property
    def spec(self) -> profiles.Profile:
        return profiles.get(self.profile)

    def __repr__(self) -> str:
        key = "[set]" if self.api_key and self.api_key != OFFLINE_API_KEY else "[none]"
        return (f"Provider(name={self.name!r}, base_url={self.base_url!r}, model={self.model!r}, "
                f"profile={self.profile!r}, api_key={key})")


def named_providers() -> dict[str, profiles.Profile]:
    """The names LLM_PROVIDERS may list: every profile with variables of its own (not "custom")."""
    return {pid: p for pid, p in profiles.all_profiles().items() if p.url_var != "LLM_BASE_URL"}


def __getattr__(name: str) -> Any:
    # Read from the profiles on each access (LLM_PROFILES may change them).
    if name == "NAMED_PROVIDERS":
        return named_providers()
    if name == "DEEPSEEK_MODEL":  # the default model of LLM_API_KEY alone
        return profiles.key_only().default_model
    if name == "DEEPSEEK_BASE_URL":
        return profiles.key_only().default_url
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


VLLM_API_KEY_VAR = "VLLM_API_KEY"  # kept for importers; the profiles' optional_key_var say it


def _env(name: str) -> str:
    return os.environ.get(name, "").strip() if name else ""


def _offline_provider(model: str = "") -> Provider:
    spec = profiles.offline()
    return Provider(spec.id, settings.OFFLINE_MODEL_URL, model or spec.default_model or OFFLINE_MODEL, OFFLINE_API_KEY,
                    profile=spec.id)


def _named_provider(spec: profiles.Profile) -> Provider | None:
    """The provider a profile's own variables configure, or None when they do not."""
    if spec.routing_headers:
        return _offline_provider()
    key = _env(spec.key_var or "")
    url = _env(spec.url_var)
    if spec.key_var:
        if not key:
            return None
    elif not url:
        return None
    url = url or spec.default_url or ""
    if not url:
        raise ImproperlyConfigured(f"{spec.key_var} is set but {spec.url_var} is not (the {spec.id} endpoint)")
    model = _env(spec.model_var) or spec.default_model or ""
    if not model:
        raise ImproperlyConfigured(f"{spec.url_var} is set but {spec.model_var} is not (the served model's name)")
    return Provider(spec.id, url, model, key or _env(spec.optional_key_var or "") or "EMPTY", profile=spec.id)


def resolve_providers() -> list[Provider]:
    """The providers to use, primary first, from settings and each provider's own variables.

    Every provider family has a profile (apps/engines/profiles.json, docs/llm.md) naming its
    variables: DEEPSEEK_API_KEY / DEEPSEEK_BASE_URL / DEEPSEEK_MODEL, OPENAI_*, GEMINI_*,
    ANTHROPIC_*, MOONSHOT_*, ZHIPU_*, OPENROUTER_*; VLLM_BASE_URL / VLLM_MODEL / VLLM_API_KEY,
    SGLANG_*, OLLAMA_BASE_URL / OLLAMA_MODEL. A provider with a key variable is configured when
    that key is set (URL and model then default to the profile's); one without (a server of
    your own) when its URL variable is set, and it then needs its model variable.

    * LLM_PROVIDERS set ("deepseek,gemini,openai"): a comma-separated priority list of profile
      ids (including vllm-noparser / sglang-noparser, which read the VLLM_* / SGLANG_*
      variables, and "offline", always configured: the scripted model at OFFLINE_MODEL_URL).
      Names that are not configured are skipped; the first configured one is the primary, the
      others are fallbacks in order. LLM_BASE_URL, LLM_API_KEY and LLM_MODEL are ignored in this
      mode. No configured name is an error.
    * Else LLM_BASE_URL / LLM_API_KEY / LLM_MODEL, if either of the first two is set, form the
      single provider. A key without a URL means DeepSeek; LLM_MODEL defaults to the profile's
      default model. The provider and its profile are named after the URL's host (a profile's
      `hosts`), else LLM_PROFILE, else "custom".
    * Else every provider whose own variables configure it, in the profiles' order (the first
      is the primary): DEEPSEEK_API_KEY alone configures DeepSeek with its current model.
    * With none of these: the offline scripted model ("offline", model scripted-reference) at
      OFFLINE_MODEL_URL, which the rollouts name loudly. LLM_MODEL may then only name the
      scripted model (e.g. "scripted-reference+fault=429"); any other model is a configuration
      error, not a reason to fall back to the stand-in.
    """
    named = named_providers()
    names = [n.strip().lower() for n in (settings.LLM_PROVIDERS or "").split(",") if n.strip()]
    if names:
        unknown = [n for n in names if n not in named]
        if unknown:
            raise ImproperlyConfigured(
                f"LLM_PROVIDERS names unknown provider(s) {', '.join(unknown)}; known: {', '.join(named)}"
            )
        providers = [p for p in (_named_provider(named[n]) for n in dict.fromkeys(names)) if p is not None]
        if not providers:
            needs = ", ".join(p.key_var or p.url_var for p in named.values() if p.auto_configure)
            raise ImproperlyConfigured(
                f"LLM_PROVIDERS={settings.LLM_PROVIDERS!r} but none of them is configured (set one of {needs})"
            )
        return providers

    base_url, api_key, model = settings.LLM_BASE_URL.strip(), settings.LLM_API_KEY.strip(), settings.LLM_MODEL.strip()
    if base_url or api_key:
        if base_url:
            spec = profiles.for_host(urlparse(base_url).hostname or "") or profiles.get(
                getattr(settings, "LLM_PROFILE", "") or "custom")
        else:
            spec = profiles.key_only()
            base_url = spec.default_url or ""
        name = spec.id if spec.hosts or spec.id == "custom" else "custom"
        # No model and no profile default: an error at the batch's start (check_models) and at
        # the first call, never a guessed name.
        return [Provider(name, base_url, model or spec.default_model or "", api_key or "EMPTY", profile=spec.id)]

    providers = [p for p in (_named_provider(spec) for spec in named.values() if spec.auto_configure) if p is not None]
    if providers:
        return providers
    if model and not model.startswith(OFFLINE_MODEL):
        raise ImproperlyConfigured(
            f"LLM_MODEL={model!r} but no provider is configured (neither LLM_BASE_URL, LLM_API_KEY nor a "
            "provider's own key such as DEEPSEEK_API_KEY); set one to use a real provider "
            "(unset LLM_MODEL for the offline scripted model)"
        )
    return [_offline_provider(model)]


# -- the model check before a batch starts ------------------------------------------------


class ModelConfigError(ImproperlyConfigured):
    """A configured model that cannot answer: retired (the message names its replacement), not
    served by the provider, or missing. Raised before any sandbox or rollout."""


MODEL_LIST_TTL_S = 300.0
_model_lists: dict[tuple[str, str], tuple[float, frozenset[str] | None, str]] = {}
_model_lists_lock = threading.Lock()


def served_models(provider: Provider, timeout: float | None = None) -> tuple[frozenset[str] | None, str]:
    """(the model ids GET /models lists, "") or (None, why the list could not be had). Kept for
    MODEL_LIST_TTL_S per endpoint and key; an endpoint that does not answer in `timeout` (default
    LLM_MODEL_CHECK_TIMEOUT_S) gives None, never an error."""
    key = (provider.base_url, hashlib.sha256(provider.api_key.encode()).hexdigest())
    now = time.monotonic()
    with _model_lists_lock:
        known = _model_lists.get(key)
    if known is not None and now - known[0] < MODEL_LIST_TTL_S:
        return known[1], known[2]
    url = provider.base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {provider.api_key}"} if provider.api_key and provider.api_key != "EMPTY" else {}
    ids: frozenset[str] | None = None
    why = ""
    try:
        response = httpx2.get(url, headers=headers, follow_redirects=False,
                              timeout=timeout if timeout is not None else settings.LLM_MODEL_CHECK_TIMEOUT_S)
        if response.status_code != 200:
            why = f"GET /models answered HTTP {response.status_code}"
        else:
            data = response.json().get("data")
            if not isinstance(data, list):
                why = "GET /models answered without a `data` list"
            else:
                ids = frozenset(str(m["id"]) for m in data if isinstance(m, dict) and m.get("id"))
    except (httpx2.HTTPError, ValueError, AttributeError) as exc:
        why = redact(f"GET /models failed: {type(exc).__name__}")
    with _model_lists_lock:
        _model_lists[key] = (now, ids, why)
    return ids, why


def reset_model_lists() -> None:
    """Forget the model lists served_models() keeps (tests; a settings change)."""
    with _model_lists_lock:
        _model_lists.clear()


def _is_served(name: str, ids: frozenset[str]) -> bool:
    return bool({name, name.rsplit("/", 1)[-1], f"models/{name}"} & ids) or any(i.rsplit("/", 1)[-1] == name for i in ids)


def check_models(models: Sequence[str] = (), providers: Sequence[Provider] | None = None, *,
                 ask_server: bool = True, timeout: float | None = None) -> list[str]:
    """Refuse, before anything runs, a model the configured providers cannot answer with.

    Every provider's configured model, and `models` (the tasks' own model names, asked of the
    primary provider), is checked: a name the profile lists as retired raises ModelConfigError
    naming its replacement; then, when the provider answers GET /models (ask_server; not for the
    offline stand-in), a name it does not list and the profile does not know raises as well.
    Not reaching /models is not an error: it is returned as a warning line.
    """
    providers = list(providers) if providers is not None else resolve_providers()
    warnings: list[str] = []
    for i, provider in enumerate(providers):
        spec = provider.spec
        names = list(dict.fromkeys([provider.model, *(m for m in models if m and i == 0)]))
        for name in names:
            if not name:
                raise ModelConfigError(
                    f"provider {provider.name} has no model: set {spec.model_var or 'LLM_MODEL'}"
                    + (f" (e.g. {spec.default_model})" if spec.default_model else ""))
            replacement = spec.replacement(name)
            if replacement:
                raise ModelConfigError(
                    f"model {name!r} of provider {provider.name} was retired by the provider; use {replacement!r} "
                    f"(set {spec.model_var or 'LLM_MODEL'}={replacement}, or change the task's model)")
        if not ask_server or spec.routing_headers:
            continue
        ids, why = served_models(provider, timeout)
        if ids is None:
            warnings.append(f"{provider.name}: could not list its models ({why}); not checked against the server")
            continue
        for name in names:
            if not _is_served(name, ids) and name not in spec.models:
                listed = ", ".join(sorted(ids)[:12]) + (" ..." if len(ids) > 12 else "")
                raise ModelConfigError(
                    f"model {name!r} is not served by provider {provider.name} at {redact(provider.base_url)} "
                    f"(GET /models lists: {listed or 'nothing'})")
    for line in warnings:
        logger.warning("model check: %s", line)
    return warnings


# -- prices ---------------------------------------------------------------------------------

# USD per million tokens come from the provider profiles (profiles.json: input, cached input,
# output per model). settings.LLM_PRICES ({"model-prefix": [input, output]} or
# [input, cached_input, output]) adds or overrides entries; the longest prefix wins.
_MILLION = Decimal(1_000_000)
Prices = tuple[Decimal, Decimal, Decimal]  # input, cached input, output

_extra_prices: tuple[str, list[tuple[str, Prices]]] | None = None


def _override_prices() -> list[tuple[str, Prices]]:
    global _extra_prices
    extra = getattr(settings, "LLM_PRICES", None) or {}
    if not extra:
        return []
    key = canonical_json(extra)
    cached = _extra_prices
    if cached is None or cached[0] != key:
        table: list[tuple[str, Prices]] = []
        for prefix, value in extra.items():
            if not isinstance(value, (list, tuple)) or len(value) not in (2, 3):
                raise ImproperlyConfigured(
                    f"LLM_PRICES[{prefix!r}] must be [input, output] or [input, cached_input, output] "
                    f"(USD per million tokens), not {value!r}")
            try:
                numbers = [Decimal(str(v)) for v in value]
            except ArithmeticError:
                raise ImproperlyConfigured(f"LLM_PRICES[{prefix!r}] has a value that is not a number: {value!r}") from None
            if len(numbers) == 2:
                numbers = [numbers[0], numbers[0], numbers[1]]
            table.append((prefix, (numbers[0], numbers[1], numbers[2])))
        table.sort(key=lambda kv: len(kv[0]), reverse=True)
        cached = _extra_prices = (key, table)
    return cached[1]


def prices_for(model: str, profile: str | None = None) -> Prices | None:
    """(input, cached input, output) USD per million tokens for a model, or None when unknown:
    LLM_PRICES first, then the named profile's model, then any profile that prices it."""
    name = model.rsplit("/", 1)[-1]
    for prefix, price in _override_prices():
        if model.startswith(prefix) or name.startswith(prefix):
            return price
    every = profiles.all_profiles()
    order = ([every[profile]] if profile in every else []) + [p for pid, p in every.items() if pid != profile]
    for spec in order:
        m = spec.model(model)
        if m.priced and m.name in spec.models:
            assert m.price_input is not None and m.price_output is not None
            cached = m.price_cached_input if m.price_cached_input is not None else m.price_input
            return (m.price_input, cached, m.price_output)
    return None


def price_per_mtok(model: str) -> tuple[Decimal, Decimal] | None:
    """(input, output) USD per million tokens for a model name, or None when unknown."""
    price = prices_for(model)
    return None if price is None else (price[0], price[2])


def cost_usd(model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
             profile: str | None = None) -> Decimal:
    """Exact cost of one call (0 for models without a price). `cached_tokens` are the part of
    `prompt_tokens` the provider served from its prompt cache, priced at the cached-input rate."""
    price = prices_for(model, profile)
    if price is None:
        return Decimal(0)
    cached = max(0, min(cached_tokens, prompt_tokens))
    return (Decimal(prompt_tokens - cached) * price[0] + Decimal(cached) * price[1]
            + Decimal(completion_tokens) * price[2]) / _MILLION


# -- errors ---------------------------------------------------------------------------------


class LLMError(Exception):
    """A failed LLM call. str() is redacted; no SDK exception (with its headers) is chained."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        status_code: int | None = None,
        attempts: int = 0,
        retry_after: float | None = None,
        failures: Sequence[tuple[str, str]] = (),
    ):
        self.message = redact(message)
        self.provider = provider
        self.model = model
        self.status_code = status_code
        self.attempts = attempts
        self.retry_after = retry_after
        self.failures = [(p, redact(m)) for p, m in failures]
        super().__init__(self.message)

    @property
    def fallback_ok(self) -> bool:
        """Whether another provider may succeed where this one failed."""
        return True

    def __str__(self) -> str:
        where = f"{self.provider}/{self.model}: " if self.provider else ""
        tries = f" (after {self.attempts} attempt{'s' if self.attempts != 1 else ''})" if self.attempts else ""
        return f"{where}{self.message}{tries}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class LLMRateLimited(LLMError):
    retryable = True


class LLMTimeout(LLMError):
    retryable = True


class LLMUnavailable(LLMError):
    retryable = True


class LLMResponseInvalid(LLMError):
    retryable = True


class LLMBadRequest(LLMError):
    retryable = False

    @property
    def fallback_ok(self) -> bool:
        # 400/422 say the request itself is wrong; 401/402/403/404 are this provider's problem
        # (key, balance, model name), so another provider may well answer.
        return self.status_code not in (400, 413, 422)


# -- results --------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class ChatResult:
    """One assistant reply and where it came from. `message` is an OpenAI-format dict."""

    message: dict[str, Any]
    finish_reason: str | None
    usage: dict[str, int]
    cost_usd: Decimal
    model: str
    provider: str
    latency_ms: int
    cached: bool = False
    attempts: int = 1
    rate_limited: int = 0  # of the attempts, those the provider answered with HTTP 429
    # Of usage["prompt_tokens"], those the provider served from its prompt cache (read through
    # the profile's cached_usage_paths; also usage["cached_tokens"]), priced at the cache rate.
    cached_tokens: int = 0
    requested_model: str = ""
    cache_key: str = ""
    failed_providers: tuple[str, ...] = ()

    @property
    def content(self) -> str | None:
        return self.message.get("content")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (cost as a decimal string), e.g. for a trajectory step's metadata."""
        return {
            "message": self.message,
            "finish_reason": self.finish_reason,
            "usage": dict(self.usage),
            "cost_usd": str(self.cost_usd),
            "model": self.model,
            "provider": self.provider,
            "latency_ms": self.latency_ms,
            "cached": self.cached,
            "attempts": self.attempts,
            "rate_limited": self.rate_limited,
            "cached_tokens": self.cached_tokens,
            "requested_model": self.requested_model,
            "cache_key": self.cache_key,
            "failed_providers": list(self.failed_providers),
        }

    @classmethod
    def from_cache(cls, data: dict[str, Any], cache_key: str) -> ChatResult:
        return cls(
            message=data["message"],
            finish_reason=data["finish_reason"],
            usage=dict(data["usage"]),
            cost_usd=Decimal(data["cost_usd"]),
            model=data["model"],
            provider=data["provider"],
            latency_ms=int(data["latency_ms"]),
            cached=True,
            attempts=0,
            cached_tokens=int(data.get("cached_tokens") or 0),
            requested_model=data.get("requested_model", ""),
            cache_key=cache_key,
        )

    def __repr__(self) -> str:
        return redact(
            f"ChatResult(provider={self.provider!r}, model={self.model!r}, finish_reason={self.finish_reason!r}, "
            f"usage={self.usage!r}, cached_tokens={self.cached_tokens}, cost_usd={self.cost_usd}, "
            f"cached={self.cached}, attempts={self.attempts}, "
            f"message={self.message!r})"
        )


# -- adaptive concurrency -------------------------------------------------------------------


class AIMDLimiter:
    """Caps requests in flight to one provider; usable from threads and from asyncio tasks.

    acquire()/aacquire() return a ticket (the congestion epoch the request started in); pass
    it back to release(ticket, outcome). A "rate_limited" outcome halves the limit, but only
    once per epoch: a burst of 429s from requests sent together counts as one signal. After
    `increase_every` consecutive "ok" outcomes the limit grows by one, up to max_limit.
    """

    def __init__(self, max_limit: int, *, min_limit: int = 1, increase_every: int = INCREASE_EVERY):
        self.max_limit = max(1, max_limit)
        self.min_limit = max(1, min(min_limit, self.max_limit))
        self.increase_every = max(1, increase_every)
        self.limit = self.max_limit
        self.in_flight = 0
        self._epoch = 0
        self._successes = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._async_waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def _try_take(self) -> bool:
        if self.in_flight < self.limit:
            self.in_flight += 1
            return True
        return False

    def _wake(self) -> None:
        free = self.limit - self.in_flight
        if free <= 0:
            return
        self._cond.notify(free)
        # Waking more waiters than slots is harmless: each one re-checks under the lock.
        for _ in range(min(free, len(self._async_waiters))):
            loop, fut = self._async_waiters.popleft()
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed; its waiter is gone
                continue

    def acquire(self) -> int:
        with self._cond:
            while not self._try_take():
                self._cond.wait()
            return self._epoch

    async def aacquire(self) -> int:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._try_take():
                    return self._epoch
                fut: asyncio.Future[None] = loop.create_future()
                self._async_waiters.append((loop, fut))
            try:
                await fut
            except asyncio.CancelledError:
                with self._lock:
                    try:
                        self._async_waiters.remove((loop, fut))
                    except ValueError:  # already woken: hand the wake-up on
                        self._wake()
                raise

    def release(self, ticket: int, outcome: str = "ok") -> None:
        """outcome: "ok", "rate_limited" or "error" (neither grows nor shrinks the limit)."""
        with self._lock:
            self.in_flight -= 1
            if outcome == "rate_limited":
                self._successes = 0
                if ticket == self._epoch:
                    self.limit = max(self.min_limit, self.limit // 2)
                    self._epoch += 1
            elif outcome == "ok":
                self._successes += 1
                if self._successes >= self.increase_every:
                    self._successes = 0
                    if self.limit < self.max_limit:
                        self.limit += 1
            self._wake()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


_limiters: dict[tuple[str, str], AIMDLimiter] = {}
_limiters_lock = threading.Lock()


def limiter_for(provider: Provider) -> AIMDLimiter:
    """The process-wide limiter of a provider (created at LLM_MAX_CONCURRENCY)."""
    key = (provider.name, provider.base_url)
    with _limiters_lock:
        limiter = _limiters.get(key)
        if limiter is None:
            limiter = _limiters[key] = AIMDLimiter(settings.LLM_MAX_CONCURRENCY)
        return limiter


def reset_limiters() -> None:
    """Forget every provider's limiter (tests; a settings change)."""
    with _limiters_lock:
        _limiters.clear()


# -- the response cache ---------------------------------------------------------------------


CACHE_ZLIB_LEVEL = 1
CACHE_ZLIB_WBITS = 12
CACHE_ZLIB_MEMLEVEL = 1


class LLMResponseCache(BaseCache):
    """CACHES["llm"] without Redis: every reply in one SQLite file, LOCATION/replies.sqlite3.

    This was Django's file cache, one file per reply. Creating a file costs an inode, a
    dentry and a temporary name: 0.15-0.9 ms of kernel time per write on these VMs while the
    sandboxes churn the same kernel caches, about a tenth of a rollout turn's CPU. A row in a
    WAL-mode SQLite file costs about 0.04 ms to write and 0.01 ms to look up.

    Every process of the machine shares the file (SQLite's locks; a writer waits up to
    BUSY_TIMEOUT_S for another). Entries are never culled and expire only when stored with a
    timeout. synchronous=NORMAL: a power cut can lose the last writes, which costs a resumed
    batch those calls again and nothing else. A file removed under a running process (someone
    clearing the cache by hand) is noticed on the next read or write and made again, so
    writes never go on into a deleted file.

    Values are pickled and zlib-compressed. One connection per thread and file, shared by the
    instances Django makes per thread and asyncio task.
    """

    FILE_NAME = "replies.sqlite3"
    BUSY_TIMEOUT_S = 30.0
    CONNECTIONS_PER_THREAD = 4

    _schema = ("CREATE TABLE IF NOT EXISTS replies "
               "(key TEXT PRIMARY KEY, expires REAL, value BLOB NOT NULL) WITHOUT ROWID")
    # thread -> {path: (pid, inode, connection)}
    _local = threading.local()

    def __init__(self, location: str, params: dict[str, Any]):
        super().__init__(params)
        self._dir = os.path.abspath(location)
        self._path = os.path.join(self._dir, self.FILE_NAME)

    def _db(self) -> sqlite3.Connection:
        """This thread's connection to the file, (re)made when there is none for this process
        or the file it has open is no longer the one at the path. A thread keeps connections
        to its CONNECTIONS_PER_THREAD most recently used files (settings overrides, tests)."""
        connections: OrderedDict = self._local.__dict__.setdefault("connections", OrderedDict())
        known = connections.pop(self._path, None)
        try:
            inode = os.stat(self._path).st_ino
        except FileNotFoundError:
            inode = None
        if known is not None and known[0] == os.getpid():
            if known[1] == inode:
                connections[self._path] = known
                return known[2]
            known[2].close()
        while len(connections) >= self.CONNECTIONS_PER_THREAD:
            pid, _, oldest = connections.popitem(last=False)[1]
            if pid == os.getpid():  # one inherited over a fork belongs to the parent
                oldest.close()
        os.makedirs(self._dir, exist_ok=True)
        db = sqlite3.connect(self._path, timeout=self.BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(self._schema)
        except BaseException:
            db.close()
            raise
        connections[self._path] = (os.getpid(), os.stat(self._path).st_ino, db)
        return db

    @staticmethod
    def _pack(value: Any) -> bytes:
        # zlib.compress() allocates ~400 KiB of state per call, and faulting that in costs
        # ~70 us of kernel time, far more than compressing a reply of a few KiB.
        compressor = zlib.compressobj(CACHE_ZLIB_LEVEL, zlib.DEFLATED, CACHE_ZLIB_WBITS, CACHE_ZLIB_MEMLEVEL)
        return compressor.compress(pickle.dumps(value, pickle.HIGHEST_PROTOCOL)) + compressor.flush()

    def get(self, key: str, default: Any = None, version: int | None = None) -> Any:
        key = self.make_and_validate_key(key, version)
        row = self._db().execute("SELECT expires, value FROM replies WHERE key = ?", (key,)).fetchone()
        if row is None or (row[0] is not None and row[0] <= time.time()):
            return default
        return pickle.loads(zlib.decompress(row[1]))

    def set(self, key: str, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        key = self.make_and_validate_key(key, version)
        self._db().execute("INSERT OR REPLACE INTO replies (key, expires, value) VALUES (?, ?, ?)",
                           (key, self.get_backend_timeout(timeout), self._pack(value)))

    def add(self, key: str, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version)
        # One statement: another process adding the same key at once cannot add it as well.
        added = self._db().execute(
            "INSERT INTO replies (key, expires, value) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
            "expires = excluded.expires, value = excluded.value WHERE replies.expires <= ?",
            (key, self.get_backend_timeout(timeout), self._pack(value), time.time()),
        )
        return added.rowcount == 1

    def touch(self, key: str, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version)
        done = self._db().execute("UPDATE replies SET expires = ? WHERE key = ? AND (expires IS NULL OR expires > ?)",
                                  (self.get_backend_timeout(timeout), key, time.time()))
        return done.rowcount == 1

    def delete(self, key: str, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version)
        return self._db().execute("DELETE FROM replies WHERE key = ?", (key,)).rowcount == 1

    def has_key(self, key: str, version: int | None = None) -> bool:
        return self.get(key, _MISSING, version) is not _MISSING

    def clear(self) -> None:
        self._db().execute("DELETE FROM replies")


_MISSING = object()


# -- the client -----------------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def cache_identity(trajectory_uuid: Any) -> dict[str, str]:
    """The `cache_key_extra` of a trajectory's model calls: its UUID, unique across databases
    (a primary key is not), so no other trajectory is ever served its answers."""
    return {"trajectory": str(uuid.UUID(str(trajectory_uuid)))}


_KEYED_FIELDS = ("model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens")


def cache_key_for(request: dict[str, Any], cache_key_extra: Any = None, extra_headers: dict[str, str] | None = None) -> str:
    """The cache key of a request: sha256 over what determines the answer (no provider URL)."""
    payload = {
        "v": CACHE_VERSION,
        **{k: request.get(k) for k in _KEYED_FIELDS},
        "extra": cache_key_extra,
    }
    body = {k: v for k, v in request.items() if k not in _KEYED_FIELDS}
    if body:  # what a profile adds (thinking switch, max_completion_tokens) changes the answer too
        payload["body"] = body
    if extra_headers:  # they can change the answer (the offline model's fault injection does)
        payload["headers"] = extra_headers
    data = memoryview(canonical_json(payload).encode("utf-8"))
    digest = hashlib.sha256()
    # In pieces below hashlib's 2 KiB threshold for releasing the GIL: hashing a few KiB takes
    # microseconds, while handing the GIL to the sandbox threads and getting it back can hold
    # the event loop for a millisecond. The digest is the same.
    for start in range(0, len(data), _HASH_PIECE):
        digest.update(data[start:start + _HASH_PIECE])
    return "chat:" + digest.hexdigest()


_HASH_PIECE = 2000

# The offline stand-in picks its script by this header (a pipeline stage's key, the judge), sent
# only to providers whose profile has routing_headers: a real model's requests carry nothing
# but the task. Callers set it with `with llm_route("pipeline:toucan/question key=s1"):`.
ROUTE_HEADER = "X-Trajplatform-Route"
_route: contextvars.ContextVar[str] = contextvars.ContextVar("llm_route", default="")


@contextlib.contextmanager
def llm_route(value: str | None) -> Iterator[None]:
    """Route the model calls made inside (this thread or task and the tasks it starts) to the
    offline stand-in's script `value`; real providers never see it."""
    token = _route.set(value or "")
    try:
        yield
    finally:
        _route.reset(token)


def shape_request(provider: Provider, request: dict[str, Any]) -> dict[str, Any]:
    """The request body as the provider's profile wants it: max_tokens under the profile's name;
    for a model that thinks (the profile's `thinks`), the sampling parameters the provider ignores
    or refuses in thinking mode dropped and its thinking switch merged in (a model that does not
    think keeps its temperature and gets no switch it would refuse)."""
    spec = provider.spec
    thinks = spec.model(str(request.get("model") or "")).thinks
    body = {k: v for k, v in request.items() if not (thinks and k in spec.ignored_params)}
    if "max_tokens" in body and spec.max_tokens_param != "max_tokens":
        body[spec.max_tokens_param] = body.pop("max_tokens")
    if thinks:
        for key, value in spec.thinking_request.items():
            body.setdefault(key, value)
    return body


@dataclass
class _Call:
    provider: Provider
    request: dict[str, Any]
    cache_key: str
    extra_headers: dict[str, str] | None = None
    attempts: int = field(default=0)

    @property
    def label(self) -> str:
        return f"{self.provider.name}/{self.request['model']}"


# The request goes out through the SDK client's generic post() (its auth, headers, timeouts,
# HTTP errors as APIStatusError) with the body exactly as built, and the reply comes back as
# the raw HTTP response, read as JSON by _result. chat.completions.create() would walk the
# body against the SDK's TypedDicts (only to rename aliased keys and encode files, which plain
# chat messages and JSON-schema tools do not have) and build pydantic models of the reply
# that _result turns straight back into dicts: together the largest CPU cost of a turn on the
# event loop, for nothing.
_CHAT_PATH = "/chat/completions"


# The SDK makes an idempotency key per request (uuid4: a getrandom system call on the event
# loop's thread) unless given one; it sends none to these providers (the OpenAI client has no
# idempotency header), so a counter per process does as well.
_idempotency_keys = itertools.count()
_IDEMPOTENCY_PREFIX = f"trajplatform-{random.getrandbits(48):012x}-"


def _post_kwargs(call: _Call, timeout: float | None) -> dict[str, Any]:
    options: dict[str, Any] = {
        "timeout": timeout,
        "security": {"bearer_auth": True},  # as chat.completions.create() sends
        "idempotency_key": f"{_IDEMPOTENCY_PREFIX}{os.getpid()}-{next(_idempotency_keys)}",
    }
    if call.extra_headers is not None:
        options["headers"] = call.extra_headers
    return {"cast_to": httpx2.Response, "body": call.request, "options": options}


def _tool_call(tc: dict[str, Any]) -> dict[str, Any]:
    """A reply's tool call as stored: id as sent ("" when missing: the loop gives every call a
    unique id), arguments the model's raw string, valid JSON or not (the loop decides what a
    malformed call means), and a provider's extra_content (Gemini's thought signature, which
    must come back unchanged) kept."""
    call = {
        "id": tc.get("id") if isinstance(tc.get("id"), str) else "",
        "type": "function",
        "function": {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]},
    }
    if tc.get("extra_content") is not None:
        call["extra_content"] = tc["extra_content"]
    return call


def _refused(exc: BaseException) -> ConnectionError | None:
    """The refused or reset connection behind an SDK error, if that is what it was: achat's
    aiohttp transport reports a refused connection as a connect *timeout*."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) / divisor)
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            continue
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
    return None


def _error_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:500]
        if isinstance(inner, str):
            return inner[:500]
    return (exc.message or "")[:500]


# achat reads and writes the local caches (LLMResponseCache, the file cache) on the event loop:
# a lookup costs about 0.01 ms and a write 0.04 ms (LLMResponseCache's docstring), not worth a
# thread hop. Any other backend (Redis: a network round trip) is read and written in one thread
# of its own, awaited, never the loop's default executor, where sandbox commands may hold every
# thread for their whole timeout. Either way achat returns once its reply is stored: another
# process finds it at once, and nothing is left to flush.
_cache_io: ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def _cache_thread() -> ThreadPoolExecutor:
    """The one thread that reads and writes cache backends other than the local ones."""
    global _cache_io
    executor = _cache_io
    if executor is None:
        with _shared_lock:
            if _cache_io is None:
                _cache_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-cache-io")
            executor = _cache_io
    return executor


# alias -> (its CACHES entry, the instance made from it)
_shared_caches: dict[str, tuple[dict[str, Any], BaseCache]] = {}


def _shared_cache(alias: str) -> BaseCache:
    """The cache instance achat reads and writes through (on the loop, or in the cache thread):
    one per process and CACHES entry, shared by every client (a settings override gets its
    own)."""
    params = caches.settings[alias]
    shared = _shared_caches.get(alias)
    if shared is None or shared[0] is not params:
        with _shared_lock:
            shared = _shared_caches.get(alias)
            if shared is None or shared[0] is not params:
                shared = _shared_caches[alias] = (params, caches.create_connection(alias))
    return shared[1]


_ssl_context: ssl.SSLContext | None = None


def _http_ssl_context() -> ssl.SSLContext:
    """The process's one SSL context for the async SDK clients, made as httpx2 makes its
    default one (certifi, or SSL_CERT_FILE / SSL_CERT_DIR from the environment). Loading the
    CA bundle takes ~20 ms, and every event loop's client would otherwise load its own."""
    global _ssl_context
    with _shared_lock:
        if _ssl_context is None:
            _ssl_context = httpx2.create_ssl_context()
        return _ssl_context


class LLMClient:
    """Chat completions with retries, fallback, adaptive concurrency, caching and costing.

    `providers` defaults to resolve_providers(); `sleep`/`asleep`/`rand` are injectable so
    tests can see the waits without waiting. One client per worker process is enough: the
    SDK clients inside are thread-safe (the async ones are made per event loop).
    """

    def __init__(
        self,
        providers: Sequence[Provider] | None = None,
        *,
        cache_alias: str = "llm",
        sleep: Callable[[float], None] = time.sleep,
        asleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        limiters: dict[str, AIMDLimiter] | None = None,
    ):
        self.providers = list(providers) if providers is not None else resolve_providers()
        if not self.providers:
            raise ImproperlyConfigured("LLMClient needs at least one provider")
        self.cache_alias = cache_alias
        self._sleep, self._asleep, self._rand = sleep, asleep, rand
        self._limiters = limiters
        self._sync_clients: dict[str, openai.OpenAI] = {}
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, openai.AsyncOpenAI]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        # Made now (once per process) rather than at the first call on an event loop.
        _http_ssl_context()

    def __repr__(self) -> str:
        return f"LLMClient(providers={self.providers!r})"

    @property
    def primary(self) -> Provider:
        return self.providers[0]

    def limiter(self, provider: Provider) -> AIMDLimiter:
        if self._limiters is not None:
            with self._lock:
                if provider.name not in self._limiters:
                    self._limiters[provider.name] = AIMDLimiter(settings.LLM_MAX_CONCURRENCY)
                return self._limiters[provider.name]
        return limiter_for(provider)

    # -- building requests

    def _plan(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        temperature: float | None,
        top_p: float | None,
        max_tokens: int | None,
        model: str | None,
        cache_key_extra: Any,
        extra_headers: dict[str, str] | None,
        provider: str | None = None,
    ) -> list[_Call]:
        calls = []
        route = _route.get()
        for i, provider in enumerate(self._ordered(provider)):
            if not ((model or provider.model) if i == 0 else provider.model):
                raise LLMBadRequest(f"no model is configured for provider {provider.name} (set LLM_MODEL or "
                                    f"{provider.spec.model_var or 'the provider model variable'})",
                                    provider=provider.name)
            # A model named by the caller is the primary's; fallbacks are other vendors and
            # ask for their own configured model.
            request: dict[str, Any] = {
                "model": (model or provider.model) if i == 0 else provider.model,
                "messages": messages,
            }
            for name, value in (
                ("tools", tools or None),
                ("tool_choice", tool_choice),
                ("temperature", temperature),
                ("top_p", top_p),
                ("max_tokens", max_tokens),
            ):
                if value is not None:
                    request[name] = value
            request = shape_request(provider, request)
            headers = extra_headers
            if route and provider.spec.routing_headers:
                headers = {**(extra_headers or {}), ROUTE_HEADER: route}
            calls.append(_Call(provider, request, cache_key_for(request, cache_key_extra, headers), headers))
        return calls

    def _ordered(self, name: str | None) -> list[Provider]:
        """The providers in the order to ask them: the one named first (a task's or a role's
        `provider`), then the others as fallbacks in their configured order."""
        if not name:
            return self.providers
        chosen = [p for p in self.providers if p.name == name]
        if not chosen:
            raise LLMBadRequest(f"provider {name!r} is not configured (configured: "
                                f"{', '.join(p.name for p in self.providers)})", provider=name, model="")
        return chosen + [p for p in self.providers if p.name != name]

    def _sync_client(self, provider: Provider) -> openai.OpenAI:
        with self._lock:
            client = self._sync_clients.get(provider.name)
            if client is None:
                client = self._sync_clients[provider.name] = openai.OpenAI(
                    api_key=provider.api_key or "EMPTY", base_url=provider.base_url, max_retries=0
                )
            return client

    def _async_client(self, provider: Provider) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        with self._lock:
            per_loop = self._async_clients.setdefault(loop, {})
            client = per_loop.get(provider.name)
            if client is None:
                # The SDK over its aiohttp transport (the openai[aiohttp] extra) with the SDK's
                # own timeout and connection limits, sharing the process's SSL context. A round
                # trip costs the event loop's thread about half the CPU of the default httpx2
                # transport (0.6 against 1.2 ms measured), and its pool hands out an idle
                # connection without checking every other one.
                client = per_loop[provider.name] = openai.AsyncOpenAI(
                    api_key=provider.api_key or "EMPTY", base_url=provider.base_url, max_retries=0,
                    http_client=openai.DefaultAioHttpClient(
                        base_url=provider.base_url, timeout=openai.DEFAULT_TIMEOUT, verify=_http_ssl_context()
                    ),
                )
            return client

    # -- interpreting answers and failures

    def _translate(self, exc: BaseException, call: _Call) -> LLMError:
        kw: dict[str, Any] = {"provider": call.provider.name, "model": call.request["model"]}
        refused = _refused(exc)
        if isinstance(exc, openai.APITimeoutError) and refused is None:
            return LLMTimeout("request timed out", **kw)
        if isinstance(exc, openai.APIConnectionError):  # APITimeoutError is one
            cause = refused or exc.__cause__ or exc.__context__
            detail = f": {type(cause).__name__}" if cause is not None else ""
            if call.provider.spec.routing_headers:
                detail += f" (is the offline model running at {call.provider.base_url}? `python manage.py offline_model`)"
            return LLMUnavailable(f"connection failed{detail}", **kw)
        if isinstance(exc, openai.APIResponseValidationError):
            return LLMResponseInvalid(f"response did not match the chat completion schema: {exc.message}", **kw)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            kw.update(status_code=status, retry_after=_retry_after(exc.response.headers))
            text = f"HTTP {status}: {_error_detail(exc)}"
            if status == 429:
                return LLMRateLimited(text, **kw)
            if status == 408:
                return LLMTimeout(text, **kw)
            if status >= 500 or status == 409:
                return LLMUnavailable(text, **kw)
            return LLMBadRequest(text, **kw)
        return LLMError(f"{type(exc).__name__}: {exc}", **kw)

    def _result(self, response: httpx2.Response, call: _Call, attempt: int, latency_s: float,
                rate_limited: int = 0) -> ChatResult:
        kw: dict[str, Any] = {"provider": call.provider.name, "model": call.request["model"]}
        try:
            completion = json.loads(response.content)
        except ValueError:
            raise LLMResponseInvalid(
                f"response is not JSON (content-type {response.headers.get('content-type', 'none')!r})", **kw
            ) from None
        choices = completion.get("choices") if isinstance(completion, dict) else None
        if not choices or not isinstance(choices, list):
            raise LLMResponseInvalid("response has no choices", **kw)
        choice = choices[0] if isinstance(choices[0], dict) else {}
        msg = choice.get("message")
        if not isinstance(msg, dict):
            raise LLMResponseInvalid("response choice has no message", **kw)
        message: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
        spec = call.provider.spec
        # Stored one way: the reasoning, from whichever field the profile says it arrives in,
        # is the message's reasoning_content (the loop sends it back as the profile says).
        for name in dict.fromkeys((*spec.reasoning_fields, "reasoning_content")):
            reasoning = msg.get(name)
            if isinstance(reasoning, str) and (reasoning or name == "reasoning_content"):
                message["reasoning_content"] = reasoning
                break
        if msg.get("tool_calls"):
            try:
                message["tool_calls"] = [_tool_call(tc) for tc in msg["tool_calls"]]
            except (KeyError, TypeError):
                raise LLMResponseInvalid("a tool call has no function name/arguments", **kw) from None
        usage_obj = completion.get("usage")
        if not isinstance(usage_obj, dict):
            usage_obj = {}
        usage = {
            "prompt_tokens": int(usage_obj.get("prompt_tokens") or 0),
            "completion_tokens": int(usage_obj.get("completion_tokens") or 0),
        }
        usage["total_tokens"] = int(usage_obj.get("total_tokens") or 0) or sum(usage.values())
        cached_tokens = 0
        for path in spec.cached_usage_paths:
            found = profiles.usage_path(usage_obj, path)
            if found is not None:
                cached_tokens = max(0, min(found, usage["prompt_tokens"]))
                break
        if cached_tokens:
            usage["cached_tokens"] = cached_tokens
        reported = completion.get("model") or call.request["model"]
        price_model = reported if prices_for(reported, call.provider.profile) is not None else call.request["model"]
        return ChatResult(
            message=redact(message, labels=False),
            finish_reason=choice.get("finish_reason"),
            usage=usage,
            cached_tokens=cached_tokens,
            cost_usd=cost_usd(price_model, usage["prompt_tokens"], usage["completion_tokens"], cached_tokens,
                              profile=call.provider.profile),
            model=reported,
            provider=call.provider.name,
            latency_ms=int(latency_s * 1000),
            attempts=attempt,
            rate_limited=rate_limited,
            requested_model=call.request["model"],
            cache_key=call.cache_key,
        )

    def _delay(self, err: LLMError, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when waiting is pointless."""
        if err.retry_after is not None:
            return err.retry_after if err.retry_after <= MAX_RETRY_AFTER_S else None
        base = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1))
        return base * (0.5 + 0.5 * self._rand())

    def _after_failure(self, err: LLMError, call: _Call, attempt: int, max_attempts: int) -> float:
        """Log a failed attempt and return the wait before the next, or raise `err` if final."""
        err.attempts = attempt
        delay = self._delay(err, attempt) if err.retryable and attempt < max_attempts else None
        if delay is None:
            raise err
        logger.warning("%s: %s; retry %d/%d in %.2fs", call.label, err.message, attempt, max_attempts - 1, delay)
        return delay

    # -- cache

    def _shared_cache(self) -> BaseCache:
        return _shared_cache(self.cache_alias)

    def _cache_get(self, calls: list[_Call], cache: BaseCache | None = None) -> ChatResult | None:
        try:
            cache = cache or caches[self.cache_alias]
            for call in calls:
                data = cache.get(call.cache_key)
                if data is not None:
                    return ChatResult.from_cache(data, call.cache_key)
        except Exception as exc:  # a broken cache costs money, not correctness
            logger.warning("llm cache read failed: %s", exc)
        return None

    async def _acache_get(self, calls: list[_Call]) -> ChatResult | None:
        try:
            shared = self._shared_cache()
        except Exception as exc:
            logger.warning("llm cache read failed: %s", exc)
            return None
        if isinstance(shared, (LLMResponseCache, FileBasedCache)):
            return self._cache_get(calls, shared)
        return await asyncio.get_running_loop().run_in_executor(_cache_thread(), self._cache_get, calls, shared)

    def _cache_value(self, result: ChatResult) -> dict[str, Any]:
        data = result.to_dict()
        for per_call in ("cached", "cache_key", "failed_providers"):
            del data[per_call]
        return data

    def _cache_set(self, result: ChatResult, cache: BaseCache | None = None) -> None:
        try:
            (cache or caches[self.cache_alias]).set(result.cache_key, self._cache_value(result), None)
        except Exception as exc:  # a broken cache costs money, not correctness
            logger.warning("llm cache write failed: %s", exc)

    async def _acache_set(self, result: ChatResult) -> None:
        try:
            shared = self._shared_cache()
        except Exception as exc:
            logger.warning("llm cache write failed: %s", exc)
            return
        if isinstance(shared, (LLMResponseCache, FileBasedCache)):
            self._cache_set(result, shared)
        else:
            await asyncio.get_running_loop().run_in_executor(_cache_thread(), self._cache_set, result, shared)

    # -- fallback across providers

    @staticmethod
    def _give_up(failures: list[tuple[_Call, LLMError]]) -> LLMError:
        if len(failures) == 1:
            return failures[0][1]
        last = failures[-1][1]
        err_cls = LLMUnavailable if any(e.retryable for _, e in failures) else type(last)
        return err_cls(
            "every provider failed: " + "; ".join(f"{c.provider.name}: {e}" for c, e in failures),
            provider=last.provider,
            model=last.model,
            status_code=last.status_code,
            attempts=sum(e.attempts for _, e in failures),
            retry_after=last.retry_after,
            failures=[(c.provider.name, str(e)) for c, e in failures],
        )

    def _next_or_raise(self, failures: list[tuple[_Call, LLMError]], remaining: int) -> None:
        call, err = failures[-1]
        if remaining == 0 or not err.fallback_ok:
            raise self._give_up(failures)
        logger.warning("%s failed (%s); falling back to the next provider", call.label, err)

    # -- public API

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        timeout: float | None = None,
        cache_key_extra: Any = None,
        use_cache: bool = True,
        cache_lookup: bool = True,
        extra_headers: dict[str, str] | None = None,
        provider: str | None = None,
    ) -> ChatResult:
        """One assistant turn for `messages`; raises an LLMError subclass when it cannot. `provider`
        names a configured provider to ask first (the others stay its fallbacks)."""
        calls = self._plan(
            messages, tools=tools, tool_choice=tool_choice, temperature=temperature, top_p=top_p,
            max_tokens=max_tokens, model=model, cache_key_extra=cache_key_extra, extra_headers=extra_headers,
            provider=provider,
        )
        if use_cache and cache_lookup and (hit := self._cache_get(calls)) is not None:
            return hit
        failures: list[tuple[_Call, LLMError]] = []
        for i, call in enumerate(calls):
            try:
                result = self._call_sync(call, timeout)
            except LLMError as err:
                failures.append((call, err))
                self._next_or_raise(failures, len(calls) - i - 1)
                continue
            result = replace(result, failed_providers=tuple(c.provider.name for c, _ in failures))
            if use_cache:
                self._cache_set(result)
            return result
        raise self._give_up(failures)  # unreachable: _next_or_raise raises on the last one

    async def achat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        timeout: float | None = None,
        cache_key_extra: Any = None,
        use_cache: bool = True,
        cache_lookup: bool = True,
        extra_headers: dict[str, str] | None = None,
        provider: str | None = None,
    ) -> ChatResult:
        """The asyncio twin of chat()."""
        calls = self._plan(
            messages, tools=tools, tool_choice=tool_choice, temperature=temperature, top_p=top_p,
            max_tokens=max_tokens, model=model, cache_key_extra=cache_key_extra, extra_headers=extra_headers,
            provider=provider,
        )
        if use_cache and cache_lookup and (hit := await self._acache_get(calls)) is not None:
            return hit
        failures: list[tuple[_Call, LLMError]] = []
        for i, call in enumerate(calls):
            try:
                result = await self._call_async(call, timeout)
            except LLMError as err:
                failures.append((call, err))
                self._next_or_raise(failures, len(calls) - i - 1)
                continue
            result = replace(result, failed_providers=tuple(c.provider.name for c, _ in failures))
            if use_cache:
                await self._acache_set(result)
            return result
        raise self._give_up(failures)

    def _call_sync(self, call: _Call, timeout: float | None) -> ChatResult:
        client = self._sync_client(call.provider)
        limiter = self.limiter(call.provider)
        max_attempts = max(0, settings.LLM_MAX_RETRIES) + 1
        timeout = timeout if timeout is not None else settings.LLM_TIMEOUT_S
        rate_limited = 0
        for attempt in range(1, max_attempts + 1):
            ticket = limiter.acquire()
            outcome, started = "error", time.monotonic()
            try:
                response = client.post(_CHAT_PATH, **_post_kwargs(call, timeout))
                outcome = "ok"
            except openai.OpenAIError as exc:
                err = self._translate(exc, call)
                outcome = "rate_limited" if isinstance(err, LLMRateLimited) else "error"
                rate_limited += outcome == "rate_limited"
            finally:
                limiter.release(ticket, outcome)
            if outcome == "ok":
                try:
                    return self._result(response, call, attempt, time.monotonic() - started, rate_limited)
                except LLMResponseInvalid as invalid:
                    err = invalid
            self._sleep(self._after_failure(err, call, attempt, max_attempts))
        raise AssertionError("unreachable")

    async def _call_async(self, call: _Call, timeout: float | None) -> ChatResult:
        client = self._async_client(call.provider)
        limiter = self.limiter(call.provider)
        max_attempts = max(0, settings.LLM_MAX_RETRIES) + 1
        timeout = timeout if timeout is not None else settings.LLM_TIMEOUT_S
        rate_limited = 0
        for attempt in range(1, max_attempts + 1):
            ticket = await limiter.aacquire()
            outcome, started = "error", time.monotonic()
            try:
                response = await client.post(_CHAT_PATH, **_post_kwargs(call, timeout))
                outcome = "ok"
            except openai.OpenAIError as exc:
                err = self._translate(exc, call)
                outcome = "rate_limited" if isinstance(err, LLMRateLimited) else "error"
                rate_limited += outcome == "rate_limited"
            finally:
                limiter.release(ticket, outcome)
            if outcome == "ok":
                try:
                    return self._result(response, call, attempt, time.monotonic() - started, rate_limited)
                except LLMResponseInvalid as invalid:
                    err = invalid
            await self._asleep(self._after_failure(err, call, attempt, max_attempts))
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the sync SDK clients."""
        with self._lock:
            clients, self._sync_clients = list(self._sync_clients.values()), {}
        for client in clients:
            client.close()

    async def aclose(self) -> None:
        """Close this loop's async SDK clients."""
        loop = asyncio.get_running_loop()
        with self._lock:
            clients = list(self._async_clients.pop(loop, {}).values())
        for client in clients:
            await client.close()


# -- the process's client: one per provider configuration -------------------------------------

_llm_clients: dict[tuple[Any, ...], LLMClient] = {}
_llm_lock = threading.Lock()


def get_llm_client() -> LLMClient:
    """The process's LLMClient for the configured providers (its async clients are per loop).

    Rollout jobs, the review agent and the pipelines share it; a worker process imports this
    module (and the openai SDK, ~0.5 s) once, not on the job's event loop before its first
    rollout."""
    providers = tuple(resolve_providers())
    with _llm_lock:
        client = _llm_clients.get(providers)
        if client is None:
            client = _llm_clients[providers] = LLMClient(list(providers))
        return client
