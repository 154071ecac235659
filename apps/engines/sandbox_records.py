"""Writes to SandboxRecord: the row lifecycle, the warm pool, operator destroys and the reconciler.

The sandbox layer writes no rows itself: it reports to a `SandboxReporter`, and
`RecordsReporter` here turns the reports into `record_begin` / `record_ready` /
`record_failed` / `record_destroyed` / `record_error` and claims warm sandboxes from the
pool's rows. EnginesConfig.ready installs it (`install()`), so every process that loads the
apps writes the same rows. Those are bookkeeping and write no audit rows. Decisions someone (or the reconciler) takes about a sandbox —
destroying it from the console, reaping it — go through `sandbox_destroy_records` and
`reconcile_sandboxes`, which audit each sandbox they destroy.

Every transition is a compare-and-swap on `destroyed_at IS NULL` / `state`, so a job that
runs twice, or two workers reaping at once, destroy and audit each sandbox once.
"""
from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterable

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.engines.models import SandboxRecord
from apps.engines.sandboxes import (
    MANAGED_LABEL,
    RECORD_LABEL,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxNotFound,
    SandboxReporter,
    SandboxSpec,
    get_backend,
    set_reporter,
)
from apps.engines.sandboxes.pool import pool_key, pools
from trajplatform.audit import audit_record
from trajplatform.schedules import enqueue

logger = logging.getLogger("apps.engines.sandboxes")

# A sandbox the backend lists but no row owns is left alone this long: its row may be in a
# transaction that has not committed yet.
ORPHAN_GRACE = timedelta(minutes=10)
# A row stuck in `creating` this long belongs to a worker that died mid-create.
CREATING_GRACE = timedelta(minutes=10)
MAX_ERROR_CHARS = 4000


def this_host() -> str:
    return socket.gethostname()[:200]


def _host_scoped(backend_name: str) -> bool:
    # A local sandbox exists only on the machine that made it; remote ones are visible from anywhere.
    return backend_name == "local"


def live_records(backend_name: str):
    """Live rows of a backend that this machine can act on."""
    qs = SandboxRecord.objects.filter(backend=backend_name, state__in=SandboxRecord.LIVE)
    if _host_scoped(backend_name):
        qs = qs.filter(host=this_host())
    return qs


# --- bookkeeping called by the backends ---------------------------------------------------------


def record_begin(*, backend: str, spec: SandboxSpec, trajectory: Any = None, pool_key: str = "") -> SandboxRecord:
    """Insert the `creating` row before the backend is asked for the sandbox."""
    return SandboxRecord.objects.create(
        backend=backend,
        state=SandboxRecord.State.CREATING,
        host=this_host(),
        image=spec.image or "",
        labels=dict(spec.labels),
        spec=spec.limits(),
        pool_key=pool_key,
        trajectory_id=getattr(trajectory, "pk", trajectory),
    )


def record_ready(*, record_id: int, sandbox: Sandbox, pooled: bool = False) -> None:
    """The backend answered: store its id, labels, expiry and downgrades; `creating` -> ready/pooled."""
    updated = SandboxRecord.objects.filter(pk=record_id, state=SandboxRecord.State.CREATING).update(
        state=SandboxRecord.State.POOLED if pooled else SandboxRecord.State.READY,
        external_id=sandbox.id,
        labels=sandbox.labels,
        downgrades=sandbox.downgrades,
        expires_at=sandbox.expires_at,
        ready_at=timezone.now(),
    )
    if not updated:
        # The reconciler gave up on this row meanwhile; the sandbox must not outlive that.
        raise SandboxError(f"sandbox record {record_id} is no longer 'creating'; refusing to hand out {sandbox.id}")


def record_failed(*, record_id: int, error: str) -> None:
    """Creating failed: `creating` -> failed, with the error."""
    SandboxRecord.objects.filter(pk=record_id, state=SandboxRecord.State.CREATING).update(
        state=SandboxRecord.State.FAILED,
        last_error=error[:MAX_ERROR_CHARS],
        destroyed_at=timezone.now(),
        destroy_reason="creation failed",
    )


def record_destroyed(*, backend: str, external_id: str, reason: str) -> bool:
    """Mark the live row of a destroyed sandbox; True if this call made the change."""
    return bool(records_destroyed(backend=backend, external_ids=[external_id], reason=reason))


def records_destroyed(*, backend: str, external_ids: list[str], reason: str) -> int:
    """record_destroyed for many sandboxes of one backend, in one UPDATE; the rows it changed."""
    return SandboxRecord.objects.filter(
        backend=backend, external_id__in=external_ids, destroyed_at__isnull=True
    ).update(
        state=SandboxRecord.State.DESTROYED,
        destroyed_at=timezone.now(),
        destroy_reason=reason[:200],
    )


