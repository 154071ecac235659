"""Fixtures for the API tests: tokens per role, an API client, a local HTTP receiver."""
from __future__ import annotations

import http.server
import json
import threading
from typing import Any, Callable, Iterator

import pytest

ROLES = ("viewer", "reviewer", "approver", "admin")


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # Every API test creates users; the production hasher costs ~0.3 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_throttle_cache() -> Iterator[None]:
    # Throttle counters live in a cache, which outlives each test's database.
    from django.core.cache import caches

    caches["api"].clear()
    yield
    caches["api"].clear()


@pytest.fixture
def make_token(make_user: Callable[..., Any]) -> Callable[..., tuple[Any, str]]:
    """make_token(role): (ApiToken row, plain token) for a new user in that role (None: no role)."""
    from trajplatform.api_models import api_token_create

    def _make(role: str | None = "viewer", user: Any = None) -> tuple[Any, str]:
        user = user or make_user(role)
        return api_token_create(user=user, name=f"{role}-token", actor=None)

    return _make


@pytest.fixture
def client_as(make_token: Callable[..., tuple[Any, str]]) -> Callable[..., Any]:
    """client_as(role): an APIClient sending a fresh token of a user in that role.

    "anonymous": no credentials; "bad": a token that does not exist; "revoked": a revoked
    admin token.
    """
    from rest_framework.test import APIClient

    from trajplatform.api_models import api_token_revoke

    def _client(who: str) -> Any:
        client = APIClient()
        if who == "anonymous":
            return client
        if who == "bad":
            client.credentials(HTTP_AUTHORIZATION="Bearer trj_not-a-real-token")
            return client
        if who == "revoked":
            token, raw = make_token("admin")
            api_token_revoke(token=token, actor=None)
        else:
            token, raw = make_token(who)
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        client.token = token
        return client

    return _client


class Receiver:
    """A loopback HTTP server recording requests and answering with scripted status codes."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []  # popped per request; empty: 200
        self.body: bytes = b'{"ok": true}'
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                receiver.requests.append(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": raw}
                )
                code = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(receiver.body)))
                self.end_headers()
                self.wfile.write(receiver.body)

            do_POST = _answer
            do_GET = _answer
            do_HEAD = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def json_bodies(self) -> list[Any]:
        return [json.loads(r["body"]) for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()
