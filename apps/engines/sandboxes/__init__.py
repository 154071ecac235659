"""Sandboxes: where agent-written code and commands run. The platform's security boundary.

One small synchronous interface, two backends:

    from apps.engines.sandboxes import SandboxSpec, get_backend

    backend = get_backend()                      # SANDBOX_BACKEND: "local" (default) or "opensandbox"
    with backend.create(SandboxSpec(memory_mb=512, labels={"task": "42"})) as sandbox:
        sandbox.write_file("main.py", b"print('hi')")
        result = sandbox.run("python3 main.py", timeout=30, on_output=lambda stream, line: ...)
        result.exit_code, result.stdout, result.timed_out, result.truncated

- `local` (local.py): bubblewrap on this machine, as `nobody`, no network, rlimits and
  cgroups (where the host allows; downgrades are recorded on the sandbox and its row).
  bwrap.py builds and supervises one command; seccomp.py is the filter it runs under;
  cgroups.py finds and manages the cgroups; etc.py builds the sandbox's own /etc.
- `opensandbox` (opensandbox.py): the OpenSandbox server at OPENSANDBOX_URL, via its SDK.

Every sandbox the platform creates has a SandboxRecord row (records.py); the reconciler
job destroys sandboxes nobody owns or whose TTL passed. `acquire()` hands out a sandbox
from the warm pool (pool.py, SANDBOX_POOL_SIZE) when one fits, else creates one.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.engines.sandboxes.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    MANAGED_LABEL,
    PLATFORM_MCP_BUILTIN_PATH,
    PLATFORM_MCP_PATH,
    PLATFORM_MCP_PROFILE,
    PLATFORM_PYTHON_PATH,
    PLATFORM_PYTHON_PROFILE,
    RECORD_LABEL,
    WORKDIR,
    ExecResult,
    OutputCallback,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxFileNotFound,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxSpecUnsupported,
    SandboxUnavailable,
    StdioCommand,
)

BACKENDS = ("local", "opensandbox")

__all__ = [
    "BACKENDS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "MANAGED_LABEL",
    "PLATFORM_MCP_BUILTIN_PATH",
    "PLATFORM_MCP_PATH",
    "PLATFORM_MCP_PROFILE",
    "PLATFORM_PYTHON_PATH",
    "PLATFORM_PYTHON_PROFILE",
    "RECORD_LABEL",
    "WORKDIR",
    "ExecResult",
    "OutputCallback",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxFileNotFound",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxSpecUnsupported",
    "SandboxSpec",
    "SandboxUnavailable",
    "StdioCommand",
    "acquire",
    "get_backend",
]


def get_backend(name: str | None = None, **options: Any) -> SandboxBackend:
    """The backend called `name` (default: the SANDBOX_BACKEND setting). Cheap: no I/O happens here."""
    name = name or settings.SANDBOX_BACKEND or "local"
    if name == "local":
        from apps.engines.sandboxes.local import LocalBackend

        return LocalBackend(**options)
    if name == "opensandbox":
        from apps.engines.sandboxes.opensandbox import OpenSandboxBackend

        return OpenSandboxBackend(**options)
    raise SandboxUnavailable(f"unknown sandbox backend {name!r}; SANDBOX_BACKEND must be one of {', '.join(BACKENDS)}")


def acquire(spec: SandboxSpec | None = None, *, trajectory: Any = None, backend: SandboxBackend | None = None) -> Sandbox:
    """A ready sandbox for `spec`, owned by `trajectory`: from the warm pool if one fits, else new."""
    from apps.engines.sandboxes.pool import acquire as pool_acquire

    return pool_acquire(spec, trajectory=trajectory, backend=backend)
