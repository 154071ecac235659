"""Webhooks: recorded per endpoint, signed, retried with backoff, claimed once."""
from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from trajplatform import webhooks
from trajplatform.webhooks import WebhookDelivery, WebhookEndpoint, sign, verify, webhook_deliver, webhook_emit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def allow_private_targets(settings: Any) -> None:
    """The loopback receiver is a private target: allowed here, refused by default (see below)."""
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = True


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(webhooks, "enqueue_deliveries", lambda ids: calls.extend(ids))
    return calls


@pytest.fixture
def endpoint(make_token: Any, receiver: Any) -> WebhookEndpoint:
    token, _raw = make_token("viewer")
    return WebhookEndpoint.objects.create(owner=token.user, token=token, url=receiver.url + "/hook", secret="s3cret-signing-key")


def _due_now(delivery: WebhookDelivery) -> None:
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())


def test_emit_records_a_delivery_per_endpoint_and_enqueues_after_commit(
    endpoint: WebhookEndpoint, enqueued: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        webhook_emit("task.finished", {"task_id": 7, "status": "completed"})
    delivery = WebhookDelivery.objects.get()
    assert (delivery.endpoint, delivery.event, delivery.status) == (endpoint, "task.finished", "pending")
    assert json.loads(delivery.body)["data"] == {"task_id": 7, "status": "completed"}
    assert len(callbacks) == 1 and enqueued == [delivery.pk]


def test_a_rolled_back_change_notifies_nobody(endpoint: WebhookEndpoint, enqueued: list[int]) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with transaction.atomic():
            webhook_emit("task.finished", {"task_id": 1})
            raise Boom
    assert WebhookDelivery.objects.count() == 0 and enqueued == []


def test_delivery_is_signed_over_the_exact_body(endpoint: WebhookEndpoint, receiver: Any, enqueued: list[int]) -> None:
    webhook_emit("task.finished", {"task_id": 3})
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery.pk) == "delivered"
    (request,) = receiver.requests
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert request["path"] == "/hook" and request["method"] == "POST"
    assert request["body"] == delivery.body.encode()
    assert headers["x-trajplatform-signature"] == sign("s3cret-signing-key", request["body"])
    assert verify("s3cret-signing-key", request["body"], headers["x-trajplatform-signature"])
    assert not verify("another-key-entirely", request["body"], headers["x-trajplatform-signature"])
    assert headers["x-trajplatform-event"] == "task.finished"
    assert headers["x-trajplatform-delivery"] == str(delivery.uuid)
    assert abs(int(headers["x-trajplatform-timestamp"]) - timezone.now().timestamp()) < 30
    delivery.refresh_from_db()
    assert delivery.status == "delivered" and delivery.attempts == 1 and delivery.delivered_at is not None
    assert delivery.attempt_log[0]["status_code"] == 200


