"""Outgoing webhooks: HMAC-signed POSTs to callback URLs, recorded and retried.

Services call `webhook_emit(event, data)` inside their transaction. It writes one
`WebhookDelivery` row per matching endpoint (the per-token `WebhookEndpoint`s subscribed to the
event, plus the global endpoint from WEBHOOK_URL) and enqueues `webhook_deliver` jobs on commit,
so a rolled-back change never notifies anyone.

Wire format (every attempt sends the same bytes):

    POST <url>
    Content-Type: application/json
    X-Trajplatform-Event: task.finished
    X-Trajplatform-Delivery: <delivery uuid; the same on every retry, dedupe on it>
    X-Trajplatform-Timestamp: <unix seconds of this attempt>
    X-Trajplatform-Attempt: <1, 2, ...>
    X-Trajplatform-Signature: sha256=<hex HMAC-SHA256 of the exact body with the endpoint secret>

    {"id": "<delivery uuid>", "event": "task.finished", "created_at": "...", "data": {...}}

Targets (SSRF): a callback URL registered for a token must be http(s) and its host must resolve
only to public addresses: loopback, private (RFC 1918, unique-local), link-local, multicast,
reserved, unspecified, shared (100.64/10) addresses and cloud metadata services (169.254.169.254,
fd00:ec2::254, 100.100.100.200, ...) are refused, also inside IPv4-mapped, 6to4, Teredo and NAT64
IPv6 addresses. The name is resolved and every address checked when the endpoint is registered
(`check_target`: a 400 in the API, a form error in the console) and again at every delivery;
the delivery then connects to the address it checked (the URL's host stays in the Host header
and in TLS SNI and certificate checks), so a name that re-resolves to an internal address
between the check and the connection (DNS rebinding) reaches nothing. A delivery refused this
way fails at once without sending anything. WEBHOOKS_ALLOW_PRIVATE_TARGETS=1 allows private
targets (a receiver on the same host or network; the test suite's loopback receiver). The
global WEBHOOK_URL is operator configuration and is not checked.

A 2xx answer completes the delivery. Anything else (non-2xx, timeout, connection error) is
recorded as an attempt and retried after WEBHOOK_BACKOFF_S * 2**(attempt-1) seconds (capped
at WEBHOOK_BACKOFF_MAX_S) until WEBHOOK_MAX_ATTEMPTS attempts, then the delivery fails. Jobs
claim a delivery by compare-and-swap, so a job delivered twice sends once; a scheduled sweep
(`webhook_sweep`) re-sends deliveries whose job was lost or whose worker died mid-attempt.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import time
import uuid
from datetime import timedelta
from typing import Any, Iterable
from urllib.parse import urlsplit

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.db.models import F
from django.utils import timezone
from django_q.models import Schedule

from trajplatform.audit import audit_record
from trajplatform.redaction import redact, storable
from trajplatform.schedules import enqueue, ensure_schedule

logger = logging.getLogger(__name__)

EVENTS: dict[str, str] = {
    "task.finished": "a task ended: the review loop completed or failed it, or someone cancelled it",
    "proposal.created": "a review proposal is waiting for a human decision",
    "proposal.decided": "a proposal was approved or rejected",
    "export.ready": "a dataset export finished (ready to download, or failed)",
}
SIGNATURE_HEADER = "X-Trajplatform-Signature"
DELIVER_JOB = "trajplatform.webhooks.webhook_deliver"
SWEEP_JOB = "trajplatform.webhooks.webhook_sweep"
SWEEP_SCHEDULE = "trajplatform: webhook sweep"
RESPONSE_EXCERPT = 500


def _new_secret() -> str:
    return secrets.token_urlsafe(32)


# --- targets: no internal services ---------------------------------------------------------------

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean ...
    "169.254.170.2",  # AWS ECS task metadata
    "fd00:ec2::254",  # AWS over IPv6
    "100.100.100.200",  # Alibaba Cloud
))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_getaddrinfo = socket.getaddrinfo  # one name for the tests to script DNS answers through


class WebhookTargetError(ValueError):
    """A callback URL the platform does not send to (the message says why)."""


class WebhookTargetUnresolved(WebhookTargetError):
    """The URL's host does not resolve (now): refused at registration, retried at delivery."""


def _address_problem(ip: IPAddress) -> str | None:
    """Why deliveries may not go to this address, or None for a public one."""
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata service"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and (problem := _address_problem(embedded)):
            return f"{problem} (inside {ip})"
    for attribute, label in (
        ("is_loopback", "a loopback address"), ("is_unspecified", "the unspecified address"),
        ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address"),
        ("is_private", "a private address"), ("is_reserved", "a reserved address"),
    ):
        if getattr(ip, attribute):
            return label
    if not ip.is_global:
        return "not a public address"
    return None


