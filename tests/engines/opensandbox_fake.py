"""A loopback fake of OpenSandbox 1.1.1: the lifecycle API (/v1) and execd, on one port.

Written from the wire contract in the project's OpenSandbox notes (reference/opensandbox-
notes.md §1.2, §1.3, §4) and the execd controllers' behaviour, not from OpenSandbox code. The
real `opensandbox==1.1.1` SDK drives it in the tests, and `test_opensandbox_fake.py` parses
every response kind with the SDK's own generated models.

What it implements, and how faithfully:

- lifecycle: POST /v1/sandboxes (202; validates timeout >= 60 or null, entrypoint, K8s-style
  metadata labels, the API key header), GET one / list (state + url-encoded metadata filter,
  pagination), DELETE (204; 404 for unknown ids), GET .../endpoints/{port} for any port
  (44772 and 18080 both resolve), PATCH .../metadata, POST .../renew-expiration,
  POST /v1/metrics/events; absent fields are omitted, never null; errors are {"code","message"}.
- execd (at the endpoint it hands out, direct `/execd/{id}/{port}` or proxied
  `/v1/sandboxes/{id}/proxy/{port}`, the latter requiring the API key): GET /ping,
  POST /command as text/event-stream frames `{json}\\n\\n` (init, stdout/stderr lines without
  the newline, then execution_complete or error with evalue "<exit code>" / "-1" +
  "signal: <name>" as Go reports a killed process; `timeout` in ms kills the process group),
  DELETE /command?id= (interrupt), POST /files/upload (multipart metadata+file pairs,
  chunked bodies, parent directories created, octal-digit mode), GET /files/download
  (Range -> 206, missing -> 404 FILE_NOT_FOUND).
- background commands (`background: true`): init then an immediate execution_complete while
  the process keeps running (its `timeout` still applies); GET /command/status/{id}
  ({id, content, running, exit_code, error, started_at, finished_at}; absent fields omitted)
  and GET /command/{id}/logs?cursor=N (stdout and stderr interleaved as text/plain from line N,
  the next line cursor in EXECD-COMMANDS-TAIL-CURSOR). The output goes to a log file outside
  the sandbox's own directories, as execd keeps it.
- ports: any other port's endpoint resolves as the Docker runtime's bridge mode does, to
  execd's reverse proxy `{host}:{execd port}/proxy/{port}` (here `/execd/{id}/44772/proxy/{port}`),
  or to the server's `/v1/sandboxes/{id}/proxy/{port}` with use_server_proxy (API key
  required). Both forward HTTP, streamed (SSE passes through), to 127.0.0.1:{port}; with
  nothing listening they answer 502 like Go's reverse proxy. Every sandbox shares the host's
  loopback here (no network namespace per sandbox), so tests pick a free port.
- images: `trajplatform-python` is the platform's Python image: its python3 imports the
  platform's packages (fastmcp), bound read-only at PLATFORM_PYTHON_PATH as on the local backend.
- commands really run: `bash -c` (or the argv) inside a bubblewrap mount namespace with the
  host /usr and /etc read-only, the sandbox's own /workspace and /tmp read-write.

What it does not do: other images (every sandbox is the host's /usr), resource limits, network
policy, expiry, pause/resume, snapshots, sessions, code contexts, the real execd's
3-second ping frames, uid/gid switching. Switches for failure injection:
`ignore_timeouts` (never apply the command timeout, like a hung execd) and
`ignore_interrupts` (DELETE /command does nothing).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from apps.engines.sandboxes.base import PLATFORM_PYTHON_PATH, PLATFORM_PYTHON_PROFILE

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
EXECD_PORT = 44772
EGRESS_PORT = 18080
TAIL_CURSOR_HEADER = "EXECD-COMMANDS-TAIL-CURSOR"
# Not forwarded by a reverse proxy (hop-by-hop, or recomputed for the new message).
HOP_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade",
               "proxy-connection", API_KEY_HEADER.lower()}
GO_SIGNAL_NAMES = {1: "hangup", 2: "interrupt", 6: "aborted", 9: "killed", 11: "segmentation fault", 13: "broken pipe",
                   15: "terminated", 24: "CPU time limit exceeded", 25: "file size limit exceeded"}
LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


def _label_ok(key: str, value: str) -> bool:
    name = key.rpartition("/")[2]
    return (
        bool(name) and len(name) <= 63 and set(name) <= LABEL_CHARS and name[0].isalnum() and name[-1].isalnum()
        and len(value) <= 63 and set(value) <= LABEL_CHARS and (not value or (value[0].isalnum() and value[-1].isalnum()))
        and not key.startswith("opensandbox.io/")
    )


@dataclass
class FakeSandbox:
    id: str
    root: Path
    image: str
    entrypoint: list[str]
    env: dict[str, str]
    metadata: dict[str, str]
    resource_limits: dict[str, str]
    created_at: datetime
    expires_at: datetime | None
    state: str = "Running"
    running: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    background: dict[str, "BackgroundCommand"] = field(default_factory=dict)

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def host_path(self, path: str) -> Path | None:
        """Where an in-sandbox path lives on the host; None outside /workspace and /tmp."""
        normal = os.path.normpath(path if path.startswith("/") else f"/workspace/{path}")
        for prefix, base in (("/workspace", self.workspace), ("/tmp", self.tmp)):
            if normal == prefix or normal.startswith(prefix + "/"):
                return base / normal[len(prefix):].lstrip("/")
        return None

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "status": {"state": self.state},
            "entrypoint": self.entrypoint,
            "createdAt": _rfc3339(self.created_at),
            "image": {"uri": self.image},
        }
        if self.expires_at is not None:
            body["expiresAt"] = _rfc3339(self.expires_at)
        if self.metadata:
            body["metadata"] = dict(self.metadata)
        return body


@dataclass
class BackgroundCommand:
    id: str
    content: str
    proc: asyncio.subprocess.Process
    log: Path
    started_at: datetime
    finished_at: datetime | None = None

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "content": self.content, "running": self.finished_at is None,
                                "started_at": _rfc3339(self.started_at)}
        if self.finished_at is not None:
            code = self.proc.returncode
            body["finished_at"] = _rfc3339(self.finished_at)
            body["exit_code"] = code if code is not None and code >= 0 else -1
            if code:
                body["error"] = f"exit status {code}" if code > 0 else f"signal: {GO_SIGNAL_NAMES.get(-code, -code)}"
        return body


class FakeOpenSandbox:
    """Start with `start()` (returns the base URL), stop with `stop()`."""

    def __init__(self, root: Path, *, api_key: str = "fake-api-key"):
        self.root = Path(root)
        self.api_key = api_key
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.requests: list[tuple[str, str]] = []
        self.create_bodies: list[dict[str, Any]] = []
        self.execd_key_leaks: list[str] = []  # execd requests (direct mode) that carried the API key
        self.interrupts: list[str] = []
        self.forwarded: list[tuple[str, str, int, str]] = []  # (sandbox id, method, port, path) through a proxy
        self._forward_client: httpx.AsyncClient | None = None
        self.ignore_timeouts = False
        self.ignore_interrupts = False
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        execd_routes = [
            Route("/ping", self.ping, methods=["GET"]),
            Route("/command", self.command, methods=["POST", "DELETE"]),
            Route("/files/upload", self.upload, methods=["POST"]),
            Route("/files/download", self.download, methods=["GET"]),
            Route("/command/status/{cid}", self.command_status, methods=["GET"]),
            Route("/command/{cid}/logs", self.command_logs, methods=["GET"]),
        ]
        routes = [
            Route("/health", lambda request: JSONResponse({"status": "healthy"}), methods=["GET"]),
            Route("/v1/sandboxes", self.create_or_list, methods=["POST", "GET"]),
            Route("/v1/sandboxes/{sid}", self.get_or_delete, methods=["GET", "DELETE"]),
            Route("/v1/sandboxes/{sid}/endpoints/{port:int}", self.endpoint, methods=["GET"]),
            Route("/v1/sandboxes/{sid}/metadata", self.patch_metadata, methods=["PATCH"]),
            Route("/v1/sandboxes/{sid}/renew-expiration", self.renew, methods=["POST"]),
            Route("/v1/metrics/events", lambda request: Response(status_code=204), methods=["POST"]),
        ]
        for prefix, proxied in (("/execd/{sid}/{port:int}", False), ("/v1/sandboxes/{sid}/proxy/{port:int}", True)):
            for route in execd_routes:
                handler = self._execd(route.endpoint, proxied)
                routes.append(Route(prefix + route.path, handler, methods=list(route.methods or [])))
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
        # execd's own reverse proxy into the sandbox (direct mode), and the server's (proxy mode).
        routes.append(Route("/execd/{sid}/{port:int}/proxy/{target:int}/{path:path}",
                            self._execd(self.forward, False), methods=methods))
        routes.append(Route("/v1/sandboxes/{sid}/proxy/{target:int}/{path:path}",
                            self._execd(self.forward, True), methods=methods))
        self.app = Starlette(routes=routes)

    # -- server ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake OpenSandbox server did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        for sandbox in list(self.sandboxes.values()):
            self._kill_all(sandbox)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    # -- helpers -----------------------------------------------------------------------------

    def _authorised(self, request: Request) -> bool:
        return request.headers.get(API_KEY_HEADER) == self.api_key

    def _sandbox(self, sid: str) -> FakeSandbox | None:
        sandbox = self.sandboxes.get(sid)
        return sandbox if sandbox is not None and sandbox.state != "Terminated" else None

    def _execd(self, handler: Any, proxied: bool) -> Any:
        async def endpoint(request: Request) -> Response:
            self.requests.append((request.method, request.url.path))
            if proxied and not self._authorised(request):
                return _error(401, "MISSING_API_KEY", "proxy requests need the API key")
            if not proxied and API_KEY_HEADER.lower() in request.headers:
                self.execd_key_leaks.append(request.url.path)
            sandbox = self._sandbox(request.path_params["sid"])
            if sandbox is None:
                return _error(404, "SANDBOX_NOT_FOUND", "no such sandbox")
            return await handler(request, sandbox)

        return endpoint

    def _kill_all(self, sandbox: FakeSandbox) -> None:
        for proc in list(sandbox.running.values()):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # -- lifecycle -----------------------------------------------------------------------------

    async def create_or_list(self, request: Request) -> Response:
        self.requests.append((request.method, request.url.path))
        if not self._authorised(request):
            return _error(401, "MISSING_API_KEY", "missing or wrong OPEN-SANDBOX-API-KEY")
        if request.method == "GET":
            return self._list(request)
        body = await request.json()
        self.create_bodies.append(body)
        timeout = body.get("timeout")
        if timeout is not None and (not isinstance(timeout, int) or timeout < 60):
            return JSONResponse({"detail": [{"loc": ["body", "timeout"], "msg": "must be >= 60", "type": "value_error"}]},
                                status_code=422)
        if not (body.get("image") or {}).get("uri"):
            return _error(400, "SANDBOX::INVALID_PARAMETER", "image.uri is required")
        entrypoint = body.get("entrypoint") or []
        if not entrypoint:
            return _error(400, "SANDBOX::INVALID_ENTRYPOINT", "Entrypoint must contain at least one command.")
        metadata = body.get("metadata") or {}
        for key, value in metadata.items():
            if not _label_ok(key, value):
                return _error(400, "SANDBOX::INVALID_METADATA_LABEL", f"Metadata {key}={value!r} is not a valid label")
        sid = uuid.uuid4().hex
        now = datetime.now(timezone.utc)
        sandbox = FakeSandbox(
            id=sid, root=self.root / sid, image=body["image"]["uri"], entrypoint=entrypoint,
            env=body.get("env") or {}, metadata=metadata, resource_limits=body.get("resourceLimits") or {},
            created_at=now, expires_at=now + timedelta(seconds=timeout) if timeout else None,
        )
        sandbox.workspace.mkdir(parents=True)
        sandbox.tmp.mkdir()
        self.sandboxes[sid] = sandbox
        response = {"id": sid, "status": {"state": "Running"}, "createdAt": _rfc3339(now), "entrypoint": entrypoint}
        if sandbox.expires_at is not None:
            response["expiresAt"] = _rfc3339(sandbox.expires_at)
        if metadata:
            response["metadata"] = metadata
        return JSONResponse(response, status_code=202)

    def _list(self, request: Request) -> Response:
        states = request.query_params.getlist("state")
        wanted = dict(parse_qsl(request.query_params.get("metadata", "")))
        page = int(request.query_params.get("page", 1))
        size = int(request.query_params.get("pageSize", 20))
        items = [
            s for s in self.sandboxes.values()
            if (not states or s.state in states) and all(s.metadata.get(k) == v for k, v in wanted.items())
        ]
        total_pages = max(1, -(-len(items) // size))
        chunk = items[(page - 1) * size: page * size]
        return JSONResponse({
            "items": [s.as_json() for s in chunk],
            "pagination": {"page": page, "pageSize": size, "totalItems": len(items), "totalPages": total_pages,
                           "hasNextPage": page < total_pages},
        })

    async def get_or_delete(self, request: Request) -> Response:
        self.requests.append((request.method, request.url.path))
        if not self._authorised(request):
            return _error(401, "MISSING_API_KEY", "missing or wrong OPEN-SANDBOX-API-KEY")
        sandbox = self._sandbox(request.path_params["sid"])
        if sandbox is None:
            return _error(404, "SANDBOX::NOT_FOUND", f"sandbox {request.path_params['sid']} not found")
        if request.method == "GET":
            return JSONResponse(sandbox.as_json())
        procs = list(sandbox.running.values())
        self._kill_all(sandbox)
        for proc in procs:  # gone when the 204 comes back, as with a removed container
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except asyncio.TimeoutError:
                pass
        sandbox.state = "Terminated"
        shutil.rmtree(sandbox.root, ignore_errors=True)
        return Response(status_code=204)

    async def endpoint(self, request: Request) -> Response:
        self.requests.append((request.method, request.url.path))
        if not self._authorised(request):
            return _error(401, "MISSING_API_KEY", "missing or wrong OPEN-SANDBOX-API-KEY")
        sid, port = request.path_params["sid"], request.path_params["port"]
        if self._sandbox(sid) is None:
            return _error(404, "SANDBOX::NOT_FOUND", f"sandbox {sid} not found")
        if not 0 < port < 65536:
            return _error(400, "SANDBOX::INVALID_PARAMETER", f"port {port} is out of range")
        if request.query_params.get("use_server_proxy") == "true":
            return JSONResponse({"endpoint": f"127.0.0.1:{self.port}/v1/sandboxes/{sid}/proxy/{port}"})
        if port in (EXECD_PORT, EGRESS_PORT):
            return JSONResponse({"endpoint": f"127.0.0.1:{self.port}/execd/{sid}/{port}"})
        # Docker bridge mode: any other port is reached through execd's own /proxy/{port}.
        return JSONResponse({"endpoint": f"127.0.0.1:{self.port}/execd/{sid}/{EXECD_PORT}/proxy/{port}"})

    async def patch_metadata(self, request: Request) -> Response:
        self.requests.append((request.method, request.url.path))
        if not self._authorised(request):
            return _error(401, "MISSING_API_KEY", "missing or wrong OPEN-SANDBOX-API-KEY")
        sandbox = self._sandbox(request.path_params["sid"])
        if sandbox is None:
            return _error(404, "SANDBOX::NOT_FOUND", "sandbox not found")
        for key, value in (await request.json()).items():
            if value is None:
                sandbox.metadata.pop(key, None)
            elif not _label_ok(key, value):
                return _error(400, "SANDBOX::INVALID_METADATA_LABEL", f"Metadata {key}={value!r} is not a valid label")
            else:
                sandbox.metadata[key] = value
        return JSONResponse(sandbox.as_json())

    async def renew(self, request: Request) -> Response:
        self.requests.append((request.method, request.url.path))
        if not self._authorised(request):
            return _error(401, "MISSING_API_KEY", "missing or wrong OPEN-SANDBOX-API-KEY")
        sandbox = self._sandbox(request.path_params["sid"])
        if sandbox is None:
            return _error(404, "SANDBOX::NOT_FOUND", "sandbox not found")
        sandbox.expires_at = datetime.fromisoformat((await request.json())["expiresAt"].replace("Z", "+00:00"))
        return JSONResponse({"expiresAt": _rfc3339(sandbox.expires_at)})

    # -- execd ---------------------------------------------------------------------------------------

    async def ping(self, request: Request, sandbox: FakeSandbox) -> Response:
        return Response(status_code=200)

    def _argv(self, sandbox: FakeSandbox, body: dict[str, Any]) -> list[str]:
        cwd = body.get("cwd") or "/workspace"
        program = ["/bin/bash", "-c", body["command"]] if body.get("command") is not None else list(body["argv"])
        argv = [self._bwrap, "--die-with-parent", "--tmpfs", "/", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link, target in (("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")):
            if os.path.exists(link):
                argv += ["--symlink", target, link]
        argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(sandbox.workspace), "/workspace",
                 "--bind", str(sandbox.tmp), "/tmp", "--chdir", cwd, "--clearenv"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root"}
        if sandbox.image == PLATFORM_PYTHON_PROFILE:
            from apps.engines.sandboxes.local import platform_python_packages

            argv += ["--ro-bind", platform_python_packages(), PLATFORM_PYTHON_PATH]
            env["PYTHONPATH"] = PLATFORM_PYTHON_PATH
        env.update({**sandbox.env, **(body.get("envs") or {})})
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return argv + ["--", *program]

    async def command(self, request: Request, sandbox: FakeSandbox) -> Response:
        if request.method == "DELETE":
            exec_id = request.query_params.get("id", "")
            self.interrupts.append(exec_id)
            proc = sandbox.running.get(exec_id)
            if proc is not None and not self.ignore_interrupts:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return JSONResponse({}) if proc is not None else _error(404, "COMMAND_NOT_FOUND", "no such command")
        body = await request.json()
        if not body.get("command") and not body.get("argv"):
            return _error(400, "INVALID_REQUEST", "command or argv is required")
        exec_id = uuid.uuid4().hex
        timeout_ms = body.get("timeout")
        if body.get("background"):
            return await self._background(sandbox, body, exec_id, timeout_ms)
        proc = await asyncio.create_subprocess_exec(
            *self._argv(sandbox, body), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=1 << 20,
        )
        sandbox.running[exec_id] = proc

        async def stream():
            started = time.monotonic()
            events: asyncio.Queue = asyncio.Queue()
            frame = self._frame

            async def pump(reader: asyncio.StreamReader, kind: str) -> None:
                while True:
                    try:
                        line = await reader.readuntil(b"\n")
                    except asyncio.IncompleteReadError as exc:
                        line = exc.partial
                    except asyncio.LimitOverrunError as exc:
                        line = await reader.readexactly(exc.consumed)
                    if not line:
                        return
                    await events.put(frame({"type": kind, "text": line.rstrip(b"\n").decode("utf-8", "replace")}))

            async def waiter() -> None:
                readers = asyncio.gather(pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr"))
                await self._wait(proc, timeout_ms)
                await readers
                code = proc.returncode
                if code == 0:
                    await events.put(frame({"type": "execution_complete",
                                            "execution_time": int((time.monotonic() - started) * 1000)}))
                elif code > 0:
                    await events.put(frame({"type": "error", "error": {
                        "ename": "CommandExecError", "evalue": str(code), "traceback": [f"exit status {code}"]}}))
                else:
                    name = GO_SIGNAL_NAMES.get(-code, f"signal {-code}")
                    await events.put(frame({"type": "error", "error": {
                        "ename": "CommandExecError", "evalue": "-1", "traceback": [f"signal: {name}"]}}))
                await events.put(None)

            task = asyncio.ensure_future(waiter())
            try:
                yield frame({"type": "init", "text": exec_id})
                while True:
                    item = await events.get()
                    if item is None:
                        break
                    yield item
            finally:
                sandbox.running.pop(exec_id, None)
                if proc.returncode is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                task.cancel()

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def _wait(self, proc: asyncio.subprocess.Process, timeout_ms: Any) -> None:
        """Until the process exits; its group is killed once the command's `timeout` (ms) passes."""
        try:
            if timeout_ms and not self.ignore_timeouts:
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout_ms / 1000)
            else:
                await proc.wait()
        except asyncio.TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    @staticmethod
    def _frame(event: dict[str, Any]) -> bytes:
        return (json.dumps({**event, "timestamp": int(time.time() * 1000)}) + "\n\n").encode()

    async def _background(self, sandbox: FakeSandbox, body: dict[str, Any], exec_id: str, timeout_ms: Any) -> Response:
        log = sandbox.root / "execd-logs" / exec_id
        log.parent.mkdir(exist_ok=True)
        with open(log, "wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(sandbox, body), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )
        command = BackgroundCommand(id=exec_id, content=body.get("command") or " ".join(body.get("argv") or []),
                                    proc=proc, log=log, started_at=datetime.now(timezone.utc))
        sandbox.running[exec_id] = proc
        sandbox.background[exec_id] = command

        async def watch() -> None:
            await self._wait(proc, timeout_ms)
            command.finished_at = datetime.now(timezone.utc)
            sandbox.running.pop(exec_id, None)

        asyncio.ensure_future(watch())

        async def stream():
            # execution_complete right away: it says the command was started, not that it ended.
            yield self._frame({"type": "init", "text": exec_id})
            yield self._frame({"type": "execution_complete", "execution_time": 0})

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def command_status(self, request: Request, sandbox: FakeSandbox) -> Response:
        command = sandbox.background.get(request.path_params["cid"])
        if command is None:
            return _error(404, "COMMAND_NOT_FOUND", "no such command")
        return JSONResponse(command.status())

    async def command_logs(self, request: Request, sandbox: FakeSandbox) -> Response:
        command = sandbox.background.get(request.path_params["cid"])
        if command is None:
            return _error(404, "COMMAND_NOT_FOUND", "no such command")
        try:
            cursor = max(0, int(request.query_params.get("cursor", 0)))
        except ValueError:
            return _error(400, "INVALID_REQUEST", "cursor must be an integer")
        lines = command.log.read_bytes().decode("utf-8", "replace").splitlines(keepends=True)
        return Response("".join(lines[cursor:]), media_type="text/plain",
                        headers={TAIL_CURSOR_HEADER: str(len(lines))})

    async def forward(self, request: Request, sandbox: FakeSandbox) -> Response:
        """A reverse proxy to 127.0.0.1:{target}: the sandbox's port, streamed both ways."""
        target, path = request.path_params["target"], request.path_params["path"]
        self.forwarded.append((sandbox.id, request.method, target, "/" + path))
        if self._forward_client is None:
            # Created on the server's loop; never proxies through the environment's settings.
            self._forward_client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(60, read=None))
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        upstream = self._forward_client.build_request(
            request.method, f"http://127.0.0.1:{target}/{path}", params=request.query_params.multi_items(),
            headers=headers, content=await request.body(),
        )
        try:
            answer = await self._forward_client.send(upstream, stream=True)
        except httpx.TransportError as exc:
            return _error(502, "PROXY_ERROR", f"port {target} in sandbox {sandbox.id}: {type(exc).__name__}")

        async def relay():
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
            finally:
                await answer.aclose()

        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(relay(), status_code=answer.status_code, headers=kept)

    async def upload(self, request: Request, sandbox: FakeSandbox) -> Response:
        content_type = request.headers.get("content-type", "")
        if "boundary=" not in content_type:
            return _error(400, "INVALID_FILE", "multipart form is empty")
        boundary = content_type.split("boundary=", 1)[1].strip().strip('"').encode()
        body = await request.body()  # Starlette reads chunked request bodies too
        parts: list[tuple[str, bytes]] = []
        for chunk in body.split(b"--" + boundary):
            if not chunk.strip() or chunk.strip() == b"--":
                continue
            head, _, data = chunk.lstrip(b"\r\n").partition(b"\r\n\r\n")
            name = head.split(b'name="', 1)[1].split(b'"', 1)[0].decode() if b'name="' in head else ""
            parts.append((name, data[:-2] if data.endswith(b"\r\n") else data))
        metas = [json.loads(data) for name, data in parts if name == "metadata"]
        files = [data for name, data in parts if name == "file"]
        if not metas or len(metas) != len(files):
            return _error(400, "INVALID_FILE", f"metadata and file count mismatch: {len(metas)} vs {len(files)}")
        for meta, data in zip(metas, files):
            target = sandbox.host_path(meta["path"])
            if target is None:
                message = f"the fake keeps files only under /workspace and /tmp, not {meta['path']}"
                return _error(500, "RUNTIME_ERROR", message)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            if meta.get("mode"):
                os.chmod(target, int(str(meta["mode"]), 8))
        return JSONResponse({})

    async def download(self, request: Request, sandbox: FakeSandbox) -> Response:
        path = request.query_params.get("path", "")
        if not path:
            return _error(400, "MISSING_QUERY", "missing query parameter 'path'")
        target = sandbox.host_path(path)
        if target is None or not target.is_file():
            return _error(404, "FILE_NOT_FOUND", f"file not found: {path}")
        data = target.read_bytes()
        header = request.headers.get("range", "")
        if header.startswith("bytes="):
            start_s, _, end_s = header[6:].partition("-")
            start = int(start_s or 0)
            end = min(int(end_s) if end_s else len(data) - 1, len(data) - 1)
            if start >= len(data) and data:
                return _error(416, "UNKNOWN", "range not satisfiable")
            return Response(data[start:end + 1], status_code=206, media_type="application/octet-stream",
                            headers={"Content-Range": f"bytes {start}-{end}/{len(data)}"})
        return Response(data, media_type="application/octet-stream")
