"""Bulk actions and assignment in the review queue (issue 40, item 4): many items accepted, rejected
with a reason or assigned, each through its review service with its own audit row, refusals reported
per item; an approver assigns items to named reviewers (reviews.assign_review), an assignment holds a
slot for its assignee, who finds the item first in "next" and ends it with a verdict."""
from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse

from apps.reviews import queue_actions, selectors, services
from apps.reviews.models import Review, ReviewAssignment
from apps.tasks.models import Trajectory
from tests.reviews.factories import finished_trajectory
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_bulk_accept_records_one_verdict_and_one_audit_row_per_item(client, awaiting, reviewer):
    items = awaiting(3)
    client.force_login(reviewer)
    response = client.post(reverse("reviews:work_bulk"), {"action": "accept", "item": [t.pk for t in items],
                                                          "queue": "scene=code_exec"})
    assert response.status_code == 302 and response["Location"] == "/review/work/?scene=code_exec"
    reviews = Review.objects.filter(kind="human", reviewer=reviewer)
    assert sorted(reviews.values_list("trajectory_id", flat=True)) == sorted(t.pk for t in items)
    assert set(reviews.values_list("verdict", flat=True)) == {"accept"}
    events = AuditEvent.objects.filter(action="reviews.human_verdict")
    assert sorted(e.data["trajectory"] for e in events) == sorted(t.pk for t in items)
    page = client.get("/review/work/?scene=code_exec").content.decode()
    assert "Accepted 3 item(s): " + ", ".join(f"#{t.pk}" for t in items) in page


def test_bulk_reject_needs_a_reason_and_then_reports_each_refused_item(client, awaiting, make_user, settings):
    settings.REVIEW_REVIEWERS_PER_ITEM = 1
    free, held, judged = awaiting(3)
    me, holder = make_user("reviewer"), make_user("reviewer", username="holder")
    services.review_claim(trajectory=held, actor=holder)
    services.human_verdict_record(trajectory=judged, actor=me, verdict="needs_fix", reason="later")
    client.force_login(me)
    ids = [free.pk, held.pk, judged.pk, 10**9]
    page = client.post(reverse("reviews:work_bulk"), {"action": "reject", "item": ids}, follow=True).content.decode()
    assert "Nothing done: give a reason for the verdict &#x27;reject&#x27;" in page
    assert not Review.objects.filter(verdict="reject").exists()
    page = client.post(reverse("reviews:work_bulk"), {"action": "reject", "item": ids, "reason": "wrong file"},
                       follow=True).content.decode()
    assert f"Rejected 1 item(s): #{free.pk}." in page
    assert f"#{held.pk} not rejected: trajectory {held.pk} is claimed by holder until" in page
    assert f"#{judged.pk} not rejected: you already gave a verdict on trajectory {judged.pk}" in page
    assert f"#{10**9} not rejected: no such trajectory" in page
    assert list(Review.objects.filter(verdict="reject").values_list("trajectory_id", "rationale")) == \
        [(free.pk, "wrong file")]
    assert AuditEvent.objects.filter(action="reviews.human_verdict").count() == 2  # needs_fix + the one reject


def test_bulk_input_that_is_not_a_selection_is_a_message(client, awaiting, reviewer):
    (item,) = awaiting(1)
    client.force_login(reviewer)
    for data, message in [({"action": "accept", "item": ["abc"]}, "not a trajectory"),
                          ({"action": "accept"}, "select at least one item"),
                          ({"action": "explode", "item": [item.pk]}, "unknown bulk action"),
                          ({"action": "assign", "item": [item.pk], "assignee": "nobody-here"}, "choose a reviewer")]:
        response = client.post(reverse("reviews:work_bulk"), data, follow=True)
        assert response.status_code == 200 and message in response.content.decode(), message
    with pytest.raises(ValidationError, match="at most 200"):
        queue_actions.review_bulk(trajectory_ids=list(range(1, 202)), actor=reviewer, action="accept")
    assert not Review.objects.filter(kind="human").exists()