def _split(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, or WebhookTargetError."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookTargetError(f"not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookTargetError("must be an http(s) URL")
    if not parts.hostname:
        raise WebhookTargetError("has no host")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80)


def resolve_target(url: str, *, allow_private: bool | None = None) -> list[IPAddress]:
    """The addresses the URL's host resolves to, every one checked (see the module docstring).

    Raises WebhookTargetError when the URL is not http(s), the name does not resolve, or any
    address is internal and private targets are not allowed (WEBHOOKS_ALLOW_PRIVATE_TARGETS).
    """
    _scheme, host, port = _split(url)
    try:
        infos = _getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookTargetUnresolved(f"its host {host!r} does not resolve ({exc})") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # without an IPv6 zone index
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise WebhookTargetUnresolved(f"its host {host!r} does not resolve")
    if allow_private is None:
        allow_private = settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS
    if not allow_private:
        for ip in addresses:
            if problem := _address_problem(ip):
                raise WebhookTargetError(
                    f"its host {host!r} resolves to {ip}, {problem}: webhooks go to public addresses only "
                    "(WEBHOOKS_ALLOW_PRIVATE_TARGETS=1 allows private ones)"
                )
    return addresses


def check_target(url: str) -> str:
    """`url` if deliveries may go there (resolved and checked now), else WebhookTargetError."""
    resolve_target(url)
    return url


class WebhookEndpoint(models.Model):
    """A callback URL registered for an API token (or a user), with its signing secret."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook_endpoints")
    token = models.ForeignKey(
        "trajplatform.ApiToken", null=True, blank=True, on_delete=models.CASCADE, related_name="webhook_endpoints",
        help_text="the API token that registered it; revoking the token silences the endpoint",
    )
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200, default=_new_secret, help_text="HMAC-SHA256 signing key")
    events = models.JSONField(default=list, blank=True, help_text="event names; empty: every event")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "trajplatform"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.url} ({self.owner})"

    def wants(self, event: str) -> bool:
        return not self.events or event in self.events


class WebhookDelivery(models.Model):
    """One event sent (or to be sent) to one URL, with every attempt recorded."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        SENDING = "sending", "sending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    endpoint = models.ForeignKey(
        WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries",
        help_text="empty: the global endpoint configured by WEBHOOK_URL",
    )
    url = models.URLField(max_length=500)
    event = models.CharField(max_length=40, db_index=True)
    body = models.TextField(help_text="the exact JSON body signed and sent on every attempt")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=6)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claim_token = models.CharField(max_length=32, blank=True, editable=False)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    attempt_log = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "trajplatform"
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="webhookdelivery_due_idx")]

    def __str__(self) -> str:
        return f"{self.event} → {self.url} ({self.status})"


def webhook_endpoint_create(
    *, owner: Any, token: Any, url: str, events: list[str], active: bool = True, actor: Any = None
) -> WebhookEndpoint:
    """Register a callback URL for the caller's token (one transaction, one audit row).

    Raises WebhookTargetError for a URL deliveries may not go to (`resolve_target`)."""
    check_target(url)  # DNS before the transaction: it may take seconds
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(
            owner=owner, token=token, url=url, events=sorted(set(events)), active=active
        )
        audit_record("api.webhook_endpoint_create", actor=actor or owner, target=endpoint,
                     data={"url": url, "events": endpoint.events, "token": token.pk if token else None})
    return endpoint


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint, actor: Any) -> None:
    """Remove a callback URL (its delivery history goes with it)."""
    with transaction.atomic():
        audit_record("api.webhook_endpoint_delete", actor=actor, target=endpoint, data={"url": endpoint.url})
        endpoint.delete()


# --- emitting ------------------------------------------------------------------------------


