"""Text is made storable at write time, the same way on SQLite and PostgreSQL: secrets (the LLM
key, `trj_` API tokens) never reach a row or a page; NUL bytes and lone surrogates from sandboxes,
tools and models become U+FFFD (counted), and a person's input holding them is refused clearly."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIClient

from apps.reviews.models import Review
from apps.reviews.review_agent import JudgeFailed, JudgeResult
from apps.reviews.services import review_open, review_store
from apps.tasks import jobs
from apps.tasks.models import Batch, Task, Trajectory, TrajectoryLog
from apps.tasks.services import REPLACED_CHARS, TaskCreateError, batch_import, task_start_iteration
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.tasks.test_jobs import FakeResult, fake_agent  # noqa: F401 (fixture)
from tests.tasks.test_synthesize import offline_only  # noqa: F401 (fixture)
from trajplatform.api_models import api_token_create
from trajplatform.redaction import REDACTED, REPLACEMENT

SECRET = "sk-live-console-secret-0123456789abcdef"
FFFD = REPLACEMENT

# A task whose command and verifier print NUL bytes, with the reference solution the offline
# model replays: on PostgreSQL this lost the whole trajectory (DataError), on SQLite it passed.
NUL_TASK = {
    "external_id": "nul-001",
    "scene": "code_exec",
    "prompt": "Print the three bytes a, NUL, b with printf, then finish.",
    "config": {"verifier": {"command": "printf 'v\\000w'", "timeout": 30}},
    "expected_tools": ["run_shell"],
    "max_steps": 4,
    "reference_solution": [
        {"thought": "printf writes the NUL byte.", "tool_calls": [
            {"name": "run_shell", "arguments": {"command": "printf 'a\\000b'"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"answer": "printed a, NUL, b"}}]},
    ],
}


def api_client(user: Any) -> APIClient:
    _token, raw = api_token_create(user=user, name="tests", actor=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


# -- NUL bytes and lone surrogates from the sandbox, the tools and the model ------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings")
def test_a_command_printing_nul_succeeds_with_the_byte_replaced_and_counted(offline_only: str, tmp_path: Path):
    path = tmp_path / "nul.jsonl"
    path.write_text(json.dumps(NUL_TASK) + "\n", encoding="utf-8")
    call_command("synthesize", "--tasks", str(path), "--batch", "nul", "--wait", "--start-offline-model",
                 "--concurrency", "1", stdout=io.StringIO(), stderr=io.StringIO())

    trajectory = Trajectory.objects.get(task__batch__name="nul")
    assert (trajectory.status, trajectory.outcome, trajectory.reward) == ("finished", "success", 1.0)
    # Stored bytes are the same on both databases: the NUL is U+FFFD wherever the output went.
    tool_messages = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert f"a{FFFD}b" in tool_messages[0] and "\x00" not in json.dumps(trajectory.messages, ensure_ascii=False)
    shell = trajectory.steps[0]
    assert shell["tool"] == "run_shell" and f"a{FFFD}b" in shell["output"]
    assert shell[REPLACED_CHARS] == 1
    assert trajectory.steps[1][REPLACED_CHARS] == 1  # the finish step's observation quotes that output
    assert f"v{FFFD}w" in json.dumps(trajectory.verifier_output, ensure_ascii=False)
    assert trajectory.content_sha256 == trajectory.compute_content_sha256()
    # The live log kept the output line (it was dropped on PostgreSQL) and says what was replaced.
    lines = list(TrajectoryLog.objects.filter(trajectory=trajectory).order_by("seq").values_list("kind", "message", "data"))
    assert any(kind == "output" and f"a{FFFD}b" in json.dumps(data, ensure_ascii=False) for kind, _, data in lines)
    note = [data for kind, message, data in lines if kind == "system" and "replaced by U+FFFD" in message]
    assert note == [{REPLACED_CHARS: {"steps": 2, "messages": 1, "verifier_output": 1}}]
    assert trajectory.task.status == Task.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_nul_and_lone_surrogates_in_an_episode_and_its_log_are_stored_replaced(make_task, fake_agent):
    async def odd_bytes(on_event, **kwargs):
        await on_event("output", "raw\x00line", {"output": "x\x00y", "bad\x00key": "\ud800"})
        return FakeResult(
            messages=[{"role": "user", "content": "task"}, {"role": "tool", "tool_call_id": "1", "content": "a\x00b"},
                      {"role": "assistant", "content": "lone \udc00 half"}],
            steps=[{"index": 0, "output": "a\x00b\x00"}, {"index": 1, "output": "clean"}],
            final_answer="done\x00", verifier_output={"stdout": "\x00", "k\x00": 1},
        )

    fake_agent(odd_bytes)
    task = make_task()
    task_start_iteration(task=task)
    jobs.run_rollouts()

    trajectory = task.trajectories.get()
    assert (trajectory.status, trajectory.outcome, trajectory.reward) == ("finished", "success", 1.0)
    assert trajectory.messages[1]["content"] == f"a{FFFD}b" and trajectory.messages[2]["content"] == f"lone {FFFD} half"
    assert trajectory.steps == [{"index": 0, "output": f"a{FFFD}b{FFFD}", REPLACED_CHARS: 2},
                                {"index": 1, "output": "clean"}]
    assert trajectory.final_answer == f"done{FFFD}"
    assert trajectory.verifier_output == {"stdout": FFFD, f"k{FFFD}": 1}
    line = TrajectoryLog.objects.get(trajectory=trajectory, kind="output")
    assert line.message == f"raw{FFFD}line"
    assert line.data == {"output": f"x{FFFD}y", f"bad{FFFD}key": FFFD}
    note = TrajectoryLog.objects.get(trajectory=trajectory, kind="system", message__contains="U+FFFD")
    assert note.data[REPLACED_CHARS] == {"messages": 2, "steps": 2, "final_answer": 1, "verifier_output": 2}


# -- a person's input: refused with a clear error, nothing written ----------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("prompt, reason", [
    ("a\ud800b", "lone UTF-16 surrogate (U+D800)"),
    ("a\x00b", "NUL byte"),
])
def test_a_submitted_prompt_that_cannot_be_stored_is_a_400_naming_the_field(make_user, prompt: str, reason: str):
    client = api_client(make_user("reviewer"))
    body = json.dumps({"tasks": [{"scene": "code_exec", "prompt": "fine"},
                                 {"scene": "code_exec", "prompt": prompt,
                                  "system_prompt_extra": f"hint: {prompt}"}]})
    response = client.post("/api/v1/tasks", body, content_type="application/json")
    assert response.status_code == 400, response.content
    errors = response.json()["error"]["details"]["errors"]
    assert [e["field"] for e in errors] == ["tasks[1].prompt", "tasks[1].system_prompt_extra"]
    assert reason in errors[0]["reason"]
    assert not Task.objects.exists() and not Batch.objects.exists()


@pytest.mark.django_db
def test_an_imported_file_with_a_nul_byte_is_refused_whole(make_user):
    rows = [{"scene": "code_exec", "prompt": "fine"}, {"scene": "code_exec", "prompt": "bad\x00"}]
    with pytest.raises(TaskCreateError) as excinfo:
        batch_import(rows=iter(rows), name="nul import", source_name="x.jsonl", source_sha256="0" * 64,
                     source_format="trajplatform", actor=make_user("admin"))
    assert excinfo.value.errors[0][0] == "tasks[1].prompt"
    assert not Task.objects.exists() and not Batch.objects.exists()


@pytest.mark.django_db
def test_a_nul_byte_in_a_filter_spec_is_a_400_not_a_database_error(make_user, make_task):
    from apps.datasets.spec import FilterSpecError, validate_filter_spec

    with pytest.raises(FilterSpecError) as excinfo:
        validate_filter_spec({"batches": ["name\x00"], "models": ["m\x00"]})
    assert sorted(excinfo.value.errors) == ["batches[0]", "models[0]"]
    client = api_client(make_user("approver"))
    response = client.post("/api/v1/datasets/nul-ds/versions", {"filter_spec": {"models": ["m\x00"]}}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["details"]["errors"][0]["field"] == "models[0]"


# -- secrets: never stored, so never shown ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@override_settings(LLM_API_KEY=SECRET)
def test_the_llm_key_in_a_prompt_is_redacted_in_the_rows_and_absent_from_every_page(make_user, fake_agent, client):
    reviewer = make_user("reviewer")
    token_user = make_user("viewer")
    _token, raw_token = api_token_create(user=token_user, name="leaked", actor=token_user)
    prompt = f"Use the key {SECRET} and the token {raw_token} to call the API."
    response = api_client(reviewer).post(
        "/api/v1/tasks", {"tasks": [{"scene": "code_exec", "prompt": prompt}]}, format="json")
    assert response.status_code == 201, response.content
    task = Task.objects.get()
    assert task.prompt == f"Use the key {REDACTED} and the token {REDACTED} to call the API."

    async def echo(config, **kwargs):  # the agent gets what the task holds, and echoes it
        return FakeResult(messages=[{"role": "user", "content": config["prompt"]}], final_answer=config["prompt"])

    fake_agent(echo)
    jobs.run_rollouts()
    trajectory = task.trajectories.get()
    assert trajectory.messages[0]["content"] == task.prompt

    # A judge prompt quoting the raw key (e.g. a task stored before this fix) is stored redacted.
    review = review_open(trajectory=trajectory)
    failed = review_store(review=review, checks={}, failure=JudgeFailed(f"bad key {SECRET}", prompt=SECRET, raw=SECRET))
    assert failed is not None and failed.judge_prompt == REDACTED and failed.error == f"bad key {REDACTED}"
    judged = JudgeResult(scores={"tool_usage": {"score": 80, "rationale": f"saw {SECRET}"}}, suggestions=[],
                         summary=f"the prompt held {SECRET}", model="judge", prompt=f"## Task\n{SECRET}",
                         raw=f'{{"key": "{SECRET}"}}', rubric_version="1")
    review = review_store(review=failed, checks={"note": {"fired": False, "detail": SECRET}}, result=judged)
    assert review is not None and review.status == Review.Status.DONE
    assert review.judge_prompt == f"## Task\n{REDACTED}" and review.judge_raw == f'{{"key": "{REDACTED}"}}'
    rows = [*Task.objects.values(), *Trajectory.objects.values(), *Review.objects.values(),
            *TrajectoryLog.objects.values()]
    assert not [row for row in rows if SECRET in str(row) or raw_token in str(row)]

    client.force_login(make_user("viewer"))
    for page in (f"/trajectories/{trajectory.pk}/", f"/review/trajectories/{trajectory.pk}/",
                 f"/review/tasks/{task.pk}/"):
        response = client.get(page)
        assert response.status_code == 200, page
        body = response.content.decode()
        assert SECRET not in body and raw_token not in body and REDACTED in body, page
