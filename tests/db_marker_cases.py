"""Cases for tests/test_db_marker.py, collected only by the subprocess it runs (not a test_*.py
file): which tests the `db` marker must reach. Names ending in _db must carry it, _nodb must not;
dynamic_nodb reaches the database at run time without it and must fail."""
from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def row(db: Any) -> str:
    return "a fixture on the database"


@pytest.fixture
def row_of_row(row: str) -> str:
    return row


def test_plain_nodb() -> None:
    pass


def test_settings_and_tmp_path_nodb(settings: Any, tmp_path: Any) -> None:
    pass


def test_db_fixture_db(db: Any) -> None:
    pass


def test_transactional_db(transactional_db: Any) -> None:
    pass


@pytest.mark.django_db
def test_django_db_marker_db() -> None:
    pass


@pytest.mark.django_db(transaction=True)
class TestMarkedClass:
    def test_in_class_db(self) -> None:
        pass


def test_through_a_fixture_db(row: str) -> None:
    pass


def test_through_a_fixture_of_a_fixture_db(row_of_row: str) -> None:
    pass


def test_live_server_db(live_server: Any) -> None:
    pass


def test_admin_client_db(admin_client: Any) -> None:
    pass


def test_unblocking_by_hand_db(django_db_setup: Any, django_db_blocker: Any) -> None:
    pass


@pytest.mark.db
def test_a_subprocess_on_the_test_database_db() -> None:
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_parametrized_db(db: Any, n: int) -> None:
    pass


def test_dynamic_nodb(request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("db")
