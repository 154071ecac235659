#!/usr/bin/env python
"""Benchmark the review console (issues 5 and 40): each page's p95 and SQL queries at a small and
a large size, up to 1,000,000 trajectories on PostgreSQL.

    .venv/bin/python bench/review_console.py [--small 1000] [--large 100000] [--requests 20]
    tests/tools/with-postgres sh -c '.venv/bin/python bench/review_console.py --database-url "$DATABASE_URL" \
        --small 10000 --large 1000000'

Fills a throwaway database with bench/scale.py's data (its fill(): code_exec rollouts of about
6 KB, 4 per task, an automatic review each, a human verdict on every tenth, a pending proposal on
every tenth task; on PostgreSQL, rows above --python-fill-max are the database's copies of those
below, scale.replicate()) to --small, times each /review/ page and the trajectory list through the
whole Django stack (session, permissions, templates), then grows the data to --large and times
them again. Prints, per page, the p95 of --requests requests at each size (target <= 300 ms at
the large size), the SQL queries each page ran (target: the same at both sizes) and the ratio of
the p95s. After each fill it runs the workers' batch tally job (apps.reviews.tallies, which the
batch page and the review queue filtered by a batch read) as a full recount and then as the
scheduled run with nothing changed since (it recounts only the batches marked changed), and their
team tally job (the team page's verdict counts), and prints their times. The agreement page
reads the latest 2,000 human verdicts, the review queue filtered by a batch one tally row, and the
trajectory search is served by trigram indexes on PostgreSQL (a scan on SQLite); their ratios are
shown but not held to the ratio target (large/small <= 3). A throwaway SQLite file is used unless --database-url is
given; never var/db.sqlite3. A benchmark, not a test: it prints numbers and exits 0 (1 only if it
cannot run).
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from typing import Any
from urllib.parse import quote

import export as export_bench  # bench/export.py: the shared Django set-up

TARGET_RATIO = 3.0
TARGET_P95_MS = 300.0
# Pages that read every row of their scope before issue 40's whole-scope fixes (judge-human
# agreement, the review queue filtered by a batch, the trajectory search: a scan on SQLite still).
AGGREGATES = ("agreement", "review queue, batch", "trajectories, search")


def _user(name: str, role: str) -> Any:
    from django.contrib.auth.models import Group, User

    user, created = User.objects.get_or_create(username=name, defaults={"is_staff": True})
    if created:
        user.groups.add(Group.objects.get(name=role))
    return user


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def profile(batch: Any, names: list[str], top: int) -> None:
    """Each named page once more, its `top` slowest SQL queries with their times: where the time of
    a page over target goes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client, pages = _pages(batch)
    for name in names:
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            client.get(pages[name])
            total = time.perf_counter() - started
        spent = sorted(((float(q["time"]), q["sql"]) for q in queries.captured_queries), reverse=True)
        print(f"profile of {name!r}: {total * 1000:.0f} ms, {len(spent)} queries, "
              f"{sum(t for t, _ in spent) * 1000:.0f} ms of them in SQL", flush=True)
        for seconds, sql in spent[:top]:
            # a long column list folded, so that the FROM and WHERE of the query show
            sql = re.sub(r"^(SELECT (?:DISTINCT )?)(.{120,}?) FROM ", r"\1… FROM ", " ".join(sql.split()), count=1)
            print(f"  {seconds * 1000:7.1f} ms  {sql[:600]}", flush=True)


def _pages(batch: Any) -> tuple[Any, dict[str, str]]:
    from django.test import Client

    from apps.tasks.models import Task, Trajectory

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(_user("bench-approver", "approver"))  # an approver reviews too (the queue)
    task = Task.objects.filter(batch=batch).order_by("-id").first()
    trajectory = Trajectory.objects.filter(task=task).first()
    return client, {
        "queue": "/review/",
        "queue, last page": "/review/?page=999999",
        "queue, filtered": f"/review/?tier=yellow&batch={quote(batch.name)}&older_than_hours=0",
        "batches": "/review/batches/",
        "batch": f"/review/batches/{batch.pk}/",
        "task history": f"/review/tasks/{task.pk}/",
        "trajectory": f"/review/trajectories/{trajectory.pk}/",
        "agreement": "/review/agreement/",
        "team": "/review/team/",
        "review queue": "/review/work/",
        "review queue, later": "/review/work/?offset=500",
        "review queue, batch": f"/review/work/?batch={quote(batch.name)}&score_max=70",
        "trajectories": "/trajectories/",
        "trajectories, search": "/trajectories/?q=Task+1%3A&verdict=none",  # one task's prompt: a rare match
    }


