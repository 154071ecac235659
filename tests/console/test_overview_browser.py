"""The operator overview and the console's small items in Chromium (issue 40, items 8 and 9) against
a real daphne, at 1440 and 390 px: the overview's states, charts and batches in progress; the
icon at /favicon.ico; a user made by `manage.py create_user` signing in; the admin's grant message
naming the users. No page wider than the screen, no console error (the icon's request included).
Screenshots under var/test-artifacts/console/ (docs/console.md, "Screenshots of the overview")."""
from __future__ import annotations

import io
import sys
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from apps.tasks.models import Batch, Task
from apps.tasks.services import tasks_enqueue
from tests.conftest import PASSWORD
from tests.console.test_review_item_browser import WIDTHS, errors, fits, shot  # noqa: F401 (a fixture)
from tests.reviews.factories import auto_review, finished_trajectory
from tests.tasks.test_live_log_browser import daphne_server, page, static_root  # noqa: F401 (fixtures)
from trajplatform import overview

pytestmark = pytest.mark.django_db(transaction=True)


def sign_in(page, server, username: str, landing: str) -> None:
    page.goto(f"{server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{server.url}{landing}")


@pytest.fixture
def fortnight(make_task, make_user):
    """A not-started batch, two batches in progress, and ten days of finished work with judge costs."""
    imported = Batch.objects.create(name="imported, waiting for Start")
    for _ in range(4):
        make_task(batch=imported)
    for name, n in (("code tasks, in progress", 3), ("web tasks, in progress", 2)):
        batch = Batch.objects.create(name=name)
        for _ in range(n):
            make_task(batch=batch)
        tasks_enqueue(batch=batch, actor=make_user("reviewer"))
    task = make_task()
    Task.objects.filter(pk=task.pk).update(status=Task.Status.COMPLETED, current_iteration=1)
    now = timezone.now()
    sample = 0
    for days_ago in range(10):
        for i in range(2 + days_ago % 4):
            outcome = "success" if (i + days_ago) % 3 else "failure"
            t = finished_trajectory(task, sample=sample, outcome=outcome, cost_usd=Decimal("0.04") * (1 + i),
                                    finished_at=now - timedelta(days=days_ago, minutes=1))
            auto_review(t, 85.0 if outcome == "success" else 40.0, cost_usd=Decimal("0.002"))
            sample += 1
    overview.refresh_activity(now=now)


def test_the_overview_at_both_widths(fortnight, daphne_server, page, errors, make_user):
    make_user("admin", username="ops")
    sign_in(page, daphne_server, "ops", "/")
    icon = page.request.get(f"{daphne_server.url}/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"] == "image/x-icon"
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{daphne_server.url}/")
        expect(page.locator('#task-states [data-state="not_started"] .n')).to_have_text("4")
        expect(page.locator('#task-states [data-state="running"] .n')).to_have_text("5")
        expect(page.locator("#batches-in-progress tbody tr")).to_have_count(2)
        expect(page.locator("#not-started-batches")).to_have_text("1 batch not started")
        for chart in ("#chart-throughput", "#chart-acceptance", "#chart-cost", "#chart-backlog"):
            drawn = page.locator(f"{chart} svg").bounding_box()
            assert drawn is not None and drawn["width"] > 200 and drawn["x"] + drawn["width"] <= width, chart
            assert page.locator(f"{chart} svg rect").count() >= (1 if chart == "#chart-backlog" else 10)
        fits(page, width)
        shot(page, f"overview-{width}")
    page.locator("#activity-table").locator("xpath=..").locator("summary").click()
    expect(page.locator("#activity-table tbody tr")).to_have_count(overview.WINDOW_DAYS)
    assert errors == []


def test_a_created_user_signs_in_on_a_phone_and_lands_on_the_queue(daphne_server, page, errors, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\n"))
    call_command("create_user", "rita", "--role", "reviewer", "--password-stdin", stdout=io.StringIO())
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, daphne_server, "rita", "/review/work/")
    expect(page.locator("header .who")).to_contain_text("rita")
    fits(page, 390)
    shot(page, "create-user-signed-in-390")
    assert errors == []


def test_the_grant_message_names_the_users(daphne_server, page, errors, make_user):
    make_user("admin", username="ops", is_superuser=True)
    alice, bob = make_user(None, username="alice"), make_user(None, username="bob")
    sign_in(page, daphne_server, "ops", "/")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{daphne_server.url}/admin/auth/user/")
        for user in (alice, bob):
            page.locator(f'input[name="_selected_action"][value="{user.pk}"]').check()
        page.select_option('select[name="action"]', "grant_role_reviewer" if width > 500 else "grant_role_approver")
        page.locator('button[name="index"]').click()
        role = "reviewer" if width > 500 else "approver"
        expect(page.locator(".messagelist")).to_contain_text(f"Granted role {role} to alice and bob")
        fits(page, width)
        shot(page, f"grant-role-{width}")
    assert set(User.objects.get(username="alice").groups.values_list("name", flat=True)) == {"approver"}
    assert errors == []
