"""Bad input never gets a 500 or a non-JSON answer (issue 21, items 1, 2 and 10): ids that
overflow 64 bits, JSON nested deeper than API_MAX_JSON_DEPTH, bodies over API_MAX_BODY_BYTES,
malformed multipart bodies, empty filters, numbers where strings belong."""
from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.tasks.models import Batch, Task
from tests.test_images import artifact_store, bomb_png  # noqa: F401 (artifact_store is a fixture)

pytestmark = pytest.mark.django_db


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    return body["error"]


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


# --- ids in the 64-bit range --------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "/api/v1/tasks?batch=99999999999999999999999",
    "/api/v1/tasks?batch=9223372036854775808",
    "/api/v1/trajectories?task=1e30",
    "/api/v1/trajectories?batch=1.5",
    "/api/v1/trajectories?iteration=1e30",
    "/api/v1/reviews?trajectory=1e30",
    "/api/v1/proposals?task=-5.1e+209",
    "/api/v1/proposals/pending?task=1e30",
    "/api/v1/proposals/pending?batch=99999999999999999999999",
])
def test_an_id_filter_outside_64_bits_is_a_400(client_as: Any, url: str) -> None:
    client = client_as("admin")
    client.raise_request_exception = False
    assert _error(client.get(url), 400)["code"] == "invalid"


def test_the_largest_64_bit_id_is_a_valid_filter(client_as: Any, make_task: Any) -> None:
    make_task()
    response = client_as("viewer").get("/api/v1/tasks", {"batch": str(2**63 - 1)})
    assert response.status_code == 200 and response.json()["results"] == []


def test_a_filter_spec_batch_id_outside_64_bits_is_a_400(client_as: Any) -> None:
    client = client_as("approver")
    client.raise_request_exception = False
    for batches in ([10**30], [str(10**30)], ["²"]):
        response = client.post("/api/v1/datasets/big-ids/versions", {"filter_spec": {"batches": batches}},
                               format="json")
        error = _error(response, 400)
        assert "batches" in str(error), error


# --- nesting depth ------------------------------------------------------------------------------------


def test_check_depth_counts_brackets_outside_strings_only() -> None:
    from trajplatform import json_limits

    json_limits.check_depth(_nested(64), limit=64)
    json_limits.check_depth('{"a": "' + "[" * 1000 + '", "b": "\\"[[[[[[[["}', limit=2)
    with pytest.raises(json_limits.JSONTooDeep):
        json_limits.check_depth(_nested(65), limit=64)
    with pytest.raises(json_limits.JSONTooDeep):
        json_limits.check_depth('{"a": {"b": {"c": "\\\\"}}}', limit=2)  # an escaped backslash ends the string
    with pytest.raises(json_limits.JSONTooDeep):
        json_limits.check_depth(b"[" * 100_000, limit=64)


def test_json_nested_deeper_than_the_limit_is_a_400_before_parsing(client_as: Any, make_task: Any) -> None:
    from apps.reviews.models import Proposal

    client = client_as("admin")
    client.raise_request_exception = False
    bodies = {
        "/api/v1/tasks": '{"tasks": ' + _nested(100_000, "") + "}",
        "/api/v1/tasks ": '{"tasks": [{"scene": "code_exec", "prompt": "p", "config": ' + _nested(5000) + "}]}",
        "/api/v1/envscaler/uploads": '{"metadata": ' + _nested(5000) + ', "scenarios": []}',
    }
    task = make_task(status="waiting_approval", current_iteration=1)
    proposal = Proposal.objects.create(task=task, iteration=1, field="temperature", from_value=0.7, to_value=0.3,
                                       options=[0.3, 0.5], tier="yellow", proposer="review-agent")
    bodies[f"/api/v1/proposals/{proposal.pk}/decide"] = '{"decision": "choose", "option": ' + _nested(5000) + "}"
    for url, body in bodies.items():
        error = _error(client.post(url.strip(), body, content_type="application/json"), 400)
        assert error["code"] == "parse_error" and "nested deeper than 64 levels" in error["message"], (url, error)
    assert Task.objects.count() == 1 and Proposal.objects.get().status == "pending"


def test_deep_json_in_a_form_field_or_an_uploaded_file_is_a_400(client_as: Any) -> None:
    client = client_as("reviewer")
    client.raise_request_exception = False
    field = client.post("/api/v1/envscaler/uploads", {"metadata": _nested(5000), "scenarios": "[]"},
                        format="multipart")
    assert "nested deeper" in str(_error(field, 400)["details"])
    upload = client.post("/api/v1/envscaler/uploads", {
        "metadata_file": SimpleUploadedFile("m.json", _nested(5000).encode()), "scenarios": "[]"}, format="multipart")
    assert "nested deeper" in str(_error(upload, 400)["details"])
    assert Batch.objects.count() == 0