def test_failures_are_retried_with_exponential_backoff_then_delivered(
    endpoint: WebhookEndpoint, receiver: Any, enqueued: list[int], settings: Any
) -> None:
    from django_q.models import Schedule

    settings.WEBHOOK_BACKOFF_S = 10
    receiver.statuses = [500, 503, 200]
    webhook_emit("proposal.created", {"proposal_id": 1})
    delivery = WebhookDelivery.objects.get()

    before = timezone.now()
    assert webhook_deliver(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.attempts == 1 and delivery.last_status_code == 500
    assert timedelta(seconds=9) < delivery.next_attempt_at - before < timedelta(seconds=12)
    assert Schedule.objects.filter(func=webhooks.DELIVER_JOB, args=repr(delivery.pk)).count() == 1
    assert webhook_deliver(delivery.pk) == ""  # not due yet: nothing is sent
    assert len(receiver.requests) == 1

    _due_now(delivery)
    before = timezone.now()
    assert webhook_deliver(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.attempts == 2 and delivery.last_status_code == 503
    assert timedelta(seconds=19) < delivery.next_attempt_at - before < timedelta(seconds=22)

    _due_now(delivery)
    assert webhook_deliver(delivery.pk) == "delivered"
    delivery.refresh_from_db()
    assert [a["status_code"] for a in delivery.attempt_log] == [500, 503, 200]
    bodies = {r["body"] for r in receiver.requests}
    assert len(bodies) == 1  # the same bytes (and signature) on every attempt


def test_it_gives_up_after_max_attempts(endpoint: WebhookEndpoint, receiver: Any, enqueued: list[int], settings: Any) -> None:
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    receiver.statuses = [500, 500, 500]
    webhook_emit("export.ready", {"export_id": 1})
    delivery = WebhookDelivery.objects.get()
    webhook_deliver(delivery.pk)
    _due_now(delivery)
    assert webhook_deliver(delivery.pk) == "failed"
    _due_now(delivery)
    assert webhook_deliver(delivery.pk) == ""
    assert len(receiver.requests) == 2


def test_a_connection_error_is_an_attempt_too(make_token: Any, enqueued: list[int]) -> None:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    token, _ = make_token("viewer")
    WebhookEndpoint.objects.create(owner=token.user, token=token, url=f"http://127.0.0.1:{port}/")
    webhook_emit("task.finished", {"task_id": 1})
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.last_status_code is None and "Connect" in delivery.last_error


def test_events_filter_revoked_tokens_and_the_global_endpoint(
    make_token: Any, receiver: Any, enqueued: list[int], settings: Any
) -> None:
    from trajplatform.api_models import api_token_revoke

    token, _ = make_token("viewer")
    only_exports = WebhookEndpoint.objects.create(owner=token.user, token=token, url=receiver.url, events=["export.ready"])
    revoked, _ = make_token("viewer")
    WebhookEndpoint.objects.create(owner=revoked.user, token=revoked, url=receiver.url)
    api_token_revoke(token=revoked, actor=None)
    WebhookEndpoint.objects.create(owner=token.user, token=token, url=receiver.url, active=False)
    settings.WEBHOOK_URL = receiver.url + "/global"
    settings.WEBHOOK_SECRET = "global-signing-secret"
    settings.WEBHOOK_EVENTS = ["proposal.created"]

    webhook_emit("proposal.created", {"proposal_id": 9})
    webhook_emit("export.ready", {"export_id": 2})
    webhook_emit("task.finished", {"task_id": 2})
    rows = sorted((d.event, d.endpoint_id, d.url) for d in WebhookDelivery.objects.all())
    assert rows == [("export.ready", only_exports.pk, receiver.url), ("proposal.created", None, receiver.url + "/global")]

    glob = WebhookDelivery.objects.get(endpoint=None)
    assert webhook_deliver(glob.pk) == "delivered"
    request = receiver.requests[-1]
    assert request["headers"]["X-Trajplatform-Signature"] == sign("global-signing-secret", request["body"])


def test_an_endpoint_revoked_after_emit_gets_nothing(endpoint: WebhookEndpoint, receiver: Any, enqueued: list[int]) -> None:
    from trajplatform.api_models import api_token_revoke

    webhook_emit("task.finished", {"task_id": 1})
    api_token_revoke(token=endpoint.token, actor=None)
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery.pk) == "failed"
    assert receiver.requests == []


def test_payload_secrets_are_redacted(endpoint: WebhookEndpoint, enqueued: list[int]) -> None:
    webhook_emit("task.finished", {"task_id": 1, "api_key": "sk-abcdefghijklmnopqrstuvwx", "note": "ok"})
    body = WebhookDelivery.objects.get().body
    assert "sk-abcdefghijklmnopqrstuvwx" not in body and '"note":"ok"' in body


def test_unknown_events_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown webhook event"):
        webhook_emit("task.exploded", {})


def test_a_claimed_delivery_is_not_sent_again(endpoint: WebhookEndpoint, receiver: Any, enqueued: list[int]) -> None:
    webhook_emit("task.finished", {"task_id": 1})
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status="sending", claim_token="other", claimed_at=timezone.now())
    assert webhook_deliver(delivery.pk) == ""
    assert receiver.requests == []


