from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "apps.engines"
    label = "engines"

    def ready(self) -> None:
        # The sandbox layer imports no app; it reports to the reporter installed here, which
        # keeps the SandboxRecord rows, in every process that loads the apps.
        from apps.engines import sandbox_records  # deferred: AppConfig.ready pattern (needs the app registry)

        sandbox_records.install()