def record_error(*, backend: str, external_id: str, error: str) -> None:
    """Remember the latest infrastructure error seen on a sandbox (shown in the console)."""
    SandboxRecord.objects.filter(backend=backend, external_id=external_id).update(last_error=error[:MAX_ERROR_CHARS])


# --- decisions (audited) ------------------------------------------------------------------------


def _destroy_one(record: SandboxRecord, *, backend: SandboxBackend, reason: str, action: str, actor: Any) -> bool:
    """Destroy one live row's sandbox; the row, the audit event and the backend agree, or it raises."""
    from_state = record.state
    if record.external_id:
        # Backend first: a row marked destroyed over a sandbox still running is the leak we
        # exist to prevent. destroy() is idempotent, so a retry after a crash is harmless.
        backend._destroy(record.external_id)
    with transaction.atomic():
        won = SandboxRecord.objects.filter(pk=record.pk, destroyed_at__isnull=True).update(
            state=SandboxRecord.State.DESTROYED,
            destroyed_at=timezone.now(),
            destroy_reason=reason[:200],
        )
        if not won:
            return False  # someone else recorded it first; their audit row stands
        record.refresh_from_db()
        audit_record(
            action,
            actor=actor,
            target=record,
            data={"backend": record.backend, "external_id": record.external_id, "reason": reason, "from": from_state},
        )
    return True


def sandbox_destroy_records(
    *, records: Iterable[SandboxRecord], actor: Any, reason: str = "destroyed by an operator"
) -> int:
    """Destroy the sandboxes of the given rows (console action); returns how many this call destroyed."""
    destroyed = 0
    backends: dict[str, SandboxBackend] = {}
    for record in records:
        if record.state not in SandboxRecord.LIVE:
            continue
        if _host_scoped(record.backend) and record.host != this_host():
            raise SandboxError(
                f"{record} lives on {record.host}; destroy it from that machine (local sandboxes are per host)"
            )
        backend = backends.get(record.backend) or backends.setdefault(record.backend, get_backend(record.backend))
        if _destroy_one(record, backend=backend, reason=reason, action="engines.sandbox_destroy", actor=actor):
            destroyed += 1
    return destroyed


@dataclass
class ReconcileReport:
    """What one reconciler pass did, per reason; `errors` are per-backend problems it skipped."""

    expired: int = 0
    owner_finished: int = 0
    stuck_creating: int = 0
    orphaned: int = 0
    vanished: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "expired": self.expired,
            "owner_finished": self.owner_finished,
            "stuck_creating": self.stuck_creating,
            "orphaned": self.orphaned,
            "vanished": self.vanished,
            "errors": self.errors,
        }


