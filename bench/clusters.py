#!/usr/bin/env python
"""Throughput with one and with two worker clusters at the same total concurrency, and how many
trajectory finishes per second PostgreSQL absorbs.

    tests/tools/with-postgres tests/tools/with-redis .venv/bin/python bench/clusters.py \
        [--rollouts 128] [--steps 4] [--latency 0.5] [--concurrency 16] [--workers 2] \
        [--finishes 600] [--writers 1,2,4] [--group 8]

Needs PostgreSQL (DATABASE_URL, an empty migratable database) and Redis (REDIS_URL): the
wrappers above start throwaway ones. Each phase queues a fresh batch of --rollouts code_exec
tasks (--steps run_shell("true") calls and a finish against the offline scripted model
answering after --latency seconds, in a child process) and runs it on the real worker clusters
(`manage.py qcluster`, the Redis broker), each cluster a "machine" of its own (own host name
through `unshare --uts`, own var and sandbox directories; tests/production/conftest.Cluster):

  1 cluster:  Q_WORKERS=--workers, ROLLOUT_CONCURRENCY=--concurrency / workers
  2 clusters: Q_WORKERS=--workers each, ROLLOUT_CONCURRENCY=--concurrency / (2 * workers)

The clusters are started (and idle) before the batch is queued; the clock runs from the
submission until every trajectory is final. Printed per phase: wall time, rollouts/s, agent
steps/s, and how the rollouts split between the machines. On one machine both clusters share its
CPUs, so this shows what a second cluster costs or gains *here*; on separate machines each
brings its own CPUs (see docs/production.md, "How throughput scales").

Then the database: --finishes running trajectories (claimed, with a stored episode of the size
phase 1 produced) are finished through `trajectories_finish` by --writers processes, --group
episodes per transaction (what a worker's Finisher does), as fast as they go. Printed: finishes
per second for each writer count, and the CPU time per finish of the writers (Python: the ORM,
redaction, the iteration's end and review job) and of the PostgreSQL server processes serving
the writers' connections, which says which side bounds the rate when both share the CPUs.

A benchmark, not a test: prints numbers; exits 1 only if it cannot run.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_overhead import ROOT, ModelServer, setup_django, write_script  # noqa: E402


def run_phase(n_clusters: int, args: argparse.Namespace, prompt: str, root: Path, env: dict[str, str]) -> dict[str, Any]:
    from apps.tasks.models import Trajectory
    from apps.tasks.services import dispatch_rollouts
    from tests.production.conftest import Cluster
    from tests.production.test_clusters import make_batch

    per_job = max(1, args.concurrency // (n_clusters * args.workers))
    cluster_env = {**env, "Q_WORKERS": str(args.workers), "ROLLOUT_CONCURRENCY": str(per_job),
                   "LLM_MAX_CONCURRENCY": str(args.concurrency)}
    clusters = [Cluster(f"bench-{n_clusters}-{i}", root, cluster_env).start() for i in range(n_clusters)]
    try:
        for cluster in clusters:
            cluster.wait_running()
        began = time.monotonic()
        batch = make_batch(f"clusters-{n_clusters}", args.rollouts, args.steps, prompt)
        dispatch_rollouts(jobs=n_clusters * args.workers)  # one job per worker process at least
        rows = Trajectory.objects.filter(task__batch=batch)
        deadline = began + args.timeout
        while rows.exclude(status__in=Trajectory.FINAL).exists():
            for cluster in clusters:
                cluster.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n_clusters} cluster(s): the batch did not finish in {args.timeout:.0f}s")
            time.sleep(0.1)
        wall = time.monotonic() - began
        outcomes = Counter(o for o in rows.values_list("outcome", flat=True))
        machines = Counter(w.split(":", 1)[0] for w in rows.values_list("worker", flat=True))
        steps = sum(len(s or []) for s in rows.values_list("steps", flat=True))
        return {"clusters": n_clusters, "per_job": per_job, "wall": wall, "outcomes": dict(outcomes),
                "machines": dict(machines), "steps": steps}
    finally:
        for cluster in clusters:
            cluster.stop()


def episode_template() -> Any:
    """An EpisodeResult shaped like phase 1's episodes (their stored messages, tools, steps)."""
    from apps.engines.agent import EpisodeResult
    from apps.tasks.models import Trajectory

    row = Trajectory.objects.filter(outcome="success").order_by("id").first()
    return EpisodeResult(messages=row.messages, tools=row.tools, steps=row.steps, final_answer=row.final_answer,
                         outcome="success", reward=1.0, prompt_tokens=row.prompt_tokens,
                         completion_tokens=row.completion_tokens, total_tokens=row.total_tokens,
                         model=row.model, llm_calls=len(row.steps))


