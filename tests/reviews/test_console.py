"""The /review/ console: every page and action for anonymous, viewer, reviewer, approver and admin,
and what the pages show."""
from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from apps.reviews.models import Proposal, Review
from apps.tasks.models import Batch, Task
from tests.reviews.factories import auto_review, finished_trajectory, waiting_task

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "viewer", "reviewer", "approver", "admin")


@pytest.fixture
def world(make_task: Any) -> dict[str, Any]:
    return waiting_task(make_task)


def _client(client: Any, make_user: Any, role: str) -> Any:
    if role != "anonymous":
        client.force_login(make_user(role))
    return client


PAGES = {
    "queue": lambda w: reverse("reviews:queue"),
    "queue filtered": lambda w: reverse("reviews:queue") + f"?tier=red&batch={w['task'].batch.name}&stale=on",
    "trajectory": lambda w: reverse("reviews:trajectory", args=[w["trajectory"].pk]),
    "task history": lambda w: reverse("reviews:task", args=[w["task"].pk]),
    "batches": lambda w: reverse("reviews:batches"),
    "batch": lambda w: reverse("reviews:batch", args=[w["task"].batch_id]),
    "agreement": lambda w: reverse("reviews:agreement"),
}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("page", PAGES)
def test_every_page_needs_a_login_and_the_viewer_role(client, make_user, world, role, page):
    response = _client(client, make_user, role).get(PAGES[page](world))
    if role == "anonymous":
        assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    else:
        assert response.status_code == 200


def test_a_signed_in_user_without_a_role_gets_403(client, make_user, world):
    client.force_login(make_user(None))
    assert client.get(reverse("reviews:queue")).status_code == 403
    assert client.post(reverse("reviews:decide", args=[world["yellow"].pk]),
                       {"decision": "choose", "option": "0"}).status_code == 403


# action -> (request, roles allowed, effect check)
def _decide_yellow(client: Any, w: dict[str, Any]) -> Any:
    return client.post(reverse("reviews:decide", args=[w["yellow"].pk]), {"decision": "choose", "option": "1"})


def _decide_red(client: Any, w: dict[str, Any]) -> Any:
    return client.post(reverse("reviews:decide", args=[w["red"].pk]), {"decision": "approve", "comment": "ok"})


def _verdict(client: Any, w: dict[str, Any]) -> Any:
    return client.post(reverse("reviews:verdict", args=[w["trajectory"].pk]),
                       {"verdict": "needs_fix", "reason": "step 2 is wrong", "flag": ["1"], "note_1": "bad"})


def _end(client: Any, w: dict[str, Any]) -> Any:
    return client.post(reverse("reviews:task_end", args=[w["task"].pk]), {"comment": "good enough"})


def _force(client: Any, w: dict[str, Any]) -> Any:
    return client.post(reverse("reviews:task_force", args=[w["task"].pk]))


ACTIONS = {
    "decide yellow": (_decide_yellow, {"reviewer", "approver", "admin"},
                      lambda w: Proposal.objects.get(pk=w["yellow"].pk).chosen_option == "gpt-4o-mini"),
    "decide red": (_decide_red, {"approver", "admin"},
                   lambda w: Proposal.objects.get(pk=w["red"].pk).status == "approved"),
    "human verdict": (_verdict, {"reviewer", "approver", "admin"},
                      lambda w: Review.objects.filter(trajectory=w["trajectory"], kind="human").exists()),
    "end loop": (_end, {"reviewer", "approver", "admin"},
                 lambda w: Task.objects.get(pk=w["task"].pk).status == "completed"),
    "force iteration": (_force, {"reviewer", "approver", "admin"},
                        lambda w: Task.objects.get(pk=w["task"].pk).current_iteration == 2),
}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", ACTIONS)
def test_every_action_is_allowed_exactly_to_its_roles(client, make_user, world, role, action):
    send, allowed, happened = ACTIONS[action]
    response = send(_client(client, make_user, role), world)
    if role == "anonymous":
        assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
        assert not happened(world)
    elif role in allowed:
        assert response.status_code == 302 and happened(world)
    else:
        assert response.status_code == 403 and not happened(world)


def test_get_is_refused_on_actions(client, reviewer, world):
    client.force_login(reviewer)
    assert client.get(reverse("reviews:decide", args=[world["yellow"].pk])).status_code == 405


def test_the_queue_shows_options_to_reviewers_and_red_sign_off_only_to_approvers(client, reviewer, approver, world):
    client.force_login(reviewer)
    body = client.get(reverse("reviews:queue")).content.decode()
    assert "gpt-4o-mini" in body and "Choose option" in body
    assert "Red changes are signed off by an approver." in body and "longer runs cost more" in body
    client.force_login(approver)
    body = client.get(reverse("reviews:queue")).content.decode()
    assert "Red changes are signed off by an approver." not in body and body.count("Reject") == 2


