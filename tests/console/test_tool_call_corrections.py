"""Corrections of tool calls (issue 40, item 7), on a trajectory the real loop wrote (offline model,
code_exec sandbox): the correction form shows each call's arguments as JSON (never a Python dict)
and takes them back edited; arguments that are not JSON, or break the schema of the tool the step
called (as the trajectory offered it), are refused with the step and the reason and nothing is
saved; accepted ones land in the new trajectory's step and in the assistant message's tool call,
marked edited, with the edit in the Correction's diff and the audit row."""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from apps.engines.offline_model import running_offline_model
from apps.reviews.models import Correction
from apps.tasks import jobs
from apps.tasks.models import Trajectory
from apps.tasks.services import task_start_iteration, trajectories_finish
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_agent import call, client, llm_env, run  # noqa: F401 (llm_env is a fixture)
from trajplatform.models import AuditEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("llm_env", "sandbox_settings")]

PROMPT = "Write hello.py that prints hello, then run it."
SCRIPT = [call("write_file", path="hello.py", content="print('hello')\n"), call("run_shell", command="python3 hello.py"),
          call("finish", answer="it prints hello")]


def _finished(make_task: Any, script: list[dict[str, Any]]) -> Trajectory:
    """A trajectory of the real loop: the offline model plays `script` in a code_exec sandbox."""
    task = make_task(prompt=PROMPT)
    task_start_iteration(task=task)
    [claim] = jobs.claim_trajectories(1, worker="w")
    with running_offline_model(scripts=[{"id": "s", "prompt": PROMPT, "reference_solution": script}]) as server:
        result = run(claim.trajectory.config_snapshot, client(server.url))
    [row] = trajectories_finish([{"trajectory_id": claim.pk, "claim_token": claim.token, "result": result}])
    assert row.status == "finished" and row.steps[1]["tool"] == "run_shell"
    return row


@pytest.fixture
def ran(make_task: Any) -> Trajectory:
    return _finished(make_task, SCRIPT)


def form(trajectory: Trajectory, **edits: str) -> dict[str, str]:
    """The correction form as the page fills it, with some fields changed."""
    data = {f"thought_{i}": s.get("thought") or "" for i, s in enumerate(trajectory.steps)}
    data["final_answer"] = trajectory.final_answer
    return {**data, **edits}


@pytest.mark.parametrize("text, reason", [
    ('{"command": 5}', "step 2: invalid arguments for run_shell.command: 5 is not of type 'string'"),
    ('{"cmd": "ls"}', "step 2: invalid arguments for run_shell: 'command' is a required property"),
    ('["ls"]', "step 2: the arguments of run_shell must be a JSON object, got list"),
    ('{"command": "ls"', "step 2 (run_shell): the arguments are not valid JSON"),
])
def test_arguments_that_break_the_tools_schema_are_refused_and_nothing_is_saved(ran, reviewer, client, text, reason):
    before = (ran.steps, ran.messages)
    client.force_login(reviewer)
    response = client.post(reverse("reviews:correct", args=[ran.pk]), form(ran, arguments_1=text,
                                                                           final_answer="a new answer"))
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="correct-errors"' in page and reason.replace("'", "&#x27;") in page and "Nothing was saved" in page
    assert not Correction.objects.exists() and Trajectory.objects.count() == 1
    ran.refresh_from_db()
    assert (ran.steps, ran.messages) == before


def test_edited_arguments_are_shown_as_json_and_saved_into_the_step_and_the_call(ran, reviewer, client):
    client.force_login(reviewer)
    page = client.get(reverse("reviews:correct", args=[ran.pk])).content.decode()
    assert 'name="arguments_1"' in page and "&quot;command&quot;: &quot;python3 hello.py&quot;" in page
    assert "{&#x27;command&#x27;" not in page  # never a Python dict
    response = client.post(reverse("reviews:correct", args=[ran.pk]),
                           form(ran, arguments_1='{"command": "python3 -B hello.py"}', note="no .pyc"))
    correction = Correction.objects.get()
    corrected = correction.corrected
    assert response.url == reverse("reviews:trajectory", args=[corrected.pk])
    step = corrected.steps[1]
    assert step["arguments"] == {"command": "python3 -B hello.py"} and step["arguments_edited"] is True
    assert step["output"] == ran.steps[1]["output"]  # the recorded result stays
    [sent] = [c for m in corrected.messages for c in m.get("tool_calls") or [] if c["id"] == step["tool_call_id"]]
    assert json.loads(sent["function"]["arguments"]) == {"command": "python3 -B hello.py"}
    assert correction.diff == [{"edit": "arguments", "step": 1, "before": {"command": "python3 hello.py"},
                                "after": {"command": "python3 -B hello.py"}}]
    event = AuditEvent.objects.get(action="reviews.correction")
    assert event.data["edits"] == ["arguments"] and event.actor == reviewer
    ran.refresh_from_db()
    assert ran.steps[1]["arguments"] == {"command": "python3 hello.py"}  # the original never changes
    # the same JSON with other spacing is no edit
    response = client.post(reverse("reviews:correct", args=[ran.pk]), form(ran, arguments_1='{ "command":"python3 hello.py" }'))
    assert response.status_code == 400 and "nothing changed" in response.content.decode()


