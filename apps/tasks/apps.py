from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate, post_save


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


def task_saved(sender: Any, instance: Any, created: bool, update_fields: Any = None, **kwargs: Any) -> None:
    """A task saved with its status: its batch's progress group hears of it after commit. A
    signal because a dozen services in tasks and reviews save a task's status; the bulk writes
    (tasks_enqueue, tasks_create) call batch_progress_changed themselves."""
    if created or update_fields is None or "status" in update_fields:
        from apps.tasks.services import batch_progress_changed

        batch_progress_changed([instance.batch_id])


class TasksConfig(AppConfig):
    name = "apps.tasks"
    label = "tasks"

    def ready(self) -> None:
        from django_q.signals import post_spawn

        post_migrate.connect(register_rollout_schedules, sender=self, dispatch_uid="tasks.register_rollout_schedules")
        post_spawn.connect(reap_at_worker_start, dispatch_uid="tasks.reap_at_worker_start")
        post_save.connect(task_saved, sender="tasks.Task", dispatch_uid="tasks.task_saved")
