"""/api/v1/review-assignments (issue 40): approvers assign queue items to a named reviewer through
queue_actions.review_assign_many (all or nothing), reviewers list their own and hand one back."""
from __future__ import annotations

from typing import Any, Callable

import pytest
from django.urls import reverse

from apps.reviews import queue_actions, services
from apps.reviews.models import ReviewAssignment
from apps.tasks.models import Task, Trajectory
from tests.reviews.factories import auto_review, finished_trajectory
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db

URL = "/api/v1/review-assignments"


@pytest.fixture
def items(make_task: Callable[..., Any]) -> Callable[[int], list[Trajectory]]:
    """items(n): n finished, automatically reviewed trajectories below the threshold: the human queue's."""
    def _make(n: int) -> list[Trajectory]:
        made = []
        for _ in range(n):
            task = make_task()
            Task.objects.filter(pk=task.pk).update(status=Task.Status.COMPLETED, current_iteration=1)
            trajectory = finished_trajectory(task)
            auto_review(trajectory, 60.0)
            made.append(trajectory)
        return made

    return _make


@pytest.fixture
def alice(make_user: Callable[..., Any]) -> Any:
    return make_user("reviewer", username="alice")


def api(client_as: Callable[..., Any], make_token: Callable[..., Any], user: Any) -> Any:
    client = client_as("anonymous")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(user=user)[1]}")
    return client


def nothing_written() -> bool:
    return not ReviewAssignment.objects.exists() and not AuditEvent.objects.filter(
        action__in=["reviews.assign", "reviews.unassign"]).exists()


