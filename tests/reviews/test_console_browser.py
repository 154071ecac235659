"""The review console in Chromium against a real daphne (as `make serve` runs it): a reviewer
chooses a yellow option and sees the next iteration start; a reviewer cannot approve a red
proposal; an approver can. Fixtures (daphne, collected static files, the playwright page) are
the live-log browser test's."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.reviews.models import Proposal
from apps.tasks.models import Task
from tests.conftest import PASSWORD
from tests.reviews.factories import waiting_task
from tests.tasks.test_live_log_browser import (  # noqa: F401 (fixtures)
    WAIT_MS,
    daphne_server,
    page,
    sign_in_and_open,
    static_root,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_reviewer_chooses_yellow_cannot_approve_red_and_an_approver_can(daphne_server, page, make_task, make_user):
    yellow_world = waiting_task(make_task, external_id="yellow-task")
    yellow_world["red"].delete()
    red_world = waiting_task(make_task, external_id="red-task")
    red_world["yellow"].delete()
    yellow, red = yellow_world["yellow"], red_world["red"]
    reviewer, approver = make_user("reviewer"), make_user("approver")

    sign_in_and_open(page, daphne_server, reviewer, "/review/")
    card = page.locator(f"#proposal-{yellow.pk}")
    card.get_by_label("gpt-4o-mini").check()
    card.get_by_role("button", name="Choose option").click()
    expect(page.locator(".messages")).to_contain_text(f"Proposal #{yellow.pk} (model): choose recorded.")
    expect(page.locator(f"#proposal-{yellow.pk}")).to_have_count(0)

    page.goto(f"{daphne_server.url}/review/tasks/{yellow.task_id}/")
    expect(page.locator("#iteration-2")).to_be_visible()
    expect(page.locator("#task-status")).to_have_text("running")
    expect(page.locator("#iteration-1")).to_contain_text("gpt-4o-mini")

    # Red: no sign-off button for a reviewer, and a forged POST is refused.
    page.goto(f"{daphne_server.url}/review/")
    red_card = page.locator(f"#proposal-{red.pk}")
    expect(red_card).to_contain_text("Red changes are signed off by an approver.")
    expect(red_card.get_by_role("button", name="Approve")).to_have_count(0)
    status = page.evaluate("""async (url) => {
        const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1];
        const body = new URLSearchParams({decision: 'approve', csrfmiddlewaretoken: token});
        return (await fetch(url, {method: 'POST', body})).status;
    }""", f"/review/proposals/{red.pk}/decide")
    assert status == 403
    assert Proposal.objects.get(pk=red.pk).status == "pending"

    # An approver signs it off, and the red task's next iteration starts.
    context = page.context.browser.new_context()
    try:
        other = context.new_page()
        other.set_default_timeout(WAIT_MS)
        other.goto(f"{daphne_server.url}/admin/login/?next=/review/")
        other.fill("#id_username", approver.username)
        other.fill("#id_password", PASSWORD)
        other.click("input[type=submit]")
        card = other.locator(f"#proposal-{red.pk}")
        expect(card).to_contain_text("longer runs cost more")
        card.get_by_role("button", name="Approve").click()
        expect(other.locator(".messages")).to_contain_text(f"Proposal #{red.pk} (timeout_s): approve recorded.")
        other.goto(f"{daphne_server.url}/review/tasks/{red.task_id}/")
        expect(other.locator("#task-status")).to_have_text("running")
        expect(other.locator("#iteration-2")).to_be_visible()
    finally:
        context.close()
    task = Task.objects.get(pk=red.task_id)
    assert (task.timeout_s, task.current_iteration) == (1200.0, 2)
