from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate


def register_rollout_schedules(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """After `migrate`: make sure the rollout reaper is scheduled (idempotent).

    Done here rather than by hand so that every database the worker cluster serves has it:
    `make worker` migrates first, and so does every deploy. `manage.py synthesize` calls
    `ensure_schedules()` as well.
    """
    from django_q.models import Schedule

    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return  # django_q not migrated on this database (e.g. `migrate tasks` alone)
    from apps.tasks.jobs import ensure_schedules

    ensure_schedules(using=using)


def reap_at_worker_start(sender: Any = None, **kwargs: Any) -> None:
    """django-q2's post_spawn, in each worker process it starts: re-queue what dead rollout
    processes of this host held and dispatch a job (apps.tasks.jobs.on_worker_start)."""
    from apps.tasks.jobs import on_worker_start

    on_worker_start()


class TasksConfig(AppConfig):
    name = "apps.tasks"
    label = "tasks"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        post_migrate.connect(register_rollout_schedules, sender=self, dispatch_uid="tasks.register_rollout_schedules")
        post_spawn.connect(reap_at_worker_start, dispatch_uid="tasks.reap_at_worker_start")
