"""The database settings (trajplatform/settings.py): PostgreSQL sessions run without JIT."""
from __future__ import annotations

from django.db import connection


def test_postgresql_sessions_run_without_jit(db):
    """Compiling the console's queue queries took 1-5 s per page at 100k trajectories (docs/benchmarks.md)."""
    if connection.vendor != "postgresql":  # the option is PostgreSQL's: SQLite gets none
        assert "options" not in connection.settings_dict["OPTIONS"]
        return
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"
