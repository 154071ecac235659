#!/usr/bin/env python
"""Benchmark the exporters (issue 6): throughput against a bare loop, and peak memory.

    .venv/bin/python bench/export.py [-n 100000] [--small 10000] [--formats sft-openai,raw,...]
    tests/tools/with-postgres sh -c '.venv/bin/python bench/export.py --database-url "$DATABASE_URL"'

Generates N synthetic trajectories of 12 messages (4 rollouts per task, parallel tool calls,
a failed command, non-ASCII text, an empty observation, an automatic review each and a human
verdict on every tenth; one in fifty carries a bearer token so redaction has work to do),
then, each in a fresh subprocess so peak RSS is its own:

* export: `export_records(FORMAT, load_records(ids), /dev/null)` for every format asked;
* bare:   the same rows (trajectories with their task columns, and their reviews) read in the
          same chunks by the same reader (`json_values`: `.values()` with JSON columns parsed
          by orjson), each trajectory serialized with its review rows by orjson, sorted keys;
          no canonical record, rendering, validation or redaction.

Each export runs right after its own bare run, and the ratio export/bare (target >= 0.5)
compares the two, so a machine that is busy with other work skews both alike. It prints
trajectories/s, the ratio, and the child's resident memory when it starts measuring and at its
peak, at --small and at -n trajectories (target: no growth with size). Ids are streamed from
the database in both modes. A throwaway SQLite file is used unless --database-url is given;
never var/db.sqlite3. The temporary directory is removed unless --keep.
A benchmark, not a test: it prints numbers and exits 0 (1 only if it cannot run).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 0.5
CHUNK = 500


def setup(database_url: str, var_dir: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["TRAJ_VAR_DIR"] = var_dir
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


# -- data -------------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": {
        "type": "object", "properties": {p: {"type": "string", "description": f"the {p}"} for p in ps},
        "required": list(ps)}}}
    for n, d, ps in [("run_shell", "Run a shell command in the workspace.", ("command",)),
                     ("write_file", "Write a file in the workspace.", ("path", "content")),
                     ("read_file", "Read a file from the workspace.", ("path",)),
                     ("finish", "End the episode with the final answer.", ("answer",))]
]


def episode(i: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    def call(k: int, name: str, **args: Any) -> dict[str, Any]:
        return {"id": f"call_{i}_{k}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}

    code = f"def solve(xs):\n    # variant {i}: somme des éléments ✓\n    return sum(x * {i % 7 + 1} for x in xs)\n"
    c = [call(1, "write_file", path="solution.py", content=code), call(2, "run_shell", command="ls -la"),
         call(3, "run_shell", command="python3 -m pytest -q"), call(4, "read_file", path="solution.py"),
         call(5, "finish", answer=f"solve() implemented for variant {i}")]
    failure = "1 failed, 2 passed in 0.12s\nAssertionError: assert 6 == 7" + (
        "\nAuthorization: Bearer abcdefghijklmnop0123" if i % 50 == 0 else "")
    messages = [
        {"role": "system", "content": "You are a careful coding agent working in /workspace. 你好."},
        {"role": "user", "content": f"Task {i // 4}: write solution.py with solve(xs) and make the tests pass."},
        {"role": "assistant", "content": "I will write the solution and look at the workspace.",
         "tool_calls": [c[0], c[1]]},
        {"role": "tool", "tool_call_id": c[0]["id"], "name": "write_file", "content": f"wrote {len(code)} bytes"},
        {"role": "tool", "tool_call_id": c[1]["id"], "name": "run_shell", "content": ""},
        {"role": "assistant", "content": None, "tool_calls": [c[2]]},
        {"role": "tool", "tool_call_id": c[2]["id"], "name": "run_shell", "content": failure},
        {"role": "assistant", "content": "Une assertion échoue ; je relis le fichier.", "tool_calls": [c[3]]},
        {"role": "tool", "tool_call_id": c[3]["id"], "name": "read_file", "content": code},
        {"role": "assistant", "content": None, "tool_calls": [c[4]]},
        {"role": "tool", "tool_call_id": c[4]["id"], "name": "finish", "content": "finish accepted; the episode ends"},
        {"role": "assistant", "content": "Done."},
    ]
    steps = [{"index": k, "turn": k + 1, "tool_call_id": x["id"], "tool": x["function"]["name"],
              "arguments": json.loads(x["function"]["arguments"]), "format": "native", "thought": "",
              "output": "ok", "exit_code": 1 if k == 2 else 0, "duration_ms": 40 + k, "truncated": False,
              "timed_out": False} for k, x in enumerate(c)]
    return messages, steps


def generate(n: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from apps.reviews.models import Review
    from apps.tasks.models import Batch, Task, Trajectory

    user = get_user_model().objects.create_user("bench-reviewer")
    batch = Batch.objects.create(name="bench")
    t0 = time.perf_counter()
    for start in range(0, n, 2000):
        with transaction.atomic():
            count = min(2000, n - start)
            tasks = Task.objects.bulk_create([
                Task(batch=batch, scene="code_exec", prompt=f"Task {(start + k) // 4}", external_id=f"t{(start + k) // 4}",
                     status="completed") for k in range(0, count, 4)])
            rows = []
            for k in range(count):
                i = start + k
                messages, steps = episode(i)
                success = i % 4 != 3
                t = Trajectory(task=tasks[k // 4], iteration=1, sample_index=k % 4, status="finished", messages=messages,
                               tools=TOOLS, steps=steps, final_answer="done" if success else "",
                               outcome="success" if success else "failure", reward=1.0 if success else 0.25,
                               verifier_output={"command": "python3 -m pytest -q", "exit_code": 0, "passed": 3},
                               model="bench-model", config_snapshot={"scene": "code_exec", "temperature": 0.7},
                               prompt_tokens=900, completion_tokens=300, total_tokens=1200)
                t.content_sha256 = t.compute_content_sha256()
                rows.append(t)
            Trajectory.objects.bulk_create(rows)
            reviews = [Review(trajectory=t, kind="auto", status="done", overall=50 + (t.pk % 50),
                              scores={"correctness": {"score": 70, "rationale": "tests pass"}}, judge_model="judge",
                              rubric_version="v1") for t in rows]
            reviews += [Review(trajectory=t, kind="human", status="done", verdict="accept", reviewer=user)
                        for t in rows[::10]]
            Review.objects.bulk_create(reviews)
    print(f"generated {n} trajectories in {time.perf_counter() - t0:.1f}s", flush=True)


# -- measured children --------------------------------------------------------------------------


def _ids(n: int) -> Any:
    from apps.tasks.models import Trajectory

    return Trajectory.objects.order_by("pk").values_list("pk", flat=True)[:n].iterator(chunk_size=2000)


def child_export(fmt: str, n: int) -> dict[str, Any]:
    from apps.datasets.exporters import export_records, load_records

    with open(os.devnull, "wb") as out:
        t0 = time.perf_counter()
        result = export_records(fmt, load_records(_ids(n), chunk_size=CHUNK), out)
        elapsed = time.perf_counter() - t0
    return {"seconds": elapsed, "lines": result.lines, "excluded": len(result.excluded)}


def child_bare(n: int) -> dict[str, Any]:
    from itertools import islice

    import orjson

    from apps.datasets.exporters.records import _row_fields, json_values, review_columns
    from apps.reviews.models import Review
    from apps.tasks.models import Trajectory

    fields = _row_fields()
    auto, human = review_columns()
    review_fields = ["trajectory_id", "kind", "reviewer__username", *sorted(set(auto) | set(human))]
    lines = 0
    with open(os.devnull, "wb") as out:
        t0 = time.perf_counter()
        ids = _ids(n)
        while chunk := list(islice(ids, CHUNK)):
            reviews: dict[int, list[dict[str, Any]]] = {}
            for review in json_values(Review.objects.filter(trajectory_id__in=chunk).order_by(), review_fields):
                reviews.setdefault(review["trajectory_id"], []).append(review)
            for row in json_values(Trajectory.objects.filter(pk__in=chunk).order_by(), fields):
                row["reviews"] = reviews.get(row["id"], [])
                out.write(orjson.dumps(row, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE))
                lines += 1
        elapsed = time.perf_counter() - t0
    return {"seconds": elapsed, "lines": lines, "excluded": 0}


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_child(args: argparse.Namespace, mode: str, fmt: str, n: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--format", fmt, "-n", str(n),
           "--database-url", args.database_url, "--var-dir", args.var_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"child {mode} {fmt} {n} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=100_000, help="trajectories (default 100000)")
    parser.add_argument("--small", type=int, default=10_000, help="the smaller size for the memory check")
    parser.add_argument("--formats", default="sft-openai,sft-trl,dpo-trl,rl,sharegpt,raw")
    parser.add_argument("--database-url", help="benchmark this (empty, throwaway) database instead of a temporary SQLite file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--child", choices=["export", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--format", default="sft-openai", help=argparse.SUPPRESS)
    parser.add_argument("--var-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        setup(args.database_url, args.var_dir)
        import apps.datasets.exporters  # noqa: F401  (imports are not what is measured)

        start = rss_mb("VmRSS")
        stats = child_export(args.format, args.n) if args.child == "export" else child_bare(args.n)
        stats.update(start_rss_mb=start, peak_rss_mb=rss_mb("VmHWM"))
        print(json.dumps(stats))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="bench-export-"))
    args.var_dir = str(tmp / "var")
    Path(args.var_dir).mkdir()
    args.database_url = args.database_url or f"sqlite:///{tmp / 'bench.sqlite3'}"
    setup(args.database_url, args.var_dir)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    generate(args.n)
    connection.close()
    print(f"database: {connection.vendor}; {os.cpu_count()} cores; chunk {CHUNK}")

    run_child(args, "bare", "-", args.small)  # warm-up: the first read of a fresh file is slower
    try:
        for n in (args.small, args.n):
            print(f"\n{n} trajectories")
            print(f"  {'format':<12} {'bare/s':>8} {'export/s':>9} {'ratio':>6} {'lines':>7} {'excl':>6} "
                  f"{'RSS start':>9} {'peak MB':>8}")
            for fmt in args.formats.split(","):
                bare = run_child(args, "bare", "-", n)
                r = run_child(args, "export", fmt, n)
                ratio = bare["seconds"] / r["seconds"]
                flag = "ok" if ratio >= TARGET_RATIO else "BELOW TARGET"
                print(f"  {fmt:<12} {n / bare['seconds']:>8,.0f} {n / r['seconds']:>9,.0f} {ratio:>6.2f} "
                      f"{r['lines']:>7} {r['excluded']:>6} {r['start_rss_mb']:>9.0f} {r['peak_rss_mb']:>8.0f}  {flag}",
                      flush=True)
            print(f"  (bare loop peak RSS {bare['peak_rss_mb']:.0f} MB)")
        print(f"\ntarget: ratio >= {TARGET_RATIO}; peak RSS at {args.n} about the same as at {args.small}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