def test_an_approver_assigns_items_and_the_reviewers_console_queue_shows_them(
        client_as: Any, client: Any, items: Any, alice: Any) -> None:
    first, second, other = items(3)
    approver = client_as("approver")
    response = approver.post(URL, {"assignee": "alice", "trajectories": [second.pk, first.pk, first.pk]}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()["assignments"]
    assert [(a["trajectory"], a["assignee"], a["status"], a["created"]) for a in body] == [
        (first.pk, "alice", "active", True), (second.pk, "alice", "active", True)]
    assert {a["assigned_by"] for a in body} == {approver.token.user.username}
    events = AuditEvent.objects.filter(action="reviews.assign").order_by("id")
    assert [(e.data["trajectory"], e.data["assignee"], e.actor_id) for e in events] == [
        (first.pk, "alice", approver.token.user.pk), (second.pk, "alice", approver.token.user.pk)]
    client.force_login(alice)
    page = client.get(reverse("reviews:work"), {"assigned": "me"}).content.decode()
    listed = {int(row.split('"', 1)[0]) for row in page.split('id="item-')[1:]}
    assert listed == {first.pk, second.pk} and other.pk not in listed
    assert "Assigned to me: <strong>2</strong>" in page


def test_assigning_what_is_assigned_already_returns_it_without_a_second_row(client_as: Any, items: Any,
                                                                             alice: Any) -> None:
    held, new = items(2)
    approver = client_as("approver")
    assert approver.post(URL, {"assignee": "alice", "trajectories": [held.pk]}, format="json").status_code == 201
    again = approver.post(URL, {"assignee": "alice", "trajectories": [held.pk]}, format="json")
    assert again.status_code == 200 and again.json()["assignments"][0]["created"] is False
    mixed = approver.post(URL, {"assignee": "alice", "trajectories": [held.pk, new.pk]}, format="json")
    assert mixed.status_code == 201
    assert [a["created"] for a in mixed.json()["assignments"]] == [False, True]
    assert ReviewAssignment.objects.count() == 2 and AuditEvent.objects.filter(action="reviews.assign").count() == 2


def test_a_reviewer_cannot_assign(client_as: Any, items: Any, alice: Any) -> None:
    (item,) = items(1)
    response = client_as("reviewer").post(URL, {"assignee": "alice", "trajectories": [item.pk]}, format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "permission_denied"
    assert nothing_written()


@pytest.mark.parametrize("assignee,reason", [
    ("mallory", "no user is named mallory"),
    ("al\x00ice", "a username cannot contain NUL characters"),  # a 400, not a database error
], ids=["unknown-user", "nul-in-username"])
def test_an_assignee_nobody_is_is_a_400_on_assignee_and_nothing_is_written(client_as: Any, items: Any,
                                                                           assignee: str, reason: str) -> None:
    (item,) = items(1)
    response = client_as("approver").post(URL, {"assignee": assignee, "trajectories": [item.pk]}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"]["fields"] == {"assignee": [reason]}
    assert nothing_written()


@pytest.mark.parametrize("who", ["viewer", "inactive"])
def test_a_user_who_cannot_review_is_a_400_on_assignee(client_as: Any, make_user: Any, items: Any, who: str) -> None:
    (item,) = items(1)
    if who == "viewer":
        make_user("viewer", username="victor")
    else:
        make_user("reviewer", username="victor", is_active=False)
    response = client_as("approver").post(URL, {"assignee": "victor", "trajectories": [item.pk]}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"]["fields"] == {"assignee": ["victor is not an active reviewer"]}
    assert nothing_written()


def test_unknown_trajectory_ids_are_a_400_naming_them_and_the_known_one_is_not_assigned(
        client_as: Any, items: Any, alice: Any) -> None:
    (item,) = items(1)
    missing = [item.pk + 1000, item.pk + 999]
    response = client_as("approver").post(URL, {"assignee": "alice", "trajectories": [item.pk, *missing]},
                                          format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"]["fields"] == {
        "trajectories": [f"no trajectory has the id {item.pk + 999}, {item.pk + 1000}"]}
    assert nothing_written()


def test_a_form_or_multipart_body_is_a_415_and_writes_nothing(client_as: Any, items: Any, alice: Any) -> None:
    (item,) = items(1)
    approver = client_as("approver")
    for kwargs in ({}, {"content_type": "application/x-www-form-urlencoded"}):  # multipart, then a form
        body = {"assignee": "alice", "trajectories": item.pk} if not kwargs else f"assignee=alice&trajectories={item.pk}"
        response = approver.post(URL, body, **kwargs)
        assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert nothing_written()


def test_an_item_the_service_refuses_rolls_back_the_whole_request(client_as: Any, items: Any, alice: Any,
                                                                  make_task: Any) -> None:
    ok, judged = items(2)
    running = Trajectory.objects.create(task=make_task(), iteration=1, status=Trajectory.Status.RUNNING)
    services.human_verdict_record(trajectory=judged, actor=alice, verdict="accept", reason="")
    response = client_as("approver").post(
        URL, {"assignee": "alice", "trajectories": [ok.pk, judged.pk, running.pk]}, format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "conflict"
    assert response.json()["error"]["details"]["fields"] == {"trajectories": [
        f"{judged.pk}: alice already gave a verdict on trajectory {judged.pk}",
        f"{running.pk}: trajectory {running.pk} has not finished"]}
    assert nothing_written()


@pytest.mark.parametrize("body,field", [
    ({"assignee": "alice", "trajectories": [1], "note": "x"}, "note"),
    ({"assignee": "alice", "trajectories": []}, "trajectories"),
    ({"assignee": "alice", "trajectories": ["one"]}, "trajectories"),
    ({"assignee": "alice", "trajectories": [2**70]}, "trajectories"),
    ({"trajectories": [1]}, "assignee"),
])
def test_malformed_bodies_are_a_400_naming_the_field(client_as: Any, alice: Any, body: dict[str, Any],
                                                     field: str) -> None:
    response = client_as("approver").post(URL, body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["details"]["fields"]
    assert nothing_written()


def test_a_reviewer_lists_their_own_assignments_only(client_as: Any, make_token: Any, make_user: Any, items: Any,
                                                     alice: Any, approver: Any) -> None:
    mine, theirs = items(2)
    bob = make_user("reviewer", username="bob")
    queue_actions.review_assign(trajectory=mine, assignee=alice, actor=approver)
    other = queue_actions.review_assign(trajectory=theirs, assignee=bob, actor=approver)
    as_alice = api(client_as, make_token, alice)
    for params in ({}, {"assignee": "me"}, {"assignee": "alice"}):
        rows = as_alice.get(URL, params).json()["results"]
        assert [(r["trajectory"], r["assignee"]) for r in rows] == [(mine.pk, "alice")], params
    refused = as_alice.get(URL, {"assignee": "bob"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    assert as_alice.get(f"{URL}/{other.pk}").status_code == 404
    assert client_as("viewer").get(URL).json()["results"] == []


def test_an_approver_lists_and_filters_everyones_with_cursor_pages(client_as: Any, make_user: Any, items: Any,
                                                                   alice: Any, approver: Any) -> None:
    first, second, third = items(3)
    bob = make_user("reviewer", username="bob")
    for item in (first, second):
        queue_actions.review_assign(trajectory=item, assignee=alice, actor=approver)
    queue_actions.review_assign(trajectory=third, assignee=bob, actor=approver)
    services.human_verdict_record(trajectory=first, actor=alice, verdict="accept", reason="")
    api_client = client_as("approver")

    def listed(**params: Any) -> list[int]:
        response = api_client.get(URL, params)
        assert response.status_code == 200, response.json()
        return [r["trajectory"] for r in response.json()["results"]]

    assert listed() == [third.pk, second.pk, first.pk]
    assert listed(assignee="alice") == [second.pk, first.pk]
    assert listed(assignee="alice", status="active") == [second.pk]
    assert listed(status="done") == [first.pk]
    assert listed(trajectory=third.pk) == [third.pk]
    assert listed(assignee="me") == [] and listed(assignee="mallory") == []
    # a value str.strip() would empty is a name nobody has (what the schema allows), not a blank 400
    assert listed(assignee="\x1c") == [] and listed(assignee=" alice") == []
    page = api_client.get(URL, {"page_size": 2}).json()
    assert [r["trajectory"] for r in page["results"]] == [third.pk, second.pk] and page["next"]
    assert [r["trajectory"] for r in api_client.get(page["next"]).json()["results"]] == [first.pk]
    for params, field in (({"assignee": "x" * 151}, "assignee"), ({"assignee": ""}, "assignee"), ({"status": "open"}, "status"),
                          ({"colour": "red"}, "colour"), ({"trajectory": "1e30"}, "trajectory")):
        response = api_client.get(URL, params)
        assert response.status_code == 400 and field in response.json()["error"]["details"]["fields"], params


def test_an_approver_withdraws_an_assignment(client_as: Any, items: Any, alice: Any, approver: Any) -> None:
    (item,) = items(1)
    assignment = queue_actions.review_assign(trajectory=item, assignee=alice, actor=approver)
    api_client = client_as("approver")
    assert api_client.delete(f"{URL}/{assignment.pk}").status_code == 204
    assignment.refresh_from_db()
    assert assignment.status == ReviewAssignment.Status.WITHDRAWN and assignment.ended_at is not None
    event = AuditEvent.objects.get(action="reviews.unassign")
    assert event.actor_id == api_client.token.user.pk and event.data == {"trajectory": item.pk, "assignee": "alice"}
    again = api_client.delete(f"{URL}/{assignment.pk}")
    assert again.status_code == 409 and "withdrawn, not active" in again.json()["error"]["message"]
    assert AuditEvent.objects.filter(action="reviews.unassign").count() == 1


def test_a_reviewer_hands_back_their_own_but_never_sees_anothers(client_as: Any, make_token: Any, make_user: Any,
                                                                 items: Any, alice: Any, approver: Any) -> None:
    mine, theirs = items(2)
    own = queue_actions.review_assign(trajectory=mine, assignee=alice, actor=approver)
    other = queue_actions.review_assign(trajectory=theirs, assignee=make_user("reviewer"), actor=approver)
    as_alice = api(client_as, make_token, alice)
    assert as_alice.delete(f"{URL}/{other.pk}").status_code == 404
    other.refresh_from_db()
    assert other.status == ReviewAssignment.Status.ACTIVE
    assert as_alice.delete(f"{URL}/{own.pk}").status_code == 204
    own.refresh_from_db()
    assert own.status == ReviewAssignment.Status.WITHDRAWN
    assert AuditEvent.objects.get(action="reviews.unassign").actor_id == alice.pk


@pytest.mark.django_db(transaction=True)
def test_two_approvers_assigning_one_item_at_once_one_request_wins_whole(items: Any, make_user: Any,
                                                                         settings: Any) -> None:
    """Overlapping requests for the last slot of an item: one assigns all of its items, the other
    none of its own (its other item is not left assigned)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    settings.REVIEW_REVIEWERS_PER_ITEM = 1
    first, shared, last = items(3)
    approvers = [make_user("approver"), make_user("approver")]
    requests = {approvers[0].pk: ([first.pk, shared.pk], make_user("reviewer")),
                approvers[1].pk: ([shared.pk, last.pk], make_user("reviewer"))}
    barrier = threading.Barrier(2, timeout=30)

    def assign(approver: Any) -> tuple[int, Any]:
        ids, assignee = requests[approver.pk]
        barrier.wait()
        try:
            return approver.pk, queue_actions.review_assign_many(trajectory_ids=ids, assignee=assignee,
                                                                 actor=approver)
        except queue_actions.AssignRefused as exc:
            return approver.pk, exc
        finally:
            connection.close()  # each thread's own connection

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(pool.map(assign, approvers, timeout=60))
    won = [pk for pk, r in results.items() if isinstance(r, list)]
    lost = [r for r in results.values() if isinstance(r, queue_actions.AssignRefused)]
    assert len(won) == 1 and len(lost) == 1, results
    winner_ids, winner_assignee = requests[won[0]]
    assert set(ReviewAssignment.objects.values_list("trajectory_id", "assignee_id")) == {
        (pk, winner_assignee.pk) for pk in winner_ids}
    assert lost[0].errors == [f"{shared.pk}: trajectory {shared.pk} is assigned to {winner_assignee.username}"]
    assert AuditEvent.objects.filter(action="reviews.assign").count() == 2