def test_the_queue_filters_by_tier_and_flags_stale_proposals(client, viewer, world, settings):
    client.force_login(viewer)
    body = client.get(reverse("reviews:queue") + "?tier=red").content.decode()
    assert f"proposal-{world['red'].pk}" in body and f"proposal-{world['yellow'].pk}" not in body
    assert "stale</span>" not in body
    settings.REVIEW_STALE_PROPOSAL_HOURS = 0
    body = client.get(reverse("reviews:queue") + "?stale=on").content.decode()
    assert f"proposal-{world['red'].pk}" in body and "stale</span>" in body
    other = Batch.objects.create(name="other")
    body = client.get(reverse("reviews:queue") + f"?batch={other.name}").content.decode()
    assert "No pending proposals match these filters." in body


def test_a_bad_decision_is_a_message_not_an_error(client, reviewer, world):
    client.force_login(reviewer)
    response = client.post(reverse("reviews:decide", args=[world["yellow"].pk]),
                           {"decision": "choose", "option": "7"}, follow=True)
    assert response.status_code == 200 and "option 7 does not exist" in response.content.decode()
    assert Proposal.objects.get(pk=world["yellow"].pk).status == "pending"


def test_a_second_decider_is_told_who_decided(client, make_user, world):
    first, second = make_user("reviewer", username="alice"), make_user("approver", username="bob")
    client.force_login(first)
    _decide_yellow(client, world)
    client.force_login(second)
    response = client.post(reverse("reviews:decide", args=[world["yellow"].pk]), {"decision": "reject"}, follow=True)
    assert "already decided by alice" in response.content.decode()


def test_the_trajectory_page_shows_review_checks_and_steps(client, reviewer, world):
    review = world["review"]
    review.checks = {"unhandled_errors": {"fired": True, "count": 1, "detail": "steps [0]", "penalty": 5,
                                          "title": "failed steps never recovered from"},
                     "verifier": {"fired": False, "count": 0, "detail": "", "penalty": 0, "title": "verifier"}}
    review.judge_model = "scripted-reference"
    review.save()
    client.force_login(reviewer)
    body = client.get(reverse("reviews:trajectory", args=[world["trajectory"].pk])).content.decode()
    assert "failed steps never recovered from" in body and "steps [0]" in body
    assert "offline scripted stand-in" in body and "tool_usage" in body
    assert "run_shell" in body and 'id="live-log"' in body and "/ws/trajectories/" in body
    assert "Record verdict" in body


def test_the_iteration_history_shows_config_changes_side_by_side(client, viewer, make_task):
    task = make_task(max_steps=5)
    auto_review(finished_trajectory(task, iteration=1))
    Task.objects.filter(pk=task.pk).update(max_steps=10, system_prompt_extra="Use run_shell.")
    task.refresh_from_db()
    auto_review(finished_trajectory(task, iteration=2), overall=90)
    Proposal.objects.create(task=task, iteration=1, field="max_steps", from_value=5, to_value=10, tier="green",
                            status="applied", proposer="rule:max_steps", chosen_option=10)
    client.force_login(viewer)
    body = client.get(reverse("reviews:task", args=[task.pk])).content.decode()
    assert 'id="iteration-2"' in body and 'id="iteration-1"' in body
    assert '<td class="before"><pre>5</pre></td><td class="after"><pre>10</pre></td>' in body
    assert "Use run_shell." in body and "policy (green)" in body and "score 90.0" in body
    assert "End the loop now" not in body  # viewers read only


def test_pages_do_not_query_per_row(client, viewer, make_task, django_assert_max_num_queries):
    for _ in range(12):
        waiting_task(make_task)
    client.force_login(viewer)
    with django_assert_max_num_queries(14):
        assert client.get(reverse("reviews:queue")).status_code == 200
    with django_assert_max_num_queries(12):
        assert client.get(reverse("reviews:batches")).status_code == 200


def test_the_queue_pages_keep_their_order_and_a_deep_page_reads_only_its_rows(client, viewer, make_task, monkeypatch,
                                                                           django_assert_max_num_queries):
    from apps.reviews import views

    monkeypatch.setattr(views, "PAGE_SIZE", 4)
    for _ in range(5):  # 10 pending proposals: pages of 4, 4 and 2
        waiting_task(make_task)
    oldest_first = list(Proposal.objects.filter(status=Proposal.Status.PENDING).order_by("created_at", "id")
                        .values_list("pk", flat=True))
    client.force_login(viewer)
    shown = []
    for number in (1, 2, 3):
        with django_assert_max_num_queries(14):
            response = client.get(reverse("reviews:queue") + f"?page={number}")
        shown += [row["proposal"].pk for row in response.context["rows"]]
    assert shown == oldest_first
    last = client.get(reverse("reviews:queue") + "?page=999999")  # past the end: the last page
    assert [row["proposal"].pk for row in last.context["rows"]] == oldest_first[8:]
    assert last.context["page"].number == 3 and last.context["page"].paginator.count == 10


