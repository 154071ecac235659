from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "apps.engines"
    label = "engines"

    def ready(self) -> None:
        from trajplatform.schedules import register_periodic  # deferred: AppConfig.ready pattern (django_q's models load first)

        register_periodic("apps.engines.jobs.ensure_sandbox_schedules")
        register_periodic("apps.engines.pipelines.jobs.ensure_pipeline_schedules")
