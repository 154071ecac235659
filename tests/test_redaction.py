"""trajplatform.redaction at write time: storable() and unstorable_fields(), and `trj_` tokens."""
from __future__ import annotations

import json

import pytest
from django.test import override_settings

from trajplatform.api_models import api_token_create
from trajplatform.redaction import (
    REDACTED,
    REPLACEMENT,
    redact,
    storable,
    storable_count,
    unstorable_fields,
    unstorable_reason,
)

KEY = "sk-configured-llm-key-0123456789abcdef"


@pytest.mark.django_db
def test_a_platform_api_token_is_redacted_wherever_it_appears(make_user) -> None:
    user = make_user("viewer")
    _token, raw = api_token_create(user=user, name="ci", actor=user)
    assert raw.startswith("trj_")
    text = f"curl -H 'X-Token: {raw}' …; token {raw}."
    assert redact(text, labels=False) == f"curl -H 'X-Token: {REDACTED}' …; token {REDACTED}."
    assert storable({"prompt": f"use {raw}"}, labels=False) == {"prompt": f"use {REDACTED}"}
    assert storable("trj_ is our token prefix") == "trj_ is our token prefix"  # the prefix alone is no token


@override_settings(LLM_API_KEY=KEY)
def test_storable_redacts_configured_keys_like_redact() -> None:
    value = {"messages": [{"role": "user", "content": f"my key is {KEY}"}], "n": 3, "ok": True, "none": None}
    assert storable(value, labels=False) == redact(value, labels=False)
    assert storable(value, labels=False)["messages"][0]["content"] == f"my key is {REDACTED}"
    assert storable_count(value)[1] == 0


def test_nul_bytes_become_the_replacement_character_at_any_depth_and_are_counted() -> None:
    value = {"out\x00put": ["a\x00b", ("c", "\x00\x00")], "exit": 0, "data": {"k": "v\x00"}}
    stored, replaced = storable_count(value, labels=False)
    assert stored == {f"out{REPLACEMENT}put": [f"a{REPLACEMENT}b", ("c", REPLACEMENT * 2)], "exit": 0,
                      "data": {"k": f"v{REPLACEMENT}"}}
    assert replaced == 5
    # What PostgreSQL's jsonb refuses is gone from the JSON text too.
    assert "\\u0000" not in json.dumps(stored) and "\x00" not in json.dumps(stored, ensure_ascii=False)


def test_lone_surrogates_are_replaced_and_valid_pairs_joined() -> None:
    stored, replaced = storable_count(["a\ud800b", "\udfff", "\ud83d\ude00 smile"], labels=False)
    assert stored == [f"a{REPLACEMENT}b", REPLACEMENT, "\U0001f600 smile"]
    assert replaced == 2
    for text in stored:
        text.encode("utf-8")  # no UnicodeEncodeError: SQLite and PostgreSQL can store it


def test_clean_text_is_returned_unchanged() -> None:
    text = "ordinary text, ünïcode and emoji \U0001f600"
    assert storable_count(text) == (text, 0)


def test_unstorable_fields_names_each_field_and_says_why() -> None:
    problems = unstorable_fields({"prompt": "a\ud800b", "scene_config": {"files": ["ok", "x\x00"]},
                                  "fine": "\ud83d\ude00"})
    assert [field for field, _ in problems] == ["prompt", "scene_config.files[1]"]
    assert "lone UTF-16 surrogate (U+D800)" in problems[0][1]
    assert "NUL byte (U+0000) at character 1" in problems[1][1]
    assert unstorable_fields({"a\x00": 1}) == [("value", "a key " + unstorable_reason("a\x00"))]
    assert unstorable_fields(["fine", 1, None]) == []
