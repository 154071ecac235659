"""The `db` marker (tests/conftest.py) reaches every test that touches the database, and the
PostgreSQL pass runs exactly those (`-m db`): a database test left unmarked would run on SQLite only.
Checked over tests/db_marker_cases.py in a pytest subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = "tests/db_marker_cases.py"


def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "python_files=db_marker_cases.py",
         "-p", "no:xdist", "--timeout=60", CASES, *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTEST_ADDOPTS": ""})


def case_names() -> set[str]:
    lines = (REPO / CASES).read_text(encoding="utf-8").splitlines()
    return {line.strip()[len("def "):].split("(")[0] for line in lines if line.strip().startswith("def test_")}


def test_every_database_test_is_marked_and_no_other_and_an_unmarked_one_at_the_database_fails() -> None:
    listing = pytest_run("--collect-only", "-q", "-m", "db")
    assert listing.returncode == 0, listing.stdout + listing.stderr
    marked = {line.split("::")[-1].split("[")[0] for line in listing.stdout.splitlines() if "::" in line}
    # The others run (as in the SQLite pass): the one that reaches the database at run time fails.
    run = pytest_run("-v", "-m", "not db", "-rf")
    outcomes = {line.split("::")[-1].split()[0]: line.split()[1] for line in run.stdout.splitlines()
                if line.startswith(CASES + "::") and line.rstrip().endswith("%]")}
    assert {name for name in marked if not name.endswith("_db")} == set()
    assert set(outcomes) == {name for name in case_names() if name.endswith("_nodb")}
    assert marked | set(outcomes) == case_names()
    assert outcomes == {"test_plain_nodb": "PASSED", "test_settings_and_tmp_path_nodb": "PASSED",
                        "test_dynamic_nodb": "FAILED"}, run.stdout + run.stderr
    assert "test_dynamic_nodb has database access but no `db` marker" in run.stdout


def make_plan(target: str) -> str:
    # Not the calling make's variables (a `make test PYTEST_ARGS=...` run passes them down in MAKEFLAGS).
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTEST_ARGS"}}
    plan = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=env)
    assert plan.returncode == 0, plan.stderr
    return plan.stdout


def test_the_postgresql_pass_runs_every_marked_test_and_the_sqlite_pass_the_others() -> None:
    postgres = make_plan("test-postgres")
    assert "pytest -n 2 --dist loadgroup -m db ;" in postgres and "--ignore" not in postgres
    assert '-m "not db or sqlite"' in make_plan("test-sqlite")
