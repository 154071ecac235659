"""`manage.py dataset_export NAME --version N --format F --out PATH`: write one export file."""
from __future__ import annotations

import argparse
from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError

from apps.datasets.cli import DatasetCommand, ProgressBar, get_version, resolve_user
from apps.datasets.jobs import export_run
from apps.datasets.models import ExportJob
from apps.datasets.services import SPLITS, DatasetError, export_start

HELP = """\
Export one split of a dataset version in one format to PATH, in this process.

The file is built in PATH.parts/ (one finished chunk at a time) and PATH.tmp, and renamed to
PATH only when complete: PATH never holds a partial file. An interrupted run (Ctrl-C, a
crash) keeps its finished chunks; running the same command again resumes from them.
An existing PATH is refused unless --force. The export is recorded (checksum, lines,
excluded records) on the version page and in `dataset_stats`.
"""
MAX_EXCLUDED_SHOWN = 20


class Command(DatasetCommand):
    help = HELP


    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", metavar="NAME", help="dataset name")
        parser.add_argument("--version", dest="number", type=int, metavar="N", help="version (default: the newest)")
        parser.add_argument("--format", required=True, metavar="F", help="e.g. sft-openai, sft-trl, dpo-trl, raw")
        parser.add_argument("--out", required=True, metavar="PATH", help="the file to write")
        parser.add_argument("--split", default="all", choices=SPLITS)
        parser.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
        parser.add_argument("--user", metavar="USERNAME", help="act as this user (their permissions apply)")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        actor = resolve_user(options.get("user"))
        version = get_version(options["name"], options["number"])
        try:
            job = export_start(version=version, fmt=options["format"], split=options["split"], actor=actor,
                               out_path=options["out"], force=options["force"], enqueue=False)
        except (DatasetError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        bar = ProgressBar(self.stderr._out, enabled=not options["no_progress"])
        try:
            job = export_run(job.pk, progress=bar.for_stage("exporting"))
        finally:
            bar.close()
        if job is None:
            raise CommandError("the export job was claimed by another process")
        if job.status != ExportJob.Status.DONE:
            raise CommandError(f"export failed: {job.error}")
        for item in job.excluded[:MAX_EXCLUDED_SHOWN]:
            self.stderr.write(f"excluded trajectory #{item.get('trajectory_id')}: {item.get('reason')}")
        if len(job.excluded) > MAX_EXCLUDED_SHOWN:
            self.stderr.write(f"... and {len(job.excluded) - MAX_EXCLUDED_SHOWN} more (see dataset_stats)")
        if job.lines == 0:
            self.stderr.write(self.style.WARNING(f"warning: no lines were written ({job.members} member(s) in the "
                                                 f"{job.split} split, {len(job.excluded)} excluded)"))
        resumed = f", {job.resumed_chunks} chunk(s) resumed" if job.resumed_chunks else ""
        self.stdout.write(self.style.SUCCESS(
            f"wrote {job.path}: {job.lines} lines, {job.bytes} bytes, {len(job.excluded)} excluded{resumed}"
        ))
        self.stdout.write(f"sha256 {job.sha256}")
