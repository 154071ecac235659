#!/usr/bin/env python
"""Benchmark the API's cursor pagination (issue 7): a page deep in a big table costs what the
first page costs.

    .venv/bin/python bench/api_pagination.py [-n 1000000] [--pages 20]
    tests/tools/with-postgres sh -c '.venv/bin/python bench/api_pagination.py --database-url "$DATABASE_URL"'

Fills a throwaway database with N trajectories (light rows: no messages), then times
GET /api/v1/trajectories through the whole Django stack (token auth, permissions, throttle,
serializers) for:

* the first page;
* a page at the far end (a cursor pointing at the oldest rows);
* for contrast, the same depth reached by LIMIT/OFFSET on the same queryset (what page-number
  pagination would run), without the HTTP stack.

It prints the median of --pages requests each and the ratio deep/first (target <= 2: the
cost does not grow with depth) and offset/cursor at depth. A throwaway SQLite file is used
unless --database-url is given; never var/db.sqlite3. A benchmark, not a test: it prints
numbers and exits 0 (1 only if it cannot run).
"""
from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
import time
from urllib.parse import urlencode

import export as export_bench  # bench/export.py: the shared Django set-up

TARGET_RATIO = 2.0
PAGE = 50


def setup(database_url: str, var_dir: str) -> None:
    os.environ["API_THROTTLE_RATE"] = "1000000/min"
    export_bench.setup(database_url, var_dir)


def fill(n: int) -> None:
    from django.utils import timezone

    from apps.tasks.models import Batch, Task, Trajectory

    per_task = 10_000
    batch = Batch.objects.create(name="bench")
    made, started = 0, time.monotonic()
    now = timezone.now()
    while made < n:
        task = Task.objects.create(batch=batch, scene="code_exec", prompt=f"bench task {made}")
        rows = []
        for i in range(min(per_task, n - made)):
            rows.append(Trajectory(task=task, iteration=1 + i // 100, sample_index=i % 100, status="finished",
                                   outcome="success", reward=1.0, model="bench", finished_at=now))
        Trajectory.objects.bulk_create(rows, batch_size=5000)
        made += len(rows)
        print(f"\r  filled {made}/{n} ({time.monotonic() - started:.0f}s)", end="", flush=True)
    print()


def cursor_at(position: int) -> str:
    return base64.b64encode(urlencode({"p": str(position)}).encode("ascii")).decode("ascii")


def median_ms(fn, pages: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    samples = []
    for _ in range(pages):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=1_000_000, help="trajectories (default 1000000)")
    parser.add_argument("--pages", type=int, default=20, help="requests per measurement (median)")
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()

    var_dir = tempfile.mkdtemp(prefix="bench-api-")
    database_url = args.database_url or f"sqlite:///{var_dir}/bench.sqlite3"
    setup(database_url, var_dir)
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.test import Client

    from apps.tasks.models import Trajectory
    from trajplatform.api_models import api_token_create

    call_command("migrate", verbosity=0)
    if Trajectory.objects.count() < args.n:
        fill(args.n - Trajectory.objects.count())
    user = User.objects.create_user(f"bench{time.time_ns()}")
    user.groups.add(Group.objects.get(name="viewer"))
    _token, raw = api_token_create(user=user, name="bench", actor=None)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="localhost")

    oldest = Trajectory.objects.order_by("id").values_list("id", flat=True)[PAGE + 1]
    depth = Trajectory.objects.filter(id__gt=oldest).count()

    def first() -> None:
        assert client.get("/api/v1/trajectories", {"page_size": PAGE}).status_code == 200

    def deep() -> None:
        response = client.get("/api/v1/trajectories", {"page_size": PAGE, "cursor": cursor_at(oldest)})
        assert response.status_code == 200 and len(response.json()["results"]) == PAGE

    queryset = Trajectory.objects.defer("messages", "tools", "steps", "verifier_output", "config_snapshot").order_by("-id")

    def offset() -> None:
        assert len(list(queryset[depth:depth + PAGE])) == PAGE

    def cursor_query() -> None:
        assert len(list(queryset.filter(id__lt=oldest)[:PAGE])) == PAGE

    first_ms, deep_ms = median_ms(first, args.pages), median_ms(deep, args.pages)
    offset_ms, cursor_ms = median_ms(offset, max(3, args.pages // 4)), median_ms(cursor_query, args.pages)
    vendor = database_url.split(":", 1)[0]
    print(f"{vendor}, {args.n} trajectories, page size {PAGE}, depth {depth} rows")
    print(f"  API first page          {first_ms:8.2f} ms")
    print(f"  API page at the far end {deep_ms:8.2f} ms   ratio deep/first {deep_ms / first_ms:5.2f} "
          f"(target <= {TARGET_RATIO})")
    print(f"  query at depth: cursor  {cursor_ms:8.2f} ms, LIMIT/OFFSET {offset_ms:8.2f} ms   "
          f"ratio offset/cursor {offset_ms / cursor_ms:6.1f}")
    if not args.database_url:
        import shutil

        shutil.rmtree(var_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
