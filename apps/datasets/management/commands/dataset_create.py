"""`manage.py dataset_create NAME [filters]`: build (and optionally publish) a new dataset version."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError

from apps.datasets.cli import DatasetCommand, ProgressBar, get_version, resolve_user
from apps.datasets.services import (
    DatasetError, dataset_version_create, dataset_version_publish, exportability_pending, publish_warnings,
)

HELP = """\
Build a new version of dataset NAME (created if it does not exist) from the finished
trajectories that match the filters: select, drop duplicates, split train/validation by
task, freeze the ordered members with their content hashes, and write the data card.

Scope (trajectories outside it are not considered):
  --scene S, --batch ID|NAME, --model M   repeatable; any of the given values
  --since DATE, --until DATE              finished_at in [since, until); ISO date or
                                          datetime, UTC when naive; a date-only --until
                                          includes that whole day
Quality rules (failures are listed in the data card with the reason):
  --min-score X        latest automatic review's overall score >= X (0-100)
  --accepted-only      latest human review's verdict is accept
  --success-only       outcome success
  --min-reward X       reward >= X
  Trajectories whose outcome is error are always excluded.
Dedup (on by default): exact (normalized content hash) and near duplicates (same outcome,
and cosine of all-MiniLM-L6-v2 embeddings of the task prompt AND of the action sequence both
>= the threshold, default DATASET_DEDUP_THRESHOLD = 0.92); the best-scored member of each
cluster is kept, and trajectories duplicating a member of an earlier published version are
dropped.

Decontamination (off unless test sets are named): --decontam NAME checks each member's task
prompt and answer against the items of DATASET_TESTSET_DIR/NAME.jsonl (or .txt): word 13-gram
overlap >= 0.5 of an item's n-grams, or all-MiniLM-L6-v2 cosine >= 0.9; matches are excluded
and listed in the data card with the benchmark and item they matched.

--filter takes the same spec as JSON (or @FILE); the flags override its keys.
The new version's parent is --parent N, else the latest published version.