def sign(secret: str, body: bytes) -> str:
    """The signature header value for a body: "sha256=<hex>"."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    """Constant-time check of a signature header (for receivers written in Python)."""
    return hmac.compare_digest(sign(secret, body), header or "")


def _targets(event: str) -> list[tuple[WebhookEndpoint | None, str]]:
    endpoints = WebhookEndpoint.objects.filter(active=True, owner__is_active=True).filter(
        models.Q(token__isnull=True) | models.Q(token__revoked_at__isnull=True)
    )
    targets: list[tuple[WebhookEndpoint | None, str]] = [(e, e.url) for e in endpoints if e.wants(event)]
    if settings.WEBHOOK_URL and event in settings.WEBHOOK_EVENTS:
        targets.append((None, settings.WEBHOOK_URL))
    return targets


def webhook_emit(event: str, data: dict[str, Any]) -> None:
    """Record one delivery of `event` per matching endpoint; the sends are enqueued on commit.

    Call it inside the service's transaction. `data` is made storable (redacted; NUL bytes and
    lone surrogates replaced) and must be JSON-serialisable.
    """
    if event not in EVENTS:
        raise ValueError(f"unknown webhook event {event!r}; events: {', '.join(EVENTS)}")
    targets = _targets(event)
    if not targets:
        return
    now = timezone.now()
    payload_data = storable(data)
    rows = []
    for endpoint, url in targets:
        delivery_id = uuid.uuid4()
        body = json.dumps(
            {"id": str(delivery_id), "event": event, "created_at": now.isoformat(), "data": payload_data},
            cls=DjangoJSONEncoder, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
        )
        rows.append(WebhookDelivery(
            uuid=delivery_id, endpoint=endpoint, url=url, event=event, body=body,
            max_attempts=max(1, settings.WEBHOOK_MAX_ATTEMPTS), next_attempt_at=now,
        ))
    created = WebhookDelivery.objects.bulk_create(rows)
    ids = [d.pk for d in created]
    transaction.on_commit(lambda: enqueue_deliveries(ids))


def enqueue_deliveries(ids: Iterable[int]) -> None:
    """One webhook_deliver job per delivery id (call after commit)."""
    for pk in ids:
        enqueue(DELIVER_JOB, pk, group="webhooks")


def _schedule_retry(delivery_id: int, delay_s: float) -> None:
    Schedule.objects.create(
        func=DELIVER_JOB, args=repr(delivery_id), schedule_type=Schedule.ONCE, repeats=-1,
        next_run=timezone.now() + timedelta(seconds=delay_s),
    )


def backoff_s(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based)."""
    return min(settings.WEBHOOK_BACKOFF_MAX_S, settings.WEBHOOK_BACKOFF_S * 2 ** max(0, attempt - 1))


# --- delivering ----------------------------------------------------------------------------


def _secret_for(delivery: WebhookDelivery) -> str | None:
    """The signing secret, or None when the endpoint may no longer receive anything."""
    endpoint = delivery.endpoint
    if endpoint is None:
        return settings.WEBHOOK_SECRET or None
    if not endpoint.active or not endpoint.owner.is_active:
        return None
    if endpoint.token_id is not None and endpoint.token.revoked_at is not None:
        return None
    return endpoint.secret


def _send_pinned(url: str, *, content: bytes, headers: dict[str, str], check: bool) -> Any:
    """POST to `url`, connecting only to an address `resolve_target` just checked (check=False:
    the operator's WEBHOOK_URL, resolved but not checked). The URL's host stays in the Host
    header, TLS SNI and certificate check, so nothing re-resolves the name after the check."""
    import httpx  # deferred: heavy (httpx), loaded only when a delivery is sent

    try:
        addresses = resolve_target(url, allow_private=None if check else True)
    except WebhookTargetUnresolved as exc:
        raise httpx.ConnectError(str(exc)) from None  # DNS may answer next time: a failed attempt
    target = httpx.URL(url)
    host_header = target.netloc.decode("ascii")
    extensions = {"sni_hostname": target.raw_host.decode("ascii")} if target.scheme == "https" else {}
    error: httpx.HTTPError | None = None
    with httpx.Client(timeout=settings.WEBHOOK_TIMEOUT_S, follow_redirects=False) as client:
        for ip in addresses:  # each one checked; the next only if this one refuses the connection
            request = client.build_request(
                "POST", target.copy_with(host=str(ip)), content=content, headers={**headers, "Host": host_header},
                extensions=extensions,
            )
            try:
                return client.send(request)
            except httpx.ConnectError as exc:
                error = exc
    assert error is not None
    raise error


def _post(delivery: WebhookDelivery, secret: str, attempt: int) -> tuple[int | None, str, str]:
    """Send one attempt; (status code or None, error text, response excerpt). Raises
    WebhookTargetError when the target resolves to an address deliveries may not go to (nothing
    is sent)."""
    import httpx  # deferred: heavy (httpx), loaded only when a delivery is sent

    body = delivery.body.encode("utf-8")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "trajplatform-webhooks/1",
        "X-Trajplatform-Event": delivery.event,
        "X-Trajplatform-Delivery": str(delivery.uuid),
        "X-Trajplatform-Timestamp": str(int(time.time())),
        "X-Trajplatform-Attempt": str(attempt),
        SIGNATURE_HEADER: sign(secret, body),
    }
    try:
        response = _send_pinned(delivery.url, content=body, headers=headers, check=delivery.endpoint_id is not None)
    except httpx.HTTPError as exc:
        return None, redact(f"{type(exc).__name__}: {exc}")[:1000], ""
    excerpt = redact(response.text[:RESPONSE_EXCERPT])
    if 200 <= response.status_code < 300:
        return response.status_code, "", excerpt
    return response.status_code, f"HTTP {response.status_code}", excerpt


