"""Limits on client JSON, checked before it is parsed.

Python's `json` parser recurses once per nesting level: a body of 100 000 `[` raises
RecursionError (a 500) instead of a parse error. Every JSON document a client sends (API
bodies, JSON form fields, uploaded JSON files in the API and the console) is scanned first by
`check_depth`, which is not recursive: it drops string literals, keeps only the brackets and
counts. API_MAX_JSON_DEPTH (default 64) levels are allowed; real task configs, EnvScaler
environments and filter specs nest well under 20.
"""
from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings

# A JSON string literal (escapes included); what is inside never counts as nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_OPEN = frozenset(b"[{")


class JSONTooDeep(ValueError):
    """The document nests arrays/objects deeper than the allowed depth."""


def max_depth() -> int:
    return settings.API_MAX_JSON_DEPTH


def check_depth(raw: bytes | str, limit: int | None = None) -> None:
    """Raise JSONTooDeep when `raw` (JSON text) nests deeper than `limit` (API_MAX_JSON_DEPTH).

    Invalid JSON is left to the parser that runs next; this only guarantees that parser never
    recurses deeper than the limit.
    """
    limit = max_depth() if limit is None else limit
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return  # cannot be deeper than the number of brackets it has
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", raw))
    depth = 0
    for byte in brackets:
        if byte in _OPEN:
            depth += 1
            if depth > limit:
                raise JSONTooDeep(f"JSON nested deeper than {limit} levels")
        else:
            depth -= 1


def loads(raw: bytes | str) -> Any:
    """json.loads after the depth check (JSONTooDeep and JSONDecodeError are both ValueErrors)."""
    check_depth(raw)
    return json.loads(raw)