def test_only_approvers_assign_and_a_viewer_gives_no_verdicts(client, awaiting, reviewer, viewer, approver):
    (item,) = awaiting(1)
    assert approver.has_perm("reviews.assign_review") and not reviewer.has_perm("reviews.assign_review")
    client.force_login(reviewer)
    assert client.post(reverse("reviews:work_bulk"), {"action": "assign", "item": [item.pk],
                                                      "assignee": reviewer.username}).status_code == 403
    client.force_login(viewer)
    assert client.post(reverse("reviews:work_bulk"), {"action": "accept", "item": [item.pk]}).status_code == 403
    html = client.get(reverse("reviews:work")).content.decode()
    assert 'id="bulk"' not in html  # nothing to act with
    with pytest.raises(PermissionDenied):
        queue_actions.review_assign(trajectory=item, assignee=reviewer, actor=reviewer)
    assert not ReviewAssignment.objects.exists() and not Review.objects.filter(kind="human").exists()


def test_an_approver_assigns_items_to_a_reviewer_who_finds_them_first(client, awaiting, make_user, approver):
    first, second, third = awaiting(3)
    alice, bob = make_user("reviewer", username="alice"), make_user("reviewer", username="bob")
    client.force_login(approver)
    page = client.post(reverse("reviews:work_bulk"), {"action": "assign", "item": [third.pk, second.pk],
                                                      "assignee": "alice"}, follow=True).content.decode()
    assert f"Assigned 2 item(s) to alice: #{third.pk}, #{second.pk}." in page
    events = AuditEvent.objects.filter(action="reviews.assign").order_by("id")
    assert [(e.data["trajectory"], e.data["assignee"], e.actor) for e in events] == \
        [(third.pk, "alice", approver), (second.pk, "alice", approver)]
    # assigning again is a no-op, no second row or audit row
    queue_actions.review_assign(trajectory=third, assignee=alice, actor=approver)
    assert ReviewAssignment.objects.filter(status="active").count() == 2 == events.count()
    # alice's next item is her oldest assigned one, not the free first item; its page says so
    claim = services.review_claim_next(actor=alice, queue=selectors.human_queue(reviewer=alice))
    assert claim.trajectory_id == second.pk
    client.force_login(alice)
    html = client.get(reverse("reviews:trajectory", args=[second.pk])).content.decode()
    assert f'id="assigned-to">Assigned to <strong>you</strong> by {approver.username}.' in html
    client.force_login(approver)
    # bob's queue skips items assigned to someone else when their slots are full
    claim = services.review_claim_next(actor=bob, queue=selectors.human_queue(reviewer=bob))
    assert claim.trajectory_id == first.pk
    with pytest.raises(services.ClaimError, match="assigned to alice"):
        services.review_claim(trajectory=third, actor=bob)
    # alice's verdict ends her assignment
    services.human_verdict_record(trajectory=second, actor=alice, verdict="accept", reason="")
    assignment = ReviewAssignment.objects.get(trajectory=second)
    assert assignment.status == "done" and assignment.ended_at is not None
    assert AuditEvent.objects.filter(action="reviews.human_verdict").last().data["assignment_closed"] is True
    html = client.get(reverse("reviews:work")).content.decode()
    assert f'id="item-{third.pk}"' in html and "alice</td>" in html.split(f'id="item-{third.pk}"')[1].split("</tr>")[0]


def test_assignment_refusals_say_why(awaiting, make_user, approver, viewer, make_task, settings):
    settings.REVIEW_REVIEWERS_PER_ITEM = 1
    held, judged = awaiting(2)
    alice, bob = make_user("reviewer", username="alice"), make_user("reviewer", username="bob")
    services.review_claim(trajectory=held, actor=bob)
    services.human_verdict_record(trajectory=judged, actor=alice, verdict="accept", reason="")
    running = finished_trajectory(make_task(), status=Trajectory.Status.RUNNING, outcome="", finished_at=None)
    cases = [(held, alice, "claimed by bob until"), (judged, alice, "alice already gave a verdict"),
             (judged, bob, "already has its 1 verdict"), (running, alice, "has not finished"),
             (held, viewer, "is not an active reviewer")]
    for trajectory, assignee, message in cases:
        with pytest.raises(queue_actions.AssignError, match=message):
            queue_actions.review_assign(trajectory=trajectory, assignee=assignee, actor=approver)
    # bob holds the claim and is assigned: one slot, counted once
    queue_actions.review_assign(trajectory=held, assignee=bob, actor=approver)
    assert selectors.human_queue().get(pk=held.pk).holds == 1


