"""Shared fixtures: users in each role, and a factory for tasks."""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Iterator

import pytest
from django.db.backends.base.base import BaseDatabaseWrapper
from pytest_django.plugin import blocking_manager_key

_batch_numbers = itertools.count(1)  # fixture batches need unique names

# Nothing in the suite may reach the internet or spawn real external tools.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")
os.environ.setdefault("ADBUTILS_ADB_PATH", "/bin/false")

ROLE_NAMES = ("viewer", "reviewer", "approver", "admin")
PASSWORD = "correct-horse-battery-staple"


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    """make_user(role=None, username=None): a staff user in the given role group (None: no role)."""
    from django.contrib.auth.models import Group, User

    counter = {"n": 0}

    def _make(role: str | None = None, username: str | None = None, **extra: Any) -> User:
        counter["n"] += 1
        name = username or f"{role or 'outsider'}{counter['n']}"
        extra.setdefault("is_staff", role is not None)
        user = User.objects.create_user(name, f"{name}@example.test", PASSWORD, **extra)
        if role is not None:
            user.groups.add(Group.objects.get(name=role))
        return user

    return _make


@pytest.fixture
def viewer(make_user: Callable[..., Any]) -> Any:
    return make_user("viewer")


@pytest.fixture
def reviewer(make_user: Callable[..., Any]) -> Any:
    return make_user("reviewer")


@pytest.fixture
def approver(make_user: Callable[..., Any]) -> Any:
    return make_user("approver")


@pytest.fixture
def admin_user_role(make_user: Callable[..., Any]) -> Any:
    return make_user("admin")


@pytest.fixture
def make_task(db: Any) -> Callable[..., Any]:
    """make_task(**fields): a code_exec task (in a fresh batch unless batch=... is given)."""
    from apps.tasks.models import Batch, Task

    def _make(**fields: Any) -> Task:
        if "batch" not in fields:
            fields["batch"] = Batch.objects.create(name=f"fixture batch {next(_batch_numbers)}")
        fields.setdefault("scene", "code_exec")
        fields.setdefault("prompt", "Print the first ten primes.")
        return Task.objects.create(**fields)

    return _make


# The fixtures through which a test reaches the test database: pytest-django's own (every fixture
# that depends on the database has one of them in its closure) and live_server (whose database
# pytest-django opens from an autouse fixture).
DB_FIXTURES = frozenset({
    "db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
    "_django_db_helper", "django_db_setup", "live_server",
})
DB_MARKER = "db"
# The database tests the SQLite pass runs besides every test without the database: where the embedded
# default's own behaviour is at stake (the rollout worker's threads and the web server sharing one
# file: its lock waits and WAL; the audit triggers; the migrations; the demo path). Every database
# test runs in the PostgreSQL pass (docs/testing.md).
SQLITE_MARKER = "sqlite"
SQLITE_PASS = ("tests/tasks/", "tests/test_audit.py", "tests/test_migrations.py", "tests/test_demo.py",
               "tests/test_bootstrap_admin.py", "tests/test_models.py")


def touches_database(item: pytest.Item) -> bool:
    """Whether the test uses the database: the django_db marker, or a database fixture anywhere in
    its fixture closure (through the fixtures it requests, autouse ones included)."""
    return (item.get_closest_marker("django_db") is not None
            or not DB_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that touches the database `db`: the PostgreSQL pass runs `-m db`, the SQLite
    pass `-m "not db or sqlite"` (the SQLITE_PASS files are marked `sqlite`). Tests that reach the database another way (a subprocess running
    manage.py on the test database) carry `pytest.mark.db` themselves; the guard below fails a
    test that got database access without the marker."""
    for item in items:
        if item.get_closest_marker(DB_MARKER) is None and touches_database(item):
            item.add_marker(DB_MARKER)
        if item.nodeid.startswith(SQLITE_PASS):
            item.add_marker(SQLITE_MARKER)


def _database_unblocked(config: pytest.Config) -> bool:
    blocker = config.stash.get(blocking_manager_key, None)
    return blocker is not None and BaseDatabaseWrapper.ensure_connection != blocker._blocking_wrapper


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test holding database access (its fixtures unblocked it, even through getfixturevalue)
    without the `db` marker would be left out of the PostgreSQL pass: it fails instead."""
    _fail_unless_marked(item)
    result = yield
    _fail_unless_marked(item)
    return result


def _fail_unless_marked(item: pytest.Item) -> None:
    if item.get_closest_marker(DB_MARKER) is None and _database_unblocked(item.config):
        pytest.fail(f"{item.nodeid} has database access but no `db` marker: the PostgreSQL pass "
                    "(-m db) would leave it out; request the database through a fixture statically "
                    "or mark it with pytest.mark.db", pytrace=False)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Remove this run's SQLite test database files, WAL and shared-memory files included."""
    from django.conf import settings

    name = settings.DATABASES["default"].get("TEST", {}).get("NAME")
    if name and settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.remove(f"{name}{suffix}")
            except FileNotFoundError:
                pass