def test_the_console_envscaler_upload_refuses_deep_json(client: Any, make_user: Any) -> None:
    from django.urls import reverse

    client.force_login(make_user("reviewer"))
    client.raise_request_exception = False
    response = client.post(reverse("engines:envscaler_upload"), {
        "metadata": SimpleUploadedFile("m.json", _nested(100_000).encode()),
        "scenarios": SimpleUploadedFile("s.json", b"[]"),
    })
    assert response.status_code == 400 and b"nested deeper than 64 levels" in response.content
    assert Batch.objects.count() == 0


def test_the_depth_limit_is_a_setting(client_as: Any, settings: Any) -> None:
    settings.API_MAX_JSON_DEPTH = 3
    client = client_as("reviewer")
    error = _error(client.post("/api/v1/tasks", '{"tasks": [[[[]]]]}', content_type="application/json"), 400)
    assert "deeper than 3 levels" in error["message"]


# --- body size and malformed bodies ------------------------------------------------------------------


def test_a_body_over_the_limit_is_a_json_413_before_it_is_read(client_as: Any, settings: Any) -> None:
    settings.API_MAX_BODY_BYTES = 1000
    client = client_as("reviewer")
    error = _error(client.post("/api/v1/tasks", '{"tasks": "' + "x" * 2000 + '"}', content_type="application/json"),
                   413)
    assert error["code"] == "too_large" and "1000 bytes" in error["message"]


def test_the_default_limit_answers_a_50_mb_json_body_with_a_json_413(client_as: Any) -> None:
    client = client_as("reviewer")
    body = b'{"tasks": "' + b"x" * (50 << 20) + b'"}'
    assert _error(client.post("/api/v1/tasks", body, content_type="application/json"), 413)["code"] == "too_large"


