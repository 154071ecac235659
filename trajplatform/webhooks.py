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

A 2xx answer completes the delivery. Anything else (non-2xx, timeout, connection error) is
recorded as an attempt and retried after WEBHOOK_BACKOFF_S * 2**(attempt-1) seconds (capped
at WEBHOOK_BACKOFF_MAX_S) until WEBHOOK_MAX_ATTEMPTS attempts, then the delivery fails. Jobs
claim a delivery by compare-and-swap, so a job delivered twice sends once; a scheduled sweep
(`webhook_sweep`) re-sends deliveries whose job was lost or whose worker died mid-attempt.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
import uuid
from datetime import timedelta
from typing import Any, Iterable

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from trajplatform.redaction import redact

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
    """Register a callback URL for the caller's token (one transaction, one audit row)."""
    from trajplatform.audit import audit_record

    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(
            owner=owner, token=token, url=url, events=sorted(set(events)), active=active
        )
        audit_record("api.webhook_endpoint_create", actor=actor or owner, target=endpoint,
                     data={"url": url, "events": endpoint.events, "token": token.pk if token else None})
    return endpoint


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint, actor: Any) -> None:
    """Remove a callback URL (its delivery history goes with it)."""
    from trajplatform.audit import audit_record

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

    Call it inside the service's transaction. `data` is redacted and must be JSON-serialisable.
    """
    if event not in EVENTS:
        raise ValueError(f"unknown webhook event {event!r}; events: {', '.join(EVENTS)}")
    targets = _targets(event)
    if not targets:
        return
    now = timezone.now()
    payload_data = redact(data)
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
    from trajplatform.schedules import enqueue

    for pk in ids:
        enqueue(DELIVER_JOB, pk, group="webhooks")


def _schedule_retry(delivery_id: int, delay_s: float) -> None:
    from django_q.models import Schedule

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


def _post(delivery: WebhookDelivery, secret: str, attempt: int) -> tuple[int | None, str, str]:
    """Send one attempt; (status code or None, error text, response excerpt)."""
    import httpx

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
        response = httpx.post(
            delivery.url, content=body, headers=headers, timeout=settings.WEBHOOK_TIMEOUT_S, follow_redirects=False
        )
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
        code, error, excerpt = _post(delivery, secret, attempt)
        give_up = False
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
    from trajplatform.audit import audit_record

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
    from trajplatform.schedules import ensure_schedule

    ensure_schedule(name=SWEEP_SCHEDULE, func=SWEEP_JOB, minutes=1, using=using)
