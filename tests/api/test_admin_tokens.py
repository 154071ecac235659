"""API tokens, webhook endpoints and deliveries in the console."""
from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conftest import PASSWORD
from trajplatform.api_models import ApiToken, hash_token
from trajplatform.audit import AuditEvent
from trajplatform.webhooks import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def _login(client: Any, user: Any) -> Any:
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_an_admin_creates_a_token_shown_once_and_revokes_it(client: Any, admin_user_role: Any, viewer: Any) -> None:
    _login(client, admin_user_role)
    response = client.post("/admin/trajplatform/apitoken/add/", {"user": viewer.pk, "name": "bot"}, follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    raw = re.search(r"<code>(trj_[A-Za-z0-9_\-]+)</code>", text).group(1)
    token = ApiToken.objects.get()
    assert token.user == viewer and token.token_hash == hash_token(raw) and raw not in token.prefix + token.name
    assert AuditEvent.objects.filter(action="auth.api_token_create").count() == 1
    detail = client.get(f"/admin/trajplatform/apitoken/{token.pk}/change/").content.decode()
    assert raw not in detail and token.token_hash not in detail

    from rest_framework.test import APIClient

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/me").json()["username"] == viewer.username
    client.post("/admin/trajplatform/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert api.get("/api/v1/me").status_code == 401


def test_a_viewer_sees_only_their_own_tokens(client: Any, make_token: Any, viewer: Any) -> None:
    mine, _ = make_token(user=viewer)
    theirs, _ = make_token("viewer")
    text = _login(client, viewer).get("/admin/trajplatform/apitoken/").content.decode()
    assert f"/admin/trajplatform/apitoken/{mine.pk}/change/" in text
    assert f"/admin/trajplatform/apitoken/{theirs.pk}/change/" not in text


def test_deliveries_are_visible_with_their_attempts(client: Any, admin_user_role: Any, make_token: Any,
                                                    monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from trajplatform import webhooks

    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = True  # the loopback target below
    monkeypatch.setattr(webhooks, "enqueue_deliveries", lambda ids: None)
    token, _ = make_token("viewer")
    WebhookEndpoint.objects.create(owner=token.user, token=token, url="http://127.0.0.1:9/never")
    webhooks.webhook_emit("task.finished", {"task": 1})
    delivery = WebhookDelivery.objects.get()
    webhooks.webhook_deliver(delivery.pk)  # nothing listens on port 9: a recorded failed attempt
    _login(client, admin_user_role)
    listing = client.get("/admin/trajplatform/webhookdelivery/").content.decode()
    assert "task.finished" in listing
    page = client.get(f"/admin/trajplatform/webhookdelivery/{delivery.pk}/change/").content.decode()
    assert "ConnectError" in page and "task.finished" in page
    endpoint_page = client.get(f"/admin/trajplatform/webhookendpoint/{delivery.endpoint_id}/change/").content.decode()
    assert delivery.endpoint.secret not in endpoint_page


def test_an_endpoint_added_in_the_console_is_audited_and_its_secret_shown_once(
    client: Any, admin_user_role: Any, viewer: Any
) -> None:
    _login(client, admin_user_role)
    response = client.post("/admin/trajplatform/webhookendpoint/add/", {
        "owner": viewer.pk, "url": "https://93.184.215.14/x", "events": ["export.ready"], "active": "on",
    }, follow=True)
    assert response.status_code == 200
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.events == ["export.ready"] and endpoint.owner == viewer
    assert endpoint.secret in response.content.decode()
    assert AuditEvent.objects.filter(action="api.webhook_endpoint_create", actor=admin_user_role).count() == 1
