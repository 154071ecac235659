"""/api/v1/saved-views (issue 40): a person's saved views of the review queue through the console's
services (queue_actions.saved_view_save / _update / _delete), the filters checked by the console's
filter form; nobody reaches another person's view."""
from __future__ import annotations

from typing import Any, Callable

import pytest
from django.urls import reverse

from apps.reviews import queue_actions
from apps.reviews.models import SavedView
from apps.tasks.models import Batch
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db

URL = "/api/v1/saved-views"


@pytest.fixture
def nightly() -> Batch:
    return Batch.objects.create(name="swe-gym nightly")


def api(client_as: Callable[..., Any], make_token: Callable[..., Any], user: Any) -> Any:
    client = client_as("anonymous")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(user=user)[1]}")
    return client


def saves() -> int:
    return AuditEvent.objects.filter(action="reviews.saved_view_save").count()


def test_a_saved_view_is_created_audited_and_offered_by_the_console(client_as: Any, make_token: Any, client: Any,
                                                                    reviewer: Any, nightly: Batch) -> None:
    as_reviewer = api(client_as, make_token, reviewer)
    response = as_reviewer.post(URL, {"name": "  nightly   low ", "filters": {
        "batch": "swe-gym nightly", "score_max": 70, "assigned": "me", "verdict": ""}}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "nightly low"
    assert body["filters"] == {"batch": "swe-gym nightly", "score_max": "70", "assigned": "me"}
    view = SavedView.objects.get()
    assert (view.user_id, view.query) == (reviewer.pk, "batch=swe-gym+nightly&score_max=70&assigned=me")
    event = AuditEvent.objects.get(action="reviews.saved_view_save")
    assert event.actor_id == reviewer.pk and event.data["created"] is True and event.data["query"] == view.query
    assert as_reviewer.get(URL).json()["results"] == [body]
    assert as_reviewer.get(f"{URL}/{view.pk}").json() == body
    client.force_login(reviewer)
    page = client.get(reverse("reviews:work")).content.decode()
    assert f'?{view.query.replace("&", "&amp;")}">nightly low</a>' in page


def test_saving_a_name_again_replaces_its_filters_as_the_console_does(client_as: Any, reviewer: Any,
                                                                      make_token: Any) -> None:
    as_reviewer = api(client_as, make_token, reviewer)
    first = as_reviewer.post(URL, {"name": "mine", "filters": {"outcome": "failure"}}, format="json")
    assert first.status_code == 201
    again = as_reviewer.post(URL, {"name": "mine", "filters": {"outcome": "success"}}, format="json")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert SavedView.objects.get().query == "outcome=success" and saves() == 2
    same = as_reviewer.post(URL, {"name": "mine", "filters": {"outcome": "success"}}, format="json")
    assert same.status_code == 200 and saves() == 2  # identical: a no-op without an audit row


@pytest.mark.parametrize("filters,field", [
    ({"score_min": 500}, "score_min"),
    ({"batch": "no such batch"}, "batch"),
    ({"scene": "chess"}, "scene"),
    ({"assigned": "mallory"}, "assigned"),
    ({"iteration": "two"}, "iteration"),
    ({"colour": "red"}, "colour"),
    ({"outcome": ["failure"]}, "outcome"),
    ({"outcome": True}, "outcome"),
])
def test_a_bad_filter_is_a_400_naming_it_and_nothing_is_saved(client_as: Any, filters: dict[str, Any],
                                                              field: str) -> None:
    response = client_as("reviewer").post(URL, {"name": "broken", "filters": filters}, format="json")
    assert response.status_code == 400, response.json()
    assert list(response.json()["error"]["details"]["fields"]["filters"]) == [field]
    assert not SavedView.objects.exists() and saves() == 0


@pytest.mark.parametrize("body,field", [
    ({"name": "   ", "filters": {}}, "name"),
    ({"name": "a\x00b", "filters": {}}, "name"),
    ({"name": "x" * 101, "filters": {}}, "name"),
    ({"name": 5, "filters": {}}, "name"),
    ({"filters": {}}, "name"),
    ({"name": "no filters"}, "filters"),
    ({"name": "list", "filters": ["batch"]}, "filters"),
    ({"name": "extra", "filters": {}, "owner": "bob"}, "owner"),
])
def test_a_bad_body_is_a_400_naming_the_field(client_as: Any, body: dict[str, Any], field: str) -> None:
    response = client_as("reviewer").post(URL, body, format="json")
    assert response.status_code == 400 and field in response.json()["error"]["details"]["fields"], response.json()
    assert not SavedView.objects.exists() and saves() == 0


def test_the_service_limit_on_views_is_a_400(client_as: Any, make_token: Any, reviewer: Any, settings: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_actions, "SAVED_VIEWS_MAX", 1)
    queue_actions.saved_view_save(user=reviewer, name="only", query="")
    response = api(client_as, make_token, reviewer).post(URL, {"name": "second", "filters": {}}, format="json")
    assert response.status_code == 400 and "delete one first" in response.json()["error"]["message"]
    assert SavedView.objects.count() == 1


@pytest.mark.parametrize("method", ["post", "patch"])
def test_a_form_or_multipart_body_is_a_415_and_writes_nothing(client_as: Any, make_token: Any, reviewer: Any,
                                                              method: str) -> None:
    """A form field cannot carry the filters' object: read as a form, "filters" would be no filters
    and an empty view saved (what a schema-driven fuzzer's multipart body did). JSON only."""
    view = queue_actions.saved_view_save(user=reviewer, name="old", query="outcome=failure")
    as_reviewer = api(client_as, make_token, reviewer)
    url = URL if method == "post" else f"{URL}/{view.pk}"
    for body, content_type in (({"name": "-2512", "filters": "1.7e-13"}, None),  # multipart (the client's default)
                               ("name=new&filters=1", "application/x-www-form-urlencoded")):
        kwargs = {"content_type": content_type} if content_type else {}
        response = getattr(as_reviewer, method)(url, body, **kwargs)
        assert response.status_code == 415, response.content
        assert response.json()["error"]["code"] == "unsupported_media_type"
    view.refresh_from_db()
    assert (SavedView.objects.count(), view.name, view.query) == (1, "old", "outcome=failure") and saves() == 1


def test_a_view_is_renamed_and_refiltered_by_patch(client_as: Any, make_token: Any, reviewer: Any) -> None:
    view = queue_actions.saved_view_save(user=reviewer, name="old", query="outcome=failure")
    as_reviewer = api(client_as, make_token, reviewer)
    response = as_reviewer.patch(f"{URL}/{view.pk}", {"name": "new"}, format="json")
    assert response.status_code == 200 and response.json()["name"] == "new"
    assert response.json()["filters"] == {"outcome": "failure"}
    event = AuditEvent.objects.filter(action="reviews.saved_view_save").latest("id")
    assert event.data == {"name": "new", "query": "outcome=failure", "created": False, "renamed_from": "old"}
    response = as_reviewer.patch(f"{URL}/{view.pk}", {"filters": {"judge": "failed"}}, format="json")
    assert response.status_code == 200 and response.json()["filters"] == {"judge": "failed"}
    view.refresh_from_db()
    assert (view.name, view.query) == ("new", "judge=failed") and saves() == 3
    assert as_reviewer.patch(f"{URL}/{view.pk}", {"name": "new"}, format="json").status_code == 200
    assert saves() == 3  # no change, no audit row


def test_renaming_onto_another_of_ones_views_is_a_400_and_changes_nothing(client_as: Any, make_token: Any,
                                                                         reviewer: Any) -> None:
    view = queue_actions.saved_view_save(user=reviewer, name="a", query="outcome=failure")
    queue_actions.saved_view_save(user=reviewer, name="b", query="")
    response = api(client_as, make_token, reviewer).patch(
        f"{URL}/{view.pk}", {"name": "b", "filters": {"outcome": "success"}}, format="json")
    assert response.status_code == 400
    assert "another view named 'b'" in response.json()["error"]["details"]["fields"]["name"][0]
    view.refresh_from_db()
    assert (view.name, view.query) == ("a", "outcome=failure") and saves() == 2


def test_a_bad_filter_in_a_patch_is_a_400_and_changes_nothing(client_as: Any, make_token: Any,
                                                              reviewer: Any) -> None:
    view = queue_actions.saved_view_save(user=reviewer, name="a", query="outcome=failure")
    response = api(client_as, make_token, reviewer).patch(
        f"{URL}/{view.pk}", {"filters": {"score_max": -1}}, format="json")
    assert response.status_code == 400 and "score_max" in response.json()["error"]["details"]["fields"]["filters"]
    view.refresh_from_db()
    assert view.query == "outcome=failure" and saves() == 1


def test_a_view_is_deleted_with_its_audit_row(client_as: Any, make_token: Any, reviewer: Any) -> None:
    view = queue_actions.saved_view_save(user=reviewer, name="gone", query="outcome=failure")
    assert api(client_as, make_token, reviewer).delete(f"{URL}/{view.pk}").status_code == 204
    assert not SavedView.objects.exists()
    event = AuditEvent.objects.get(action="reviews.saved_view_delete")
    assert event.actor_id == reviewer.pk and event.data == {"name": "gone", "query": "outcome=failure"}


def test_nobody_reaches_another_persons_view(client_as: Any, make_token: Any, reviewer: Any,
                                             make_user: Any) -> None:
    theirs = queue_actions.saved_view_save(user=make_user("approver"), name="theirs", query="outcome=failure")
    as_reviewer = api(client_as, make_token, reviewer)
    assert as_reviewer.get(URL).json()["results"] == []
    assert as_reviewer.get(f"{URL}/{theirs.pk}").status_code == 404
    assert as_reviewer.patch(f"{URL}/{theirs.pk}", {"name": "mine now"}, format="json").status_code == 404
    assert as_reviewer.delete(f"{URL}/{theirs.pk}").status_code == 404
    theirs.refresh_from_db()
    assert (theirs.name, theirs.query) == ("theirs", "outcome=failure") and saves() == 1
    assert not AuditEvent.objects.filter(action="reviews.saved_view_delete").exists()
    # the same name is free for each person
    assert as_reviewer.post(URL, {"name": "theirs", "filters": {}}, format="json").status_code == 201


@pytest.mark.parametrize("who,status", [("anonymous", 401), (None, 403), ("viewer", 201)])
def test_saved_views_need_a_role(client_as: Any, make_token: Any, make_user: Any, who: str | None,
                                 status: int) -> None:
    caller = client_as(who) if who else api(client_as, make_token, make_user(None))
    response = caller.post(URL, {"name": "v", "filters": {}}, format="json")
    assert response.status_code == status
    assert SavedView.objects.count() == (1 if status == 201 else 0)