def _writer(claims: list[tuple[int, str]], group: int, result: Any, start: Any, done: Any) -> None:
    from django.db import connections

    from apps.tasks.services import trajectories_finish

    connections.close_all()  # a fresh connection in this process, never the parent's
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]  # this writer's PostgreSQL server process (same machine)
    backend_cpu = _cpu_s(backend)
    start.wait()
    for i in range(0, len(claims), group):
        trajectories_finish([{"trajectory_id": pk, "claim_token": token, "result": result}
                             for pk, token in claims[i:i + group]])
    backend_cpu = _cpu_s(backend) - backend_cpu
    connections.close_all()
    done.put((len(claims), backend_cpu))


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def finish_rate(n: int, writers: int, group: int, prompt: str, result: Any) -> tuple[float, float, float]:
    """(finishes per second, writers' CPU seconds per finish, PostgreSQL's CPU seconds per
    finish) for `n` claimed trajectories stored by `writers` processes."""
    from django.db import connections

    from apps.tasks.jobs import claim_trajectories
    from apps.tasks.models import Trajectory
    from tests.production.test_clusters import make_batch

    batch = make_batch(f"finish-{writers}-{time.monotonic_ns()}", n, 1, prompt)
    claims = [(c.pk, c.token) for c in claim_trajectories(n, worker="bench:0:db", batch_id=batch.pk)]
    assert len(claims) == n, f"claimed {len(claims)} of {n}"
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    start, done = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(claims[i::writers], group, result, start, done)) for i in range(writers)]
    for proc in procs:
        proc.start()
    time.sleep(0.5)
    began, children = time.monotonic(), os.times()
    start.set()
    reports = [done.get(timeout=600) for _ in procs]
    elapsed = time.monotonic() - began
    stored, pg = sum(n for n, _ in reports), sum(cpu for _, cpu in reports)
    for proc in procs:
        proc.join()
    after = os.times()
    writer_cpu = (after.children_user + after.children_system) - (children.children_user + children.children_system)
    finished = Trajectory.objects.filter(task__batch=batch, status="finished").count()
    assert stored == n and finished == n, (stored, finished)
    return n / elapsed, writer_cpu / n, pg / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="run_shell steps per episode (plus a finish)")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the model takes per answer")
    parser.add_argument("--concurrency", type=int, default=16, help="total rollouts at once, over all clusters")
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS of each cluster")
    parser.add_argument("--finishes", type=int, default=600, help="trajectories finished in the database bench")
    parser.add_argument("--writers", default="1,2,4", help="writer process counts for the database bench")
    parser.add_argument("--group", type=int, default=8, help="episodes stored per transaction")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if not os.environ.get("REDIS_URL") or not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("needs DATABASE_URL (PostgreSQL) and REDIS_URL: run it under tests/tools/with-postgres "
              "tests/tools/with-redis", file=sys.stderr)
        return 1

    tmp = Path(tempfile.mkdtemp(prefix="bench-clusters-", dir="/var/tmp"))
    server: ModelServer | None = None
    try:
        setup_django(tmp, database_url=os.environ["DATABASE_URL"], env={"LOG_LEVEL": "WARNING"})
        from django.conf import settings

        prompt = write_script(tmp / "script.json", args.steps)
        server = ModelServer(tmp / "script.json", fault=f"slow;seconds={args.latency:g}")
        env = {k: v for k, v in os.environ.items() if k not in {"TRAJ_VAR_DIR", "SANDBOX_ROOT"}}
        env.update(OFFLINE_MODEL_URL=server.url, DJANGO_SECRET_KEY=settings.SECRET_KEY, LOG_LEVEL="INFO",
                   PYTHONUNBUFFERED="1")
        machines = tmp / "machines"
        machines.mkdir(mode=0o711)
        print(f"{args.rollouts} rollouts per phase ({args.steps} run_shell steps + finish, model latency "
              f"{args.latency:g}s), total concurrency {args.concurrency}, Q_WORKERS={args.workers} per cluster; "
              f"PostgreSQL + Redis; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        phases = [run_phase(n, args, prompt, machines, env) for n in (1, 2)]
        for phase in phases:
            rate = args.rollouts / phase["wall"]
            print(f"{phase['clusters']} cluster(s), ROLLOUT_CONCURRENCY={phase['per_job']}: {phase['wall']:.1f}s, "
                  f"{rate:.2f} rollouts/s, {phase['steps'] / phase['wall']:.1f} steps/s; outcomes {phase['outcomes']}; "
                  f"by machine {phase['machines']}")
        ratio = phases[0]["wall"] / phases[1]["wall"]
        print(f"two clusters / one cluster throughput on this machine: {ratio:.2f}x")

        result = episode_template()
        print(f"database: finishes stored through trajectories_finish, {args.group} per transaction, episode of "
              f"{len(result.steps)} steps / {len(result.messages)} messages")
        for writers in (int(w) for w in args.writers.split(",") if w.strip()):
            rate, writer_cpu, pg_cpu = finish_rate(args.finishes, writers, args.group, prompt, result)
            print(f"  {writers} writer process(es): {rate:.0f} finishes/s; CPU per finish: writers "
                  f"{writer_cpu * 1000:.1f} ms, PostgreSQL {pg_cpu * 1000:.1f} ms")
    except Exception as exc:
        print(f"cannot run the benchmark: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
