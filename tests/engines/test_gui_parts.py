"""The gui scene's parts that need no browser: the sandbox's address-space switch, every check
kind on a passing and a failing case, the artifact store (written, deduplicated, deleted with
its trajectory), the bundled sites' state and validation, origin rules."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from apps.engines.scenes.gui import checks, sites
from apps.engines.scenes.gui.server import PageServer, allowed, miniwob_config
from apps.engines.sandboxes import SandboxSpec, SandboxSpecUnsupported, cgroups
from apps.engines.sandboxes.base import SandboxError
from apps.engines.sandboxes.local import LocalBackend
from tests.test_images import png_bytes

# --- the sandbox ------------------------------------------------------------------------------


@pytest.mark.usefixtures("sandbox_settings")
@pytest.mark.django_db(transaction=True)
def test_a_sandbox_without_an_address_space_limit_runs_unlimited_under_its_memory_cgroup() -> None:
    assert "memory" in cgroups.support().enforced, "CI's machines give sandboxes a memory cgroup"
    backend = LocalBackend()
    lifted = backend.create(SandboxSpec(address_space_mb=None, memory_mb=256))
    default = backend.create(SandboxSpec(memory_mb=256))
    sized = backend.create(SandboxSpec(address_space_mb=4096, memory_mb=256))
    try:
        assert lifted.run("ulimit -v", timeout=10).stdout.strip() == "unlimited"
        assert lifted.spec.limits()["address_space_mb"] is None
        assert backend.get(lifted.id).spec.address_space_mb is None  # kept in the sandbox's meta
        assert default.run("ulimit -v", timeout=10).stdout.strip() == str(256 * 8 * 1024)
        assert sized.run("ulimit -v", timeout=10).stdout.strip() == str(4096 * 1024)
    finally:
        for sandbox in (lifted, default, sized):
            sandbox.destroy()


@pytest.mark.usefixtures("sandbox_settings")
@pytest.mark.django_db(transaction=True)
def test_without_a_memory_cgroup_an_unlimited_address_space_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = cgroups.support()
    without_memory = cgroups.CgroupSupport(
        parents={c: p for c, p in real.parents.items() if c != "memory"},
        versions={c: v for c, v in real.versions.items() if c != "memory"},
        problems={"memory": "no memory controller (test)"})
    monkeypatch.setattr(cgroups, "support", lambda: without_memory)
    backend = LocalBackend()
    with pytest.raises(SandboxSpecUnsupported, match="memory cgroup"):
        backend.create(SandboxSpec(address_space_mb=None))
    assert backend.list() == []
    ok = backend.create(SandboxSpec())  # other sandboxes still run, with the rlimit fallback
    ok.destroy()


def test_address_space_must_be_a_size_zero_or_none() -> None:
    for bad in (-1, 1.5, True, "8G"):
        with pytest.raises(SandboxError, match="address_space_mb"):
            SandboxSpec(address_space_mb=bad)


# --- checks -----------------------------------------------------------------------------------


def probe(*, answer: str = "", url: str = "http://127.0.0.1:8100/", page: dict[str, Any] | None = None,
          state: dict[str, Any] | None = None) -> checks.Probe:
    page = page or {}

    def evaluate(expression: str, open_url: str | None) -> Any:
        if expression not in page:
            raise checks.CheckError(f"no such expression in the fake page: {expression}")
        return page[expression]

    return checks.Probe(final_answer=answer, url=url, evaluate=evaluate, site_state=lambda: state or {})


MINIWOB_GLOBALS = ("({raw: WOB_RAW_REWARD_GLOBAL, reward: WOB_REWARD_GLOBAL, reason: WOB_REWARD_REASON,"
                   " done: WOB_DONE_GLOBAL})")


def test_the_miniwob_check_passes_on_a_raw_reward_of_one_and_keeps_the_reason() -> None:
    won = {MINIWOB_GLOBALS: {"raw": 1, "reward": 0.93, "reason": None, "done": True}}
    lost = {MINIWOB_GLOBALS: {"raw": -1, "reward": -1, "reason": "wrong button", "done": True}}
    assert checks.run_check({"type": "miniwob"}, probe(page=won))[0] == 1.0
    reward, details = checks.run_check({"type": "miniwob"}, probe(page=lost))
    assert reward == 0.0 and details["reason"] == "wrong button" and details["raw_reward"] == -1


def test_miniwob_partial_credit_is_no_success_and_a_number_only_when_the_task_asks() -> None:
    """click-checkboxes with one box of three wrong: raw (2 - 1) / 3. BrowserGym's raw > 0 scored
    it 1; MiniWoB's binary rule is success only at 1.0."""
    partial = {MINIWOB_GLOBALS: {"raw": 1 / 3, "reward": 0.33, "reason": None, "done": True}}
    reward, details = checks.run_check({"type": "miniwob"}, probe(page=partial))
    assert reward == 0.0 and details["passed"] is False and details["raw_reward"] == pytest.approx(1 / 3)
    assert checks.completion_conditions(details)["completed"] == {
        "ok": False, "detail": f"MiniWoB's raw reward is {1 / 3} (success is 1.0)"}
    rl, details = checks.run_check({"type": "miniwob", "partial_credit": True}, probe(page=partial))
    assert rl == pytest.approx(1 / 3) and details["passed"] is False
    assert checks.completion_conditions(details)["completed"]["relaxed"] is True
    wrong = {MINIWOB_GLOBALS: {"raw": -1, "reward": -1, "reason": None, "done": True}}
    assert checks.run_check({"type": "miniwob", "partial_credit": True}, probe(page=wrong))[0] == 0.0
    both = checks.run_check([{"type": "miniwob", "partial_credit": True}, {"type": "answer", "expected": "x"}],
                            probe(page=partial, answer="x"))
    assert both[0] == pytest.approx(1 / 3)
    with pytest.raises(checks.CheckError, match="partial_credit"):
        checks.run_check({"type": "miniwob", "partial_credit": "yes"}, probe(page=partial))


