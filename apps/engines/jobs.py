"""Engine jobs (django-q2): the sandbox reconciler, the warm-pool refill, and their schedule.

Both jobs are safe to run twice or concurrently: every destroy is a compare-and-swap on
the SandboxRecord row (see `apps.engines.sandbox_records`), and the pool is claimed the
same way. Register the schedule once per deployment with `ensure_sandbox_schedules()`
(idempotent; e.g. from a post-migrate hook or a setup command).

Local sandboxes exist only on the machine that made them, so the reconciler acts on the
local rows of the host its worker runs on; run a django-q2 cluster on every worker host.
"""
from __future__ import annotations

import logging
from typing import Any

from apps.engines import sandbox_records
from apps.engines.sandboxes.pool import pool_size
from trajplatform.schedules import ensure_schedule

logger = logging.getLogger("apps.engines.jobs")

RECONCILE_SCHEDULE_NAME = "engines.reconcile_sandboxes"
RECONCILE_FUNC = "apps.engines.jobs.reconcile_sandboxes"
RECONCILE_EVERY_MINUTES = 2


def reconcile_sandboxes() -> dict[str, Any]:
    """Destroy sandboxes no live row owns, whose owner finished or whose TTL passed; refill the pool."""
    report = sandbox_records.reconcile_sandboxes()
    result: dict[str, Any] = report.as_dict()
    if pool_size():
        try:
            result["pool"] = sandbox_records.fill_pool()
        except Exception as exc:  # the reaping above already happened; report, do not lose it
            logger.exception("sandbox pool refill failed")
            result["errors"].append(f"pool: {exc}")
    reaped = sum(result[k] for k in ("expired", "owner_finished", "stuck_creating", "orphaned"))
    if reaped or result["vanished"] or result["errors"]:
        logger.info("sandbox reconciler: %s", result)
    return result


def fill_sandbox_pool() -> dict[str, int]:
    """Top the warm sandbox pool up to SANDBOX_POOL_SIZE (no-op when it is full or disabled)."""
    if not pool_size():
        return {"created": 0, "trimmed": 0, "size": 0}
    return sandbox_records.fill_pool()


def ensure_sandbox_schedules(*, minutes: int = RECONCILE_EVERY_MINUTES, using: str = "default") -> Any:
    """Register the sandbox reconciler's django-q2 Schedule (idempotent); returns it."""
    return ensure_schedule(name=RECONCILE_SCHEDULE_NAME, func=RECONCILE_FUNC, minutes=minutes, using=using)
