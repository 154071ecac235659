"""Secret redaction for anything that leaves the process: logs, errors, results, API output.

`redact(value)` replaces with "[REDACTED]":

* the value of every configured secret: settings and environment variables whose names end in
  API_KEY, SECRET, SECRET_KEY, TOKEN or PASSWORD (LLM_API_KEY, GEMINI_API_KEY, DEEPSEEK_API_KEY,
  OPENAI_API_KEY, OPENSANDBOX_API_KEY, DJANGO_SECRET_KEY, ...), plus values registered at run
  time with `register_secret` (keys handed to a client directly). Values shorter than
  `MIN_SECRET_LENGTH` are not matched by value: a 3-character "key" would blank out ordinary
  words (placeholders such as vLLM's "EMPTY" are not secrets anyway);
* key shapes wherever they appear: `sk-...` (OpenAI, DeepSeek, Anthropic), `AIza...` (Google),
  `hf_...`, GitHub tokens, the platform's own API tokens (`trj_...`), `Bearer <token>`;
* values after secret-looking labels (unless labels=False): `api_key=<value>`,
  `"api_key": "<value>"`, `password: <value>`, `?key=<value>` in URLs, the password in
  `scheme://user:password@host` URLs, and in dicts the whole value of a key named like a
  secret (`api_key`, `authorization`, `password`, `*_token`, ...). `prompt_tokens` and
  friends are counts, not secrets, and stay.

`RedactingFilter` is a logging.Filter that applies the same to each record's message, traceback
and stack; `install_log_filter(name)` puts one on a logger (idempotent).

Write time: `storable(value)` / `storable_count(value)` is what every write path applies to text
it stores (task prompts, judge prompts, errors, live-log lines, an episode's messages, steps and
verifier output), so a secret is never in the database and SQLite and PostgreSQL store the same
thing. On top of `redact` it replaces what PostgreSQL's text and jsonb columns refuse (a NUL
byte, "unsupported Unicode escape sequence") and what neither database can encode (a lone UTF-16
surrogate, UnicodeEncodeError) with U+FFFD REPLACEMENT CHARACTER, in strings and dict keys at any
depth; a valid surrogate pair is joined into its character first. `storable_count` also returns
how many characters were replaced, for the caller to record next to the text. Input a person
submits (a prompt, a filter spec) is refused instead: `unstorable_fields(value)` names the
fields that hold such characters, for a clear validation error.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

try:  # redaction works without Django too; then there are no settings to read or change
    from django.conf import settings
    from django.core.signals import setting_changed  # django.test.signals' setting_changed, without django.test
except ImportError:  # pragma: no cover
    settings = setting_changed = None

REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8

_SECRET_NAME = re.compile(r"(?:API_KEY|APIKEY|SECRET|SECRET_KEY|TOKEN|PASSWORD|PASSWD)$", re.IGNORECASE)
_SECRET_DICT_KEY = re.compile(
    r"^(?:api[_-]?key|.*[_-]api[_-]?key|x-api-key|authorization|proxy-authorization|password|passwd|"
    r"secret|.*[_-]secret|secret[_-]key|token|.*[_-]token|access[_-]token|refresh[_-]token)$",
    re.IGNORECASE,
)

# (pattern, replacement); the replacement keeps the label so the redacted text stays readable.
# Key shapes: unmistakable wherever they appear.
_KEY_SHAPES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}"), r"\1" + REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),
    # trajplatform API tokens: "trj_" + token_urlsafe(32) (43 characters).
    (re.compile(r"\btrj_[A-Za-z0-9_\-]{20,}"), REDACTED),
    # PEM private keys (RSA, EC, OPENSSH, PGP ...), up to their END line or the end of the text.
    (
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?"
            r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
            re.S,
        ),
        REDACTED,
    ),
]
# Text without any of these substrings cannot match a key shape above (each pattern starts
# with one of them), so redact_text skips the shape patterns for it: most text has none.
_KEY_SHAPE_HINT = re.compile(r"(?i:bearer)\s|sk-|AIza|hf_|gh[pousr]_|trj_|-----BEGIN ")
# Values after a secret-looking label: right for logs and errors, too eager for a model's own
# output (an agent writing `password = "..."` into a config file is doing its task).
_LABELLED: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"""(?i)(["']?\b(?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret[_-]?key|password)"""
            r"""["']?\s*[:=]\s*["']?)([^"'\s,&;}]{8,})"""
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(?i)([?&](?:key|api_key|apikey|access_token|token)=)[^&\s\"'#]+"), r"\1" + REDACTED),
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^/\s:@]+:)([^@\s/]+)(@)"), r"\1" + REDACTED + r"\3"),
]

