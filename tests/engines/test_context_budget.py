"""Token counting and fitting a request under the context window (apps.engines.context_budget)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.engines import context_budget
from apps.engines.context_budget import ContextOverflow, TokenCounter, estimate_tokens, fit, tokenizer_file


def test_the_estimate_overcounts_ascii_and_counts_other_characters_one_each() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcdef") == 2 and estimate_tokens("abcdefg") == 3
    assert estimate_tokens("数据集") == 3 and estimate_tokens("ab数") == 2


def _tokenizer_json(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))


def test_a_tokenizer_in_the_hub_cache_is_used_and_nothing_is_downloaded(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert tokenizer_file("Org/Tiny-1B") is None and TokenCounter.for_model("Org/Tiny-1B").method == "estimate"
    _tokenizer_json(tmp_path / "models--Org--Tiny-1B" / "snapshots" / "abc123" / "tokenizer.json")
    counter = TokenCounter.for_model("Org/Tiny-1B")
    assert counter.method == "tokenizer" and tokenizer_file("Tiny-1B") == counter.tokenizer_path  # any org
    assert counter.text("hello world hello, world") == 5  # the comma is a token of its own
    assert counter.message({"role": "user", "content": "hello world"}) == context_budget.MESSAGE_TOKENS + 2


def test_a_local_model_directory_is_read_too(tmp_path: Path) -> None:
    _tokenizer_json(tmp_path / "tokenizer.json")
    assert TokenCounter.for_model(str(tmp_path)).method == "tokenizer"


def _conversation(outputs: int, size: int) -> tuple[list[dict[str, Any]], list[int]]:
    messages = [{"role": "system", "content": "s" * 300}, {"role": "user", "content": "do it"}]
    elidable = []
    for n in range(outputs):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function", "function": {"name": "run_shell", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "name": "run_shell", "content": str(n) * size})
        elidable.append(len(messages) - 1)
    return messages, elidable


def test_fitting_elides_the_oldest_observations_to_below_the_target_and_stops_there() -> None:
    messages, elidable = _conversation(6, 3000)
    counter = TokenCounter("m")
    before = counter.request(messages, None)
    tokens, elided = fit(messages, None, counter=counter, limit=5000, elidable=elidable[:-1])
    assert before > 5000 >= tokens == counter.request(messages, None)
    assert tokens <= 5000 * context_budget.ELIDE_TO
    assert elided == elidable[:len(elided)] and 0 < len(elided) < 5
    assert messages[elided[0]]["content"] == (
        "[observation elided to fit the model's context window: 3000 characters of run_shell removed]")
    assert messages[elidable[-1]]["content"] == "5" * 3000
    # Under the limit nothing changes: requests stay append-only.
    again = json.dumps(messages)
    assert fit(messages, None, counter=counter, limit=5000, elidable=elidable[:-1])[1] == []
    assert json.dumps(messages) == again


def test_a_request_that_cannot_fit_raises_with_the_numbers() -> None:
    messages, elidable = _conversation(2, 3000)
    with pytest.raises(ContextOverflow) as info:
        fit(messages, None, counter=TokenCounter("m"), limit=900, elidable=elidable[:-1])
    assert info.value.limit == 900 and info.value.tokens > 900 and "estimate" in str(info.value)


def test_the_servers_count_corrects_ours_upwards_only() -> None:
    counter = TokenCounter("m")
    counter.observe(100, 80)
    assert counter.correction == 1.0
    counter.observe(100, 150)
    assert counter.correction == 1.5 and counter.request([{"role": "user", "content": "a" * 30}], None) == 21
