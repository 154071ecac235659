"""Trajectory pages: who may see them, what they show (escaped), and the log backfill endpoint."""
from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.tasks.models import Trajectory
from apps.tasks.services import trajectory_log_append
from apps.tasks.episode import episode_from
from apps.tasks.views import BACKFILL_MAX_LIMIT

pytestmark = pytest.mark.django_db

MESSAGES = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "List the files. <script>alert('task')</script>"},
    {
        "role": "assistant",
        "content": "I should look around first.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls -la"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "notes.txt\n<script>alert('out')</script>"},
    {"role": "assistant", "content": "There is one file: notes.txt."},
]
# The agent loop's per-step records (apps/engines/agent.py): one per tool call.
STEPS = [{
    "index": 0, "turn": 1, "tool_call_id": "call_1", "tool": "shell", "arguments": {"command": "ls -la"},
    "format": "native", "observation": MESSAGES[1]["content"], "thought": "I should look around first.",
    "llm": {"model": "scripted-reference", "latency_ms": 40, "usage": {"total_tokens": 150}, "cached": False},
    "output": MESSAGES[3]["content"], "exit_code": 0, "duration_ms": 12, "truncated": False, "timed_out": False,
}]


@pytest.fixture
def trajectory(make_task):
    task = make_task(external_id="files-1", prompt="List the files in the working directory.")
    return Trajectory.objects.create(
        task=task,
        iteration=1,
        status=Trajectory.Status.FINISHED,
        outcome=Trajectory.Outcome.SUCCESS,
        outcome_reason="verifier passed",
        reward=1.0,
        model="scripted-reference",
        messages=MESSAGES,
        steps=STEPS,
        final_answer="notes.txt",
        prompt_tokens=120,
        completion_tokens=30,
        total_tokens=150,
    )


def detail_url(trajectory_id: int) -> str:
    return reverse("tasks:trajectory_detail", args=[trajectory_id])


def log_url(trajectory_id: int) -> str:
    return reverse("tasks:trajectory_log", args=[trajectory_id])


# --- permissions -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tasks:trajectory_list", "tasks:trajectory_detail"])
def test_anonymous_users_are_sent_to_the_login_page(client, trajectory, name):
    url = reverse(name, args=[trajectory.pk] if name.endswith("detail") else [])
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert "next=" in response["Location"]


@pytest.mark.parametrize("name", ["tasks:trajectory_list", "tasks:trajectory_detail"])
def test_a_signed_in_user_without_the_view_permission_gets_403(client, make_user, trajectory, name):
    client.force_login(make_user(None))
    url = reverse(name, args=[trajectory.pk] if name.endswith("detail") else [])
    assert client.get(url).status_code == 403


def test_an_outsider_gets_403_not_404_for_an_unknown_trajectory(client, make_user):
    client.force_login(make_user(None))
    assert client.get(detail_url(999999)).status_code == 403


@pytest.mark.parametrize("trajectory_id", [999999, 10**30])
def test_a_viewer_gets_404_for_an_unknown_trajectory(client, viewer, trajectory_id):
    client.force_login(viewer)
    assert client.get(detail_url(trajectory_id)).status_code == 404
    assert client.get(log_url(trajectory_id)).status_code == 404


# --- the detail page ---------------------------------------------------------------------------

def test_the_viewer_sees_the_summary_steps_and_the_live_log_panel(client, viewer, trajectory):
    client.force_login(viewer)
    response = client.get(detail_url(trajectory.pk))
    assert response.status_code == 200
    html = response.content.decode()
    for text in ("List the files in the working directory.", "scripted-reference", "verifier passed",
                 "150 total (120 prompt, 30 completion)", "I should look around first.", "Action · shell",
                 "exit code 0", "12 ms", "model call: scripted-reference, 40 ms, 150 tokens",
                 "There is one file: notes.txt.", "You are a careful agent.", "Conversation"):
        assert text in html, text
    assert "&quot;command&quot;: &quot;ls -la&quot;" in html  # arguments indented as JSON, escaped
    assert f'data-backfill-url="{log_url(trajectory.pk)}"' in html
    assert f'data-ws-path="/ws/trajectories/{trajectory.pk}/"' in html
    assert "tasks/livelog.js" in html
    assert reverse("admin:tasks_trajectory_change", args=[trajectory.pk]) in html
    assert reverse("admin:tasks_task_change", args=[trajectory.task_id]) in html


def test_message_text_is_escaped(client, viewer, trajectory):
    client.force_login(viewer)
    html = client.get(detail_url(trajectory.pk)).content.decode()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#x27;task&#x27;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#x27;out&#x27;)&lt;/script&gt;" in html