def reconcile_backend(backend: SandboxBackend, *, now=None, report: ReconcileReport | None = None) -> ReconcileReport:
    """Destroy what the database does not own or whose TTL passed, on one backend.

    1. live rows past `expires_at`                              -> destroyed ("ttl")
    2. rows owned by a trajectory that finished or was cancelled -> destroyed ("owner finished")
    3. rows stuck in `creating` (the worker died mid-create)     -> their sandbox, if any, destroyed
    4. platform sandboxes the backend lists that no live row owns, older than ORPHAN_GRACE
                                                                 -> destroyed, a row records it
    5. live rows whose sandbox the backend no longer has         -> marked destroyed ("vanished")
    """
    # The owner's model through the row's foreign key: this layer sits below apps.tasks.
    owner_final = list(SandboxRecord._meta.get_field("trajectory").related_model.FINAL)
    now = now or timezone.now()
    report = report or ReconcileReport()
    name = backend.name

    def reap(record: SandboxRecord, reason: str) -> bool:
        try:
            return _destroy_one(record, backend=backend, reason=reason, action="engines.sandbox_reap", actor=None)
        except Exception as exc:  # one bad sandbox must not stop the pass
            report.errors.append(f"{record}: {exc}")
            SandboxRecord.objects.filter(pk=record.pk).update(last_error=f"reaping failed: {exc}"[:MAX_ERROR_CHARS])
            return False

    for record in live_records(name).filter(expires_at__lt=now).exclude(state=SandboxRecord.State.CREATING):
        report.expired += reap(record, "ttl passed")

    finished = live_records(name).filter(
        state=SandboxRecord.State.READY, trajectory__status__in=owner_final
    ).select_related("trajectory")
    for record in finished:
        report.owner_finished += reap(record, f"owning trajectory {record.trajectory_id} is {record.trajectory.status}")

    stuck = list(live_records(name).filter(state=SandboxRecord.State.CREATING, created_at__lt=now - CREATING_GRACE))

    listed_at = timezone.now()
    listing = backend.list({MANAGED_LABEL: "true"})
    listed = {info.id: info for info in listing}

    stuck_ids = {r.pk for r in stuck}
    for record in stuck:
        # Claim the row first so a late `record_ready` from a still-alive worker refuses.
        if not SandboxRecord.objects.filter(pk=record.pk, state=SandboxRecord.State.CREATING).update(
            state=SandboxRecord.State.FAILED, destroyed_at=now, destroy_reason="creation interrupted",
            last_error="the worker creating it stopped before the backend answered",
        ):
            continue
        for info in listing:
            if info.record_id == record.pk:
                backend._destroy(info.id)
                listed.pop(info.id, None)
                with transaction.atomic():
                    SandboxRecord.objects.filter(pk=record.pk).update(external_id=info.id)
                    record.refresh_from_db()
                    audit_record("engines.sandbox_reap", target=record, data={
                        "backend": name, "external_id": info.id, "reason": "creation interrupted", "from": "creating",
                    })
        report.stuck_creating += 1

    owned = set(
        SandboxRecord.objects.filter(backend=name, state__in=SandboxRecord.LIVE).exclude(external_id="")
        .values_list("external_id", flat=True)
    )
    creating = set(
        SandboxRecord.objects.filter(backend=name, state=SandboxRecord.State.CREATING).values_list("pk", flat=True)
    )
    for sandbox_id, info in listed.items():
        if sandbox_id in owned or (info.record_id in creating and info.record_id not in stuck_ids):
            continue
        if info.created_at is not None and info.created_at > now - ORPHAN_GRACE:
            continue
        try:
            backend._destroy(sandbox_id)
        except Exception as exc:
            report.errors.append(f"{name}:{sandbox_id}: {exc}")
            continue
        with transaction.atomic():
            record, _ = SandboxRecord.objects.get_or_create(
                backend=name, external_id=sandbox_id,
                defaults={"state": SandboxRecord.State.DESTROYED, "host": this_host(), "image": info.image,
                          "labels": info.labels, "destroyed_at": now, "destroy_reason": "orphan: no row owned it"},
            )
            SandboxRecord.objects.filter(pk=record.pk, destroyed_at__isnull=True).update(
                state=SandboxRecord.State.DESTROYED, destroyed_at=now, destroy_reason="orphan: no row owned it"
            )
            audit_record("engines.sandbox_reap", target=record, data={
                "backend": name, "external_id": sandbox_id, "reason": "orphan: no row owned it",
                "labels": info.labels,
            })
        report.orphaned += 1

    vanished = live_records(name).exclude(external_id="").exclude(external_id__in=list(listed)).filter(
        ready_at__lt=listed_at
    ).exclude(state=SandboxRecord.State.CREATING)
    for record in vanished:
        report.vanished += SandboxRecord.objects.filter(pk=record.pk, destroyed_at__isnull=True).update(
            state=SandboxRecord.State.DESTROYED, destroyed_at=now, destroy_reason="vanished from the backend",
        )
    return report


def backends_to_reconcile() -> list[str]:
    """The configured backend plus any backend that still has live rows."""
    names = {settings.SANDBOX_BACKEND}
    names |= set(SandboxRecord.objects.filter(state__in=SandboxRecord.LIVE).values_list("backend", flat=True).distinct())
    return sorted(names)


def reconcile_sandboxes(*, backend_names: Iterable[str] | None = None, now=None) -> ReconcileReport:
    """One reconciler pass over every relevant backend (see `reconcile_backend`)."""
    report = ReconcileReport()
    for name in backend_names or backends_to_reconcile():
        try:
            backend = get_backend(name)
            reconcile_backend(backend, now=now, report=report)
        except Exception as exc:
            logger.exception("sandbox reconciler: backend %s failed", name)
            report.errors.append(f"{name}: {exc}")
    return report


# --- the warm pool ------------------------------------------------------------------------------


def claim_pooled(backend: SandboxBackend, spec: SandboxSpec, trajectory: Any) -> Sandbox | None:
    """A warm sandbox of `spec`'s shape, now owned by `trajectory` (a refill is queued), or None
    when no pool of this shape is configured or it has none left."""
    key = pool_key(backend.name, spec)
    if not any(size and key == pool_key(backend.name, shape) for shape, size in pools()):
        return None
    sandbox = _claim(backend, key, spec, trajectory)
    if sandbox is not None:
        _queue_refill()
    return sandbox


