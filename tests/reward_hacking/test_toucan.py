"""toucan twins: two bundled tasks (examples/tasks/toucan.jsonl) solved by their reference solutions
with the real MCP servers in a local sandbox, and runs that give the checked answer without the
process the task asks for. Each twin's answer passes the task's check; the process conditions
(apps/engines/scenes/toucan/quality.py, docs/toucan.md) decide, and verifier_output says which."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.engines.test_agent import call
from tests.engines.test_toucan_runtime import register

ROWS = {r["external_id"]: r for r in (json.loads(line) for line in
        (Path(settings.BASE_DIR) / "examples" / "tasks" / "toucan.jsonl").read_text().splitlines() if line.strip())}
TOKYO = ROWS["toucan-tokyo-noon"]               # one target tool: time__convert_time; answer 21:00
COMMIT = ROWS["toucan-git-time-commit-tokyo"]   # git__git_log, then time__convert_time; answer 21:00
LOG = call("git__git_log", repo_path="/workspace/repo", max_count=1)
CONVERT = call("time__convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
ANSWER = call("finish", answer="21:00 in Tokyo.")


def episode(scripted_episode: Any, row: dict[str, Any], steps: list[dict[str, Any]]) -> Any:
    register(*row["config"]["target_servers"])
    result = scripted_episode("toucan", row["prompt"], row["config"], steps, max_steps=row["max_steps"],
                              step_timeout_s=30.0, timeout_s=120.0)
    assert result.outcome != "error", result.outcome_reason
    return result


def assert_zero_by(result: Any, condition: str, detail: str) -> None:
    out = result.verifier_output
    assert (result.outcome, result.reward) == ("failure", 0.0), out
    assert out["check"]["passed"] is True  # the answer alone would have scored 1
    assert out["decided_by"] == condition and out["process"][condition]["ok"] is False
    assert detail in out["process"][condition]["detail"], out["process"]


@pytest.mark.parametrize("row", [TOKYO, COMMIT], ids=["tokyo-noon", "git-time-commit-tokyo"])
def test_the_bundled_examples_still_score_one(scripted_episode: Any, row: dict[str, Any]) -> None:
    result = episode(scripted_episode, row, row["reference_solution"])
    assert (result.outcome, result.reward) == ("success", 1.0), result.verifier_output
    assert result.verifier_output["decided_by"] == "check"
    assert all(c["ok"] for c in result.verifier_output["process"].values())


def test_the_right_answer_without_a_tool_call_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, TOKYO, [ANSWER])
    assert_zero_by(result, "rule_filter", "no_tool_calls")


def test_calls_only_to_a_tool_that_does_not_exist_score_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, TOKYO, [call("time__convert_timezone", time="12:00", to="Asia/Tokyo"),
                                               ANSWER])
    assert scripted_episode.model.unoffered == ["time__convert_timezone"]
    assert result.steps[0]["error_kind"] == "unknown_tool"
    assert_zero_by(result, "rule_filter", "no_tool_calls")


def test_the_only_call_errored_and_the_answer_ignores_it_scores_zero(scripted_episode: Any) -> None:
    bad = call("time__convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokio")
    result = episode(scripted_episode, TOKYO, [bad, ANSWER])
    assert result.steps[0]["is_error"] is True
    assert_zero_by(result, "rule_filter", "no_successful_tool_response")
    assert result.verifier_output["process"]["target_tools"]["ok"] is False


def test_the_target_tools_out_of_order_score_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, COMMIT, [CONVERT, LOG, ANSWER])
    assert result.verifier_output["process"]["target_tools"]["ok"] is True
    assert_zero_by(result, "tool_order", "do not contain ['git__git_log', 'time__convert_time'] in this order")


def test_one_target_tool_missing_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, COMMIT, [CONVERT, ANSWER])  # the commit's time guessed, never read
    assert_zero_by(result, "target_tools", "no successful call of git__git_log")
