"""The review item, the comparison and the correction form in Chromium (issue 40, items 1, 2, 3, 7)
against a real daphne, walked as a reviewer at 1440 and 390 px on trajectories the real loop
wrote (offline model): the page opens on the task then the trace (a delegate step's role run in
place), the judge beside it (below on a phone), the verdict bar fixed at the bottom with targets
of 44 px or more (48 on a phone) and the same keys; a mobile_agent tap drawn on the screen it
tapped; the aligned comparison decided with the keys; a tool call's arguments refused against its
schema, then saved. No page wider than the screen, no console error. Screenshots are kept under
var/test-artifacts/console/ (docs/console.md, "Screenshots of the review item")."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from playwright.sync_api import expect

from apps.reviews.models import Correction, Preference, Review
from apps.tasks.models import Batch
from tests.conftest import PASSWORD
from tests.console.test_compare import OTHER, SAME, two_rollouts
from tests.console.test_trace import MOBILE, stored
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_agent import llm_env  # noqa: F401 (a fixture)
from tests.engines.test_gui import artifact_root  # noqa: F401 (a fixture)
from tests.engines.test_multi_agent import PROMPT, scene_config, scripts
from tests.reviews.factories import auto_review
from tests.tasks.test_live_log_browser import DaphneServer, _server_env, page, static_root  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("llm_env", "sandbox_settings")]

ARTIFACTS = Path(settings.BASE_DIR) / "var" / "test-artifacts" / "console"
WIDTHS = (1440, 390)


@pytest.fixture
def daphne_server(transactional_db, static_root, tmp_path, artifact_root):  # noqa: F811 (serves this test's artifacts)
    """daphne as the other browser tests start it, reading the artifacts this test's episodes stored."""
    env = {**_server_env(static_root), "ARTIFACTS_STORAGE_OPTIONS": json.dumps({"location": str(artifact_root)})}
    server = DaphneServer(env, tmp_path / "daphne.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def errors(page) -> list[str]:
    """Console errors and uncaught exceptions of every page the test opens."""
    seen: list[str] = []
    def console(message: Any) -> None:
        if message.type == "error":
            seen.append(f"{message.text} ({message.location.get('url') or ''})")

    page.on("console", console)
    page.on("pageerror", lambda exc: seen.append(str(exc)))
    return seen


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def sign_in(page, server, user) -> None:
    page.goto(f"{server.url}/admin/login/?next=/review/work/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/review/work/")


def fits(page, width: int) -> None:
    wide = page.evaluate("document.documentElement.scrollWidth")
    assert wide <= width, f"{page.url} is {wide} px wide at {width} px"


def box(page, selector: str) -> dict[str, float]:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, selector
    return found


# The episodes run on the loop (asyncio.run) before Playwright's sync API starts its own loop in
# this thread: each test's data is a fixture named ahead of `page`.


@pytest.fixture
def delegated(make_task):
    return stored(make_task, scripts(), scene="multi_agent", prompt=PROMPT, scene_config=scene_config())


@pytest.fixture
def tapped(make_task, artifact_root, monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")
    row = MOBILE["mobile-calc-37x36"]
    return stored(make_task, [{"id": "s", "prompt": row["prompt"], "reference_solution": row["reference_solution"]}],
                  scene="mobile_agent", prompt=row["prompt"], scene_config=row["config"], max_steps=row["max_steps"])


@pytest.fixture
def compared(make_task):
    batch = Batch.objects.create(name="compare in chromium")
    a, b = two_rollouts(make_task, batch, SAME, OTHER)
    later, _ = two_rollouts(make_task, batch, SAME, SAME)
    return a, b, later


@pytest.fixture
def correctable(make_task):
    return two_rollouts(make_task, Batch.objects.create(name="correct in chromium"), SAME, SAME)[0]


def test_a_reviewer_reads_the_trace_and_decides_from_the_fixed_bar(delegated, daphne_server, page, errors, make_user):
    lead = delegated
    coder, _tester = lead.subtrajectories()
    auto_review(lead, 70.0)
    reviewer = make_user("reviewer")
    sign_in(page, daphne_server, reviewer)
    url = f"{daphne_server.url}/review/trajectories/{lead.pk}/"
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 844 if width < 500 else 900})
        page.goto(url)
        # the task, then the trace, at the top of the page; the role's run inside the lead's step 1
        assert box(page, "#task")["y"] < box(page, "#steps")["y"] < 900
        expect(page.locator(f"#run-{coder.pk}")).to_contain_text("write_file")
        expect(page.locator(f"#run-{coder.pk} .shared-reward")).to_have_text("1.0")
        side, trace = box(page, "#side-panel"), box(page, "#steps")
        if width == 1440:
            assert side["x"] > trace["x"] + trace["width"] - 1 and side["y"] < trace["y"] + 50  # beside the trace
        else:
            assert side["y"] > trace["y"] + trace["height"] - 1  # below it on a phone
        # the verdict bar stays at the bottom of the screen, with large targets
        bar = box(page, "#verdict-form")
        viewport = page.viewport_size
        assert abs(bar["y"] + bar["height"] - viewport["height"]) <= 1 and bar["width"] >= width - 1
        for label in page.locator("#verdict-form .choice").all():
            assert label.bounding_box()["height"] >= (48 if width < 500 else 44)
        page.mouse.wheel(0, 2000)
        bar = box(page, "#verdict-form")
        assert abs(bar["y"] + bar["height"] - viewport["height"]) <= 1
        fits(page, width)
        shot(page, f"trace-review-{width}")
    # on the phone: tap reject, type the reason, record
    page.locator("#verdict-form .choice-reject").click()
    page.locator("#verdict-form textarea[name=reason]").fill("the tester never ran the checks it was given")
    page.locator("#verdict-form button.primary").click()
    expect(page.locator(".messages")).to_contain_text(f"Verdict recorded: reject on trajectory #{lead.pk}")
    # on the desktop the same bar takes the keys: f puts the cursor in the reason, Ctrl+Enter sends
    page.set_viewport_size({"width": 1440, "height": 900})
    page.keyboard.press("f")
    expect(page.locator("#verdict-form textarea[name=reason]")).to_be_focused()
    page.keyboard.type("step 2 needs a real check")
    page.keyboard.press("Control+Enter")
    expect(page.locator(".messages")).to_contain_text("Verdict recorded: needs fix")
    assert list(Review.objects.filter(kind="human", reviewer=reviewer).order_by("id").values_list("verdict", flat=True)) \
        == ["reject", "needs_fix"]
    # the role's own page: its trace and the episode's shared reward
    page.goto(f"{daphne_server.url}/trajectories/{coder.pk}/")
    expect(page.locator("#shared-reward")).to_have_text("1.0")
    shot(page, "trace-role-run-1440")
    assert errors == []


