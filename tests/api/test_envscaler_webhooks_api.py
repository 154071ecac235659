"""EnvScaler uploads (multipart files or JSON) and the caller's webhook endpoints over the API."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.tasks.models import Batch, Task
from trajplatform.webhooks import WebhookDelivery, WebhookEndpoint, sign, webhook_deliver, webhook_emit

pytestmark = pytest.mark.django_db

EXAMPLES = Path(django_settings.BASE_DIR) / "examples" / "envscaler"


@pytest.fixture
def sandbox_root(settings: Any) -> Iterator[Path]:
    # Under /var/tmp: the sandbox user must be able to enter every parent.
    root = Path(tempfile.mkdtemp(prefix="trajplatform-api-sandboxes-", dir="/var/tmp"))
    root.chmod(0o711)
    settings.SANDBOX_ROOT = root
    settings.SANDBOX_BACKEND = "local"
    settings.SANDBOX_POOL_SIZE = 0
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_envscaler_files_become_one_batch(client_as: Any, sandbox_root: Path) -> None:
    client = client_as("reviewer")
    response = client.post("/api/v1/envscaler/uploads", {
        "metadata_file": SimpleUploadedFile("metadata.json", (EXAMPLES / "metadata.json").read_bytes()),
        "scenarios_file": SimpleUploadedFile("scenarios.json", (EXAMPLES / "scenarios.json").read_bytes()),
        "batch": "clinic-and-friends",
    }, format="multipart")
    assert response.status_code == 201, response.json()
    body = response.json()
    scenarios = json.loads((EXAMPLES / "scenarios.json").read_text())
    assert body["task_count"] == len(scenarios) and body["started"] == 0 and body["name"] == "clinic-and-friends"
    assert set(Task.objects.filter(batch_id=body["batch"]).values_list("scene", flat=True)) == {"envscaler"}


def test_envscaler_errors_are_listed_per_item_and_nothing_is_written(client_as: Any) -> None:
    client = client_as("reviewer")
    response = client.post("/api/v1/envscaler/uploads",
                           {"metadata": [{"env_name": "x"}], "scenarios": [{"task_id": "t"}]}, format="json")
    assert response.status_code == 400
    errors = response.json()["error"]["details"]["errors"]
    assert errors and all({"item", "field", "message"} <= set(e) for e in errors)
    assert Batch.objects.count() == 0
    both = client.post("/api/v1/envscaler/uploads", {"metadata": [], "metadata_file": "x", "scenarios": []},
                       format="multipart")
    assert both.status_code == 400
    not_json = client.post("/api/v1/envscaler/uploads", {
        "metadata_file": SimpleUploadedFile("m.json", b"\xff\xfe not json"), "scenarios": "[]"}, format="multipart")
    assert not_json.status_code == 400


def test_webhook_endpoints_are_registered_per_token_and_signed_with_their_secret(
    client_as: Any, receiver: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    from trajplatform import webhooks

    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = True  # the loopback receiver
    monkeypatch.setattr(webhooks, "enqueue_deliveries", lambda ids: None)
    client = client_as("viewer")
    created = client.post("/api/v1/webhooks", {"url": receiver.url + "/cb", "events": ["export.ready"]}, format="json")
    assert created.status_code == 201, created.json()
    secret = created.json()["secret"]
    listed = client.get("/api/v1/webhooks").json()["results"]
    assert [e["url"] for e in listed] == [receiver.url + "/cb"] and "secret" not in listed[0]
    assert client_as("viewer").get("/api/v1/webhooks").json()["results"] == []  # someone else's token

    webhook_emit("export.ready", {"export": 1, "sha256": "ab" * 32})
    webhook_emit("task.finished", {"task": 1})
    delivery = WebhookDelivery.objects.get()
    assert webhook_deliver(delivery.pk) == "delivered"
    request = receiver.requests[-1]
    assert request["headers"]["X-Trajplatform-Signature"] == sign(secret, request["body"])

    endpoint_id = created.json()["id"]
    assert client.delete(f"/api/v1/webhooks/{endpoint_id}").status_code == 204
    assert not WebhookEndpoint.objects.exists()


def test_webhook_endpoints_need_a_token_not_a_session(client: Any, viewer: Any) -> None:
    from tests.conftest import PASSWORD

    client.login(username=viewer.username, password=PASSWORD)

    response = client.post("/api/v1/webhooks", {"url": "http://127.0.0.1:9/"}, content_type="application/json")
    assert response.status_code == 403 and "API token" in response.json()["error"]["message"]
