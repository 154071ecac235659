from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "apps.datasets"
    label = "datasets"

    def ready(self) -> None:
        from trajplatform.schedules import register_periodic  # deferred: AppConfig.ready pattern (django_q's models load first)

        register_periodic("apps.datasets.jobs.ensure_export_schedules")
        from apps.datasets.embedding_jobs import embed_finished_iteration  # deferred: AppConfig.ready pattern
        from apps.tasks.signals import iteration_finished  # deferred: AppConfig.ready pattern

        iteration_finished.connect(embed_finished_iteration, dispatch_uid="datasets.embed_finished_iteration")