def measure(requests: int, batch: Any) -> dict[str, tuple[list[float], int]]:
    """page -> (seconds of each of `requests` requests, SQL queries of the last); the pages are
    taken in turn, round after round, so a busy minute of the machine falls on all of them."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client, pages = _pages(batch)
    results: dict[str, tuple[list[float], int]] = {name: ([], 0) for name in pages}
    for _ in range(requests):
        for name, url in pages.items():
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get(url)
                results[name][0].append(time.perf_counter() - started)
            if response.status_code != 200:
                raise SystemExit(f"{url}: HTTP {response.status_code}")
            results[name] = (results[name][0], len(queries))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20, help="requests per page at each size")
    parser.add_argument("--python-fill-max", type=int, default=100_000,
                        help="on PostgreSQL, rows above this size are the database's copies of those below")
    parser.add_argument("--database-url")
    parser.add_argument("--profile-top", type=int, default=8,
                        help="after the run, each page over the p95 target at the large size once more with its "
                             "N slowest SQL queries and their times (0: none)")
    args = parser.parse_args()
    var_dir = tempfile.mkdtemp(prefix="bench-review-")
    export_bench.setup(args.database_url or f"sqlite:///{var_dir}/bench.sqlite3", var_dir)
    from django.core.management import call_command
    from django.db import connection

    import scale  # bench/scale.py: the one fill of the scale benchmarks (it imports this module)
    from apps.reviews import tallies
    from apps.tasks.models import Batch

    call_command("migrate", verbosity=0)
    batch = Batch.objects.create(name=scale.BATCH_NAME)
    reviewer = _user("bench-reviewer", "reviewer")
    print(f"database: {connection.vendor}; sizes {args.small:,} and {args.large:,}", flush=True)
    results = {}
    filled = 0
    for n in (args.small, args.large):
        started = time.monotonic()
        scale.grow(filled, n, batch, reviewer, python_fill_max=args.python_fill_max)
        print(f"filled {n:,} trajectories in {time.monotonic() - started:.0f}s", flush=True)
        filled = n
        started = time.monotonic()
        tallies.refresh_batch_tallies(full=True)  # the workers' job the batch page and the queue by batch read
        full = time.monotonic() - started
        started = time.monotonic()
        tallies.refresh_batch_tallies()  # the scheduled run: only the batches changed since (none here)
        print(f"batch tallies: full recount {full:.1f}s, nothing changed {time.monotonic() - started:.3f}s",
              flush=True)
        started = time.monotonic()
        tallies.refresh_team_tally()  # the workers' job the team page reads
        print(f"team tally counted in {time.monotonic() - started:.1f}s", flush=True)
        measure(1, batch)  # warm-up: templates compiled, caches filled
        results[n] = measure(args.requests, batch)
    small, large = results[args.small], results[args.large]
    print(f"{'page':<22} {'p95 ms @' + format(args.small, ','):>16} {'p95 ms @' + format(args.large, ','):>18} "
          f"{'queries':>9} {'ratio':>6}")
    worst, slowest, changed = 0.0, ("", 0.0), []
    for name in small:
        (t_small, q_small), (t_large, q_large) = (p95(small[name][0]), small[name][1]), \
            (p95(large[name][0]), large[name][1])
        ratio = t_large / t_small if t_small else float("inf")
        if name not in AGGREGATES:
            worst = max(worst, ratio)
        if t_large > slowest[1]:
            slowest = (name, t_large)
        if q_small != q_large:
            changed.append(name)
        print(f"{name:<22} {t_small * 1000:>16.1f} {t_large * 1000:>18.1f} {q_small:>4}/{q_large:<4} {ratio:>6.2f}")
    print(f"worst paginated-page ratio {worst:.2f} (target <= {TARGET_RATIO:g}); slowest page at {args.large:,}: "
          f"{slowest[0]} p95 {slowest[1] * 1000:.0f} ms (target <= {TARGET_P95_MS:g} ms); queries per page "
          + (f"changed on {', '.join(changed)}" if changed else "the same at both sizes"))
    over = [name for name in large if p95(large[name][0]) * 1000 > TARGET_P95_MS]
    if args.profile_top and over:
        profile(batch, over, args.profile_top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
