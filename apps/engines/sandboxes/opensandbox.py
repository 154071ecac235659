"""The OpenSandbox backend: sandboxes on an OpenSandbox server, through its pinned SDK (1.1.1).

Lifecycle calls go to the server at OPENSANDBOX_URL (header OPEN-SANDBOX-API-KEY); commands
and files go to execd inside each sandbox, directly or through the server's proxy
(OPENSANDBOX_USE_SERVER_PROXY). What this adapter adds on top of the SDK:

- labels become sandbox `metadata` (the list filter the reconciler uses); every create sends
  `EXECD_API_GRACE_SHUTDOWN=50ms` (no ~1 s tail per command), the spec's cpu/memory as
  `resourceLimits`, its TTL as `timeout` (the server wants >= 60 s) and, for network "none",
  a deny-all egress policy;
- an outer wall-clock deadline around every command: the SDK reads the SSE stream with no
  read timeout, so a hung execd would hang the worker. The command runs in a helper thread;
  at the deadline we interrupt it, and if the stream still does not end we drop the
  connection (the handle reconnects on next use);
- output lines reach `on_output` on the caller's thread (Django DB writes stay on it), with
  the same bounded capture as the local backend;
- 404s become SandboxNotFound / SandboxFileNotFound; execd's error events become exit codes:
  "exit status N" -> N, "signal: killed" (Go's -1) -> 128+9, and a kill at the deadline -> timed_out.

Not enforced per sandbox by OpenSandbox (recorded as downgrades): pids, max_file_mb and
open_files; the server's own [docker] limits (pids_limit, ...) apply instead.
"""
from __future__ import annotations

import math
import queue
import re
import shlex
import threading
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.conf import settings

from apps.engines.sandboxes.base import (
    PLATFORM_LABEL_PREFIX,
    SERVICE_HTTP,
    ServiceEndpoint,
    ExecResult,
    OutputCallback,
    OutputCollector,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxFileNotFound,
    SandboxInfo,
    SandboxNotFound,
    SandboxSpec,
    SandboxUnavailable,
    ServiceFailed,
    WORKDIR,
    logger,
)

DEFAULT_IMAGE = "python:3.11"
LOCAL_PROFILES = ("default", "debian", "python", "python3")
MIN_SERVER_TIMEOUT_S = 60
# How much longer than the command's own timeout we wait for execd to report back before we
# stop waiting ourselves; then how long an interrupt gets to end the stream.
OUTER_GRACE_S = 5.0
INTERRUPT_GRACE_S = 3.0
FINAL_STATES = {"terminated"}
# Go's syscall.Signal strings, as execd reports "signal: <name>" for a killed command.
GO_SIGNALS = {
    "hangup": 1, "interrupt": 2, "quit": 3, "illegal instruction": 4, "trace/breakpoint trap": 5,
    "aborted": 6, "bus error": 7, "floating point exception": 8, "killed": 9, "user defined signal 1": 10,
    "segmentation fault": 11, "user defined signal 2": 12, "broken pipe": 13, "alarm clock": 14,
    "terminated": 15, "CPU time limit exceeded": 24, "file size limit exceeded": 25,
}
# Waiting for a background service: how often to look, and how long one HTTP probe may take.
SERVICE_POLL_S = 0.2
SERVICE_PROBE_TIMEOUT_S = 2.0
# A proxy in front of the port answers these while nothing listens behind it yet.
_NOT_LISTENING = {502, 503, 504}
_SIGNAL_RE = re.compile(r"signal: ([A-Za-z /-]+[a-z0-9])")
_EXIT_RE = re.compile(r"exit status (-?\d+)")


