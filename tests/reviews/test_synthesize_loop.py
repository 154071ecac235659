"""`synthesize --wait` runs the review loop in-process and returns when tasks wait for a person."""
from __future__ import annotations

import io
import json
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.core.management import call_command

from apps.reviews.models import PolicyRule, Proposal
from apps.tasks.models import Task
from tests.reviews.conftest import bundled_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings")]


def test_wait_ends_when_a_task_waits_for_approval_and_says_so(offline_model, tmp_path: Path):
    # Only max_steps may change, and only as a yellow decision.
    PolicyRule.objects.all().delete()
    PolicyRule.objects.create(field="max_steps", tier="yellow", min_value=1, max_value=100)
    spec = bundled_task(1)
    spec.update(model="scripted-reference+fault=never_finish", max_steps=3, max_iterations=3)
    spec.pop("reference_solution", None)
    path = tmp_path / "looping.jsonl"
    path.write_text(json.dumps(spec) + "\n", encoding="utf-8")
    out = io.StringIO()
    call_command("synthesize", "--tasks", str(path), "--batch", "loop", "--wait", stdout=out, stderr=out)
    output = out.getvalue()

    task = Task.objects.get(batch__name="loop")
    assert task.status == Task.Status.WAITING_APPROVAL and task.current_iteration == 1
    proposal = Proposal.objects.get(task=task)
    assert (proposal.field, proposal.tier, proposal.status, proposal.options[:1]) == ("max_steps", "yellow",
                                                                                     "pending", [6])
    assert "1 task(s): 0 done, 0 failed, 1 waiting for approval" in output
    assert "proposals:    1 yellow pending" in output
    assert f"1 task(s) wait for a decision at /review/?{urlencode({'batch': task.batch.name})}" in output
