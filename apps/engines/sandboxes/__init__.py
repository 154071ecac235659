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

The backends report every sandbox's life to the installed `SandboxReporter` (base.py); the
engine app's reporter keeps a SandboxRecord row per sandbox (apps.engines.sandbox_records),
whose reconciler job destroys sandboxes nobody owns or whose TTL passed. `acquire()`
(backends.py) hands out a sandbox from the warm pool (pool.py's shapes, SANDBOX_POOL_SIZE)
when one fits, else creates one. This package imports no app.
"""
from __future__ import annotations

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
    SandboxReporter,
    SandboxSpec,
    SandboxSpecUnsupported,
    SandboxUnavailable,
    StdioCommand,
    set_reporter,
)
from apps.engines.sandboxes.backends import BACKENDS, acquire, get_backend

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
    "SandboxReporter",
    "SandboxSpecUnsupported",
    "SandboxSpec",
    "SandboxUnavailable",
    "StdioCommand",
    "acquire",
    "get_backend",
    "set_reporter",
]
