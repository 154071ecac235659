"""Build the toucan examples: ready tasks, pipeline seeds and the offline model's scripts.

    python3 examples/toucan/build.py      # after editing a task, a seed or a scripted answer here

Writes
- examples/tasks/toucan.jsonl: ready tasks over the bundled servers (examples/toucan/servers.json),
  each with a stable answer check or a state check, and its reference solution (the offline
  model's script, found by the task's prompt);
- examples/toucan/seeds.jsonl: seeds for `manage.py synthesize_pipeline toucan`;
- examples/pipelines/toucan/scripts.json: the offline model's answers to the pipeline's llm stages
  (matched by their key line `[pipeline:toucan/<template> key=<seed id>.q<i>]`) and the agent's
  solutions of the questions that survive it.

The fixtures these rely on (the seed repository's three commits, the products table, the library
pages) are the registry's, in servers.json. Time questions use zones without daylight saving
(Asia/Tokyo, Asia/Kolkata, Asia/Shanghai): mcp-server-time converts on today's date.
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent
REPO = "/workspace/repo"


def call(name: str, thought: str = "", **arguments: object) -> dict:
    step: dict = {"tool_calls": [{"name": name, "arguments": arguments}]}
    if thought:
        step["thought"] = thought
    return step


def finish(answer: str) -> dict:
    return call("finish", answer=answer)


def task(external_id: str, prompt: str, servers: list[str], targets: list[str], check: dict, solution: list[dict],
         **extra: object) -> dict:
    return {"external_id": f"toucan-{external_id}", "scene": "toucan", "prompt": prompt,
            "config": {"target_servers": servers, "target_tools": targets, "check": check},
            "expected_tools": targets, "max_steps": 8, **extra, "reference_solution": solution}


def contains(expected: str) -> dict:
    return {"type": "answer", "expected": expected, "match": "contains"}


def state(probe: str, expect: str) -> dict:
    return {"type": "state", "probe": probe, "expect": expect}


def sql_probe(query: str) -> str:
    return ("python3 -c \"import sqlite3, sys; print(sqlite3.connect('file:/workspace/data.db?mode=ro', uri=True)"
            f".execute(sys.argv[1]).fetchone()[0])\" \"{query}\"")


CONVERT = "time__convert_time"
TASKS = [
    task("tokyo-noon", "A client in Tokyo asks to meet when it is 12:00 UTC. What time is that in Tokyo? "
         "Answer as HH:MM.", ["time"], [CONVERT], contains("21:00"), [
             call(CONVERT, "Convert 12:00 from UTC to Asia/Tokyo.", source_timezone="UTC", time="12:00",
                  target_timezone="Asia/Tokyo"),
             finish("21:00 in Tokyo.")]),
    task("kolkata-standup", "Our stand-up is at 09:30 UTC. What time is it then for our team in Kolkata "
         "(Asia/Kolkata)? Answer as HH:MM.", ["time"], [CONVERT], contains("15:00"), [
             call(CONVERT, source_timezone="UTC", time="09:30", target_timezone="Asia/Kolkata"),
             finish("15:00 in Kolkata.")]),
    task("tokyo-to-utc", "Our Tokyo office closes at 18:00 local time (Asia/Tokyo). What is that in UTC? "
         "Answer as HH:MM.", ["time"], [CONVERT], contains("09:00"), [
             call(CONVERT, source_timezone="Asia/Tokyo", time="18:00", target_timezone="UTC"),
             finish("09:00 UTC.")]),
    task("shanghai-offset", "A supplier in Shanghai (Asia/Shanghai) ships at 08:15 UTC. What is the local time "
         "there? Answer as HH:MM.", ["time"], [CONVERT], contains("16:15"), [
             call(CONVERT, "The first try names the zone wrongly.", source_timezone="UTC", time="08:15",
                  target_timezone="China/Shanghai"),
             call(CONVERT, "That zone does not exist; the IANA name is Asia/Shanghai.", source_timezone="UTC",
                  time="08:15", target_timezone="Asia/Shanghai"),
             finish("16:15 in Shanghai.")]),
    task("git-release-branch", f"In the repository at {REPO}, create a branch named release-1 from main so we can "
         "prepare the release.", ["git"], ["git__git_create_branch"],
         state(f"git -C {REPO} rev-parse --abbrev-ref release-1", "release-1"), [
             call("git__git_create_branch", repo_path=REPO, branch_name="release-1", base_branch="main"),
             finish("Created branch release-1 from main.")]),
    task("git-last-commit", f"What is the message of the most recent commit in the repository at {REPO}? "
         "Reply with the message only.", ["git"], ["git__git_log"],
         {"type": "answer", "expected": "document usage", "match": "exact"}, [
             call("git__git_log", repo_path=REPO, max_count=1),
             finish("document usage")]),
    task("git-commit-count", f"How many commits are there on the main branch of the repository at {REPO}?",
         ["git"], ["git__git_log"], {"type": "answer", "expected": 3, "match": "number"}, [
             call("git__git_log", repo_path=REPO, max_count=50),
             finish("There are 3 commits on main.")]),
    task("sqlite-add-product", "Add a new product to the shop database: 'filter', priced 12.99 (1299 cents), "
         "7 in stock. Then tell me how many products there are.", ["sqlite"],
         ["sqlite__write_query", "sqlite__read_query"], state(sql_probe("select count(*) from products"), "4"), [
             call("sqlite__describe_table", "Check the columns first.", table_name="products"),
             call("sqlite__write_query",
                  query="INSERT INTO products (name, price_cents, stock) VALUES ('filter', 1299, 7)"),
             call("sqlite__read_query", query="SELECT COUNT(*) AS n FROM products"),
             finish("Added 'filter'; there are now 4 products.")]),
    task("sqlite-total-stock", "How many units are in stock across all products in the shop database?",
         ["sqlite"], ["sqlite__read_query"], {"type": "answer", "expected": 15, "match": "number"}, [
             call("sqlite__read_query", query="SELECT SUM(stock) AS units FROM products"),
             finish("15 units are in stock.")]),
    task("sqlite-restock-tripods", "We just received 5 tripods. Update the tripod stock in the shop database "
         "accordingly.", ["sqlite"], ["sqlite__read_query", "sqlite__write_query"],
         state(sql_probe("select stock from products where name = 'tripod'"), "5"), [
             call("sqlite__read_query", query="SELECT stock FROM products WHERE name = 'tripod'"),
             call("sqlite__write_query", query="UPDATE products SET stock = stock + 5 WHERE name = 'tripod'"),
             finish("Tripod stock is now 5.")]),
    task("git-time-commit-tokyo", f"The latest commit in {REPO} was made at a time given in UTC. What time was it "
         "then in Tokyo? Answer as HH:MM.", ["git", "time"], ["git__git_log", CONVERT], contains("21:00"), [
             call("git__git_log", "Read the latest commit's date.", repo_path=REPO, max_count=1),
             call(CONVERT, "It was committed at 12:00 UTC.", source_timezone="UTC", time="12:00",
                  target_timezone="Asia/Tokyo"),
             finish("21:00 in Tokyo.")]),
    task("fetch-library-hours", "The Harbor Town Library's website is at http://127.0.0.1:8080/ . Until what "
         "time is the library open on weekdays?", ["fetch"], ["fetch__fetch"], contains("18:00"), [
             call("fetch__fetch", url="http://127.0.0.1:8080/"),
             finish("It is open until 18:00 (Monday to Friday, 09:00-18:00).")]),
]

# -- the pipeline demo: seeds, the llm stages' answers, the agent's solutions -----------------

SEEDS = [
    {"id": "time-1", "servers": ["time"], "mode": "single_server", "sampling": "uniform", "num_tools": 1,
     "total": 3, "seed": 1},
    {"id": "git-sqlite", "servers": ["git", "sqlite"], "mode": "multi_server", "allocation": "random",
     "num_tools": 2, "total": 1, "seed": 2},
]


def question(text: str, *tools: tuple[str, str], analysis: str = "") -> str:
    return json.dumps({"server_analysis": analysis or "The tools answer the need directly.",
                       "target_tools": [{"server": s, "tool": t} for s, t in tools], "question": text})


def qc(stability: str = "highly stable", **ratings: str) -> str:
    reasons = {"tool_selection_difficulty": "The need is clear but the tool is not named.",
               "tool_selection_uniqueness": "Only these tools give the needed data.",
               "question_quality": "Clear, specific, with every value given.",
               "scenario_realism": "A common real-life need.",
               "verifiable": "The answer is a short exact value.",
               "stability": "The answer does not depend on when or where it is asked."}
    values = {"tool_selection_difficulty": "medium", "tool_selection_uniqueness": "quite unique",
              "question_quality": "good", "scenario_realism": "realistic", "verifiable": "easy to verify",
              "stability": stability, **ratings}
    if stability != "highly stable":
        reasons["stability"] = "The answer changes from minute to minute."
    return json.dumps({dim: {"reasoning": reasons[dim], "rating": values[dim]} for dim in reasons})


TOKYO_CALL = "I have a video call at 12:00 UTC with a colleague in Tokyo. What time will it be for her?"
GIT_SQLITE = (f"Before I tag a release of the inventory repository at {REPO}: what is the message of its newest "
              "commit, and how many lamps are in stock in the shop database?")
STAGE_ANSWERS = {
    "time-1.q0": (question(TOKYO_CALL, ("time", "convert_time")), qc()),
    # A paraphrase of q0: the dedup stage drops it (cosine 0.98).
    "time-1.q1": (question("My colleague in Tokyo joins a video call at 12:00 UTC. What time will it be for her "
                           "there?", ("time", "convert_time")), qc()),
    # Depends on the moment it is asked: the quality gate drops it (stability 1 < 3).
    "time-1.q2": (question("What is the current local time in Lima right now?", ("time", "get_current_time")),
                  qc("highly unstable", verifiable="hard to verify")),
    "git-sqlite.q0": (question(GIT_SQLITE, ("git", "git_log"), ("sqlite", "read_query"),
                               analysis="git reads the repository's history, sqlite the shop's stock."), qc()),
}
AGENT_SOLUTIONS = {
    TOKYO_CALL: [call(CONVERT, source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo"),
                 finish("It will be 21:00 in Tokyo.")],
    GIT_SQLITE: [call("git__git_log", repo_path=REPO, max_count=1),
                 call("sqlite__read_query", query="SELECT stock FROM products WHERE name = 'lamp'"),
                 finish("The newest commit is 'document usage'; 3 lamps are in stock.")],
}


def stage_scripts() -> list[dict]:
    scripts = []
    for key, (q, assessment) in STAGE_ANSWERS.items():
        scripts.append({"id": f"toucan-question-{key}", "prompt": f"[pipeline:toucan/question key={key}]",
                        "reference_solution": [{"content": q}]})
        scripts.append({"id": f"toucan-qc-{key}", "prompt": f"[pipeline:toucan/qc key={key}]",
                        "reference_solution": [{"content": assessment}]})
    for i, (prompt, steps) in enumerate(AGENT_SOLUTIONS.items()):
        scripts.append({"id": f"toucan-agent-{i}", "prompt": prompt, "reference_solution": steps})
    return scripts


def main() -> None:
    (EXAMPLES / "tasks" / "toucan.jsonl").write_text(
        "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in TASKS), encoding="utf-8")
    (HERE / "seeds.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SEEDS), encoding="utf-8")
    out = EXAMPLES / "pipelines" / "toucan"
    out.mkdir(parents=True, exist_ok=True)
    (out / "scripts.json").write_text(json.dumps(stage_scripts(), indent=1, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    print(f"{len(TASKS)} tasks, {len(SEEDS)} seeds, {len(stage_scripts())} pipeline scripts")


if __name__ == "__main__":
    main()