def test_the_page_facts_decide_the_task_page_and_the_injection_conditions() -> None:
    own = {"url": "http://127.0.0.1:8100/miniwob/click-button.html", "task_page": True, "started_page": True,
           "blocked_scripts": []}
    assert checks.process_conditions("miniwob", own) == {"task_page": {"ok": True, "detail": ""},
                                                          "no_injected_reward": {"ok": True, "detail": ""}}
    for other in ({**own, "task_page": False}, {**own, "started_page": False}, {}):  # another page, reloaded, no facts
        assert checks.process_conditions("miniwob", other)["task_page"]["ok"] is False
    injected = checks.process_conditions("miniwob", {**own, "blocked_scripts": ["Executing inline event handler …"]})
    assert injected["no_injected_reward"] == {
        "ok": False, "detail": "the page refused 1 script(s) put into it: Executing inline event handler …"}
    assert set(checks.process_conditions("site", {"blocked_scripts": []})) == {"no_injected_reward"}
    assert checks.process_conditions("url", {"blocked_scripts": ["an external site's own refusal"]}) == {}


def test_the_js_check_passes_on_a_truthy_predicate() -> None:
    check = {"type": "js", "predicate": "document.title === 'Done'"}
    assert checks.run_check(check, probe(page={check["predicate"]: True}))[0] == 1.0
    assert checks.run_check(check, probe(page={check["predicate"]: False}))[0] == 0.0


def test_the_url_check_follows_webarenas_gold_in_pred_and_exact_rules() -> None:
    check = {"type": "url", "reference_url": "http://127.0.0.1:8100/order/A1001 |OR| http://127.0.0.1:8100/order/A1002"}
    assert checks.run_check(check, probe(url="http://127.0.0.1:8100/order/A1001/"))[0] == 1.0
    assert checks.run_check(check, probe(url="http://127.0.0.1:8100/checkout"))[0] == 0.0
    query = {"type": "url", "reference_url": "http://h/search?q=lamp"}
    assert checks.run_check(query, probe(url="http://h/search?q=lamp&page=2"))[0] == 1.0
    assert checks.run_check(query, probe(url="http://h/search?q=mug"))[0] == 0.0
    exact = {**check, "url_note": "EXACT"}
    assert checks.run_check(exact, probe(url="http://127.0.0.1:8100/order/A1001"))[0] == 1.0
    assert checks.run_check(exact, probe(url="http://127.0.0.1:8100/order/A1001/extra"))[0] == 0.0


