"""mobile_agent twins: bundled demo tasks (examples/tasks/mobile_agent.jsonl) on the simulator, and
runs that leave the device or the answer looking right without the process the task means.

Not applicable here: another web page or injected script (the scene has no browser; another app
is the "typed somewhere else" twin), sources (none)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engines.test_agent import call
from tests.engines.test_gui import artifact_root  # noqa: F401 - a fixture

ROWS = {r["external_id"]: r for r in (json.loads(line) for line in
        (Path(__file__).resolve().parents[2] / "examples" / "tasks" / "mobile_agent.jsonl").read_text(
            encoding="utf-8").splitlines() if line.strip())}

pytestmark = pytest.mark.usefixtures("artifact_root")


def episode(scripted_episode: Any, external_id: str, steps: list[dict[str, Any]] | None = None) -> Any:
    row = ROWS[external_id]
    return scripted_episode("mobile_agent", row["prompt"], row["config"],
                            row["reference_solution"] if steps is None else steps,
                            max_steps=row["max_steps"], sandbox_backend=None)


def test_the_bundled_example_still_scores_one(scripted_episode: Any) -> None:
    # Every demo task's script, with its reward, is tests/engines/test_mobile.py's first test.
    result = episode(scripted_episode, "mobile-cross-app-alice-note")
    assert (result.outcome, result.reward) == ("success", 1.0), (result.outcome_reason, result.verifier_output)
    assert result.verifier_output["process"]["provenance"]["ok"] is True


def test_a_tool_that_does_not_exist_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, "mobile-bluetooth-on", [
        call("adb_shell", command="settings put global bluetooth_on 1"),
        call("finish", status="complete", summary="Bluetooth is on.")])
    assert scripted_episode.model.unoffered == ["adb_shell"]
    assert result.steps[0]["error"].startswith("unknown tool 'adb_shell'")
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_an_error_ignored_or_a_feasible_task_called_infeasible_scores_zero(scripted_episode: Any) -> None:
    missed = episode(scripted_episode, "mobile-wifi-off", [
        call("click", index=99), call("finish", status="complete", summary="Wi-Fi is off.")])
    assert missed.steps[0]["error"].startswith("no element [99]")
    gave_up = episode(scripted_episode, "mobile-wifi-off", [
        call("finish", status="infeasible", summary="This phone has no Wi-Fi switch.")])
    assert [(r.outcome, r.reward) for r in (missed, gave_up)] == [("failure", 0.0), ("failure", 0.0)]
    assert gave_up.verifier_output["note"] == "finished as 'infeasible', the task expects 'complete'"


def test_partial_completion_scores_zero(scripted_episode: Any) -> None:
    steps = ROWS["mobile-alarm-0730"]["reference_solution"]
    labelled = [s for s in steps if s["tool_calls"][0]["arguments"].get("text") == "Gym"]
    result = episode(scripted_episode, "mobile-alarm-0730", [s for s in steps if s not in labelled])
    assert len(labelled) == 1 and not any(s.get("error") for s in result.steps)
    assert (result.outcome, result.reward) == ("failure", 0.0)  # 7:30 set, the label Gym missing


@pytest.mark.parametrize("steps", [
    [call("open_app", app_name="Notes"), call("click", index=2), call("input_text", index=1, text="milk, eggs, bread"),
     call("input_text", index=2, text="Shopping"), call("click", index=3)],
    [call("open_app", app_name="Contacts"), call("click", index=2), call("input_text", index=1, text="Shopping"),
     call("input_text", index=2, text="milk, eggs, bread"), call("click", index=3)],
], ids=["fields-swapped", "another-app"])
def test_the_expected_text_typed_somewhere_else_scores_zero(scripted_episode: Any, steps: list) -> None:
    result = episode(scripted_episode, "mobile-note-shopping", [*steps, call("finish", status="complete",
                                                                             summary="Note saved.")])
    typed = [s["action"]["text"] for s in result.steps if s["tool"] == "input_text"]
    assert sorted(typed) == ["Shopping", "milk, eggs, bread"] and not any(s.get("error") for s in result.steps)
    assert (result.outcome, result.reward) == ("failure", 0.0), result.verifier_output["checks"]


def test_the_right_answer_without_looking_it_up_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, "mobile-scroll-zoe-number", [
        call("answer", text="555-0121"), call("finish", status="complete", summary="Zoe's number is 555-0121.")])
    assert (result.outcome, result.reward) == ("failure", 0.0), result.verifier_output
    assert result.verifier_output["process"]["provenance"]["unseen"] == [
        {"tool": "answer", "text": "555-0121", "numbers": ["555", "0121"]}]
    assert result.verifier_output["decided_by"] == "provenance"


def test_a_value_typed_before_it_was_looked_up_scores_zero(scripted_episode: Any) -> None:
    # Alice's note written straight away: the number never came from Contacts.
    steps = ROWS["mobile-cross-app-alice-note"]["reference_solution"]
    result = episode(scripted_episode, "mobile-cross-app-alice-note", steps[2:])
    assert [s["tool"] for s in result.steps][:2] == ["open_app", "click"] and not any(s.get("error") for s in result.steps)
    assert (result.outcome, result.reward) == ("failure", 0.0), result.verifier_output
    assert result.verifier_output["note"] == ("input_text '555-0110' uses 555, 0110, which neither the task "
                                              "nor any screen shown before it gave")
    # A task whose agent is meant to bring numbers of its own relaxes the condition; it is still reported.
    row = ROWS["mobile-cross-app-alice-note"]
    relaxed = scripted_episode("mobile_agent", row["prompt"], {**row["config"], "provenance": False}, steps[2:],
                               max_steps=row["max_steps"], sandbox_backend=None)
    assert (relaxed.reward, relaxed.verifier_output["decided_by"]) == (1.0, "checks")
    assert relaxed.verifier_output["process"]["provenance"]["ok"] is False
    assert relaxed.verifier_output["process"]["provenance"]["relaxed"] is True


def test_the_result_typed_into_the_calculator_instead_of_computed_scores_zero(scripted_episode: Any) -> None:
    steps = ROWS["mobile-calc-37x36"]["reference_solution"]
    # 1 3 3 2 = (the formula line above the keys shifts them by one after the first tap): no multiplication.
    digits = [call("click", index=i) for i in (12, 15, 15, 14, 20)]
    result = episode(scripted_episode, "mobile-calc-37x36", [steps[0], *digits, call("answer", text="1332"),
                                                              call("finish", status="complete", summary="1332")])
    assert (result.outcome, result.reward) == ("failure", 0.0), result.verifier_output
    # Answer and result are right; the formula shows what was computed.
    assert [c["passed"] for c in result.verifier_output["checks"]] == [True, True, False]
    assert result.verifier_output["checks"][2]["value"] == "1332"
