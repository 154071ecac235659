"""The README's `make demo` path, as commands: admin, example import, the console shows it."""
from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from apps.tasks.models import Batch, Task

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"

pytestmark = pytest.mark.django_db


def test_demo_commands_leave_the_example_batch_visible_in_the_console(client, monkeypatch):
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "a-demo-password-123")
    for _ in range(2):  # `make demo` may run again: nothing is duplicated
        call_command("bootstrap_admin", "admin", "--password-env", "DEMO_ADMIN_PASSWORD", stdout=StringIO())
        call_command("import_tasks", str(EXAMPLES / "demo.jsonl"), "--batch", "demo", "--once", stdout=StringIO())

    batch = Batch.objects.get(name="demo")
    expected = sum(1 for line in (EXAMPLES / "demo.jsonl").read_text().splitlines() if line.strip())
    assert batch.task_count == expected == Task.objects.filter(batch=batch).count()

    assert client.login(username="admin", password="a-demo-password-123")
    changelist = client.get("/admin/tasks/batch/")
    assert changelist.status_code == 200
    assert "demo" in changelist.content.decode()
    tasks = client.get(f"/admin/tasks/task/?batch__id__exact={batch.pk}")
    assert tasks.status_code == 200
    body = tasks.content.decode()
    first = Task.objects.filter(batch=batch).order_by("id").first()
    assert first.external_id in body