def test_the_page_renders_malformed_episode_json_instead_of_failing(client, viewer, make_task):
    odd = Trajectory.objects.create(
        task=make_task(),
        iteration=1,
        messages=["bare string", {"role": "assistant", "tool_calls": ["not a dict", {"function": None}]},
                  {"role": "tool", "tool_call_id": "nobody", "content": [{"type": "text", "text": "<b>part</b>"}]}],
        steps={"not": "a list"},
        tools=[{"type": "function", "function": {"name": "shell"}}, {"function": None}, "weird"],
    )
    client.force_login(viewer)
    response = client.get(detail_url(odd.pk))
    assert response.status_code == 200
    assert "&lt;b&gt;part&lt;/b&gt;" in response.content.decode()


def test_steps_come_from_the_agents_step_records():
    episode = episode_from(MESSAGES, STEPS)
    assert episode.source == "steps"
    (step,) = episode.steps
    assert step.observations == [("", MESSAGES[1]["content"])]
    assert step.thought == "I should look around first."
    (action,) = step.actions
    assert (action.name, action.call_id, action.result) == ("shell", "call_1", MESSAGES[3]["content"])
    # A command is shown as highlighted source; no other arguments are left to list.
    assert "ls" in action.code and "-la" in action.code and action.arguments == ""
    assert (action.summary, action.state, action.is_error) == ("ls -la", "exit 0", False)
    assert action.meta[:2] == ["exit code 0", "12 ms"]
    assert [m.role for m in episode.conversation] == ["system", "user", "assistant", "tool", "assistant"]


def test_calls_of_one_model_reply_show_its_observation_once():
    records = [
        {"turn": 1, "observation": "the task", "thought": "two things", "tool": "a", "output": "x", "exit_code": None},
        {"turn": 1, "observation": "the task", "thought": "", "tool": "b", "output": "y", "timed_out": True},
        {"turn": 2, "observation": "y", "thought": "done", "tool": "finish", "output": "ok", "error": "boom"},
    ]
    first, second, third = episode_from([], records).steps
    # The third step's observation only repeats the second's result, shown there (issue 28).
    assert (first.observations, second.observations, third.observations) == ([("", "the task")], [], [])
    assert first.actions[0].meta == ["no exit code"]
    assert "timed out" in second.actions[0].meta
    assert "error: boom" in third.actions[0].meta


def test_without_step_records_steps_are_rebuilt_from_the_messages():
    episode = episode_from(MESSAGES, [])
    assert episode.source == "messages"
    first, second = episode.steps
    assert first.observations == [("task", MESSAGES[1]["content"])]
    (action,) = first.actions
    assert (action.name, action.call_id, action.result) == ("shell", "call_1", MESSAGES[3]["content"])
    # A command is shown as highlighted source; no other arguments are left to list.
    assert "ls" in action.code and "-la" in action.code and action.arguments == ""
    assert (action.summary, action.state, action.is_error) == ("ls -la", "", False)
    assert second.actions == [] and second.thought == "There is one file: notes.txt."


def test_arguments_that_are_not_json_are_shown_as_sent():
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "function": {"name": "x", "arguments": "{not json"}}]}]
    assert episode_from(messages, None).steps[0].actions[0].arguments == "{not json"


# --- the list page -------------------------------------------------------------------------------

def test_the_list_filters_by_status_and_task_and_paginates(client, viewer, make_task):
    task_a, task_b = make_task(), make_task()
    for i in range(1, 56):
        Trajectory.objects.create(task=task_a, iteration=i)
    done = Trajectory.objects.create(
        task=task_b, iteration=1, status=Trajectory.Status.FINISHED, outcome=Trajectory.Outcome.FAILURE
    )
    client.force_login(viewer)
    url = reverse("tasks:trajectory_list")

    with CaptureQueriesContext(connection) as queries:
        first = client.get(url)
    assert first.status_code == 200
    assert len(first.context["page"].object_list) == 50
    # The pager reads one row past the page instead of counting every trajectory.
    assert first.context["page"].has_next and not first.context["page"].has_previous
    assert not any("COUNT(" in q["sql"].upper() for q in queries.captured_queries)
    assert "page=2" in first.content.decode() and "page 1</span>" in first.content.decode()

    second = client.get(url, {"task": task_a.pk, "page": 2})
    assert [t.task_id for t in second.context["page"].object_list] == [task_a.pk] * 5
    assert not second.context["page"].has_next and "page=1" in second.content.decode()
    # Past the last page: an empty page with the way back; out of range or not a number: page 1.
    beyond = client.get(url, {"page": 9})
    assert beyond.context["page"].object_list == [] and "page=8" in beyond.content.decode()
    for bad in ("0", "-1", "10001", "٣", "99999999999999999999"):
        assert client.get(url, {"page": bad}).context["page"].number == 1

    finished = client.get(url, {"status": "finished"})
    assert [t.pk for t in finished.context["page"].object_list] == [done.pk]
    assert detail_url(done.pk) in finished.content.decode()