def test_the_program_html_check_reads_each_target_with_its_locator() -> None:
    check = {"type": "program_html", "program_html": [
        {"url": "last", "locator": "", "required_contents": {"must_include": ["Thank you", "A1001 |OR| A1002"]}},
        {"url": "last", "locator": "document.querySelector('h1').textContent", "required_contents": {"exact_match": "thank you!"}},
    ]}
    good = {"document.body.outerText": "Thank you! Order A1002 total", "document.querySelector('h1').textContent": "Thank you!"}
    bad = {**good, "document.body.outerText": "Checkout"}
    assert checks.run_check(check, probe(page=good))[0] == 1.0
    reward, details = checks.run_check(check, probe(page=bad))
    assert reward == 0.0 and [t["passed"] for t in details["targets"]] == [False, True]
    with pytest.raises(checks.CheckError, match="func:"):
        checks.run_check({"type": "program_html", "program_html": [
            {"url": "last", "locator": "func:shopping_get_latest_order_url()", "required_contents": {"exact_match": "x"}}]},
            probe(page=good))


def test_the_answer_check_matches_exact_contains_and_must_include() -> None:
    assert checks.run_check({"type": "answer", "expected": "Lunch on Friday?"}, probe(answer='"lunch on friday?"'))[0] == 1.0
    assert checks.run_check({"type": "answer", "expected": "Lunch"}, probe(answer="Dinner"))[0] == 0.0
    assert checks.run_check({"type": "answer", "expected": "4411", "match": "contains"}, probe(answer="Invoice 4411"))[0] == 1.0
    must = {"type": "answer", "expected": ["tuesday", "10:00 |OR| 10am"], "match": "must_include"}
    assert checks.run_check(must, probe(answer="Tuesday at 10am"))[0] == 1.0
    assert checks.run_check(must, probe(answer="Tuesday"))[0] == 0.0


def test_the_site_state_check_asserts_on_the_state_file() -> None:
    state = {"orders": [{"id": "A1001", "total": 18.5, "items": [{"sku": "mug", "qty": 1}]}], "cart": []}
    check = {"type": "site_state", "assertions": [
        {"path": "orders", "op": "len", "value": 1}, {"path": "orders.-1.items.0.sku", "op": "eq", "value": "mug"},
        {"path": "orders.0.total", "op": "gte", "value": 10}, {"path": "cart", "op": "len", "value": 0},
        {"path": "orders.0.coupon", "op": "absent"}]}
    assert checks.run_check(check, probe(state=state))[0] == 1.0
    reward, details = checks.run_check(check, probe(state={**state, "orders": []}))
    assert reward == 0.0 and not details["assertions"][0]["passed"]


def test_a_list_of_checks_must_all_pass_and_a_bad_check_is_a_check_error() -> None:
    both = [{"type": "answer", "expected": "x"}, {"type": "js", "predicate": "p"}]
    assert checks.run_check(both, probe(answer="x", page={"p": True}))[0] == 1.0
    assert checks.run_check(both, probe(answer="x", page={"p": False}))[0] == 0.0
    for bad in ({"type": "screenshot_diff"}, {"type": "js"}, {"type": "site_state", "assertions": [{"path": "a", "op": "~"}]}):
        with pytest.raises(checks.CheckError):
            checks.run_check(bad, probe(state={"a": 1}))


# --- origins ----------------------------------------------------------------------------------


def test_only_allowed_origins_and_file_prefixes_may_be_loaded() -> None:
    origins = ["http://127.0.0.1:8100", "file:///opt/x/html/"]
    assert allowed("http://127.0.0.1:8100/cart", origins)
    assert allowed("file:///opt/x/html/core/core.js", origins)
    assert allowed("about:blank", origins)
    for url in ("http://127.0.0.1:8101/", "https://127.0.0.1:8100/", "http://example.com/", "file:///opt/x/htmlx/a",
                "file:///opt/x/html/../../etc/passwd", "javascript:alert(1)", "data:text/html,hi", "chrome://crash"):
        assert not allowed(url, origins), url


