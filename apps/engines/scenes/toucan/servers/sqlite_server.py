"""A small SQLite MCP server (fastmcp), run INSIDE the sandbox; its state is checkable by SQL.

    python3 -m sqlite_server --db /workspace/data.db [--seed /workspace/seed.sql]   # MCP over stdio

PyPI's mcp-server-sqlite crashes under mcp 2.x, so the toucan scene bundles this one, with the
same five tools: list_tables, describe_table, read_query (one SELECT, run on a read-only
connection), write_query (one INSERT, UPDATE or DELETE), create_table (one CREATE TABLE).
A refused or failing statement is a tool error (isError) whose text says why. `--seed` runs an
SQL script when the database has no tables yet (a fixture's starting data). It imports
nothing from the platform: the sandbox's python3 runs it with fastmcp on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import contextlib
import re
import sqlite3
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

MAX_ROWS = 500
FIRST_WORD = re.compile(r"^\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*([A-Za-z]+)", re.S)


def first_word(query: str) -> str:
    match = FIRST_WORD.match(query)
    return match.group(1).upper() if match else ""


def build_server(db_path: str, seed: str | None = None) -> FastMCP:
    # Creates the file, which the read-only connections need.
    with contextlib.closing(sqlite3.connect(db_path)) as connection:
        if seed and not connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone():
            with open(seed, encoding="utf-8") as script:
                connection.executescript(script.read())
    mcp = FastMCP("sqlite")

    def run(query: str, *, kinds: tuple[str, ...], read_only: bool) -> sqlite3.Cursor:
        if first_word(query) not in kinds:
            raise ToolError(f"this tool runs one {' or '.join(kinds)} statement; got {first_word(query) or 'nothing'!r}")
        uri = f"file:{db_path}?mode=ro" if read_only else f"file:{db_path}?mode=rwc"
        connection = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            # execute() refuses a second statement ("You can only execute one statement at a time").
            return connection.execute(query)
        except sqlite3.Error as exc:
            connection.close()
            raise ToolError(f"sqlite: {exc}") from None

    def rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
        names = [d[0] for d in cursor.description or ()]
        try:
            return [dict(zip(names, row)) for row in cursor.fetchmany(MAX_ROWS)]
        finally:
            cursor.connection.close()

    @mcp.tool
    def list_tables() -> list[str]:
        """List the names of the tables in the database."""
        return [r["name"] for r in rows(run("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%' ORDER BY name",
                                            kinds=("SELECT",), read_only=True))]

    @mcp.tool
    def describe_table(table_name: str) -> list[dict[str, Any]]:
        """Describe a table's columns: name, type, notnull, default value and primary-key position."""
        if table_name not in list_tables():
            raise ToolError(f"no table named {table_name!r}")
        quoted = '"' + table_name.replace('"', '""') + '"'
        return [{"name": c["name"], "type": c["type"], "notnull": bool(c["notnull"]), "default": c["dflt_value"],
                 "pk": c["pk"]} for c in rows(run(f"PRAGMA table_info({quoted})", kinds=("PRAGMA",), read_only=True))]

    @mcp.tool
    def read_query(query: str) -> list[dict[str, Any]]:
        """Run one SELECT statement and return its rows (at most 500) as objects."""
        return rows(run(query, kinds=("SELECT", "WITH"), read_only=True))

    @mcp.tool
    def write_query(query: str) -> dict[str, int]:
        """Run one INSERT, UPDATE or DELETE statement; returns the number of rows it changed."""
        cursor = run(query, kinds=("INSERT", "UPDATE", "DELETE", "REPLACE"), read_only=False)
        try:
            return {"affected_rows": cursor.rowcount}
        finally:
            cursor.connection.close()

    @mcp.tool
    def create_table(query: str) -> str:
        """Run one CREATE TABLE statement."""
        if not re.match(r"^\s*CREATE\s+TABLE\b", query, re.I):
            raise ToolError("this tool runs one CREATE TABLE statement")
        run(query, kinds=("CREATE",), read_only=False).connection.close()
        return "table created"

    return mcp


def main() -> None:
    parser = argparse.ArgumentParser(description="A SQLite MCP server over stdio.")
    parser.add_argument("--db", required=True, help="the database file (created if missing)")
    parser.add_argument("--seed", help="an SQL script run when the database has no tables yet")
    args = parser.parse_args()
    build_server(args.db, args.seed).run(transport="stdio", show_banner=False)


if __name__ == "__main__":
    main()
