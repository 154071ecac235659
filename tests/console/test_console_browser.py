"""The console in Chromium against a real daphne (issue 28): a reviewer works through the queue
with the keyboard; two reviewers claim the same item; a task file with a bad line is refused with
its line number and nothing written; the main pages at 1440 and 390 px (screenshots kept under
var/test-artifacts/console/, and no page wider than the 390 px screen)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from apps.datasets.models import DatasetVersion, VersionBuild
from apps.reviews.models import Review, ReviewClaim
from apps.tasks.models import Batch, Task
from tests.conftest import PASSWORD
from tests.datasets.version_data import measure_exportability
from tests.tasks.test_live_log_browser import (  # noqa: F401 (fixtures)
    WAIT_MS,
    daphne_server,
    page,
    static_root,
)

pytestmark = pytest.mark.django_db(transaction=True)

ARTIFACTS = Path(settings.BASE_DIR) / "var" / "test-artifacts" / "console"


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def sign_in(page, server, user, landing: str) -> None:
    """Log in through the admin's form with no `next`: the role-aware home decides where to land."""
    page.goto(f"{server.url}/admin/login/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{server.url}{landing}")


def test_a_reviewer_works_through_the_queue_with_the_keyboard(daphne_server, page, awaiting, make_user):
    items = awaiting(3)
    reviewer = make_user("reviewer")
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, daphne_server, reviewer, "/review/work/")
    expect(page.locator("#work-queue tbody tr")).to_have_count(3)
    shot(page, "work-queue-1440")
    page.get_by_role("button", name="Start reviewing").click()
    page.wait_for_url(f"**/review/trajectories/{items[0].pk}/?queue=")
    expect(page.locator("#queuebar")).to_contain_text("yours until")
    # j j: the second step is current; x flags it; a accepts with no reason and opens the next item
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(page.locator("details.step.current")).to_have_attribute("id", "step-2")
    page.keyboard.press("x")
    expect(page.locator("details.step.flagged")).to_have_count(1)
    shot(page, "review-item-1440")
    page.keyboard.press("a")
    page.wait_for_url(f"**/review/trajectories/{items[1].pk}/?queue=")
    expect(page.locator(".messages")).to_contain_text(f"Verdict recorded: accept on trajectory #{items[0].pk}")
    # r selects reject and puts the cursor in the reason; Ctrl+Enter submits
    page.keyboard.press("r")
    expect(page.locator("textarea[name=reason]")).to_be_focused()
    page.keyboard.type("the answer misses 97")
    page.keyboard.press("Control+Enter")
    page.wait_for_url(f"**/review/trajectories/{items[2].pk}/?queue=")
    # n skips the last one: released, and the queue has nothing else for this reviewer
    page.keyboard.press("n")
    expect(page.locator(".messages")).to_contain_text("Nothing left to review")
    verdicts = dict(Review.objects.filter(kind="human", reviewer=reviewer).values_list("trajectory_id", "verdict"))
    assert verdicts == {items[0].pk: "accept", items[1].pk: "reject"}
    assert Review.objects.get(trajectory=items[0], kind="human").step_flags == [{"step": 1, "note": ""}]
    assert ReviewClaim.objects.get(trajectory=items[2]).status == "released"


def test_two_reviewers_claim_the_same_item(daphne_server, page, awaiting, make_user):
    (item,) = awaiting(1)
    first, second = make_user("reviewer"), make_user("reviewer")
    sign_in(page, daphne_server, first, "/review/work/")
    other = page.context.browser.new_context().new_page()
    sign_in(other, daphne_server, second, "/review/work/")
    # Both see the item free; the first claims it, then the second's click is refused.
    page.get_by_role("button", name=f"Claim trajectory {item.pk}").click()
    page.wait_for_url(f"**/review/trajectories/{item.pk}/?queue=")
    other.get_by_role("button", name=f"Claim trajectory {item.pk}").click()
    expect(other.locator(".messages")).to_contain_text(f"Not claimed: trajectory {item.pk} is claimed by {first.username}")
    expect(other.locator(f"#item-{item.pk}")).to_contain_text("taken")
    assert list(ReviewClaim.objects.values_list("reviewer_id", "status")) == [(first.pk, "active")]
    other.context.close()


def test_a_task_file_with_a_bad_line_is_refused_with_its_line_number(daphne_server, page, make_user, tmp_path):
    good = '{"scene": "code_exec", "prompt": "Print hello.", "external_id": "a"}'
    path = tmp_path / "tasks.jsonl"
    path.write_text(f'{good}\n{{"scene": "code_exec", "external_id": "b"}}\n')
    sign_in(page, daphne_server, make_user("reviewer"), "/review/work/")
    page.goto(f"{daphne_server.url}/tasks/new/")
    page.set_input_files("#id_file", str(path))
    page.get_by_role("button", name="Import").click()
    expect(page.locator("#import-errors")).to_contain_text("tasks.jsonl:2: prompt: required field is missing")
    expect(page.locator("#import-errors")).to_contain_text("nothing was imported")
    shot(page, "task-file-refused-1440")
    assert not Batch.objects.exists() and not Task.objects.exists()
    # The fixed file goes in and starts; the batch page follows its progress.
    path.write_text(f"{good}\n")
    page.set_input_files("#id_file", str(path))
    page.get_by_role("button", name="Import").click()
    expect(page.locator("h1")).to_contain_text("Batch tasks")
    expect(page.locator("#batch-progress")).to_contain_text("0 of 1 tasks final")
    assert Task.objects.get().status == "running"


