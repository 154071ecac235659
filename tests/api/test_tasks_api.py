"""Tasks, batches and trajectories over the API: creation, idempotency, filters, cancel/retry, redaction."""
from __future__ import annotations

from typing import Any

import pytest

from apps.tasks.models import Batch, Task, Trajectory
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db

ITEM = {"scene": "code_exec", "prompt": "Print the first ten primes.", "external_id": "primes-1"}


@pytest.fixture(autouse=True)
def _no_queue(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Rollout jobs are enqueued on commit; record the calls instead of touching the broker."""
    from apps.tasks import services

    calls: list[Any] = []
    monkeypatch.setattr(services, "dispatch_rollouts", lambda **kw: calls.append(kw))
    return calls


def test_a_reviewer_creates_tasks_that_start_after_commit(
    client_as: Any, django_capture_on_commit_callbacks: Any, _no_queue: list[Any]
) -> None:
    client = client_as("reviewer")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/api/v1/tasks", {"tasks": [ITEM, {**ITEM, "external_id": "primes-2"}], "batch": "b1"},
                               format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["batch"]["name"] == "b1" and [t["created"] for t in body["tasks"]] == [True, True]
    assert {t["status"] for t in body["tasks"]} == {"running"}
    tasks = Task.objects.filter(batch_id=body["batch"]["id"])
    assert tasks.count() == 2 and Trajectory.objects.filter(task__in=tasks).count() == 2
    assert AuditEvent.objects.filter(action="tasks.task_create").count() == 2
    assert _no_queue, "rollout jobs were not dispatched on commit"


def test_external_ids_make_a_repeat_return_the_existing_task(client_as: Any) -> None:
    client = client_as("reviewer")
    first = client.post("/api/v1/tasks", {"tasks": [ITEM], "batch": "ext"}, format="json").json()
    again = client.post("/api/v1/tasks", {"tasks": [ITEM, {**ITEM, "external_id": "new"}], "batch": "ext"},
                        format="json")
    assert again.status_code == 201
    tasks = again.json()["tasks"]
    assert tasks[0]["id"] == first["tasks"][0]["id"] and tasks[0]["created"] is False and tasks[1]["created"] is True
    assert Task.objects.count() == 2 and Batch.objects.count() == 1


def test_idempotency_key_replays_the_first_response_and_refuses_a_different_body(client_as: Any) -> None:
    client = client_as("reviewer")
    first = client.post("/api/v1/tasks", {"tasks": [ITEM]}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    repeat = client.post("/api/v1/tasks", {"tasks": [ITEM]}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == repeat.status_code == 201
    assert repeat.json() == first.json() and repeat["Idempotent-Replayed"] == "true"
    assert Task.objects.count() == 1
    other = client.post("/api/v1/tasks", {"tasks": [{**ITEM, "prompt": "other"}]}, format="json",
                        HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"
    assert Task.objects.count() == 1
    # Keys belong to their user: another user's same key is a new request.
    second_user = client_as("reviewer")
    assert second_user.post("/api/v1/tasks", {"tasks": [ITEM]}, format="json",
                            HTTP_IDEMPOTENCY_KEY="k-1").status_code == 201
    assert Task.objects.count() == 2


def test_a_failed_request_is_not_stored_under_its_key(client_as: Any) -> None:
    client = client_as("reviewer")
    bad = client.post("/api/v1/tasks", {"tasks": [{"scene": "nope", "prompt": "x"}]}, format="json",
                      HTTP_IDEMPOTENCY_KEY="k-2")
    assert bad.status_code == 400
    good = client.post("/api/v1/tasks", {"tasks": [ITEM]}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert good.status_code == 201


def test_invalid_items_are_all_reported_and_nothing_is_written(client_as: Any) -> None:
    client = client_as("reviewer")
    response = client.post("/api/v1/tasks", {"tasks": [
        ITEM,
        {"scene": "code_exec", "prompt": "", "priority": 11},
        {"scene": "code_exec", "prompt": "x", "config": {"verifier": {}}},
        {"scene": "code_exec", "prompt": "x", "colour": "red"},
        {**ITEM},
    ]}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    fields = {e["field"] for e in error["details"]["errors"]}
    assert {"tasks[1].prompt", "tasks[1].priority", "tasks[2].config.verifier", "tasks[3].colour",
            "tasks[4].external_id"} <= fields
    assert Task.objects.count() == 0 and Batch.objects.count() == 0


@pytest.mark.parametrize("body", [
    {"tasks": []}, {"tasks": "x"}, {}, {"tasks": [ITEM], "unexpected": 1}, [ITEM], {"tasks": [1]},
])
def test_malformed_bodies_are_400(client_as: Any, body: Any) -> None:
    response = client_as("reviewer").post("/api/v1/tasks", body, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"code", "message", "details"}


def test_a_disabled_scene_is_refused(client_as: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from trajplatform import skills

    monkeypatch.setattr(skills, "_catalog", {"search2qa": skills.SkillEntry("search2qa", "trajectory-search2qa", "d")})
    response = client_as("reviewer").post("/api/v1/tasks", {"tasks": [ITEM]}, format="json")
    assert response.status_code == 400
    assert "not enabled" in response.json()["error"]["details"]["errors"][0]["reason"]


def test_list_filters_and_cursor_pagination(client_as: Any, make_task: Any) -> None:
    batch = Batch.objects.create(name="filter-me")
    for i in range(5):
        make_task(batch=batch, external_id=f"t{i}", status="failed" if i % 2 else "queued")
    make_task(scene="gui")
    client = client_as("viewer")
    page = client.get("/api/v1/tasks", {"batch": batch.pk, "status": "failed"}).json()
    assert {t["external_id"] for t in page["results"]} == {"t1", "t3"}
    assert {t["scene"] for t in client.get("/api/v1/tasks", {"scene": "gui"}).json()["results"]} == {"gui"}
    seen, url = [], "/api/v1/tasks?page_size=2"
    while url:
        body = client.get(url).json()
        seen += [t["id"] for t in body["results"]]
        url = body["next"]
    assert seen == sorted(Task.objects.values_list("id", flat=True), reverse=True)
    future = client.get("/api/v1/tasks", {"created_after": "2999-01-01T00:00:00Z"}).json()
    assert future["results"] == []
    assert client.get("/api/v1/tasks", {"status": "bogus"}).status_code == 400
    assert client.get("/api/v1/tasks", {"page_size": 0}).status_code == 400
    assert client.get("/api/v1/tasks", {"cursor": "garbage"}).status_code == 404


def test_detail_shows_iterations_and_cancel_then_retry(client_as: Any, make_task: Any) -> None:
    task = make_task(status="running", current_iteration=1)
    Trajectory.objects.create(task=task, iteration=1, sample_index=0)
    client = client_as("reviewer")
    detail = client.get(f"/api/v1/tasks/{task.pk}").json()
    assert detail["iterations"][0]["iteration"] == 1 and len(detail["iterations"][0]["trajectories"]) == 1
    cancelled = client.post(f"/api/v1/tasks/{task.pk}/cancel", {"reason": "wrong prompt"}, format="json")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    retried = client.post(f"/api/v1/tasks/{task.pk}/retry", {}, format="json")
    assert retried.status_code == 200 and retried.json()["status"] == "running"
    again = client.post(f"/api/v1/tasks/{task.pk}/retry", {}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert client.get("/api/v1/tasks/999999").status_code == 404


def test_batch_progress(client_as: Any, make_task: Any) -> None:
    batch = Batch.objects.create(name="progress")
    make_task(batch=batch, status="completed")
    make_task(batch=batch, status="queued")
    body = client_as("viewer").get(f"/api/v1/batches/{batch.pk}").json()
    assert body["progress"]["completed"] == 1 and body["progress"]["queued"] == 1
    assert body["progress"]["total"] == 2 and body["progress"]["finished"] == 1


def test_trajectory_detail_never_shows_a_secret(client_as: Any, make_task: Any, settings: Any) -> None:
    settings.LLM_API_KEY = "sk-live-abcdefghijklmnop1234"
    task = make_task(scene_config={})
    trajectory = Trajectory.objects.create(
        task=task, iteration=1, status="finished", outcome="error",
        messages=[{"role": "user", "content": "key sk-live-abcdefghijklmnop1234"}],
        config_snapshot={"api_key": "whatever-secret-value"},
        error="Authorization: Bearer abcdefghijklmnopqrstuvwxyz",
        outcome_reason="failed with sk-live-abcdefghijklmnop1234",
    )
    client = client_as("viewer")
    text = client.get(f"/api/v1/trajectories/{trajectory.pk}").content.decode()
    listing = client.get("/api/v1/trajectories", {"task": task.pk}).content.decode()
    for body in (text, listing):
        assert "sk-live-abcdefghijklmnop1234" not in body
    assert "whatever-secret-value" not in text and "abcdefghijklmnopqrstuvwxyz" not in text
    assert "[REDACTED]" in text


def test_trajectory_list_filters(client_as: Any, make_task: Any) -> None:
    task = make_task()
    Trajectory.objects.create(task=task, iteration=1, sample_index=0, status="finished", outcome="success", reward=1.0)
    Trajectory.objects.create(task=task, iteration=1, sample_index=1, status="finished", outcome="failure", reward=0.0)
    client = client_as("viewer")
    rows = client.get("/api/v1/trajectories", {"outcome": "success", "scene": "code_exec"}).json()["results"]
    assert [r["reward"] for r in rows] == [1.0]
    assert "messages" not in rows[0]


# --- batch names are unique; creating one is race-safe (issue 21, item 4) ----------------------------


def _concurrently(n: int, call: Any) -> list[Any]:
    """Run call() in n threads released together; each thread's database connection is closed."""
    import threading

    from django.db import connection

    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = call()
        except Exception as exc:  # reported by the assertions below, with the thread's exception
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_submissions_create_one_batch_and_one_task(make_token: Any) -> None:
    from rest_framework.test import APIClient

    _token, raw = make_token("reviewer")
    body = {"tasks": [{**ITEM, "external_id": "same-ext"}], "batch": "race-batch"}

    def submit() -> Any:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        response = client.post("/api/v1/tasks", body, format="json")
        return response.status_code, response.json()

    results = _concurrently(20, submit)
    assert all(isinstance(r, tuple) for r in results), [r for r in results if not isinstance(r, tuple)]
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 19 + [201], results
    assert Batch.objects.filter(name="race-batch").count() == 1 and Task.objects.count() == 1
    task_ids = {data["tasks"][0]["id"] for _, data in results}
    assert task_ids == {Task.objects.get().pk}
    assert [data["tasks"][0]["created"] for _, data in results].count(True) == 1
    assert AuditEvent.objects.filter(action="tasks.task_create").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_batch_create_returns_one_batch_to_everyone(make_user: Any) -> None:
    from apps.tasks.services import BatchNameTaken, batch_create

    user = make_user("reviewer")

    def create() -> Any:
        from django.db import transaction

        with transaction.atomic():
            return batch_create(name="shared", created_by=user, source_format="api", reuse=lambda b: True)

    results = _concurrently(20, create)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert len({batch.pk for batch, _ in results}) == 1 and [c for _, c in results].count(True) == 1
    assert Batch.objects.filter(name="shared").count() == 1

    def refuse() -> Any:
        from django.db import transaction

        with transaction.atomic():
            return batch_create(name="shared", created_by=user)

    assert all(isinstance(r, BatchNameTaken) for r in _concurrently(4, refuse))


def test_a_batch_name_someone_else_has_is_a_409(client_as: Any) -> None:
    assert client_as("reviewer").post("/api/v1/tasks", {"tasks": [ITEM], "batch": "mine"}, format="json").status_code == 201
    other = client_as("reviewer").post("/api/v1/tasks", {"tasks": [ITEM], "batch": "mine"}, format="json")
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
    assert "already exists" in other.json()["error"]["message"]
    assert Batch.objects.count() == 1 and Task.objects.count() == 1


def test_requests_without_a_batch_name_in_the_same_second_get_their_own_batches(
    client_as: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime

    from django.utils import timezone

    frozen = timezone.now().replace(microsecond=0) + datetime.timedelta(microseconds=1)
    monkeypatch.setattr(timezone, "now", lambda: frozen)
    client = client_as("reviewer")
    names = [client.post("/api/v1/tasks", {"tasks": [{**ITEM, "external_id": ""}]}, format="json").json()["batch"]["name"]
             for _ in range(3)]
    assert len(set(names)) == 3 and names[1] == f"{names[0]} (2)" and names[2] == f"{names[0]} (3)"


def test_an_import_into_a_taken_batch_name_is_refused_and_writes_nothing(make_task: Any) -> None:
    from apps.tasks.services import BatchNameTaken, batch_import

    make_task(batch=Batch.objects.create(name="taken"))
    with pytest.raises(BatchNameTaken):
        batch_import(rows=[{"scene": "code_exec", "prompt": "p"}], name="taken", source_name="f.jsonl",
                     source_sha256="", source_format="native", actor=None)
    assert Batch.objects.count() == 1 and Task.objects.count() == 1


def test_an_envscaler_upload_without_a_name_gets_a_free_generated_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.engines.pipelines.envscaler import envscaler_import
    from apps.engines.scenes.envscaler import importer
    from apps.tasks.services import BatchNameTaken

    rows = [{"scene": "envscaler", "prompt": "book a slot", "scene_config": {"env_name": "clinic"}}]
    monkeypatch.setattr(importer, "validate_inputs", lambda **kw: [dict(r) for r in rows])
    names = [envscaler_import(metadata=[], scenarios=[], actor=None).name for _ in range(2)]
    assert names == ["envscaler: clinic", "envscaler: clinic (2)"]
    with pytest.raises(BatchNameTaken):
        envscaler_import(metadata=[], scenarios=[], actor=None, batch_name="envscaler: clinic")
