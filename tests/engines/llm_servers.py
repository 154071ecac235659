"""Loopback HTTP servers standing in for an LLM endpoint in the client and agent-loop tests.

`LoopbackServer` binds a free port on 127.0.0.1 and serves from a daemon thread; a subclass says
what each request gets (`on_post`, `on_get`: status, headers, payload). Closing never waits for a
connection the client keeps alive (daemon request threads, no join on close). `serve_each` is the
body of a fixture that makes servers on demand and closes them all after the test.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

Answer = tuple[int, dict[str, str], bytes]


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def on_post(self, request: BaseHTTPRequestHandler, raw: bytes) -> Answer:
        return 405, {}, b"{}"

    def on_get(self, request: BaseHTTPRequestHandler) -> Answer:
        return 404, {}, b"{}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackServer

    def do_POST(self) -> None:  # noqa: N802
        self._send(*self.server.on_post(self, self.rfile.read(int(self.headers.get("Content-Length") or 0))))

    def do_GET(self) -> None:  # noqa: N802
        self._send(*self.server.on_get(self))

    def _send(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


def json_answer(body: Any, status: int = 200) -> Answer:
    return status, {}, json.dumps(body).encode()


def serve_each(make: Callable[..., LoopbackServer]) -> Iterator[Callable[..., Any]]:
    """For a fixture: `yield from serve_each(Server)` gives the test a factory of servers, all
    closed after it."""
    servers: list[LoopbackServer] = []

    def start(*args: Any, **kwargs: Any) -> Any:
        servers.append(make(*args, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
