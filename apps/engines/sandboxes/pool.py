"""Warm pools' shapes: which ready sandboxes wait so a rollout does not wait for creation.

One pool per shape: the default spec's (SANDBOX_POOL_SIZE sandboxes) and one per image named
in SANDBOX_POOL_IMAGES ("python:3.11=4,trajplatform-python=2": the default spec with that
image, e.g. what code_exec asks for with a task's `scene_config.image`). Pooled sandboxes are
ordinary sandboxes whose row is in state `pooled` with a `pool_key` naming their shape
(backend, image, limits, network). This module only computes the shapes from the settings;
the pool itself lives in the rows (apps.engines.sandbox_records): `acquire(spec)` asks the
reporter to claim one of the spec's shape by compare-and-swap on the row (`pooled` ->
`ready`), so two workers never get the same sandbox, and gives the sandbox the caller's
labels, TTL and env. A spec of another shape, an empty pool or a size of 0 means a fresh
`create`. `sandbox_records.fill_pool()` tops every pool up (and trims a pool whose size was
lowered or that is no longer configured); the reconciler job calls it on every pass and a
claim queues it. Pooled sandboxes have a TTL of their own (POOL_TTL) so a stale pool is
recycled by the reconciler.
"""
from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.engines.sandboxes.base import SandboxSpec

POOL_TTL = timedelta(hours=6)


def pools() -> list[tuple[SandboxSpec, int]]:
    """The configured pools: (the shape they are filled with, how many), the default shape first.
    A malformed SANDBOX_POOL_IMAGES raises ImproperlyConfigured naming the entry."""
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
