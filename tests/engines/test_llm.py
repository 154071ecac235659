"""The LLM client, driven through the real openai SDK over loopback HTTP.

The offline scripted model plays both the good provider and the faulty one (fault injection);
a tiny canned-response endpoint stands in where a test needs a reply the scripted model never
gives (a priced model name, reasoning_content, an endpoint that echoes the API key back).
Waits are injected (`sleep`/`asleep`/`rand`), so tests assert the requested delays, not time.
"""
from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from apps.engines.llm import (
    AIMDLimiter,
    cache_identity,
    ChatResult,
    LLMBadRequest,
    LLMClient,
    LLMError,
    LLMRateLimited,
    LLMResponseInvalid,
    LLMTimeout,
    LLMUnavailable,
    Provider,
    cost_usd,
    price_per_mtok,
    reset_limiters,
    resolve_providers,
)
from apps.engines.offline_model import MODEL_NAME, running_offline_model
from tests.engines.llm_servers import LoopbackServer, serve_each
from trajplatform.redaction import REDACTED, redact

EXAMPLES = Path(settings.BASE_DIR) / "examples" / "reference_solutions"
PRIMES = "Print the first ten primes."
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("write_file", "run_shell", "finish")
]
# One key in a well-known shape, one that only redaction-by-value can catch.
SK_KEY = "sk-test-4f9c2b7e1d8a6035c4b2e9f1a7d3c6b8"
ODD_KEY = "zq-private-7H3kP9xL2mQ8vR4tW6yB"
PROVIDER_ENV_VARS = [
    f"{p}_{v}" for p in ("GEMINI", "DEEPSEEK", "OPENAI", "VLLM", "SGLANG", "OLLAMA", "ANTHROPIC", "MOONSHOT", "ZHIPU",
                          "OPENROUTER") for v in ("API_KEY", "BASE_URL", "MODEL")
]


@pytest.fixture(autouse=True)
def llm_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in PROVIDER_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    llm_cache = {
        "BACKEND": "apps.engines.llm.LLMResponseCache",
        "LOCATION": str(tmp_path / "llm-cache"),
        "TIMEOUT": None,
    }
    with override_settings(
        LLM_BASE_URL="", LLM_API_KEY="", LLM_MODEL="", LLM_PROVIDERS="", LLM_TIMEOUT_S=10.0,
        LLM_MAX_RETRIES=3, LLM_MAX_CONCURRENCY=8, OFFLINE_MODEL_URL="http://127.0.0.1:8765/v1",
        CACHES={**settings.CACHES, "llm": llm_cache},
    ):
        reset_limiters()
        yield
    reset_limiters()


@pytest.fixture
def server() -> Iterator[Any]:
    with running_offline_model([EXAMPLES]) as srv:
        yield srv


class Waits:
    """Records the waits the client asks for instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)

    async def asleep(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def waits() -> Waits:
    return Waits()


def client_for(waits: Waits, *providers: Provider, **kw: Any) -> LLMClient:
    return LLMClient(list(providers), sleep=waits.sleep, asleep=waits.asleep, rand=lambda: 0.5, limiters={}, **kw)


def offline(server: Any, name: str = "offline", api_key: str = "") -> Provider:
    return Provider(name, server.url, MODEL_NAME, api_key)


def user(prompt: str = PRIMES) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": prompt}]


def fault(spec: str) -> dict[str, str]:
    return {"X-Scripted-Fault": spec}


# -- a canned-response endpoint -------------------------------------------------------------


class Canned(LoopbackServer):
    """Answers POSTs from a list of (status, headers, body); "{auth}" in a body is replaced by
    the request's Authorization header, like providers that quote a bad key back."""

    def __init__(self, replies: list[tuple[int, dict[str, str], Any]]):
        self.replies = list(replies)
        self.count = 0
        super().__init__()

    def on_post(self, request: Any, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = self.replies[min(self.count, len(self.replies) - 1)]
        self.count += 1
        return status, headers, json.dumps(body).replace("{auth}", request.headers.get("Authorization", "")).encode()


@pytest.fixture
def canned() -> Iterator[Any]:
    yield from serve_each(lambda *replies: Canned(list(replies)))


def completion(content: str | None, *, model: str, usage: tuple[int, int] = (10, 5), **message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content, **message}}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# -- replay ---------------------------------------------------------------------------------


def run_episode(client: LLMClient, prompt: str, max_turns: int = 6, **kw: Any) -> list[ChatResult]:
    """A minimal agent loop: feed every tool call a dummy result until `finish` or text."""
    messages = user(prompt)
    results = []
    for _ in range(max_turns):
        result = client.chat(messages, tools=TOOLS, temperature=0.0, **kw)
        results.append(result)
        messages.append(result.message)
        if not result.tool_calls or result.tool_calls[0]["function"]["name"] == "finish":
            break
        for call in result.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
    return results


