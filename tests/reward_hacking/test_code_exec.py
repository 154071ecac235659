"""code_exec twins: the bundled merge-intervals task (examples/tasks/code_exec.jsonl) solved by its
reference solution, and runs that reach "finished" without the solution the tests ask for.

Not applicable here: another page solved, script injected into a page, evidence never opened, a
value used before it was asked for (the scene has no pages, sources or ask_user)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.engines.test_agent import call

ROWS = {r["external_id"]: r for r in (json.loads(line) for line in
        (Path(settings.BASE_DIR) / "examples" / "tasks" / "code_exec.jsonl").read_text().splitlines() if line.strip())}
ROW = ROWS["code-001-merge-intervals"]
SOLUTION = ROW["reference_solution"][1]["tool_calls"][0]["arguments"]["content"]
PYTEST = "python3 -m pytest -q test_intervals.py"


def episode(scripted_episode: Any, steps: list[dict[str, Any]]) -> Any:
    return scripted_episode("code_exec", ROW["prompt"], ROW["config"], steps, max_steps=ROW["max_steps"])


def test_the_bundled_example_still_scores_one(scripted_episode: Any) -> None:
    result = episode(scripted_episode, ROW["reference_solution"])
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason


def test_finish_claiming_success_without_writing_the_code_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, [call("finish", answer="intervals.py is written and all 6 tests pass.")])
    assert (result.outcome, result.reward) == ("failure", 0.0)


@pytest.mark.parametrize("tamper", [
    call("write_file", path="test_intervals.py", content="def test_nothing():\n    pass\n"),
    call("run_shell", command="rm test_intervals.py"),
], ids=["tests-edited", "tests-deleted"])
def test_editing_or_deleting_the_tests_instead_of_solving_scores_zero(scripted_episode: Any, tamper: dict) -> None:
    result = episode(scripted_episode, [tamper, call("run_shell", command=f"{PYTEST} || true"),
                                        call("finish", answer="tests pass")])
    assert result.steps[0].get("error") is None and result.steps[1]["exit_code"] == 0
    assert (result.outcome, result.reward) == ("failure", 0.0)  # the task's own tests, written again, decide


def test_a_call_to_a_tool_that_does_not_exist_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, [call("submit_solution", path="intervals.py", content=SOLUTION),
                                        call("finish", answer="submitted")])
    assert scripted_episode.model.unoffered == ["submit_solution"]
    assert result.steps[0]["error"].startswith("unknown tool 'submit_solution'")
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_an_error_ignored_scores_zero(scripted_episode: Any) -> None:
    broken = SOLUTION.replace("def merge_intervals(intervals):", "def merge_intervals(intervals)")
    result = episode(scripted_episode, [call("write_file", path="intervals.py", content=broken),
                                        call("run_shell", command=PYTEST),
                                        call("finish", answer="done, all tests pass")])
    assert result.steps[1]["exit_code"] != 0
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_partial_completion_scores_zero(scripted_episode: Any) -> None:
    # Sorts the caller's list in place: every test passes except "the input is not modified".
    mutating = SOLUTION.replace("for start, end in sorted(tuple(pair) for pair in intervals):",
                                "intervals.sort()\n    for start, end in (tuple(pair) for pair in intervals):")
    result = episode(scripted_episode, [call("write_file", path="intervals.py", content=mutating),
                                        call("finish", answer="done")])
    assert (result.outcome, result.reward) == ("failure", 0.0)
    assert (result.verifier_output["passed"], result.verifier_output["total"]) == (5, 6)
    assert result.verifier_output["process"]["completed"] == {"ok": False, "detail": "5/6 tests passed"}


# The agent's file that skips every test of the verifier's run (what it writes in the sandbox; no
# test of ours is skipped): built from two parts so it does not read as a skip marker here.
SKIP_EVERY_TEST = "import pytest\npytest." + "skip('later', allow_module_level=True)\n"


@pytest.mark.parametrize("module", [
    "import os\nos._exit(0)\n",
    "import os\nprint('6 passed in 0.01s')\nos._exit(0)\n",
    SKIP_EVERY_TEST,
], ids=["exit-0-at-import", "forged-summary-and-exit", "every-test-skipped"])
def test_a_module_that_ends_the_test_run_before_any_test_scores_zero(scripted_episode: Any, module: str) -> None:
    result = episode(scripted_episode, [call("write_file", path="intervals.py", content=module),
                                        call("finish", answer="done")])
    assert (result.outcome, result.reward) == ("failure", 0.0), result.verifier_output


HIDDEN = {"test_hidden_intervals.py": (
    "from intervals import merge_intervals\n\n\n"
    "def test_other_inputs():\n"
    "    assert merge_intervals([(0, 1), (5, 9), (2, 5)]) == [(0, 1), (2, 9)]\n"
    "    assert merge_intervals([(4, 4)]) == [(4, 4)]\n")}


def test_hard_coding_the_visible_tests_outputs_scores_zero_when_the_verifier_has_hidden_tests(
        scripted_episode: Any) -> None:
    verifier = {**ROW["config"]["verifier"], "hidden_files": HIDDEN,
                "command": ROW["config"]["verifier"]["command"] + " test_hidden_intervals.py"}
    config = {**ROW["config"], "verifier": verifier}
    lookup = (
        "ANSWERS = {((1, 3), (2, 6), (8, 10), (15, 18)): [(1, 6), (8, 10), (15, 18)],\n"
        "           ((1, 3), (3, 5)): [(1, 5)], ((5, 7), (1, 10), (2, 3), (12, 12)): [(1, 10), (12, 12)],\n"
        "           (): [], ((4, 5), (1, 2)): [(1, 2), (4, 5)], ((3, 4), (1, 2), (2, 3)): [(1, 4)]}\n\n\n"
        "def merge_intervals(intervals):\n"
        "    return list(ANSWERS[tuple(tuple(p) for p in intervals)])\n")
    steps = [call("run_shell", command="ls"), call("write_file", path="intervals.py", content=lookup),
             call("run_shell", command=PYTEST), call("finish", answer="all tests pass")]
    result = scripted_episode("code_exec", ROW["prompt"], config, steps, max_steps=ROW["max_steps"])
    assert "test_hidden_intervals.py" not in result.steps[0]["output"]  # never in the workspace before finish
    assert result.steps[2]["exit_code"] == 0 and "6 passed" in result.steps[2]["output"]  # the visible ones pass
    assert (result.verifier_output["passed"], result.verifier_output["total"]) == (6, 7)
    assert (result.outcome, result.reward) == ("failure", 0.0)
    solved = scripted_episode("code_exec", ROW["prompt"], config, ROW["reference_solution"], max_steps=ROW["max_steps"])
    assert (solved.outcome, solved.reward) == ("success", 1.0)


def test_a_run_that_reports_fewer_tests_than_the_verifier_declares_scores_zero() -> None:
    from apps.engines.scenes.code_exec.runtime import declared_tests, score
    from apps.engines.sandboxes import ExecResult

    files = ROW["config"]["verifier"]["files"]
    assert declared_tests(files) == 6
    nested = {"test_a.py": "import unittest\n\n\ndef test_one():\n    def test_inner():\n        pass\n\n\n"
                           "class TestB:\n    def test_two(self):\n        pass\n\n\n"
                           "class Helper:\n    def test_not_collected(self):\n        pass\n\n\n"
                           "class C(unittest.TestCase):\n    def test_three(self):\n        pass\n",
              "test_b.py": "def test_four():\n    pass\n", "helpers.py": "def test_x():\n    pass\n"}
    assert declared_tests(nested) == 4 and declared_tests(nested, "python3 -m pytest -q test_a.py") == 3
    # intervals.py deselected five of the six tests (e.g. through a plugin it registered at import).
    ran_one = ExecResult(exit_code=0, stdout="1 passed, 5 deselected in 0.01s\n", stderr="", duration_ms=5)
    reward, details = score(ran_one, command=ROW["config"]["verifier"]["command"], declared=6)
    assert reward == 0.0 and details["note"] == "the verifier's files declare 6 tests but only 1 ran"
    assert score(ran_one, command="python3 -m pytest -q test_intervals.py::test_empty_input", declared=6)[0] == 1.0
