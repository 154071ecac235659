"""Benchmark `manage.py import_tasks`: generate N task lines, import them, print lines/s.

    .venv/bin/python bench/import_tasks.py [-n 100000] [--database-url URL] [--keep]

Runs against a throwaway SQLite file (migrated first) unless --database-url is given; never
against the project's own var/db.sqlite3. Lines mix both shapes and several scenes, with a
code_exec verifier config on some, so validation does realistic work.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generate(path: Path, n: int) -> None:
    verifier = {
        "files": {"test_solution.py": "from solution import solve\n\n\ndef test_solve():\n    assert solve(3) == 6\n"},
        "command": "python3 -m pytest -q",
    }
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            kind = i % 4
            if kind == 0:
                row = {"task_id": f"adp-{i}", "task_type": ("code", "web", "reasoning")[i % 3],
                       "description": f"Process part {i} of the dataset and report the row count",
                       "expected_tools": ["python_executor"], "max_steps": 5, "timeout": 60, "priority": 1 + i % 10}
            elif kind == 1:
                row = {"external_id": f"code-{i}", "scene": "code_exec",
                       "prompt": f"Write solution.py with solve(n) returning n * 2 (variant {i}).",
                       "config": {"verifier": verifier}, "max_steps": 12, "temperature": 0.5, "priority": 5}
            elif kind == 2:
                row = {"external_id": f"search-{i}", "scene": "deep_search",
                       "prompt": f"Who maintains package number {i} in the index, and since when?",
                       "config": {"sources": ["https://pypi.org/"]}, "samples_per_iteration": 2}
            else:
                row = {"external_id": f"gui-{i}", "scene": "gui", "prompt": f"Open page {i} and read its title.",
                       "config": {"start_url": "https://example.com/"}, "max_steps": 8, "quality_threshold": 75}
            f.write(json.dumps(row) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=100_000, help="lines to generate (default 100000)")
    parser.add_argument("--database-url", help="benchmark this database instead of a temporary SQLite file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-import-"))
    os.environ["DATABASE_URL"] = args.database_url or f"sqlite:///{tmp / 'bench.sqlite3'}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from apps.tasks.models import Task

    call_command("migrate", verbosity=0)
    data = tmp / "bench.jsonl"
    t0 = time.perf_counter()
    generate(data, args.n)
    size_mb = data.stat().st_size / 1e6
    print(f"generated {args.n} lines ({size_mb:.1f} MB) in {time.perf_counter() - t0:.1f}s")

    t0 = time.perf_counter()
    call_command("import_tasks", str(data), dry_run=True, stdout=io.StringIO())
    dry = time.perf_counter() - t0
    print(f"--dry-run (check only): {dry:.2f}s, {args.n / dry:,.0f} lines/s")

    before = Task.objects.count()
    t0 = time.perf_counter()
    call_command("import_tasks", str(data), stdout=io.StringIO())
    full = time.perf_counter() - t0
    created = Task.objects.count() - before
    assert created == args.n, f"expected {args.n} tasks, got {created}"
    print(f"import (check + write): {full:.2f}s, {args.n / full:,.0f} lines/s  [{os.environ['DATABASE_URL'].split(':')[0]}]")

    if args.keep:
        print(f"kept {tmp}")
    else:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
