"""`manage.py dataset_export NAME --version N --format F --out PATH`: write one export file."""
from __future__ import annotations

import argparse
import textwrap
from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError

from apps.datasets.cli import DatasetCommand, ProgressBar, get_version, resolve_user
from apps.datasets.exporters import format_table
from apps.datasets.exporters.answers import MODES as FINAL_ANSWERS
from apps.datasets.hf_layout import LAYOUTS
from apps.datasets.jobs import export_run
from apps.datasets.models import ExportJob
from apps.datasets.services import SPLITS, DatasetError, export_start, template_check_run

HELP = """\
Export one split of a dataset version in one format to PATH, in this process.

The file is built in PATH.parts/ (one finished chunk at a time) and PATH.tmp, and renamed to
PATH only when complete: PATH never holds a partial file. An interrupted run (Ctrl-C, a
crash) keeps its finished chunks; running the same command again resumes from them.
An existing PATH is refused unless --force. The export is recorded (checksum, lines,
excluded records) on the version page and in `dataset_stats`.

Formats (--format F): what each is for, and which consumer loads it. A version exports in
those that apply to its scenes and would write a line (its card's exportability, dataset_stats).
"""


def formats_help(width: int = 100) -> str:
    """The format table as help text: a name, then its line, wrapped under it."""
    rows = format_table()
    pad = max(len(r.name) for r in rows) + 4
    return "\n".join(textwrap.fill(r.line, width=width, initial_indent=f"  {r.name:<{pad - 4}}  ",
                                   subsequent_indent=" " * pad, break_on_hyphens=False) for r in rows)


MAX_EXCLUDED_SHOWN = 20
MAX_PROBLEMS_SHOWN = 5


class Command(DatasetCommand):
    help = HELP + formats_help() + "\n"


    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", metavar="NAME", help="dataset name")
        parser.add_argument("--version", dest="number", type=int, metavar="N", help="version (default: the newest)")
        parser.add_argument("--format", required=True, metavar="F", help="the export format: one of those listed above")
        parser.add_argument("--out", required=True, metavar="PATH", help="the file to write (with --layout hf, the directory)")
        parser.add_argument("--split", default="all", choices=SPLITS)
        parser.add_argument("--force", action="store_true", help="overwrite PATH if it exists (the directory, with "
                            "--layout hf: replaced only once the new one is complete)")
        parser.add_argument("--layout", choices=LAYOUTS, default="jsonl",
                            help="jsonl (the default): one JSONL file at PATH; hf: the Hugging Face layout, PATH a "
                                 "directory of Parquet shards per split (data/<split>-00000-of-0000N.parquet, "
                                 "DATASET_HF_SHARD_ROWS rows each) and a README.md card with the Hub's YAML, read by "
                                 "datasets.load_dataset(PATH) (docs/exports.md, \"Hugging Face layout\")")
        parser.add_argument("--final-answer", choices=FINAL_ANSWERS, default=None,
                            help="how the chat formats end an episode: text (their default) - the finish call becomes "
                                 "the last assistant message with the answer as its text, finish leaves the tools, no "
                                 "acknowledgement; tool - the finish call and its acknowledgement are kept (agents "
                                 "trained on a submit tool, SWE-agent / OpenHands style). toucan and toolace take text "
                                 "only; raw, the interchange formats, qa and aitw refuse the option (docs/exports.md, "
                                 "\"Final answers\")")
        parser.add_argument("--check-template", action="append", default=[], metavar="NAME",
                            help="after writing, render every line through this chat template (a .jinja file, a "
                                 "tokenizer directory, or a name in DATASET_CHAT_TEMPLATE_DIR) and report per record "
                                 "what the template drops from a message's turn (in any form it writes it: raw, JSON, "
                                 "html-safe JSON, repr), the assistant mask, the round trip; what it drops by design "
                                 "(text or reasoning on tool-call turns) and its own errors once per template; "
                                 "repeatable; exit 1 if a record fails (formats sft-trl, dpo-trl, dpo-step-trl, "
                                 "kto-trl, reward-score)")
        parser.add_argument("--user", metavar="USERNAME", help="act as this user (their permissions apply)")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        actor = resolve_user(options.get("user"))
        if options["layout"] == "hf" and options["check_template"]:
            raise CommandError("--check-template renders a JSONL export's lines; use it with --layout jsonl")
        version = get_version(options["name"], options["number"])
        try:
            job = export_start(version=version, fmt=options["format"], split=options["split"], actor=actor,
                               out_path=options["out"], force=options["force"], enqueue=False,
                               layout=options["layout"], final_answer=options["final_answer"])
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
        failed = 0
        for name in options["check_template"]:
            try:
                check, report = template_check_run(job=job, template_name=name, actor=actor)
            except (DatasetError, PermissionDenied) as exc:
                raise CommandError(f"--check-template {name}: {exc}") from None
            for record in report.records:
                # A template's own error is said once for the template, below, not once per line.
                shown = [p for p in record.problems if not record.render_error or record.render_error not in p]
                for problem in shown[:MAX_PROBLEMS_SHOWN]:
                    self.stderr.write(f"{check.template}: line {record.line}: {problem}")
                if len(shown) > MAX_PROBLEMS_SHOWN:
                    self.stderr.write(f"{check.template}: line {record.line}: ... and "
                                      f"{len(shown) - MAX_PROBLEMS_SHOWN} more")
            s = check.summary
            for error in s["render_errors"]:
                lines = ", ".join(map(str, error["lines"])) + (", ..." if error["records"] > len(error["lines"]) else "")
                self.stderr.write(f"{check.template}: the template cannot render {error['records']} of "
                                  f"{check.records} record(s) (line {lines}): {error['error']}")
            reasoning = (f", reasoning kept in {s['reasoning_kept']} turn(s), stripped in {s['reasoning_stripped']}"
                         if s["reasoning_kept"] or s["reasoning_stripped"] else "")
            self.stdout.write(f"template {check.template} ({check.template_sha256[:12]}): {check.passed}/{check.records}"
                              f" records pass; assistant mask {s['mask']}{reasoning}")
            for prop in s["properties"]:
                self.stdout.write(f"template {check.template} by design {prop['property']}: {prop['turns']} turn(s) "
                                  f"in {prop['records']} record(s) (not counted as failures)")
            failed += check.failed
        if failed:
            raise CommandError(f"{failed} record check(s) failed against the chat template(s); the file is written")
