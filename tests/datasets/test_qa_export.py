"""The `qa` and `qa-verl` formats: what makes a QA pair, what is excluded and why, and the validators.
(Records the real factory and solver produced are exported in tests/engines/test_search2qa_emit.py.)"""
from __future__ import annotations

import io
import json
from typing import Any

from apps.datasets.exporters import export_records, validate_line

GATES = [{"name": "evidence_quotes", "passed": True, "reason": "all 2 quote(s) occur", "items": []},
         {"name": "no_tool_fails", "passed": True, "reason": "a solver without tools missed it ('1980')"}]
QA = {"question": "Which year?", "answer": "1983", "aliases": ["nineteen eighty-three"],
      "evidence": [{"url": "https://a.example/1", "quote": "q"}, {"url": "https://a.example/2", "quote": "r"},
                   {"url": "https://a.example/1", "quote": "s"}]}


def record(scene: str, *, task_id: int = 1, reward: float | None = 1.0, config: dict[str, Any] | None = None,
           verifier_output: dict[str, Any] | None = None, prompt: str = "Which year?") -> dict[str, Any]:
    return {
        "trajectory_id": task_id * 10, "task_id": task_id, "reward": reward, "outcome": "success",
        "task": {"scene": scene, "prompt": prompt, "external_id": f"x-{task_id}", "scene_config": config or {},
                 "batch": "b"},
        "messages": [{"role": "system", "content": "You are a research assistant."},
                     {"role": "user", "content": prompt},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "name": "finish", "content": "ok"}],
        "tools": [], "steps": [], "final_answer": "1983", "verifier_output": verifier_output or {},
    }


def export(fmt: str, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any]:
    buf = io.BytesIO()
    result = export_records(fmt, records, buf)
    return [json.loads(line) for line in buf.getvalue().splitlines()], result


def test_a_search2qa_pair_exports_with_its_gates_and_unique_sources() -> None:
    lines, result = export("qa", [record("search2qa", config={"seed": "s"},
                                         verifier_output={"qa": QA, "gates": GATES, "emitted": {"task_id": 7}})])
    assert result.excluded == []
    [line] = lines
    assert (line["question"], line["answer"], line["aliases"]) == ("Which year?", "1983", ["nineteen eighty-three"])
    assert line["sources"] == ["https://a.example/1", "https://a.example/2"]
    assert line["gates"] == [{k: g[k] for k in ("name", "passed", "reason")} for g in GATES]
    assert line["metadata"]["seed"] == "s" and line["metadata"]["emitted"] == {"task_id": 7}


def test_a_pair_that_failed_a_gate_or_a_scene_without_pairs_is_excluded_with_the_reason() -> None:
    failed = record("search2qa", task_id=2, reward=0.0, verifier_output={
        "qa": QA, "gates": [{"name": "no_tool_fails", "passed": False, "reason": "answered"}]})
    no_answer = record("deep_search", task_id=3, config={"sources": []})
    code = record("code_exec", task_id=4)
    lines, result = export("qa", [failed, no_answer, code])
    assert lines == []
    assert [e["reason"] for e in result.excluded] == [
        "qa: the pair did not pass every gate (failed: no_tool_fails)",
        "qa: the deep_search task has no expected_answer",
        "qa: for search2qa, deep_search trajectories, not code_exec",
    ]


def test_a_deep_search_task_exports_one_line_per_task_and_the_verl_row_keeps_its_aliases() -> None:
    config = {"expected_answer": "1983", "aliases": ["'83"], "sources": ["https://a.example/2"],
              "generation": {"seed": "s", "gates": GATES, "source_trajectory": "u"}}
    records = [record("deep_search", task_id=5, config=config), record("deep_search", task_id=5, config=config)]
    lines, result = export("qa", records)
    assert len(lines) == 1 and "one line per task" in result.excluded[0]["reason"]
    assert lines[0]["gates"][1]["name"] == "no_tool_fails" and lines[0]["metadata"]["source_trajectory"] == "u"
    [row], _ = export("qa-verl", records[:1])
    assert row["reward_model"] == {"style": "rule", "ground_truth": "1983"}
    assert row["extra_info"]["aliases"] == ["'83"] and row["extra_info"]["index"] == 0
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert validate_line("qa-verl", row) == []


def test_the_validators_name_what_is_wrong() -> None:
    assert validate_line("qa", {"question": "", "answer": "x", "aliases": [1], "sources": [], "gates": [{}],
                                "metadata": {}}) == [
        "line.question: must be a non-empty string", "line.aliases: must be a list of non-empty strings",
        "line.gates: must be a list of {name, passed, reason}"]
    assert "line.metadata: missing" in validate_line("qa", {})
    row = {"data_source": "d", "prompt": [{"role": "user", "content": "q"}], "ability": "a",
           "reward_model": {"style": "rule", "ground_truth": "x"}, "extra_info": {"index": 0, "split": "train",
                                                                               "aliases": "x"}}
    assert validate_line("qa-verl", row) == ["line.extra_info.aliases: must be a list of strings"]