def test_unassign_by_an_approver_or_the_assignee_and_in_bulk(client, awaiting, make_user, approver):
    first, second = awaiting(2)
    alice = make_user("reviewer", username="alice")
    for item in (first, second):
        queue_actions.review_assign(trajectory=item, assignee=alice, actor=approver)
    assert queue_actions.review_unassign(trajectory=first, assignee=alice, actor=alice).status == "withdrawn"
    assert queue_actions.review_unassign(trajectory=first, assignee=alice, actor=alice) is None
    client.force_login(approver)
    page = client.post(reverse("reviews:work_bulk"), {"action": "unassign", "item": [first.pk, second.pk],
                                                      "assignee": "alice"}, follow=True).content.decode()
    assert f"Unassigned 1 item(s) from alice: #{second.pk}." in page
    assert f"#{first.pk} not unassigned: trajectory {first.pk} is not assigned to alice" in page
    assert AuditEvent.objects.filter(action="reviews.unassign").count() == 2
    assert not ReviewAssignment.objects.filter(status="active").exists()


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_bulk_accepting_one_item_at_once_give_one_verdict(awaiting, make_user, settings):
    """Both lock the item before looking at its slots: one verdict, one refusal naming it."""
    import threading

    from django.db import connection

    settings.REVIEW_REVIEWERS_PER_ITEM = 1
    (item,) = awaiting(1)
    people = [make_user("reviewer"), make_user("reviewer")]
    barrier, results = threading.Barrier(2), {}

    def accept(person):
        try:
            barrier.wait()
            results[person.pk] = queue_actions.review_bulk(trajectory_ids=[item.pk], actor=person, action="accept")
        finally:
            connection.close()

    threads = [threading.Thread(target=accept, args=(p,)) for p in people]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert Review.objects.filter(kind="human", trajectory=item).count() == 1
    outcomes = sorted((len(r.done), len(r.failed)) for r in results.values())
    assert outcomes == [(0, 1), (1, 0)]
    refused = next(r for r in results.values() if r.failed)
    assert "already has its 1 verdict" in refused.failed[0][1]


def test_the_admin_lists_assignments_and_withdraws_them_through_the_service(client, awaiting, make_user, approver,
                                                                            reviewer):
    (item,) = awaiting(1)
    alice = make_user("reviewer", username="alice")
    assignment = queue_actions.review_assign(trajectory=item, assignee=alice, actor=approver)
    url = reverse("admin:reviews_reviewassignment_changelist")
    client.force_login(reviewer)  # may read, not withdraw
    assert client.get(url).status_code == 200
    client.post(url, {"action": "withdraw", "_selected_action": [assignment.pk]})
    assignment.refresh_from_db()
    assert assignment.status == "active"
    client.force_login(approver)
    assert client.get(reverse("admin:reviews_reviewassignment_change", args=[assignment.pk])).status_code == 200
    assert client.get(reverse("admin:reviews_reviewassignment_add")).status_code == 403
    response = client.post(url, {"action": "withdraw", "_selected_action": [assignment.pk]}, follow=True)
    assert "Withdrew 1 assignment(s)." in response.content.decode()
    assignment.refresh_from_db()
    assert assignment.status == "withdrawn"
    assert AuditEvent.objects.get(action="reviews.unassign").actor == approver


def test_a_nul_in_a_bulk_reason_is_stored_replaced_not_a_server_error(client, awaiting, reviewer):
    (item,) = awaiting(1)
    client.force_login(reviewer)
    response = client.post(reverse("reviews:work_bulk"), {"action": "reject", "item": [item.pk],
                                                          "reason": "bad\x00file"}, follow=True)
    assert response.status_code == 200 and f"Rejected 1 item(s): #{item.pk}." in response.content.decode()
    assert Review.objects.get(kind="human").rationale == "bad\ufffdfile"
