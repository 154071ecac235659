"""The sandbox interface both backends implement: spec, result, handle, backend, errors.

Everything here is backend-neutral and synchronous but for `Sandbox.arun`, the awaitable
twin of `run`. A backend subclasses `SandboxBackend` (`_create`, `_get`, `_list`, `_destroy`)
and `Sandbox` (`_run`, `_write_file`, `_read_file`); the public methods
here validate arguments, normalise paths and results and tell the installed
`SandboxReporter` about every sandbox's life (created, ready, failed, destroyed, errors), so
the two backends behave the same to callers. The sandbox layer writes no database rows: the
engine app installs the reporter that keeps the SandboxRecord rows (apps.engines.sandbox_records,
from EnginesConfig.ready), so every process records the same rows.
"""
from __future__ import annotations

import asyncio
import logging
import posixpath
import re
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, Callable, ClassVar, Iterable

from django.db import close_old_connections

logger = logging.getLogger("apps.engines.sandboxes")

WORKDIR = "/workspace"
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20  # per stream
DEFAULT_TTL = timedelta(hours=1)

# Labels the platform puts on every sandbox it creates (OpenSandbox `metadata`).
MANAGED_LABEL = "trajplatform.io/managed"
RECORD_LABEL = "trajplatform.io/record"
PLATFORM_LABEL_PREFIX = "trajplatform.io/"
# OpenSandbox reserves this prefix for itself and rejects it in metadata.
RESERVED_LABEL_PREFIX = "opensandbox.io/"

OutputCallback = Callable[[str, str], None]

# The runtime profile (local backend) / image name (OpenSandbox) whose python3 can import the
# platform's own Python packages (fastmcp for MCP servers): locally the platform's
# site-packages are bound read-only at PLATFORM_PYTHON_PATH and put on PYTHONPATH; an
# OpenSandbox image of this name must ship python3 with those packages installed.
PLATFORM_PYTHON_PROFILE = "trajplatform-python"
PLATFORM_PYTHON_PATH = "/opt/trajplatform/site-packages"
# The profile / image that also runs the bundled MCP servers: locally PLATFORM_PYTHON_PROFILE plus
# the directory `make install` fills (SANDBOX_MCP_PACKAGES) bound read-only at PLATFORM_MCP_PATH:
# python/ (requirements-mcp.lock: mcp-server-time, -git, -fetch; on PYTHONPATH after the
# platform's packages) and, where npm was found, node/node_modules (mcp-npm/package-lock.json).
# Our own servers (apps/engines/scenes/toucan/servers: `python3 -m sqlite_server`) are bound read-only at
# PLATFORM_MCP_BUILTIN_PATH, also on PYTHONPATH.
PLATFORM_MCP_PROFILE = "trajplatform-mcp"
PLATFORM_MCP_PATH = "/opt/trajplatform/mcp"
PLATFORM_MCP_BUILTIN_PATH = "/opt/trajplatform/mcp-builtin"


# --- errors ---------------------------------------------------------------------------


class SandboxError(Exception):
    """A sandbox operation failed; the message says what and, where it can, why."""


class SandboxUnavailable(SandboxError):
    """The backend cannot provide sandboxes here (missing tool, blocked namespaces, no server)."""


class SandboxSpecUnsupported(SandboxError):
    """This backend cannot give what the spec asks for (e.g. network egress locally): the task's
    configuration, not a passing fault, so it is not retried."""


class SandboxNotFound(SandboxError):
    """No sandbox with this id exists (any more) on the backend."""


class SandboxFileNotFound(SandboxError, FileNotFoundError):
    """`read_file` of a path that does not exist inside the sandbox."""


class ServiceFailed(SandboxError):
    """`start_service`: the process exited, or never answered on its port, in time (its own doing)."""


# --- labels ---------------------------------------------------------------------------

