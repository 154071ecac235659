"""The provider profiles (apps/engines/profiles.json through apps.engines.profiles)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from apps.engines import profiles
from apps.engines.llm import (
    ROUTE_HEADER, LLMClient, ModelConfigError, Provider, check_models, llm_route, reset_limiters, reset_model_lists,
    resolve_providers,
)
from tests.engines.llm_servers import LoopbackServer, json_answer, serve_each

EXPECTED = {"deepseek", "openai", "gemini", "anthropic", "vllm", "vllm-noparser", "sglang", "sglang-noparser",
            "ollama", "moonshot", "zhipu", "openrouter", "offline"}


def test_every_profile_loads_with_sources_and_a_current_default():
    every = profiles.all_profiles()
    assert EXPECTED <= set(every)
    for pid, profile in every.items():
        assert profile.id == pid
        if pid not in ("custom", "offline"):
            assert profile.sources and all(s["checked"] == "2026-12-01" for s in profile.sources), pid
        if profile.default_model:
            assert profile.replacement(profile.default_model) is None, pid
            assert profile.default_model in profile.models, pid
    assert [p.id for p in every.values() if p.routing_headers] == ["offline"]


def test_deepseek_profile_follows_its_documentation():
    deepseek = profiles.get("deepseek")
    assert deepseek.key_var == "DEEPSEEK_API_KEY"
    assert deepseek.replacement("deepseek-chat") == deepseek.replacement("deepseek-reasoner") == "deepseek-flash"
    assert deepseek.reasoning_echo == "tool_turns" and deepseek.reasoning_echo_field == "reasoning_content"
    assert deepseek.cached_usage_paths[0] == "prompt_cache_hit_tokens"
    pro = deepseek.model("deepseek-v4-pro")
    assert (pro.price_input, pro.price_cached_input, pro.price_output) == (Decimal("1.32"), Decimal("0.044"),
                                                                          Decimal("3.96"))
    assert pro.context_window == 1_000_000 and pro.thinks


def test_model_lookup_exact_then_longest_prefix_then_defaults():
    openai = profiles.get("openai")
    assert openai.model("gpt-4o-mini-2024-07-18").name == "gpt-4o-mini"
    assert openai.model("gpt-4o-2024-08-06").name == "gpt-4o"
    assert profiles.get("gemini").model("models/gemini-3.5-flash").name == "gemini-3.5-flash"
    unknown = profiles.get("vllm").model("Qwen/Qwen3-8B")
    assert unknown.price_input is None and unknown.context_window == profiles.get("vllm").default_context_window


def test_unknown_profile_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ImproperlyConfigured, match="unknown LLM profile 'nope'.*deepseek"):
        profiles.get("nope")


def test_llm_profiles_setting_merges_over_the_file(settings, tmp_path):
    settings.LLM_PROFILES = json.dumps({"vllm": {"default_context_window": 40960,
                                                 "models": {"Qwen3-8B": {"context_window": 40960, "max_output": 8192}}},
                                        "deepseek": {"models": {"deepseek-flash": {"price_input": "0.15"}}}})
    assert profiles.get("vllm").model("Qwen3-8B-AWQ").context_window == 40960
    assert profiles.get("vllm").text_tool_format is None  # the rest of the file's profile stays
    assert profiles.get("deepseek").model("deepseek-flash").price_input == Decimal("0.15")
    assert profiles.get("deepseek").model("deepseek-v4-pro").price_input == Decimal("1.32")
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"profiles": {"mine": {**json.loads(profiles.PROFILES_FILE.read_text())["profiles"]["vllm"],
                                                       "text_tool_format": "mistral"}}}))
    settings.LLM_PROFILES = str(path)
    assert profiles.get("mine").text_tool_format == "mistral"


@pytest.mark.parametrize("override, message", [
    ({"deepseek": {"reasoning_echo": "sometimes"}}, "reasoning_echo must be one of"),
    ({"deepseek": {"models": {"x": {"price_input": "cheap"}}}}, r"models\.x\.price_input must be a number"),
    ({"openai": {"max_tokens_param": "max_output"}}, "max_tokens_param must be one of"),
    ({"vllm": {"text_tool_format": "xml"}}, "text_tool_format must be null or one of"),
    ({"new": {"url_var": "X"}}, "missing"),
])
def test_bad_profile_data_is_a_config_error_naming_the_field(settings, override, message):
    settings.LLM_PROFILES = json.dumps(override)
    with pytest.raises(ImproperlyConfigured, match=message):
        profiles.all_profiles()


def test_unreadable_llm_profiles_is_a_config_error(settings, tmp_path):
    settings.LLM_PROFILES = str(tmp_path / "missing.json")
    with pytest.raises(ImproperlyConfigured, match="cannot read the file"):
        profiles.all_profiles()
    settings.LLM_PROFILES = "{not json"
    with pytest.raises(ImproperlyConfigured, match="not valid JSON"):
        profiles.all_profiles()


def test_usage_path_reads_dotted_paths():
    usage = {"prompt_cache_hit_tokens": 7, "prompt_tokens_details": {"cached_tokens": 5}}
    assert profiles.usage_path(usage, "prompt_cache_hit_tokens") == 7
    assert profiles.usage_path(usage, "prompt_tokens_details.cached_tokens") == 5
    assert profiles.usage_path(usage, "cached_tokens") is None
    assert profiles.usage_path({"prompt_tokens_details": None}, "prompt_tokens_details.cached_tokens") is None


# -- the client applies the profile ---------------------------------------------------------

KEY = "sk-test-profile-7c1e9a3b5d2f4e6a8b0c"
PROFILE_VARS = sorted({v for p in profiles.all_profiles().values()
                       for v in (p.key_var, p.url_var, p.model_var, p.optional_key_var) if v} - {"OFFLINE_MODEL_URL"})


class Recorder(LoopbackServer):
    """Answers every chat completion with `reply` and records each request's body and headers."""

    def __init__(self, reply: dict[str, Any], models: tuple[str, ...] = ()):
        self.reply, self.requests, self.models = reply, [], models
        super().__init__()

    def on_post(self, request: Any, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        self.requests.append({"body": json.loads(raw), "headers": {k.lower(): v for k, v in request.headers.items()}})
        return json_answer(self.reply)

    def on_get(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        self.requests.append({"get": request.path})
        return json_answer({"object": "list", "data": [{"id": m} for m in self.models]}, 200 if self.models else 404)


def reply(model: str, usage: dict[str, Any], **message: Any) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": model, "usage": usage,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok", **message}}]}


