"""The provider profiles (apps/engines/profiles.json through apps.engines.profiles)."""
from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.engines import profiles

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
