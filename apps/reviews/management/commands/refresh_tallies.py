"""`manage.py refresh_tallies [--full] [--no-team]`: the workers' tally jobs, run now."""
from __future__ import annotations

import argparse
import time
from typing import Any

from django.core.management.base import BaseCommand

from apps.reviews import tallies


class Command(BaseCommand):
    help = ("Run the workers' tally jobs now (apps.reviews.tallies; the schedules run them every "
            f"{tallies.BATCH_TALLY_EVERY_MINUTES} minutes): recount the batch tallies of the batches changed since "
            "their last count and of those never counted (the batch page's spend and accepted count, the review "
            "queue's batch progress), then every reviewer's verdicts (the team page). --full recounts every batch: "
            "after changing REVIEW_REVIEWERS_PER_ITEM or REVIEW_AUDIT_SHARE, or to check the incremental count.")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--full", action="store_true",
                            help="recount every batch, changed or not (exact, and slower: linear in all the data)")
        parser.add_argument("--no-team", action="store_true", help="leave the team tally as it is")

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        batches = tallies.refresh_batch_tallies(full=options["full"])
        scope = "every batch" if options["full"] else "the batches changed since their last count"
        self.stdout.write(f"Recounted {batches} batch tally(ies): {scope}, in {time.monotonic() - started:.1f} s.")
        if not options["no_team"]:
            started = time.monotonic()
            people = tallies.refresh_team_tally()
            self.stdout.write(f"Recounted the team tally of {people} reviewer(s) in {time.monotonic() - started:.1f} s.")
