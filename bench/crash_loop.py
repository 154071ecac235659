#!/usr/bin/env python
"""Kill -9 the worker cluster again and again during a batch; print whether every rollout survives.

    .venv/bin/python bench/crash_loop.py [--rollouts 200] [--kills 10] [--cluster-every 3]
                                         [--interval 6] [--steps 4] [--latency 1.0] [--database-url URL]

Starts the real worker cluster (`manage.py qcluster`, Q_WORKERS=2, ROLLOUT_CONCURRENCY=8, the
ORM broker, the scheduler with the rollout reaper) on a throwaway database, queues a batch of
--rollouts code_exec tasks (one iteration each; each episode makes --steps run_shell("true")
calls and a finish against the offline scripted model answering after --latency seconds, in
its own process, through the local sandbox), and while the batch runs sends --kills SIGKILLs,
one every --interval seconds: every --cluster-every-th one kills the whole cluster (its process
group) and starts a new one; the others kill the worker process that holds the most running
trajectories (django-q2's guard starts a replacement).

Printed: the outcomes, how many trajectories failed with a lost worker, the duplicates (a task
with more than one trajectory, an iteration that ended twice), the episodes run to their end
a second time (work lost, not data: the worker died between an episode's end and storing it),
the worker losses absorbed, and the drain time from the last restart (the moment of the last
worker kill, or the start of the last new cluster) until every trajectory was final, with the
first claim after that restart.
Target (issue 21, item 7): all --rollouts succeed, 0 duplicated, drained within 60 s of the
last restart.

A benchmark, not a test: prints numbers and a verdict, exits 0 either way (1 if it cannot run).
Throwaway SQLite database in a temporary TRAJ_VAR_DIR unless --database-url is given (e.g.
`tests/tools/with-postgres .venv/bin/python bench/crash_loop.py --database-url '$DATABASE_URL'`
or simply under with-postgres, which sets DATABASE_URL: pass --database-url "$DATABASE_URL").
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_overhead import ROOT, ModelServer, setup_django, write_script  # noqa: E402

DRAIN_TARGET_S = 60.0


class Cluster:
    """`manage.py qcluster` in a process group of its own, its output in a log file."""

    def __init__(self, env: dict[str, str], log: Path):
        self.env, self.log = env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0
        self.start()

    def start(self) -> float:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=self.env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.started += 1
        return time.monotonic()

    def kill(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()

    def check(self) -> None:
        """Raise if the cluster exited by itself (e.g. it could not import the code)."""
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-1:] if self.log.exists() else []
            raise RuntimeError(f"the worker cluster exited with {self.proc.returncode}: {' '.join(tail)}")


def make_batch(prompt: str, rollouts: int, steps: int) -> Any:
    from apps.tasks.services import batch_import, tasks_enqueue

    rows = [{"scene": "code_exec", "prompt": prompt, "max_steps": steps + 5, "step_timeout_s": 30.0,
             "timeout_s": 600.0, "temperature": 0.0, "max_iterations": 1, "external_id": f"crash-{i}"}
            for i in range(rollouts)]
    batch = batch_import(rows=rows, name="crash-loop", source_name="bench", source_sha256="", source_format="bench",
                         actor=None)
    tasks_enqueue(batch=batch)
    return batch


def busiest_worker_pid(batch: Any) -> int | None:
    """The pid of the live process holding the most running trajectories of the batch (worker
    names are host:pid:token; a dead worker's claims stay running until they are re-queued)."""
    from apps.tasks.models import Trajectory

    held = Counter(int(w.split(":")[1]) for w in Trajectory.objects.filter(task__batch=batch, status="running")
                   .values_list("worker", flat=True) if w.count(":") >= 2)
    for pid, _ in held.most_common():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return pid
    return None


def all_final(batch: Any) -> bool:
    from apps.tasks.models import Trajectory

    return not Trajectory.objects.filter(task__batch=batch).exclude(status__in=Trajectory.FINAL).exists()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--cluster-every", type=int, default=3,
                        help="every N-th kill takes the whole cluster down (0: worker processes only)")
    parser.add_argument("--interval", type=float, default=6.0, help="seconds between kills")
    parser.add_argument("--steps", type=int, default=4, help="run_shell steps per episode (plus a finish)")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the model takes per answer")
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS")
    parser.add_argument("--concurrency", type=int, default=8, help="ROLLOUT_CONCURRENCY")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up waiting after this many seconds")
    parser.add_argument("--database-url", help="use this (empty, migratable) database instead of a temporary SQLite")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (and the cluster's log)")
    args = parser.parse_args()
    # `timeout` sends SIGTERM: leave through the finally block, which kills the cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    tmp = Path(tempfile.mkdtemp(prefix="bench-crash-loop-", dir="/var/tmp"))
    cluster: Cluster | None = None
    server: ModelServer | None = None
    try:
        setup_django(tmp, database_url=args.database_url, env={
            "ROLLOUT_CONCURRENCY": str(args.concurrency), "Q_WORKERS": str(args.workers),
            "LLM_MAX_CONCURRENCY": str(args.concurrency * args.workers), "LOG_LEVEL": "WARNING",
        })
        from django.db.models import Count, Sum

        from apps.tasks.models import Trajectory, TrajectoryLog
        from trajplatform.audit import AuditEvent

        prompt = write_script(tmp / "script.json", args.steps)
        server = ModelServer(tmp / "script.json", fault=f"slow;seconds={args.latency:g}")
        env = {**os.environ, "OFFLINE_MODEL_URL": server.url, "Q_LOG_LEVEL": "WARNING"}
        load_before = os.getloadavg()[0]
        batch = make_batch(prompt, args.rollouts, args.steps)
        began = time.monotonic()
        cluster = Cluster(env, tmp / "qcluster.log")
        last_restart = began
        kills: list[str] = []
        deadline = began + args.timeout
        while not Trajectory.objects.filter(task__batch=batch, status="running").exists():
            cluster.check()
            if time.monotonic() > deadline:
                raise RuntimeError("no rollout started")
            time.sleep(0.2)
        restarted_at = time.time()
        while len(kills) < args.kills and not all_final(batch) and time.monotonic() < deadline:
            time.sleep(args.interval)
            n = len(kills) + 1
            if args.cluster_every and n % args.cluster_every == 0:
                cluster.kill()
                last_restart, restarted_at = cluster.start(), time.time()
                kills.append(f"{last_restart - began:.0f}s cluster")
                continue
            pid = None
            while pid is None and time.monotonic() < deadline and not all_final(batch):
                pid = busiest_worker_pid(batch)
                if pid is None:
                    time.sleep(0.1)
            if pid is None:
                break
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # it ended meanwhile: not a kill
            last_restart, restarted_at = time.monotonic(), time.time()
            kills.append(f"{last_restart - began:.0f}s worker {pid}")
        while not all_final(batch) and time.monotonic() < deadline:
            cluster.check()
            time.sleep(0.2)
        drained = time.monotonic()

        rows = Trajectory.objects.filter(task__batch=batch)
        outcomes = Counter(o or s for o, s in rows.values_list("outcome", "status"))
        lost = rows.filter(outcome="error", outcome_reason__startswith="worker lost").count()
        multi = batch.tasks.annotate(n=Count("trajectories")).filter(n__gt=1).count()
        task_ids = [str(pk) for pk in batch.tasks.values_list("pk", flat=True)]
        ended_twice = (AuditEvent.objects.filter(action="tasks.iteration_finish", target_id__in=task_ids)
                       .values("target_id").annotate(n=Count("id")).filter(n__gt=1).count())
        # Work done twice, not data: an episode that reached its end (its "result" line) and
        # whose worker was killed before the result was stored runs again.
        rerun = (TrajectoryLog.objects.filter(trajectory__task__batch=batch, kind="result").values("trajectory")
                 .annotate(n=Count("id")).filter(n__gt=1).count())
        first_claim = (rows.filter(started_at__gte=datetime.fromtimestamp(restarted_at, tz=dt_timezone.utc))
                       .order_by("started_at").values_list("started_at", flat=True).first())
        losses = rows.aggregate(losses=Sum("worker_losses"), claims=Sum("attempts"))
        most = max(rows.values_list("worker_losses", flat=True), default=0)
        db = "PostgreSQL" if "postgres" in (args.database_url or "") else "SQLite"
        ok = outcomes.get("success", 0)
        drain_s = drained - last_restart
        print(f"{args.rollouts} rollouts ({args.steps} run_shell steps + finish, model latency {args.latency:g}s) on "
              f"{db}, Q_WORKERS={args.workers}, ROLLOUT_CONCURRENCY={args.concurrency}; {os.cpu_count()} CPUs, "
              f"load average before {load_before:.1f}")
        print(f"kills: {len(kills)} ({sum('cluster' in k for k in kills)} whole-cluster): {', '.join(kills)}")
        print(f"outcomes: {dict(sorted(outcomes.items()))}; failed with a lost worker: {lost}")
        print(f"duplicated: {multi} tasks with more than one trajectory, {ended_twice} task iterations that ended "
              f"twice; episodes run to their end again after their worker died before storing them: {rerun}")
        print(f"worker losses absorbed: {losses['losses'] or 0} (most on one trajectory: {most}); "
              f"claims: {losses['claims'] or 0}")
        since = f"{first_claim.timestamp() - restarted_at:.1f}s" if first_claim else "none"
        print(f"wall: {drained - began:.1f}s; drained {drain_s:.1f}s after the last restart (first claim after it: "
              f"{since})")
        met = ok == args.rollouts and not multi and not ended_twice and drain_s <= DRAIN_TARGET_S
        print(f"target: {args.rollouts}/{args.rollouts} succeed, 0 duplicated, drained within "
              f"{DRAIN_TARGET_S:.0f}s -> {'MET' if met else 'MISSED'} ({ok}/{args.rollouts})")
    except Exception as exc:
        print(f"cannot run the benchmark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.stop()
        if server is not None:
            server.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
