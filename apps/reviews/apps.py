from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate


def register_review_schedules(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """After `migrate`: make sure the judge-retry job is scheduled (idempotent)."""
    from django_q.models import Schedule

    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return  # django_q not migrated on this database
    from apps.reviews.jobs import ensure_review_schedule

    ensure_review_schedule(using=using)


class ReviewsConfig(AppConfig):
    name = "apps.reviews"
    label = "reviews"

    def ready(self) -> None:
        post_migrate.connect(register_review_schedules, sender=self, dispatch_uid="reviews.register_review_schedules")