def test_paths_are_checked_decoded_and_normalised() -> None:
    """`%2e%2e` is a dot segment to the browser: before the fix the raw string passed the prefix check."""
    origins = miniwob_config("/opt/x/html", "click-button", 1, 8100)["allowed_origins"]
    assert allowed("http://127.0.0.1:8100/miniwob/click-button.html", origins)
    assert allowed("http://127.0.0.1:8100/core/jquery-ui/jquery-ui.min.css", origins)
    assert allowed("http://127.0.0.1:8100/miniwob/../core/core.js", origins)  # what the browser loads
    for url in ("http://127.0.0.1:8100/miniwob/click-test.html",  # another task's page
                "http://127.0.0.1:8100/core/%2e%2e/miniwob/click-test.html", "http://127.0.0.1:8100/core/%2E%2E/miniwob/x",
                "http://127.0.0.1:8100/core/..%2fminiwob/click-test.html", "http://127.0.0.1:8100/core/%252e%252e/x",
                "http://127.0.0.1:8100/core\\..\\miniwob/click-test.html", "http://127.0.0.1:8100/core/%00.js",
                "http://127.0.0.1:8100/core/%ff.js", "http://127.0.0.1:8100/miniwob/"):
        assert not allowed(url, origins), url
    files = ["file:///opt/x/html/"]
    for url in ("file:///opt/x/html/%2e%2e/%2e%2e/etc/passwd", "file:///opt/x/html/core/%2e%2e%2f%2e%2e/y",
                "file://evil/opt/x/html/a.js"):
        assert not allowed(url, files), url


def test_the_miniwob_page_server_serves_only_the_tasks_page_and_the_shared_files(tmp_path: Path) -> None:
    import hashlib

    root = tmp_path / "html"
    (root / "miniwob").mkdir(parents=True)
    (root / "core").mkdir()
    script = "\nvar genProblem = function() {};\n"
    (root / "miniwob" / "t.html").write_text(f"<html><head><script src='../core/core.js'></script>"
                                              f"<script>{script}</script></head><body></body></html>")
    (root / "miniwob" / "other.html").write_text("<html>another task</html>")
    (root / "core" / "core.js").write_text("var core = {};")
    (root / "core" / "page.html").write_text("<html>not a shared file</html>")
    (tmp_path / "secret.txt").write_text("outside")
    (root / "core" / "link.js").symlink_to(tmp_path / "secret.txt")
    pages = PageServer(str(root), "/miniwob/t.html", 8100)
    status, headers, body = pages.respond("/miniwob/t.html")
    csp = dict(headers)["Content-Security-Policy"]
    digest = __import__("base64").b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert status.startswith("200") and b"genProblem" in body
    assert f"script-src http://127.0.0.1:8100/core/core.js 'sha256-{digest}';" in csp
    assert "'unsafe-inline'" not in csp.split("style-src")[0] and "base-uri 'none'" in csp
    assert pages.respond("/core/core.js")[0].startswith("200")
    assert "Content-Security-Policy" not in dict(pages.respond("/core/core.js")[1])
    for path in ("/miniwob/other.html", "/core/%2e%2e/miniwob/other.html", "/core/..%2fminiwob/other.html",
                 "/core/page.html", "/core/link.js", "/core/%2e%2e/%2e%2e/secret.txt", "/core/%252e%252e/x", "/"):
        assert pages.respond(path)[0].startswith("404"), path


def test_the_bundled_sites_send_a_policy_that_runs_no_script(tmp_path: Path) -> None:
    app = sites.wsgi_app(sites.Site("mail", str(tmp_path / "state.json")))
    headers: list[Any] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "QUERY_STRING": "", "wsgi.input": io.BytesIO(b"")}
    b"".join(app(environ, lambda status, h: headers.extend(h)))
    assert "script-src 'none'" in dict(headers)["Content-Security-Policy"]


# --- sites ------------------------------------------------------------------------------------


def call(app: Any, method: str, path: str, form: dict[str, str] | None = None) -> tuple[str, str]:
    body = "&".join(f"{k}={v}" for k, v in (form or {}).items()).encode()
    status: list[str] = []
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "", "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": io.BytesIO(body)}
    out = b"".join(app(environ, lambda s, headers: status.append(s)))
    return status[0], out.decode()


