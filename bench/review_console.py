#!/usr/bin/env python
"""Benchmark the review console (issue 5): its pages cost about the same with 100k trajectories
as with 1k.

    .venv/bin/python bench/review_console.py [--small 1000] [--large 100000] [--requests 5]
    tests/tools/with-postgres sh -c '.venv/bin/python bench/review_console.py --database-url "$DATABASE_URL"'

Fills a throwaway database with --small trajectories (10 per task, each with an automatic
review; a pending proposal on every 10th task; a human verdict on every 100th trajectory),
times each /review/ page through the whole Django stack (session, permissions, templates),
then grows the data to --large and times them again. Prints the median of --requests requests
per page, the SQL queries each page ran, and the ratio large/small (target <= 3: the pages are
paginated and query per page, not per row). The agreement page reads every review pair by
design (one query, two columns), the review queue filtered by a batch counts the batch's review
progress (one aggregate) and the trajectory search matches substrings over every prompt, so their
ratios are shown but not held to the target. A
throwaway SQLite file is used unless --database-url is given; never var/db.sqlite3. A
benchmark, not a test: it prints numbers and exits 0 (1 only if it cannot run).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

import export as export_bench  # bench/export.py: the shared Django set-up

TARGET_RATIO = 3.0
# Pages that read every row of their scope by design (one query, not a query per row): judge-human
# agreement, the review queue filtered by a batch (the batch's review progress, one aggregate) and
# the trajectory search (a substring match over every prompt and answer; no full-text index).
AGGREGATES = ("agreement", "review queue, batch", "trajectories, search")
PER_TASK = 10


def fill(start: int, stop: int, batch: Any) -> None:
    from django.utils import timezone

    from apps.reviews.models import Proposal, Review
    from apps.tasks.models import Task, Trajectory

    now = timezone.now()
    reviewer = _user("bench-reviewer", "reviewer")
    for first in range(start, stop, 1000):
        count = min(1000, stop - first)
        tasks = Task.objects.bulk_create([
            Task(batch=batch, scene="code_exec", prompt=f"bench task {first + i}", status="waiting_approval",
                 current_iteration=1) for i in range(0, count, PER_TASK)])
        trajectories = Trajectory.objects.bulk_create([
            Trajectory(task=tasks[i // PER_TASK], iteration=1, sample_index=i % PER_TASK, status="finished",
                       outcome="success", reward=1.0, model="bench", finished_at=now,
                       steps=[{"index": 0, "tool": "finish", "arguments": {"answer": "x"}, "output": "ok"}])
            for i in range(count)], batch_size=1000)
        Review.objects.bulk_create([
            Review(trajectory=t, kind="auto", status="done", overall=60 + (t.pk % 40), judge_model="bench",
                   scores={"tool_usage": {"score": 50 + t.pk % 50, "rationale": "r"}}, checks={})
            for t in trajectories], batch_size=1000)
        Review.objects.bulk_create([
            Review(trajectory=t, kind="human", status="done", verdict="accept" if t.pk % 3 else "reject",
                   rationale="bench", reviewer=reviewer) for t in trajectories[::100]])
        Proposal.objects.bulk_create([
            Proposal(task=task, iteration=1, field="model", from_value="", to_value="gpt-4o-mini",
                     options=["gpt-4o-mini", "deepseek-chat"], tier="yellow", proposer="review-agent")
            for task in tasks[::10]])


def _user(name: str, role: str) -> Any:
    from django.contrib.auth.models import Group, User

    user, created = User.objects.get_or_create(username=name, defaults={"is_staff": True})
    if created:
        user.groups.add(Group.objects.get(name=role))
    return user


def measure(requests: int, batch: Any) -> dict[str, tuple[float, int]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from apps.tasks.models import Task, Trajectory

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(_user("bench-approver", "approver"))  # an approver reviews too (the queue)
    task = Task.objects.filter(batch=batch).order_by("-id").first()
    trajectory = Trajectory.objects.filter(task=task).first()
    pages = {
        "queue": "/review/",
        "queue, last page": "/review/?page=999999",
        "queue, filtered": f"/review/?tier=yellow&batch={batch.pk}&older_than_hours=0",
        "batches": "/review/batches/",
        "batch": f"/review/batches/{batch.pk}/",
        "task history": f"/review/tasks/{task.pk}/",
        "trajectory": f"/review/trajectories/{trajectory.pk}/",
        "agreement": "/review/agreement/",
        "review queue": "/review/work/",
        "review queue, later": "/review/work/?offset=500",
        "review queue, batch": f"/review/work/?batch={batch.pk}&score_max=70",
        "trajectories": "/trajectories/",
        "trajectories, search": "/trajectories/?q=bench+task+1&verdict=none",
    }
    results = {}
    for name, url in pages.items():
        times = []
        for _ in range(requests):
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get(url)
                times.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise SystemExit(f"{url}: HTTP {response.status_code}")
        results[name] = (statistics.median(times), len(queries))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    var_dir = tempfile.mkdtemp(prefix="bench-review-")
    export_bench.setup(args.database_url or f"sqlite:///{var_dir}/bench.sqlite3", var_dir)
    from django.core.management import call_command

    from apps.tasks.models import Batch

    call_command("migrate", verbosity=0)
    batch = Batch.objects.create(name="bench")
    fill(0, args.small, batch)
    small = measure(args.requests, batch)
    started = time.monotonic()
    fill(args.small, args.large, batch)
    print(f"filled {args.large:,} trajectories in {time.monotonic() - started:.0f}s")
    large = measure(args.requests, batch)
    print(f"{'page':<20} {'ms @' + format(args.small, ','):>12} {'ms @' + format(args.large, ','):>14} "
          f"{'queries':>9} {'ratio':>6}")
    worst = 0.0
    for name in small:
        (t_small, q_small), (t_large, q_large) = small[name], large[name]
        ratio = t_large / t_small if t_small else float("inf")
        if name not in AGGREGATES:
            worst = max(worst, ratio)
        print(f"{name:<20} {t_small * 1000:>12.1f} {t_large * 1000:>14.1f} {q_small:>4}/{q_large:<4} {ratio:>6.2f}")
    print(f"worst paginated-page ratio {worst:.2f} (target <= {TARGET_RATIO:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
