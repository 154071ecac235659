"""`flush`, which empties every table, also empties the append-only audit table.

Django's flush DELETEs (SQLite) or TRUNCATEs (PostgreSQL) every table, which the audit table's
triggers refuse. This runs it in one transaction that drops the triggers first and puts them
back after, so no other connection ever sees the table unguarded (the DDL locks it until the
commit). Tests that use the real transaction (TransactionTestCase) flush after each test.
"""
from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.db import connections, transaction

from trajplatform.audit import append_only_triggers_installed, drop_append_only_triggers, install_append_only_triggers


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        connection = connections[options["database"]]
        with transaction.atomic(using=options["database"]):
            guarded = append_only_triggers_installed(connection)
            if guarded:
                drop_append_only_triggers(connection)
            super().handle(**options)
            if guarded:
                install_append_only_triggers(connection)