@pytest.mark.django_db(transaction=True)
def test_a_job_delivered_twice_at_once_sends_once(endpoint: WebhookEndpoint, receiver: Any, enqueued: list[int]) -> None:
    from django.db import connection

    webhook_emit("task.finished", {"task_id": 1})
    delivery = WebhookDelivery.objects.get()
    results: list[str] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        try:
            results.append(webhook_deliver(delivery.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["", "delivered"]
    assert len(receiver.requests) == 1


def test_the_sweep_releases_a_stuck_attempt_and_enqueues_due_ones(
    endpoint: WebhookEndpoint, enqueued: list[int]
) -> None:
    webhook_emit("task.finished", {"task_id": 1})
    webhook_emit("task.finished", {"task_id": 2})
    stuck, due = WebhookDelivery.objects.order_by("pk")
    WebhookDelivery.objects.filter(pk=stuck.pk).update(
        status="sending", claim_token="gone", claimed_at=timezone.now() - timedelta(hours=1)
    )
    enqueued.clear()
    assert webhooks.webhook_sweep() == 2
    stuck.refresh_from_db()
    assert stuck.status == "pending" and stuck.attempts == 1 and "worker lost" in stuck.attempt_log[0]["error"]
    assert sorted(enqueued) == sorted([stuck.pk, due.pk])


def test_redeliver_gives_a_failed_delivery_one_more_attempt(
    endpoint: WebhookEndpoint, receiver: Any, enqueued: list[int], admin_user_role: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from trajplatform.audit import AuditEvent

    webhook_emit("task.finished", {"task_id": 1})
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status="failed", attempts=6)
    enqueued.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert webhooks.webhook_redeliver(deliveries=WebhookDelivery.objects.all(), actor=admin_user_role) == 1
    assert enqueued == [delivery.pk]
    assert webhook_deliver(delivery.pk) == "delivered"
    assert AuditEvent.objects.filter(action="api.webhook_redeliver").count() == 1


def test_cancelling_a_task_sends_task_finished(endpoint: WebhookEndpoint, enqueued: list[int], make_task: Any,
                                               reviewer: Any, django_capture_on_commit_callbacks: Any) -> None:
    from apps.tasks.services import task_cancel

    task = make_task()
    with django_capture_on_commit_callbacks(execute=True):
        task_cancel(task=task, actor=reviewer, reason="wrong prompt")
        task_cancel(task=task, actor=reviewer, reason="double click")  # no-op: no second delivery
    delivery = WebhookDelivery.objects.get()
    assert delivery.event == "task.finished" and enqueued == [delivery.pk]
    assert json.loads(delivery.body)["data"] == {"task": task.pk, "status": "cancelled", "iteration": 0,
                                                 "reason": "wrong prompt"}


# -- targets: no internal services (SSRF) -----------------------------------------------------------

PUBLIC_IP = "93.184.215.14"


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Scripted DNS for names under .example.test: dns[name] = [ip, ...] or a callable giving them;
    dns["calls"] counts lookups of scripted names. Other names resolve for real (localhost)."""
    import socket

    answers: dict[str, Any] = {"calls": 0}
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if not host.endswith(".example.test"):
            return real(host, port, *args, **kwargs)
        answers["calls"] += 1
        ips = answers.get(host)
        ips = ips() if callable(ips) else ips
        if not ips:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                for ip in ips]

    monkeypatch.setattr(webhooks, "_getaddrinfo", getaddrinfo)
    return answers


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:8080/hook", "loopback"),
    ("http://localhost/hook", "loopback"),
    ("http://[::1]:9/hook", "loopback"),
    ("http://10.1.2.3/hook", "private"),
    ("http://192.168.0.10/hook", "private"),
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
    ("http://100.100.100.200/", "metadata"),
    ("http://[::ffff:127.0.0.1]/hook", "loopback"),
    ("http://[64:ff9b::a00:1]/hook", "private"),  # NAT64 of 10.0.0.1
    ("http://0.0.0.0/hook", "unspecified"),
    ("http://224.0.0.1/hook", "multicast"),
    ("http://100.64.0.1/hook", "not a public address"),
    ("http://internal.example.test/hook", "loopback"),
    ("http://split.example.test/hook", "private"),  # one public and one internal address
    ("http://nowhere.example.test/hook", "does not resolve"),
])
def test_registering_an_internal_target_is_refused(client_as: Any, settings: Any, dns: dict[str, Any], url: str,
                                                   why: str) -> None:
    from trajplatform.audit import AuditEvent

    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    dns["internal.example.test"] = ["127.0.0.1"]
    dns["split.example.test"] = [PUBLIC_IP, "10.0.0.7"]
    response = client_as("viewer").post("/api/v1/webhooks", {"url": url}, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["details"]["fields"]
    assert list(fields) == ["url"] and why in fields["url"][0], fields
    assert not WebhookEndpoint.objects.exists() and not AuditEvent.objects.filter(action__startswith="api.webhook").exists()


@pytest.mark.parametrize("url", ["http://2130706433/", "http://0x7f.1/", "http://017700000001/", "http://127.1/"])
def test_other_spellings_of_loopback_are_refused_by_the_service(make_token: Any, settings: Any, url: str) -> None:
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    token, _ = make_token("viewer")
    with pytest.raises(webhooks.WebhookTargetError, match="127.0.0.1, a loopback address"):
        webhooks.webhook_endpoint_create(owner=token.user, token=token, url=url, events=[])
    assert not WebhookEndpoint.objects.exists()


def test_a_public_target_is_registered(client_as: Any, settings: Any, dns: dict[str, Any]) -> None:
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    dns["hooks.example.test"] = [PUBLIC_IP, "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]
    response = client_as("viewer").post("/api/v1/webhooks", {"url": "https://hooks.example.test/cb"}, format="json")
    assert response.status_code == 201, response.content


def test_a_name_rebound_to_loopback_after_registration_is_refused_at_delivery_and_nothing_is_sent(
    client_as: Any, receiver: Any, settings: Any, dns: dict[str, Any], enqueued: list[int]
) -> None:
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    port = receiver.server.server_address[1]
    dns["rebind.example.test"] = [PUBLIC_IP]
    url = f"http://rebind.example.test:{port}/hook"
    assert client_as("viewer").post("/api/v1/webhooks", {"url": url}, format="json").status_code == 201
    dns["rebind.example.test"] = ["127.0.0.1"]  # the attacker's DNS now answers with the receiver's address
    webhook_emit("task.finished", {"task_id": 1})
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery.pk) == "failed"  # at once: a refused target is not retried
    delivery.refresh_from_db()
    assert receiver.requests == []
    assert delivery.attempts == 1 and delivery.last_status_code is None
    assert delivery.last_error.startswith("refused, not sent:") and "127.0.0.1, a loopback address" in delivery.last_error


def test_a_delivery_connects_to_the_address_it_checked_keeping_the_host_header(
    make_token: Any, receiver: Any, dns: dict[str, Any], enqueued: list[int]
) -> None:
    port = receiver.server.server_address[1]
    answers = iter([["127.0.0.1"]])
    dns["pinned.example.test"] = lambda: next(answers, ["10.255.255.1"])  # a second lookup would go elsewhere
    token, _ = make_token("viewer")
    WebhookEndpoint.objects.create(owner=token.user, token=token, url=f"http://pinned.example.test:{port}/hook")
    webhook_emit("task.finished", {"task_id": 1})
    assert webhook_deliver(WebhookDelivery.objects.get().pk) == "delivered"
    assert dns["calls"] == 1  # resolved once, by the check; the connection used that answer
    assert receiver.requests[0]["headers"]["Host"] == f"pinned.example.test:{port}"
    assert receiver.requests[0]["path"] == "/hook"


def test_a_name_that_stops_resolving_is_a_failed_attempt_retried_later(
    make_token: Any, dns: dict[str, Any], enqueued: list[int]
) -> None:
    token, _ = make_token("viewer")
    WebhookEndpoint.objects.create(owner=token.user, token=token, url="http://gone.example.test/hook")
    webhook_emit("task.finished", {"task_id": 1})
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert "does not resolve" in delivery.last_error


def test_the_console_refuses_an_internal_target_in_the_add_form(client: Any, admin_user_role: Any, viewer: Any,
                                                                 settings: Any) -> None:
    from tests.conftest import PASSWORD

    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    assert client.login(username=admin_user_role.username, password=PASSWORD)
    response = client.post("/admin/trajplatform/webhookendpoint/add/", {
        "owner": viewer.pk, "url": "http://169.254.169.254/latest/meta-data/", "active": "on"})
    assert response.status_code == 200 and "a cloud metadata service" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_deliveries_are_shown_to_their_owner_and_to_admins_only(
    client: Any, make_user: Any, make_token: Any, admin_user_role: Any, enqueued: list[int], settings: Any
) -> None:
    from tests.conftest import PASSWORD

    settings.WEBHOOK_URL, settings.WEBHOOK_SECRET, settings.WEBHOOK_EVENTS = (
        "http://127.0.0.1:9/global", "global-secret", ["task.finished"])
    owners = {}
    for name in ("alice", "bob"):
        owners[name] = make_user("viewer", username=name)
        token, _ = make_token(user=owners[name])
        WebhookEndpoint.objects.create(owner=owners[name], token=token, url=f"http://127.0.0.1:9/{name}")
    webhook_emit("task.finished", {"task_id": 1})
    by_url = {d.url.rsplit("/", 1)[1]: d for d in WebhookDelivery.objects.all()}
    WebhookDelivery.objects.update(attempt_log=[{"attempt": 1, "response": "internal reply excerpt"}])

    def visible(user: Any) -> set[str]:
        client.logout()
        assert client.login(username=user.username, password=PASSWORD)
        listing = client.get("/admin/trajplatform/webhookdelivery/").content.decode()
        seen = {name for name, d in by_url.items() if f"/admin/trajplatform/webhookdelivery/{d.pk}/change/" in listing}
        for name, d in by_url.items():
            page = client.get(f"/admin/trajplatform/webhookdelivery/{d.pk}/change/")
            assert (page.status_code == 200) == (name in seen), (user, name, page.status_code)
        return seen

    assert visible(owners["alice"]) == {"alice"}
    assert visible(owners["bob"]) == {"bob"}
    assert visible(make_user("approver")) == set()
    assert visible(admin_user_role) == {"alice", "bob", "global"}


def test_an_https_delivery_is_pinned_with_the_name_kept_for_sni_and_the_certificate(
    make_token: Any, dns: dict[str, Any], enqueued: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    sent: list[httpx.Request] = []

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        sent.append(request)
        return httpx.Response(204, request=request)

    monkeypatch.setattr(httpx.Client, "send", send)
    dns["secure.example.test"] = [PUBLIC_IP]
    token, _ = make_token("viewer")
    WebhookEndpoint.objects.create(owner=token.user, token=token, url="https://secure.example.test/in?x=1")
    webhook_emit("task.finished", {"task_id": 1})
    assert webhook_deliver(WebhookDelivery.objects.get().pk) == "delivered"
    [request] = sent
    assert str(request.url) == f"https://{PUBLIC_IP}/in?x=1"  # the connection goes to the checked address
    assert request.headers["Host"] == "secure.example.test"
    # httpcore uses it as the TLS server_hostname: SNI and the certificate check are the name's.
    assert request.extensions["sni_hostname"] == "secure.example.test"


def test_a_payload_with_a_nul_byte_is_recorded_with_it_replaced(endpoint: WebhookEndpoint, enqueued: list[int]) -> None:
    webhook_emit("task.finished", {"task_id": 1, "reason": "output a\x00b", "bad\ud800": 1})
    delivery = WebhookDelivery.objects.get()  # stored on PostgreSQL too (no DataError)
    assert json.loads(delivery.body)["data"] == {"task_id": 1, "reason": "output a\ufffdb", "bad\ufffd": 1}