Exportability: once the version is written, every export format that applies is rendered and
validated in dry run on every member (nothing is written), in chunks, and the counts go in the
data card; until then the version cannot be exported or published. This command measures it
in-process, printing its progress; interrupted, the measurement goes back to the queue and a
worker resumes it from its last finished chunk. --no-wait leaves it to the workers (qcluster)
and returns once the version is written; follow it on the version page or with dataset_stats.
"""


def _spec_from(options: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    raw = options.get("filter")
    if raw:
        try:
            text = Path(raw[1:]).read_text(encoding="utf-8") if raw.startswith("@") else raw
            spec = json.loads(text)
        except OSError as exc:
            raise CommandError(f"--filter: cannot read {raw[1:]}: {exc.strerror}") from None
        except ValueError as exc:
            raise CommandError(f"--filter: not valid JSON: {exc}") from None
        if not isinstance(spec, dict):
            raise CommandError("--filter: must be a JSON object")
    for flag, key in (("scene", "scenes"), ("batch", "batches"), ("model", "models")):
        if options.get(flag):
            spec[key] = options[flag]
    for key in ("min_score", "min_reward", "since", "until", "validation_fraction", "split_seed"):
        if options.get(key) is not None:
            spec[key] = options[key]
    for key in ("accepted_only", "success_only", "prefer_corrections"):
        if options.get(key):
            spec[key] = True
    dedup = spec.get("dedup") if spec.get("dedup") is not None else {}
    if isinstance(dedup, dict):  # anything else is reported by the spec validation
        dedup = dict(dedup)
        if options.get("no_exact_dedup"):
            dedup["exact"] = False
        if options.get("no_near_dedup"):
            dedup["near"] = False
        if options.get("dedup_threshold") is not None:
            dedup["threshold"] = options["dedup_threshold"]
        if dedup:
            spec["dedup"] = dedup
    decontam = spec.get("decontam") if spec.get("decontam") is not None else {}
    if isinstance(decontam, dict):  # anything else is reported by the spec validation
        decontam = dict(decontam)
        if options.get("decontam"):
            decontam["test_sets"] = sorted(set(decontam.get("test_sets") or []) | set(options["decontam"]))
        for flag, key in (("decontam_ngram", "ngram"), ("decontam_overlap", "ngram_threshold"),
                          ("decontam_cosine", "cosine_threshold")):
            if options.get(flag) is not None:
                decontam[key] = options[flag]
        if options.get("no_decontam_embedding"):
            decontam["embedding"] = False
        if decontam:
            spec["decontam"] = decontam
    return spec


class Command(DatasetCommand):
    help = HELP


    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", metavar="NAME", help="dataset name (a slug)")
        parser.add_argument("--filter", metavar="JSON|@FILE", help="the filter spec as JSON")
        parser.add_argument("--scene", action="append", metavar="S")
        parser.add_argument("--batch", action="append", metavar="ID|NAME")
        parser.add_argument("--model", action="append", metavar="M")
        parser.add_argument("--min-score", type=float, metavar="X")
        parser.add_argument("--accepted-only", action="store_true")
        parser.add_argument("--success-only", action="store_true")
        parser.add_argument("--prefer-corrections", action="store_true",
                            help="a trajectory a reviewer corrected is replaced by its latest correction")
        parser.add_argument("--min-reward", type=float, metavar="X")
        parser.add_argument("--since", metavar="DATE")
        parser.add_argument("--until", metavar="DATE")
        parser.add_argument("--dedup-threshold", type=float, metavar="COS")
        parser.add_argument("--no-exact-dedup", action="store_true")
        parser.add_argument("--no-near-dedup", action="store_true", help="skip the embedding model entirely")
        parser.add_argument("--decontam", action="append", metavar="TESTSET",
                            help="drop members matching this benchmark test set (TESTSET.jsonl or .txt in "
                                 "DATASET_TESTSET_DIR); repeatable")
        parser.add_argument("--decontam-ngram", type=int, metavar="N", help="word n-gram size (default 13)")
        parser.add_argument("--decontam-overlap", type=float, metavar="X",
                            help="share of a test item's n-grams that marks a match (default 0.5)")
        parser.add_argument("--decontam-cosine", type=float, metavar="COS",
                            help="MiniLM cosine that marks a match (default 0.9)")
        parser.add_argument("--no-decontam-embedding", action="store_true", help="n-gram overlap only")
        parser.add_argument("--validation-fraction", type=float, metavar="F", help="share of tasks (default 0.1)")
        parser.add_argument("--split-seed", type=int, metavar="N")
        parser.add_argument("--parent", type=int, metavar="N", help="parent version number")
        parser.add_argument("--notes", default="")
        parser.add_argument("--publish", action="store_true",
                            help="publish the new version at once (after its exportability is measured)")
        parser.add_argument("--no-wait", action="store_true",
                            help="return once the version is written; the workers measure its exportability")
        parser.add_argument("--user", metavar="USERNAME", help="act as this user (their permissions apply)")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["publish"] and options["no_wait"]:
            raise CommandError("--publish needs the exportability counts: it cannot be given with --no-wait")
        actor = resolve_user(options.get("user"))
        spec = _spec_from(options)
        parent = get_version(options["name"], options["parent"]) if options.get("parent") else None
        bar = ProgressBar(self.stderr._out, enabled=not options["no_progress"])
        try:
            version = dataset_version_create(
                dataset_name=options["name"], filter_spec=spec, actor=actor, parent=parent, notes=options["notes"],
                progress=bar, wait_exportability=not options["no_wait"],
            )
            pending = exportability_pending(version)
            if options["publish"] and (pending is None or pending.status != pending.Status.FAILED):
                version = dataset_version_publish(version=version, actor=actor)
        except (DatasetError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None
        finally:
            bar.close()
        c = version.counts
        self.stdout.write(self.style.SUCCESS(
            f"{version} ({version.status}): {c['members']} trajectories from {c['tasks']} tasks "
            f"(train {c['train']}, validation {c['validation']}); {c['in_scope']} in scope, "
            f"{c['excluded_by_filter']} excluded by the filter, {c['excluded_as_duplicates']} as duplicates"
            + (f", {c['excluded_as_contaminated']} as contaminated" if c.get("excluded_as_contaminated") else "")
        ))
        diff = version.data_card.get("diff")
        if diff:
            self.stdout.write(f"against v{diff['parent']}: +{len(diff['added'])} added, "
                              f"-{len(diff['removed'])} removed, {diff['kept']} kept")
        if version.is_published:
            for warning in publish_warnings(version):
                self.stderr.write(self.style.WARNING(f"warning: {warning}"))
        self.stdout.write(f"details: manage.py dataset_stats {version.dataset.name} --version {version.number}")
        if pending is not None and pending.status == pending.Status.FAILED:
            raise CommandError(f"{version} was written, but its exportability measurement failed ({pending.error}); "
                               "it cannot be exported or published: build the version again")
        if pending is not None:
            self.stdout.write(f"exportability: queued for the workers ({pending.total} members); exports and "
                              "publishing open when it is done")
