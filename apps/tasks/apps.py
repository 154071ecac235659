from django.apps import AppConfig
from django.db.models.signals import post_migrate, post_save


class TasksConfig(AppConfig):
    name = "apps.tasks"
    label = "tasks"

    def ready(self) -> None:
        from django_q.signals import post_spawn  # deferred: AppConfig.ready pattern (it imports django_q's models)

        from apps.engines.mcp.records import set_trajectory_reader  # deferred: AppConfig.ready pattern (the engine core loads the LLM client)
        from apps.tasks import jobs, selectors, services  # deferred: AppConfig.ready pattern (the receivers' modules need the models)

        post_migrate.connect(jobs.register_rollout_schedules, sender=self, dispatch_uid="tasks.register_rollout_schedules")
        # django-q2's post_spawn, in each worker process it starts: re-queue what dead rollout
        # processes of this host held and dispatch a job.
        post_spawn.connect(jobs.on_worker_start, dispatch_uid="tasks.reap_at_worker_start")
        post_save.connect(services.task_saved, sender="tasks.Task", dispatch_uid="tasks.task_saved")
        # Replays (the MCP hub, the live web) read stored trajectories through this reader.
        set_trajectory_reader(selectors.trajectory_replay_record)
