"""Importing EnvScaler environments and scenarios as one batch of envscaler tasks, all or nothing.

    batch = envscaler_import(metadata=[...], scenarios=[...], actor=user, batch_name="clinic")

The envscaler scene validates the input (apps/engines/scenes/envscaler/importer.py: the static
checks here, the environment code and check functions inside a sandbox) and returns the task
rows; this service writes them through the tasks services: one batch with one task per
scenario, its `tasks.batch_import` audit row and an `engines.envscaler_import` row.
"""
from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.engines.scenes.envscaler import importer
from apps.tasks.services import batch_free_name, batch_import
from trajplatform.audit import audit_record


def envscaler_import(*, metadata: Any, scenarios: Any, actor: Any, batch_name: str | None = None,
                     source_name: str = "", dry_run: bool = False) -> Any:
    """Validate EnvScaler metadata + scenarios and create one batch of envscaler tasks, all or nothing.

    Raises EnvScalerImportError (with every per-item error) and writes nothing when anything is
    invalid. With dry_run the validated task rows are returned instead of a batch.
    """
    rows = importer.validate_inputs(metadata=metadata, scenarios=scenarios)
    if dry_run:
        return rows
    envs = sorted({row["scene_config"]["env_name"] for row in rows})
    digest = importer.input_digest(metadata, scenarios)
    with transaction.atomic():
        # A name given is the batch's (taken: BatchNameTaken); a generated one gets " (2)", ... if needed.
        name = batch_name or batch_free_name(f"envscaler: {', '.join(envs)}")
        batch = batch_import(rows=rows, name=name, source_name=source_name or "envscaler upload",
                             source_sha256=digest, source_format="envscaler", actor=actor)
        audit_record("engines.envscaler_import", actor=actor, target=batch, data={
            "environments": envs, "task_count": len(rows), "source_sha256": digest,
        })
    return batch
