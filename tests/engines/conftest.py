"""Sandbox fixtures: a private SANDBOX_ROOT, the loopback OpenSandbox fake, one backend per kind."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.engines.opensandbox_fake import FakeOpenSandbox

SANDBOX_UID = 65534


@pytest.fixture(scope="session")
def sandbox_root_dir() -> Iterator[Path]:
    # Under /var/tmp, not pytest's tmp_path: the sandbox user must be able to enter the parents.
    root = Path(tempfile.mkdtemp(prefix="trajplatform-test-sandboxes-", dir="/var/tmp"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sandbox_settings(settings: Any, sandbox_root_dir: Path) -> Iterator[Path]:
    """A private SANDBOX_ROOT per test (a failing test's leftovers never reach another's listing),
    the local backend, no unisolated fallback, no pool. The sandbox test modules use it for
    every test (`pytestmark`); it is not autouse so other tests in this folder are untouched."""
    root = Path(tempfile.mkdtemp(prefix="t-", dir=sandbox_root_dir))
    root.chmod(0o711)
    settings.SANDBOX_ROOT = root
    settings.SANDBOX_BACKEND = "local"
    settings.SANDBOX_ALLOW_UNISOLATED = False
    settings.SANDBOX_POOL_SIZE = 0
    yield root
    from apps.engines.sandboxes.local import LocalBackend

    leftovers = LocalBackend(records=False, root=root)
    for info in leftovers.list():
        leftovers.destroy(info.id)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def opensandbox_fake() -> Iterator[FakeOpenSandbox]:
    root = Path(tempfile.mkdtemp(prefix="trajplatform-test-opensandbox-"))
    fake = FakeOpenSandbox(root)
    fake.start()
    yield fake
    fake.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fake(opensandbox_fake: FakeOpenSandbox) -> Iterator[FakeOpenSandbox]:
    """The session's fake with its failure switches reset."""
    opensandbox_fake.ignore_timeouts = False
    opensandbox_fake.ignore_interrupts = False
    yield opensandbox_fake
    opensandbox_fake.ignore_timeouts = False
    opensandbox_fake.ignore_interrupts = False


@pytest.fixture
def local_backend(db: Any) -> Any:
    from apps.engines.sandboxes import get_backend

    return get_backend("local")


@pytest.fixture
def opensandbox_backend(db: Any, fake: FakeOpenSandbox, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from apps.engines.sandboxes import get_backend

    # The fake's sandboxes share the host's network: a server a sandbox starts on a fixed port (the
    # gui page server's 8100) would collide with any other process of the machine (another test
    # worker or run): a free port each time.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setattr("apps.engines.scenes.gui.runtime.SITE_PORT", sock.getsockname()[1])
    settings.OPENSANDBOX_URL = fake.url
    settings.OPENSANDBOX_API_KEY = fake.api_key
    backend = get_backend("opensandbox")
    yield backend
    backend.close()


@pytest.fixture(params=["local", "opensandbox"])
def backend(request: pytest.FixtureRequest, db: Any) -> Any:
    """Each backend in turn: the conformance suite runs once per backend."""
    # `db` is requested here, statically: requested only through getfixturevalue, pytest-django
    # leaves the connection on the development database.
    return request.getfixturevalue(f"{request.param}_backend")


def sandbox_user_processes(root: Path | str | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of the sandbox user's processes that belong to sandboxes under `root`
    (default: this test's SANDBOX_ROOT): each bwrap binding a workspace there, and everything
    below it. Scoped so that sandboxes of other test runs on a shared machine do not count."""
    if root is None:
        from django.conf import settings

        root = settings.SANDBOX_ROOT
    needle = str(root)
    table: dict[int, tuple[int, int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry.name}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            table[int(entry.name)] = (int(fields["PPid"].split()[0]), int(fields["Uid"].split()[0]), cmdline.strip())
        except (OSError, KeyError, ValueError, IndexError):
            continue
    ours = {pid for pid, (_, uid, cmd) in table.items() if uid == SANDBOX_UID and needle in cmd}
    grew = True
    while grew:
        below = {pid for pid, (ppid, uid, _) in table.items() if ppid in ours and uid == SANDBOX_UID} - ours
        grew = bool(below)
        ours |= below
    return sorted((pid, table[pid][2]) for pid in ours)


def wait_for_no_sandbox_processes(timeout: float = 5.0, root: Path | str | None = None) -> list[tuple[int, str]]:
    """Poll until none of our sandboxes' processes is left (the kernel tears namespaces down async)."""
    deadline = time.monotonic() + timeout
    while True:
        left = sandbox_user_processes(root)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
