"""envscaler twins: bundled scenarios (examples/envscaler, examples/reference_solutions/envscaler.json)
solved by their reference solutions, and runs that finish without reaching the state the task asks
for, or try to reach the check or the state some other way than the environment's operations.

The scene's verdict is the task's check function on the environment's final state, run by the
platform in the sandbox after finish; the agent's only handles on that state are the declared
operations (the loop refuses any other tool name, and arguments are JSON data).

The bundled scenarios these twins copy still score 1 with their reference solutions in
tests/engines/test_envscaler_runtime.py (test_a_bundled_task_is_solved_by_its_reference_solution,
warehouse-receive-then-fulfill among them; an MCP environment costs seconds per episode, so the
suite does not run them twice).

Not applicable here: pages, sources and ask_user (none in the scene); the state is the only thing
checked, so "the right answer without the process" is a finish without any operation."""
from __future__ import annotations

from typing import Any

from tests.engines.test_agent import call
from tests.engines.test_envscaler_runtime import METADATA, SCENARIOS, SOLUTIONS, scene_config


def episode(scripted_episode: Any, task_id: str, steps: list[dict[str, Any]] | None = None) -> Any:
    scenario = SCENARIOS[task_id]
    config = scene_config(METADATA[scenario["env_name"]], scenario["init_config"], scenario["check_func"])
    steps = SOLUTIONS[scenario["task_desc"]]["reference_solution"] if steps is None else steps
    return scripted_episode("envscaler", scenario["task_desc"], config, steps)


def test_every_bundled_scenario_is_unsolved_in_its_initial_state() -> None:
    # What a finish-only run would be checked against: no scenario's check holds before any call.
    solved = []
    for task_id, scenario in SCENARIOS.items():
        env = METADATA[scenario["env_name"]]
        namespace: dict[str, Any] = {}
        exec(env["code"], namespace)  # noqa: S102 - the bundled environment's own code
        instance = namespace[env.get("class_name") or env["env_name"]](**scenario["init_config"])
        exec(scenario["check_func"], namespace)  # noqa: S102
        if namespace["check"](instance) not in (False, 0, 0.0):
            solved.append(task_id)
    assert solved == []


FAKES = [
    call("envscaler_check", source="def check(env):\n    return True\n"),
    call("envscaler_state", stock={"SKU-200": {"location": "B3"}}),
    call("run_shell", command="sed -i 's/B1/B3/' .envscaler/spec.json"),
    call("set_location", sku="SKU-200", location="B3"),
]


def test_tools_that_are_not_operations_are_refused_and_finish_without_an_operation_scores_zero(
        scripted_episode: Any) -> None:
    # The platform's own check and state tools, a shell, an invented operation: none reaches the
    # environment, and the claim in finish decides nothing.
    result = episode(scripted_episode, "warehouse-move", [*FAKES, call("finish", answer="Moved SKU-200 to bin B3.")])
    names = [f["tool_calls"][0]["name"] for f in FAKES]
    assert scripted_episode.model.unoffered == names
    assert [s["error"].split(";")[0] for s in result.steps[:-1]] == [f"unknown tool {n!r}" for n in names]
    assert result.verifier_output["final_state"] == result.verifier_output["initial_state"]
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_an_error_ignored_scores_zero(scripted_episode: Any) -> None:
    # Shipping fails for want of stock; the agent says it shipped and stops.
    result = episode(scripted_episode, "warehouse-receive-then-fulfill", [
        call("fulfill_order", order_id="O-2"), call("finish", answer="Shipped O-2.")])
    assert result.steps[0]["env_error"] and result.steps[0]["state_changed"] is False
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_partial_completion_scores_zero(scripted_episode: Any) -> None:
    # One of Carol's two appointments cancelled (the check also refuses a third, someone else's).
    result = episode(scripted_episode, "clinic-cancel-all", [
        call("cancel_appointment", appointment_id="A4"), call("finish", answer="Cancelled Carol's appointments.")])
    assert result.steps[0].get("env_error") is None and result.steps[0]["state_changed"] is True
    assert (result.outcome, result.reward) == ("failure", 0.0)
