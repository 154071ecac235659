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
    from trajplatform.permissions import sync_role_groups  # deferred: AppConfig module (auth's models load after it)

    sync_role_groups()


def _register_webhook_sweep(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    from trajplatform.schedules import schedules_migrated  # deferred: AppConfig module (django_q's models load after it)

    if not schedules_migrated(using):
        return
    from trajplatform.artifacts import ensure_sweep_schedule  # deferred: AppConfig module (models load after it)
    from trajplatform.webhooks import ensure_webhook_schedule  # deferred: AppConfig module (models load after it)

    ensure_webhook_schedule(using=using)
    ensure_sweep_schedule(using=using)


class TrajplatformConfig(AppConfig):
    """Shared infrastructure: the audit log and the role groups."""

    name = "trajplatform"
    verbose_name = "Platform"

    def ready(self) -> None:
        from trajplatform import checks  # noqa: F401  # deferred: AppConfig.ready pattern (registers the deploy checks)

        from trajplatform.schedules import register_periodic  # deferred: AppConfig.ready pattern (django_q's models load first)

        # By dotted path: the overview's job reads the apps above this one.
        register_periodic("trajplatform.overview.ensure_activity_schedule")
        post_migrate.connect(_sync_roles_after_migrate, dispatch_uid="trajplatform.sync_roles")
        post_migrate.connect(_register_webhook_sweep, sender=self, dispatch_uid="trajplatform.webhook_sweep")
