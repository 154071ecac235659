"""The platform store (apps.engines.generation.PlatformStore): the rows a scene's pipeline reads
(registered MCP servers, existing tasks), and the tasks a scene emits while its episode runs.

search2qa emits a deep_search task per verified pair, with the passing solver run attached as
its first trajectory. For an emitted task the store validates the item as a task file's
(`validate_task`), creates it with `tasks_create` (validation, audit rows; a pair made again
finds its task by external id) and attaches the run with `trajectory_attach_episode`, in one
transaction, on behalf of the creator of the emitting trajectory's task.
"""
from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Iterator

from django.db import connections, transaction

from apps.engines.generation import TaskSpecError, set_platform_store
from apps.engines.models import McpServer
from apps.tasks.importers import validate_task
from apps.tasks.models import Task, Trajectory
from apps.tasks.services import tasks_create, trajectory_attach_episode


def _validated_fields(item: dict[str, Any]) -> dict[str, Any]:
    _shape, fields, problems = validate_task(item)
    if problems or fields is None:
        raise TaskSpecError(list(problems))
    return fields


def _in_own_thread(fn: Callable[[], Any]) -> Any:
    """Run database work in a thread of its own that closes its connection: the emitting
    episode's worker thread is the event loop's executor, shared with other episodes."""

    def work() -> Any:
        try:
            return fn()
        finally:
            connections.close_all()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="task-store") as pool:
        return pool.submit(work).result()


class DatabaseStore:
    """The PlatformStore the engine app installs: reads the models, writes through apps.tasks.services."""

    def task_prompts(self, scene: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return Task.objects.filter(scene=scene).values_list("prompt", "scene_config").iterator()

    def mcp_servers(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        rows = McpServer.objects.filter(enabled=True).order_by("name")
        if names:
            rows = rows.filter(name__in=names)
        return [{"name": row.name, "spec": row.spec, "labels": row.labels or {}, "tools": list(row.tools or [])}
                for row in rows]

    def task_config(self, item: dict[str, Any]) -> dict[str, Any]:
        return Task(**_validated_fields(item)).config_snapshot()

    def emit(self, item: dict[str, Any], *, source: str, trajectory: Any, attach: Any,
             batch_name: Callable[[str | None], str]) -> dict[str, Any]:
        _validated_fields(item)  # a config error before anything is written

        def write() -> dict[str, Any]:
            origin: dict[str, Any] = {"scene": source}
            actor, source_batch = None, None
            if trajectory is not None:
                row = Trajectory.objects.select_related("task__batch", "task__created_by").get(pk=trajectory.pk)
                origin.update(task=row.task_id, trajectory=str(row.uuid))
                actor = row.task.created_by
                source_batch = row.task.batch.name if row.task.batch is not None else None
            with transaction.atomic():
                result = tasks_create(items=[item], actor=actor, batch_name=batch_name(source_batch), source=source)
                task, created = result.tasks[0], result.created[0]
                attached = None
                if created and attach is not None:
                    attached = trajectory_attach_episode(task=task, result=attach, source=origin, actor=actor)
            return {"task_id": task.pk, "external_id": task.external_id, "batch": result.batch.name,
                    "created": created, "trajectory_id": attached.pk if attached is not None else None,
                    "trajectory_uuid": str(attached.uuid) if attached is not None else None}

        return _in_own_thread(write)


def install() -> None:
    """Make this the platform store (EnginesConfig.ready, in every process)."""
    set_platform_store(DatabaseStore())
