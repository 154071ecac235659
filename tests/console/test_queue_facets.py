"""The review queue's facets and saved views (issue 40, item 4): batch by name with suggestions,
model, outcome, human verdict, judged by, assigned to, iteration; the builder's batches and models by
name; a person's saved views, written by their service with audit rows."""
from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.reviews import queue_actions, selectors, services
from apps.reviews.models import SavedView
from apps.tasks.models import Batch, Task, Trajectory
from tests.reviews.factories import auto_review, finished_trajectory
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db


def listed(client, **params) -> set[int]:
    response = client.get(reverse("reviews:work"), params)
    assert response.status_code == 200
    rows = response.content.decode().split('id="item-')[1:]
    return {int(row.split('"', 1)[0]) for row in rows}


def test_the_queue_filters_by_batch_name_model_outcome_and_iteration(client, awaiting, reviewer):
    first = awaiting(2, batch=Batch.objects.create(name="swe-gym nightly"))
    other = awaiting(1, batch=Batch.objects.create(name="gui smoke"))
    Trajectory.objects.filter(pk=first[0].pk).update(model="deepseek-v3", outcome="failure")
    Task.objects.filter(pk=other[0].task_id).update(current_iteration=2)
    Trajectory.objects.filter(pk=other[0].pk).update(iteration=2)
    client.force_login(reviewer)
    assert listed(client) == {t.pk for t in first + other}
    assert listed(client, batch="swe-gym nightly") == {t.pk for t in first}
    assert listed(client, model="deepseek-v3") == {first[0].pk}
    assert listed(client, outcome="failure") == {first[0].pk}
    assert listed(client, iteration=2) == {other[0].pk}
    # a typed id is not a batch name: the form says so and nothing is filtered by it
    body = client.get(reverse("reviews:work"), {"batch": str(first[0].task.batch_id)}).content.decode()
    assert f"no batch is named &#x27;{first[0].task.batch_id}&#x27;" in body


def test_the_verdict_and_reviewer_facets_show_decided_items(client, awaiting, make_user, settings):
    settings.REVIEW_REVIEWERS_PER_ITEM = 1
    accepted, rejected, open_ = awaiting(3)
    alice, bob = make_user("reviewer", username="alice"), make_user("reviewer", username="bob")
    services.human_verdict_record(trajectory=accepted, actor=alice, verdict="accept", reason="")
    services.human_verdict_record(trajectory=rejected, actor=bob, verdict="reject", reason="wrong file")
    client.force_login(alice)
    assert listed(client) == {open_.pk}  # the queue: what awaits a verdict
    assert listed(client, verdict="none") == {open_.pk}
    assert listed(client, verdict="accept") == {accepted.pk}
    assert listed(client, verdict="reject") == {rejected.pk}
    assert listed(client, reviewer="bob") == {rejected.pk}
    assert listed(client, reviewer="alice") == {accepted.pk}  # her own verdicts are not hidden here
    body = client.get(reverse("reviews:work"), {"reviewer": "mallory"}).content.decode()
    assert 'class="errors"' in body


def test_the_assigned_facet_and_assigned_to_me(client, awaiting, make_user, approver):
    mine, theirs, free = awaiting(3)
    alice, bob = make_user("reviewer", username="alice"), make_user("reviewer", username="bob")
    queue_actions.review_assign(trajectory=mine, assignee=alice, actor=approver)
    queue_actions.review_assign(trajectory=theirs, assignee=bob, actor=approver)
    client.force_login(alice)
    assert listed(client, assigned="me") == {mine.pk}
    assert listed(client, assigned="bob") == {theirs.pk}
    assert listed(client, assigned="nobody") == {free.pk}
    body = client.get(reverse("reviews:work")).content.decode()
    assert 'id="assigned-to-me"' in body and "Assigned to me: <strong>1</strong>" in body


def test_batch_and_model_suggestions_complete_what_was_typed(client, make_task, viewer):
    for name in ("swe-gym nightly", "swe-gym weekly", "gui smoke"):
        task = make_task(batch=Batch.objects.create(name=name))
        finished_trajectory(task, model=f"{name.split()[0]}-model")
    client.force_login(viewer)
    body = client.get(reverse("reviews:suggest", args=["batches"]), {"batch": "SWE"}).content.decode()
    assert body.count("<option") == 2 and 'value="swe-gym weekly"' in body and "gui" not in body
    # the builder's comma-separated list: the last part is completed, the ones before it kept
    body = client.get(reverse("reviews:suggest", args=["batches"]), {"batches": "gui smoke, swe-gym w"}).content.decode()
    assert body.strip() == '<option value="gui smoke, swe-gym weekly">'
    body = client.get(reverse("reviews:suggest", args=["models"]), {"model": "gui"}).content.decode()
    assert body.strip() == '<option value="gui-model">'
    assert client.get(reverse("reviews:suggest", args=["users"])).status_code == 404
    client.logout()
    assert client.get(reverse("reviews:suggest", args=["batches"])).status_code == 302


