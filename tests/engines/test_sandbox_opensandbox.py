"""OpenSandbox backend specifics, and checks that keep the loopback fake honest.

The fake (opensandbox_fake.py) is only worth what its wire shapes are worth: the first tests
parse each kind of response with the SDK's own generated models, as a real server's would be.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import httpx
import opensandbox
import pytest

from apps.engines.models import SandboxRecord
from apps.engines.sandboxes import (
    MANAGED_LABEL,
    RECORD_LABEL,
    SandboxSpec,
    SandboxUnavailable,
    get_backend,
)
from apps.engines.sandboxes.opensandbox import OpenSandboxBackend, _normalise_exit

pytestmark = pytest.mark.usefixtures("sandbox_settings")


def test_the_sdk_is_the_pinned_release() -> None:
    assert opensandbox.__version__ == "1.1.1"


def test_fake_responses_parse_with_the_sdks_own_models(fake: Any) -> None:
    from opensandbox.api.lifecycle.models import (
        CreateSandboxResponse,
        Endpoint,
        ListSandboxesResponse,
        RenewSandboxExpirationResponse,
        Sandbox,
    )

    headers = {"OPEN-SANDBOX-API-KEY": fake.api_key}
    with httpx.Client(base_url=fake.url, headers=headers) as client:
        too_short = {"image": {"uri": "x"}, "entrypoint": ["true"], "timeout": 30}
        assert client.post("/v1/sandboxes", json=too_short).status_code == 422
        assert client.post("/v1/sandboxes", json={"image": {"uri": "x"}, "entrypoint": ["true"],
                                                  "metadata": {"bad key": "v"}}).status_code == 400
        assert httpx.post(f"{fake.url}/v1/sandboxes", json={}).status_code == 401
        created = client.post("/v1/sandboxes", json={
            "image": {"uri": "python:3.11"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 120,
            "metadata": {"team": "fake-check"},
        })
        assert created.status_code == 202
        sandbox_id = CreateSandboxResponse.from_dict(created.json()).id
        manual = client.post(
            "/v1/sandboxes", json={"image": {"uri": "python:3.11"}, "entrypoint": ["true"], "timeout": None}
        )
        assert "expiresAt" not in manual.json() and "metadata" not in manual.json()  # omitted, never null
        CreateSandboxResponse.from_dict(manual.json())
        assert Sandbox.from_dict(client.get(f"/v1/sandboxes/{sandbox_id}").json()).id == sandbox_id
        assert Endpoint.from_dict(client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772").json()).endpoint
        assert client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").status_code == 200
        listed = ListSandboxesResponse.from_dict(client.get("/v1/sandboxes", params={"metadata": "team=fake-check"}).json())
        assert [item.id for item in listed.items] == [sandbox_id]
        renewed = client.post(f"/v1/sandboxes/{sandbox_id}/renew-expiration", json={"expiresAt": "2030-01-01T00:00:00Z"})
        assert RenewSandboxExpirationResponse.from_dict(renewed.json()).expires_at.year == 2030
        assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
        missing = client.delete(f"/v1/sandboxes/{sandbox_id}")
        assert missing.status_code == 404 and set(missing.json()) == {"code", "message"}
        client.delete(f"/v1/sandboxes/{manual.json()['id']}")


def test_create_sends_labels_limits_ttl_grace_period_and_deny_all_egress(opensandbox_backend: Any, fake: Any) -> None:
    spec = SandboxSpec(cpu=0.5, memory_mb=256, ttl=10, labels={"task": "t-1"}, env={"A": "1"})
    with opensandbox_backend.create(spec) as sandbox:
        body = fake.create_bodies[-1]
        record = SandboxRecord.objects.get(external_id=sandbox.id)
        assert body["env"] == {"A": "1", "EXECD_API_GRACE_SHUTDOWN": "50ms"}
        assert body["metadata"] == {"task": "t-1", MANAGED_LABEL: "true", RECORD_LABEL: str(record.pk)}
        assert body["resourceLimits"] == {"cpu": "500m", "memory": "256Mi"}
        assert body["timeout"] == 60  # the server's minimum; recorded
        assert any("server minimum of 60s" in d for d in sandbox.downgrades)
        assert body["networkPolicy"] == {"defaultAction": "deny", "egress": []}
        assert sandbox.run("echo $A", timeout=30).stdout == "1\n"
    assert fake.execd_key_leaks == []  # direct mode: the API key never goes to execd


def test_server_proxy_mode_runs_commands_and_files_through_the_server(db: Any, fake: Any) -> None:
    backend = OpenSandboxBackend(url=fake.url, api_key=fake.api_key, use_server_proxy=True)
    try:
        with backend.create(SandboxSpec()) as sandbox:
            sandbox.write_file("via-proxy.txt", b"proxied")
            result = sandbox.run("cat via-proxy.txt", timeout=30)
            assert sandbox.read_file("via-proxy.txt") == b"proxied"
    finally:
        backend.close()
    assert result.stdout == "proxied\n"
    assert any("/proxy/44772/command" in path for _, path in fake.requests)


def test_a_command_stuck_in_execd_is_interrupted_at_the_outer_deadline(db: Any, fake: Any) -> None:
    # execd issue #1695 and friends: the stream never ends. The SDK would wait forever.
    fake.ignore_timeouts = True
    backend = OpenSandboxBackend(url=fake.url, api_key=fake.api_key, outer_grace=0.3, interrupt_grace=5)
    try:
        with backend.create(SandboxSpec()) as sandbox:
            interrupts_before = len(fake.interrupts)
            result = sandbox.run("sleep 60", timeout=0.5)
            assert result.timed_out and result.exit_code is None and result.killed_by == "timeout"
            assert len(fake.interrupts) == interrupts_before + 1
            assert sandbox.run("echo fine", timeout=30).stdout == "fine\n"
    finally:
        backend.close()


def test_a_stream_that_ignores_the_interrupt_is_dropped_and_the_handle_reconnects(transactional_db: Any, fake: Any) -> None:
    # transactional_db: run() records the error from the runner thread's own connection.
    fake.ignore_timeouts = fake.ignore_interrupts = True
    backend = OpenSandboxBackend(url=fake.url, api_key=fake.api_key, outer_grace=0.3, interrupt_grace=0.3)
    outcome: list[Any] = []
    try:
        sandbox = backend.create(SandboxSpec())
        runner = threading.Thread(target=lambda: outcome.append(sandbox.run("sleep 60", timeout=0.5)))
        runner.start()
        runner.join(30)
        assert not runner.is_alive(), "run() hung on a stream that never ends"
        assert outcome[0].timed_out
        record = SandboxRecord.objects.get(external_id=sandbox.id)
        assert "connection dropped" in record.last_error
        fake.ignore_interrupts = fake.ignore_timeouts = False
        assert sandbox.run("echo reconnected", timeout=30).stdout == "reconnected\n"
        sandbox.destroy()
    finally:
        backend.close()


def test_execd_error_events_become_exit_codes() -> None:
    def execution(value: Any = None, traceback: list[str] | None = None, complete: bool = False) -> Any:
        error = None if value is None else SimpleNamespace(value=value, traceback=traceback or [])
        return SimpleNamespace(error=error, complete=object() if complete else None)

    assert _normalise_exit(execution(complete=True)) == (0, False, "")
    assert _normalise_exit(execution("3", ["exit status 3"])) == (3, False, "")
    assert _normalise_exit(execution("-1", ["signal: killed"])) == (137, True, "")
    assert _normalise_exit(execution("-1", ["signal: segmentation fault"])) == (139, True, "")
    code, signalled, note = _normalise_exit(execution("fork/exec /bin/bash: no such file or directory"))
    assert code == 1 and not signalled and "could not start" in note


def test_it_needs_a_server_url(db: Any, settings: Any) -> None:
    settings.OPENSANDBOX_URL = ""
    with pytest.raises(SandboxUnavailable, match="OPENSANDBOX_URL"):
        get_backend("opensandbox").create(SandboxSpec())


def test_an_unreachable_server_is_reported_as_unavailable(db: Any) -> None:
    backend = OpenSandboxBackend(url="http://127.0.0.1:9", api_key="k", request_timeout=2)
    with pytest.raises(SandboxUnavailable, match="cannot reach OpenSandbox"):
        backend.get("abc")


def test_the_reconciler_and_the_pool_work_on_opensandbox_too(opensandbox_backend: Any, fake: Any, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.engines import jobs
    from apps.engines import sandbox_records as records
    from apps.engines.sandboxes import acquire

    settings.SANDBOX_BACKEND = "opensandbox"
    orphan = OpenSandboxBackend(records=False, url=fake.url, api_key=fake.api_key).create(SandboxSpec())
    expired = opensandbox_backend.create(SandboxSpec())
    SandboxRecord.objects.filter(external_id=expired.id).update(expires_at=timezone.now() - timedelta(seconds=1))

    report = records.reconcile_sandboxes(now=timezone.now() + records.ORPHAN_GRACE + timedelta(minutes=1))

    assert report.orphaned >= 1 and report.errors == []
    assert report.expired == 1
    assert fake.sandboxes[orphan.id].state == "Terminated" and fake.sandboxes[expired.id].state == "Terminated"

    settings.SANDBOX_POOL_SIZE = 1
    assert jobs.fill_sandbox_pool()["created"] == 1
    warm = SandboxRecord.objects.get(state=SandboxRecord.State.POOLED)
    with acquire(SandboxSpec(labels={"task": "t9"}, ttl=7200), backend=opensandbox_backend) as sandbox:
        assert sandbox.id == warm.external_id
        assert fake.sandboxes[sandbox.id].metadata == {"task": "t9", MANAGED_LABEL: "true", RECORD_LABEL: str(warm.pk)}
        remaining = fake.sandboxes[sandbox.id].expires_at - timezone.now()
        assert timedelta(hours=1, minutes=59) < remaining <= timedelta(hours=2)
        assert sandbox.run("echo warm", timeout=30).stdout == "warm\n"
    settings.SANDBOX_POOL_SIZE = 0