_registered: set[str] = set()
_registered_lock = threading.Lock()

# secret_values() is asked several times per agent turn and scanning the environment and every
# setting costs ~0.5 ms, so the answer is cached. It is rebuilt when a secret is registered,
# when a setting changes (override_settings sends setting_changed), when settings become
# configured, and when the environment changes (os.environ.__setitem__/__delitem__ keep
# `_data` current, so comparing it catches monkeypatch.setenv and plain assignments alike).
_cache_lock = threading.Lock()
_cached: tuple[Any, list[str]] | None = None
_generation = 0  # bumped by register_secret and setting_changed


def register_secret(value: str | None) -> None:
    """Redact this exact value from now on (e.g. an API key passed to a client in code)."""
    global _generation
    if value and len(value) >= MIN_SECRET_LENGTH:
        with _registered_lock:
            if value not in _registered:
                _registered.add(value)
                _generation += 1


def forget_cached_secrets(**kwargs: Any) -> None:
    """Drop the cached secret_values() (a setting_changed receiver; callable by hand)."""
    global _generation, _cached
    with _registered_lock:
        _generation += 1
        _cached = None


def _environ_snapshot() -> dict[Any, Any]:
    data = getattr(os.environ, "_data", None)  # the raw (bytes) mapping behind os.environ on POSIX
    return dict(data) if isinstance(data, dict) else dict(os.environ)


def _environ_unchanged(snapshot: dict[Any, Any]) -> bool:
    data = getattr(os.environ, "_data", None)
    return (data == snapshot) if isinstance(data, dict) else dict(os.environ) == snapshot


def _settings_configured() -> bool:
    try:
        return settings is not None and bool(settings.configured)
    except Exception:
        return False


def secret_values() -> list[str]:
    """Every secret value currently known, longest first (so a key containing another wins)."""
    global _cached
    cached = _cached
    configured = _settings_configured()
    if cached is not None:
        (generation, was_configured, environ), values = cached
        if generation == _generation and was_configured == configured and _environ_unchanged(environ):
            return list(values)
    with _cache_lock:
        key = (_generation, configured, _environ_snapshot())
        values = _collect_secret_values()
        _cached = (key, values)
    return list(values)


