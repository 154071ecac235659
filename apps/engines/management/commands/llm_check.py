"""manage.py llm_check: what each configured LLM provider will be sent, and one tiny real request.

    python manage.py llm_check                  # every configured provider, one request each
    python manage.py llm_check --no-request     # only the configuration and the model check
    python manage.py llm_check --provider deepseek

For each provider (apps.engines.llm.resolve_providers, primary first) it prints the profile
(apps/engines/profiles.json, docs/llm.md), URL, model, what the request body gets from the
profile (thinking switch, max-tokens parameter, dropped sampling parameters), where reasoning
arrives and how it is sent back, the text tool-call format, context window, maximum output,
prices per million tokens (input, cached input, output) and the profile's sources; then the
check a batch makes before it starts (retired names, GET /models); then, unless --no-request,
one chat completion of a few tokens, with its reply, latency, tokens, cached tokens and cost.
Exits non-zero when a provider fails its check or its request.
"""
from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.engines import llm
from trajplatform.redaction import redact

TINY_PROMPT = "Reply with the single word: ok"
SMALL_OUTPUT, THINKING_OUTPUT = 16, 1024


def _price(value: Any) -> str:
    return "-" if value is None else f"${value}"


def describe(provider: llm.Provider) -> list[tuple[str, str]]:
    """(label, value) lines saying what this provider will be sent and how its replies are read."""
    spec = provider.spec
    model = spec.model(provider.model)
    known = model.name in spec.models
    body = llm.shape_request(provider, {"model": provider.model, "messages": [], "temperature": 0.0, "max_tokens": 1})
    echo = spec.reasoning_echo + (f" (as {spec.reasoning_echo_field})" if spec.reasoning_echo != "never" else "")
    sources = ", ".join(f"{s['url']} ({s.get('checked', '?')})" for s in spec.sources) or "-"
    return [
        ("profile", f"{spec.id}" + (f" — {spec.title}" if spec.title else "")),
        ("url", redact(provider.base_url)),
        ("model", provider.model + ("" if known else " (not in the profile: its defaults apply, no price)")),
        ("api key", "set" if provider.api_key and provider.api_key not in ("EMPTY", llm.OFFLINE_API_KEY) else "none"),
        ("thinking request", json.dumps(spec.thinking_request) if spec.thinking_request else "nothing added"),
        ("thinks by default", "yes" if model.thinks else "no"),
        ("max tokens sent as", spec.max_tokens_param),
        ("dropped params", ", ".join(p for p in spec.ignored_params) or "none"),
        ("body of a request", json.dumps({k: v for k, v in body.items() if k not in ("messages",)}, sort_keys=True)),
        ("reasoning arrives in", ", ".join(spec.reasoning_fields) + (" and <think> in content" if spec.think_tags else "")
         if spec.reasoning_fields or spec.think_tags else "nowhere (not returned)"),
        ("reasoning echo", echo),
        ("text tool calls", spec.text_tool_format or "none (native tool_calls)"),
        ("context window", f"{model.context_window:,} tokens"),
        ("max output", f"{model.max_output:,} tokens"),
        ("prices / 1M tokens", f"input {_price(model.price_input)}, cached input {_price(model.price_cached_input)}, "
                               f"output {_price(model.price_output)}"),
        ("cache-hit usage", ", ".join(spec.cached_usage_paths) or "not reported"),
        ("route headers", "yes (the offline stand-in)" if spec.routing_headers else "no"),
        ("sources", sources),
    ]


class Command(BaseCommand):
    help = (
        "Print, for every configured LLM provider (primary first), what it will be sent: profile, URL, model, "
        "thinking request, max-tokens parameter, dropped sampling parameters, where reasoning arrives and how it "
        "is echoed back, text tool-call format, context window, max output, prices (input, cached input, output) "
        "and the profile's sources; check the model as a batch start does (retired names, GET /models); then "
        "make one tiny real chat request per provider (skip with --no-request). Exits 1 if any provider fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-request", action="store_true",
                            help="do not send the tiny chat request; only print the configuration and check the model")
        parser.add_argument("--provider", metavar="NAME",
                            help="check only this configured provider (a name from LLM_PROVIDERS or the one "
                                 "configured; default: all of them)")
        parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                            help="timeout of the tiny request and of GET /models (default 30)")
        parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                            help=f"max output tokens of the tiny request (default {SMALL_OUTPUT}, or {THINKING_OUTPUT} "
                                 "for a model that thinks by default: its reasoning counts against it)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            providers = llm.resolve_providers()
        except ImproperlyConfigured as exc:
            raise CommandError(f"the LLM configuration is invalid: {exc}") from None
        if options["provider"]:
            chosen = [p for p in providers if p.name == options["provider"]]
            if not chosen:
                raise CommandError(f"provider {options['provider']!r} is not configured "
                                   f"(configured: {', '.join(p.name for p in providers)})")
            providers = chosen
        failures: list[str] = []
        for i, provider in enumerate(providers):
            role = "primary" if i == 0 else "fallback"
            self.stdout.write(self.style.MIGRATE_HEADING(f"{provider.name} ({role})"))
            if provider.spec.routing_headers:
                self.stdout.write(self.style.WARNING(
                    "  the offline scripted model: a labelled stand-in that replays reference solutions, "
                    "not a language model (no provider is configured)"))
            for label, value in describe(provider):
                self.stdout.write(f"  {label:<22} {value}")
            try:
                warnings = llm.check_models(providers=[provider], timeout=options["timeout"])
            except ImproperlyConfigured as exc:
                failures.append(f"{provider.name}: {exc}")
                self.stdout.write(self.style.ERROR(f"  model check: {exc}"))
                continue
            for line in warnings:
                self.stdout.write(self.style.WARNING(f"  model check: {line}"))
            if not warnings:
                self.stdout.write(self.style.SUCCESS(
                    "  model check: ok" + ("" if provider.spec.routing_headers else " (listed by GET /models or known "
                                                                                   "to the profile; not retired)")))
            if options["no_request"]:
                continue
            self._request(provider, options, failures)
        if failures:
            raise CommandError("; ".join(failures))

    def _request(self, provider: llm.Provider, options: dict[str, Any], failures: list[str]) -> None:
        client = llm.LLMClient([provider], limiters={})
        max_tokens = options["max_tokens"] or (
            THINKING_OUTPUT if provider.spec.model(provider.model).thinks else SMALL_OUTPUT)
        try:
            result = client.chat([{"role": "user", "content": TINY_PROMPT}], max_tokens=max_tokens,
                                 timeout=options["timeout"], use_cache=False)
        except llm.LLMError as exc:
            failures.append(f"{provider.name}: {exc}")
            self.stdout.write(self.style.ERROR(f"  request: {type(exc).__name__}: {exc}"))
            return
        finally:
            client.close()
        reply = (result.content or "").strip().replace("\n", " ")
        self.stdout.write(self.style.SUCCESS(
            f"  request: answered by {result.model} in {result.latency_ms} ms: {reply[:120]!r}"))
        self.stdout.write(
            f"  {'usage':<22} {result.usage.get('prompt_tokens', 0)} prompt ({result.cached_tokens} cached), "
            f"{result.usage.get('completion_tokens', 0)} completion tokens; cost ${result.cost_usd}"
            + ("; reasoning returned" if result.message.get("reasoning_content") else ""))
