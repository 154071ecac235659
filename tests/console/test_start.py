"""Start work from the browser (issue 28, item 6): a task file through the import service (line
errors shown, nothing written), a single-task form that starts, Start / Cancel / Retry, live progress."""
from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from apps.tasks.models import Batch, Task, Trajectory
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db

GOOD = {"scene": "code_exec", "prompt": "Print hello.", "external_id": "hello"}


def _file(lines: list[object], name: str = "tasks.jsonl") -> SimpleUploadedFile:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    return SimpleUploadedFile(name, text.encode(), content_type="application/jsonl")


def test_a_file_with_a_bad_line_is_refused_with_its_line_and_nothing_written(client, reviewer):
    client.force_login(reviewer)
    bad = [GOOD, {**GOOD, "external_id": "two"}, {"scene": "code_exec", "external_id": "three"}, "{not json"]
    response = client.post(reverse("tasks:task_new"), {"kind": "file", "file": _file(bad), "start": "on"})
    html = response.content.decode()
    assert response.status_code == 400 and 'id="import-errors"' in html
    assert "tasks.jsonl:3: prompt: required field is missing" in html
    assert "tasks.jsonl:4:" in html and "nothing was imported" in html
    assert not Batch.objects.exists() and not Task.objects.exists()
    assert not AuditEvent.objects.filter(action="tasks.batch_import").exists()


def test_a_valid_file_is_imported_and_started(client, reviewer, django_capture_on_commit_callbacks):
    client.force_login(reviewer)
    lines = [GOOD, {**GOOD, "external_id": "two", "prompt": "Print two."}]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("tasks:task_new"), {"kind": "file", "file": _file(lines), "batch": "from the form",
                                                           "start": "on"})
    batch = Batch.objects.get(name="from the form")
    assert response.url == reverse("reviews:batch", args=[batch.pk])
    assert batch.task_count == 2 and batch.created_by == reviewer
    assert set(Task.objects.values_list("status", flat=True)) == {"running"}
    assert Trajectory.objects.filter(task__batch=batch).count() == 2 and callbacks
    assert AuditEvent.objects.filter(action="tasks.batch_import", actor=reviewer).count() == 1


def test_a_file_imported_without_start_waits_for_the_start_button(client, reviewer):
    client.force_login(reviewer)
    client.post(reverse("tasks:task_new"), {"kind": "file", "file": _file([GOOD], "demo.jsonl")})
    batch = Batch.objects.get(name="demo")
    assert Task.objects.get().status == "queued" and Task.objects.get().current_iteration == 0
    page = client.get(reverse("reviews:batch", args=[batch.pk])).content.decode()
    assert 'id="batch-controls"' in page and ">Start</button>" in page
    response = client.post(reverse("reviews:batch_control", args=[batch.pk, "start"]), follow=True)
    assert "1 task(s) started" in response.content.decode()
    assert Task.objects.get().status == "running"


def test_the_single_task_form_creates_and_starts_one_task(client, reviewer):
    client.force_login(reviewer)
    response = client.post(reverse("tasks:task_new"), {
        "kind": "single", "scene": "code_exec", "prompt": "Print the first ten primes.", "scene_config": "",
        "external_id": "primes", "max_steps": "8"})
    task = Task.objects.get()
    assert response.url == reverse("reviews:task", args=[task.pk])
    assert (task.status, task.max_steps, task.external_id, task.created_by) == ("running", 8, "primes", reviewer)
    assert AuditEvent.objects.filter(action="tasks.task_create", actor=reviewer).count() == 1


def test_the_single_task_form_shows_field_errors_and_writes_nothing(client, reviewer):
    client.force_login(reviewer)
    response = client.post(reverse("tasks:task_new"), {"kind": "single", "scene": "code_exec", "prompt": "x",
                                                       "scene_config": "[1, 2]"})
    assert response.status_code == 400 and "must be a JSON object" in response.content.decode()
    response = client.post(reverse("tasks:task_new"), {"kind": "single", "scene": "code_exec", "prompt": "x",
                                                       "scene_config": '{"image": 5}'})
    assert response.status_code == 400 and 'id="import-errors"' in response.content.decode()
    assert not Task.objects.exists()


def test_viewers_see_the_page_but_cannot_create(client, viewer):
    client.force_login(viewer)
    assert client.get(reverse("tasks:task_new")).status_code == 200
    response = client.post(reverse("tasks:task_new"), {"kind": "file", "file": _file([GOOD])})
    assert response.status_code == 403 and not Task.objects.exists()
    batch = Batch.objects.create(name="b")
    assert client.post(reverse("reviews:batch_control", args=[batch.pk, "cancel"])).status_code == 403


def test_cancel_and_retry_a_task_and_a_batch(client, reviewer, make_task):
    task = make_task()
    client.force_login(reviewer)
    client.post(reverse("reviews:task_control", args=[task.pk, "start"]))
    task.refresh_from_db()
    assert task.status == "running"
    client.post(reverse("reviews:task_control", args=[task.pk, "cancel"]))
    task.refresh_from_db()
    assert task.status == "cancelled"
    client.post(reverse("reviews:task_control", args=[task.pk, "retry"]))
    task.refresh_from_db()
    assert task.status == "running"
    client.post(reverse("reviews:batch_control", args=[task.batch_id, "cancel"]))
    task.refresh_from_db()
    assert task.status == "cancelled"
    response = client.post(reverse("reviews:batch_control", args=[task.batch_id, "retry"]), follow=True)
    assert "1 task(s) queued again" in response.content.decode()
    response = client.post(reverse("reviews:task_control", args=[task.pk, "start"]), follow=True)
    assert "only a queued, not started task starts" in response.content.decode()
    assert client.post(reverse("reviews:task_control", args=[task.pk, "explode"])).status_code == 404
    mine = AuditEvent.objects.filter(actor=reviewer)
    assert mine.filter(action="tasks.task_cancel").count() == 2 and mine.filter(action="tasks.task_requeue").count() == 2


def test_the_batch_progress_refreshes_itself_until_every_task_is_final(client, viewer, make_task):
    task = make_task()
    client.force_login(viewer)
    fragment = client.get(reverse("reviews:batch_progress", args=[task.batch_id])).content.decode()
    # every 3 s while the batch's websocket is not open (tests/console/test_batch_progress_ws.py)
    assert 'hx-trigger="every 3s [' in fragment and "0 of 1 tasks final" in fragment
    Task.objects.filter(pk=task.pk).update(status="completed")
    fragment = client.get(reverse("reviews:batch_progress", args=[task.batch_id])).content.decode()
    assert "hx-trigger" not in fragment and "1 of 1 tasks final" in fragment