def test_a_batch_page_lists_its_tasks_in_windows_without_counting_them_all(client, viewer, make_task, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.reviews import views

    monkeypatch.setattr(views, "PAGE_SIZE", 4)
    first = make_task()
    tasks = [first] + [make_task(batch=first.batch) for _ in range(8)]  # pages of 4, 4 and 1
    client.force_login(viewer)
    url = reverse("reviews:batch", args=[first.batch_id])
    shown = []
    for number in (1, 2, 3):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url, {"page": number})
        page = response.context["page"]
        shown += [t.pk for t in page.object_list]
        assert page.has_next == (number < 3) and page.has_previous == (number > 1)
        # The tasks are read as one window of PAGE_SIZE + 1 rows; the only COUNT is the state line's.
        assert sum("COUNT(" in q["sql"].upper() and "GROUP BY" not in q["sql"].upper()
                   for q in queries.captured_queries) == 0
    assert shown == [t.pk for t in tasks]
    html = client.get(url, {"page": 2, "status": "not_started"}).content.decode()
    assert "page=1" in html and "page=3" in html and "status=not_started" in html and "page 2</span>" in html
    assert client.get(url, {"page": "99999999"}).context["page"].number == 1


@pytest.mark.parametrize("data, message", [
    ({"verdict": "needs_fix", "reason": ""}, "give a reason"),
    ({"verdict": "maybe", "reason": "x"}, "verdict must be one of"),
    ({"verdict": "reject", "reason": "x", "flag": ["abc"]}, "is not a step number"),
    ({"verdict": "reject", "reason": "x", "flag": ["42"]}, "step 42 does not exist"),
])
def test_bad_verdict_input_is_a_message_and_writes_nothing(client, reviewer, world, data, message):
    client.force_login(reviewer)
    response = client.post(reverse("reviews:verdict", args=[world["trajectory"].pk]), data, follow=True)
    assert response.status_code == 200 and message in response.content.decode()
    assert not Review.objects.filter(kind="human").exists()


def test_bad_filters_and_transitions_are_messages_not_errors(client, reviewer, world):
    client.force_login(reviewer)
    response = client.get(reverse("reviews:queue") + "?batch=abc&older_than_hours=-3&tier=purple")
    assert response.status_code == 200 and 'class="errors"' in response.content.decode()
    Task.objects.filter(pk=world["task"].pk).update(status=Task.Status.RUNNING)
    response = client.post(reverse("reviews:task_end", args=[world["task"].pk]), follow=True)
    assert response.status_code == 200 and "only a reviewing or waiting task" in response.content.decode()
    assert client.get(reverse("reviews:trajectory", args=[10**12])).status_code == 404


def test_the_admin_actions_decide_through_the_same_service(client, reviewer, approver, world):
    url = reverse("admin:reviews_proposal_changelist")
    both = [world["yellow"].pk, world["red"].pk]
    client.force_login(reviewer)
    response = client.post(url, {"action": "approve_proposed_value", "_selected_action": both}, follow=True)
    body = response.content.decode()
    assert "Approved 1 proposal(s)" in body and "decided by an approver" in body
    assert Proposal.objects.get(pk=world["red"].pk).status == "pending"
    client.force_login(approver)
    client.post(url, {"action": "reject_selected", "_selected_action": both}, follow=True)
    red = Proposal.objects.get(pk=world["red"].pk)
    assert (red.status, red.decided_by, red.comment) == ("rejected", approver, "decided in the console")
    assert Task.objects.get(pk=world["task"].pk).status == "running"  # the last decision started iteration 2


def test_a_reviewer_withdraws_their_own_red_proposal_from_the_queue(client, reviewer, approver, world):
    red = world["red"]
    Proposal.objects.filter(pk=red.pk).update(proposed_by=reviewer)
    client.force_login(reviewer)
    body = client.get(reverse("reviews:queue")).content.decode()
    assert "You proposed this red change" in body and "Withdraw" in body
    # Approving stays refused; withdrawing (reject) is allowed and audited as a withdrawal.
    assert client.post(reverse("reviews:decide", args=[red.pk]), {"decision": "approve"}).status_code == 403
    client.post(reverse("reviews:decide", args=[red.pk]), {"decision": "reject"})
    red.refresh_from_db()
    assert (red.status, red.decided_by) == ("rejected", reviewer)
    from trajplatform.audit import AuditEvent
    assert AuditEvent.objects.filter(action="reviews.proposal_withdraw", target_id=str(red.pk)).count() == 1
