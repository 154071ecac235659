"""Run the offline scripted model (the `scripted-reference` stand-in) in the foreground."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.engines.offline_model import (
    FaultSpecError,
    OfflineModelServer,
    ReferenceSolutionError,
    ScriptedModel,
    load_scripts,
)

# examples/tasks carries the tasks' own scripts; the scenes whose sub-episodes (multi_agent's roles,
# search2qa's stages) or generation stages need scripts of their own keep them beside their examples.
DEFAULT_SOLUTION_DIRS = ("examples/reference_solutions", "examples/tasks", "examples/multi_agent", "examples/search2qa")


class Command(BaseCommand):
    help = (
        "Serve the offline scripted model: an OpenAI-compatible endpoint (model 'scripted-reference') that "
        "replays bundled reference solutions. A labelled stand-in for demos and tests, not a language model. "
        "Host and port default to OFFLINE_MODEL_URL's; solutions default to "
        + " and ".join(DEFAULT_SOLUTION_DIRS) + " (those that exist)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        default = urlparse(settings.OFFLINE_MODEL_URL)
        parser.add_argument("--host", default=default.hostname or "127.0.0.1")
        parser.add_argument("--port", type=int, default=default.port or 8765)
        parser.add_argument(
            "--solutions", nargs="+", metavar="PATH",
            help="reference-solution files or directories (*.json, *.jsonl with reference_solution per line)",
        )
        parser.add_argument(
            "--fault", default="",
            help="inject faults into every request, e.g. '429;retry_after=2;times=3' or 'slow;seconds=5' "
                 "(see apps/engines/offline_model.py)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        paths = options["solutions"]
        if paths is None:
            paths = [p for p in (Path(settings.BASE_DIR) / d for d in DEFAULT_SOLUTION_DIRS) if p.exists()]
        try:
            model = ScriptedModel(load_scripts(paths), faults=options["fault"])
        except (ReferenceSolutionError, FaultSpecError) as exc:
            raise CommandError(str(exc)) from None
        try:
            server = OfflineModelServer(model, options["host"], options["port"])
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc}") from None
        self.stdout.write(
            f"scripted-reference (offline stand-in, not a real model) serving {len(model.registry)} reference "
            f"solution(s) from {', '.join(map(str, paths)) or 'nothing'} at {server.url}"
            + (f" with faults {options['fault']!r}" if options["fault"] else "")
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
