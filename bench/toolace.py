#!/usr/bin/env python
"""Benchmark the toolace pipeline: its yield per LLM call, the share rejected at each gate, and what
validating a suite in the sandbox costs.

    .venv/bin/python bench/toolace.py [--repeats 5] [--keep]

1. Yield: the demo seeds (examples/toolace/seeds.jsonl) through `synthesize_pipeline toolace`'s
   runner, answered by the offline scripted model (examples/pipelines/toolace/scripts.json): model
   calls per stage, suites and tasks admitted per model call, and the items each gate rejected out
   of those that reached it (by the gate named at the start of the stored reason).
2. Cost: the suite gate (a fresh sandbox, envscaler's validation + a smoke call of every
   operation) and the task gate (the replay of every task of the suite, one sandbox) on the
   calendar suite, `--repeats` times, beside creating and destroying a bare sandbox that runs
   `true` (what the gate pays for isolation).

A throwaway SQLite database and var directory are used (never var/db.sqlite3), removed unless
--keep. This is a benchmark, not a test: it prints numbers and exits 0.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup(database_url: str, var_dir: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["TRAJ_VAR_DIR"] = var_dir
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
    os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def timings(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
    return f"median {statistics.median(values) * 1000:7.0f} ms   p90 {p90 * 1000:7.0f} ms   (n={len(values)})"


def gate_of(reason: str) -> str:
    head = reason.split(":", 1)[0]
    if reason.startswith("invalid output after"):
        inner = reason.split(": ", 1)[1] if ": " in reason else reason
        head = inner.split(":", 1)[0]
    return head


def yield_report() -> None:
    from apps.engines.llm import LLMClient, Provider
    from apps.engines.models import StageRun
    from apps.engines.offline_model import MODEL_NAME, running_offline_model
    from apps.engines.pipelines import jobs, services
    from apps.engines.pipelines.runner import ALL_ITEMS

    seeds = [json.loads(line) for line in (ROOT / "examples" / "toolace" / "seeds.jsonl").read_text().splitlines() if line]
    scripts = json.loads((ROOT / "examples" / "pipelines" / "toolace" / "scripts.json").read_text())
    run = services.pipeline_run_create(scene="toolace", seeds=seeds, actor=None, batch_name="bench-toolace")
    started = time.perf_counter()
    with running_offline_model(scripts=scripts) as server:
        llm = LLMClient([Provider("offline", server.url, MODEL_NAME, "")], limiters={})
        result = jobs.run_pipeline(run.pk, llm=llm)
    took = time.perf_counter() - started
    rows = list(StageRun.objects.filter(run=run).order_by("id"))
    print(f"pipeline run {result.get('status')} in {took:.1f} s: {len(seeds)} seeds")
    print(f"{'stage':10} {'runs':>5} {'calls':>6} {'kept':>5} {'dropped':>8}   drop reasons (gate)")
    calls_total = 0
    entered: collections.Counter[str] = collections.Counter()
    rejected: collections.Counter[str] = collections.Counter()
    for stage in ("refine", "expand", "couple", "cross", "flows", "tasks", "task_gate", "task"):
        mine = [r for r in rows if r.stage == stage]
        calls = sum(r.llm_calls for r in mine)
        calls_total += calls
        if stage == "cross":
            outputs = [o for r in mine for o in ((r.parsed_output or {}).get("kept") or {}).values()]
            kept = sum(len(o["combined"]) for o in outputs)
            dropped = [why for o in outputs for why in o["rejected"].values()]
            runs = kept + len(dropped)
            entered["suite gate"] += runs
            rejected["suite gate"] += len(dropped)
        elif stage == "task_gate":
            out = mine[0].parsed_output if mine else {"kept": {}, "dropped": {}}
            kept, dropped = len(out["kept"]), list(out["dropped"].values())
            runs = kept + len(dropped)
        else:
            kept = sum(r.status == "succeeded" for r in mine)
            dropped = [r.error for r in mine if r.status == "dropped"]
            runs = len([r for r in mine if r.item_key != ALL_ITEMS])
        gates = collections.Counter(gate_of(reason) for reason in dropped)
        if stage == "couple":
            entered["suite gate"] += runs
            rejected["suite gate"] += len(dropped)
            repaired = sum(r.repair_attempts > 0 and r.status == "succeeded" for r in mine)
            gates["repaired, then admitted"] = repaired
        if stage == "task_gate":
            entered["task gate"] += runs
            rejected["task gate"] += len(dropped)
        reasons = ", ".join(f"{g} {n}" for g, n in sorted(gates.items()) if n) or "-"
        print(f"{stage:10} {runs:>5} {calls:>6} {kept:>5} {len(dropped):>8}   {reasons}")
    suites = sum(r.status == "succeeded" for r in rows if r.stage == "couple")  # combined ones cost no call
    suite_calls = sum(r.llm_calls for r in rows if r.stage in ("refine", "expand", "couple"))
    tasks = sum(r.status == "succeeded" and r.task_id is not None for r in rows if r.stage == "task")
    print(f"model calls {calls_total}: suites admitted {suites} ({suites / suite_calls:.2f} per suite-stage call, "
          f"{suite_calls} calls); tasks admitted {tasks} ({tasks / calls_total:.2f} per call overall)")
    for gate in entered:
        share = rejected[gate] / entered[gate] if entered[gate] else 0.0
        print(f"rejected at the {gate}: {rejected[gate]}/{entered[gate]} ({share:.0%})")


def cost_report(repeats: int) -> None:
    from django.conf import settings

    from apps.engines.sandboxes import SandboxSpec, get_backend
    from apps.engines.scenes.toolace import gates

    spec = importlib.util.spec_from_file_location("toolace_build", ROOT / "examples" / "toolace" / "build.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    tasks = {f"{f}.{t['task']['id']}": t["task"] for f, ts in demo.CAL_TASKS.items() for t in ts}
    bare, suite, replay = [], [], []
    for _ in range(repeats):
        t = time.perf_counter()
        with get_backend().create(SandboxSpec(image=settings.ENVSCALER_SANDBOX_IMAGE)) as sandbox:
            sandbox.run(["true"], timeout=30)
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        gates.suite_gate(demo.CAL_SUITE)
        suite.append(time.perf_counter() - t)
        t = time.perf_counter()
        gates.task_gates(demo.CAL_SUITE, tasks)
        replay.append(time.perf_counter() - t)
    ops = len(demo.CAL_SUITE["operations"])
    print(f"{'bare sandbox (create, run true, destroy)':52} {timings(bare)}")
    print(f"{f'suite gate: validate + {ops} smoke calls, one sandbox':52} {timings(suite)}")
    print(f"{f'task gate: replay {len(tasks)} tasks of the suite, one sandbox':52} {timings(replay)}")
    print(f"suite gate beyond the bare sandbox: {(statistics.median(suite) - statistics.median(bare)) * 1000:.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-toolace-"))
    (tmp / "var").mkdir()
    try:
        setup(f"sqlite:///{tmp / 'bench.sqlite3'}", str(tmp / "var"))
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        print(f"{os.cpu_count()} cores")
        yield_report()
        print()
        cost_report(args.repeats)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
