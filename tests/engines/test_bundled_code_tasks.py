"""The bundled code_exec tasks (examples/tasks/code_exec.jsonl): importable, scripted, unsolved
as shipped, and solved by their own reference solutions in a real local sandbox.

Verifiers run pytest as `python3 -I -B -m pytest ... --noconftest -c /dev/null`: nothing the
agent leaves in the workspace (a pytest.py, a conftest.py, a pytest.ini) can change the verdict.
"""
from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
from django.conf import settings
from django.core.management import call_command

from apps.engines.offline_model import ScriptRegistry, load_scripts, normalize_prompt
from apps.engines.sandboxes import ExecResult, Sandbox, SandboxSpec, get_backend

TASK_FILE = Path(settings.BASE_DIR) / "examples" / "tasks" / "code_exec.jsonl"
TASKS: list[dict[str, Any]] = [json.loads(line) for line in TASK_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
AGENT_TOOLS = {"run_shell", "write_file", "read_file", "finish"}
SHELL_TIMEOUT_S = 30  # the code_exec scene's default step timeout
HARDENED_PYTEST = "python3 -I -B -m pytest -q -p no:cacheprovider --noconftest -c /dev/null --rootdir=. "

_COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")


def pytest_counts(result: ExecResult) -> Counter:
    """passed / failed / error counts from the last pytest summary line of a verifier run."""
    counts: Counter = Counter()
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    for number, kind in _COUNT.findall(lines[-1] if lines else ""):
        counts["error" if kind.startswith("error") else kind] += int(number)
    return counts


def reward(result: ExecResult) -> float:
    """The code_exec scene's rule: the fraction of tests passed, else exit code 0 -> 1.0."""
    counts = pytest_counts(result)
    total = counts["passed"] + counts["failed"] + counts["error"]
    if total:
        return counts["passed"] / total
    return 1.0 if result.exit_code == 0 else 0.0


def _ids(tasks: list[dict[str, Any]]) -> list[str]:
    return [task["external_id"] for task in tasks]


@pytest.fixture
def sandbox(sandbox_settings: Path) -> Iterator[Sandbox]:
    with get_backend("local", records=False).create(SandboxSpec(memory_mb=1024)) as box:
        yield box


def test_there_are_at_least_20_code_tasks_with_unique_ids() -> None:
    ids = _ids(TASKS)
    assert len(ids) >= 20
    assert len(set(ids)) == len(ids)
    assert all(task["scene"] == "code_exec" and task["external_id"].startswith("code-") for task in TASKS)


def test_the_file_imports_cleanly_with_dry_run() -> None:
    out = io.StringIO()
    call_command("import_tasks", str(TASK_FILE), "--dry-run", stdout=out)
    assert f"valid, {len(TASKS)} tasks (jsonl/trajplatform); dry run, nothing written" in out.getvalue()


def test_every_verifier_runs_pytest_so_that_the_workspace_cannot_change_the_verdict() -> None:
    assert [task["external_id"] for task in TASKS if not task["config"]["verifier"]["command"].startswith(HARDENED_PYTEST)] == []


def test_every_prompt_is_unique() -> None:
    prompts = Counter(normalize_prompt(task["prompt"]) for task in TASKS)
    assert [p[:60] for p, n in prompts.items() if n > 1] == []


def test_the_offline_model_finds_each_tasks_own_script() -> None:
    registry = ScriptRegistry(load_scripts([TASK_FILE]))
    for task in TASKS:
        for text in (task["prompt"], f"You work in /workspace.\n\nTask:\n{task['prompt']}\n\nCall finish when done."):
            script = registry.match(text)
            assert script is not None and script.id == task["external_id"], task["external_id"]


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_the_reference_solution_is_a_plausible_agent_run(task: dict[str, Any]) -> None:
    steps = task["reference_solution"]
    assert 3 <= len(steps) <= 6 <= task["max_steps"]
    calls = [call for step in steps for call in step["tool_calls"]]
    assert {call["name"] for call in calls} <= AGENT_TOOLS
    assert [call["name"] for call in steps[-1]["tool_calls"]] == ["finish"]
    assert [call["name"] for call in calls].count("finish") == 1
    assert "run_shell" in {call["name"] for call in calls}, "a competent agent runs something before finishing"


def _write_files(box: Sandbox, files: dict[str, str]) -> None:
    for path, content in files.items():
        box.write_file(path, content.encode("utf-8"))


def _replay(box: Sandbox, steps: list[dict[str, Any]]) -> ExecResult | None:
    """Execute the scripted tool calls; returns the result of the last run_shell."""
    last_shell = None
    for step in steps:
        for call in step["tool_calls"]:
            name, args = call["name"], call["arguments"]
            if name == "write_file":
                box.write_file(args["path"], args["content"].encode("utf-8"))
            elif name == "run_shell":
                last_shell = box.run(args["command"], timeout=SHELL_TIMEOUT_S)
            elif name == "read_file":
                box.read_file(args["path"])
            elif name == "finish":
                return last_shell
            else:  # pragma: no cover - guarded by the plausibility test
                raise AssertionError(f"unknown tool {name}")
    raise AssertionError("the reference solution never calls finish")


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_the_task_is_unsolved_as_shipped_and_solved_by_its_reference_solution(task: dict[str, Any], sandbox: Sandbox) -> None:
    config = task["config"]
    verifier = config["verifier"]
    timeout = verifier.get("timeout", 60)

    # As the code_exec scene does it: setup and verifier files before the first turn, the
    # verifier files written again right before the check runs.
    _write_files(sandbox, {**config.get("setup_files", {}), **verifier["files"]})
    before = sandbox.run(verifier["command"], timeout=timeout)
    assert not before.timed_out
    assert before.exit_code != 0 and reward(before) < 1, f"already solved as shipped:\n{before.stdout}"

    last_shell = _replay(sandbox, task["reference_solution"])
    assert last_shell is not None and last_shell.exit_code == 0, (
        f"the solution's last check failed:\n{last_shell.stdout if last_shell else ''}{last_shell.stderr if last_shell else ''}"
    )

    _write_files(sandbox, verifier["files"])
    after = sandbox.run(verifier["command"], timeout=timeout)
    counts = pytest_counts(after)
    assert after.exit_code == 0, after.stdout + after.stderr
    assert counts["failed"] == counts["error"] == 0 and counts["passed"] >= 3, after.stdout
    assert reward(after) == 1.0


def test_the_jsonl_is_what_its_sources_generate(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "code_exec.jsonl"
    subprocess.run([sys.executable, str(root / "examples/tasks/code_exec_src/gen.py"), str(out)], check=True,
                   capture_output=True)
    assert out.read_bytes() == (root / "examples/tasks/code_exec.jsonl").read_bytes()
