"""Every error is {"error": {"code", "message", "details"}}: 404, 405, 401, 403, 400, 409, 429, 500."""
from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.django_db


def _error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    return body["error"]


def test_unknown_api_urls_are_json_404(client_as: Any, client: Any) -> None:
    assert _error(client.get("/api/v1/nothing-here"))["code"] == "not_found"
    assert client.get("/api/v1/nothing-here").status_code == 404
    response = client_as("viewer").get("/api/v1/tasks/123456")
    assert response.status_code == 404 and _error(response)["code"] == "not_found"


def test_a_wrong_method_is_json_405(client_as: Any) -> None:
    response = client_as("admin").delete("/api/v1/scenes")
    assert response.status_code == 405 and _error(response)["code"] == "method_not_allowed"
    response = client_as("admin").put("/api/v1/tasks/1", {}, format="json")
    assert response.status_code in (404, 405)
    _error(response)


def test_malformed_json_is_400(client_as: Any) -> None:
    response = client_as("reviewer").post("/api/v1/tasks", "{not json", content_type="application/json")
    assert response.status_code == 400 and _error(response)["code"] == "parse_error"


def test_validation_errors_name_the_fields(client_as: Any) -> None:
    response = client_as("viewer").post("/api/v1/webhooks", {"url": "ftp://x", "events": ["nope"]}, format="json")
    error = _error(response)
    assert response.status_code == 400 and error["code"] == "invalid"
    assert set(error["details"]["fields"]) == {"url", "events"}


def test_throttling_per_token(client_as: Any, settings: Any) -> None:
    settings.API_THROTTLE_RATE = "3/min"
    first, second = client_as("viewer"), client_as("viewer")
    codes = [first.get("/api/v1/me").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    response = first.get("/api/v1/me")
    error = _error(response)
    assert error["code"] == "throttled" and error["details"]["retry_after_s"] > 0 and "Retry-After" in response
    assert second.get("/api/v1/me").status_code == 200  # another token has its own budget


def test_an_unexpected_exception_is_a_json_500_without_details(client_as: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.engines.api import views

    def boom(scene_id: str) -> Any:
        raise RuntimeError("secret internals sk-abcdefghijklmnopqrstu")

    monkeypatch.setattr(views, "scene_data", boom)
    client = client_as("viewer")
    client.raise_request_exception = False
    response = client.get("/api/v1/scenes")
    assert response.status_code == 500
    error = _error(response)
    assert error["code"] == "server_error" and "sk-" not in response.content.decode()


def test_non_api_pages_keep_django_404(client: Any) -> None:
    response = client.get("/no-such-page/")
    assert response.status_code == 404 and not response.get("Content-Type", "").startswith("application/json")