PAGES = [
    ("home", "/"), ("admin", "/admin/"), ("work", "/review/work/"), ("proposals", "/review/"),
    ("trajectories", "/trajectories/"), ("batches", "/review/batches/"), ("start", "/tasks/new/"),
    ("datasets", "/datasets/"), ("builder", "/datasets/new/"), ("not-found", "/trajectories/999999/"),
]


def run_build_slowly(build_id: int, monkeypatch) -> None:
    """Run the version build job here, each progress report held long enough for the page's
    socket (which tails the database: the in-memory layer does not cross processes) to see it."""
    from apps.datasets import jobs, services

    real = services.version_build_progress

    def held(**kwargs):
        kept = real(**kwargs)
        time.sleep(1.2)
        return kept

    monkeypatch.setattr(jobs, "BUILD_PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(services, "version_build_progress", held)
    jobs.run_version_build(build_id)
    measure_exportability(VersionBuild.objects.get(pk=build_id).version)  # the next job a worker runs


def record_timing(name: str, seconds: float) -> None:
    """Measured figures beside the screenshots (a test asserts behaviour, not time)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "timings.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = round(seconds * 1000, 1)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


def test_the_main_pages_fit_a_390_px_screen(daphne_server, page, awaiting, make_user, monkeypatch):
    items = awaiting(2)
    admin = make_user("admin", is_superuser=True)
    sign_in(page, daphne_server, admin, "/")
    pages = PAGES + [("trajectory", f"/trajectories/{items[0].pk}/"), ("review", f"/review/trajectories/{items[0].pk}/"),
                     ("batch", f"/review/batches/{items[0].task.batch_id}/"),
                     ("compare", f"/review/tasks/{items[0].task_id}/compare/"),
                     ("correct", f"/review/trajectories/{items[0].pk}/correct")]
    for width in (1440, 390):
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in pages:
            page.goto(f"{daphne_server.url}{path}")
            shot(page, f"{name}-{width}")
            overflow = page.evaluate("document.documentElement.scrollWidth")
            assert overflow <= width, f"{path} is {overflow} px wide at {width} px"
    # The navigation wraps instead of overflowing: the last link is on screen.
    expect(page.locator("header .sitenav a", has_text="API docs")).to_be_in_viewport()

    # The version builder counts as the filter is typed (htmx), then creates; the version is published.
    page.set_viewport_size({"width": 1440, "height": 900})
    previews: list[str] = []
    page.on("request", lambda request: previews.append(request.url) if "/datasets/new/preview" in request.url else None)
    page.goto(f"{daphne_server.url}/datasets/new/")
    page.fill("#id_dataset", "console-set")
    page.fill("#id_min_score", "50")
    expect(page.locator("#live-count")).to_contain_text("2 trajectories of 2 tasks pass")
    page.fill("#id_min_score", "70")
    expect(page.locator("#live-count")).to_contain_text("0 trajectories of 0 tasks pass")
    page.fill("#id_min_score", "50")
    expect(page.locator("#live-count")).to_contain_text("2 trajectories")
    shot(page, "builder-preview-1440")
    # The live preview's GET carries the filter, never the CSRF token (it would land in server logs).
    assert previews and all("min_score=" in url and "csrfmiddlewaretoken" not in url for url in previews), previews
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(str(payload))))
    started = time.perf_counter()
    page.get_by_role("button", name="Create the version (draft)").click()
    page.wait_for_url("**/datasets/builds/*/")
    returned_s = time.perf_counter() - started
    # The request only queued the build: the page is up before any worker has run it.
    expect(page.locator("#build-status")).to_have_text("queued")
    build = VersionBuild.objects.get()
    assert build.status == "queued" and not DatasetVersion.objects.exists()
    shot(page, "version-build-queued-1440")
    run_build_slowly(build.pk, monkeypatch)  # this process plays the worker
    page.wait_for_url("**/datasets/console-set/v1/")
    states = [json.loads(f).get("status") for f in frames if '"type": "build"' in f]
    assert states[0] == "queued" and "running" in states and states[-1] == "done", states
    record_timing("version-create-request", returned_s)
    page.get_by_role("button", name="Publish").click()
    expect(page.locator("body")).to_contain_text("Published")
    assert DatasetVersion.objects.get(dataset__name="console-set").status == "published"
