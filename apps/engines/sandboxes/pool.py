"""Warm pools: ready sandboxes so a rollout does not wait for creation.

One pool per shape: the default spec's (SANDBOX_POOL_SIZE sandboxes) and one per image named
in SANDBOX_POOL_IMAGES ("python:3.11=4,trajplatform-python=2": the default spec with that
image, e.g. what code_exec asks for with a task's `scene_config.image`). Pooled sandboxes are
ordinary sandboxes whose row is in state `pooled` with a `pool_key` naming their shape
(backend, image, limits, network). `acquire(spec)` claims one of the spec's shape by
compare-and-swap on the row (`pooled` -> `ready`), so two workers never get the same sandbox;
then it gives the sandbox the caller's labels, TTL and env. A spec of another shape, an empty
pool or a size of 0 means a fresh `create`.

`fill_pool()` tops every pool up (and trims a pool whose size was lowered or that is no longer
configured); the reconciler job calls it on every pass and `acquire` queues it after taking a
sandbox. Pooled sandboxes have a TTL of their own (POOL_TTL) so a stale pool is recycled by the
reconciler.
"""
from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.engines.models import SandboxRecord
from apps.engines.sandboxes import records
from apps.engines.sandboxes.base import (
    MANAGED_LABEL,
    RECORD_LABEL,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxNotFound,
    SandboxSpec,
)

logger = logging.getLogger("apps.engines.sandboxes")

POOL_TTL = timedelta(hours=6)


def pools() -> list[tuple[SandboxSpec, int]]:
    """The configured pools: (the shape they are filled with, how many), the default shape first.
    A malformed SANDBOX_POOL_IMAGES raises ImproperlyConfigured naming the entry."""
    from django.core.exceptions import ImproperlyConfigured

    found = [(pooled_spec(), max(0, int(getattr(settings, "SANDBOX_POOL_SIZE", 0) or 0)))]
    seen: set[str] = set()
    for entry in str(getattr(settings, "SANDBOX_POOL_IMAGES", "") or "").split(","):
        if not entry.strip():
            continue
        image, _, size = entry.strip().rpartition("=")
        image = image.strip()
        if not image or not size.strip().isdigit():
            raise ImproperlyConfigured(f"SANDBOX_POOL_IMAGES: {entry.strip()!r} is not image=size (e.g. python:3.11=4)")
        if image in seen:
            raise ImproperlyConfigured(f"SANDBOX_POOL_IMAGES names {image!r} twice")
        seen.add(image)
        found.append((pooled_spec(image), int(size)))
    return found


def pool_size() -> int:
    """How many warm sandboxes the pools hold in all (0: no pool)."""
    return sum(size for _, size in pools())


def pool_key(backend_name: str, spec: SandboxSpec) -> str:
    """Which pooled sandboxes can serve `spec`: same backend, image and limits (not env, labels, TTL)."""
    shape = {"backend": backend_name, "image": spec.image or "", **spec.limits()}
    shape.pop("ttl_s")
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:32]


def pooled_spec(image: str | None = None) -> SandboxSpec:
    """The shape a pool is filled with: the default spec (with `image`), living POOL_TTL while it waits."""
    return SandboxSpec(image=image, ttl=POOL_TTL)


def _backend(backend: SandboxBackend | None) -> SandboxBackend:
    from apps.engines.sandboxes import get_backend

    return backend or get_backend()


def acquire(spec: SandboxSpec | None = None, *, trajectory: Any = None, backend: SandboxBackend | None = None) -> Sandbox:
    """A sandbox for `spec` owned by `trajectory`: a warm one if the pool has one of this shape."""
    spec = spec or SandboxSpec()
    backend = _backend(backend)
    if backend.records:
        key = pool_key(backend.name, spec)
        if any(size and key == pool_key(backend.name, shape) for shape, size in pools()):
            sandbox = _claim(backend, key, spec, trajectory)
            if sandbox is not None:
                _queue_refill()
                return sandbox
    return backend.create(spec, trajectory=trajectory)


def _claim(backend: SandboxBackend, key: str, spec: SandboxSpec, trajectory: Any) -> Sandbox | None:
    candidates = records.live_records(backend.name).filter(state=SandboxRecord.State.POOLED, pool_key=key)
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
        from trajplatform.schedules import enqueue

        enqueue("apps.engines.jobs.fill_sandbox_pool", task_name="engines.fill_sandbox_pool")
    except Exception:  # the reconciler's pass refills too; never fail a rollout over this
        logger.exception("could not queue a sandbox pool refill")


def fill_pool(backend: SandboxBackend | None = None) -> dict[str, int]:
    """Create or destroy pooled sandboxes until each pool holds its configured size (a pool no
    longer configured holds none); returns counts over all pools."""
    backend = _backend(backend)
    configured = pools()
    sizes = {pool_key(backend.name, shape): (shape, size) for shape, size in configured}
    live = records.live_records(backend.name).filter(
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
