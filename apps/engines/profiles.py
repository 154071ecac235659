"""Provider profiles: what each provider family accepts and returns, as data (profiles.json).

    from apps.engines import profiles
    profile = profiles.get("deepseek")          # unknown id -> ImproperlyConfigured
    spec = profile.model("deepseek-v4-pro")     # exact name, else longest prefix, else the defaults
    spec.context_window, spec.max_output, spec.price_input, spec.price_cached_input, spec.price_output
    profiles.all_profiles()                     # the repo file, then settings.LLM_PROFILES over it

A profile says which environment variables configure the provider, its current and retired
model names (a retired name maps to its replacement), how thinking is switched on
(`thinking_request`, merged into the request body), which sampling parameters the provider
ignores (the client drops them), the max-tokens parameter's name, where reasoning arrives in a
reply (`reasoning_fields`, `think_tags`), how it must be sent back (`reasoning_echo`:
tool_turns | never | always, under `reasoning_echo_field`), the tool-call format when no
server-side parser runs (`text_tool_format`: hermes | llama_json | mistral), context window and
maximum output per model, prices per million tokens (input, cached input, output), the usage
fields that report cache hits (`cached_usage_paths`, dotted), and the documentation pages it
was read from with the date they were checked. docs/llm.md has the table.

The client (apps.engines.llm) and the agent loop read these; no provider name is tested in
code outside this data (the offline stand-in is told apart by `routing_headers`).

settings.LLM_PROFILES (a path to a JSON file, or inline JSON, of the same shape as
profiles.json: {"profiles": {id: {...}}} or just {id: {...}}) is merged over the file: a
profile's keys replace the file's, its `models` and `retired` are merged name by name, and a
new id adds a profile. Bad data is an ImproperlyConfigured naming the profile and field.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PROFILES_FILE = Path(__file__).with_name("profiles.json")

REASONING_ECHO = ("tool_turns", "never", "always")
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")
TEXT_TOOL_FORMATS = (None, "hermes", "llama_json", "mistral")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    context_window: int  # tokens
    max_output: int  # tokens
    price_input: Decimal | None  # USD per million tokens, cache-miss input
    price_cached_input: Decimal | None
    price_output: Decimal | None
    thinks: bool  # thinks by default

    @property
    def priced(self) -> bool:
        return self.price_input is not None and self.price_output is not None


@dataclass(frozen=True)
class Profile:
    id: str
    key_var: str | None
    url_var: str
    model_var: str
    default_url: str | None
    default_model: str | None
    models: dict[str, ModelSpec]
    retired: dict[str, str]
    reasoning_fields: tuple[str, ...]
    think_tags: bool
    reasoning_echo: str
    reasoning_echo_field: str
    text_tool_format: str | None
    thinking_request: dict[str, Any]
    max_tokens_param: str
    ignored_params: tuple[str, ...]
    cached_usage_paths: tuple[str, ...]
    default_context_window: int
    default_max_output: int
    routing_headers: bool
    sources: tuple[dict[str, str], ...]
    # Beyond the agreed API (docs/llm.md): an optional key variable for servers that take one
    # (VLLM_API_KEY), the hosts that name a provider from LLM_BASE_URL, whether the provider is
    # configured by its own variables alone (false: only when LLM_PROVIDERS names it), a title.
    optional_key_var: str | None = None
    hosts: tuple[str, ...] = ()
    auto_configure: bool = True
    title: str = ""
    notes: str = ""
    _prefixes: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def model(self, name: str) -> ModelSpec:
        """The spec of a model name: exact, else the longest known prefix (dated snapshots,
        `models/...` or `vendor/...` forms), else the profile's defaults with no price."""
        for candidate in dict.fromkeys((name, name.rsplit("/", 1)[-1])):
            spec = self.models.get(candidate)
            if spec is not None:
                return spec
            for prefix in self._prefixes:
                if candidate.startswith(prefix):
                    return self.models[prefix]
        return ModelSpec(name, self.default_context_window, self.default_max_output, None, None, None, False)

    def knows(self, name: str) -> bool:
        """Whether a model name is one of the profile's (exactly or by prefix)."""
        return self.model(name).name in self.models

    def replacement(self, name: str) -> str | None:
        """What replaced a retired model name, or None when the name is not retired."""
        return self.retired.get(name) or self.retired.get(name.rsplit("/", 1)[-1])


