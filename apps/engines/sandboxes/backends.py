"""Choosing a backend (`get_backend`) and handing out a sandbox (`acquire`: warm pool first).

Kept out of the package's __init__ so no module of the package imports the package itself.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.engines.sandboxes.base import Sandbox, SandboxBackend, SandboxSpec, SandboxUnavailable
from apps.engines.sandboxes.local import LocalBackend
from apps.engines.sandboxes.opensandbox import OpenSandboxBackend

BACKENDS = ("local", "opensandbox")


def get_backend(name: str | None = None, **options: Any) -> SandboxBackend:
    """The backend called `name` (default: the SANDBOX_BACKEND setting). Cheap: no I/O happens here."""
    name = name or settings.SANDBOX_BACKEND or "local"
    if name == "local":
        return LocalBackend(**options)
    if name == "opensandbox":
        return OpenSandboxBackend(**options)
    raise SandboxUnavailable(f"unknown sandbox backend {name!r}; SANDBOX_BACKEND must be one of {', '.join(BACKENDS)}")


def acquire(spec: SandboxSpec | None = None, *, trajectory: Any = None, backend: SandboxBackend | None = None) -> Sandbox:
    """A ready sandbox for `spec`, owned by `trajectory`: from the warm pool (the reporter's
    claim) if one of this shape waits there, else new."""
    spec = spec or SandboxSpec()
    backend = backend or get_backend()
    reporter = backend.reporter()
    if reporter is not None:
        sandbox = reporter.claim(backend, spec, trajectory)
        if sandbox is not None:
            return sandbox
    return backend.create(spec, trajectory=trajectory)