# Kubernetes label syntax, which the OpenSandbox server enforces on metadata; the local
# backend enforces the same so a spec that works on one backend works on the other.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_RE = re.compile(rf"^(?:{_DNS_LABEL}\.)*{_DNS_LABEL}$")
_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def validate_labels(labels: dict[str, str], *, allow_platform: bool = False) -> dict[str, str]:
    """Return `labels` as a plain str->str dict or raise SandboxError naming the bad entry."""
    if not isinstance(labels, dict):
        raise SandboxError(f"labels must be a dict of str to str, got {type(labels).__name__}")
    out: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SandboxError(f"label {key!r}: keys and values must be strings")
        prefix, _, name = key.rpartition("/")
        if (
            not name
            or len(name) > 63
            or not _LABEL_NAME_RE.match(name)
            or ("/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)))
        ):
            raise SandboxError(
                f"label key {key!r} is not a valid label key ([prefix/]name, name <= 63 chars of "
                "letters, digits, '-', '_', '.', starting and ending alphanumeric)"
            )
        if len(value) > 63 or not _LABEL_VALUE_RE.match(value):
            raise SandboxError(
                f"label {key}={value!r}: values are <= 63 chars of letters, digits, '-', '_', '.', "
                "starting and ending alphanumeric"
            )
        if key.startswith(RESERVED_LABEL_PREFIX):
            raise SandboxError(f"label key {key!r} uses the prefix {RESERVED_LABEL_PREFIX!r}, reserved by OpenSandbox")
        if key.startswith(PLATFORM_LABEL_PREFIX) and not allow_platform:
            raise SandboxError(f"label key {key!r} uses the prefix {PLATFORM_LABEL_PREFIX!r}, reserved for the platform")
        out[key] = value
    return out


def validate_env(env: dict[str, str] | None) -> dict[str, str]:
    """Environment variables as a str->str dict with POSIX names; raise SandboxError otherwise."""
    if not env:
        return {}
    if not isinstance(env, dict):
        raise SandboxError(f"env must be a dict of str to str, got {type(env).__name__}")
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            raise SandboxError(f"env name {key!r} is not a valid variable name")
        if not isinstance(value, str) or "\0" in value:
            raise SandboxError(f"env {key}: value must be a string without NUL bytes")
    return dict(env)


# --- spec, results, info ------------------------------------------------------------------


NETWORK_MODES = ("none", "open")


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox should be; both backends accept the same spec.

    `image` is an OpenSandbox image (``python:3.11``) or, on the local backend, a named runtime
    profile (``default``); see each backend for how it treats the other kind. `ttl` is the
    lifetime after which the reconciler destroys the sandbox (None: only explicit destroy).
    `address_space_mb` is each process's address-space limit: 0 the backend's default, None
    none at all (browsers reserve ~88 GiB of virtual memory they never use), which the local
    backend gives only where a memory cgroup bounds the sandbox and refuses otherwise.
    `entrypoint` replaces an OpenSandbox image's command (an Android image boots with its own
    `/init`); the local backend runs commands, not images, and refuses one.
    """

    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cpu: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    max_file_mb: int = 512
    open_files: int = 1024
    network: str = "none"
    ttl: timedelta | None = DEFAULT_TTL
    labels: dict[str, str] = field(default_factory=dict)
    address_space_mb: int | None = 0
    entrypoint: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ttl, (int, float)) and not isinstance(self.ttl, bool):
            object.__setattr__(self, "ttl", timedelta(seconds=self.ttl))
        if self.ttl is not None and (not isinstance(self.ttl, timedelta) or self.ttl.total_seconds() <= 0):
            raise SandboxError(f"ttl must be a positive timedelta (or seconds) or None, got {self.ttl!r}")
        if self.network not in NETWORK_MODES:
            raise SandboxError(f"network must be one of {', '.join(NETWORK_MODES)}; got {self.network!r}")
        if not (0 < float(self.cpu) <= 256):
            raise SandboxError(f"cpu must be a positive number of cores, got {self.cpu!r}")
        for name in ("memory_mb", "pids", "max_file_mb", "open_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SandboxError(f"{name} must be a positive integer, got {value!r}")
        if self.pids < 8:
            raise SandboxError(f"pids must be at least 8 (a shell and a few children), got {self.pids}")
        if self.memory_mb < 32:
            raise SandboxError(f"memory_mb must be at least 32, got {self.memory_mb}")
        space = self.address_space_mb
        if space is not None and (isinstance(space, bool) or not isinstance(space, int) or space < 0):
            raise SandboxError(f"address_space_mb must be 0 (the default), a number of MiB or None, got {space!r}")
        if self.entrypoint is not None:
            if isinstance(self.entrypoint, str) or not self.entrypoint or not all(
                    isinstance(a, str) and a and "\x00" not in a for a in self.entrypoint):
                raise SandboxError(f"entrypoint must be a non-empty list of non-empty strings, got {self.entrypoint!r}")
            object.__setattr__(self, "entrypoint", tuple(self.entrypoint))
        object.__setattr__(self, "env", validate_env(self.env))
        object.__setattr__(self, "labels", validate_labels(self.labels))

    def limits(self) -> dict[str, Any]:
        """The resource part of the spec, JSON-friendly (stored on the SandboxRecord)."""
        return {
            "cpu": self.cpu,
            "memory_mb": self.memory_mb,
            "pids": self.pids,
            "max_file_mb": self.max_file_mb,
            "open_files": self.open_files,
            "network": self.network,
            "ttl_s": self.ttl.total_seconds() if self.ttl else None,
            "address_space_mb": self.address_space_mb,
        }


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one `Sandbox.run` (or `arun`).

    `exit_code` is the command's status, 128+N when a signal N ended it (shell convention on
    both backends), None when the platform killed it on its deadline (`timed_out`). `stdout`
    and `stderr` keep at most `max_output_bytes` each (head and tail, with a marker line in
    between); `truncated` says some was dropped. `killed_by` names what ended the command
    when it was not its own doing: "timeout", "memory", "cpu", "destroyed".
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_ms: int = 0
    killed_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StdioCommand:
    """A host command line whose stdin/stdout are a process running inside a sandbox.

    Spawn it with any process API (fastmcp's StdioTransport, asyncio, subprocess): the process
    runs under the sandbox's isolation and limits, and dies with the sandbox.
    """

    argv: list[str]
    env: dict[str, str]
    cwd: str


# How a long-lived process inside a sandbox is reached from the platform (Sandbox.service_transport).
SERVICE_STDIO = "stdio"  # its stdin/stdout, through `stdio_command` (local backend)
SERVICE_HTTP = "http"  # a port it listens on, through `start_service` (OpenSandbox: execd has no stdin)


@dataclass(frozen=True)
class ServiceEndpoint:
    """A background process inside a sandbox that answers HTTP on `port`, reachable at `url`.

    `url` is the base URL the backend resolved for the port (no trailing slash); `headers` must be
    sent on every request to it (routing or auth headers of the backend's proxy). `process_id`
    names the background command (for `service_output`).
    """

    url: str
    headers: dict[str, str]
    port: int
    process_id: str


@dataclass(frozen=True)
class SandboxInfo:
    """What `backend.list` reports about one sandbox (no connection is made to it)."""

    id: str
    backend: str
    labels: dict[str, str]
    state: str
    created_at: datetime | None = None
    expires_at: datetime | None = None
    image: str = ""

    @property
    def record_id(self) -> int | None:
        raw = self.labels.get(RECORD_LABEL, "")
        return int(raw) if raw.isdigit() else None


# --- output capture ---------------------------------------------------------------------

# A line longer than this is passed to on_output in pieces, so a program that writes
# without newlines cannot make us buffer without bound.
MAX_LINE_BYTES = 64 * 1024


class _StreamCapture:
    """One stream's bounded capture plus the live line callback."""

    def __init__(self, name: str, cap: int, on_output: OutputCallback | None):
        self.name = name
        self.cap = cap
        self.on_output = on_output
        self.head = bytearray()
        self.tail = bytearray()
        self.tail_trimmed = False
        self.seen = 0
        self.emitted = 0  # bytes already passed to on_output as lines
        self.line = bytearray()
        self.live = on_output is not None

    @property
    def tail_keep(self) -> int:
        return self.cap // 2

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.seen += len(data)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data_rest = data[room:]
        else:
            data_rest = data
        if data_rest:
            self.tail += data_rest
            if len(self.tail) > 2 * self.tail_keep + 4096:
                del self.tail[: len(self.tail) - self.tail_keep]
                self.tail_trimmed = True
        if self.live:
            self._lines(data)

    def _lines(self, data: bytes) -> None:
        self.line += data
        while self.live:
            nl = self.line.find(b"\n")
            if nl < 0:
                if len(self.line) >= MAX_LINE_BYTES:
                    self._emit(bytes(self.line[:MAX_LINE_BYTES]), MAX_LINE_BYTES)
                    del self.line[:MAX_LINE_BYTES]
                    continue
                return
            self._emit(bytes(self.line[:nl]), nl + 1)
            del self.line[: nl + 1]

    def _emit(self, raw: bytes, consumed: int) -> None:
        assert self.on_output is not None
        if self.emitted + consumed > self.cap:
            self.live = False
            self.line.clear()
            self.on_output(self.name, f"[output truncated: {self.name} exceeded {self.cap} bytes]")
            return
        self.emitted += consumed
        self.on_output(self.name, raw.decode("utf-8", "replace"))

    def close(self) -> None:
        if self.live and self.line:
            self._emit(bytes(self.line), len(self.line))
            self.line.clear()
        # Line-oriented on both backends: execd reports lines without their newline, so an
        # unterminated last line cannot be told apart there; terminate it here too.
        last = self.tail[-1:] if self.tail else self.head[-1:]
        if self.seen and last != b"\n" and not self.truncated:
            self.head += b"\n"

    @property
    def truncated(self) -> bool:
        return self.seen > self.cap

    def text(self) -> str:
        if not self.truncated:
            return bytes(self.head).decode("utf-8", "replace")
        keep_tail = self.tail_keep
        keep_head = self.cap - keep_tail
        suffix = bytes(self.tail if self.tail_trimmed else self.head + self.tail)[-keep_tail:] if keep_tail else b""
        omitted = self.seen - keep_head - len(suffix)
        marker = f"\n[... {omitted} bytes of {self.name} omitted: output exceeded {self.cap} bytes ...]\n"
        return bytes(self.head[:keep_head]).decode("utf-8", "replace") + marker + suffix.decode("utf-8", "replace")


class OutputCollector:
    """Bounded stdout/stderr capture shared by the backends, with the live `on_output` lines.

    Output is treated as lines: `on_output` gets each line without its newline, and a last
    line the program left unterminated is terminated, as execd (which reports lines) does.
    """

    def __init__(self, max_output_bytes: int, on_output: OutputCallback | None = None):
        self.streams = {
            "stdout": _StreamCapture("stdout", max_output_bytes, on_output),
            "stderr": _StreamCapture("stderr", max_output_bytes, on_output),
        }

    def feed(self, stream: str, data: bytes) -> None:
        self.streams[stream].feed(data)

    def close(self) -> None:
        for capture in self.streams.values():
            capture.close()

    def result(
        self,
        *,
        exit_code: int | None,
        timed_out: bool,
        duration_ms: int,
        killed_by: str | None = None,
        extra_stderr: str = "",
    ) -> ExecResult:
        stderr = self.streams["stderr"].text()
        if extra_stderr:
            stderr = f"{stderr}{'' if not stderr or stderr.endswith(chr(10)) else chr(10)}{extra_stderr}\n"
        return ExecResult(
            exit_code=exit_code,
            stdout=self.streams["stdout"].text(),
            stderr=stderr,
            timed_out=timed_out,
            truncated=any(c.truncated for c in self.streams.values()),
            duration_ms=duration_ms,
            killed_by=killed_by,
        )


# --- the handle and the backend --------------------------------------------------------------


def sandbox_path(path: str) -> str:
    """An absolute, normalised in-sandbox path; relative paths are under /workspace."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise SandboxError(f"invalid sandbox path {path!r}")
    if not path.startswith("/"):
        path = f"{WORKDIR}/{path}"
    return posixpath.normpath(path).replace("//", "/")


def _command_list(cmd: str | list[str]) -> str | list[str]:
    if isinstance(cmd, str):
        if not cmd.strip():
            raise SandboxError("command is empty")
        if "\0" in cmd:
            raise SandboxError("command contains a NUL byte")
        return cmd
    if isinstance(cmd, (list, tuple)):
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
            raise SandboxError("argv must be a non-empty list of strings")
        if any("\0" in a for a in argv):
            raise SandboxError("argv contains a NUL byte")
        return argv
    raise SandboxError(f"command must be a string or a list of strings, got {type(cmd).__name__}")


async def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run a synchronous call in a worker thread (sandbox I/O, ORM work in callbacks); the
    thread's database connection is closed after it, per CONN_MAX_AGE."""

    def call() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return await asyncio.to_thread(call)


@dataclass(frozen=True)
class RunCall:
    """One `run`/`arun` call, checked and normalised (`Sandbox._run_call`): an absolute `cwd`,
    `env` on top of the spec's, `timeout` in seconds. `kwargs()` are `Sandbox._run`'s."""

    command: str | list[str]
    timeout: float
    cwd: str
    env: dict[str, str]
    on_output: OutputCallback | None
    max_output_bytes: int

    def kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Sandbox(ABC):
    """A live sandbox. Use as a context manager to destroy it on exit."""

    def __init__(
        self,
        backend: "SandboxBackend",
        sandbox_id: str,
        spec: SandboxSpec,
        labels: dict[str, str],
        *,
        created_at: datetime | None = None,
        expires_at: datetime | None = None,
        downgrades: Iterable[str] = (),
    ):
        self.backend = backend
        self.id = sandbox_id
        self.spec = spec
        self.labels = dict(labels)
        self.created_at = created_at
        self.expires_at = expires_at
        self.downgrades: list[str] = list(downgrades)
        self.record_id: int | None = None
        self.destroyed = False
        self._cleanups: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.backend.name}:{self.id}>"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            id=self.id,
            backend=self.backend.name,
            labels=dict(self.labels),
            state="destroyed" if self.destroyed else "running",
            created_at=self.created_at,
            expires_at=self.expires_at,
            image=self.spec.image or "",
        )

    def run(
        self,
        cmd: str | list[str],
        *,
        timeout: float,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        on_output: OutputCallback | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run a shell string (``sh -c``) or an argv list; returns when it exits or is killed.

        `timeout` (seconds) is a hard wall-clock deadline; `on_output(stream, line)` is called
        live from the calling thread for each output line, up to `max_output_bytes` per stream.
        """
        return self._run(**self._run_call(cmd, timeout=timeout, cwd=cwd, env=env, on_output=on_output,
                                          max_output_bytes=max_output_bytes).kwargs())

    async def arun(
        self,
        cmd: str | list[str],
        *,
        timeout: float,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        on_output: OutputCallback | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """`run` for a caller on an asyncio event loop: the same arguments, checks and result.

        The arguments are checked on the loop (SandboxError at once, as `run` raises); the command
        then runs in a worker thread (`in_thread`), where `on_output` is called. Cancelling the
        awaiting task does not stop the command: it runs on to its end (destroy the sandbox to
        stop it).
        """
        call = self._run_call(cmd, timeout=timeout, cwd=cwd, env=env, on_output=on_output,
                              max_output_bytes=max_output_bytes)
        return await in_thread(self._run, **call.kwargs())

    def _run_call(
        self,
        cmd: str | list[str],
        *,
        timeout: float | timedelta,
        cwd: str | None,
        env: dict[str, str] | None,
        on_output: OutputCallback | None,
        max_output_bytes: int,
    ) -> RunCall:
        """`run`'s and `arun`'s checks: the call for `_run`, or SandboxError
        (SandboxNotFound once the sandbox was destroyed)."""
        command = _command_list(cmd)
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise SandboxError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes <= 0:
            raise SandboxError(f"max_output_bytes must be a positive integer, got {max_output_bytes!r}")
        if self.destroyed:
            raise SandboxNotFound(f"sandbox {self.id} was destroyed")
        return RunCall(command=command, timeout=float(timeout), cwd=sandbox_path(cwd) if cwd else WORKDIR,
                       env={**self.spec.env, **validate_env(env)}, on_output=on_output,
                       max_output_bytes=max_output_bytes)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a file (parents are created) with `data` and permission `mode`."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SandboxError(f"data must be bytes, got {type(data).__name__}")
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise SandboxError(f"mode must be an int permission like 0o644, got {mode!r}")
        if self.destroyed:
            raise SandboxNotFound(f"sandbox {self.id} was destroyed")
        self._write_file(sandbox_path(path), bytes(data), mode)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes (at most `max_bytes`); SandboxFileNotFound if it does not exist."""
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
            raise SandboxError(f"max_bytes must be a non-negative integer or None, got {max_bytes!r}")
        if self.destroyed:
            raise SandboxNotFound(f"sandbox {self.id} was destroyed")
        if max_bytes == 0:
            # Still tells a missing file from an empty one.
            self._read_file(sandbox_path(path), 1)
            return b""
        return self._read_file(sandbox_path(path), max_bytes)

    def stdio_command(
        self, argv: list[str], *, lifetime: float, cwd: str | None = None, env: dict[str, str] | None = None
    ) -> StdioCommand:
        """A host command that runs `argv` inside this sandbox with its stdin/stdout attached.

        For long-lived processes spoken to over pipes (an MCP server over stdio). `lifetime`
        (seconds) bounds its CPU time like `run`'s timeout; destroying the sandbox kills it.
        SandboxUnavailable on a backend that cannot attach to a process's pipes.
        """
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise SandboxError("argv must be a non-empty list of strings without NUL bytes")
        if isinstance(lifetime, bool) or not isinstance(lifetime, (int, float)) or lifetime <= 0:
            raise SandboxError(f"lifetime must be a positive number of seconds, got {lifetime!r}")
        if self.destroyed:
            raise SandboxNotFound(f"sandbox {self.id} was destroyed")
        return self._stdio_command(
            list(argv), lifetime=float(lifetime), cwd=sandbox_path(cwd) if cwd else WORKDIR,
            env={**self.spec.env, **validate_env(env)},
        )

    def _stdio_command(self, argv: list[str], *, lifetime: float, cwd: str, env: dict[str, str]) -> StdioCommand:
        raise SandboxUnavailable(
            f"the {self.backend.name} backend cannot attach to a process's stdin/stdout inside a sandbox"
        )

    # Which way this backend reaches a long-lived process inside the sandbox: SERVICE_STDIO
    # (`stdio_command`) or SERVICE_HTTP (`start_service`). Callers choose by this, not by type.
    service_transport: ClassVar[str] = SERVICE_STDIO

    def start_service(
        self, argv: list[str], *, port: int, lifetime: float, ready_timeout: float,
        cwd: str | None = None, env: dict[str, str] | None = None,
    ) -> ServiceEndpoint:
        """Start `argv` in the background, listening on `port` inside the sandbox, and return
        once it answers HTTP there (SandboxError naming the cause and its output otherwise,
        after at most `ready_timeout` seconds). `lifetime` bounds how long it may run;
        destroying the sandbox kills it. SandboxUnavailable on a backend without ports.
        """
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise SandboxError("argv must be a non-empty list of strings without NUL bytes")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise SandboxError(f"port must be an integer in 1..65535, got {port!r}")
        for name, value in (("lifetime", lifetime), ("ready_timeout", ready_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SandboxError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.destroyed:
            raise SandboxNotFound(f"sandbox {self.id} was destroyed")
        return self._start_service(
            list(argv), port=port, lifetime=float(lifetime), ready_timeout=float(ready_timeout),
            cwd=sandbox_path(cwd) if cwd else WORKDIR, env={**self.spec.env, **validate_env(env)},
        )

    def service_output(self, service: ServiceEndpoint, max_chars: int = 4000) -> str:
        """The tail of what the service wrote (stdout and stderr); "" when unavailable."""
        return ""

    def _start_service(
        self, argv: list[str], *, port: int, lifetime: float, ready_timeout: float, cwd: str, env: dict[str, str]
    ) -> ServiceEndpoint:
        raise SandboxUnavailable(f"the {self.backend.name} backend cannot serve a port from inside a sandbox")

    def add_cleanup(self, callback: Callable[[], None]) -> None:
        """Call `callback` (once) when the sandbox is destroyed, before anything in it is killed."""
        self._cleanups.append(callback)

    def _run_cleanups(self) -> None:
        while self._cleanups:
            callback = self._cleanups.pop()
            try:
                callback()
            except Exception:
                logger.exception("sandbox %s: a cleanup callback failed", self.id)

    def destroy(self, *, record: bool = True) -> None:
        """Kill everything running in the sandbox and delete it; safe to call twice. With
        record=False the caller marks its SandboxRecord (sandbox_records.records_destroyed) itself."""
        self._run_cleanups()
        if self.destroyed:
            return
        self.backend.destroy(self.id, record=record)
        self.destroyed = True

    @abstractmethod
    def _run(
        self,
        command: str | list[str],
        *,
        timeout: float,
        cwd: str,
        env: dict[str, str],
        on_output: OutputCallback | None,
        max_output_bytes: int,
    ) -> ExecResult: ...

    @abstractmethod
    def _write_file(self, path: str, data: bytes, mode: int) -> None: ...

    @abstractmethod
    def _read_file(self, path: str, max_bytes: int | None) -> bytes: ...

    def _relabel(self, labels: dict[str, str], expires_at: datetime | None, env: dict[str, str]) -> None:
        """Re-own a pooled sandbox: new labels, expiry and default env (backend hook)."""
        self.labels = dict(labels)
        self.expires_at = expires_at
        own = {k: v for k, v in labels.items() if not k.startswith(PLATFORM_LABEL_PREFIX)}
        self.spec = replace(self.spec, env=env, labels=own)


class SandboxBackend(ABC):
    """Creates, finds, lists and destroys sandboxes of one kind.

    `records=False` tells no reporter, so no SandboxRecord rows (the benchmark and low-level
    tests); everything the platform runs keeps them, so the reconciler can find leaked sandboxes.
    """

    name: ClassVar[str] = ""

    def __init__(self, *, records: bool = True):
        self.records = records

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # -- public API -------------------------------------------------------------------------

    def create(
        self,
        spec: SandboxSpec | None = None,
        *,
        trajectory: Any = None,
        pool_key: str = "",
    ) -> Sandbox:
        """A new, ready sandbox; the reporter hears of it (its row is written) before the backend is asked."""
        spec = spec or SandboxSpec()
        reporter = self.reporter()
        record_id: int | None = None
        labels = {**spec.labels, MANAGED_LABEL: "true"}
        if reporter is not None:
            record_id = reporter.begin(backend=self.name, spec=spec, trajectory=trajectory, pool_key=pool_key)
            labels[RECORD_LABEL] = str(record_id)
        try:
            sandbox = self._create(spec, labels)
        except Exception as exc:
            if reporter is not None:
                reporter.failed(record_id=record_id, error=str(exc) or type(exc).__name__)
            raise
        if sandbox.downgrades:
            logger.warning(
                "sandbox %s:%s runs with downgraded isolation: %s", self.name, sandbox.id, "; ".join(sandbox.downgrades)
            )
        if reporter is not None:
            try:
                reporter.ready(record_id=record_id, sandbox=sandbox, pooled=bool(pool_key))
            except Exception:
                # The row is the only thing that lets the reconciler tell this sandbox is owned.
                self._destroy(sandbox.id)
                raise
            sandbox.record_id = record_id
        return sandbox

    def get(self, sandbox_id: str) -> Sandbox:
        """Reconnect to a sandbox by id (e.g. after a worker restart); SandboxNotFound if gone."""
        if not isinstance(sandbox_id, str) or not sandbox_id:
            raise SandboxNotFound(f"no sandbox with id {sandbox_id!r}")
        sandbox = self._get(sandbox_id)
        raw = sandbox.labels.get(RECORD_LABEL, "")
        sandbox.record_id = int(raw) if raw.isdigit() else None
        return sandbox

    def list(self, labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        """Live sandboxes whose labels include every given key=value (all of them for None)."""
        wanted = validate_labels(labels or {}, allow_platform=True)
        return [info for info in self._list(wanted) if all(info.labels.get(k) == v for k, v in wanted.items())]

    def destroy(self, sandbox_id: str, *, reason: str = "destroyed", record: bool = True) -> bool:
        """Destroy a sandbox; True if it existed. Unknown ids and repeats are fine. record=False
        leaves its SandboxRecord to the caller."""
        if not isinstance(sandbox_id, str) or not sandbox_id:
            return False
        existed = self._destroy(sandbox_id)
        reporter = self.reporter()
        if reporter is not None and record:
            reporter.destroyed(backend=self.name, external_id=sandbox_id, reason=reason)
        return existed

    def reporter(self) -> "SandboxReporter | None":
        """Whom this backend tells about its sandboxes: the installed reporter, None with records=False."""
        if not self.records:
            return None
        if _reporter is None:
            raise SandboxError(
                "no sandbox reporter is installed, so this sandbox would have no record; the engine app "
                "installs one when Django starts (apps.engines.sandbox_records), or pass records=False"
            )
        return _reporter

    def check(self) -> list[str]:
        """Problems that would stop `create` here (empty list: ready), without creating anything."""
        return []

    # -- backend hooks --------------------------------------------------------------------

    @abstractmethod
    def _create(self, spec: SandboxSpec, labels: dict[str, str]) -> Sandbox: ...

    @abstractmethod
    def _get(self, sandbox_id: str) -> Sandbox: ...

    @abstractmethod
    def _list(self, labels: dict[str, str]) -> list[SandboxInfo]: ...

    @abstractmethod
    def _destroy(self, sandbox_id: str) -> bool: ...


# --- the reporter: who keeps the records of sandboxes -------------------------------------


class SandboxReporter(ABC):
    """What a backend tells about its sandboxes, and the warm pool `acquire` asks first.

    The engine app's implementation (apps.engines.sandbox_records.RecordsReporter) keeps one
    SandboxRecord row per sandbox; `set_reporter` installs it once per process."""

    @abstractmethod
    def begin(self, *, backend: str, spec: SandboxSpec, trajectory: Any, pool_key: str) -> int:
        """A sandbox is about to be created; returns the id of its record (put on it as a label)."""

    @abstractmethod
    def ready(self, *, record_id: int, sandbox: Sandbox, pooled: bool) -> None:
        """The backend made it; raise to refuse it (the backend then destroys it)."""

    @abstractmethod
    def failed(self, *, record_id: int, error: str) -> None:
        """Creating it failed with `error`."""

    @abstractmethod
    def destroyed(self, *, backend: str, external_id: str, reason: str) -> None:
        """The backend destroyed the sandbox `external_id`."""

    @abstractmethod
    def error(self, *, backend: str, external_id: str, error: str) -> None:
        """An infrastructure error seen on a live sandbox (the console shows the latest)."""

    @abstractmethod
    def claim(self, backend: SandboxBackend, spec: SandboxSpec, trajectory: Any) -> Sandbox | None:
        """A warm sandbox of `spec`'s shape now owned by `trajectory`, or None (then one is created)."""


_reporter: SandboxReporter | None = None


def set_reporter(reporter: SandboxReporter | None) -> SandboxReporter | None:
    """Install the process's reporter (None: none); returns the one it replaces."""
    global _reporter
    previous, _reporter = _reporter, reporter
    return previous
