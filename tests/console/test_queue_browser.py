"""The review queue's facets, saved views, bulk actions and assignment, and the team page, in
Chromium against a real daphne (issue 40, item 4), at 1440 and 390 px: an approver filters by a batch
name the box suggests, saves the view and assigns the batch's items to a reviewer in one go (and
the version builder completes batch names in its comma-separated list); the
reviewer opens "assigned to me", is told a bulk reject needs a reason, rejects two and accepts the
rest; the team page counts them. No page wider than the screen, no console error; screenshots under
var/test-artifacts/console/ (docs/console.md, "Screenshots of the queue and the team page")."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.reviews.models import Review, ReviewAssignment, SavedView
from apps.reviews.tallies import refresh_team_tally
from apps.tasks.models import Batch
from tests.console.test_review_item_browser import errors, fits, shot, sign_in  # noqa: F401 (a fixture)
from tests.tasks.test_live_log_browser import daphne_server, page, static_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

WIDTHS = (1440, 390)


def test_an_approver_assigns_a_batch_and_the_reviewer_decides_it_in_bulk(daphne_server, page, errors, awaiting,
                                                                          make_user):
    items = awaiting(4, batch=Batch.objects.create(name="swe-gym nightly 2026-12-01"))
    other = awaiting(1, batch=Batch.objects.create(name="gui smoke"))
    approver, alice = make_user("approver", username="ana"), make_user("reviewer", username="alice")
    make_user("reviewer", username="bob")
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, daphne_server, approver)
    expect(page.locator("#work-queue tbody tr")).to_have_count(5)
    # the batch box suggests names as one types; the filter takes the name
    page.locator("#id_batch").fill("nightly")
    expect(page.locator("#batches-names option")).to_have_count(1)
    assert page.locator("#batches-names option").get_attribute("value") == "swe-gym nightly 2026-12-01"
    page.locator("#id_batch").fill("swe-gym nightly 2026-12-01")
    page.locator("#facets button[type=submit]").click()
    expect(page.locator("#work-queue tbody tr")).to_have_count(4)
    expect(page.locator(f"#item-{other[0].pk}")).to_have_count(0)
    # save the view, then select the page and assign it to alice
    page.locator("#view-name").fill("nightly")
    page.locator("#save-view button").click()
    expect(page.locator(".messages")).to_contain_text("Saved the view 'nightly'")
    expect(page.locator("#saved-views .saved-view.current a")).to_have_text("nightly")
    page.locator("#select-all").check()
    expect(page.locator("#bulk-count")).to_have_text("Selected: 4")
    page.locator("#bulk-action").select_option("assign")
    page.locator("#bulk-assignee").select_option("alice")
    page.locator("#bulk-apply").click()
    expect(page.locator(".messages")).to_contain_text("Assigned 4 item(s) to alice")
    assert ReviewAssignment.objects.filter(assignee=alice, status="active").count() == 4
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        expect(page.locator(f"#item-{items[0].pk} .assignees")).to_have_text("alice")
        fits(page, width)
        shot(page, f"queue-assigned-{width}")
    # the saved view reopens the filters from a fresh queue
    page.goto(f"{daphne_server.url}/review/work/")
    page.locator("#saved-views a", has_text="nightly").click()
    expect(page.locator("#work-queue tbody tr")).to_have_count(4)
    assert SavedView.objects.get(user=approver).query == "batch=swe-gym+nightly+2026-12-01"
    # the version builder completes the last of its comma-separated batch names the same way
    page.goto(f"{daphne_server.url}/datasets/new/")
    page.locator("#id_dataset").fill("nightly")
    page.locator("#id_batches").fill("gui smoke, night")
    expect(page.locator("#batches-names option")).to_have_count(1)
    assert page.locator("#batches-names option").get_attribute("value") == "gui smoke, swe-gym nightly 2026-12-01"
    page.locator("#id_batches").fill("gui smoke, swe-gym nightly 2026-12-01")
    expect(page.locator("#live-count")).to_contain_text("5 trajectories of 5 tasks")
    fits(page, 1440)

    page.context.clear_cookies()
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, daphne_server, alice)
    expect(page.locator("#assigned-to-me")).to_contain_text("Assigned to me: 4")
    page.locator("#assigned-to-me").click()
    expect(page.locator("#work-queue tbody tr")).to_have_count(4)
    for item in items[:2]:
        page.locator(f"#item-{item.pk} input[name=item]").check()
    page.locator("#bulk-action").select_option("reject")
    page.locator("#bulk-apply").click()
    expect(page.locator(".messages")).to_contain_text("Nothing done: give a reason")
    for item in items[:2]:
        page.locator(f"#item-{item.pk} input[name=item]").check()
    page.locator("#bulk-action").select_option("reject")
    page.locator("#bulk-reason").fill("the tests were never run")
    page.locator("#bulk-apply").click()
    expect(page.locator(".messages")).to_contain_text(f"Rejected 2 item(s): #{items[0].pk}, #{items[1].pk}")
    fits(page, 390)
    shot(page, "queue-bulk-390")
    expect(page.locator("#work-queue tbody tr")).to_have_count(2)
    page.locator("#select-all").check()
    page.locator("#bulk-action").select_option("accept")
    page.locator("#bulk-apply").click()
    expect(page.locator(".messages")).to_contain_text("Accepted 2 item(s)")
    verdicts = dict(Review.objects.filter(kind="human", reviewer=alice).values_list("trajectory_id", "verdict"))
    assert verdicts == {items[0].pk: "reject", items[1].pk: "reject", items[2].pk: "accept", items[3].pk: "accept"}
    assert set(ReviewAssignment.objects.filter(assignee=alice).values_list("status", flat=True)) == {"done"}

    refresh_team_tally()  # the workers' count the team page's verdict columns read
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{daphne_server.url}/review/team/")
        alice_row = page.locator('#team tr[data-reviewer="alice"]')
        expect(alice_row.locator('[data-col="today"]')).to_have_text("4")
        expect(alice_row.locator('[data-col="acceptance"]')).to_have_text("50%")
        expect(alice_row.locator('[data-col="done"]')).to_have_text("4")
        expect(page.locator('#team tr[data-reviewer="bob"] [data-col="total"]')).to_have_text("0")
        fits(page, width)
        shot(page, f"team-{width}")
    assert errors == []