def webhook_deliver(delivery_id: int) -> str:
    """Send one due, pending delivery (a no-op if another job claimed it); returns its new status."""
    now = timezone.now()
    claim = secrets.token_hex(8)
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now
    ).update(status=WebhookDelivery.Status.SENDING, claim_token=claim, claimed_at=now)
    if not claimed:
        return ""
    delivery = WebhookDelivery.objects.select_related("endpoint__owner", "endpoint__token").get(pk=delivery_id)
    attempt = delivery.attempts + 1
    secret = _secret_for(delivery)
    started = time.monotonic()
    if secret is None:
        code, error, excerpt = None, "endpoint disabled, its token revoked or WEBHOOK_SECRET unset: not sent", ""
        give_up = True
    else:
        try:
            code, error, excerpt = _post(delivery, secret, attempt)
            give_up = False
        except WebhookTargetError as exc:  # an internal address now (DNS rebinding): never retried
            code, error, excerpt = None, redact(f"refused, not sent: {exc}")[:1000], ""
            give_up = True
    finished = timezone.now()
    entry = {
        "attempt": attempt, "at": finished.isoformat(), "status_code": code, "error": error,
        "duration_ms": round((time.monotonic() - started) * 1000), "response": excerpt,
    }
    fields: dict[str, Any] = {
        "attempts": attempt, "last_status_code": code, "last_error": error,
        "attempt_log": [*delivery.attempt_log, entry], "claim_token": "",
    }
    retry_in = None
    if not error:
        fields.update(status=WebhookDelivery.Status.DELIVERED, delivered_at=finished)
    elif give_up or attempt >= delivery.max_attempts:
        fields.update(status=WebhookDelivery.Status.FAILED)
    else:
        retry_in = backoff_s(attempt)
        fields.update(status=WebhookDelivery.Status.PENDING, next_attempt_at=finished + timedelta(seconds=retry_in))
    updated = WebhookDelivery.objects.filter(
        pk=delivery_id, status=WebhookDelivery.Status.SENDING, claim_token=claim
    ).update(**fields)
    if not updated:
        return ""  # the sweep reclaimed it meanwhile; its attempt is recorded there
    if retry_in is not None:
        _schedule_retry(delivery_id, retry_in)
    if error:
        logger.warning("webhook %s to %s attempt %d: %s", delivery.event, delivery.url, attempt, error)
    return fields["status"]


def webhook_redeliver(*, deliveries: Any, actor: Any) -> int:
    """Give failed deliveries (a queryset) one more attempt each, now; returns how many."""
    with transaction.atomic():
        ids = list(deliveries.filter(status=WebhookDelivery.Status.FAILED).values_list("pk", flat=True))
        if not ids:
            return 0
        WebhookDelivery.objects.filter(pk__in=ids, status=WebhookDelivery.Status.FAILED).update(
            status=WebhookDelivery.Status.PENDING, next_attempt_at=timezone.now(), max_attempts=F("attempts") + 1,
        )
        audit_record("api.webhook_redeliver", actor=actor, data={"deliveries": ids})
        transaction.on_commit(lambda: enqueue_deliveries(ids))
    return len(ids)


def webhook_sweep() -> int:
    """Scheduled: re-send due deliveries whose job was lost; release those stuck mid-attempt.

    Returns how many deliveries were enqueued.
    """
    now = timezone.now()
    stale = now - timedelta(seconds=settings.WEBHOOK_TIMEOUT_S + 120)
    for delivery in WebhookDelivery.objects.filter(status=WebhookDelivery.Status.SENDING, claimed_at__lt=stale):
        entry = {"attempt": delivery.attempts + 1, "at": now.isoformat(), "status_code": None,
                 "error": "worker lost during the attempt", "duration_ms": None, "response": ""}
        attempts = delivery.attempts + 1
        status = WebhookDelivery.Status.FAILED if attempts >= delivery.max_attempts else WebhookDelivery.Status.PENDING
        WebhookDelivery.objects.filter(
            pk=delivery.pk, status=WebhookDelivery.Status.SENDING, claim_token=delivery.claim_token
        ).update(status=status, attempts=attempts, claim_token="", last_error=entry["error"],
                 attempt_log=[*delivery.attempt_log, entry], next_attempt_at=now)
    due = list(
        WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at").values_list("pk", flat=True)[:1000]
    )
    enqueue_deliveries(due)
    return len(due)


def ensure_webhook_schedule(using: str = "default") -> None:
    """Register the every-minute sweep (idempotent; run after migrate)."""
    ensure_schedule(name=SWEEP_SCHEDULE, func=SWEEP_JOB, minutes=1, using=using)
