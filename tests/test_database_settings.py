"""The database settings (trajplatform/settings.py): PostgreSQL sessions run without JIT."""
from __future__ import annotations

import pytest
from django.db import connection


def test_postgresql_sessions_run_without_jit(db):
    """Compiling the console's queue queries took 1-5 s per page at 100k trajectories (docs/benchmarks.md)."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL setting")
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"
