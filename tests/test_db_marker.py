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


def test_the_postgresql_pass_runs_the_marked_tests() -> None:
    plan = subprocess.run(["make", "-n", "--no-print-directory", "test-postgres"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "-m db" in plan.stdout