def _sdk():
    """The SDK modules, imported lazily (they pull in pydantic models and httpx)."""
    import opensandbox  # deferred: heavy (the OpenSandbox SDK), only for this backend
    from opensandbox import exceptions  # deferred: with the SDK
    from opensandbox.config.connection_sync import ConnectionConfigSync  # deferred: with the SDK
    from opensandbox.models.execd import RunCommandOpts  # deferred: with the SDK
    from opensandbox.models.execd_sync import ExecutionHandlersSync  # deferred: with the SDK
    from opensandbox.models.sandboxes import NetworkPolicy, SandboxFilter  # deferred: with the SDK
    from opensandbox.sync.manager import SandboxManagerSync  # deferred: with the SDK
    from opensandbox.sync.sandbox import SandboxSync  # deferred: with the SDK

    return {
        "version": getattr(opensandbox, "__version__", "?"),
        "exceptions": exceptions,
        "ConnectionConfigSync": ConnectionConfigSync,
        "RunCommandOpts": RunCommandOpts,
        "ExecutionHandlersSync": ExecutionHandlersSync,
        "NetworkPolicy": NetworkPolicy,
        "SandboxFilter": SandboxFilter,
        "SandboxManagerSync": SandboxManagerSync,
        "SandboxSync": SandboxSync,
    }


def _status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def _map_error(exc: BaseException, what: str, *, not_found: type[SandboxError] = SandboxNotFound) -> SandboxError:
    """The platform error for an SDK exception (404 -> not found, connection -> unavailable)."""
    sdk = _sdk()["exceptions"]
    if isinstance(exc, SandboxError):
        return exc
    if _status_code(exc) == 404:
        return not_found(f"{what}: not found ({exc})")
    if isinstance(exc, sdk.SandboxConnectionException):
        return SandboxUnavailable(f"{what}: cannot reach OpenSandbox: {exc}")
    detail = str(exc) or type(exc).__name__
    code = _status_code(exc)
    return SandboxError(f"{what}: {'HTTP ' + str(code) + ': ' if code else ''}{detail}")


