from typing import Any

from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate


def _sync_roles_after_migrate(sender: AppConfig, **kwargs: Any) -> None:
    # post_migrate fires once per app that has a models module, after auth has created that
    # app's permissions; syncing after the last such app covers every model, including ones
    # added later (apps without models, e.g. static-file packages, get no signal).
    with_models = [config for config in apps.get_app_configs() if config.models_module is not None]
    if sender.label != with_models[-1].label:
        return
    from trajplatform.permissions import sync_role_groups

    sync_role_groups()


def _register_webhook_sweep(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    from django.db import connections
    from django_q.models import Schedule

    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return
    from trajplatform.artifacts import ensure_sweep_schedule
    from trajplatform.webhooks import ensure_webhook_schedule

    ensure_webhook_schedule(using=using)
    ensure_sweep_schedule(using=using)


class TrajplatformConfig(AppConfig):
    """Shared infrastructure: the audit log and the role groups."""

    name = "trajplatform"
    verbose_name = "Platform"

    def ready(self) -> None:
        from trajplatform import checks  # noqa: F401  (registers the deploy checks)

        post_migrate.connect(_sync_roles_after_migrate, dispatch_uid="trajplatform.sync_roles")
        post_migrate.connect(_register_webhook_sweep, sender=self, dispatch_uid="trajplatform.webhook_sweep")
        from django.conf import settings

        if settings.PLATFORM_SKILLS_URL:
            # VibeDataBot's skill manifest decides the enabled scenes; unreachable: refuse to start.
            from trajplatform.skills import load_skills

            load_skills()
