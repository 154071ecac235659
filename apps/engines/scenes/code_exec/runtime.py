"""The code_exec scene: an agent writes and runs code in the task's sandbox; a verifier grades it.

Tools: run_shell(command), write_file(path, content), read_file(path), finish(answer).

scene_config (validated by apps/engines/registry.py):

    {"image": "python:3.11",                       # OpenSandbox image / local profile
     "setup_files": {"data/input.csv": "..."},     # written before the first turn
     "verifier": {"files": {"test_solution.py": "..."},
                  "hidden_files": {"test_hidden.py": "..."},   # optional, written only after finish
                  "command": "python3 -m pytest -q test_solution.py test_hidden.py",
                  "partial_credit": false,                       # optional: reward = fraction passed
                  "timeout": 120}}

Verifier files are placed in the workspace before the run, like the tests of a real
repository (the agent may read and run them), and written again, from the task, right
before the check command runs after finish: whatever the agent did to them is undone.
Files the agent added are not removed (a conftest.py of its own still loads; a task that
must rule that out says so in its command, e.g. `pytest -p no:cacheprovider --noconftest`).

`verifier.hidden_files` are tests the agent never sees: written only right before the check
command runs (name them in the command), so hard-coding the visible tests' expected outputs
does not pass them.

Reward: 1.0 when every test passed, by the output's pytest summary line ("2 passed, 1 failed
in 0.03s") or unittest one ("Ran 3 tests" + "FAILED (failures=1)"), else 0.0; with
`verifier.partial_credit: true` the reward is the fraction of tests passed (for RL; the outcome
is still a success only at 1.0); `verifier_output.fraction` and `process.completed` carry it
either way. A command without such a summary scores 1.0 for exit code 0 and 0.0 for anything
else. A command that times out scores
0.0, and so does one that exits non-zero although every counted test passed (something
else in the check failed). A command that runs a test runner (pytest, unittest) is decided by
its summary only: no summary, or no test counted, scores 0.0 whatever the exit code (the
agent's module may end the process with exit code 0 while it is imported, or skip every test),
and so does a summary that counts fewer tests than the verifier's test files define (the
test_*.py / *_test.py files the command names, else all of them; top-level test functions and
test methods of Test* or unittest classes, parametrized ones once). The output is kept in
`verifier_output`.
"""
from __future__ import annotations

import ast
import posixpath
import re
import time
from typing import Any

from apps.engines.runtime import SceneRuntime, SetupError, ToolError, ToolResult
from apps.engines.sandboxes import (
    WORKDIR,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxSpec,
    SandboxUnavailable,
)

DEFAULT_STEP_TIMEOUT_S = 30.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
# What the sandbox keeps of one command's stdout and of its stderr; the loop then caps what
# the model sees (agent.MAX_TOOL_OUTPUT_CHARS).
COMMAND_MAX_OUTPUT_BYTES = 256 * 1024
READ_FILE_MAX_BYTES = 256 * 1024
VERIFIER_MAX_OUTPUT_BYTES = 64 * 1024
# A sandbox outlives its episode by this much before the reconciler may reap it.
TTL_MARGIN_S = 900

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": (
                "Run a shell command (sh -c) in /workspace and return its exit code, stdout and stderr. "
                "Each call starts a fresh shell: cd, variables and background processes do not carry over."
            ),
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command line to run"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a text file (parent directories are created). Relative paths are under /workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "file path, relative to /workspace or absolute"},
                    "content": {"type": "string", "description": "the complete new content of the file"},
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Return the content of a text file. Relative paths are under /workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "file path, relative to /workspace or absolute"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "End the task. Call it once, when the work is done, with the answer or a short summary.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "the final answer or a summary of what was done"}},
                "required": ["answer"],
            },
        },
    },
]


def _scene_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("scene_config") or {}


