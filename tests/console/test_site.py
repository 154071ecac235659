"""One site (issue 28, item 1): shared navigation between admin and console, a role-aware home,
error pages that say why."""
from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_home_sends_each_role_to_its_work(client, make_user):
    assert client.get("/").url.startswith(reverse("admin:login"))
    expected = {"viewer": "/trajectories/", "reviewer": "/review/work/", "approver": "/review/?tier=red"}
    for role, target in expected.items():
        client.force_login(make_user(role))
        response = client.get("/")
        assert (response.status_code, response.url) == (302, target), role


def test_an_admin_lands_on_the_operator_overview(client, make_user, make_task):
    make_task()
    client.force_login(make_user("admin"))
    response = client.get("/")
    html = response.content.decode()
    assert response.status_code == 200 and "Operator overview" in html
    assert 'id="overview"' in html and "awaiting a human verdict" in html


def test_the_admin_login_lands_on_the_home_page(client, make_user):
    from tests.conftest import PASSWORD

    reviewer = make_user("reviewer")
    form = client.get(reverse("admin:login"))
    assert 'name="next" value="/"' in form.content.decode()
    response = client.post(reverse("admin:login"), {"username": reviewer.username, "password": PASSWORD, "next": "/"})
    assert response.url == "/"
    assert client.get("/").url == "/review/work/"


def test_admin_and_console_pages_carry_the_same_navigation(client, make_user):
    client.force_login(make_user("admin"))
    admin_html = client.get(reverse("admin:index")).content.decode()
    console_html = client.get(reverse("reviews:batches")).content.decode()
    for link in ("/review/work/", "/review/", "/trajectories/", "/datasets/", "/api/docs/", "/admin/"):
        assert f'href="{link}"' in admin_html, link
        assert f'href="{link}"' in console_html, link
    assert 'class="sitenav"' in admin_html and "console/site.css" in admin_html


def test_a_refused_page_is_styled_and_says_why(client, make_user, make_task):
    from tests.reviews.factories import waiting_task

    red = waiting_task(make_task)["red"]
    client.force_login(make_user("reviewer"))
    response = client.post(reverse("reviews:decide", args=[red.pk]), {"decision": "approve"})
    html = response.content.decode()
    assert response.status_code == 403
    assert "you may not decide red proposals" in html and 'id="error-reason"' in html
    assert "the role <strong>reviewer</strong>" in html and 'class="sitenav"' in html


def test_a_missing_page_is_styled_and_says_why(client, make_user):
    client.force_login(make_user("viewer"))
    response = client.get(reverse("tasks:trajectory_detail", args=[999999]))
    assert response.status_code == 404
    html = response.content.decode()
    assert 'id="error-reason"' in html and "No Trajectory matches the given query." in html


def test_api_errors_stay_json(client, make_user):
    client.force_login(make_user("viewer"))
    response = client.get("/api/v1/nothing-here")
    assert response.status_code == 404 and response["Content-Type"].startswith("application/json")


def test_the_server_error_page_needs_no_database_or_context(rf):
    from trajplatform.views import handler500

    response = handler500(rf.get("/review/"))
    assert response.status_code == 500 and "500 — server error" in response.content.decode()


def test_admin_change_pages_link_to_the_console_and_the_api(client, make_user, make_task):
    from tests.reviews.factories import finished_trajectory

    trajectory = finished_trajectory(make_task())
    client.force_login(make_user("admin", is_superuser=True))
    html = client.get(reverse("admin:tasks_trajectory_change", args=[trajectory.pk])).content.decode()
    for url in (reverse("tasks:trajectory_detail", args=[trajectory.pk]),
                reverse("reviews:trajectory", args=[trajectory.pk]), f"/api/v1/trajectories/{trajectory.pk}"):
        assert f'href="{url}"' in html, url
    html = client.get(reverse("admin:tasks_task_change", args=[trajectory.task_id])).content.decode()
    assert f'href="{reverse("reviews:compare", args=[trajectory.task_id])}"' in html
    html = client.get(reverse("admin:tasks_batch_change", args=[trajectory.task.batch_id])).content.decode()
    assert f'href="{reverse("reviews:batch", args=[trajectory.task.batch_id])}"' in html


def test_favicon_is_served_to_anyone(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200 and response["Content-Type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
    assert "max-age" in response["Cache-Control"]


def test_the_comparison_page_highlights_the_review_queue_not_the_trajectories(client, make_user, make_task):
    from apps.tasks.models import Batch
    from tests.console.test_compare import OTHER, SAME, two_rollouts

    a, b = two_rollouts(make_task, Batch.objects.create(name="nav"), SAME, OTHER)
    client.force_login(make_user("reviewer"))
    html = client.get(reverse("reviews:compare", args=[a.task_id])).content.decode()
    nav = html[html.index('<nav class="sitenav"'):html.index("</nav>")]
    assert nav.count('aria-current="page"') == 1
    assert f'href="{reverse("reviews:work")}" aria-current="page">Review queue' in nav
