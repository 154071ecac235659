"""django-q2 glue: `enqueue` a job, and idempotent registration of the periodic ones.

Each app names the function that registers its Schedules from its AppConfig.ready
(`register_periodic`); `ensure_periodic()` runs them all, after every migrate and from
`manage.py synthesize` (apps.tasks.jobs.ensure_schedules), so no app imports another's jobs to
gather them."""
from __future__ import annotations

from typing import Any

from django.db import connections, transaction
from django.utils.module_loading import import_string
from django_q.models import Schedule
from django_q.tasks import async_task


def schedules_migrated(using: str = "default") -> bool:
    """Whether django_q's tables exist on this database (a post_migrate of `migrate tasks` alone
    may come before them)."""
    return Schedule._meta.db_table in connections[using].introspection.table_names()


def ensure_schedule(*, name: str, func: str, minutes: int, using: str = "default") -> Any:
    """Create the named every-N-minutes Schedule, or bring an existing one in line.

    An existing schedule keeps its next run, so registering again on every deploy never
    postpones the job; duplicates left by two processes racing are removed.
    """
    with transaction.atomic(using=using):
        existing = list(Schedule.objects.using(using).select_for_update().filter(name=name).order_by("pk"))
        if not existing:
            return Schedule.objects.using(using).create(
                name=name, func=func, schedule_type=Schedule.MINUTES, minutes=minutes, repeats=-1
            )
        schedule, extras = existing[0], existing[1:]
        for extra in extras:
            extra.delete()
        wanted = {"func": func, "schedule_type": Schedule.MINUTES, "minutes": minutes, "repeats": -1}
        changed = [field for field, value in wanted.items() if getattr(schedule, field) != value]
        for field in changed:
            setattr(schedule, field, wanted[field])
        if changed:
            schedule.save(update_fields=changed)
        return schedule


def enqueue(func: str, *args: Any, **kwargs: Any) -> Any:
    """django_q.tasks.async_task, inside a transaction of its own (call it on commit).

    On the ORM broker, async_task called in autocommit mode first runs
    close_old_connections(), which with CONN_MAX_AGE=0 closes the caller's database
    connection: a worker finishing trajectories would reconnect (and re-run the connection
    set-up) twice per job it queues. In a transaction the broker leaves the connection alone,
    and the row is committed when the block ends. Other brokers do not touch the database."""
    with transaction.atomic():
        return async_task(func, *args, **kwargs)


# The apps' schedule registrations, by dotted path (filled by AppConfig.ready, in INSTALLED_APPS
# order): naming a function, not importing it, keeps each app's jobs module (and what it
# imports) out of process start-up.
_periodic: list[str] = []


def register_periodic(ensure: str) -> None:
    """Add an app's schedule registration: `ensure` is the dotted path of a function taking
    `using=` that registers its Schedules (with ensure_schedule). Registering twice is a no-op."""
    if ensure not in _periodic:
        _periodic.append(ensure)


def ensure_periodic(*, using: str = "default") -> None:
    """Run every registered schedule registration (each idempotent), in registration order."""
    for path in _periodic:
        import_string(path)(using=using)