@pytest.fixture
def recorder() -> Iterator[Any]:
    yield from serve_each(Recorder)


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[None]:
    for name in PROFILE_VARS:
        monkeypatch.delenv(name, raising=False)
    cache = {"BACKEND": "apps.engines.llm.LLMResponseCache", "LOCATION": str(tmp_path / "llm"), "TIMEOUT": None}
    from django.conf import settings as dj

    with override_settings(LLM_BASE_URL="", LLM_API_KEY="", LLM_MODEL="", LLM_PROVIDERS="", LLM_PROFILES="",
                           LLM_MAX_RETRIES=0, CACHES={**dj.CACHES, "llm": cache}):
        reset_limiters()
        reset_model_lists()
        yield
    reset_limiters()
    reset_model_lists()


def test_a_deepseek_key_alone_configures_deepseek_with_a_current_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: LLM_PROVIDERS empty and no LLM_API_KEY meant the offline scripted model.
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    [provider] = resolve_providers()
    assert (provider.name, provider.profile, provider.model, provider.base_url) == (
        "deepseek", "deepseek", "deepseek-flash", "https://api.deepseek.com")
    monkeypatch.setenv("DEEPSEEK_BASE_URL", "https://proxy.example/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert [(p.name, p.base_url) for p in resolve_providers()] == [
        ("deepseek", "https://proxy.example/v1"), ("openai", "https://api.openai.com/v1")]
    # the noparser variants read the same variables but only when named
    monkeypatch.setenv("VLLM_BASE_URL", "http://gpu:8000/v1")
    monkeypatch.setenv("VLLM_MODEL", "Qwen/Qwen3-8B")
    assert [p.name for p in resolve_providers()] == ["deepseek", "openai", "vllm"]
    with override_settings(LLM_PROVIDERS="vllm-noparser"):
        [noparser] = resolve_providers()
    assert (noparser.profile, noparser.base_url, noparser.model) == ("vllm-noparser", "http://gpu:8000/v1", "Qwen/Qwen3-8B")


