"""`manage.py import_trajectories FILE`: read a raw export back into the database."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.datasets.cli import resolve_user
from apps.datasets.raw_import import RawImportError, interchange_import

MAX_ERRORS_SHOWN = 200
FLAGS = {"batch": "--batch NAME", "outcome": "--outcome success|failure", "scene": "--scene S",
         "format": "--format atif|adp|mini-swe-agent"}  # an error's field, as this command takes it


class Command(BaseCommand):
    help = (
        "Import trajectories from FILE, a JSONL file in our raw export format "
        "(dataset_export --format raw), with their tasks and latest reviews. The whole file is "
        "checked first; every bad line is reported as FILE:LINE: reason and nothing is written. "
        "Each source batch becomes a new batch of the same name unless --batch is given "
        "(a name that already exists is refused). "
        "Human reviews need their reviewer's account to exist here. "
        "--format atif|adp|mini-swe-agent reads other tools' trajectories (and our atif/adp exports, "
        "which come back as they went out) through the same checks; a trajectory a chat format "
        "(sft-trl, sft-openai, sharegpt) cannot take as it is is named in a warning (docs/interchange.md)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("file", metavar="FILE", help="a raw export (.jsonl), or another tool's file in --format")
        parser.add_argument("--batch", metavar="NAME", help="put every imported task in one new batch of this name")
        parser.add_argument("--format", default="raw", choices=["raw", "atif", "adp", "mini-swe-agent"],
                            help="raw (ours, default); atif (Harbor's ATIF v1.0-v1.7, JSONL, a JSON list or one "
                                 "trajectory.json); adp (Agent Data Protocol 1.x or without schema_version, JSONL or "
                                 "a JSON list); mini-swe-agent (a saved .traj.json, or JSONL of them)")
        parser.add_argument("--outcome", choices=["success", "failure"],
                            help="the outcome of trajectories from another tool (they carry none we can verify); "
                                 "required for those, ignored for our own exports")
        parser.add_argument("--scene", help="the scene of tasks from another tool (default code_exec)")
        parser.add_argument("--user", metavar="USERNAME", help="record this user as the importer (default: system)")

    def handle(self, *args: Any, **options: Any) -> None:
        actor = resolve_user(options["user"])
        try:
            result = interchange_import(path_or_file=options["file"], fmt=options["format"], actor=actor,
                                        batch_name=options["batch"], outcome=options["outcome"],
                                        scene=options["scene"])
        except RawImportError as exc:
            hint = f" ({FLAGS[exc.field]})" if exc.field in FLAGS else ""
            for line in exc.errors[:MAX_ERRORS_SHOWN]:
                self.stderr.write(line + hint)
            more = len(exc.errors) - MAX_ERRORS_SHOWN
            if more > 0:
                self.stderr.write(f"... and {more} more")
            raise CommandError(f"{options['file']}: {len(exc.errors)} problem(s); nothing was imported") from None
        names = ", ".join(f"#{b.pk} {b.name!r}" for b in result.batches)
        self.stdout.write(
            f"imported {result.trajectory_count} trajectories, {result.task_count} tasks and "
            f"{result.review_count} reviews into batch(es) {names}"
        )
        for warning in result.warnings:
            self.stderr.write(f"warning: {warning}")
        if result.rehashed:
            self.stdout.write(f"{result.rehashed} trajectories no longer match their recorded content_sha256 "
                              "(redacted on export, or edited) and were hashed again")