def test_the_shop_validates_checkout_and_writes_its_state_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    app = sites.wsgi_app(sites.Site("shop", str(path)))
    assert call(app, "POST", "/cart/add", {"sku": "mug"})[0].startswith("303")
    status, page = call(app, "POST", "/checkout", {"name": "", "address": "x", "shipping": "standard"})
    assert "Name is required" in page and json.loads(path.read_text())["orders"] == []
    call(app, "POST", "/checkout", {"name": "Ana", "address": "1 Main St", "shipping": "express"})
    state = json.loads(path.read_text())
    assert state["orders"][0]["total"] == 20.5 and state["cart"] == []


def test_the_admin_form_refuses_invalid_users() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        site = sites.Site("admin", f"{directory}/s.json")
        app = sites.wsgi_app(site)
        _, page = call(app, "POST", "/users/new", {"username": "Bo", "email": "bo@", "role": "x", "age": "12"})
        assert page.count("class='error'") == 4
        call(app, "POST", "/users/new", {"username": "bo_1", "email": "bo@example.org", "role": "editor", "age": "30"})
        assert site.state["users"][-1] == {"username": "bo_1", "email": "bo@example.org", "role": "editor", "age": 30}


# --- the artifact store -----------------------------------------------------------------------


@pytest.fixture
def artifact_storage(settings: Any, tmp_path: Path) -> Path:
    from django.core.files.storage import storages

    root = tmp_path / "artifacts"
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(root)}}}
    storages._storages.pop("artifacts", None)
    storages._backends = None  # settings changed: let Django read STORAGES again
    return root


def _trajectory() -> Any:
    from apps.tasks.models import Task, Trajectory

    task = Task.objects.create(scene="gui", prompt="p")
    return Trajectory.objects.create(task=task, iteration=1, sample_index=0)


@pytest.mark.django_db(transaction=True)
def test_artifacts_are_content_addressed_deduplicated_and_deleted_with_their_last_trajectory(artifact_storage: Path) -> None:
    from trajplatform import artifacts

    png = png_bytes(5, 3)  # the store measures every image it keeps
    first = artifacts.store(png, "image/png", width=500, height=360)
    again = artifacts.store(png, "image/png", width=500, height=360)
    assert first == again and first["artifact"] == __import__("hashlib").sha256(png).hexdigest()
    assert artifacts.Artifact.objects.count() == 1
    files = list(artifact_storage.rglob("*.png"))
    assert [f.name for f in files] == [f"{first['artifact']}.png"] and files[0].read_bytes() == png
    assert artifacts.read(first["artifact"]) == png
    assert artifacts.data_url(first["artifact"]).startswith("data:image/png;base64,")

    one, two = _trajectory(), _trajectory()
    steps = [{"screenshot": first}, {"screenshot": first}]
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"artifact:{first['artifact']}"}}]}]
    assert artifacts.link_trajectories({one.pk: [steps], two.pk: [messages]}) == 2
    one.delete()
    assert files[0].exists(), "still used by the other trajectory"
    two.delete()
    assert not files[0].exists() and artifacts.Artifact.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_artifacts_no_stored_episode_took_are_swept_after_a_day_and_the_sweep_is_scheduled(
        artifact_storage: Path) -> None:
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone
    from django_q.models import Schedule

    from trajplatform import artifacts

    old = artifacts.store(png_bytes(1, 1), "image/png")  # an episode that was never stored
    fresh = artifacts.store(png_bytes(1, 2), "image/png")  # an episode still running
    used = artifacts.store(png_bytes(1, 3), "image/png")  # a stored episode's screenshot
    artifacts.link_trajectories({_trajectory().pk: [[{"images": [used]}]]})
    artifacts.Artifact.objects.filter(sha256__in=[old["artifact"], used["artifact"]]).update(
        created_at=timezone.now() - timedelta(days=2))
    assert artifacts.sweep() == 1
    assert set(artifacts.Artifact.objects.values_list("sha256", flat=True)) == {fresh["artifact"], used["artifact"]}
    assert not list(artifact_storage.rglob(f"{old['artifact']}.png"))
    call_command("migrate", verbosity=0)  # post_migrate registers the schedules
    assert Schedule.objects.filter(name=artifacts.SWEEP_SCHEDULE, func=artifacts.SWEEP_JOB, minutes=60).exists()
