"""The overview's daily activity: one row per UTC day, derived from trajectories and reviews.

A cache of aggregates, not a record: `trajplatform.overview.refresh_activity` (a scheduled job
on the workers) recomputes the rows from the trajectory and review tables, so the overview's
charts read 14 small rows instead of aggregating every trajectory of a fortnight in the web
request. Being derived, the rows are rewritten without audit rows; nothing else writes them.
"""
from __future__ import annotations

from django.db import models


class ActivityDay(models.Model):
    """What finished on one UTC day (by the top-level trajectory's finished_at) and what it cost."""

    day = models.DateField(unique=True)
    finished = models.PositiveIntegerField(default=0, help_text="top-level trajectories finished (status finished)")
    succeeded = models.PositiveIntegerField(default=0, help_text="of those, outcome success")
    accepted = models.PositiveIntegerField(
        default=0, help_text="of those, accepted: a human accept where a human reviewed it, else a success")
    human_reviewed = models.PositiveIntegerField(default=0, help_text="of those, with a human verdict")
    cost_usd = models.DecimalField(max_digits=16, decimal_places=6, default=0,
                                   help_text="the day's trajectories' recorded cost (cancelled ones too), no judge")
    judge_usd = models.DecimalField(max_digits=16, decimal_places=6, default=0,
                                    help_text="the judge's calls on the day's trajectories")
    awaiting_review = models.PositiveIntegerField(
        null=True, blank=True, help_text="the human review queue's size when computed (a past day: at its last run)")
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["day"]
        verbose_name_plural = "activity days"

    def __str__(self) -> str:
        return f"activity of {self.day}"
