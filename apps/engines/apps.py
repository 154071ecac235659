from django.apps import AppConfig
from django.conf import settings


class EnginesConfig(AppConfig):
    name = "apps.engines"
    label = "engines"

    def ready(self) -> None:
        # The sandbox layer imports no app; it reports to the reporter installed here, which
        # keeps the SandboxRecord rows, in every process that loads the apps.
        from apps.engines import sandbox_records  # deferred: AppConfig.ready pattern (needs the app registry)
        from trajplatform.schedules import register_periodic  # deferred: AppConfig.ready pattern (django_q's models load first)

        sandbox_records.install()
        # Scenes import no app: the rows they read and the tasks they emit go through the
        # platform store installed here (apps.engines.generation.platform_store).
        from apps.engines.pipelines import store  # deferred: AppConfig.ready pattern (imports the tasks app)

        store.install()
        # The toucan scene reads the registered MCP servers through the registry installed here.
        from apps.engines import mcp_servers  # deferred: AppConfig.ready pattern (needs the app registry)

        mcp_servers.install()
        # Embeddings are kept in TextEmbedding rows: the store installed here (embeddings imports no model).
        from apps.engines import embedding_store  # deferred: AppConfig.ready pattern (needs the app registry)

        embedding_store.install()
        register_periodic("apps.engines.jobs.ensure_sandbox_schedules")
        register_periodic("apps.engines.pipelines.services.ensure_pipeline_schedules")
        if settings.PLATFORM_SKILLS_URL:
            # VibeDataBot's skill manifest decides the enabled scenes; unreachable: refuse to start.
            from trajplatform.skills import load_skills  # deferred: AppConfig.ready pattern (imports every scene)

            load_skills()