def test_bad_list_filters_show_an_error_instead_of_failing(client, viewer, make_task):
    Trajectory.objects.create(task=make_task(), iteration=1)
    client.force_login(viewer)
    response = client.get(reverse("tasks:trajectory_list"), {"task": "abc", "status": "nope", "page": "zzz"})
    assert response.status_code == 200
    assert response.context["form"].errors.keys() == {"task", "status"}
    assert len(response.context["page"].object_list) == 1 and response.context["page"].number == 1


# --- the backfill endpoint --------------------------------------------------------------------

@pytest.fixture
def logged(trajectory):
    trajectory_log_append(
        trajectory_id=trajectory.pk, lines=[("output", f"line {n}", {"n": n}) for n in range(1, 8)]
    )
    return trajectory


def test_backfill_returns_lines_in_seq_order(client, viewer, logged):
    client.force_login(viewer)
    response = client.get(log_url(logged.pk))
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    body = response.json()
    assert [line["seq"] for line in body["lines"]] == [1, 2, 3, 4, 5, 6, 7]
    assert body["lines"][0] == {**body["lines"][0], "kind": "output", "message": "line 1", "data": {"n": 1}}
    assert (body["status"], body["last_seq"], body["more"]) == ("finished", 7, False)


def test_backfill_pages_with_after_and_limit(client, viewer, logged):
    client.force_login(viewer)
    body = client.get(log_url(logged.pk), {"after": 2, "limit": 3}).json()
    assert [line["seq"] for line in body["lines"]] == [3, 4, 5]
    assert (body["last_seq"], body["more"]) == (5, True)
    rest = client.get(log_url(logged.pk), {"after": body["last_seq"], "limit": 3}).json()
    assert [line["seq"] for line in rest["lines"]] == [6, 7]
    assert rest["more"] is False
    empty = client.get(log_url(logged.pk), {"after": 7}).json()
    assert (empty["lines"], empty["last_seq"], empty["more"]) == ([], 7, False)


def test_backfill_caps_the_limit(client, viewer, logged):
    client.force_login(viewer)
    assert client.get(log_url(logged.pk), {"limit": 10**6}).json()["limit"] == BACKFILL_MAX_LIMIT


@pytest.mark.parametrize(
    "params",
    [{"after": "abc"}, {"after": "-1"}, {"after": "1.5"}, {"after": ""}, {"after": " 3"},
     {"after": "99999999999999999999999"}, {"limit": "0"}, {"limit": "ten"}, {"limit": "-5"}],
)
def test_backfill_rejects_bad_parameters_with_400_json(client, viewer, logged, params):
    client.force_login(viewer)
    response = client.get(log_url(logged.pk), params)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert "must be an integer" in json.loads(response.content)["error"]


def test_backfill_answers_json_errors_for_anonymous_outsider_and_unknown(client, make_user, viewer, logged):
    anonymous = client.get(log_url(logged.pk))
    assert (anonymous.status_code, anonymous["Content-Type"]) == (403, "application/json")
    client.force_login(make_user(None))
    assert client.get(log_url(logged.pk)).status_code == 403
    assert client.get(log_url(999999)).status_code == 403
    client.force_login(viewer)
    unknown = client.get(log_url(999999))
    assert (unknown.status_code, unknown.json()) == (404, {"error": "no such trajectory"})


def test_backfill_only_answers_get(client, viewer, logged):
    client.force_login(viewer)
    assert client.post(log_url(logged.pk)).status_code == 405


def test_log_lines_are_json_encoded_not_html(client, viewer, trajectory):
    trajectory_log_append(trajectory_id=trajectory.pk, lines=[("output", "<img src=x onerror=alert(1)>", {})])
    client.force_login(viewer)
    response = client.get(log_url(trajectory.pk))
    assert response["Content-Type"] == "application/json"
    assert response.json()["lines"][0]["message"] == "<img src=x onerror=alert(1)>"


def test_a_scripted_reference_trajectory_is_labelled_as_the_offline_stand_in(client, make_user, make_task):
    from apps.tasks.models import Trajectory

    trajectory = Trajectory.objects.create(task=make_task(), iteration=1, model="scripted-reference")
    client.force_login(make_user("viewer"))
    body = client.get(f"/trajectories/{trajectory.pk}/").content.decode()
    assert "offline scripted stand-in" in body
    trajectory.model = "deepseek-chat"
    trajectory.save(update_fields=["model"])
    assert "offline scripted stand-in" not in client.get(f"/trajectories/{trajectory.pk}/").content.decode()
