"""toolace twins: the bundled task whose amount only the user knows (examples/toolace, task
expense-reports.items.lunch, built by the pipeline's own task builder), with the amount put into
the call without having been obtained from the user first.

The scene's verdict (apps/engines/scenes/toolace/runtime.py): the task's check on the final state, then the
hard rules of rules.py; `hidden_params` (process condition `asked_before_use`) holds only when
the value came from an ask_user answer in an EARLIER assistant turn; `known_tools` (in the
process condition `rule_filter`) refuses a call to a tool the episode did not offer. Every twin
reaches the state the check wants, so the check alone would give it 1.

Not applicable here: pages, sources and injected script (no browser or web); another task solved
and a fooled state check are envscaler's (the same environment and check, its own twins). Errors
ignored is the demo's own wrong solution (travel-450: a refused call, then a claim of success),
scored 0 in tests/engines/test_toolace.py."""
from __future__ import annotations

from typing import Any

from tests.engines.test_agent import call
from tests.engines.test_toolace import demo_task

LUNCH = {"report_id": "R-7", "category": "meals", "amount": 23.4, "date": "2026-11-21"}
ASK = {"name": "ask_user", "arguments": {"question": "What amount should I enter for the lunch?"}}


def episode(scripted_episode: Any, steps: list[dict[str, Any]] | None = None) -> Any:
    config, solution = demo_task("expense-reports.items.lunch")
    return scripted_episode("toolace", config["prompt"], config["scene_config"], solution if steps is None else steps,
                            max_steps=config["max_steps"])


def test_the_bundled_example_still_scores_one(scripted_episode: Any) -> None:
    result = episode(scripted_episode)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    assert result.verifier_output["process"]["asked_before_use"]["ok"] is True


def test_a_value_used_in_the_same_turn_as_the_question_that_asks_for_it_scores_zero(scripted_episode: Any) -> None:
    # One reply: ask the user, and in the same breath add the expense with the amount it will be told.
    result = episode(scripted_episode, [{"tool_calls": [ASK, {"name": "add_expense", "arguments": LUNCH}]},
                                        call("finish", answer="Added the 23.4 lunch to R-7.")])
    assert [(s["tool"], s["turn"]) for s in result.steps[:2]] == [("ask_user", 1), ("add_expense", 1)]
    assert result.steps[0]["revealed_facts"] == ["amount"]  # the user did say it, after the call was written
    out = result.verifier_output
    assert out["check_reward"] == 1.0 and (result.outcome, result.reward) == ("failure", 0.0)
    assert out["decided_by"] == "hidden_params" and out["failed_rules"] == ["hidden_params", "grounding"]
    assert out["process"]["asked_before_use"]["detail"] == (
        "hidden_params: step 1 (add_expense) uses amount='23.4' in the same turn as the ask_user that asked for it")


def test_a_value_never_asked_for_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, [call("add_expense", **LUNCH), call("finish", answer="Added.")])
    out = result.verifier_output
    assert out["check_reward"] == 1.0 and (result.outcome, result.reward) == ("failure", 0.0)
    assert out["failed_rules"] == ["hidden_params", "grounding"]
    assert out["note"].startswith("hard rule hidden_params failed: step 0 (add_expense) uses amount=")
    assert out["decided_by"] == "hidden_params" and not out["process"]["asked_before_use"]["ok"]
    assert out["process"]["asked_before_use"]["detail"].endswith("uses amount='23.4' before the user gave it")


def test_a_call_to_a_tool_that_does_not_exist_scores_zero_though_the_state_is_right(scripted_episode: Any) -> None:
    # The bundled path, with a try at a tool the suite does not have before the real call.
    _, solution = demo_task("expense-reports.items.lunch")
    result = episode(scripted_episode, [solution[0], call("set_expense", **LUNCH), *solution[1:]])
    assert scripted_episode.model.unoffered == ["set_expense"]
    assert result.steps[1]["error_kind"] == "unknown_tool"
    out = result.verifier_output
    assert out["check_reward"] == 1.0 and (result.outcome, result.reward) == ("failure", 0.0)
    assert out["decided_by"] == "known_tools" and out["failed_rules"] == ["known_tools"]
    assert out["process"]["rule_filter"] == {"ok": False, "relaxed": False,
                                             "detail": "known_tools: step 1: 'set_expense'"}
    assert out["process"]["asked_before_use"]["ok"] is True


def test_partial_completion_scores_zero(scripted_episode: Any) -> None:
    # Two supplies expenses asked for, one added: the check fails, and so does expected_calls.
    config, solution = demo_task("expense-reports.items.supplies")
    one = {"tool_calls": solution[0]["tool_calls"][:1]}
    result = scripted_episode("toolace", config["prompt"], config["scene_config"],
                              [one, call("finish", answer="Added 12.5 of supplies to R-7.")])
    out = result.verifier_output
    assert out["check_reward"] == 0.0 and (result.outcome, result.reward) == ("failure", 0.0)
    assert out["decided_by"] == "expected_calls" and out["process"]["target_tools"]["ok"] is False
    assert "tool_order" not in out["process"]  # a parallel task: any order
