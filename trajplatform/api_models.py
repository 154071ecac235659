"""Models behind the REST API: per-user API tokens and stored idempotent responses.

Kept apart from `trajplatform/api.py` (the DRF machinery) so that model loading never imports
Django REST framework. Tokens are stored as SHA-256 hashes: the plain token is shown once,
when it is created (`api_token_create`), and cannot be recovered afterwards.
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction
from django.utils import timezone

from trajplatform.audit import audit_record

TOKEN_PREFIX = "trj_"
# The part of a token kept in clear text so operators can tell tokens apart in the console.
VISIBLE_PREFIX_LENGTH = 8


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    """A bearer token acting as its user, with exactly that user's role permissions."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="what the token is for, e.g. 'vibedatabot'")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False, help_text="the token's first characters")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        app_label = "trajplatform"
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.user})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


def api_token_create(*, user: Any, name: str, actor: Any) -> tuple[ApiToken, str]:
    """Create a token for `user`; returns (row, plain token). The plain token is never stored."""
    name = (name or "").strip()
    if not name:
        raise ValueError("a token needs a name")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user, name=name[:100], token_hash=hash_token(raw), prefix=raw[:VISIBLE_PREFIX_LENGTH]
        )
        audit_record("auth.api_token_create", actor=actor, target=token, data={"user": user.get_username(), "name": name})
    return token, raw


def api_token_revoke(*, token: ApiToken, actor: Any) -> ApiToken:
    """Revoke a token (it stops authenticating at once); a repeat revoke is a no-op."""
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=token.pk)
        if token.revoked_at is not None:
            return token
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record("auth.api_token_revoke", actor=actor, target=token, data={"user": token.user.get_username()})
    return token


class IdempotencyRecord(models.Model):
    """The first response to a request sent with an `Idempotency-Key`, replayed for repeats."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=200)
    scope = models.CharField(max_length=100, help_text="the endpoint, e.g. 'POST /api/v1/tasks'")
    request_sha256 = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField()
    response_body = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        app_label = "trajplatform"
        constraints = [models.UniqueConstraint(fields=["user", "scope", "key"], name="idempotency_unique_key")]

    def __str__(self) -> str:
        return f"{self.scope} {self.key} ({self.user_id})"
