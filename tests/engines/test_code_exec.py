"""The code_exec scene on the real local sandbox: tools, set-up, verifier and reward.

Episodes are driven by the offline scripted model over loopback (helpers from test_agent).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from apps.engines.scenes.code_exec.runtime import parse_test_summary, score
from apps.engines.models import SandboxRecord
from apps.engines.sandboxes import ExecResult
from apps.tasks.models import Trajectory
from tests.engines.test_agent import (  # noqa: F401 (fixtures)
    Events,
    assert_no_sandbox_left,
    call,
    config_for,
    llm_env,
    local,
    run,
    scripted,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

SOLUTION = "def add(a, b):\n    return a + b\n"
BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = (
    "from calc import add\n\n\n"
    "def test_small():\n    assert add(1, 2) == 3\n\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n\n\n"
    "def test_negative():\n    assert add(-1, -1) == -2\n"
)
PYTEST = {"files": {"test_calc.py": TESTS}, "command": "python3 -m pytest -q -p no:cacheprovider test_calc.py",
          "timeout": 60}
PROMPT = "Implement add(a, b) in calc.py so that the tests in test_calc.py pass."


def calc_steps(source: str, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        call("read_file", "Read the tests first.", path="test_calc.py"),
        call("write_file", path="calc.py", content=source),
        call("run_shell", command="python3 -c 'import sys; sys.exit(3)'"),
        *extra,
        call("finish", answer="calc.py implemented"),
    ]


# --- verifier, reward, outcome ---------------------------------------------------------------


def test_a_passing_verifier_gives_reward_1_and_success_with_real_exit_codes(local: Any, make_task: Any) -> None:
    task = make_task(prompt=PROMPT, scene_config={"verifier": PYTEST})
    trajectory = Trajectory.objects.create(task=task, iteration=1, status=Trajectory.Status.RUNNING)
    with scripted(PROMPT, *calc_steps(SOLUTION)) as (_, llm):
        result = run(task.config_snapshot(), llm, trajectory=trajectory, sandbox_backend=local)

    assert (result.outcome, result.reward) == ("success", 1.0)
    assert result.outcome_reason == "finished; verifier passed (3/3 tests passed)"
    read, write, shell, finish = result.steps
    assert TESTS.strip() in read["output"]  # the tests were in the workspace before the run
    assert shell["exit_code"] == 3 and shell["output"].startswith("exit_code: 3") and shell["duration_ms"] > 0
    assert finish["tool"] == "finish" and result.final_answer == "calc.py implemented"
    out = result.verifier_output
    assert (out["passed"], out["failed"], out["total"], out["reward"], out["exit_code"]) == (3, 0, 3, 1.0, 0)
    assert out["command"] == PYTEST["command"] and "3 passed" in out["stdout"] and out["method"] == "pytest"
    assert "python3 -m pytest" in result.messages[0]["content"]  # the agent is told how it is checked
    record = SandboxRecord.objects.get(trajectory=trajectory)  # this run's one sandbox, whatever else the database holds
    assert record.state == SandboxRecord.State.DESTROYED
    assert_no_sandbox_left(local)


def test_a_failing_verifier_gives_reward_0_and_failure(local: Any) -> None:
    with scripted(PROMPT, *calc_steps("def add(a, b):\n    return None\n")) as (_, llm):
        result = run(config_for(PROMPT, {"verifier": PYTEST}), llm)
    assert (result.outcome, result.reward) == ("failure", 0.0)
    assert result.outcome_reason == "finished; verifier reward 0.00 (0/3 tests passed)"
    assert result.verifier_output["exit_code"] == 1 and result.verifier_output["failed"] == 3
    assert_no_sandbox_left(local)


def test_partly_passing_tests_score_zero_or_with_partial_credit_the_fraction_and_a_failure(local: Any) -> None:
    with scripted(PROMPT, *calc_steps(BUGGY)) as (_, llm):  # a - b: only add(0, 0) passes
        result = run(config_for(PROMPT, {"verifier": PYTEST}), llm)
    out = result.verifier_output
    assert (out["passed"], out["total"], out["fraction"]) == (1, 3, pytest.approx(1 / 3))
    assert result.outcome == "failure" and result.reward == 0.0
    assert out["process"]["completed"] == {"ok": False, "detail": "1/3 tests passed"}
    assert "1/3 tests passed" in result.outcome_reason

    partial = {**PYTEST, "partial_credit": True}
    two_of_three = "def add(a, b):\n    return a + b if a else 1\n"  # breaks only add(0, 0)
    with scripted(PROMPT, *calc_steps(two_of_three)) as (_, llm):
        result = run(config_for(PROMPT, {"verifier": partial}), llm)
    assert result.outcome == "failure" and result.reward == pytest.approx(2 / 3)
    assert (result.verifier_output["passed"], result.verifier_output["failed"]) == (2, 1)
    assert_no_sandbox_left(local)


def test_unittest_output_is_scored_by_its_counts(local: Any) -> None:
    tests = (
        "import unittest\nfrom calc import add\n\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(add(2, 2), 4)\n\n"
        "    def test_b(self):\n        self.assertEqual(add(1, 0), 1)\n\n"
        "    def test_c(self):\n        self.assertEqual(add(0, 3), 3)\n\n"
        "    def test_d(self):\n        self.assertEqual(add(5, 5), 10)\n"
    )
    verifier = {"files": {"test_calc.py": tests}, "command": "python3 -m unittest -v test_calc", "partial_credit": True}
    with scripted(PROMPT, *calc_steps("def add(a, b):\n    return a * 2 if a == b else a + b - 2 * (a == 0)\n")) as (_, llm):
        result = run(config_for(PROMPT, {"verifier": verifier}), llm)
    out = result.verifier_output
    assert out["method"] == "unittest" and (out["passed"], out["failed"], out["total"]) == (3, 1, 4)
    assert result.reward == 0.75 and result.outcome == "failure"
    assert_no_sandbox_left(local)


def test_a_plain_check_command_scores_by_exit_code(local: Any) -> None:
    prompt = "Create hello.txt containing exactly the line: hello, world"
    verifier = {"command": "grep -qx 'hello, world' hello.txt"}
    ok = [call("write_file", path="hello.txt", content="hello, world\n"), call("finish", answer="done")]
    wrong = [call("write_file", path="hello.txt", content="hello world\n"), call("finish", answer="done")]
    with scripted(prompt, *ok) as (_, llm):
        good = run(config_for(prompt, {"verifier": verifier}), llm)
    with scripted(prompt, *wrong) as (_, llm):
        bad = run(config_for(prompt, {"verifier": verifier}), llm)
    assert (good.outcome, good.reward, good.verifier_output["method"]) == ("success", 1.0, "exit_code")
    assert good.outcome_reason == "finished; verifier passed (exit code 0)"
    assert (bad.outcome, bad.reward, bad.verifier_output["exit_code"]) == ("failure", 0.0, 1)
    assert_no_sandbox_left(local)


def test_the_verifier_files_are_written_again_so_tampering_does_not_pay(local: Any) -> None:
    tamper = call("write_file", path="test_calc.py", content="def test_ok():\n    assert True\n")
    with scripted(PROMPT, *calc_steps(BUGGY, tamper)) as (_, llm):
        result = run(config_for(PROMPT, {"verifier": PYTEST}), llm)
    assert result.outcome == "failure" and result.verifier_output["total"] == 3
    assert result.reward == 0.0 and result.verifier_output["fraction"] == pytest.approx(1 / 3)
    assert_no_sandbox_left(local)


def test_without_a_verifier_finish_is_success_with_no_reward(local: Any) -> None:
    prompt = "Create out.txt."
    with scripted(prompt, call("write_file", path="out.txt", content="x"), call("finish", answer="made")) as (_, llm):
        result = run(config_for(prompt), llm)
    assert (result.outcome, result.reward, result.verifier_output) == ("success", None, {})
    assert "checked by running" not in result.messages[0]["content"]
    assert_no_sandbox_left(local)


def test_the_bundled_fizzbuzz_reference_passes_a_verifier() -> None:
    example = json.loads((Path(settings.BASE_DIR) / "examples/reference_solutions/fizzbuzz.json").read_text())
    verifier = {"files": {"test_check.py": (
        "import subprocess\n\n\ndef test_output():\n"
        "    out = subprocess.run(['python3', 'fizzbuzz.py'], capture_output=True, text=True).stdout.split()\n"
        "    assert out[2] == 'Fizz' and out[4] == 'Buzz' and out[14] == 'FizzBuzz' and out[0] == '1'\n"
    )}, "command": "python3 -m pytest -q -p no:cacheprovider test_check.py"}
    with scripted(example["prompt"], *example["reference_solution"]["steps"]) as (_, llm):
        result = run(config_for(example["prompt"], {"verifier": verifier}), llm)
    assert (result.outcome, result.reward) == ("success", 1.0)
    assert result.steps[2]["exit_code"] == 0 and "1 passed" in result.steps[2]["output"]


# --- tools ------------------------------------------------------------------------------------------


def test_setup_files_are_in_the_workspace_before_the_first_turn(local: Any) -> None:
    prompt = "Sum the numbers in data/numbers.txt."
    steps = [call("read_file", path="data/numbers.txt"),
             call("run_shell", command="awk '{s+=$1} END {print s}' data/numbers.txt"),
             call("finish", answer="6")]
    with scripted(prompt, *steps) as (_, llm):
        result = run(config_for(prompt, {"setup_files": {"data/numbers.txt": "1\n2\n3\n"}}), llm)
    assert result.steps[0]["output"] == "1\n2\n3\n"
    assert result.steps[1]["output"] == "exit_code: 0\nstdout:\n6"
    assert_no_sandbox_left(local)


def test_the_agents_own_mistakes_come_back_as_tool_errors(local: Any) -> None:
    prompt = "Make mistakes, then finish."
    steps = [call("read_file", path="missing.txt"),
             call("write_file", path="/etc/evil.conf", content="x"),
             call("read_file", path="."),
             call("write_file", path="notes.txt"),  # no content
             call("finish", answer="done")]
    with scripted(prompt, *steps) as (_, llm):
        result = run(config_for(prompt), llm)
    assert result.outcome == "success"
    errors = [s.get("error", "") for s in result.steps[:4]]
    assert "missing.txt: no such file" in errors[0]
    assert "/etc/evil.conf" in errors[1]
    assert "is a directory" in errors[2]
    assert "'content' is a required property" in errors[3]
    assert all(s["output"].startswith("error: ") and s["exit_code"] is None for s in result.steps[:4])
    assert_no_sandbox_left(local)


def test_a_command_past_the_step_timeout_is_killed_and_the_run_goes_on(local: Any) -> None:
    prompt = "Run something slow, then something quick."
    steps = [call("run_shell", command="sleep 20"), call("run_shell", command="echo quick"), call("finish", answer="ok")]
    with scripted(prompt, *steps) as (_, llm):
        result = run(config_for(prompt, step_timeout_s=0.5), llm)
    slow, quick = result.steps[:2]
    assert slow["timed_out"] is True and slow["exit_code"] is None and slow.get("killed_by") == "timeout"
    assert slow["output"].startswith("timed out: killed after 0.5s (no exit code)")
    assert quick["exit_code"] == 0 and result.outcome == "success"
    assert "killed after 0.5s" in result.messages[0]["content"]  # the prompt states the limit
    assert_no_sandbox_left(local)


def test_long_output_is_cut_to_head_and_tail_for_the_model(local: Any) -> None:
    prompt = "Print a lot."
    command = "python3 -c \"print('BEGIN' + 'x' * 30000 + 'END')\""
    with scripted(prompt, call("run_shell", command=command), call("finish", answer="ok")) as (_, llm):
        result = run(config_for(prompt), llm)
    step = result.steps[0]
    assert step["truncated"] is True and step["exit_code"] == 0
    assert "BEGIN" in step["output"] and "END" in step["output"] and "characters omitted" in step["output"]
    assert len(step["output"]) < 8200
    assert result.messages[3]["content"] == step["output"]  # the step keeps what the model saw
    assert_no_sandbox_left(local)


def test_a_sandbox_lost_mid_run_is_an_infrastructure_error(local: Any) -> None:
    prompt = "Work while the sandbox disappears."
    steps = [call("write_file", path="a.txt", content="a"), call("run_shell", command="cat a.txt"),
             call("finish", answer="ok")]
    events = Events()

    def on_event(kind: str, message: str, data: dict[str, Any]) -> None:
        events(kind, message, data)
        if kind == "action" and data["index"] == 1:
            ready = next(data for _, _, data in events.items if "record_id" in data)
            local.destroy(ready["id"], reason="operator destroyed it")

    with scripted(prompt, *steps) as (server, llm):
        result = run(config_for(prompt), llm, on_event=on_event)
    assert result.outcome == "error" and result.error_kind == "infrastructure" and result.retryable
    assert result.outcome_reason.startswith("infrastructure: sandbox lost in step 1 (run_shell)")
    assert result.steps[1]["error_kind"] == "infrastructure" and server.model.chat_requests == 2
    assert "error" in events.kinds()
    assert_no_sandbox_left(local)


def test_a_setup_file_outside_the_workspace_is_a_config_error(local: Any) -> None:
    with scripted(PROMPT, *calc_steps(SOLUTION)) as (server, llm):
        result = run(config_for(PROMPT, {"setup_files": {"../../etc/x": "y"}}), llm)
    assert result.outcome == "error" and result.error_kind == "config"
    assert result.outcome_reason.startswith("set-up failed") and "outside /workspace" in result.outcome_reason
    assert server.model.chat_requests <= 1 and result.steps == []  # only the turn that overlapped the set-up
    assert_no_sandbox_left(local)


# --- the summary parser -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("....F\n1 failed, 4 passed in 0.05s\n", ("pytest", 4, 1, 5)),
    ("===== 3 passed, 1 warning in 0.12s =====", ("pytest", 3, 0, 3)),
    ("== 2 passed, 1 failed, 1 error, 2 skipped in 1.50s (0:00:01) ==", ("pytest", 2, 2, 4)),
    ("1 passed in 0.01s\n2 failed in 0.02s\n", ("pytest", 1, 2, 3)),
    ("Ran 5 tests in 0.003s\n\nFAILED (failures=1, errors=1, skipped=1)\n", ("unittest", 2, 2, 4)),
    ("Ran 2 tests in 0.001s\n\nOK\n", ("unittest", 2, 0, 2)),
])
def test_parse_test_summary_reads_pytest_and_unittest(text: str, expected: tuple[str, int, int, int]) -> None:
    summary = parse_test_summary(text)
    assert summary is not None
    assert (summary["framework"], summary["passed"], summary["failed"], summary["total"]) == expected


def test_parse_test_summary_ignores_other_output() -> None:
    assert parse_test_summary("all good\n3 passed tests were mentioned here\n") is None


def test_score_rules() -> None:
    def result(code: int | None, out: str = "", timed_out: bool = False) -> ExecResult:
        return ExecResult(exit_code=code, stdout=out, stderr="", timed_out=timed_out)

    assert score(result(0))[0] == 1.0 and score(result(2))[0] == 0.0
    assert score(result(1, "2 passed, 2 failed in 0.1s"))[0] == 0.0
    assert score(result(1, "2 passed, 2 failed in 0.1s"), partial_credit=True)[0] == 0.5
    reward, details = score(result(1, "3 passed in 0.1s"))  # tests passed, the command did not
    assert reward == 0.0 and "exited with 1" in details["note"]
    assert score(result(None, "3 passed in 0.1s", timed_out=True))[0] == 0.0
    assert score(result(5, "no tests ran in 0.01s"))[0] == 0.0
