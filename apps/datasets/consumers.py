"""The version page's export states over /ws/versions/<id>/exports/, and a version build's
progress over /ws/version-builds/<id>/ (VersionBuildConsumer, at the end).

On subscribe and after each committed change of one of the version's exports (created, claimed,
finished, failed: `export_state_changed`) and of its exportability measurement (queued, each
chunk measured, done, failed), {"type": "exports", "version": id, "jobs": [[job id, status], ...],
"exportability": {"status", "done", "total", "error"} or None for a version without a run}; only
states that differ from the last sent. With the in-memory layer, which the
export workers in other processes cannot reach, the consumer also reads them every
`tail_poll_seconds`. Refusals as for the live log: 4403 (not signed in, no
datasets.view_datasetversion), 4404 (no such version).
"""
from __future__ import annotations

from typing import Any

from apps.datasets.models import DatasetVersion, VersionBuild
from apps.datasets.services import build_group_name, build_state_message, export_group_name, export_states_message
from apps.tasks.consumers import SnapshotConsumer


class ExportStatesConsumer(SnapshotConsumer):
    """Relays a version's "export.states" group messages to a permitted, signed-in client."""

    object_kwarg, model, permission = "version_id", DatasetVersion, "datasets.view_datasetversion"

    def group_for(self, object_id: int) -> str:
        return export_group_name(object_id)

    def snapshot(self, event: dict[str, Any] | None = None) -> dict[str, Any]:
        event = event or export_states_message(self.object_id)
        return {"type": "exports", "version": self.object_id, "jobs": event["jobs"],
                "exportability": event.get("exportability")}

    async def export_states(self, event: dict[str, Any]) -> None:
        """Group message from `export_state_changed`, sent after its transaction commits."""
        await self._relay(event, "version")


class VersionBuildConsumer(SnapshotConsumer):
    """A version build's state ({"type": "build", "build": id, "status", "stage", "done", "total",
    "error", "version_url"}) on subscribe and after each committed change; with the in-memory
    layer (the build runs in a worker process) also read every `tail_poll_seconds`. Refusals as
    above: 4403 (not signed in, no datasets.view_datasetversion), 4404 (no such build)."""

    tail_poll_seconds = 1.0
    object_kwarg, model, permission = "build_id", VersionBuild, "datasets.view_datasetversion"

    def group_for(self, object_id: int) -> str:
        return build_group_name(object_id)

    def snapshot(self, event: dict[str, Any] | None = None) -> dict[str, Any]:
        state = event or build_state_message(self.object_id)
        return {**state, "type": "build"}

    async def build_state(self, event: dict[str, Any]) -> None:
        """Group message from `build_state_changed`, sent after its transaction commits."""
        await self._relay(event, "build")