def _cpu_quantity(cpu: float) -> str:
    millis = int(round(cpu * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _normalise_exit(execution: Any) -> tuple[int | None, bool, str]:
    """(exit_code, signalled, note) from an SDK Execution (see the module docstring)."""
    error = execution.error
    if error is None:
        if execution.complete is not None:
            return 0, False, ""
        return None, False, ""
    traceback = " ".join(error.traceback or [])
    try:
        code = int(error.value)
    except (TypeError, ValueError):
        # Not an exit status: execd could not start the command (bad cwd, exec failure).
        return 1, False, f"[sandbox] command could not start: {error.value}"
    if code >= 0:
        return code, False, ""
    match = _SIGNAL_RE.search(traceback)
    if match and match.group(1) in GO_SIGNALS:
        return 128 + GO_SIGNALS[match.group(1)], True, ""
    return None, True, f"[sandbox] command ended abnormally: {traceback or error.value}"


class OpenSandbox(Sandbox):
    """A handle on one OpenSandbox sandbox (wraps an SDK `SandboxSync`, reconnecting as needed)."""

    backend: "OpenSandboxBackend"

    def __init__(self, backend: "OpenSandboxBackend", sandbox_id: str, spec: SandboxSpec, labels: dict[str, str], *,
                 handle: Any = None, **kwargs: Any):
        super().__init__(backend, sandbox_id, spec, labels, **kwargs)
        self._handle = handle
        self._handle_lock = threading.Lock()

    def _sdk_handle(self) -> Any:
        with self._handle_lock:
            if self._handle is None:
                self._handle = self.backend._connect(self.id)
            return self._handle

    def _drop_handle(self) -> None:
        with self._handle_lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            try:
                handle.close()
            except Exception:  # closing a broken connection may fail; it is being discarded anyway
                pass

    def endpoint(self, port: int) -> str:
        """Where a port inside the sandbox is reached from the platform, as the lifecycle API
        resolves it: `host:port` (host networking, a published port) or a proxy URL."""
        try:
            resolved = self._sdk_handle().get_endpoint(int(port))
        except Exception as exc:
            raise _map_error(exc, f"resolving port {port} of sandbox {self.id}") from exc
        return str(resolved.endpoint)

    def close(self) -> None:
        """Release local connections (the remote sandbox is untouched; `destroy` removes it)."""
        self._drop_handle()

    def destroy(self, *, record: bool = True) -> None:
        super().destroy(record=record)
        self._drop_handle()

    def _run(
        self,
        command: str | list[str],
        *,
        timeout: float,
        cwd: str,
        env: dict[str, str],
        on_output: OutputCallback | None,
        max_output_bytes: int,
    ) -> ExecResult:
        sdk = _sdk()
        handle = self._sdk_handle()
        collector = OutputCollector(max_output_bytes, on_output)
        events: queue.Queue = queue.Queue(maxsize=10_000)
        abandoned = threading.Event()
        exec_id: dict[str, str] = {}

        def put(item: tuple[str, Any]) -> None:
            # Backpressure on the stream while the caller consumes; never block once abandoned.
            while not abandoned.is_set():
                try:
                    events.put(item, timeout=0.5)
                    return
                except queue.Full:
                    continue

        handlers = sdk["ExecutionHandlersSync"](
            on_stdout=lambda msg: put(("stdout", msg.text)),
            on_stderr=lambda msg: put(("stderr", msg.text)),
            on_init=lambda init: exec_id.setdefault("id", init.id),
            skip_accumulation=True,
        )
        opts = sdk["RunCommandOpts"](
            working_directory=cwd,
            timeout=timedelta(seconds=timeout),
            envs=env or None,
        )

        def work() -> None:
            try:
                put(("done", handle.commands.run(command, opts=opts, handlers=handlers)))
            except BaseException as exc:  # handed to the caller's thread
                put(("error", exc))

        started = time.monotonic()
        worker = threading.Thread(target=work, name=f"opensandbox-run-{self.id}", daemon=True)
        worker.start()
        outer_deadline = started + timeout + self.backend.outer_grace
        execution = None
        try:
            while True:
                remaining = outer_deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    kind, payload = events.get(timeout=remaining)
                except queue.Empty:
                    break
                if kind in ("stdout", "stderr"):
                    collector.feed(kind, f"{payload}\n".encode())
                elif kind == "done":
                    execution = payload
                    break
                else:
                    abandoned.set()
                    raise _map_error(payload, f"running a command in sandbox {self.id}")
        except BaseException:
            if not abandoned.is_set():
                # The caller's on_output raised (or we were interrupted): stop the remote command too.
                abandoned.set()
                self._abandon(handle, worker, exec_id.get("id"))
            raise
        finally:
            if execution is None:
                abandoned.set()
        duration_ms = int((time.monotonic() - started) * 1000)
        if execution is None:
            self._abandon(handle, worker, exec_id.get("id"))
            collector.close()
            return collector.result(
                exit_code=None, timed_out=True, duration_ms=duration_ms, killed_by="timeout",
                extra_stderr=f"[sandbox] killed: wall-clock timeout of {timeout:g}s (execd did not finish the command)",
            )
        collector.close()
        exit_code, signalled, note = _normalise_exit(execution)
        if execution.error is None and execution.complete is None:
            raise SandboxError(f"sandbox {self.id}: the command stream ended without a result (sandbox gone?)")
        timed_out = signalled and duration_ms >= timeout * 1000 - 50
        killed_by = "timeout" if timed_out else ("cpu" if exit_code == 152 else None)
        if timed_out:
            exit_code = None
            note = f"[sandbox] killed: wall-clock timeout of {timeout:g}s"
        return collector.result(
            exit_code=exit_code, timed_out=timed_out, duration_ms=duration_ms, killed_by=killed_by, extra_stderr=note
        )

    def _abandon(self, handle: Any, worker: threading.Thread, execution_id: str | None) -> None:
        """The outer deadline passed: interrupt the command, then cut the stream if it hangs on."""
        if execution_id:
            try:
                handle.commands.interrupt(execution_id)
            except Exception as exc:
                logger.warning("sandbox %s: interrupting command %s failed: %s", self.id, execution_id, exc)
        worker.join(self.backend.interrupt_grace)
        if worker.is_alive():
            message = "execd kept the command stream open past the deadline and an interrupt; connection dropped"
            logger.warning("sandbox %s: %s", self.id, message)
            self._drop_handle()
            reporter = self.backend.reporter()
            if reporter is not None:
                reporter.error(backend=self.backend.name, external_id=self.id, error=message)

    # -- services: execd gives background commands no stdin, so a long-lived process is
    # reached over HTTP on a port, through the endpoint the lifecycle API resolves for it.

    service_transport = SERVICE_HTTP

    def _start_service(
        self, argv: list[str], *, port: int, lifetime: float, ready_timeout: float, cwd: str, env: dict[str, str]
    ) -> ServiceEndpoint:
        sdk = _sdk()
        handle = self._sdk_handle()
        opts = sdk["RunCommandOpts"](background=True, working_directory=cwd,
                                     timeout=timedelta(seconds=lifetime), envs=env or None)
        try:
            # A shell string: execd 1.1.1 takes argv too, but older execd builds only `command`.
            execution = handle.commands.run(shlex.join(argv), opts=opts)
        except Exception as exc:
            raise _map_error(exc, f"starting a background command in sandbox {self.id}") from exc
        if not execution.id:
            raise SandboxError(f"sandbox {self.id}: execd did not report an id for the background command")
        try:
            endpoint = handle.get_endpoint(port)
            headers = dict(endpoint.build_request_headers(handle.connection_config))
        except Exception as exc:
            self._stop_service(handle, execution.id)
            raise _map_error(exc, f"resolving the endpoint of port {port} in sandbox {self.id}") from exc
        base = endpoint.endpoint.rstrip("/")
        url = base if "://" in base else f"http://{base}"
        service = ServiceEndpoint(url=url, headers=headers, port=port, process_id=execution.id)
        try:
            self._wait_for_service(handle, service, ready_timeout)
        except ServiceFailed:
            raise  # it exited, or was stopped when the wait gave up
        except BaseException:
            self._stop_service(handle, execution.id)
            raise
        return service

    def _wait_for_service(self, handle: Any, service: ServiceEndpoint, ready_timeout: float) -> None:
        """Until the port answers HTTP (any status but a proxy's 502-504); fail fast if it exited."""
        import httpx  # deferred: heavy (httpx), only to probe a service

        deadline = time.monotonic() + ready_timeout
        last = "no answer yet"
        with httpx.Client(headers=service.headers, timeout=SERVICE_PROBE_TIMEOUT_S, trust_env=False) as client:
            while True:
                try:
                    status = handle.commands.get_command_status(service.process_id)
                except Exception as exc:
                    raise _map_error(exc, f"checking the background command in sandbox {self.id}") from exc
                if status.running is False:
                    raise ServiceFailed(
                        f"the service for port {service.port} in sandbox {self.id} exited "
                        f"(exit code {status.exit_code}) before it answered{self._output_note(service)}"
                    )
                try:
                    answer = client.get(service.url + "/")
                    if answer.status_code not in _NOT_LISTENING:
                        return
                    last = f"HTTP {answer.status_code} from the endpoint"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if time.monotonic() >= deadline:
                    message = (f"the service for port {service.port} in sandbox {self.id} did not answer at "
                               f"{service.url} within {ready_timeout:g}s ({last}){self._output_note(service)}")
                    self._stop_service(handle, service.process_id)
                    raise ServiceFailed(message)
                time.sleep(SERVICE_POLL_S)

    def _stop_service(self, handle: Any, process_id: str) -> None:
        try:
            handle.commands.interrupt(process_id)
        except Exception as exc:  # it may have exited already; destroying the sandbox ends it anyway
            logger.info("sandbox %s: stopping background command %s: %s", self.id, process_id, exc)

    def service_output(self, service: ServiceEndpoint, max_chars: int = 4000) -> str:
        try:
            logs = self._sdk_handle().commands.get_background_command_logs(service.process_id)
        except Exception as exc:
            logger.info("sandbox %s: reading the output of %s: %s", self.id, service.process_id, exc)
            return ""
        return (logs.content or "")[-max_chars:].strip()

    def _output_note(self, service: ServiceEndpoint) -> str:
        output = self.service_output(service)
        return f"\nits output:\n{output}" if output else ""

    def _write_file(self, path: str, data: bytes, mode: int) -> None:
        try:
            # execd takes the mode as the octal digits read as a decimal int: 0o644 -> 644.
            self._sdk_handle().files.write_file(path, data, mode=int(format(mode, "o")))
        except Exception as exc:
            raise _map_error(exc, f"writing {path} in sandbox {self.id}") from exc

    def _read_file(self, path: str, max_bytes: int | None) -> bytes:
        try:
            data = self._sdk_handle().files.read_bytes(
                path, range_header=f"bytes=0-{max_bytes - 1}" if max_bytes else None
            )
        except Exception as exc:
            if _status_code(exc) == 404:
                raise SandboxFileNotFound(f"{path}: no such file in sandbox {self.id}") from exc
            raise _map_error(exc, f"reading {path} in sandbox {self.id}") from exc
        return data if max_bytes is None else data[:max_bytes]

    def _relabel(self, labels: dict[str, str], expires_at: datetime | None, env: dict[str, str]) -> None:
        handle = self._sdk_handle()
        try:
            patch: dict[str, str | None] = {k: None for k in self.labels if k not in labels}
            patch.update(labels)
            handle.patch_metadata(patch)
            if expires_at is not None:
                handle.renew(max(timedelta(seconds=MIN_SERVER_TIMEOUT_S), expires_at - datetime.now(dt_timezone.utc)))
        except Exception as exc:
            raise _map_error(exc, f"re-labelling sandbox {self.id}") from exc
        super()._relabel(labels, expires_at, env)


class OpenSandboxBackend(SandboxBackend):
    """Sandboxes on the OpenSandbox server at OPENSANDBOX_URL."""

    name = "opensandbox"

    def __init__(
        self,
        *,
        records: bool = True,
        url: str | None = None,
        api_key: str | None = None,
        use_server_proxy: bool | None = None,
        request_timeout: float = 30.0,
        ready_timeout: float = 60.0,
        default_image: str | None = None,
        outer_grace: float = OUTER_GRACE_S,
        interrupt_grace: float = INTERRUPT_GRACE_S,
    ):
        super().__init__(records=records)
        self.outer_grace = outer_grace
        self.interrupt_grace = interrupt_grace
        self.url = (url if url is not None else settings.OPENSANDBOX_URL or "").rstrip("/")
        self.api_key = api_key if api_key is not None else settings.OPENSANDBOX_API_KEY
        self.use_server_proxy = (
            use_server_proxy if use_server_proxy is not None
            else settings.OPENSANDBOX_USE_SERVER_PROXY
        )
        self.request_timeout = request_timeout
        self.ready_timeout = ready_timeout
        self.default_image = default_image or settings.OPENSANDBOX_DEFAULT_IMAGE or DEFAULT_IMAGE
        self._manager: Any = None
        self._manager_lock = threading.Lock()

    def check(self) -> list[str]:
        if not self.url:
            return ["OPENSANDBOX_URL is not set"]
        try:
            self._list({})
        except SandboxError as exc:
            return [str(exc)]
        return []

    def _config(self) -> Any:
        if not self.url:
            raise SandboxUnavailable(
                "the opensandbox backend needs OPENSANDBOX_URL (and OPENSANDBOX_API_KEY) pointing at an OpenSandbox server"
            )
        sdk = _sdk()
        return sdk["ConnectionConfigSync"](
            domain=self.url,
            api_key=self.api_key or None,
            request_timeout=timedelta(seconds=self.request_timeout),
            use_server_proxy=self.use_server_proxy,
            disable_metrics=True,
        )

    def manager(self) -> Any:
        with self._manager_lock:
            if self._manager is None:
                self._manager = _sdk()["SandboxManagerSync"].create(self._config())
            return self._manager

    def close(self) -> None:
        with self._manager_lock:
            manager, self._manager = self._manager, None
        if manager is not None:
            manager.close()

    def _connect(self, sandbox_id: str) -> Any:
        try:
            return _sdk()["SandboxSync"].connect(
                sandbox_id,
                connection_config=self._config(),
                connect_timeout=timedelta(seconds=self.ready_timeout),
                skip_health_check=True,
            )
        except Exception as exc:
            raise _map_error(exc, f"connecting to sandbox {sandbox_id}") from exc

    def _image(self, spec: SandboxSpec) -> str:
        if not spec.image or spec.image in LOCAL_PROFILES:
            return self.default_image
        return spec.image

    def _create(self, spec: SandboxSpec, labels: dict[str, str]) -> OpenSandbox:
        sdk = _sdk()
        ttl_s = None if spec.ttl is None else max(MIN_SERVER_TIMEOUT_S, math.ceil(spec.ttl.total_seconds()))
        image = self._image(spec)
        try:
            handle = sdk["SandboxSync"].create(
                image,
                timeout=timedelta(seconds=ttl_s) if ttl_s is not None else None,
                ready_timeout=timedelta(seconds=self.ready_timeout),
                env={**spec.env, "EXECD_API_GRACE_SHUTDOWN": "50ms"},
                metadata=labels,
                resource={"cpu": _cpu_quantity(spec.cpu), "memory": f"{spec.memory_mb}Mi"},
                network_policy=sdk["NetworkPolicy"](default_action="deny", egress=[]) if spec.network == "none" else None,
                **({"entrypoint": list(spec.entrypoint)} if spec.entrypoint else {}),
                connection_config=self._config(),
            )
        except Exception as exc:
            raise _map_error(exc, f"creating an OpenSandbox sandbox from {image}", not_found=SandboxError) from exc
        now = datetime.now(dt_timezone.utc)
        downgrades = [
            f"pids={spec.pids}, max_file_mb={spec.max_file_mb}, open_files={spec.open_files} are not set per "
            "sandbox by OpenSandbox; the server's own limits ([docker] pids_limit, ...) apply"
        ]
        if ttl_s is not None and spec.ttl is not None and ttl_s > spec.ttl.total_seconds():
            downgrades.append(f"ttl raised to the server minimum of {MIN_SERVER_TIMEOUT_S}s")
        sandbox = OpenSandbox(
            self, handle.id, spec, labels, handle=handle,
            created_at=now, expires_at=now + timedelta(seconds=ttl_s) if ttl_s else None, downgrades=downgrades,
        )
        try:
            result = sandbox.run(["mkdir", "-p", WORKDIR], timeout=60, cwd="/")
            if not result.ok:
                detail = result.stderr.strip() or result.exit_code
                raise SandboxError(f"cannot create {WORKDIR} in the new sandbox: {detail}")
        except Exception:
            self._destroy(handle.id)
            sandbox.close()
            raise
        return sandbox

    def _get(self, sandbox_id: str) -> OpenSandbox:
        try:
            info = self.manager().get_sandbox_info(sandbox_id)
        except Exception as exc:
            raise _map_error(exc, f"opensandbox sandbox {sandbox_id}") from exc
        if str(info.status.state).lower() in FINAL_STATES:
            raise SandboxNotFound(f"opensandbox sandbox {sandbox_id} is {info.status.state}")
        labels = dict(info.metadata or {})
        spec = SandboxSpec(
            image=info.image.image if info.image else None,
            ttl=None,
            labels={k: v for k, v in labels.items() if not k.startswith(PLATFORM_LABEL_PREFIX)},
        )
        return OpenSandbox(self, sandbox_id, spec, labels, handle=self._connect(sandbox_id),
                           created_at=info.created_at, expires_at=info.expires_at)

    def _list(self, labels: dict[str, str]) -> list[SandboxInfo]:
        sdk = _sdk()
        infos: list[SandboxInfo] = []
        page = 1
        while True:
            try:
                paged = self.manager().list_sandbox_infos(
                    sdk["SandboxFilter"](metadata=labels or None, page=page, page_size=100)
                )
            except Exception as exc:
                raise _map_error(exc, "listing OpenSandbox sandboxes", not_found=SandboxError) from exc
            for item in paged.sandbox_infos:
                state = str(item.status.state)
                if state.lower() in FINAL_STATES:
                    continue
                infos.append(SandboxInfo(
                    id=item.id, backend=self.name, labels=dict(item.metadata or {}), state=state.lower(),
                    created_at=item.created_at, expires_at=item.expires_at,
                    image=item.image.image if item.image else "",
                ))
            if not paged.pagination.has_next_page:
                return infos
            page += 1

    def _destroy(self, sandbox_id: str) -> bool:
        try:
            self.manager().kill_sandbox(sandbox_id)
        except Exception as exc:
            if _status_code(exc) == 404:
                return False
            raise _map_error(exc, f"deleting sandbox {sandbox_id}") from exc
        return True