def test_djangos_own_body_limit_is_the_same_json_413(client_as: Any, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000  # what a body without Content-Length runs into
    client = client_as("reviewer")
    client.raise_request_exception = False
    response = client.post("/api/v1/tasks", '{"tasks": "' + "x" * 2000 + '"}', content_type="application/json")
    assert _error(response, 413)["code"] == "too_large"


@pytest.mark.parametrize("body,content_type", [
    (b"--abc--\r\n", "multipart/form-data; boundary=abc"),
    (b"garbage without a boundary", "multipart/form-data; boundary=abc"),
    (b"--abc--\r\n", "multipart/form-data"),
    (b"--abc\r\nContent-Disposition: form-data\r\n\r\nx\r\n--abc--\r\n", "multipart/form-data; boundary=abc"),
])
def test_a_malformed_multipart_body_gets_json(client_as: Any, make_task: Any, body: bytes, content_type: str) -> None:
    """Django reads a body without parts as an empty form (then the view answers); one it cannot
    parse at all is a parse_error. Either way: JSON, never a 500."""
    task = make_task(status="failed")
    client = client_as("admin")
    client.raise_request_exception = False
    for url in ["/api/v1/tasks", f"/api/v1/tasks/{task.pk}/cancel", f"/api/v1/tasks/{task.pk}/retry",
                "/api/v1/webhooks", "/api/v1/envscaler/uploads"]:
        response = client.generic("POST", url, body, content_type=content_type)
        assert response.status_code < 500 and response["Content-Type"] == "application/json", (url, response)
        if response.status_code >= 400:
            error = _error(response, response.status_code)
            if "boundary" not in content_type:
                assert (response.status_code, error["code"]) == (400, "parse_error"), (url, error)


@pytest.fixture
def daphne_server(transactional_db: Any, tmp_path: Any) -> Any:
    """daphne serving the test database, as `make serve` runs it (no static files needed here)."""
    from tests.tasks.test_live_log_browser import DaphneServer, _server_env

    (tmp_path / "static").mkdir()
    server = DaphneServer(_server_env(tmp_path / "static"), tmp_path / "daphne.log")
    server.start()
    yield server
    server.stop()


@pytest.mark.django_db(transaction=True)
def test_daphne_leaves_a_malformed_multipart_body_to_django(daphne_server: Any, make_token: Any) -> None:
    """Under daphne, Twisted parsed multipart bodies itself and answered `--abc--` with an
    empty 400 without a content type, before Django (and its error envelope) saw the request."""
    import httpx

    _token, raw = make_token("admin")
    response = httpx.post(f"{daphne_server.url}/api/v1/webhooks", content=b"--abc--\r\n", timeout=30,
                          headers={"Authorization": f"Bearer {raw}", "Content-Type": "multipart/form-data; boundary=abc"})
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    assert response.json()["error"]["details"]["fields"] == {"url": ["This field is required."]}


# --- strict inputs (the schema's types) ------------------------------------------------------------------


def test_numbers_are_not_accepted_as_comment_or_reason(client_as: Any, make_task: Any) -> None:
    from apps.reviews.models import Proposal
    from apps.tasks.models import Trajectory

    task = make_task(status="waiting_approval", current_iteration=1)
    proposal = Proposal.objects.create(task=task, iteration=1, field="temperature", from_value=0.7, to_value=0.3,
                                       tier="yellow", proposer="review-agent")
    trajectory = Trajectory.objects.create(task=task, iteration=1, status="finished", outcome="success")
    client = client_as("approver")
    for url, body, field in [
        (f"/api/v1/proposals/{proposal.pk}/decide", {"decision": "approve", "comment": 5}, "comment"),
        (f"/api/v1/tasks/{task.pk}/cancel", {"reason": 1.5}, "reason"),
        (f"/api/v1/trajectories/{trajectory.pk}/verdicts", {"verdict": "accept", "reason": 7}, "reason"),
        ("/api/v1/tasks", {"tasks": [{"scene": "code_exec", "prompt": "p"}], "batch": 12}, "batch"),
    ]:
        error = _error(client.post(url, body, format="json"), 400)
        assert error["details"]["fields"] == {field: ["must be a string"]}, (url, error)
    assert Proposal.objects.get().status == "pending" and Task.objects.get().status == "waiting_approval"


@pytest.mark.parametrize("url", [
    "/api/v1/tasks?created_before=", "/api/v1/tasks?created_after=", "/api/v1/batches?created_before=",
    "/api/v1/trajectories?task=", "/api/v1/reviews?trajectory=", "/api/v1/proposals?task=",
])
def test_an_empty_filter_is_a_400_not_no_filter(client_as: Any, url: str) -> None:
    error = _error(client_as("viewer").get(url), 400)
    assert "must not be empty" in error["message"]


def test_an_empty_text_filter_still_means_no_filter(client_as: Any) -> None:
    assert client_as("viewer").get("/api/v1/tasks?external_id=").status_code == 200


def test_the_schema_declares_page_size_bounds_blank_enums_and_integer_ids(client: Any, settings: Any) -> None:
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    parameters = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/tasks"]["get"]["parameters"]}
    assert parameters["page_size"] == {"type": "integer", "minimum": 1, "maximum": settings.API_MAX_PAGE_SIZE}
    assert parameters["batch"]["type"] == "integer"
    assert (parameters["batch"]["minimum"], parameters["batch"]["maximum"]) == (1, 2**63 - 1)
    components = schema["components"]["schemas"]

    def allows_blank(prop: dict[str, Any]) -> bool:
        refs = [r.get("$ref", "") for r in prop.get("oneOf", prop.get("anyOf", [prop]))]
        return any(components.get(ref.rsplit("/", 1)[-1], {}).get("enum") == [""] for ref in refs) or \
            "" in prop.get("enum", [])

    assert allows_blank(components["Review"]["properties"]["verdict"])
    assert allows_blank(components["TrajectorySummary"]["properties"]["outcome"])
    # Strict request bodies say that unknown fields are refused.
    assert components["ReasonRequest"]["additionalProperties"] is False
    assert components["DecisionRequest"]["additionalProperties"] is False
    trajectories = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/trajectories"]["get"]["parameters"]}
    assert trajectories["min_reward"]["maximum"] == 1e50 and trajectories["iteration"]["minimum"] == 0


@pytest.mark.parametrize("value", ["4679-03-16T15:19:37.20+19:51", "0494-07-02T13:42:49-20:30"])
def test_a_date_filter_with_a_far_utc_offset_is_compared_in_utc(client_as: Any, make_task: Any, value: str) -> None:
    """PostgreSQL refuses offsets beyond ±15:59 (a DataError, and the request's transaction was lost)."""
    make_task()
    response = client_as("viewer").get("/api/v1/tasks", {"created_before": value})
    assert response.status_code == 200
    assert len(response.json()["results"]) == (1 if value.startswith("4679") else 0)


def test_a_date_filter_outside_years_1_to_9999_in_utc_is_a_400(client_as: Any) -> None:
    error = _error(client_as("viewer").get("/api/v1/tasks", {"created_after": "0001-01-01T00:00:00+05:00"}), 400)
    assert "out of range" in error["message"]


# --- images from outside (issue 36, item 1) ------------------------------------------------------


@pytest.mark.parametrize("size", [(30000, 30000), (12000, 12000)])
def test_an_imported_decompression_bomb_is_a_400_naming_its_line_and_writes_nothing(
        client_as: Any, artifact_store: Any, size: tuple[int, int]) -> None:
    import base64
    import json

    from apps.tasks.models import Trajectory
    from tests.datasets.test_interchange import adp_web_record
    from trajplatform.artifacts import Artifact

    record = adp_web_record()
    bomb = "data:image/png;base64," + base64.b64encode(bomb_png(*size)).decode()
    record["content"][7]["content"] = bomb
    upload = SimpleUploadedFile("bomb.adp.jsonl", (json.dumps(record) + "\n").encode())
    before = (Batch.objects.count(), Task.objects.count(), Trajectory.objects.count(), Artifact.objects.count())
    error = _error(client_as("admin").post("/api/v1/imports/trajectories", {
        "file": upload, "format": "adp", "outcome": "success"}, format="multipart"), 400)
    [reason] = [e["reason"] for e in error["details"]["errors"]]
    assert reason.startswith("bomb.adp.jsonl:1:") and "IMAGE_MAX_PIXELS" in reason
    assert (Batch.objects.count(), Task.objects.count(), Trajectory.objects.count(), Artifact.objects.count()) == before
    assert not [p for p in artifact_store.rglob("*") if p.is_file()]
