"""Trajectories for the exporter tests, built with the ORM (no agent run)."""
from __future__ import annotations

import json
from typing import Any

def tool(name: str, description: str, *params: str) -> dict[str, Any]:
    properties = {p: {"type": "string"} for p in params}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(params)}}}


TOOLS = [
    tool("run_shell", "Run a shell command in the workspace.", "command"),
    tool("write_file", "Write a file.", "path", "content"),
    tool("read_file", "Read a file.", "path"),
    tool("finish", "End the episode with an answer.", "answer"),
]

SYSTEM = "You are a careful coding agent. 你好."
PROMPT = "Écris primes.py qui affiche les dix premiers nombres premiers — merci ✓"


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def step(index: int, turn: int, c: dict[str, Any], output: str, *, exit_code: int | None = 0,
         error: str | None = None, thought: str = "") -> dict[str, Any]:
    s = {"index": index, "turn": turn, "tool_call_id": c["id"], "tool": c["function"]["name"],
         "arguments": json.loads(c["function"]["arguments"]), "format": "native", "thought": thought,
         "observation": "", "output": output, "exit_code": exit_code, "duration_ms": 12, "truncated": False,
         "timed_out": False}
    if error:
        s["error"] = error
    return s


def rich_episode(prefix: str = "") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Parallel calls with text in the same turn, an empty observation, a failed command,
    non-ASCII text everywhere, and a finish. Returns (messages, steps)."""
    c1 = call(f"{prefix}call_1", "write_file", path="primes.py", content="print('2 3 5 7 — ✓')\n")
    c2 = call(f"{prefix}call_2", "run_shell", command="ls")
    c3 = call(f"{prefix}call_3", "run_shell", command="python3 primes.py")
    c4 = call(f"{prefix}call_4", "write_file", path="primes.py", content="print(*[2,3,5,7,11,13,17,19,23,29])\n")
    c5 = call(f"{prefix}call_5", "run_shell", command="python3 primes.py")
    c6 = call(f"{prefix}call_6", "finish", answer="2 3 5 7 11 13 17 19 23 29 ✓")
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": "Je vais écrire le fichier puis lister le dossier.", "tool_calls": [c1, c2]},
        {"role": "tool", "tool_call_id": c1["id"], "name": "write_file", "content": "wrote 25 bytes to primes.py"},
        {"role": "tool", "tool_call_id": c2["id"], "name": "run_shell", "content": ""},
        {"role": "assistant", "content": None, "tool_calls": [c3]},
        {"role": "tool", "tool_call_id": c3["id"], "name": "run_shell",
         "content": "exit code 1\nSyntaxError: invalid character '—' (U+2014)"},
        {"role": "assistant", "content": "修正します。", "reasoning_content": "The dash broke it.",
         "tool_calls": [c4]},
        {"role": "tool", "tool_call_id": c4["id"], "name": "write_file", "content": "wrote 37 bytes to primes.py"},
        {"role": "assistant", "content": None, "tool_calls": [c5]},
        {"role": "tool", "tool_call_id": c5["id"], "name": "run_shell", "content": "2 3 5 7 11 13 17 19 23 29"},
        {"role": "assistant", "content": "Done. Finishing.", "tool_calls": [c6]},
        {"role": "tool", "tool_call_id": c6["id"], "name": "finish", "content": "finish accepted; the episode ends"},
    ]
    steps = [
        step(0, 1, c1, "wrote 25 bytes to primes.py", exit_code=None, thought="Je vais écrire le fichier"),
        step(1, 1, c2, "", exit_code=0),
        step(2, 2, c3, "exit code 1\nSyntaxError: invalid character '—' (U+2014)", exit_code=1),
        step(3, 3, c4, "wrote 37 bytes to primes.py", exit_code=None),
        step(4, 4, c5, "2 3 5 7 11 13 17 19 23 29"),
        step(5, 5, c6, "finish accepted; the episode ends", exit_code=None),
    ]
    return messages, steps


def failing_episode(prefix: str = "") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A rollout that fails: a command that errors, a tool error, then gives up with text."""
    c1 = call(f"{prefix}f_1", "run_shell", command="python3 nope.py")
    c2 = call(f"{prefix}f_2", "read_file", path="missing.txt")
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": None, "tool_calls": [c1]},
        {"role": "tool", "tool_call_id": c1["id"], "name": "run_shell",
         "content": "exit code 2\npython3: can't open file 'nope.py'"},
        {"role": "assistant", "content": "Let me read the file.", "tool_calls": [c2]},
        {"role": "tool", "tool_call_id": c2["id"], "name": "read_file", "content": "error: no such file: missing.txt"},
        {"role": "assistant", "content": "I could not do it. Désolé."},
    ]
    steps = [step(0, 1, c1, messages[3]["content"], exit_code=2),
             step(1, 2, c2, messages[5]["content"], exit_code=None, error="no such file: missing.txt")]
    return messages, steps


def make_trajectory(task: Any, *, episode: Any = rich_episode, iteration: int = 1, sample_index: int = 0,
                    outcome: str = "success", reward: float | None = 1.0, **fields: Any) -> Any:
    from apps.tasks.models import Trajectory

    messages, steps = episode(f"i{iteration}s{sample_index}_")
    messages[1]["content"] = task.prompt
    values = dict(
        task=task, iteration=iteration, sample_index=sample_index, status="finished", messages=messages,
        tools=TOOLS, steps=steps, final_answer="2 3 5 7 11 13 17 19 23 29 ✓" if outcome == "success" else "",
        outcome=outcome, outcome_reason="verifier passed" if outcome == "success" else "gave up", reward=reward,
        verifier_output={"command": "python3 -m pytest -q", "exit_code": 0 if outcome == "success" else 1,
                         "stdout": "1 passed", "reward": reward},
        model="scripted-reference", config_snapshot={"scene": "code_exec", "temperature": 0.7},
        prompt_tokens=120, completion_tokens=80, total_tokens=200,
    )
    values.update(fields)
    return Trajectory.objects.create(**values)


def make_review(trajectory: Any, *, kind: str = "auto", overall: float | None = None, verdict: str = "",
                reviewer: Any = None, status: str = "done") -> Any:
    from apps.reviews.models import Review

    scores = {"correctness": {"score": overall, "rationale": "ok"}} if overall is not None else {}
    return Review.objects.create(trajectory=trajectory, kind=kind, status=status, overall=overall, scores=scores,
                                 verdict=verdict, reviewer=reviewer, judge_model="judge-x" if kind == "auto" else "",
                                 rubric_version="v1" if kind == "auto" else "", rationale="because")
