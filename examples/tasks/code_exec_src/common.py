"""Helpers for writing the bundled code_exec tasks as Python, emitted as JSONL."""
from textwrap import dedent

# -I: the workspace cannot shadow pytest or the stdlib; --noconftest and -c /dev/null: an
# agent-written conftest.py or pytest.ini cannot change the outcome; -B: no stale bytecode.
PYTEST = "python3 -I -B -m pytest -q -p no:cacheprovider --noconftest -c /dev/null --rootdir=."
TASKS = []


def d(text):
    """Dedent and drop the first newline, keep one trailing newline."""
    return dedent(text).lstrip("\n")


def write(path, content):
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def shell(command):
    return {"name": "run_shell", "arguments": {"command": command}}


def read(path):
    return {"name": "read_file", "arguments": {"path": path}}


def finish(answer):
    return {"name": "finish", "arguments": {"answer": answer}}


def step(thought, *calls):
    out = {"tool_calls": list(calls)}
    if thought:
        out = {"thought": thought, **out}
    return out


def task(external_id, prompt, *, verifier_files, command, solution, setup_files=None, max_steps=12, timeout=60):
    config = {}
    if setup_files:
        config["setup_files"] = setup_files
    config["verifier"] = {"files": verifier_files, "command": command, "timeout": timeout}
    tools = []
    for s in solution:
        for c in s["tool_calls"]:
            if c["name"] != "finish" and c["name"] not in tools:
                tools.append(c["name"])
    TASKS.append({
        "external_id": external_id,
        "scene": "code_exec",
        "prompt": " ".join(prompt.split()),
        "config": config,
        "expected_tools": sorted(tools),
        "max_steps": max_steps,
        "reference_solution": solution,
    })
