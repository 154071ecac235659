"""Write the multi_agent demo: examples/tasks/multi_agent.jsonl (tasks, each with the lead's
reference solution for the offline model) and examples/multi_agent/roles.jsonl (the other
roles' scripts, matched by the instruction the lead hands them).

    python3 examples/multi_agent/build.py          # rewrite both files
    python3 examples/multi_agent/build.py --check  # exit 1 if they are not what this writes

Every task's reward comes from its base scene's verifier (code_exec's pytest; deep_search's exact
match and opened sources for ma-006, over the debian-docs corpus); ma-004's coder writes a wrong
function on purpose, so that task scores 0.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = HERE.parent / "tasks" / "multi_agent.jsonl"
ROLE_SCRIPTS = HERE / "roles.jsonl"

TEAM = [
    {"name": "planner", "description": "splits the task and hands out the work",
     "system_prompt": "You plan and delegate. You do not write code yourself; you may read files.",
     "tools": ["read_file"]},
    {"name": "coder", "description": "writes the code", "tools": ["write_file", "read_file", "run_shell"],
     "max_steps": 6},
    {"name": "tester", "description": "runs quick checks and reports what they print", "tools": ["run_shell", "read_file"],
     "max_steps": 4, "trainable": False},
]


def call(name: str, thought: str = "", **arguments: object) -> dict:
    step: dict = {"tool_calls": [{"name": name, "arguments": arguments}]}
    if thought:
        step["thought"] = thought
    return step


# The bundled code tasks' hardened pytest: nothing a role leaves in the workspace (a conftest.py,
# a pytest.ini) changes the verdict.
PYTEST = "python3 -I -B -m pytest -q -p no:cacheprovider --noconftest -c /dev/null --rootdir=. "


def verifier(module: str, tests: str) -> dict:
    return {"files": {f"test_{module}.py": tests}, "command": PYTEST + f"test_{module}.py"}


def delegate_task(key: str, prompt: str, module: str, code: str, check: str, printed: str, tests: str) -> tuple[dict, list[dict]]:
    coder = f"[{key} coder] Write {module}.py exactly as the task says: {prompt}"
    tester = f"[{key} tester] Run: python3 -c \"{check}\" and report what it prints."
    task = {
        "external_id": key, "scene": "multi_agent", "prompt": f"[{key}] {prompt}",
        "config": {"base_scene": "code_exec", "base_config": {"verifier": verifier(module, tests)},
                   "protocol": "delegate", "roles": TEAM, "lead": "planner"},
        "max_steps": 6,
        "reference_solution": [
            call("delegate", f"The coder writes {module}.py first.", role="coder", instruction=coder),
            call("delegate", "Then the tester tries it.", role="tester", instruction=tester),
            call("finish", answer=f"{module}.py is written; the tester saw: {printed}"),
        ],
    }
    roles = [
        {"id": f"{key}-coder", "prompt": coder, "reference_solution": [
            call("write_file", path=f"{module}.py", content=code),
            call("finish", answer=f"wrote {module}.py"),
        ]},
        {"id": f"{key}-tester", "prompt": tester, "reference_solution": [
            call("run_shell", command=f"python3 -c \"{check}\""),
            call("finish", answer=f"it prints {printed}"),
        ]},
    ]
    return task, roles


SLUG_TESTS = ("from slug import slugify\n\n\ndef test_slugify():\n    assert slugify('Hello, World!') == 'hello-world'\n"
              "    assert slugify('  many   spaces ') == 'many-spaces'\n    assert slugify('a--b') == 'a-b'\n"
              "    assert slugify('') == ''\n")
SLUG = ("import re\n\n\ndef slugify(text):\n    return re.sub(r'[^a-z0-9]+', '-', text.lower()).strip('-')\n")
SLUG_WRONG = ("import re\n\n\ndef slugify(text):\n    return re.sub(r'[^A-Za-z0-9]+', '-', text).strip('-')\n")
PALINDROME_TESTS = ("from pal import is_palindrome\n\n\ndef test_palindromes():\n"
                    "    assert is_palindrome('A man, a plan, a canal: Panama')\n    assert is_palindrome('')\n"
                    "    assert not is_palindrome('abc')\n")
PALINDROME = ("def is_palindrome(text):\n    kept = [c.lower() for c in text if c.isalnum()]\n"
              "    return kept == kept[::-1]\n")
WC_TESTS = ("from wc import word_count\n\n\ndef test_counts():\n    assert word_count('a B a') == {'a': 2, 'b': 1}\n"
            "    assert word_count('') == {}\n")
WC = ("def word_count(text):\n    counts = {}\n    for word in text.lower().split():\n"
      "        counts[word] = counts.get(word, 0) + 1\n    return counts\n")


def round_robin_task() -> tuple[dict, list[dict]]:
    key = "ma-005"
    prompt = f"[{key}] Agree with the group on the value of 2**10, then write it to answer.txt."
    post = "I propose that 2**10 is 1024. Check it and say whether you agree."
    alice_says = "1024: I computed it with python3."
    bob_says = "Agreed, 1024 (2 to the 10th is 1024)."
    team = [
        {"name": "moderator", "description": "leads the discussion and writes the result",
         "tools": ["write_file"]},
        {"name": "alice", "description": "checks claims by running code", "tools": ["run_shell"], "max_steps": 3},
        {"name": "bob", "description": "a careful reviewer", "tools": [], "max_steps": 2},
    ]
    task = {
        "external_id": key, "scene": "multi_agent", "prompt": prompt,
        "config": {"base_scene": "code_exec",
                   "base_config": {"verifier": verifier("answer", "def test_answer():\n"
                                                        "    assert open('answer.txt').read().strip() == '1024'\n")},
                   "protocol": "round_robin", "roles": team, "lead": "moderator", "max_rounds": 2,
                   "consensus": "all_agree"},
        "max_steps": 5,
        "reference_solution": [
            call("post", "Ask the group.", message=post),
            call("write_file", "Everyone agrees.", path="answer.txt", content="1024\n"),
            call("finish", answer="1024, agreed by alice and bob; written to answer.txt"),
        ],
    }
    roles = [
        # The turn's prompt also quotes the task, whose (lead's) script must not win: the roles'
        # scripts quote the discussion, which is longer.
        {"id": f"{key}-alice", "prompt": f"The discussion so far:\n\n[moderator] {post}\n\nIt is your turn, alice.",
         "reference_solution": [
            call("run_shell", command="python3 -c 'print(2**10)'"),
            call("say", message=alice_says, agree=True),
        ]},
        {"id": f"{key}-bob", "prompt": f"The discussion so far:\n\n[moderator] {post}\n\n[alice] {alice_says}\n\n"
                                        "It is your turn, bob.", "reference_solution": [
            call("say", message=bob_says, agree=True),
        ]},
    ]
    return task, roles


def research_task() -> tuple[dict, list[dict]]:
    """deep_search as the base scene: a researcher and a verifier use the web tools, the writer
    (the lead) only delegates and answers; the cited pages count as opened because the roles'
    sub-episodes opened them (deep_search checks the episode's pages, its sub-episodes' included)."""
    key = "ma-006"
    lovelace, ada = "https://foldoc.example/ada_lovelace", "https://foldoc.example/ada"
    researcher = (f"[{key} researcher] Find the programming language named after Lord Byron's daughter: open her "
                  "FOLDOC entry and the language's entry, and report both URLs.")
    verifier = f"[{key} verifier] Open {ada} and find the year the language was designed."
    team = [
        {"name": "writer", "description": "writes the final answer with its sources", "tools": []},
        {"name": "researcher", "description": "searches the web and opens pages", "tools": ["search", "open", "find"],
         "max_steps": 5},
        {"name": "verifier", "description": "checks a claim on a given page", "tools": ["open", "find"],
         "max_steps": 4},
    ]
    task = {
        "external_id": key, "scene": "multi_agent",
        "prompt": f"[{key}] In what year was the programming language named after Lord Byron's daughter designed?",
        "config": {"base_scene": "deep_search",
                   "base_config": {"expected_answer": "1979", "aliases": [], "sources": [lovelace, ada],
                                   "require_sources": True, "web": {"backend": "corpus", "corpus": "debian-docs"}},
                   "protocol": "delegate", "roles": team, "lead": "writer"},
        "max_steps": 5,
        "reference_solution": [
            call("delegate", "The researcher finds the language.", role="researcher", instruction=researcher),
            call("delegate", "The verifier confirms the year.", role="verifier", instruction=verifier),
            call("finish", answer="1979", sources=[lovelace, ada]),
        ],
    }
    roles = [
        {"id": f"{key}-researcher", "prompt": researcher, "reference_solution": [
            call("search", query="daughter of Lord Byron", k=3),
            call("open", url=lovelace),
            call("open", url=ada),
            call("finish", answer=f"The language is Ada: {lovelace} and {ada}"),
        ]},
        {"id": f"{key}-verifier", "prompt": verifier, "reference_solution": [
            call("open", url=ada),
            call("find", url=ada, pattern="1979"),
            call("finish", answer="Ada was designed in 1979."),
        ]},
    ]
    return task, roles


def build() -> tuple[list[dict], list[dict]]:
    tasks, roles = [], []
    for args in [
        ("ma-001", "Write slug.py with slugify(text): lowercase it, turn every run of characters other than a-z "
                   "and 0-9 into one hyphen, and strip hyphens at both ends.", "slug", SLUG,
         "from slug import slugify; print(slugify('Hello, World!'))", "hello-world", SLUG_TESTS),
        ("ma-002", "Write pal.py with is_palindrome(text): True when the letters and digits of text, lowercased, "
                   "read the same backwards.", "pal", PALINDROME,
         "from pal import is_palindrome; print(is_palindrome('Never odd or even'))", "True", PALINDROME_TESTS),
        ("ma-003", "Write wc.py with word_count(text): a dict from each lowercased whitespace-separated word to "
                   "how often it occurs.", "wc", WC, "from wc import word_count; print(word_count('a B a'))",
         "{'a': 2, 'b': 1}", WC_TESTS),
        # The wrong solution: the coder forgets to lowercase, the verifier's pytest fails, reward 0.
        ("ma-004", "Write slug.py with slugify(text): lowercase it, turn every run of characters other than a-z "
                   "and 0-9 into one hyphen, and strip hyphens at both ends (this run's coder gets it wrong).",
         "slug", SLUG_WRONG, "from slug import slugify; print(slugify('Hello, World!'))", "Hello-World", SLUG_TESTS),
    ]:
        task, scripts = delegate_task(*args)
        tasks.append(task)
        roles += scripts
    for task, scripts in (round_robin_task(), research_task()):
        tasks.append(task)
        roles += scripts
    return tasks, roles


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)


def main() -> int:
    tasks, roles = build()
    wanted = {TASKS: render(tasks), ROLE_SCRIPTS: render(roles)}
    if "--check" in sys.argv:
        stale = [str(p) for p, text in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
        if stale:
            print("out of date (run python3 examples/multi_agent/build.py):", *stale, file=sys.stderr)
            return 1
        return 0
    for path, text in wanted.items():
        path.write_text(text, encoding="utf-8")
    print(f"wrote {len(tasks)} tasks to {TASKS} and {len(roles)} role scripts to {ROLE_SCRIPTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
