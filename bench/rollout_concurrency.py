#!/usr/bin/env python
"""Benchmark how many rollouts one worker process drives at once (issue: rollouts, benchmark b).

    .venv/bin/python bench/rollout_concurrency.py [--rollouts 128] [--steps 10] [--latency 1.0] [--rounds 1]

Runs --rollouts trajectories at once in ONE run_rollouts job (ROLLOUT_CONCURRENCY = --rollouts,
LLM_MAX_CONCURRENCY raised to match) against the offline scripted model answering every request
after --latency seconds (fault "slow;seconds=S", in its own process), with the local sandbox.
Each episode makes --steps run_shell("true") calls and a finish: --steps + 1 model turns.

    efficiency = achieved model turns per second / (rollouts / latency)

i.e. how close the worker gets to keeping every rollout waiting on the model all the time.
Target: >= 0.85 for 128 rollouts at 1 s on this 2-core machine. Also printed: the same rate
over the steady-state window only (every rollout started, none finished yet; from the live-log
action rows), and the peak RSS of the worker process. With --processes N the batch is split over
N worker processes (as `make worker` runs Q_WORKERS of them), timed from the moment all are
ready until the last one's job returned: a worker process is long-lived, so its start-up and
exit are not part of running a batch. --repeat N runs N batches and prints the median as well.

The verdict is on one batch of --rollouts episodes, all started together: its wall time
includes their first turns, whose answers all arrive at once, and its end, when fewer and
fewer are left running. --rounds K queues K times as many episodes for the same --rollouts
slots (a slot that frees claims the next one, as a worker does in a long batch) and prints,
besides that batch's own rate, the rate while every slot was busy (from the moment the first
--rollouts had started until the last episode started; from the live-log action rows).

A benchmark, not a test: prints numbers and a verdict, exits 0 either way (1 if it cannot run).
Throwaway SQLite database in a temporary TRAJ_VAR_DIR unless --database-url is given.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_overhead import ModelServer, make_batch, peak_rss_mb, setup_django, write_script  # noqa: E402

TARGET = 0.85
# The stand-in for a remote model shares our two cores; at this priority the worker's own load
# (128 sandboxes starting at once) does not stretch what stands for a remote service's latency.
MODEL_NICE = -10


def cpu_s(children: bool) -> float:
    """CPU seconds of this process (all threads), or of the processes it waited for (worker
    processes and their sandboxes, or this process's own sandboxes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


WORKER_SCRIPT = """
import sys, time, django
django.setup()
from apps.tasks.jobs import run_rollouts
print("ready", flush=True)
sys.stdin.readline()
run_rollouts(concurrency=int(sys.argv[1]), batch_id=int(sys.argv[2]))
print("done", time.perf_counter(), flush=True)
"""


def run_in_processes(batch_id: int, processes: int, each: int, model_url: str) -> float:
    """`processes` worker processes, each one run_rollouts job with concurrency `each`; returns
    the wall time from the moment all of them are ready (a worker is a long-lived process: its
    start-up is not part of running a batch) until the last one is done."""
    env = {**os.environ, "OFFLINE_MODEL_URL": model_url, "ROLLOUT_CONCURRENCY": str(each),
           "LLM_MAX_CONCURRENCY": str(each)}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, str(each), str(batch_id)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parent.parent) for _ in range(processes)]
    for worker in workers:
        if worker.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise RuntimeError("a worker process did not start")
    started = time.perf_counter()
    for worker in workers:
        worker.stdin.write("go\n")  # type: ignore[union-attr]
        worker.stdin.flush()  # type: ignore[union-attr]
    done = []
    for worker in workers:
        line = worker.stdout.readline().split()  # type: ignore[union-attr]
        if worker.wait() != 0 or len(line) != 2 or line[0] != "done":
            raise RuntimeError(f"a worker process exited with {worker.returncode}")
        done.append(float(line[1]))  # perf_counter is CLOCK_MONOTONIC: comparable across processes
    # Until the last worker finished its job; a worker process is long-lived: its exit, like its
    # start, is not part of running a batch.
    return max(done) - started


