"""manage.py llm_check against loopback stand-ins of a provider."""
from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from apps.engines.llm import reset_limiters, reset_model_lists
from tests.engines.test_llm_profiles import KEY, PROFILE_VARS, Recorder, reply

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in PROFILE_VARS:
        monkeypatch.delenv(name, raising=False)
    with override_settings(LLM_BASE_URL="", LLM_API_KEY="", LLM_MODEL="", LLM_PROVIDERS="", LLM_PROFILES="",
                           LLM_MAX_RETRIES=0):
        reset_limiters()
        reset_model_lists()
        yield
    reset_limiters()
    reset_model_lists()


@pytest.fixture
def deepseek(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "prompt_cache_hit_tokens": 8}
    srv = Recorder(reply("deepseek-flash", usage, reasoning_content="trivial"), models=("deepseek-flash",))
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    monkeypatch.setenv("DEEPSEEK_BASE_URL", srv.url)
    yield srv
    srv.shutdown()
    srv.server_close()


def run(*args: str) -> str:
    out = StringIO()
    call_command("llm_check", *args, stdout=out)
    return out.getvalue()


def test_it_prints_what_the_provider_will_be_sent_and_makes_one_tiny_request(deepseek: Recorder) -> None:
    out = run()
    for line in ("deepseek (primary)", "profile                deepseek", "model                  deepseek-flash",
                 'thinking request       {"thinking": {"type": "enabled"}}', "reasoning echo         tool_turns",
                 "context window         1,000,000 tokens", "input $0.30, cached input $0.006, output $1.20",
                 "model check: ok", "request: answered by deepseek-flash", "12 prompt (8 cached), 3 completion"):
        assert line in out, line
    assert KEY not in out
    [get, post] = deepseek.requests
    assert get == {"get": "/v1/models"}
    assert post["body"]["messages"] == [{"role": "user", "content": "Reply with the single word: ok"}]
    assert post["body"]["max_tokens"] == 1024 and post["body"]["thinking"] == {"type": "enabled"}


def test_no_request_only_checks(deepseek: Recorder) -> None:
    out = run("--no-request")
    assert "model check: ok" in out and "request:" not in out
    assert all("body" not in r for r in deepseek.requests)


def test_a_retired_model_fails_the_check_naming_the_replacement(deepseek: Recorder, monkeypatch: Any) -> None:
    monkeypatch.setenv("DEEPSEEK_MODEL", "deepseek-reasoner")
    with pytest.raises(CommandError, match="deepseek-reasoner.*retired.*deepseek-flash"):
        run()
    assert deepseek.requests == []


def test_the_offline_model_is_named_as_a_stand_in_and_an_unknown_provider_is_refused() -> None:
    out = run("--no-request")
    assert "offline (primary)" in out and "not a language model" in out and "route headers          yes" in out
    with pytest.raises(CommandError, match="'deepseek' is not configured"):
        run("--provider", "deepseek")


def test_help_lists_every_option() -> None:
    from apps.engines.management.commands.llm_check import Command

    text = Command().create_parser("manage.py", "llm_check").format_help()
    for option in ("--no-request", "--provider", "--timeout", "--max-tokens"):
        assert option in text