def test_the_builder_takes_batch_names_not_ids(client, make_task, approver):
    batch = Batch.objects.create(name="swe-gym nightly")
    client.force_login(approver)
    html = client.get(reverse("datasets:builder")).content.decode()
    assert 'list="batches-names"' in html and 'list="models-names"' in html and "Batch ids" not in html
    preview = client.get(reverse("datasets:builder_preview"),
                         {"dataset": "d", "batches": "swe-gym nightly", "dedup_exact": "on"}).content.decode()
    assert 'id="builder-errors"' not in preview
    preview = client.get(reverse("datasets:builder_preview"), {"dataset": "d", "batches": f"{batch.pk}"}).content.decode()
    assert 'id="builder-errors"' in preview and f"no batch is named &#x27;{batch.pk}&#x27;" in preview


def test_a_saved_view_reopens_the_filters_and_is_audited(client, awaiting, reviewer, make_user):
    items = awaiting(2, batch=Batch.objects.create(name="nightly"))
    client.force_login(reviewer)
    response = client.post(reverse("reviews:saved_view_save"),
                           {"name": "  nightly  low ", "queue": "batch=nightly&score_max=70&bogus=1"}, follow=True)
    view = SavedView.objects.get()
    assert (view.user, view.name, view.query) == (reviewer, "nightly low", "batch=nightly&score_max=70")
    body = response.content.decode()
    assert "Saved the view &#x27;nightly low&#x27;" in body and 'href="/review/work/?batch=nightly&amp;score_max=70"' in body
    assert listed(client, batch="nightly", score_max=70) == {t.pk for t in items}
    event = AuditEvent.objects.get(action="reviews.saved_view_save")
    assert event.actor == reviewer and event.data == {"name": "nightly low", "query": "batch=nightly&score_max=70",
                                                      "created": True}
    # the same name again replaces the filters; identical ones write nothing
    client.post(reverse("reviews:saved_view_save"), {"name": "nightly low", "queue": "batch=nightly"})
    client.post(reverse("reviews:saved_view_save"), {"name": "nightly low", "queue": "batch=nightly"})
    view.refresh_from_db()
    assert view.query == "batch=nightly" and AuditEvent.objects.filter(action="reviews.saved_view_save").count() == 2
    # views are per person: another reviewer neither sees nor deletes it
    other = make_user("reviewer")
    client.force_login(other)
    assert "nightly low</a>" not in client.get(reverse("reviews:work")).content.decode()
    assert client.post(reverse("reviews:saved_view_delete", args=[view.pk])).status_code == 404
    with pytest.raises(PermissionDenied):
        queue_actions.saved_view_delete(view=view, actor=other)
    client.force_login(reviewer)
    client.post(reverse("reviews:saved_view_delete", args=[view.pk]))
    assert not SavedView.objects.exists()
    assert AuditEvent.objects.get(action="reviews.saved_view_delete").data["name"] == "nightly low"


def test_a_view_needs_a_name(client, reviewer):
    client.force_login(reviewer)
    response = client.post(reverse("reviews:saved_view_save"), {"name": "  ", "queue": ""}, follow=True)
    assert "View not saved: give the view a name" in response.content.decode()
    with pytest.raises(ValidationError, match="at most 100"):
        queue_actions.saved_view_save(user=reviewer, name="x" * 101, query="")
    assert not SavedView.objects.exists() and not AuditEvent.objects.filter(action__startswith="reviews.saved").exists()


def test_the_queue_page_reads_a_constant_number_of_queries(client, awaiting, make_user, approver):
    """The facets' choices, saved views, assignments and claims come with the page, never per row."""
    alice = make_user("reviewer", username="alice")
    client.force_login(alice)
    queue_actions.saved_view_save(user=alice, name="mine", query="assigned=me")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("reviews:work"), {"scene": "code_exec"}).status_code == 200
        return len(captured)

    few = awaiting(2)
    queue_actions.review_assign(trajectory=few[0], assignee=alice, actor=approver)
    small = queries()
    many = awaiting(30)
    for item in many[:10]:
        queue_actions.review_assign(trajectory=item, assignee=alice, actor=approver)
        services.review_claim(trajectory=item, actor=alice)
    assert queries() == small <= 14


def test_nul_characters_in_facets_suggestions_and_names_are_refused_not_errors(client, reviewer):
    client.force_login(reviewer)
    assert client.get(reverse("reviews:suggest", args=["batches"]), {"batch": "a\x00b"}).status_code == 200
    assert client.get(reverse("reviews:suggest", args=["models"]), {"models": "x, a\x00"}).status_code == 200
    body = client.get(reverse("reviews:work"), {"batch": "a\x00b", "model": "m\x00"}).content.decode()
    assert 'class="errors"' in body
    response = client.post(reverse("reviews:saved_view_save"), {"name": "a\x00b", "queue": ""}, follow=True)
    assert "may not contain NUL characters" in response.content.decode() and not SavedView.objects.exists()
