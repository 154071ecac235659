"""Regenerate examples/tasks/code_exec.jsonl from the task sources in this folder.

    python3 examples/tasks/code_exec_src/gen.py examples/tasks/code_exec.jsonl

Each module appends its tasks (prompt, setup files, verifier, reference solution) to
common.TASKS; edit the modules, not the JSONL. A test checks the two stay identical.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import TASKS  # noqa: E402
import algorithms, text, data, bugfix, writetests  # noqa: E402,F401  (each appends to TASKS)


def main(out: str) -> None:
    with open(out, "w", encoding="utf-8") as fh:
        for task in TASKS:
            fh.write(json.dumps(task, ensure_ascii=False) + "\n")
    print(len(TASKS), "tasks ->", out)


if __name__ == "__main__":
    main(sys.argv[1])
