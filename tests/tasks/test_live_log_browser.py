"""The trajectory page in Chromium against a real daphne: backfill, live lines, reconnect.

daphne runs as a subprocess (`python -m daphne trajplatform.asgi:application`) on the test
database, exactly as `make serve` runs it. Lines are appended from this process, as a
worker process would; with the default in-memory channel layer they reach the daphne
process through the consumer's tail of the log table, with Redis (REDIS_URL) through the
channel layer.

Needs Debian's chromium (`apt-get install chromium`); playwright's sync API drives it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection, connections
from playwright.sync_api import Page, expect, sync_playwright

from apps.tasks.models import Trajectory
from apps.tasks.services import trajectory_log_append
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
]
# Upper bounds on waiting for something to appear (a hung test fails), not measured times.
WAIT_MS = 30_000
SERVER_START_S = 60
LISTENING = re.compile(r"Listening on TCP address 127\.0\.0\.1:(\d+)")


def _test_database_url() -> str:
    """DATABASE_URL of the test database this process created (SQLite file or PostgreSQL)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    if connection.vendor == "postgresql":
        auth = quote(s["USER"] or "", safe="")
        if s["PASSWORD"]:
            auth += ":" + quote(s["PASSWORD"], safe="")
        host = s["HOST"] or "localhost"
        port = f":{s['PORT']}" if s["PORT"] else ""
        return f"postgres://{auth}@{host}{port}/{quote(s['NAME'], safe='')}"
    raise RuntimeError(f"no DATABASE_URL form for {connection.vendor}")


def _server_env(static_root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(
        DATABASE_URL=_test_database_url(),
        STATIC_ROOT=str(static_root),
        DJANGO_DEBUG="0",
        DJANGO_HTTPS="0",
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        PYTHONUNBUFFERED="1",
    )
    return env


class DaphneServer:
    """`python -m daphne` on 127.0.0.1 in a subprocess; start() waits until it listens."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start on self.port (0: any free port, then remembered) and wait for the listening line."""
        log = self.log_path.open("a")
        offset = self.log_path.stat().st_size
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-v", "1", "-b", "127.0.0.1", "-p", str(self.port),
             "trajplatform.asgi:application"],
            cwd=settings.BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            with self.log_path.open() as fh:
                fh.seek(offset)
                match = LISTENING.search(fh.read())
            if match:
                self.port = int(match.group(1))
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"daphne did not start:\n{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@pytest.fixture(scope="module")
def static_root(tmp_path_factory) -> Path:
    """Collected static files: daphne serves them through whitenoise, as in production."""
    root = tmp_path_factory.mktemp("static")
    env = {**os.environ, "STATIC_ROOT": str(root)}
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--no-input", "-v0"], cwd=settings.BASE_DIR, env=env, check=True
    )
    return root


@pytest.fixture
def daphne_server(transactional_db, static_root, tmp_path):
    server = DaphneServer(_server_env(static_root), tmp_path / "daphne.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def page(daphne_server, monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # meanwhile are plain blocking calls, which Django refuses without this flag.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            browser.close()
            # While playwright's loop runs, Django keys connections by context rather than by
            # thread: the ORM calls made meanwhile used a connection of their own. Close it
            # here, or PostgreSQL refuses to drop the test database at the end of the run.
            connections.close_all()


@pytest.fixture
def trajectory(make_task):
    return Trajectory.objects.create(
        task=make_task(prompt="Count the files."),
        iteration=1,
        status=Trajectory.Status.RUNNING,
        model="scripted-reference",
        messages=[
            {"role": "user", "content": "Count the files. <script>window.__pwned = true</script>"},
            {"role": "assistant", "content": "Listing first.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
        ],
    )


def append_as_worker(trajectory_id: int, lines: list) -> None:
    """trajectory_log_append from a plain thread, as a worker runs it.

    Not from this thread: playwright's loop runs here, and the service's after-commit
    broadcast (async_to_sync) refuses to run in a thread with a running loop.
    """
    def work() -> None:
        try:
            trajectory_log_append(trajectory_id=trajectory_id, lines=lines)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(work).result()


def sign_in_and_open(page: Page, server: DaphneServer, user, path: str) -> None:
    page.goto(f"{server.url}/admin/login/?next={path}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{server.url}{path}")


def test_the_page_backfills_then_shows_new_lines_live(daphne_server, page, viewer, trajectory):
    append_as_worker(trajectory.pk, [("system", "sandbox ready", {}), ("thought", "<b>not bold</b>", {"step": 1})],
    )
    sign_in_and_open(page, daphne_server, viewer, f"/trajectories/{trajectory.pk}/")
    panel = page.locator("#live-log")

    expect(page.locator("h1")).to_contain_text(f"Trajectory #{trajectory.pk}")
    expect(page.locator(".step .part.action")).to_contain_text("ls")
    expect(panel.locator("li[data-seq='1']")).to_contain_text("sandbox ready", timeout=WAIT_MS)
    expect(panel.locator("li[data-seq='2']")).to_contain_text("<b>not bold</b>", timeout=WAIT_MS)
    expect(panel).to_have_attribute("data-state", "live", timeout=WAIT_MS)

    page.evaluate("window.__sameDocument = true")
    append_as_worker(trajectory.pk, [("action", "ls -la", {}), ("output", "a.txt", {})])
    expect(panel.locator("li[data-seq='4']")).to_contain_text("a.txt", timeout=WAIT_MS)
    expect(panel.locator("li[data-seq='3']")).to_contain_text("ls -la")
    expect(panel.locator("li[data-seq]")).to_have_count(4)
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    assert panel.locator("b").count() == 0  # log text is text, not markup
    assert page.evaluate("window.__pwned === undefined")  # the message's <script> never ran


def test_after_a_server_restart_the_page_reconnects_and_backfills_what_it_missed(
    daphne_server, page, viewer, trajectory
):
    append_as_worker(trajectory.pk, [("system", "started", {})])
    sign_in_and_open(page, daphne_server, viewer, f"/trajectories/{trajectory.pk}/")
    panel = page.locator("#live-log")
    expect(panel.locator("li[data-seq='1']")).to_contain_text("started", timeout=WAIT_MS)
    expect(panel).to_have_attribute("data-state", "live", timeout=WAIT_MS)

    daphne_server.stop()
    expect(panel).to_have_attribute("data-state", "reconnecting", timeout=WAIT_MS)
    append_as_worker(trajectory.pk, [("output", "written while the server was down", {})])
    daphne_server.start()  # same port

    expect(panel.locator("li[data-seq='2']")).to_contain_text("written while the server was down", timeout=WAIT_MS)
    expect(panel).to_have_attribute("data-state", "live", timeout=WAIT_MS)
    append_as_worker(trajectory.pk, [("result", "after the restart", {})])
    expect(panel.locator("li[data-seq='3']")).to_contain_text("after the restart", timeout=WAIT_MS)
    expect(panel.locator("li[data-seq]")).to_have_count(3)


def test_once_access_is_revoked_the_page_stops_retrying(daphne_server, page, viewer, trajectory):
    sign_in_and_open(page, daphne_server, viewer, f"/trajectories/{trajectory.pk}/")
    panel = page.locator("#live-log")
    expect(panel).to_have_attribute("data-state", "live", timeout=WAIT_MS)

    viewer.groups.clear()
    daphne_server.stop()
    daphne_server.start()

    expect(panel).to_have_attribute("data-state", "signed-out", timeout=WAIT_MS)
    expect(panel.locator("[data-log-status]")).to_contain_text("not allowed")