def test_it_replays_a_three_step_solution(server: Any, waits: Waits) -> None:
    results = run_episode(client_for(waits, offline(server)), PRIMES)

    assert [r.tool_calls[0]["function"]["name"] for r in results] == ["write_file", "run_shell", "finish"]
    for r in results:
        assert (r.provider, r.model, r.finish_reason, r.cached, r.attempts) == ("offline", MODEL_NAME, "tool_calls", False, 1)
        assert r.cost_usd == 0 and r.usage["total_tokens"] == r.usage["prompt_tokens"] + r.usage["completion_tokens"] > 0
        assert set(r.message) == {"role", "content", "tool_calls"}
        assert isinstance(r.tool_calls[0], dict) and r.tool_calls[0]["type"] == "function"
    assert json.loads(results[2].tool_calls[0]["function"]["arguments"]) == {"answer": "2 3 5 7 11 13 17 19 23 29"}
    assert waits.delays == []


@pytest.mark.asyncio
async def test_achat_replays_the_same_solution_concurrently(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    results = await asyncio.gather(
        *(client.achat(user(), tools=TOOLS, cache_key_extra={"sample": i}) for i in range(5))
    )
    await client.aclose()
    assert {r.tool_calls[0]["function"]["name"] for r in results} == {"write_file"}
    assert {r.provider for r in results} == {"offline"}
    assert server.model.chat_requests == 5


def test_an_unknown_prompt_gets_honest_text_and_no_tool_call(server: Any, waits: Waits) -> None:
    result = client_for(waits, offline(server)).chat(user("Compose a sonnet."), tools=TOOLS)
    assert result.tool_calls == [] and "tool_calls" not in result.message
    assert result.finish_reason == "stop"
    assert "no script for this task" in result.content


def test_malformed_arguments_are_delivered_as_is(server: Any, waits: Waits) -> None:
    result = client_for(waits, offline(server)).chat(user(), tools=TOOLS, extra_headers=fault("malformed"))
    arguments = result.tool_calls[0]["function"]["arguments"]
    assert arguments.startswith('{"path": "primes.py"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(arguments)


def test_reasoning_content_is_kept(canned: Any, waits: Waits) -> None:
    endpoint = canned((200, {}, completion("42", model="deepseek-reasoner", reasoning_content="6 x 7")))
    result = client_for(waits, Provider("deepseek", endpoint.url, "deepseek-reasoner", SK_KEY)).chat(user("q"))
    assert result.message == {"role": "assistant", "content": "42", "reasoning_content": "6 x 7"}


# -- retries --------------------------------------------------------------------------------


def test_429_retry_after_is_honoured(server: Any, waits: Waits) -> None:
    result = client_for(waits, offline(server)).chat(user(), tools=TOOLS, extra_headers=fault("429;retry_after=7;times=2"))
    assert waits.delays == [7.0, 7.0]
    assert result.attempts == 3 and result.tool_calls[0]["function"]["name"] == "write_file"
    assert server.model.chat_requests == 3 and result.rate_limited == 2


@pytest.mark.asyncio
async def test_achat_honours_retry_after_too(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    result = await client.achat(user(), tools=TOOLS, extra_headers=fault("429;retry_after=4;times=1"))
    await client.aclose()
    assert waits.delays == [4.0] and result.attempts == 2 and result.rate_limited == 1


def test_a_retry_after_too_long_to_wait_for_fails_at_once(server: Any, waits: Waits) -> None:
    with pytest.raises(LLMRateLimited) as exc:
        client_for(waits, offline(server)).chat(user(), tools=TOOLS, extra_headers=fault("429;retry_after=3600"))
    assert exc.value.retry_after == 3600 and exc.value.retryable and exc.value.status_code == 429
    assert waits.delays == [] and server.model.chat_requests == 1


def test_a_500_is_retried_with_jittered_exponential_backoff(server: Any, waits: Waits) -> None:
    result = client_for(waits, offline(server)).chat(user(), tools=TOOLS, extra_headers=fault("500;times=2"))
    # base 1 s then 2 s, times (0.5 + 0.5 * rand) with rand fixed at 0.5
    assert waits.delays == [0.75, 1.5]
    assert result.attempts == 3 and result.rate_limited == 0  # retried, but not rate limited


def test_exhausted_retries_raise_a_typed_error(server: Any, waits: Waits) -> None:
    with override_settings(LLM_MAX_RETRIES=2), pytest.raises(LLMUnavailable) as exc:
        client_for(waits, offline(server)).chat(user(), tools=TOOLS, extra_headers=fault("503"))
    err = exc.value
    assert (err.status_code, err.attempts, err.provider, err.retryable) == (503, 3, "offline", True)
    assert "HTTP 503" in str(err) and "after 3 attempts" in str(err)
    assert len(waits.delays) == 2 and server.model.chat_requests == 3


def test_a_slow_reply_past_the_timeout_raises_llmtimeout(server: Any, waits: Waits) -> None:
    with override_settings(LLM_MAX_RETRIES=0), pytest.raises(LLMTimeout) as exc:
        client_for(waits, offline(server)).chat(user(), tools=TOOLS, timeout=0.3, extra_headers=fault("slow;seconds=2"))
    assert exc.value.retryable and exc.value.attempts == 1


def test_a_timeout_is_retried_like_other_transient_failures(server: Any, waits: Waits) -> None:
    result = client_for(waits, offline(server)).chat(
        user(), tools=TOOLS, timeout=0.3, extra_headers=fault("slow;seconds=2;times=1")
    )
    assert result.attempts == 2 and waits.delays == [0.75]


def test_a_bad_request_is_not_retried(server: Any, waits: Waits) -> None:
    with pytest.raises(LLMBadRequest) as exc:
        client_for(waits, offline(server)).chat(user(), tools=TOOLS[1:])  # write_file not offered
    assert exc.value.status_code == 400 and not exc.value.retryable
    assert waits.delays == [] and server.model.chat_requests == 1


def test_a_response_without_choices_is_invalid_and_retried(canned: Any, waits: Waits) -> None:
    endpoint = canned((200, {}, {**completion("x", model="m"), "choices": []}), (200, {}, completion("fine", model="m")))
    result = client_for(waits, Provider("custom", endpoint.url, "m", SK_KEY)).chat(user("q"))
    assert result.content == "fine" and result.attempts == 2

    endpoint = canned((200, {}, {**completion("x", model="m"), "choices": []}))
    with override_settings(LLM_MAX_RETRIES=0), pytest.raises(LLMResponseInvalid):
        client_for(waits, Provider("custom", endpoint.url, "m", SK_KEY)).chat(user("q"), use_cache=False)


# -- cache ----------------------------------------------------------------------------------


def test_an_identical_call_is_answered_from_the_cache(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    first = client.chat(user(), tools=TOOLS, temperature=0.7, cache_key_extra={"task": 1, "sample": 0})
    second = client.chat(user(), tools=TOOLS, temperature=0.7, cache_key_extra={"task": 1, "sample": 0})
    assert server.model.chat_requests == 1
    assert (second.cached, second.attempts, first.cached) == (True, 0, False)
    assert (second.message, second.usage, second.provider, second.model) == (first.message, first.usage, "offline", MODEL_NAME)

    # A resumed batch: a fresh client (another worker) finds the same answer.
    client_for(waits, offline(server)).chat(user(), tools=TOOLS, temperature=0.7, cache_key_extra={"task": 1, "sample": 0})
    assert server.model.chat_requests == 1


@pytest.mark.django_db
def test_the_cache_identity_is_the_trajectorys_uuid_so_a_flushed_database_never_gets_old_answers(
        server: Any, waits: Waits, make_task: Any) -> None:
    from apps.tasks.models import Trajectory

    task = make_task(prompt="same prompt")
    old = Trajectory.objects.create(task=task, iteration=1, sample_index=0)
    client = client_for(waits, offline(server))
    client.chat(user(), tools=TOOLS, temperature=0.7, cache_key_extra=cache_identity(old.uuid))
    # A fresh database: the same task and the same primary key, another trajectory.
    pk = old.pk
    old.delete()
    new = Trajectory.objects.create(pk=pk, task=task, iteration=1, sample_index=0)
    assert new.uuid != old.uuid
    assert not client.chat(user(), tools=TOOLS, temperature=0.7, cache_key_extra=cache_identity(new.uuid)).cached
    # Its own retry (same UUID, another client: another worker) replays.
    assert client_for(waits, offline(server)).chat(user(), tools=TOOLS, temperature=0.7,
                                                    cache_key_extra=cache_identity(new.uuid)).cached
    assert server.model.chat_requests == 2
    assert cache_identity(str(new.uuid).upper()) == cache_identity(new.uuid) == {"trajectory": str(new.uuid)}
    with pytest.raises(ValueError):
        cache_identity(pk)


def test_another_sample_or_parameter_misses_the_cache(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    client.chat(user(), tools=TOOLS, temperature=0.7, cache_key_extra={"task": 1, "sample": 0})
    assert not client.chat(user(), tools=TOOLS, temperature=0.7, cache_key_extra={"task": 1, "sample": 1}).cached
    assert not client.chat(user(), tools=TOOLS, temperature=0.2, cache_key_extra={"task": 1, "sample": 0}).cached
    assert not client.chat(user(), tools=TOOLS[:2] + TOOLS, temperature=0.7, cache_key_extra={"task": 1, "sample": 0}).cached
    assert server.model.chat_requests == 4


def test_a_faulty_reply_is_never_replayed_for_a_normal_request(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    broken = client.chat(user(), tools=TOOLS, extra_headers=fault("malformed"))
    normal = client.chat(user(), tools=TOOLS)
    assert not normal.cached and normal.tool_calls[0]["function"]["arguments"] != broken.tool_calls[0]["function"]["arguments"]
    json.loads(normal.tool_calls[0]["function"]["arguments"])


def test_failures_are_not_cached(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    with override_settings(LLM_MAX_RETRIES=0), pytest.raises(LLMUnavailable):
        client.chat(user(), tools=TOOLS, extra_headers=fault("500;times=1"))
    assert not client.chat(user(), tools=TOOLS, extra_headers=fault("500;times=1")).cached
    assert server.model.chat_requests == 2


def test_use_cache_false_always_asks(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    client.chat(user(), tools=TOOLS, use_cache=False)
    client.chat(user(), tools=TOOLS, use_cache=False)
    assert server.model.chat_requests == 2
    assert caches["llm"].get(client.chat(user(), tools=TOOLS, use_cache=False).cache_key) is None


@pytest.mark.asyncio
async def test_cache_lookup_false_asks_but_still_stores_the_reply(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    first = await client.achat(user(), tools=TOOLS, cache_key_extra="s9")
    asked = await client.achat(user(), tools=TOOLS, cache_key_extra="s9", cache_lookup=False)
    hit = await client.achat(user(), tools=TOOLS, cache_key_extra="s9")
    await client.aclose()
    assert (first.cached, asked.cached, hit.cached) == (False, False, True)
    assert server.model.chat_requests == 2 and caches["llm"].get(asked.cache_key) is not None


@pytest.mark.asyncio
async def test_achat_reads_and_writes_the_same_cache(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    await client.achat(user(), tools=TOOLS, cache_key_extra="s0")
    again = await client.achat(user(), tools=TOOLS, cache_key_extra="s0")
    await client.aclose()
    assert again.cached and server.model.chat_requests == 1


@pytest.mark.asyncio
async def test_achat_stores_the_reply_before_it_returns(server: Any, waits: Waits) -> None:
    client = client_for(waits, offline(server))
    first = await client.achat(user(), tools=TOOLS, cache_key_extra="wb")
    stored = caches["llm"].get(first.cache_key)  # on disk already: nothing is left to flush
    assert stored is not None and stored["message"] == first.message
    first.message["content"] = "changed by the caller after the call"  # must not reach the cache
    other = client_for(waits, offline(server))
    hit = await other.achat(user(), tools=TOOLS, cache_key_extra="wb")
    assert hit.cached and server.model.chat_requests == 1
    assert hit.message["content"] != "changed by the caller after the call"
    await client.aclose()
    await other.aclose()


def test_the_llm_response_cache_keeps_replies_in_one_sqlite_file_shared_by_processes(tmp_path: Path) -> None:
    from apps.engines.llm import LLMResponseCache

    location = tmp_path / "llm-cache"
    cache = LLMResponseCache(str(location), {"TIMEOUT": None})
    assert cache.get("chat:a") is None
    for n in range(50):
        cache.set(f"chat:{n}", {"message": {"content": f"reply {n}"}}, None)
    cache.set("chat:a", {"message": {"content": "hi"}}, None)
    cache.set("chat:a", {"message": {"content": "again"}}, None)  # replaced
    assert cache.get("chat:a") == {"message": {"content": "again"}} and cache.get("chat:7")["message"]["content"] == "reply 7"
    # No file per reply: the SQLite file and its WAL.
    assert {p.name for p in location.iterdir()} <= {"replies.sqlite3", "replies.sqlite3-wal", "replies.sqlite3-shm"}
    # Another process (a second worker) reads what this one wrote and writes what this one reads.
    script = textwrap.dedent(f"""
        from apps.engines.llm import LLMResponseCache
        cache = LLMResponseCache({str(location)!r}, {{"TIMEOUT": None}})
        assert cache.get("chat:a") == {{"message": {{"content": "again"}}}}
        cache.set("chat:from-child", [1, 2, 3], None)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=settings.BASE_DIR)
    # Another thread of this process has a connection of its own, to the same file.
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(LLMResponseCache(str(location), {}).get("chat:from-child")))
    thread.start()
    thread.join(30)
    assert seen == [[1, 2, 3]]


def test_the_llm_response_cache_makes_its_file_again_when_it_is_removed_under_it(tmp_path: Path) -> None:
    from apps.engines.llm import LLMResponseCache

    location = tmp_path / "llm-cache"
    cache = LLMResponseCache(str(location), {"TIMEOUT": None})
    cache.set("chat:a", {"n": 1}, None)
    shutil.rmtree(location)  # cleared by hand while a worker runs
    assert cache.get("chat:a") is None
    asyncio.run(cache.aset("chat:b", {"n": 2}, None))  # not into the deleted file
    assert LLMResponseCache(str(location), {}).get("chat:b") == {"n": 2}
    assert asyncio.run(cache.aget("chat:b")) == {"n": 2}


def test_a_thread_keeps_connections_to_a_few_cache_files_only(tmp_path: Path) -> None:
    from apps.engines.llm import LLMResponseCache

    caches_ = [LLMResponseCache(str(tmp_path / f"c{n}"), {"TIMEOUT": None}) for n in range(LLMResponseCache.CONNECTIONS_PER_THREAD + 3)]
    for n, cache in enumerate(caches_):
        cache.set("chat:n", n, None)
    held = LLMResponseCache._local.connections
    assert len(held) == LLMResponseCache.CONNECTIONS_PER_THREAD
    assert str(tmp_path / "c0" / "replies.sqlite3") not in held
    assert [cache.get("chat:n") for cache in caches_] == list(range(len(caches_)))  # reopened when needed


def test_the_llm_response_cache_honours_timeouts_add_touch_delete_and_clear(tmp_path: Path) -> None:
    from apps.engines.llm import LLMResponseCache

    cache = LLMResponseCache(str(tmp_path / "c"), {"TIMEOUT": None})
    now = time.time()
    cache.set("chat:short", "v", 10)
    cache.set("chat:forever", "w", None)
    assert not cache.add("chat:short", "other") and cache.add("chat:new", "n", None)
    with mock.patch("time.time", return_value=now + 20):
        assert cache.get("chat:short") is None and cache.get("chat:forever") == "w"
        assert not cache.touch("chat:short", 100)  # expired: nothing to touch
        assert cache.add("chat:short", "again", 10)  # an expired key can be added again
    assert cache.touch("chat:forever", 10)
    with mock.patch("time.time", return_value=now + 20):
        assert cache.get("chat:forever") is None
    assert cache.delete("chat:new") and not cache.delete("chat:new")
    cache.clear()
    assert cache.get("chat:short") is None and cache.get("chat:new") is None


# -- adaptive concurrency -------------------------------------------------------------------


def test_the_limiter_halves_on_429_once_per_burst_and_grows_back_slowly() -> None:
    limiter = AIMDLimiter(8, increase_every=3)
    tickets = [limiter.acquire() for _ in range(4)]
    for ticket in tickets:  # four 429s from requests sent together: one halving
        limiter.release(ticket, "rate_limited")
    assert (limiter.limit, limiter.in_flight) == (4, 0)

    limiter.release(limiter.acquire(), "rate_limited")
    limiter.release(limiter.acquire(), "rate_limited")
    limiter.release(limiter.acquire(), "rate_limited")
    assert limiter.limit == 1  # never below the floor
    limiter.release(limiter.acquire(), "rate_limited")
    assert limiter.limit == 1

    for _ in range(5):
        limiter.release(limiter.acquire(), "ok")
    assert limiter.limit == 2  # +1 per 3 consecutive successes
    limiter.release(limiter.acquire(), "error")
    assert limiter.limit == 2  # other errors neither grow nor shrink it
    for _ in range(3 * 20):
        limiter.release(limiter.acquire(), "ok")
    assert limiter.limit == 8  # never above the maximum


@pytest.mark.asyncio
async def test_the_limiter_makes_async_callers_wait_for_a_slot() -> None:
    limiter = AIMDLimiter(2)
    holding, peak, gate = 0, 0, asyncio.Event()

    async def request() -> None:
        nonlocal holding, peak
        ticket = await limiter.aacquire()
        holding += 1
        peak = max(peak, holding)
        await gate.wait()
        holding -= 1
        limiter.release(ticket)

    tasks = [asyncio.create_task(request()) for _ in range(6)]
    await asyncio.sleep(0.01)
    assert (holding, limiter.in_flight) == (2, 2)
    gate.set()
    await asyncio.gather(*tasks)
    assert peak == 2 and limiter.in_flight == 0


def test_the_limiter_makes_threads_wait_for_a_slot() -> None:
    limiter = AIMDLimiter(1)
    ticket = limiter.acquire()
    acquired = threading.Event()

    def worker() -> None:
        limiter.release(limiter.acquire())
        acquired.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert not acquired.wait(0.05)
    limiter.release(ticket)
    thread.join(5)
    assert acquired.is_set() and limiter.in_flight == 0


def test_the_client_cuts_concurrency_on_429_and_regrows(server: Any, waits: Waits) -> None:
    limiters: dict[str, AIMDLimiter] = {}
    client = LLMClient([offline(server)], sleep=waits.sleep, rand=lambda: 0.5, limiters=limiters)
    client.chat(user(), tools=TOOLS, use_cache=False, extra_headers=fault("429;retry_after=0;times=1"))
    limiter = limiters["offline"]
    assert limiter.limit == 4  # LLM_MAX_CONCURRENCY 8, halved
    for _ in range(limiter.increase_every - 1):  # the retried call's success counted once already
        client.chat(user(), tools=TOOLS, use_cache=False)
    assert limiter.limit == 5


# -- providers and fallback -----------------------------------------------------------------


def test_it_falls_back_to_the_next_provider_when_the_first_is_down(server: Any, waits: Waits) -> None:
    down = Provider("deepseek", closed_port_url(), "deepseek-chat", SK_KEY)
    result = client_for(waits, down, offline(server)).chat(user(), tools=TOOLS)
    assert (result.provider, result.model, result.failed_providers) == ("offline", MODEL_NAME, ("deepseek",))
    assert len(waits.delays) == 3  # the primary had all its retries first
    assert result.tool_calls[0]["function"]["name"] == "write_file"


def test_an_offline_model_that_is_not_running_is_named_in_the_error(waits: Waits) -> None:
    with override_settings(LLM_MAX_RETRIES=0, OFFLINE_MODEL_URL=closed_port_url()), pytest.raises(LLMUnavailable) as exc:
        LLMClient(sleep=waits.sleep, limiters={}).chat(user())
    assert "manage.py offline_model" in str(exc.value) and exc.value.provider == "offline"


@pytest.mark.asyncio
async def test_achat_reports_a_refused_connection_as_one_not_as_a_timeout(waits: Waits) -> None:
    # aiohttp's transport raises a connect *timeout* for a refused connection; chat() always said
    # "connection failed" with the offline model's hint, achat() said "request timed out".
    with override_settings(LLM_MAX_RETRIES=0, OFFLINE_MODEL_URL=closed_port_url()):
        client = LLMClient(sleep=waits.sleep, asleep=waits.asleep, limiters={})
        with pytest.raises(LLMUnavailable) as exc:
            await client.achat(user())
        await client.aclose()
    assert "connection failed: ConnectionRefusedError" in str(exc.value) and "manage.py offline_model" in str(exc.value)


def test_it_falls_back_after_a_provider_keeps_failing_with_5xx(waits: Waits) -> None:
    with running_offline_model([EXAMPLES], faults="503") as broken, running_offline_model([EXAMPLES]) as good:
        result = client_for(waits, offline(broken, "gemini"), offline(good, "openai")).chat(user(), tools=TOOLS)
        assert result.provider == "openai" and result.failed_providers == ("gemini",)
        assert (broken.model.chat_requests, good.model.chat_requests) == (4, 1)


def test_when_every_provider_fails_the_error_names_each(waits: Waits) -> None:
    with override_settings(LLM_MAX_RETRIES=0), pytest.raises(LLMUnavailable) as exc:
        client_for(
            waits, Provider("deepseek", closed_port_url(), "deepseek-chat", SK_KEY),
            Provider("openai", closed_port_url(), "gpt-4o-mini", ODD_KEY),
        ).chat(user())
    assert [p for p, _ in exc.value.failures] == ["deepseek", "openai"]
    assert "every provider failed" in str(exc.value) and "connection failed" in str(exc.value)


def test_a_bad_request_does_not_fall_back(server: Any, waits: Waits) -> None:
    with running_offline_model([EXAMPLES]) as second, pytest.raises(LLMBadRequest):
        client_for(waits, offline(server), offline(second, "openai")).chat(user(), tools=TOOLS[1:])
    assert second.model.chat_requests == 0


def test_a_caller_model_applies_to_the_primary_only(server: Any, waits: Waits) -> None:
    down = Provider("deepseek", closed_port_url(), "deepseek-chat", SK_KEY)
    result = client_for(waits, down, offline(server)).chat(user(), tools=TOOLS, model="deepseek-reasoner")
    assert (result.requested_model, result.provider) == (MODEL_NAME, "offline")


def test_without_configuration_the_provider_is_the_offline_model() -> None:
    [provider] = resolve_providers()
    assert (provider.name, provider.base_url, provider.model) == ("offline", "http://127.0.0.1:8765/v1", MODEL_NAME)


def test_a_key_alone_means_deepseek() -> None:
    with override_settings(LLM_API_KEY=SK_KEY):
        [provider] = resolve_providers()
    assert (provider.name, provider.base_url, provider.model, provider.api_key) == (
        "deepseek", "https://api.deepseek.com", "deepseek-flash", SK_KEY)
    assert provider.profile == "deepseek"


def test_url_key_and_model_form_the_single_provider() -> None:
    with override_settings(LLM_BASE_URL="https://api.openai.com/v1", LLM_API_KEY=SK_KEY, LLM_MODEL="gpt-4.1-mini"):
        assert resolve_providers()[0].name == "openai"
    with override_settings(LLM_BASE_URL="http://gpu-box:8000/v1", LLM_MODEL="Qwen/Qwen3-8B"):
        [provider] = resolve_providers()
    assert (provider.name, provider.model) == ("custom", "Qwen/Qwen3-8B")


def test_a_model_without_an_endpoint_is_an_error_not_the_offline_model() -> None:
    with override_settings(LLM_MODEL="deepseek-chat"), pytest.raises(ImproperlyConfigured, match="LLM_MODEL"):
        resolve_providers()
    with override_settings(LLM_MODEL="scripted-reference+fault=429"):
        assert resolve_providers()[0].model == "scripted-reference+fault=429"


def test_llm_providers_picks_the_configured_ones_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", SK_KEY)
    monkeypatch.setenv("VLLM_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("VLLM_MODEL", "Qwen/Qwen3-8B")
    monkeypatch.setenv("OPENAI_API_KEY", ODD_KEY)
    monkeypatch.setenv("OPENAI_MODEL", "gpt-4.1")
    with override_settings(LLM_PROVIDERS="gemini, vllm,deepseek,openai", LLM_API_KEY="ignored-in-this-mode"):
        providers = resolve_providers()
    assert [(p.name, p.model) for p in providers] == [
        ("vllm", "Qwen/Qwen3-8B"), ("deepseek", "deepseek-flash"), ("openai", "gpt-4.1")]
    assert providers[1].base_url == "https://api.deepseek.com"
    assert providers[2].base_url == "https://api.openai.com/v1"


def test_llm_providers_misconfigurations_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(LLM_PROVIDERS="gemini,openai"), pytest.raises(ImproperlyConfigured, match="none of them"):
        resolve_providers()
    with override_settings(LLM_PROVIDERS="deepseek,claude"), pytest.raises(ImproperlyConfigured, match="claude"):
        resolve_providers()
    monkeypatch.setenv("VLLM_BASE_URL", "http://127.0.0.1:8000/v1")
    with override_settings(LLM_PROVIDERS="vllm"), pytest.raises(ImproperlyConfigured, match="VLLM_MODEL"):
        resolve_providers()
    with override_settings(LLM_PROVIDERS="gemini,offline"):
        assert [p.name for p in resolve_providers()] == ["offline"]


# -- cost -----------------------------------------------------------------------------------


def test_cost_comes_from_the_profiles_prices() -> None:
    assert cost_usd("deepseek-flash", 1_000_000, 1_000_000) == Decimal("1.50")
    assert cost_usd("deepseek-chat", 1_000_000, 1_000_000) == 0  # retired: no price (and refused before a batch)
    assert price_per_mtok("gpt-4o-mini-2024-07-18") == (Decimal("0.15"), Decimal("0.60"))
    assert price_per_mtok("gpt-4o-2024-08-06") == (Decimal("2.50"), Decimal("10.00"))
    assert price_per_mtok("models/gemini-3.5-flash") == (Decimal("1.50"), Decimal("9.00"))
    assert cost_usd("some-local-model", 10**6, 10**6) == 0 and price_per_mtok("some-local-model") is None
    assert cost_usd(MODEL_NAME, 10**6, 10**6) == 0
    # cached input tokens are part of the prompt tokens, at the cache-hit price
    assert cost_usd("deepseek-v4-pro", 1_000_000, 0, cached_tokens=750_000) == Decimal("0.363")  # 0.25 x 1.32 + 0.75 x 0.044
    with override_settings(LLM_PRICES={"some-local-model": ["1", "2"]}):
        assert cost_usd("some-local-model", 500_000, 250_000) == Decimal("1.0")
        assert cost_usd("some-local-model", 500_000, 250_000, cached_tokens=500_000) == Decimal("1.0")  # no cache price
    with override_settings(LLM_PRICES={"some-local-model": ["1", "0.1", "2"], "deepseek-flash": ["0.15", "0.003", "0.6"]}):
        assert cost_usd("some-local-model", 500_000, 250_000, cached_tokens=500_000) == Decimal("0.55")
        assert cost_usd("deepseek-flash", 1_000_000, 1_000_000) == Decimal("0.75")  # an override wins over the profile
    with override_settings(LLM_PRICES={"m": ["1"]}), pytest.raises(ImproperlyConfigured, match=r"LLM_PRICES\['m'\]"):
        cost_usd("m", 1, 1)


def test_each_call_records_tokens_and_cost(canned: Any, waits: Waits) -> None:
    endpoint = canned((200, {}, completion("hi", model="deepseek-flash", usage=(1000, 500))))
    result = client_for(waits, Provider("deepseek", endpoint.url, "deepseek-flash", SK_KEY)).chat(user("q"))
    assert result.usage == {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
    assert result.cached_tokens == 0
    assert result.cost_usd == Decimal("0.0009")  # 1000 x 0.30 + 500 x 1.20 per million
    assert result.to_dict()["cost_usd"] == "0.0009"


# -- secrets --------------------------------------------------------------------------------


def assert_no_key(*texts: str) -> None:
    for text in texts:
        assert SK_KEY not in text and ODD_KEY not in text
        assert SK_KEY[10:30] not in text and ODD_KEY[8:] not in text


@pytest.mark.parametrize("key", [SK_KEY, ODD_KEY])
def test_an_api_key_quoted_back_by_the_provider_never_leaks(
    key: str, canned: Any, waits: Waits, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    quoting = {"error": {"message": "Incorrect API key provided: {auth}", "type": "invalid_request_error"}}
    failing = canned((500, {}, quoting), (401, {}, quoting))
    with override_settings(LLM_BASE_URL=failing.url, LLM_API_KEY=key, LLM_MODEL="m"), pytest.raises(LLMError) as exc:
        client = LLMClient(sleep=waits.sleep, limiters={})
        client.chat(user("q"))
    err = exc.value
    assert isinstance(err, LLMBadRequest) and err.status_code == 401
    assert REDACTED in str(err)
    logging.getLogger("apps.engines.llm").exception("rollout failed", exc_info=err)
    logging.getLogger("apps.engines.llm").warning("configured with %s", key)
    assert_no_key(str(err), repr(err), err.message, caplog.text, repr(client), repr(client.providers))
    chained: BaseException | None = err
    while chained is not None:  # no SDK exception (which holds the request headers) in the chain
        assert isinstance(chained, LLMError)
        chained = chained.__cause__ or chained.__context__


def test_a_key_echoed_in_a_reply_is_redacted_from_the_result(canned: Any, waits: Waits) -> None:
    endpoint = canned((200, {}, completion("your key is {auth}", model="deepseek-chat")))
    result = client_for(waits, Provider("deepseek", endpoint.url, "deepseek-chat", ODD_KEY)).chat(user("q"))
    assert result.content == f"your key is Bearer {REDACTED}"
    assert_no_key(repr(result), json.dumps(result.to_dict()))


def test_model_output_keeps_ordinary_labelled_values(canned: Any, waits: Waits) -> None:
    text = f'db_password = "hunter2hunter2" and a leaked {SK_KEY}'
    endpoint = canned((200, {}, completion(text, model="deepseek-chat")))
    result = client_for(waits, Provider("deepseek", endpoint.url, "deepseek-chat", ODD_KEY)).chat(user("q"))
    assert result.content == f'db_password = "hunter2hunter2" and a leaked {REDACTED}'


def test_fallback_errors_carry_no_key(waits: Waits, caplog: pytest.LogCaptureFixture) -> None:
    url = closed_port_url().replace("http://", f"http://user:{ODD_KEY}@")
    with override_settings(LLM_MAX_RETRIES=1), pytest.raises(LLMUnavailable) as exc:
        client_for(waits, Provider("deepseek", url, "deepseek-chat", SK_KEY), Provider("openai", url, "m", ODD_KEY)).chat(user())
    assert_no_key(str(exc.value), repr(exc.value.failures), caplog.text)


def test_redact_covers_common_key_shapes_and_leaves_counts_alone() -> None:
    text = (
        f"Authorization: Bearer abc.def-123456789 key={SK_KEY} url=https://u:hunter22pass@db:5432/x "
        "https://generativelanguage.googleapis.com/v1?key=AIzaSyA1234567890abcdefghijklmnopqrstu "
        'GEMINI_API_KEY=abcdefgh12345678 {"api_key": "qwertyuiop1234"}'
    )
    out = redact(text)
    for secret in ("abc.def-123456789", SK_KEY, "hunter22pass", "AIzaSyA1234567890", "abcdefgh12345678", "qwertyuiop1234"):
        assert secret not in out
    data = redact({"api_key": "short", "prompt_tokens": 12, "max_tokens": 5, "headers": {"Authorization": "x"},
                   "nested": [f"token {SK_KEY}"]})
    assert data == {"api_key": REDACTED, "prompt_tokens": 12, "max_tokens": 5, "headers": {"Authorization": REDACTED},
                    "nested": [f"token {REDACTED}"]}


def test_redact_removes_pem_private_keys_even_without_their_end_line() -> None:
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
    whole = f"cat id_rsa\n-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\ndone"
    assert redact(whole, labels=False) == f"cat id_rsa\n{REDACTED}\ndone"
    cut = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{body}"  # truncated tool output
    assert body not in redact(cut, labels=False)
    public = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----"
    assert redact(public) == public


def test_secret_values_follow_the_environment_settings_and_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajplatform.redaction import register_secret, secret_values

    before = secret_values()
    assert secret_values() == before  # cached, and a copy each time
    secret_values().append("mutated-by-a-caller")
    assert "mutated-by-a-caller" not in secret_values()
    monkeypatch.setenv("SOME_VENDOR_API_KEY", "env-secret-1234567")
    assert "env-secret-1234567" in secret_values() and "env-secret-1234567" not in redact("x env-secret-1234567")
    monkeypatch.delenv("SOME_VENDOR_API_KEY")
    assert "env-secret-1234567" not in secret_values()
    with override_settings(SOME_SERVICE_TOKEN="setting-secret-1234567"):
        assert "setting-secret-1234567" in secret_values()
    assert "setting-secret-1234567" not in secret_values()
    register_secret("registered-secret-1234567")
    assert "registered-secret-1234567" in secret_values()


def test_the_request_body_is_sent_as_given(server: Any, waits: Waits) -> None:
    client = client_for(waits, Provider("offline", server.url, MODEL_NAME))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PRIMES}]
    client.chat(messages, tools=TOOLS, temperature=0.0, use_cache=False)
    body = server.model.requests[-1]["body"]
    assert body == {"model": MODEL_NAME, "messages": messages, "tools": TOOLS, "temperature": 0.0}


def test_async_calls_share_one_aiohttp_client_per_event_loop(server: Any) -> None:
    async def run() -> tuple[set[int], str, bool]:
        client = LLMClient([Provider("offline", server.url, MODEL_NAME)], limiters={})
        sdk = client._async_client(client.primary)
        try:
            ids = {id(client._async_client(client.primary)) for _ in range(10)}
            result = await client.achat([{"role": "user", "content": PRIMES}], tools=TOOLS, use_cache=False)
            return ids | {id(sdk)}, type(sdk._client._transport).__name__, bool(result.tool_calls)
        finally:
            await client.aclose()
            assert sdk.is_closed()

    ids, transport, answered = asyncio.run(run())
    assert len(ids) == 1
    assert transport == "AiohttpTransport"
    assert answered


def test_a_named_provider_is_asked_first_and_an_unknown_one_is_refused(server: Any, waits: Waits) -> None:
    from apps.engines.llm import LLMBadRequest

    second = Provider("vllm", offline(server).base_url, offline(server).model)
    client = client_for(waits, offline(server), second)
    assert client.chat(user(), tools=TOOLS, use_cache=False).provider == "offline"
    assert client.chat(user(), tools=TOOLS, use_cache=False, provider="vllm").provider == "vllm"
    with pytest.raises(LLMBadRequest, match=r"provider 'gemini' is not configured \(configured: offline, vllm\)"):
        client.chat(user(), tools=TOOLS, provider="gemini")
