"""`manage.py mcp_register FILE [--dry-run] [--user NAME]`: register MCP servers (toucan's registry)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.engines.mcp_servers import McpRegistryError, load_records, mcp_servers_register

HELP = """\
Register MCP servers from FILE: a JSON list of server records, {"servers": [...]}, one record,
or JSONL (one record a line); examples/toucan/servers.json holds the bundled ones. A record is
{name, package {kind, name, version}, launch (the hub's McpServerSpec fields: argv, env, cwd,
transport, ...), deny_tools, labels {primary, secondary}, secrets (names only), fixtures,
state_probe, enabled} (docs/mcp.md, "MCP server registry").

Each server is started in a sandbox (profile trajplatform-mcp) with its fixtures, and its own
tools/list is stored as the tool snapshot with a SHA-256; a name registered before is updated
and its hash change recorded. Every record is checked and snapshotted first: a bad one is
reported (RECORD: REASON) and nothing is written. --dry-run does all of that and writes nothing.
"""


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", metavar="FILE", help="the server records (JSON or JSONL)")
        parser.add_argument("--dry-run", action="store_true",
                            help="check and snapshot every record in a sandbox; write nothing")
        parser.add_argument("--user", metavar="NAME", help="the user the audit rows name (default: system)")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"])
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        actor = None
        if options["user"]:
            actor = get_user_model().objects.filter(username=options["user"]).first()
            if actor is None:
                raise CommandError(f"--user {options['user']}: no such user")
        try:
            records = load_records(path)
            results = mcp_servers_register(records=records, actor=actor, dry_run=options["dry_run"],
                                           actor_repr=None if actor else "manage.py mcp_register")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{path}: {exc}") from None
        except McpRegistryError as exc:
            for error in exc.errors:
                self.stderr.write(f"{path}: {error}")
            raise CommandError(f"{len(exc.errors)} problem(s); nothing was registered") from None
        for result in results:
            snapshot = result.snapshot
            if result.created:
                what = "new"
            elif result.tools_changed:
                what = f"updated, tools changed (was {result.previous_sha256[:12]})"
            else:
                what = "updated, same tools"
            self.stdout.write(f"{result.name}: {len(snapshot.tools)} tools, sha256 {snapshot.sha256[:12]}, "
                              f"started in {snapshot.start_ms} ms ({what})")
        verb = "would register" if options["dry_run"] else "registered"
        self.stdout.write(self.style.SUCCESS(f"{verb} {len(results)} MCP server(s)"
                                             + (" (dry run: nothing written)" if options["dry_run"] else "")))
