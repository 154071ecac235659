#!/usr/bin/env python
"""Benchmark what the platform adds around an agent's steps (issue: rollouts, benchmark a).

    .venv/bin/python bench/rollout_overhead.py [--episodes 8] [--steps 20] [--rounds 3] [--database-url URL]

With an instant model (the offline scripted model, no latency, in its own process) and a trivial
tool (`run_shell("true")`), compares steps/s through the full platform path

    task rows -> tasks_enqueue -> run_rollouts (claim, heartbeat, live-log rows, cancel checks)
    -> agent loop (LLM client over HTTP, tool dispatch) -> local sandbox -> trajectory_finish

with a bare loop running the same sandbox commands (create a sandbox, run `true` --steps
times, destroy it; no model, no database). Both run the episodes one after another; a step is
one sandbox command. Target: ratio >= 0.5. The two alternate for --rounds rounds (a bare loop,
then the platform, each over --episodes episodes), so that this VM's drift in speed, which is
minutes long, falls on both sides; the verdict is on the median of the rounds' ratios. Also
printed, to show where the time goes: the platform path with the agent loop and the model
replaced by the same sandbox commands (what the worker itself adds: claims, live-log rows,
polls, heartbeats, sandbox records, storage), and the full path at ROLLOUT_CONCURRENCY.

A benchmark, not a test: it prints numbers and a verdict and exits 0 either way (1 only if it
cannot run). It uses a throwaway SQLite database and LLM cache in a temporary TRAJ_VAR_DIR
unless --database-url is given; never the project's var/.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 0.5
BENCH_PROMPT = "Benchmark episode: run the trivial command {n} times, then finish."


# -- shared with bench/rollout_concurrency.py -------------------------------------------------


def setup_django(tmp: Path, *, database_url: str | None, env: dict[str, str] | None = None) -> None:
    """Point settings at a throwaway var dir (database, LLM cache), then django.setup() + migrate."""
    os.environ["TRAJ_VAR_DIR"] = str(tmp / "var")
    os.environ["DATABASE_URL"] = database_url or f"sqlite:///{tmp / 'var' / 'bench.sqlite3'}"
    os.environ["SANDBOX_ROOT"] = str(tmp / "sandboxes")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    for name in ("LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL", "LLM_PROVIDERS"):
        os.environ.pop(name, None)  # the offline model, nothing else
    os.environ.update(env or {})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
    (tmp / "sandboxes").mkdir(mode=0o711, parents=True, exist_ok=True)
    tmp.chmod(0o711)  # the sandbox user must be able to enter the parents
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_script(path: Path, steps: int) -> str:
    """A reference solution of `steps` run_shell("true") calls and a finish; returns its prompt."""
    prompt = BENCH_PROMPT.format(n=steps)
    solution = [{"tool_calls": [{"name": "run_shell", "arguments": {"command": "true"}}]} for _ in range(steps)]
    solution.append({"tool_calls": [{"name": "finish", "arguments": {"answer": "done"}}]})
    path.write_text(json.dumps({"id": "bench", "prompt": prompt, "reference_solution": solution}))
    return prompt


# The offline scripted model's own server (apps/engines/offline_model.py: aiohttp, HTTP/1.1
# keep-alive, a listen backlog of 1024), in a child process so that it does not share the
# worker's GIL. The fault spec "slow;seconds=S" is the model's latency.
SERVER_SCRIPT = """
import sys
from apps.engines.offline_model import OfflineModelServer, ScriptedModel, load_scripts

