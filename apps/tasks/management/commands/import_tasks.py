"""`manage.py import_tasks FILE`: validate a task file, then import it as one batch."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Iterator

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, DjangoHelpFormatter
from django.urls import reverse

from apps.engines.registry import SCENES
from apps.tasks.importers import ADP_TASK_TYPE_SCENES, ImportSummary, InvalidImport, check_file, iter_tasks
from apps.tasks.selectors import batch_imported_from
from apps.tasks.services import BatchNameTaken, batch_free_name, batch_import, tasks_enqueue

MAX_ERRORS_SHOWN = 200

_MAPPING = ", ".join(f"{t} -> {s}" for t, s in ADP_TASK_TYPE_SCENES.items())

HELP = f"""\
Import tasks from FILE (JSONL, one task per line, or a JSON list of tasks) as one batch.

Each line is one of two shapes, detected per line:
  agent-data-platform: task_id, task_type, description
      [, expected_tools, max_steps, timeout, priority]
    task_type picks the scene: {_MAPPING}
    (--scene overrides it); task_id -> external_id, description -> prompt,
    timeout -> timeout_s.
  trajplatform: scene, prompt
      [, config, external_id, expected_tools, model, temperature, top_p, max_steps,
       step_timeout_s, timeout_s, max_tokens, system_prompt_extra, max_iterations,
       quality_threshold, samples_per_iteration, priority]
    config is the scene config, checked against the scene's schema.
  Either shape may also carry
    reference_solution: read by the offline model, ignored by the import.

The whole file is checked first: every invalid line is reported as
FILE:LINE: field: reason, and nothing is written. Otherwise the batch and all its tasks
(status queued) are created in one transaction.

By default the batch is imported, not started: the console lists it as "not started" until
someone runs its Start action (Tasks > Batches) or `manage.py synthesize`. With --start, the
first iteration of every task is queued at once and rollout jobs go to the workers.
"""


class _HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", metavar="FILE", help="the .jsonl or .json file to import")
        parser.add_argument(
            "--batch", metavar="NAME",
            help="batch name, unique (default: the file name without extension, with ' (2)', ... if taken)",
        )
        parser.add_argument(
            "--scene",
            choices=list(SCENES),
            metavar="SCENE",
            help=f"use this scene for every line, overriding scene / task_type ({', '.join(SCENES)})",
        )
        parser.add_argument("--user", metavar="USERNAME", help="record this user as the batch's creator (default: system)")
        parser.add_argument("--dry-run", action="store_true", help="validate only; write nothing")
        parser.add_argument(
            "--start", action=argparse.BooleanOptionalAction, default=False,
            help="queue every task's first iteration for the workers after the import (default: --no-start, "
            "the batch waits as 'not started' for the console's Start action)",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="do nothing if a batch of this name was already imported from identical file content "
            "(used by 'make demo' so that it can run again)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        label: str = options["file"]
        path = Path(label)
        if not path.is_file():
            raise CommandError(f"{label}: no such file")
        name = options["batch"] if options["batch"] is not None else path.stem
        if not name.strip() or len(name) > 200:
            raise CommandError("--batch: must be 1-200 characters")
        actor = None
        if options["user"]:
            try:
                actor = get_user_model().objects.get_by_natural_key(options["user"])
            except get_user_model().DoesNotExist:
                raise CommandError(f"--user: no user named {options['user']!r}") from None
        scene = options["scene"]

        with path.open("rb") as fp:
            summary = check_file(fp, scene=scene)
        if summary.errors:
            self._report_errors(label, summary)

        if options["once"]:
            existing = batch_imported_from(name=name, source_sha256=summary.sha256)
            if existing is not None:
                self.stdout.write(
                    f"{label}: already imported as batch #{existing.pk} {existing.name!r}; nothing to import"
                )
                if options["start"]:
                    started = tasks_enqueue(batch=existing, actor=actor)
                    self.stdout.write(f"Started {started} not-started task(s).")
                self.stdout.write(f"Admin: {_batch_admin_path(existing.pk)}")
                return

        if options["dry_run"]:
            self.stdout.write(f"{label}: valid, {summary.task_count} tasks ({summary.source_format}); "
                              "dry run, nothing written")
            self._write_counts(summary)
            return

        if options["batch"] is None:
            name = batch_free_name(name)  # the file's name again: "tasks (2)", batch names are unique

        with path.open("rb") as fp:
            rows = self._checked_rows(fp, scene, summary.sha256)
            try:
                batch = batch_import(
                    rows=rows,
                    name=name,
                    source_name=path.name,
                    source_sha256=summary.sha256,
                    source_format=summary.source_format,
                    actor=actor,
                )
            except InvalidImport as exc:
                raise CommandError(f"{label} changed while importing ({exc.errors[0].format(label)}); nothing imported") from None
            except BatchNameTaken as exc:
                raise CommandError(f"--batch: {exc} (with --once, a file already imported under that name is "
                                   "skipped); nothing imported") from None

        self.stdout.write(self.style.SUCCESS(
            f"Imported {batch.task_count} tasks into batch #{batch.pk} {batch.name!r} "
            f"({summary.source_format}, sha256 {summary.sha256[:12]})"
        ))
        self._write_counts(summary)
        if options["start"]:
            started = tasks_enqueue(batch=batch, actor=actor)
            self.stdout.write(f"Started {started} task(s); workers (`make worker`) run them.")
        else:
            self.stdout.write("Not started: run the batch's Start action in the console, or import with --start.")
        self.stdout.write(f"Admin: {_batch_admin_path(batch.pk)}")

    def _checked_rows(self, fp: Any, scene: str | None, sha256: str) -> Iterator[dict[str, Any]]:
        # Consumed inside the service's transaction: a file rewritten since the check pass
        # raises here and rolls the whole batch back.
        second = ImportSummary()
        yield from iter_tasks(fp, scene=scene, summary=second)
        if second.sha256 != sha256:
            raise CommandError("the file changed between the check and the import; nothing imported")

    def _report_errors(self, label: str, summary: ImportSummary) -> None:
        errors = summary.errors
        for error in errors[:MAX_ERRORS_SHOWN]:
            self.stderr.write(error.format(label))
        if len(errors) > MAX_ERRORS_SHOWN:
            self.stderr.write(f"… and {len(errors) - MAX_ERRORS_SHOWN} more")
        lines = len({e.line for e in errors})
        raise CommandError(f"{label}: {len(errors)} error(s) on {lines} line(s); nothing imported")

    def _write_counts(self, summary: ImportSummary) -> None:
        for scene_id, n in sorted(summary.by_scene.items()):
            self.stdout.write(f"  {scene_id:<14} {n}")


def _batch_admin_path(pk: int) -> str:
    return reverse("admin:tasks_batch_change", args=[pk])