def test_arguments_given_as_a_json_string_are_refused_not_stored_double_encoded(ran, reviewer, client):
    client.force_login(reviewer)
    text = json.dumps('{"command": "ls"}')  # a JSON string holding JSON: a valid object once decoded twice
    response = client.post(reverse("reviews:correct", args=[ran.pk]), form(ran, arguments_1=text))
    assert response.status_code == 400
    assert "step 2: the arguments of run_shell must be a JSON object, got str" in response.content.decode()
    assert not Correction.objects.exists()


def test_an_untouched_arguments_field_sent_with_crlf_is_no_edit(ran, reviewer, client):
    from apps.reviews.views import _arguments_json

    steps = [dict(s) for s in ran.steps]
    steps[1]["arguments"] = '{"command": "python3\nhello.py"'  # a call the model sent as broken JSON, kept as text
    Trajectory.objects.filter(pk=ran.pk).update(steps=steps)
    ran.refresh_from_db()
    client.force_login(reviewer)
    untouched = _arguments_json(ran.steps[1]).replace("\n", "\r\n")  # how a browser sends a textarea
    assert "\r\n" in untouched
    response = client.post(reverse("reviews:correct", args=[ran.pk]),
                           form(ran, arguments_1=untouched, thought_0="write the file first"))
    assert response.status_code == 302
    correction = Correction.objects.get()
    assert [d["edit"] for d in correction.diff] == ["thought"]
    assert correction.corrected.steps[1]["arguments"] == ran.steps[1]["arguments"]


def test_a_tool_call_written_as_text_cannot_have_its_arguments_edited(ran, reviewer, client):
    steps = [dict(s) for s in ran.steps]
    steps[1]["format"] = "json_text"  # as a text-action model writes its calls: inside the message text
    Trajectory.objects.filter(pk=ran.pk).update(steps=steps)
    ran.refresh_from_db()
    client.force_login(reviewer)
    response = client.post(reverse("reviews:correct", args=[ran.pk]),
                           form(ran, arguments_1='{"command": "python3 -B hello.py"}'))
    assert response.status_code == 400
    assert "a tool call written as text (json_text) cannot have its arguments edited" in response.content.decode()
    assert not Correction.objects.exists()


def test_the_correction_form_edits_the_arguments_as_the_trace_shows_them(ran, reviewer, client):
    from django.utils.html import escape

    from apps.tasks.episode import arguments_text

    client.force_login(reviewer)
    trace = client.get(reverse("reviews:trajectory", args=[ran.pk])).content.decode()
    edit = client.get(reverse("reviews:correct", args=[ran.pk])).content.decode()
    for i, step in enumerate(ran.steps):
        shown = escape(arguments_text(step["arguments"]))
        assert f'name="arguments_{i}"' in edit and f'class="json-edit">{shown}</textarea>' in edit, i
        if step["tool"] == "run_shell":  # the trace shows a write_file's content as a file, not its arguments
            assert shown in trace


def test_a_call_refused_for_its_arguments_cannot_be_edited_only_dropped(make_task, reviewer, client):
    # The model's second call is broken JSON: the loop refuses it (it never runs), the model retries.
    broken = {"tool_calls": [{"name": "run_shell", "arguments": '{"command": "python3 hello.py"'}]}
    refused = _finished(make_task, [SCRIPT[0], broken, *SCRIPT[1:]])
    step = refused.steps[1]
    assert step["error_kind"] == "unparseable_arguments" and "not valid JSON" in step["output"]
    url = reverse("reviews:correct", args=[refused.pk])
    client.force_login(reviewer)
    page = client.get(url).content.decode()
    assert 'aria-describedby="never-ran-1"' in page and "refused for its arguments and never ran" in page
    # Fixing the arguments would leave the refusal answering the fixed call, in every export: refused.
    response = client.post(url, form(refused, arguments_1='{"command": "python3 hello.py"}'))
    assert response.status_code == 400 and not Correction.objects.exists()
    assert ("step 2 (run_shell): the call was refused for its arguments and never ran, so there is no result "
            "for other arguments; drop the step instead") in response.content.decode()
    # Dropping it is the correction: the call and its refusal go, the retry stays.
    response = client.post(url, form(refused, drop_1="1"))
    assert response.status_code == 302, response.content.decode()[-2000:]
    corrected = Correction.objects.get().corrected
    assert [s["tool"] for s in corrected.steps] == ["write_file", "run_shell", "finish"]
    assert not any(s.get("error") for s in corrected.steps)
    assert "not valid JSON" not in json.dumps(corrected.messages)