def _verifier(config: dict[str, Any]) -> dict[str, Any] | None:
    verifier = _scene_config(config).get("verifier")
    return verifier if verifier and verifier.get("command") else None


def _workspace_path(path: str) -> str:
    """A set-up path as an absolute path inside the workspace; SetupError if it leaves it."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise SetupError(f"invalid file path {path!r}")
    full = posixpath.normpath(path if path.startswith("/") else f"{WORKDIR}/{path}")
    if not full.startswith(WORKDIR + "/"):
        raise SetupError(f"file path {path!r} is outside {WORKDIR}")
    return full


def _fmt_seconds(value: float) -> str:
    return f"{value:g}s"


def format_exec_result(result: ExecResult, timeout: float) -> str:
    """The model's view of a command: its real exit code (or that it was killed), then its output."""
    if result.timed_out:
        head = f"timed out: killed after {_fmt_seconds(timeout)} (no exit code)"
    elif result.killed_by:
        head = f"exit_code: {result.exit_code} (killed: {result.killed_by})"
    else:
        head = f"exit_code: {result.exit_code}"
    parts = [head]
    if result.stdout:
        parts.append("stdout:\n" + result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if not result.stdout and not result.stderr:
        parts.append("(no output)")
    return "\n".join(parts)


# --- test summaries ---------------------------------------------------------------------------

_PYTEST_COUNT = r"\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|deselected|rerun)"
_PYTEST_SUMMARY = re.compile(
    rf"^[= ]*((?:{_PYTEST_COUNT})(?:, {_PYTEST_COUNT})*) in \d+(?:\.\d+)?s\b.*$", re.MULTILINE
)
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in \d+(?:\.\d+)?s$", re.MULTILINE)
_UNITTEST_RESULT = re.compile(r"^(OK|FAILED)(?: \(([^)]*)\))?\s*$", re.MULTILINE)


def parse_test_summary(text: str) -> dict[str, Any] | None:
    """Test counts from pytest's or unittest's summary in `text`, or None when there is none.

    {"framework", "passed", "failed" (failures + errors), "errors", "skipped", "total"
    (passed + failed)}; several pytest summaries (several runs) are added up. Skipped and
    expected-failure tests count neither way.
    """
    pytest_lines = _PYTEST_SUMMARY.findall(text)
    if pytest_lines:
        counts: dict[str, int] = {}
        for line in pytest_lines:
            for item in line.split(", "):
                number, word = item.split(" ", 1)
                word = {"error": "errors", "warning": "warnings"}.get(word, word)
                counts[word] = counts.get(word, 0) + int(number)
        passed = counts.get("passed", 0) + counts.get("xpassed", 0)
        errors = counts.get("errors", 0)
        failed = counts.get("failed", 0) + errors
        return {"framework": "pytest", "passed": passed, "failed": failed, "errors": errors,
                "skipped": counts.get("skipped", 0), "total": passed + failed}
    ran = _UNITTEST_RAN.findall(text)
    results = _UNITTEST_RESULT.findall(text)
    if ran and results:
        total_ran = sum(int(n) for n in ran)
        details: dict[str, int] = {}
        for _, inner in results:
            for item in filter(None, (p.strip() for p in inner.split(","))):
                key, _, number = item.partition("=")
                if number.strip().isdigit():
                    details[key.strip()] = details.get(key.strip(), 0) + int(number)
        skipped = details.get("skipped", 0) + details.get("expected failures", 0)
        errors = details.get("errors", 0)
        failed = details.get("failures", 0) + details.get("unexpected successes", 0) + errors
        total = max(0, total_ran - skipped)
        return {"framework": "unittest", "passed": max(0, total - failed), "failed": failed, "errors": errors,
                "skipped": skipped, "total": total}
    return None


# A check command that runs a test runner: its verdict is the runner's summary, never the exit
# code alone (code the agent wrote can end the process with exit code 0 before any test runs).
_TEST_RUNNER = re.compile(r"(?<![\w.-])(?:pytest|py\.test|unittest)(?![\w-])")
_TEST_FILE = re.compile(r"(?:^|/)(?:test_[^/]*|[^/]*_test)\.py$")


def _collected(tree: ast.Module) -> int:
    """Tests pytest collects from a module by default: top-level test* functions, and test*
    methods of top-level Test* classes or unittest-style classes (any class with a base)."""
    count = 0
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            count += 1
        elif isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or node.bases):
            count += sum(1 for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"))
    return count


def declared_tests(files: dict[str, Any], command: str = "") -> int:
    """How many tests the verifier's test files (test_*.py, *_test.py) define, parametrized ones
    once; only the files the command names when it names any. A file that does not parse counts 0."""
    tests = {path: content for path, content in files.items() if isinstance(content, str) and _TEST_FILE.search(path)}
    named = {path: content for path, content in tests.items()
             if re.search(rf"(?<![\w./-]){re.escape(posixpath.basename(path))}(?![\w.-])", command)}
    total = 0
    for content in (named or tests).values():
        try:
            total += _collected(ast.parse(content))
        except (SyntaxError, ValueError):
            continue
    return total


def score(result: ExecResult, *, command: str = "", declared: int = 0,
          partial_credit: bool = False) -> tuple[float, dict[str, Any]]:
    """(reward, details) of a finished verifier command; see the module docstring. `command` and
    `declared` (declared_tests of the verifier files) make a test run that reports fewer tests than
    were declared, or no summary at all, score 0; `partial_credit` makes the reward the fraction
    of tests passed (else 1.0 only when every test passed)."""
    reward, details = _score(result, command=command, declared=declared)
    details.setdefault("decided_by", "check")
    if details["method"] == "exit_code" or "note" in details:
        return reward, details
    details["fraction"] = reward
    process = details.setdefault("process", {})
    process["completed"] = {"ok": reward == 1.0, "detail": f"{details['passed']}/{details['total']} tests passed"}
    if partial_credit:
        process["completed"]["relaxed"] = True
        return reward, details
    return (1.0 if reward == 1.0 else 0.0), details


def _score(result: ExecResult, *, command: str, declared: int) -> tuple[float, dict[str, Any]]:
    summary = parse_test_summary(f"{result.stdout}\n{result.stderr}")
    details: dict[str, Any] = {"method": "exit_code", "passed": None, "failed": None, "total": None}
    if summary is not None and summary["total"] > 0:
        details.update(summary)
        details["method"] = details.pop("framework")
    if result.timed_out:
        details["note"] = "the check command timed out"
        return 0.0, details
    runs_tests = bool(_TEST_RUNNER.search(command))
    if runs_tests:
        details["process"] = {"tests_ran": {"ok": True, "detail": f"{details['total']} tests counted"}}
    if details["method"] == "exit_code" and runs_tests:
        details["note"] = "the test run reported no test that ran (it ended before its summary, or skipped them all)"
        details["process"]["tests_ran"] = {"ok": False, "detail": details["note"]}
        details["decided_by"] = "tests_ran"
        return 0.0, details
    if details["method"] == "exit_code":
        return (1.0 if result.exit_code == 0 else 0.0), details
    whole_files = runs_tests and "::" not in command and not re.search(r"\s-k\b", command)
    if whole_files and declared and details["total"] + details.get("skipped", 0) < declared:
        details["declared"] = declared
        details["note"] = f"the verifier's files declare {declared} tests but only {details['total']} ran"
        details["process"]["tests_ran"] = {"ok": False, "detail": details["note"]}
        details["decided_by"] = "tests_ran"
        return 0.0, details
    reward = details["passed"] / details["total"]
    if reward == 1.0 and result.exit_code != 0:
        details["note"] = f"every counted test passed but the command exited with {result.exit_code}"
        return 0.0, details
    return reward, details


def _shell_call(command: str, config: dict[str, Any], timeout: float | None) -> tuple[str, float]:
    """A run_shell call's command, checked (ToolError: the agent's mistake), and its time limit."""
    if not command.strip():
        raise ToolError("command is empty")
    if "\0" in command:
        raise ToolError("command contains a NUL byte")
    return command, float(timeout if timeout is not None else config.get("step_timeout_s") or DEFAULT_STEP_TIMEOUT_S)


def _shell_result(result: ExecResult, limit: float) -> ToolResult:
    """A run_shell call's ToolResult: the model's view of the command, and the step's record."""
    extra = {"killed_by": result.killed_by} if result.killed_by else {}
    return ToolResult(
        output=format_exec_result(result, limit),
        exit_code=result.exit_code,
        duration_ms=result.duration_ms,
        truncated=result.truncated,
        timed_out=result.timed_out,
        extra=extra,
    )


# --- the runtime ------------------------------------------------------------------------------


class CodeExecRuntime(SceneRuntime):
    scene_id = "code_exec"

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(tool, function=dict(tool["function"])) for tool in TOOLS]

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    text_form_rewrites: dict[str, str | None] = {
        "- finish(answer): end the task with your answer or a short summary of what you did.\n": None,
        "Use a tool in every reply. Call finish(answer) when you are done; nothing runs after it.":
            "Use a tool in every reply until you are done; then reply in text, without a tool call, with your answer "
            "or a short summary of what you did: nothing runs after it.",
        "After you call finish, your work is checked": "After your final reply, your work is checked",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        step_timeout = float(config.get("step_timeout_s") or DEFAULT_STEP_TIMEOUT_S)
        lines = [
            "You are an agent solving a task in a Linux sandbox.",
            f"Your working directory is {WORKDIR}; files you write there persist between commands. "
            "The sandbox has no network access, and only the tools below act on it.",
            f"Each run_shell command runs in a fresh shell (sh -c) starting in {WORKDIR}: cd, exported "
            "variables and background processes do not carry over to the next command. A command is "
            f"killed after {_fmt_seconds(step_timeout)}.",
            "",
            "Tools:",
            "- run_shell(command): run a shell command; returns its exit code, stdout and stderr.",
            "- write_file(path, content): create or overwrite a file (relative paths are under /workspace).",
            "- read_file(path): return a file's content.",
            "- finish(answer): end the task with your answer or a short summary of what you did.",
            "",
            "Work step by step: write code, run it, read the errors, fix them, and check the result. "
            "Use a tool in every reply. Call finish(answer) when you are done; nothing runs after it.",
        ]
        if config.get("max_steps"):
            lines.append(f"You have at most {int(config['max_steps'])} replies.")
        verifier = _verifier(config)
        if verifier:
            lines.append(
                f"After you call finish, your work is checked by running `{verifier['command']}` in {WORKDIR}."
            )
        return "\n".join(lines)

    def sandbox_spec(self, config: dict[str, Any]) -> SandboxSpec:
        verifier = _verifier(config) or {}
        lifetime = float(config.get("timeout_s") or 600) + float(verifier.get("timeout") or 0) + TTL_MARGIN_S
        return SandboxSpec(
            image=_scene_config(config).get("image") or None,
            labels={"scene": "code_exec"},
            ttl=lifetime,
        )

    def setup(self, sandbox: Sandbox, config: dict[str, Any]) -> None:
        scene_config = _scene_config(config)
        files = dict(scene_config.get("setup_files") or {})
        files.update((_verifier(config) or {}).get("files") or {})
        for path, content in files.items():
            target = _workspace_path(path)
            if not isinstance(content, str):
                raise SetupError(f"content of {path!r} must be a string")
            sandbox.write_file(target, content.encode("utf-8"))

    def execute_tool(
        self, name: str, args: dict[str, Any], sandbox: Sandbox, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        if name == "run_shell":
            return self._run_shell(args["command"], sandbox, config, timeout)
        if name == "write_file":
            return self._write_file(args["path"], args["content"], sandbox)
        if name == "read_file":
            return self._read_file(args["path"], sandbox)
        raise ToolError(f"unknown tool {name!r}")

    async def aexecute_tool(
        self, name: str, args: dict[str, Any], sandbox: Sandbox, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        """run_shell through `Sandbox.arun` (its arguments checked on the loop, the command run in a
        worker thread); the file tools take the default's worker thread."""
        if name == "run_shell":
            command, limit = _shell_call(args["command"], config, timeout)
            result = await sandbox.arun(command, timeout=limit, max_output_bytes=COMMAND_MAX_OUTPUT_BYTES)
            return _shell_result(result, limit)
        return await super().aexecute_tool(name, args, sandbox, config, timeout=timeout)

    def _run_shell(self, command: str, sandbox: Sandbox, config: dict[str, Any], timeout: float | None) -> ToolResult:
        command, limit = _shell_call(command, config, timeout)
        return _shell_result(sandbox.run(command, timeout=limit, max_output_bytes=COMMAND_MAX_OUTPUT_BYTES), limit)

    def _write_file(self, path: str, content: str, sandbox: Sandbox) -> ToolResult:
        if not path or "\0" in path:
            raise ToolError(f"invalid path {path!r}")
        data = content.encode("utf-8")
        started = time.monotonic()
        sandbox.write_file(path, data)
        shown = path if path.startswith("/") else posixpath.normpath(f"{WORKDIR}/{path}")
        return ToolResult(
            output=f"wrote {len(data)} bytes to {shown}", duration_ms=int((time.monotonic() - started) * 1000)
        )

    def _read_file(self, path: str, sandbox: Sandbox) -> ToolResult:
        if not path or "\0" in path:
            raise ToolError(f"invalid path {path!r}")
        started = time.monotonic()
        try:
            data = sandbox.read_file(path, max_bytes=READ_FILE_MAX_BYTES + 1)
        except SandboxFileNotFound:
            raise ToolError(f"{path}: no such file") from None
        except (SandboxNotFound, SandboxUnavailable):
            raise
        except SandboxError as exc:
            if "is a directory" in str(exc):
                raise ToolError(f"{path} is a directory; use run_shell('ls {path}') to list it") from None
            raise
        duration_ms = int((time.monotonic() - started) * 1000)
        truncated = len(data) > READ_FILE_MAX_BYTES
        data = data[:READ_FILE_MAX_BYTES]
        if b"\0" in data[:8192]:
            return ToolResult(output=f"{path} is a binary file; not shown", duration_ms=duration_ms)
        text = data.decode("utf-8", "replace")
        if truncated:
            text += f"\n[... file longer than {READ_FILE_MAX_BYTES} bytes; the rest is not shown ...]"
        return ToolResult(output=text if text else "(empty file)", duration_ms=duration_ms, truncated=truncated)

    def verify(self, sandbox: Sandbox, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        verifier = _verifier(config)
        if verifier is None:
            return None, {}
        # Written again from the task: the agent cannot have weakened the tests it was given. The
        # hidden ones it never saw join them now.
        files = {**(verifier.get("files") or {}), **(verifier.get("hidden_files") or {})}
        for path, content in files.items():
            sandbox.write_file(_workspace_path(path), content.encode("utf-8"))
        timeout = float(verifier.get("timeout") or DEFAULT_VERIFIER_TIMEOUT_S)
        result = sandbox.run(verifier["command"], timeout=timeout, max_output_bytes=VERIFIER_MAX_OUTPUT_BYTES)
        reward, details = score(result, command=verifier["command"], declared=declared_tests(files, verifier["command"]),
                                partial_credit=bool(verifier.get("partial_credit")))
        output = {
            "command": verifier["command"],
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
            "duration_ms": result.duration_ms,
            **details,
            "reward": reward,
        }
        return reward, output