def _fail(pid: str, key: str, why: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"LLM profile {pid!r}: {key} {why}")


def _price(pid: str, key: str, value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise _fail(pid, key, f"must be a number (USD per million tokens), not {value!r}") from None
    if not price.is_finite() or price < 0:
        raise _fail(pid, key, f"must be a non-negative number, not {value!r}")
    return price


def _int(pid: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _fail(pid, key, f"must be a positive integer (tokens), not {value!r}")
    return value


def _strs(pid: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise _fail(pid, key, f"must be a list of names, not {value!r}")
    return tuple(value)


def _opt_str(pid: str, key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _fail(pid, key, f"must be a string or null, not {value!r}")
    return value


def _build(pid: str, raw: dict[str, Any]) -> Profile:
    if not isinstance(raw, dict):
        raise _fail(pid, "profile", "must be an object")
    required = ("url_var", "reasoning_echo", "max_tokens_param", "default_context_window", "default_max_output")
    missing = [k for k in required if k not in raw]
    if missing:
        raise _fail(pid, ", ".join(missing), "missing")
    default_window = _int(pid, "default_context_window", raw["default_context_window"])
    default_output = _int(pid, "default_max_output", raw["default_max_output"])
    models: dict[str, ModelSpec] = {}
    raw_models = raw.get("models") or {}
    if not isinstance(raw_models, dict):
        raise _fail(pid, "models", "must be an object of model name -> spec")
    for name, m in raw_models.items():
        if not isinstance(m, dict):
            raise _fail(pid, f"models.{name}", "must be an object")
        where = f"models.{name}."
        models[name] = ModelSpec(
            name=name,
            context_window=_int(pid, where + "context_window", m.get("context_window", default_window)),
            max_output=_int(pid, where + "max_output", m.get("max_output", default_output)),
            price_input=_price(pid, where + "price_input", m.get("price_input")),
            price_cached_input=_price(pid, where + "price_cached_input", m.get("price_cached_input")),
            price_output=_price(pid, where + "price_output", m.get("price_output")),
            thinks=bool(m.get("thinks", False)),
        )
    retired = raw.get("retired") or {}
    if not isinstance(retired, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in retired.items()):
        raise _fail(pid, "retired", "must be an object of retired name -> replacement name")
    echo = raw["reasoning_echo"]
    if echo not in REASONING_ECHO:
        raise _fail(pid, "reasoning_echo", f"must be one of {', '.join(REASONING_ECHO)}, not {echo!r}")
    echo_field = raw.get("reasoning_echo_field") or ""
    if echo != "never" and not echo_field:
        raise _fail(pid, "reasoning_echo_field", f"must name the field when reasoning_echo is {echo!r}")
    if raw["max_tokens_param"] not in MAX_TOKENS_PARAMS:
        raise _fail(pid, "max_tokens_param", f"must be one of {', '.join(MAX_TOKENS_PARAMS)}")
    text_format = raw.get("text_tool_format")
    if text_format not in TEXT_TOOL_FORMATS:
        raise _fail(pid, "text_tool_format", f"must be null or one of hermes, llama_json, mistral, not {text_format!r}")
    thinking = raw.get("thinking_request") or {}
    if not isinstance(thinking, dict):
        raise _fail(pid, "thinking_request", "must be an object merged into the request body")
    sources = raw.get("sources") or []
    if not isinstance(sources, list) or not all(isinstance(s, dict) and s.get("url") for s in sources):
        raise _fail(pid, "sources", "must be a list of {url, title, checked}")
    url_var = raw["url_var"]
    if not isinstance(url_var, str):
        raise _fail(pid, "url_var", "must be a string")
    return Profile(
        id=pid,
        key_var=_opt_str(pid, "key_var", raw.get("key_var")),
        url_var=url_var,
        model_var=raw.get("model_var") or "",
        default_url=_opt_str(pid, "default_url", raw.get("default_url")),
        default_model=_opt_str(pid, "default_model", raw.get("default_model")),
        models=models,
        retired=dict(retired),
        reasoning_fields=_strs(pid, "reasoning_fields", raw.get("reasoning_fields") or []),
        think_tags=bool(raw.get("think_tags", False)),
        reasoning_echo=echo,
        reasoning_echo_field=echo_field,
        text_tool_format=text_format,
        thinking_request=dict(thinking),
        max_tokens_param=raw["max_tokens_param"],
        ignored_params=_strs(pid, "ignored_params", raw.get("ignored_params") or []),
        cached_usage_paths=_strs(pid, "cached_usage_paths", raw.get("cached_usage_paths") or []),
        default_context_window=default_window,
        default_max_output=default_output,
        routing_headers=bool(raw.get("routing_headers", False)),
        sources=tuple(dict(s) for s in sources),
        optional_key_var=_opt_str(pid, "optional_key_var", raw.get("optional_key_var")),
        hosts=_strs(pid, "hosts", raw.get("hosts") or []),
        auto_configure=bool(raw.get("auto_configure", True)),
        title=str(raw.get("title") or ""),
        notes=str(raw.get("notes") or ""),
        _prefixes=tuple(sorted(models, key=len, reverse=True)),
    )


def _read_json(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ImproperlyConfigured(f"{where} must be a JSON object")
    profiles = data["profiles"] if "profiles" in data else data
    if not isinstance(profiles, dict):
        raise ImproperlyConfigured(f"{where}: 'profiles' must be an object of profile id -> profile")
    return profiles


def _overrides(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if isinstance(value, dict):
        return _read_json(json.dumps(value), "LLM_PROFILES")
    text = str(value).strip()
    if text.startswith("{"):
        return _read_json(text, "LLM_PROFILES")
    path = Path(text)
    try:
        content = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ImproperlyConfigured(f"LLM_PROFILES={text!r}: cannot read the file ({exc.strerror})") from None
    return _read_json(content, f"LLM_PROFILES file {text}")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for pid, raw in over.items():
        if not isinstance(raw, dict):
            raise _fail(pid, "profile", "must be an object (in LLM_PROFILES)")
        current = dict(merged.get(pid) or {})
        for key, value in raw.items():
            if key in ("models", "retired") and isinstance(value, dict) and isinstance(current.get(key), dict):
                current[key] = {**current[key], **value}
            else:
                current[key] = value
        merged[pid] = current
    return merged


_cache: tuple[Any, dict[str, Profile]] | None = None
_lock = threading.Lock()


def all_profiles() -> dict[str, Profile]:
    """Every profile by id: profiles.json with settings.LLM_PROFILES merged over it."""
    global _cache
    override = getattr(settings, "LLM_PROFILES", "") or ""
    key = json.dumps(override, sort_keys=True) if isinstance(override, dict) else override
    cached = _cache
    if cached is not None and cached[0] == key:
        return cached[1]
    with _lock:
        base = _read_json(PROFILES_FILE.read_text(encoding="utf-8"), str(PROFILES_FILE))
        raw = _merge(base, _overrides(override))
        built = {pid: _build(pid, p) for pid, p in raw.items()}
        _cache = (key, built)
        return built


def get(profile_id: str) -> Profile:
    """The profile with that id; an unknown id is an ImproperlyConfigured naming the known ones."""
    profiles = all_profiles()
    profile = profiles.get(profile_id)
    if profile is None:
        raise ImproperlyConfigured(f"unknown LLM profile {profile_id!r}; known: {', '.join(profiles)}")
    return profile


def for_host(host: str) -> Profile | None:
    """The profile whose `hosts` include this host name (LLM_BASE_URL's), or None."""
    for profile in all_profiles().values():
        if host in profile.hosts:
            return profile
    return None


def key_only() -> Profile:
    """The profile LLM_API_KEY alone (no LLM_BASE_URL) means: the file's key_only_profile."""
    data = json.loads(PROFILES_FILE.read_text(encoding="utf-8"))
    return get(data.get("key_only_profile") or "")


def offline() -> Profile:
    """The offline stand-in's profile: the one with routing_headers."""
    for profile in all_profiles().values():
        if profile.routing_headers:
            return profile
    raise ImproperlyConfigured("no LLM profile has routing_headers (the offline model's)")


def usage_path(usage: dict[str, Any], path: str) -> int | None:
    """The integer at a dotted path in a reply's `usage`, or None when absent."""
    value: Any = usage
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)