LOADED = """img => img.complete ? img.naturalWidth > 0 : new Promise(done => {
    img.addEventListener("load", () => done(img.naturalWidth > 0), {once: true});
    img.addEventListener("error", () => done(false), {once: true});
})"""


def loaded(img) -> bool:
    """True once a (lazily loaded) image has arrived with pixels; False if it failed to load."""
    img.scroll_into_view_if_needed()
    return img.evaluate(LOADED)


def test_a_tap_is_drawn_on_the_screen_it_tapped_at_both_widths(tapped, daphne_server, page, errors, make_user):
    trajectory = tapped
    tap = next(i for i, s in enumerate(trajectory.steps) if i and (s.get("action") or {}).get("type") == "click")
    sign_in(page, daphne_server, make_user("reviewer"))
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{daphne_server.url}/review/trajectories/{trajectory.pk}/")
        step = page.locator(f"#step-{tap + 1}")
        step.locator("summary").click()
        before = step.locator("figure[data-shot=before]")
        expect(before.locator("img")).to_have_attribute(
            "src", f"/artifacts/{trajectory.steps[tap - 1]['images'][-1]['artifact']}")
        # the images loaded, and the point sits inside the before image
        assert loaded(before.locator("img"))
        image, point = before.locator("img").bounding_box(), before.locator(".action-point").bounding_box()
        assert image["x"] <= point["x"] + 7 <= image["x"] + image["width"]
        assert image["y"] <= point["y"] + 7 <= image["y"] + image["height"]
        assert loaded(step.locator("figure[data-shot=after] img"))
        assert step.locator("figure[data-shot=after] .action-point").count() == 0
        fits(page, width)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        step.locator(".part.screenshots").screenshot(path=str(ARTIFACTS / f"screenshots-before-after-{width}.png"))
    assert errors == []


def test_an_aligned_comparison_is_decided_with_the_keys(compared, daphne_server, page, errors, make_user):
    a, b, later = compared
    sign_in(page, daphne_server, make_user("reviewer"))
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{daphne_server.url}/review/tasks/{a.task_id}/compare/?a={a.pk}&b={b.pk}")
        expect(page.locator("#first-divergence")).to_contain_text("first divergence")
        expect(page.locator("#aligned tbody tr[data-row]")).to_have_count(4)
        fits(page, width)
        shot(page, f"compare-aligned-{width}")
    page.keyboard.press("/")
    expect(page.locator("#prefer-note")).to_be_focused()
    page.keyboard.type("B looked before it ran")
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.wait_for_url(f"**/review/tasks/{later.task_id}/compare/")
    expect(page.locator(".messages")).to_contain_text(f"#{b.pk} preferred over #{a.pk}")
    pick = Preference.objects.get()
    assert (pick.chosen_id, pick.rejected_id, pick.note) == (b.pk, a.pk, "B looked before it ran")
    page.keyboard.press("t")  # a tie on the next task: nothing stored, and no next task left
    expect(page.locator(".messages")).to_contain_text("a tie, no preference stored")
    assert Preference.objects.count() == 1
    assert errors == []


def test_a_tool_calls_arguments_are_refused_against_the_schema_then_saved(correctable, daphne_server, page, errors,
                                                                          make_user):
    original = correctable
    sign_in(page, daphne_server, make_user("reviewer"))
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{daphne_server.url}/review/trajectories/{original.pk}/correct")
    field = page.locator("#arguments_1")
    assert json.loads(field.input_value()) == {"command": "python3 hello.py"}
    field.fill('{"command": 7}')
    page.get_by_role("button", name="Save the correction as a new trajectory").click()
    expect(page.locator("#correct-errors")).to_contain_text("step 2: invalid arguments for run_shell.command")
    expect(page.locator("#arguments_1")).to_have_value('{"command": 7}')  # what was typed stays, to fix
    fits(page, 390)
    shot(page, "correct-refused-390")
    assert not Correction.objects.exists()
    page.locator("#arguments_1").fill('{"command": "python3 -B hello.py"}')
    page.get_by_role("button", name="Save the correction as a new trajectory").click()
    expect(page.locator(".messages")).to_contain_text("Correction saved as trajectory")
    assert Correction.objects.get().corrected.steps[1]["arguments"] == {"command": "python3 -B hello.py"}
    # the console error of the refused POST (a 400) is the only one
    assert all("400" in e for e in errors), errors