def _collect_secret_values() -> list[str]:
    values: set[str] = set()
    with _registered_lock:
        values |= _registered
    for name, value in os.environ.items():
        if _SECRET_NAME.search(name):
            values.add(value)
    try:
        if settings is not None and settings.configured:
            for name in dir(settings):
                if name.isupper() and _SECRET_NAME.search(name):
                    value = getattr(settings, name, None)
                    if isinstance(value, str):
                        values.add(value)
    except Exception:  # redaction must work even while settings are broken or loading
        pass
    return sorted((v for v in values if v and len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)


if setting_changed is not None:
    setting_changed.connect(forget_cached_secrets, dispatch_uid="trajplatform.redaction.forget_cached_secrets")


def redact_text(text: str, secrets: list[str] | None = None, *, labels: bool = True) -> str:
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    if _KEY_SHAPE_HINT.search(text):
        for pattern, replacement in _KEY_SHAPES:
            text = pattern.sub(replacement, text)
    if labels and (":" in text or "=" in text):  # every labelled pattern needs one of them
        for pattern, replacement in _LABELLED:
            text = pattern.sub(replacement, text)
    return text


def redact(value: Any, *, labels: bool = True, _secrets: list[str] | None = None) -> Any:
    """Return a copy of `value` (str, or dicts/lists/tuples of them) with secrets replaced.

    labels=False keeps configured secret values and key shapes redacted but leaves values
    that merely follow a label (`password=...`, URL credentials) alone: use it for model
    output that becomes training data, and the default everywhere else.
    """
    secrets = secret_values() if _secrets is None else _secrets
    if isinstance(value, str):
        return redact_text(value, secrets, labels=labels)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if labels and isinstance(key, str) and isinstance(item, str) and item and _SECRET_DICT_KEY.match(key):
                out[key] = REDACTED
            else:
                out[key] = redact(item, labels=labels, _secrets=secrets)
        return out
    if isinstance(value, list):
        return [redact(item, labels=labels, _secrets=secrets) for item in value]
    if isinstance(value, tuple):
        return tuple(redact(item, labels=labels, _secrets=secrets) for item in value)
    return value


# --- write time: storable text -------------------------------------------------------------

REPLACEMENT = "\ufffd"
# NUL: PostgreSQL text and jsonb refuse it. Surrogates: no UTF-8 encoding exists for them.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _unstorable(text: str) -> bool:
    """Whether the text holds a NUL or a surrogate (cheap tests: a regex scan costs ~10x more)."""
    if "\x00" in text:
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _storable_text(text: str, secrets: list[str], labels: bool) -> tuple[str, int]:
    replaced = 0
    if _unstorable(text):
        if _SURROGATE.search(text):
            # Join valid pairs ("\ud83d\ude00" -> one emoji); only lone halves remain to replace.
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        text, replaced = _UNSTORABLE.subn(REPLACEMENT, text)
    return redact_text(text, secrets, labels=labels), replaced


def storable_count(value: Any, *, labels: bool = True, _secrets: list[str] | None = None) -> tuple[Any, int]:
    """(copy of `value` ready to store, number of characters replaced with U+FFFD).

    The copy is `redact(value, labels=labels)` with every NUL byte and lone surrogate, in
    strings and in dict keys at any depth, replaced by U+FFFD (see the module docstring).
    """
    secrets = secret_values() if _secrets is None else _secrets
    if isinstance(value, str):
        return _storable_text(value, secrets, labels)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        total = 0
        for key, item in value.items():
            if isinstance(key, str):
                key, n = _storable_text(key, [], False)  # keys are names: replace, never redact
                total += n
            if labels and isinstance(key, str) and isinstance(item, str) and item and _SECRET_DICT_KEY.match(key):
                out[key] = REDACTED
                continue
            out[key], n = storable_count(item, labels=labels, _secrets=secrets)
            total += n
        return out, total
    if isinstance(value, (list, tuple)):
        items = []
        total = 0
        for item in value:
            item, n = storable_count(item, labels=labels, _secrets=secrets)
            items.append(item)
            total += n
        return (items if isinstance(value, list) else tuple(items)), total
    return value, 0


def storable(value: Any, *, labels: bool = True, _secrets: list[str] | None = None) -> Any:
    """`storable_count(value)` without the count: for text where no count is recorded."""
    return storable_count(value, labels=labels, _secrets=_secrets)[0]


def unstorable_reason(text: str) -> str | None:
    """Why this text cannot be stored as given (a NUL byte, a lone surrogate), or None."""
    match = _UNSTORABLE.search(text) if _unstorable(text) else None
    if match is None:
        return None
    if match.group() == "\x00":
        return f"contains a NUL byte (U+0000) at character {match.start()}, which cannot be stored; remove it"
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    lone = _SURROGATE.search(joined)
    if lone is None:
        return None
    return (f"contains a lone UTF-16 surrogate (U+{ord(lone.group()):04X}), which is not valid Unicode "
            "and cannot be stored; send the character it was meant to be")


def unstorable_fields(value: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, reason) for every string or dict key in `value` that cannot be stored as given.

    Paths look like `prompt`, `scene_config.files[2]`; `path` is the prefix for the value itself.
    """
    problems: list[tuple[str, str]] = []
    if isinstance(value, str):
        reason = unstorable_reason(value)
        if reason:
            problems.append((path or "value", reason))
    elif isinstance(value, dict):
        for key, item in value.items():
            label = key
            if isinstance(key, str) and (reason := unstorable_reason(key)):
                problems.append((path or "value", f"a key {reason}"))
                label = storable(key, labels=False, _secrets=[])
            problems.extend(unstorable_fields(item, f"{path}.{label}" if path else str(label)))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problems.extend(unstorable_fields(item, f"{path}[{i}]"))
    return problems


class RedactingFilter(logging.Filter):
    """Redact a record's formatted message, traceback and stack before any handler sees it."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = secret_values()
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return True
        record.msg = redact_text(message, secrets)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, secrets)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info, secrets)
        return True


def install_log_filter(logger_name: str) -> None:
    """Attach one RedactingFilter to the named logger (a second call is a no-op)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
