"""`manage.py import_envscaler --metadata M.json --scenarios S.json [--batch NAME] [--dry-run] [--wait]`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from apps.engines.management.commands.offline_model import DEFAULT_SOLUTION_DIRS
from apps.engines.pipelines.envscaler import envscaler_import
from apps.engines.scenes.envscaler.importer import EnvScalerImportError, input_digest
from apps.tasks.management.commands.synthesize import Command as SynthesizeCommand
from apps.tasks.management.commands.synthesize import quiet_loggers
from apps.tasks.models import Batch
from apps.tasks.services import BatchNameTaken

RUN_OPTIONS = ("user", "once", "wait", "concurrency", "start_offline_model", "solutions")
HELP = """\
Import EnvScaler environments (--metadata: env_name, description, code, operations) and their
scenarios (--scenarios: task_id, task_desc, env_name, init_config, check_func) as one batch of
envscaler tasks. Everything is validated first (the environment code and check functions
inside a sandbox, never in this process); every problem is listed as ITEM: FIELD: REASON and
nothing is written when there is any.

With --wait the batch is started and its rollouts run in this process, exactly as
`synthesize --wait` does (with --start-offline-model, the offline scripted model serves the
reference solutions: examples/reference_solutions, or --solutions).
"""


def _load(path: str, flag: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise CommandError(f"{flag} {path}: no such file")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError(f"{flag} {path}: not valid JSON: {exc}") from None


class Command(SynthesizeCommand):
    help = HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--metadata", required=True, metavar="M.json", help="the environments (JSON list)")
        parser.add_argument("--scenarios", required=True, metavar="S.json", help="the tasks (JSON list)")
        parser.add_argument("--batch", metavar="NAME", help="batch name (default: 'envscaler: <environments>')")
        parser.add_argument("--dry-run", action="store_true", help="validate only; write nothing")
        # --user, --once, --wait, --concurrency, --start-offline-model, --solutions: synthesize's own.
        theirs = argparse.ArgumentParser(add_help=False)
        super().add_arguments(theirs)
        for action in theirs._actions:
            if action.dest in RUN_OPTIONS:
                parser._add_action(action)

    def handle(self, *args: Any, **options: Any) -> None:
        metadata = _load(options["metadata"], "--metadata")
        scenarios = _load(options["scenarios"], "--scenarios")
        wait = options["wait"]
        if options["dry_run"] and wait:
            raise CommandError("--dry-run and --wait exclude each other")
        if options["start_offline_model"] and not wait:
            raise CommandError("--start-offline-model goes with --wait")
        if options["concurrency"] is not None and (options["concurrency"] < 1 or not wait):
            raise CommandError("--concurrency must be at least 1 and goes with --wait")
        actor = None
        if options["user"]:
            actor = get_user_model().objects.filter(username=options["user"]).first()
            if actor is None:
                raise CommandError(f"--user {options['user']}: no such user")
        with quiet_loggers(options["verbosity"]):
            server = None
            try:
                if wait:
                    # The model is checked (and the offline one started) before anything is written.
                    if options["solutions"] is None:
                        options["solutions"] = [str(p) for p in (Path(settings.BASE_DIR) / d for d in DEFAULT_SOLUTION_DIRS)
                                                if p.exists()]
                    server = self._check_model(options, Path(options["scenarios"]))
                batch = self._import(metadata, scenarios, options, actor)
                if batch is not None and wait:
                    self._start(batch)
                    self._run_here(batch, options["concurrency"] or settings.ROLLOUT_CONCURRENCY)
            finally:
                if server is not None:
                    server.stop()

    def _import(self, metadata: Any, scenarios: Any, options: dict[str, Any], actor: Any) -> Batch | None:
        name = options["batch"]
        if options["once"] and name:
            existing = Batch.objects.filter(name=name, source_sha256=input_digest(metadata, scenarios)).order_by("-pk").first()
            if existing is not None:
                self.stdout.write(f"Batch #{existing.pk} {name!r} was already imported from this input; using it.")
                return existing
        source = f"{Path(options['metadata']).name} + {Path(options['scenarios']).name}"
        try:
            result = envscaler_import(metadata=metadata, scenarios=scenarios, actor=actor, batch_name=name,
                                      source_name=source, dry_run=options["dry_run"])
        except EnvScalerImportError as exc:
            for error in exc.errors:
                self.stderr.write(str(error))
            raise CommandError(f"{len(exc.errors)} error(s); nothing was imported") from None
        except BatchNameTaken as exc:
            raise CommandError(f"--batch: {exc}; nothing was imported") from None
        if options["dry_run"]:
            envs = sorted({row["scene_config"]["env_name"] for row in result})
            self.stdout.write(f"valid: {len(envs)} environment(s), {len(result)} task(s); dry run, nothing written")
            return None
        self.stdout.write(f"Imported batch #{result.pk} {result.name!r}: {result.task_count} envscaler task(s).")
        return result
