from typing import Any

from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate


def _sync_roles_after_migrate(sender: AppConfig, **kwargs: Any) -> None:
    # post_migrate fires once per app, after auth has created that app's permissions;
    # syncing after the last app covers every model, including ones added later.
    if sender.label != list(apps.get_app_configs())[-1].label:
        return
    from trajplatform.permissions import sync_role_groups

    sync_role_groups()


class TrajplatformConfig(AppConfig):
    """Shared infrastructure: the audit log and the role groups."""

    name = "trajplatform"
    verbose_name = "Platform"

    def ready(self) -> None:
        post_migrate.connect(_sync_roles_after_migrate, dispatch_uid="trajplatform.sync_roles")