def test_nothing_configured_is_the_offline_model_and_a_custom_url_gets_the_custom_profile() -> None:
    [provider] = resolve_providers()
    assert (provider.name, provider.profile) == ("offline", "offline")
    with override_settings(LLM_BASE_URL="http://gpu:8000/v1", LLM_MODEL="m"):
        assert resolve_providers()[0].profile == "custom"
    with override_settings(LLM_BASE_URL="http://gpu:8000/v1", LLM_MODEL="m", LLM_PROFILE="sglang-noparser"):
        assert resolve_providers()[0].profile == "sglang-noparser"
    with override_settings(LLM_BASE_URL="https://api.moonshot.ai/v1", LLM_API_KEY=KEY):
        assert (resolve_providers()[0].profile, resolve_providers()[0].model) == ("moonshot", "kimi-k3")


def test_the_request_follows_the_profile(recorder: Any) -> None:
    srv = recorder(reply("gpt-5.4-mini", {"prompt_tokens": 10, "completion_tokens": 2}))
    client = LLMClient([Provider("openai", srv.url, "gpt-5.4-mini", KEY)], limiters={})
    client.chat([{"role": "user", "content": "hi"}], temperature=0.3, top_p=0.9, max_tokens=50, use_cache=False)
    body = srv.requests[-1]["body"]
    assert body["max_completion_tokens"] == 50 and "max_tokens" not in body
    assert "temperature" not in body and "top_p" not in body
    assert body["reasoning_effort"] == "medium"
    srv2 = recorder(reply("deepseek-flash", {"prompt_tokens": 10, "completion_tokens": 2}))
    LLMClient([Provider("deepseek", srv2.url, "deepseek-flash", KEY)], limiters={}).chat(
        [{"role": "user", "content": "hi"}], temperature=0.3, max_tokens=50, use_cache=False)
    body = srv2.requests[-1]["body"]
    assert body["thinking"] == {"type": "enabled"} and body["max_tokens"] == 50 and "temperature" not in body
    # a model that does not think keeps its sampling parameters and gets no thinking switch
    client = LLMClient([Provider("openai", srv.url, "gpt-4.1", KEY)], limiters={})
    client.chat([{"role": "user", "content": "hi"}], temperature=0.3, max_tokens=50, use_cache=False)
    body = srv.requests[-1]["body"]
    assert body["temperature"] == 0.3 and "reasoning_effort" not in body and body["max_completion_tokens"] == 50