def _claim(backend: SandboxBackend, key: str, spec: SandboxSpec, trajectory: Any) -> Sandbox | None:
    candidates = live_records(backend.name).filter(state=SandboxRecord.State.POOLED, pool_key=key)
    for record in candidates.order_by("created_at")[:10]:
        now = timezone.now()
        expires_at = now + spec.ttl if spec.ttl else None
        won = SandboxRecord.objects.filter(pk=record.pk, state=SandboxRecord.State.POOLED).update(
            state=SandboxRecord.State.READY, pool_key="", claimed_at=now, expires_at=expires_at,
            trajectory_id=getattr(trajectory, "pk", trajectory), labels=dict(spec.labels),
        )
        if not won:
            continue  # another worker took it
        try:
            sandbox = backend.get(record.external_id)
            labels = {**spec.labels, MANAGED_LABEL: "true", RECORD_LABEL: str(record.pk)}
            sandbox._relabel(labels, expires_at, dict(spec.env))
        except (SandboxNotFound, SandboxError) as exc:
            logger.warning("warm sandbox %s unusable (%s); destroying it", record, exc)
            try:
                backend.destroy(record.external_id, reason=f"unusable from the pool: {exc}")
            except SandboxError:
                pass
            continue
        SandboxRecord.objects.filter(pk=record.pk).update(labels=sandbox.labels)
        sandbox.record_id = record.pk
        return sandbox
    return None


def _queue_refill() -> None:
    try:
        enqueue("apps.engines.jobs.fill_sandbox_pool", task_name="engines.fill_sandbox_pool")
    except Exception:  # the reconciler's pass refills too; never fail a rollout over this
        logger.exception("could not queue a sandbox pool refill")


def fill_pool(backend: SandboxBackend | None = None) -> dict[str, int]:
    """Create or destroy pooled sandboxes until each pool holds its configured size (a pool no
    longer configured holds none); returns counts over all pools."""
    backend = backend or get_backend()
    configured = pools()
    sizes = {pool_key(backend.name, shape): (shape, size) for shape, size in configured}
    live = live_records(backend.name).filter(
        state__in=[SandboxRecord.State.POOLED, SandboxRecord.State.CREATING]).exclude(pool_key="")
    for key in set(live.values_list("pool_key", flat=True)) - set(sizes):
        sizes[key] = (None, 0)  # a pool no longer configured: trim it all
    created = trimmed = 0
    for key, (shape, size) in sizes.items():
        pooled = live.filter(pool_key=key)
        have = pooled.count()
        for _ in range(max(0, size - have)):
            try:
                backend.create(shape, pool_key=key)
                created += 1
            except SandboxError:
                logger.exception("filling the sandbox pool of %s failed", shape.image or "the default image")
                break
        if have > size:
            for record in pooled.filter(state=SandboxRecord.State.POOLED).order_by("created_at")[: have - size]:
                if SandboxRecord.objects.filter(pk=record.pk, state=SandboxRecord.State.POOLED).update(
                    state=SandboxRecord.State.READY, pool_key=""
                ):
                    backend.destroy(record.external_id, reason="pool shrunk")
                    trimmed += 1
    return {"created": created, "trimmed": trimmed, "size": sum(size for _, size in configured)}


# --- the reporter the sandbox layer talks to ------------------------------------------------------


class RecordsReporter(SandboxReporter):
    """Keeps a SandboxRecord row per sandbox and claims warm sandboxes from the pool's rows."""

    def begin(self, *, backend: str, spec: SandboxSpec, trajectory: Any, pool_key: str) -> int:
        return record_begin(backend=backend, spec=spec, trajectory=trajectory, pool_key=pool_key).pk

    def ready(self, *, record_id: int, sandbox: Sandbox, pooled: bool) -> None:
        record_ready(record_id=record_id, sandbox=sandbox, pooled=pooled)

    def failed(self, *, record_id: int, error: str) -> None:
        record_failed(record_id=record_id, error=error)

    def destroyed(self, *, backend: str, external_id: str, reason: str) -> None:
        record_destroyed(backend=backend, external_id=external_id, reason=reason)

    def error(self, *, backend: str, external_id: str, error: str) -> None:
        record_error(backend=backend, external_id=external_id, error=error)

    def claim(self, backend: SandboxBackend, spec: SandboxSpec, trajectory: Any) -> Sandbox | None:
        return claim_pooled(backend, spec, trajectory)


def install() -> None:
    """Make the sandbox layer of this process report to the SandboxRecord rows (EnginesConfig.ready)."""
    set_reporter(RecordsReporter())
