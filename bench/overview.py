#!/usr/bin/env python
"""Benchmark the operator overview (issue 40, item 8): the page at 10k, 100k and 1M trajectories,
and the scheduled job that computes its daily activity.

    tests/tools/with-postgres sh -c '.venv/bin/python bench/overview.py --database-url "$DATABASE_URL"'
    .venv/bin/python bench/overview.py --sizes 2000,8000                  # a quick look, on SQLite

Fills one throwaway database with bench/scale.py's fill (above --python-fill-max, PostgreSQL's
copies of the rows below: scale.replicate), plus a batch never started and one in progress, then
ANALYZEs. At each size: GET / as an admin through the whole Django stack (p95 of --requests, the
SQL queries it ran), and `refresh_activity` twice: the first run computes the 14 days, the next
only today and yesterday. Every filled trajectory finished "now" (scale's fill), so the job's
today is the whole table: its worst case. A benchmark, not a test: it prints numbers, exits 0.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import export as export_bench  # bench/export.py: the set-up
import review_console  # bench/review_console.py: its users
import scale  # bench/scale.py: the fill


def side_batches() -> None:
    from apps.tasks.models import Batch, Task

    idle = Batch.objects.create(name="overview: never started")
    Task.objects.bulk_create([Task(batch=idle, scene="code_exec", prompt=f"idle {i}") for i in range(50)])
    busy = Batch.objects.create(name="overview: in progress")
    Task.objects.bulk_create([Task(batch=busy, scene="code_exec", prompt=f"busy {i}", current_iteration=1,
                                   status="running" if i % 2 else "completed") for i in range(50)])


def measure(requests: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from trajplatform import overview

    started = time.perf_counter()
    first = overview.refresh_activity()
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    again = overview.refresh_activity()
    again_s = time.perf_counter() - started
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(review_console._user("bench-admin", "admin"))
    client.get("/")  # warm-up: templates compiled
    times = []
    for _ in range(requests):
        with CaptureQueriesContext(connection) as queries:
            t0 = time.perf_counter()
            response = client.get("/")
            times.append(time.perf_counter() - t0)
        if response.status_code != 200:
            raise SystemExit(f"/: HTTP {response.status_code}")
    return {"p95_ms": scale._p95(times) * 1000, "median_ms": statistics.median(times) * 1000, "queries": len(queries),
            "job_first_s": first_s, "job_first_days": first, "job_again_s": again_s, "job_again_days": again}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--python-fill-max", type=int, default=100_000)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    var_dir = tempfile.mkdtemp(prefix="bench-overview-")
    export_bench.setup(args.database_url or f"sqlite:///{var_dir}/bench.sqlite3", var_dir)
    from django.core.management import call_command
    from django.db import connection

    from apps.tasks.models import Batch

    call_command("migrate", verbosity=0)
    batch = Batch.objects.create(name="scale")
    reviewer = review_console._user("bench-reviewer", "reviewer")
    side_batches()
    print(f"database: {connection.vendor}; {os.cpu_count()} cores (shared)", flush=True)
    print(f"{'trajectories':>12} {'fill s':>7} {'page p95 ms':>12} {'median ms':>10} {'queries':>8} "
          f"{'job 14 days s':>14} {'job 2 days s':>13}", flush=True)
    filled = 0
    for n in sizes:
        t0 = time.perf_counter()
        if filled and n > args.python_fill_max and connection.vendor == "postgresql":
            scale.replicate(filled, n)
        else:
            scale.fill(filled, n, batch, reviewer)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        fill_s = time.perf_counter() - t0
        filled = n
        r = measure(args.requests)
        print(f"{n:>12,} {fill_s:>7.0f} {r['p95_ms']:>12.1f} {r['median_ms']:>10.1f} {r['queries']:>8} "
              f"{r['job_first_s']:>14.2f} {r['job_again_s']:>13.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