@pytest.mark.parametrize("pid, usage, cached", [
    ("deepseek", {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_cache_hit_tokens": 800,
                  "prompt_cache_miss_tokens": 200}, 800),
    ("openai", {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 640}}, 640),
    ("moonshot", {"prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 500}, 500),
    ("vllm", {"prompt_tokens": 1000, "completion_tokens": 100}, 0),
])
def test_cached_input_tokens_are_read_from_the_profiles_usage_fields_and_priced(
    recorder: Any, pid: str, usage: dict[str, Any], cached: int,
) -> None:
    spec = profiles.get(pid)
    model = spec.default_model or "served-model"
    srv = recorder(reply(model, usage))
    result = LLMClient([Provider(pid, srv.url, model, KEY)], limiters={}).chat(
        [{"role": "user", "content": "hi"}], use_cache=False)
    assert result.cached_tokens == cached and result.to_dict()["cached_tokens"] == cached
    assert result.usage.get("cached_tokens", 0) == cached
    m = spec.model(model)
    if m.priced:
        expected = ((1000 - cached) * m.price_input + cached * m.price_cached_input + 100 * m.price_output) / 10**6
        assert result.cost_usd == expected


def test_reasoning_arrives_in_the_profiles_field_and_is_stored_as_reasoning_content(recorder: Any) -> None:
    srv = recorder(reply("Qwen3-8B", {"prompt_tokens": 1, "completion_tokens": 1}, reasoning="think first",
                         tool_calls=[{"type": "function", "function": {"name": "f", "arguments": "{}"},
                                      "extra_content": {"google": {"thought_signature": "sig"}}}]))
    result = LLMClient([Provider("vllm", srv.url, "Qwen3-8B", "")], limiters={}).chat(
        [{"role": "user", "content": "hi"}], use_cache=False)
    assert result.message["reasoning_content"] == "think first"
    [call] = result.message["tool_calls"]
    assert call["id"] == "" and call["extra_content"] == {"google": {"thought_signature": "sig"}}


def test_a_real_providers_request_carries_no_route_header_and_the_offline_one_does(recorder: Any) -> None:
    srv = recorder(reply("m", {"prompt_tokens": 1, "completion_tokens": 1}))
    real = LLMClient([Provider("deepseek", srv.url, "deepseek-flash", KEY)], limiters={})
    stand_in = LLMClient([Provider("offline", srv.url, "scripted-reference", "")], limiters={})
    with llm_route("pipeline:toucan/question key=s1"):
        real.chat([{"role": "user", "content": "hi"}], use_cache=False)
        stand_in.chat([{"role": "user", "content": "hi"}], use_cache=False)
    real_request, offline_request = srv.requests
    assert ROUTE_HEADER.lower() not in real_request["headers"]
    assert not any("trajplatform" in v.lower() for v in real_request["headers"].values())
    assert "[pipeline:" not in json.dumps(real_request["body"])
    assert offline_request["headers"][ROUTE_HEADER.lower()] == "pipeline:toucan/question key=s1"


# -- the model check before a batch starts ---------------------------------------------------------


def test_a_retired_model_is_refused_naming_its_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    monkeypatch.setenv("DEEPSEEK_MODEL", "deepseek-chat")
    with pytest.raises(ModelConfigError, match="'deepseek-chat' of provider deepseek was retired.*'deepseek-flash'"):
        check_models()
    monkeypatch.setenv("DEEPSEEK_MODEL", "deepseek-v4-pro")
    with pytest.raises(ModelConfigError, match="deepseek-reasoner.*retired.*deepseek-flash"):
        check_models(["deepseek-reasoner"], ask_server=False)  # a task's own model
    assert check_models(ask_server=False) == []


def test_the_servers_model_list_is_checked_and_an_unreachable_one_is_only_a_warning(recorder: Any) -> None:
    srv = recorder(reply("m", {}), models=("Qwen/Qwen3-8B",))
    assert check_models(providers=[Provider("vllm", srv.url, "Qwen/Qwen3-8B", "")]) == []
    with pytest.raises(ModelConfigError, match=r"'Qwen3-32B' is not served by provider vllm .*lists: Qwen/Qwen3-8B"):
        check_models(providers=[Provider("vllm", srv.url, "Qwen3-32B", "")])
    assert [r["get"] for r in srv.requests] == ["/v1/models"]  # the list is kept a while
    silent = recorder(reply("m", {}))  # answers 404 to GET /models
    [warning] = check_models(providers=[Provider("sglang", silent.url, "any", "")])
    assert "could not list its models (GET /models answered HTTP 404)" in warning
    # a model the profile knows is accepted even when the server does not list it (a legacy alias)
    listed = recorder(reply("m", {}), models=("deepseek-flash", "deepseek-v4-pro"))
    assert check_models(providers=[Provider("deepseek", listed.url, "deepseek-v4-flash", KEY)]) == []


@pytest.mark.django_db
def test_tasks_enqueue_refuses_a_retired_model_before_any_trajectory(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.tasks import services
    from apps.tasks.models import Batch, Task, Trajectory

    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    monkeypatch.setenv("DEEPSEEK_BASE_URL", "http://127.0.0.1:9/v1")  # never reached: the name is refused first
    batch = Batch.objects.create(name="retired")
    task = Task.objects.create(batch=batch, scene="code_exec", prompt="p", model="deepseek-chat")
    with pytest.raises(ModelConfigError, match="deepseek-chat.*retired.*deepseek-flash"):
        services.tasks_enqueue(batch=batch)
    with pytest.raises(ModelConfigError, match="retired"):
        services.task_start_iteration(task=task)
    task.refresh_from_db()
    assert task.status == Task.Status.QUEUED and not Trajectory.objects.filter(task__batch=batch).exists()
