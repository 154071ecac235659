"""Shared fixtures: users in each role, and a factory for tasks."""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable

import pytest

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
