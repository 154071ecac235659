"""The production path: PostgreSQL, django-q2 on Redis, channels-redis, several worker clusters.

These tests need a Redis server and PostgreSQL: `make test-redis` (part of `make test`) runs
them under `tests/tools/with-postgres tests/tools/with-redis`. Without REDIS_URL nothing here is
collected (the SQLite and PostgreSQL passes of the suite run without Redis); run explicitly
without it, pytest collects no test and the Makefile treats that as a failure.

A "cluster" is `manage.py qcluster` in a process group of its own, with its own TRAJ_VAR_DIR
and SANDBOX_ROOT (what a separate machine would have) and, through `unshare --uts`, its own
host name: the reaper and the worker-start hook tell machines apart by host name, so each
cluster here is a machine as far as the platform can tell.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from django.conf import settings

if not os.environ.get("REDIS_URL"):
    collect_ignore_glob = ["test_*.py"]

# Upper bounds on waiting (a broken test fails instead of hanging), not measured times.
CLUSTER_START_S = 60
UNSHARE = shutil.which("unshare")


def test_database_url() -> str:
    """DATABASE_URL of the test database this process created."""
    from tests.tasks.test_live_log_browser import _test_database_url

    return _test_database_url()


test_database_url.__test__ = False  # a helper, not a test


class Cluster:
    """One worker cluster (`manage.py qcluster`) as machine `host`; see the module docstring."""

    def __init__(self, host: str, root: Path, env: dict[str, str]):
        self.host = host
        self.var = root / host / "var"
        self.sandboxes = root / host / "sandboxes"
        self.var.mkdir(parents=True, exist_ok=True)
        self.sandboxes.mkdir(mode=0o711, parents=True, exist_ok=True)
        (root / host).chmod(0o711)
        self.log = root / host / "qcluster.log"
        self.env = {**env, "TRAJ_VAR_DIR": str(self.var), "SANDBOX_ROOT": str(self.sandboxes)}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Cluster":
        assert UNSHARE, "unshare (util-linux) is needed to give each cluster its own host name"
        script = f'hostname "$1" && exec "$2" manage.py qcluster'
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [UNSHARE, "--uts", "sh", "-c", script, "sh", self.host, sys.executable],
                cwd=settings.BASE_DIR, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_running(self) -> None:
        """Until the cluster's workers have started (django-q2 logs the cluster as running at
        INFO; its logger follows LOG_LEVEL, not Q_LOG_LEVEL, under the platform's LOGGING)."""
        deadline = time.monotonic() + CLUSTER_START_S
        while time.monotonic() < deadline:
            self.check()
            if " running." in self.log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        raise AssertionError(f"cluster {self.host} did not start:\n{self.tail()}")

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"cluster {self.host} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def kill(self) -> None:
        """kill -9 the whole cluster (sentinel, pusher, workers, monitor, their sandboxes)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """SIGTERM (django-q2 stops its workers), then SIGKILL if it has not stopped soon."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=3)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        self.kill()


@pytest.fixture
def redis_client() -> Iterator[Any]:
    """A client of the test Redis, emptied before and after the test (queue, cache, channels)."""
    import redis

    client = redis.from_url(os.environ["REDIS_URL"])
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def machines_root() -> Iterator[Path]:
    """Where the clusters' var and sandbox directories go: under /var/tmp, not pytest's tmp_path,
    whose parents (mode 700) the sandbox user could not enter."""
    root = Path(tempfile.mkdtemp(prefix="trajplatform-machines-", dir="/var/tmp"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster_env() -> Callable[..., dict[str, str]]:
    """cluster_env(**overrides): the environment of a cluster on the test database and Redis."""
    def _env(**overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in {"DJANGO_ALLOW_ASYNC_UNSAFE", "LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL", "LLM_PROVIDERS"}}
        # One secret key for every machine: django-q2 signs each job with it, and a cluster
        # refuses ("BadSignature") the jobs of a web server or cluster with another key (a key
        # generated into each machine's own var dir is another key).
        env.update(DATABASE_URL=test_database_url(), REDIS_URL=os.environ["REDIS_URL"], PYTHONUNBUFFERED="1",
                   DJANGO_SECRET_KEY=settings.SECRET_KEY, LOG_LEVEL="INFO", Q_WORKERS="2", ROLLOUT_CONCURRENCY="4",
                   LLM_MAX_RETRIES="0")
        env.update(overrides)
        return env

    return _env


@pytest.fixture
def clusters(machines_root: Path) -> Iterator[Callable[..., Cluster]]:
    """clusters(host, env): start a cluster as machine `host` (a second one of the same host
    shares its directories, as a restart would); all are stopped after the test."""
    started: list[Cluster] = []

    def _start(host: str, env: dict[str, str]) -> Cluster:
        cluster = Cluster(host, machines_root, env).start()
        started.append(cluster)
        return cluster

    yield _start
    for cluster in started:
        cluster.stop()