port, solutions, fault = int(sys.argv[1]), sys.argv[2], sys.argv[3]
OfflineModelServer(ScriptedModel(load_scripts([solutions]), faults=fault), "127.0.0.1", port).serve_forever()
"""


class ModelServer:
    """The offline scripted model in a child process (so it does not share the worker's GIL)."""

    def __init__(self, solutions: Path, *, fault: str = "", nice: int = 0):
        self.port = free_port()
        args = [sys.executable, "-c", SERVER_SCRIPT, str(self.port), str(solutions), fault]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.nice = 0
        if nice:
            # Before it starts its threads (they inherit it); lowering needs root.
            try:
                os.setpriority(os.PRIO_PROCESS, self.proc.pid, nice)
                self.nice = nice
            except OSError:
                pass
        self.url = f"http://127.0.0.1:{self.port}/v1"
        import httpx

        for _ in range(300):
            try:
                if httpx.get(self.url + "/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("the offline model server exited")
            time.sleep(0.05)
        raise RuntimeError("the offline model server did not answer")

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far (it shares this machine's cores)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def make_batch(prompt: str, episodes: int, steps: int, name: str) -> Any:
    """A batch of identical code_exec tasks (no verifier), started: their trajectories are queued."""
    from apps.tasks.services import batch_import, tasks_enqueue

    rows = [{"scene": "code_exec", "prompt": prompt, "max_steps": steps + 5, "step_timeout_s": 30.0,
             "timeout_s": 3600.0, "temperature": 0.0, "external_id": f"{name}-{i}"} for i in range(episodes)]
    batch = batch_import(rows=rows, name=name, source_name="bench", source_sha256="", source_format="bench",
                         actor=None)
    tasks_enqueue(batch=batch)
    return batch


def run_platform(batch: Any, concurrency: int) -> tuple[float, dict[str, Any]]:
    """run_rollouts for this batch until done; (wall seconds, outcome counts). The CPU seconds
    this process used meanwhile (all its threads; not the sandboxes' processes, not the model
    server's) are in the report as "cpu_s"."""
    from apps.tasks.jobs import run_rollouts

    started, cpu = time.perf_counter(), time.process_time()
    report = run_rollouts(concurrency=concurrency, batch_id=batch.pk)
    return time.perf_counter() - started, {**report, "cpu_s": time.process_time() - cpu}


def sandbox_steps(batch: Any) -> int:
    """Sandbox commands the platform ran: run_shell steps over all trajectories of the batch."""
    from apps.tasks.models import Trajectory

    total = 0
    for steps in Trajectory.objects.filter(task__batch=batch).values_list("steps", flat=True):
        total += sum(1 for s in steps if (s.get("tool") or s.get("name")) == "run_shell")
    return total


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the benchmark ----------------------------------------------------------------------------


def bare_loop(episodes: int, steps: int) -> float:
    """Seconds for `episodes` x (create sandbox, run `true` `steps` times, destroy)."""
    from apps.engines.sandboxes import SandboxSpec, get_backend

    backend = get_backend("local", records=False)
    started = time.perf_counter()
    for _ in range(episodes):
        with backend.create(SandboxSpec()) as box:
            for _ in range(steps):
                result = box.run("true", timeout=30)
                assert result.exit_code == 0, result
    return time.perf_counter() - started


class SandboxOnlyAgent:
    """Stands in for run_episode with the same sandbox commands and live-log events but no model
    and no agent loop: the platform path minus the agent isolates the worker's own overhead."""

    def __init__(self, steps: int):
        self.steps = steps

    async def __call__(self, *, on_event, should_cancel, trajectory, **kwargs):
        import asyncio

        from apps.engines.agent import EpisodeResult
        from apps.engines.sandboxes import SandboxSpec, acquire

        box = await asyncio.to_thread(acquire, SandboxSpec(), trajectory=trajectory)
        steps = []
        try:
            for _ in range(self.steps):
                if await should_cancel():
                    break
                await on_event("action", "run_shell(true)", {})
                result = await asyncio.to_thread(box.run, "true", timeout=30)
                await on_event("output", f"exit {result.exit_code}", {})
                steps.append({"tool": "run_shell", "exit_code": result.exit_code})
        finally:
            await asyncio.to_thread(box.destroy)
        await on_event("result", "success", {})
        return EpisodeResult(steps=steps, outcome="success", outcome_reason="sandbox-only", model="none")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="run_shell steps per episode (plus a finish)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating bare/platform rounds; the verdict is on the median")
    parser.add_argument("--database-url", help="use this (empty, migratable) database instead of a temporary SQLite")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if args.rounds < 1 or args.episodes < 1 or args.steps < 1:
        parser.error("--rounds, --episodes and --steps must be at least 1")

    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-rollout-overhead-", dir="/var/tmp"))
    rounds: list[tuple[float, float]] = []  # (bare steps/s, platform steps/s)
    cpu_ms: list[float] = []  # the platform's CPU in this process per step
    expected = args.episodes * args.steps
    try:
        setup_django(tmp, database_url=args.database_url)
        from django.conf import settings

        prompt = write_script(tmp / "script.json", args.steps)
        server = ModelServer(tmp / "script.json")
        try:
            from django.test.utils import override_settings

            with override_settings(OFFLINE_MODEL_URL=server.url):
                bare_loop(1, 3)  # warm-up: bwrap, page cache
                warm = make_batch(prompt, 1, 3, "warm-up")
                run_platform(warm, 1)

                for n in range(1, args.rounds + 1):
                    bare_s = bare_loop(args.episodes, args.steps)
                    batch = make_batch(prompt, args.episodes, args.steps, f"sequential-{n}")
                    platform_s, report = run_platform(batch, 1)
                    platform_steps = sandbox_steps(batch)
                    if platform_steps != expected:
                        print(f"warning: round {n}: the platform ran {platform_steps} sandbox steps, expected {expected}"
                              f" (outcomes {_outcomes(report)})")
                    rounds.append((expected / bare_s, platform_steps / platform_s))
                    cpu_ms.append(report["cpu_s"] * 1000 / max(1, platform_steps))
                    print(f"round {n}: bare loop {expected / bare_s:6.1f} steps/s, platform {platform_steps / platform_s:6.1f}"
                          f" steps/s ({_outcomes(report)}), ratio {platform_steps / platform_s * bare_s / expected:.2f}",
                          flush=True)

                from apps.tasks import jobs

                jobs.run_episode = SandboxOnlyAgent(args.steps)
                try:
                    worker_only = make_batch(prompt, args.episodes, args.steps, "worker-only")
                    worker_s, _ = run_platform(worker_only, 1)
                    worker_steps = sandbox_steps(worker_only)
                finally:
                    jobs.run_episode = None

                concurrency = settings.ROLLOUT_CONCURRENCY
                wide = make_batch(prompt, args.episodes, args.steps, "concurrent")
                wide_s, wide_report = run_platform(wide, concurrency)
                wide_steps = sandbox_steps(wide)
        finally:
            server.stop()
    except Exception as exc:
        print(f"cannot run the benchmark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    ratios = [platform / bare for bare, platform in rounds]
    ratio = statistics.median(ratios)
    bare_sps = statistics.median(bare for bare, _ in rounds)
    platform_sps = statistics.median(platform for _, platform in rounds)
    worker_sps = worker_steps / worker_s
    wide_sps = wide_steps / wide_s
    print(f"episodes {args.episodes} x {args.steps} run_shell('true') steps (+ finish), instant offline model, "
          f"local sandbox, {os.cpu_count()} CPUs; {args.rounds} rounds, medians:")
    print(f"bare loop (sandbox only):        {bare_sps:7.1f} steps/s")
    print(f"platform, concurrency 1:         {platform_sps:7.1f} steps/s")
    print(f"  the same minus agent loop + LLM: {worker_sps:7.1f} steps/s  (ratio {worker_sps / bare_sps:.2f} to the "
          "median bare loop: the worker's own share)")
    print(f"platform, concurrency {concurrency:<3}:       {wide_sps:7.1f} steps/s  outcomes {_outcomes(wide_report)}")
    print(f"ratio platform/bare (sequential), per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"ratio platform/bare (sequential), median: {ratio:.2f}  (target >= {TARGET_RATIO}) -> "
          f"{'MET' if ratio >= TARGET_RATIO else 'MISSED'}")
    print(f"ratio platform/bare (platform at concurrency {concurrency}): {wide_sps / bare_sps:.2f}")
    print(f"CPU of this process per platform step (agent loop, LLM client, worker; not the sandboxes' or the "
          f"model's processes), median: {statistics.median(cpu_ms):.2f} ms (less skewed by other work than the rates)")
    print(f"peak RSS of this process: {peak_rss_mb():.0f} MB; load average before the run {load_before:.1f} "
          "(other work on the machine skews both sides)")
    if worker_steps != expected or wide_steps != expected:
        print(f"warning: the worker-only and concurrent batches ran {worker_steps} and {wide_steps} sandbox steps, "
              f"expected {expected}")
    return 0


def _outcomes(report: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in report.items() if k not in ("worker", "claimed", "wall_s", "cpu_s"))


if __name__ == "__main__":
    sys.exit(main())
