from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "apps.datasets"
    label = "datasets"

    def ready(self) -> None:
        from trajplatform.schedules import register_periodic  # deferred: AppConfig.ready pattern (django_q's models load first)

        register_periodic("apps.datasets.jobs.ensure_export_schedules")