class FakeAgent:
    """--fake-agent: stands in for run_episode with the model's latency as a sleep and no sandbox,
    but the same callbacks per step as the real loop (live-log events, a cancel check)."""

    def __init__(self, steps: int, latency: float):
        self.steps, self.latency = steps, latency

    async def __call__(self, *, on_event, should_cancel, **kwargs):
        import asyncio

        from apps.engines.agent import EpisodeResult

        messages = []
        for step in range(self.steps + 1):
            if await should_cancel():
                return EpisodeResult(outcome="error", outcome_reason="cancelled", cancelled=True)
            await asyncio.sleep(self.latency)  # the model call
            messages.append({"role": "assistant", "content": None, "tool_calls": []})
            await on_event("thought", f"step {step}", {"step": step})
            await on_event("action", "run_shell(true)", {"step": step})
            await on_event("output", "exit 0", {"step": step})
        await on_event("result", "success", {})
        return EpisodeResult(messages=messages, outcome="success", outcome_reason="fake", model="fake")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="run_shell steps per episode (plus a finish)")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the model takes per answer")
    parser.add_argument("--fake-agent", action="store_true",
                        help="replace the agent loop (LLM client, sandbox) with a sleep per step: what the worker "
                             "machinery alone (claims, live logs, polls, heartbeats, storage) achieves")
    parser.add_argument("--processes", type=int, default=1,
                        help="split the rollouts over this many worker processes (as `make worker` runs Q_WORKERS "
                             "of them, Q_WORKERS=2 by default), each running rollouts/processes at once")
    parser.add_argument("--rounds", type=int, default=1,
                        help="queue this many episodes per slot (rounds x rollouts in all, rollouts at once); "
                             "the steady-state line is then the rate while every slot was busy")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the batch this many times (one model server, a new batch each) and print the "
                             "median too: this VM's CPU speed drifts by a tenth from minute to minute")
    parser.add_argument("--database-url", help="use this (empty, migratable) database instead of a temporary SQLite")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if args.processes > 1 and args.fake_agent:
        parser.error("--fake-agent runs in this process only")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    tmp = Path(tempfile.mkdtemp(prefix="bench-rollout-concurrency-", dir="/var/tmp"))
    n = args.rollouts
    results: list[float] = []
    try:
        setup_django(tmp, database_url=args.database_url, env={
            "ROLLOUT_CONCURRENCY": str(n), "LLM_MAX_CONCURRENCY": str(n), "LLM_TIMEOUT_S": "300",
        })
        from django.test.utils import override_settings

        from apps.tasks import jobs

        if args.fake_agent:
            jobs.run_episode = FakeAgent(args.steps, args.latency)
        prompt = write_script(tmp / "script.json", args.steps)
        server = ModelServer(tmp / "script.json", fault=f"slow;seconds={args.latency:g}", nice=MODEL_NICE)
        try:
            with override_settings(OFFLINE_MODEL_URL=server.url):
                for run in range(1, args.repeat + 1):
                    if args.repeat > 1:
                        print(f"--- run {run} of {args.repeat}")
                    results.append(run_once(args, prompt, server, f"concurrency-{run}"))
        finally:
            server.stop()
    except Exception as exc:
        print(f"cannot run the benchmark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.repeat > 1:
        median = statistics.median(results)
        print(f"=== {args.repeat} runs: efficiency " + ", ".join(f"{e:.3f}" for e in results)
              + f"; median {median:.3f}, best {max(results):.3f}"
              + ((f" (target >= {TARGET}) -> " + ("MET" if median >= TARGET else "MISSED") + " on the median")
                 if args.rounds == 1 else ""))
    return 0


def run_once(args: argparse.Namespace, prompt: str, server: ModelServer, name: str) -> float:
    """One batch of --rollouts episodes, timed; prints its numbers, returns its efficiency."""
    from django.db.models import Count, Max, Min

    from apps.tasks.jobs import run_rollouts
    from apps.tasks.models import Trajectory, TrajectoryLog

    n = args.rollouts
    load_before = os.getloadavg()[0]
    batch = make_batch(prompt, n * args.rounds, args.steps, name)
    multi = args.processes > 1
    cpu_before, sandbox_before, server_before = cpu_s(multi), cpu_s(True), server.cpu_s()
    if multi:
        wall = run_in_processes(batch.pk, args.processes, -(-n // args.processes), server.url)
    else:
        started = time.perf_counter()
        run_rollouts(batch_id=batch.pk)
        wall = time.perf_counter() - started
    cpu = cpu_s(multi) - cpu_before
    sandbox_cpu = cpu_s(True) - sandbox_before
    server_cpu = server.cpu_s() - server_before

    rows = Trajectory.objects.filter(task__batch=batch)
    outcomes = ", ".join(f"{o or s}={k}" for o, s, k in rows.order_by().values_list("outcome", "status")
                         .annotate(k=Count("id")).values_list("outcome", "status", "k"))
    turns = sum(sum(1 for m in messages if m.get("role") == "assistant")
                for messages in rows.values_list("messages", flat=True))
    if args.rounds == 1:  # from the last start to the first end: all of them running
        window = rows.aggregate(start=Max("started_at"), end=Min("finished_at"))
    else:  # from the moment every slot had an episode until the queue ran dry
        starts = sorted(t for t in rows.values_list("started_at", flat=True) if t is not None)
        window = {"start": starts[n - 1], "end": starts[-1]} if len(starts) >= n else {"start": None, "end": None}
    steady_s = steady_turns = 0.0
    if window["start"] and window["end"] and window["end"] > window["start"]:
        steady_s = (window["end"] - window["start"]).total_seconds()
        steady_turns = TrajectoryLog.objects.filter(
            trajectory__task__batch=batch, kind="action",
            created_at__gte=window["start"], created_at__lt=window["end"],
        ).count()

    ideal = n / args.latency
    rate = turns / wall
    efficiency = rate / ideal
    what = ("FAKE agent (a sleep per step, no LLM client, no sandbox)" if args.fake_agent
            else "real agent loop, LLM client, local sandbox (a fresh bubblewrap per command)")
    where = "one worker process" if args.processes == 1 else f"{args.processes} worker processes"
    queued = "" if args.rounds == 1 else f" ({n * args.rounds} queued: {args.rounds} per slot)"
    print(f"{n} rollouts at once{queued} in {where}, model latency {args.latency:g}s, "
          f"{args.steps} run_shell steps + finish each; {what}; {os.cpu_count()} CPUs")
    print(f"outcomes: {outcomes}; load average before the run {load_before:.1f}")
    print(f"model turns: {turns} in {wall:.2f}s = {rate:.1f}/s; ideal {ideal:.1f}/s")
    if args.rounds == 1:
        print(f"efficiency: {efficiency:.3f}  (target >= {TARGET}) -> {'MET' if efficiency >= TARGET else 'MISSED'}")
    else:
        print(f"efficiency: {efficiency:.3f}  ({args.rounds} episodes per slot; the target is judged on one batch "
              "of --rollouts, --rounds 1)")
    if steady_s:
        print(f"steady state (all {n} slots busy): {steady_turns:.0f} turns in {steady_s:.2f}s = "
              f"{steady_turns / steady_s:.1f}/s, efficiency {steady_turns / steady_s / ideal:.3f}")
    print(f"model server CPU (the benchmark's stand-in for a remote model, on the same cores): "
          f"{server_cpu / turns * 1000:.1f} ms per model turn")
    if args.processes == 1:
        print(f"worker process CPU: {cpu:.1f}s = {cpu / turns * 1000:.1f} ms per model turn; one core, all the GIL "
              f"lets it use, caps it at {turns / cpu:.0f} turns/s; its sandbox processes: "
              f"{sandbox_cpu / turns * 1000:.1f} ms per turn")
        print(f"peak RSS of the worker process: {peak_rss_mb():.0f} MB")
    else:
        print(f"worker processes' CPU, sandboxes included: {cpu:.1f}s = {cpu / turns * 1000:.1f} ms per model turn")
        print(f"peak RSS of the largest worker process: {children_peak_rss_mb():.0f} MB")
    return efficiency


if __name__ == "__main__":
    sys.exit(main())
