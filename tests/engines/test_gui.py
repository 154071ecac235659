"""The gui scene with a real browser: Debian's chromium driven by our Playwright MCP server in a
local sandbox, through the MCP hub, the shared agent loop and the offline scripted model.

Chromium is slow to start on a 2-core machine: the tests of the runtime's tools and checks share
one site episode (a module fixture); the loop tests run one episode each.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from django.test import override_settings

from apps.engines.scenes.gui.runtime import GuiRuntime, browser_config
from apps.engines.scenes.gui.server import PageServer, miniwob_config
from apps.engines.mcp import McpSessionError
from apps.engines.registry import register_runtime
from apps.engines.runtime import InfrastructureError, SetupError, ToolError
from apps.engines.sandboxes.local import LocalBackend
from tests.engines.test_agent import call, config_for, llm_env, run, scripted  # noqa: F401 - llm_env is a fixture
from tests.engines.test_envscaler_runtime import _bwraps_using

CLICK_PROMPT = 'Click on the "Ok" button.'  # MiniWoB click-button, seed 1
CLICK = {"source": "miniwob", "task": "click-button", "seed": 1, "utterance": CLICK_PROMPT, "check": {"type": "miniwob"}}
SHOP = {"source": "site", "site": "shop", "check": {"type": "site_state", "assertions": [
    {"path": "orders", "op": "len", "value": 1}, {"path": "orders.0.items.0.sku", "op": "eq", "value": "mug"}]}}


@pytest.fixture(scope="module")
def artifact_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gui-artifacts-") as root:
        storages = {"default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
                    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
                    "artifacts": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                                  "OPTIONS": {"location": root}}}
        from django.core.files.storage import storages as handler

        with override_settings(STORAGES=storages):
            handler._backends = None
            handler._storages.pop("artifacts", None)
            yield Path(root)
        handler._backends = None
        handler._storages.pop("artifacts", None)


@pytest.fixture(scope="module")
def shop(django_db_setup: Any, django_db_blocker: Any, sandbox_root_dir: Path, artifact_root: Path) -> Iterator[dict[str, Any]]:
    """One shop episode's sandbox with the browser started (no loop): the runtime's tools and checks."""
    root = Path(tempfile.mkdtemp(prefix="gui-", dir=sandbox_root_dir))
    root.chmod(0o711)
    backend = LocalBackend(records=False, root=root)
    runtime = GuiRuntime()
    config = config_for("Buy a blue mug with standard shipping.", SHOP, scene="gui")
    sandbox = backend.create(runtime.sandbox_spec(config))
    try:
        with django_db_blocker.unblock():
            runtime.setup(sandbox, config)
        yield {"runtime": runtime, "sandbox": sandbox, "config": config}
    finally:
        sandbox.destroy()


def act(shop: dict[str, Any], name: str, **args: Any) -> Any:
    return shop["runtime"].execute_tool(name, args, shop["sandbox"], shop["config"], timeout=20)


def ref_of(snapshot: str, text: str) -> str:
    """The ref of the first snapshot line holding `text`."""
    for line in snapshot.splitlines():
        if text in line and "[ref=" in line:
            return line.split("[ref=")[1].split("]")[0]
    raise AssertionError(f"{text!r} not in the snapshot:\n{snapshot}")


@pytest.mark.django_db(transaction=True)
def test_the_agent_cannot_call_a_platform_only_tool(shop: dict[str, Any]) -> None:
    names = {t["function"]["name"] for t in shop["runtime"].tools(shop["config"])}
    assert {"browser_click", "browser_type", "browser_snapshot", "finish"} <= names
    assert not {n for n in names if n.startswith("platform_")} and "browser_take_screenshot" not in names
    for tool in ("platform_evaluate", "platform_start", "platform_observe"):
        with pytest.raises(ToolError, match="not available to the agent"):
            act(shop, tool, expression="core.endEpisode(1)")


@pytest.mark.django_db(transaction=True)
def test_navigation_outside_the_allowed_origins_is_refused(shop: dict[str, Any]) -> None:
    for url in ("http://127.0.0.1:8101/", "file:///workspace/.gui/site-state.json", "https://example.com/",
                "file:///workspace/.gui/%2e%2e/%2e%2e/etc/passwd", "http://example.com\\@127.0.0.1:8100/"):
        result = act(shop, "browser_navigate", url=url)
        assert result.extra["is_error"] and "refused" in result.output, result.output
        assert result.extra["url"].startswith("http://127.0.0.1:8100/")
    after = act(shop, "browser_snapshot")  # the browser stayed where it was: the episode goes on
    assert not after.extra["is_error"] and "Products" in after.output


@pytest.mark.django_db(transaction=True)
def test_a_shop_purchase_passes_its_state_check_and_every_step_keeps_a_screenshot(shop: dict[str, Any]) -> None:
    from trajplatform import artifacts

    runtime, sandbox, config = shop["runtime"], shop["sandbox"], shop["config"]
    before = runtime.verify(sandbox, config, "")
    assert before[0] == 0.0 and before[1]["check"]["assertions"][0]["actual"] == []
    page = act(shop, "browser_navigate", url="http://127.0.0.1:8100/")
    added = act(shop, "browser_click", element="Add Blue mug", ref=ref_of(page.output, "Add Blue mug to cart"))
    assert "Cart (1)" in added.output and added.extra["action"]["box"]["width"] > 0
    checkout = act(shop, "browser_click", element="Checkout", ref=ref_of(added.output, "Checkout"))
    form = checkout.output
    filled = act(shop, "browser_fill_form", fields=[
        {"name": "Name", "type": "textbox", "ref": ref_of(form, 'textbox "Name"'), "value": "Ana"},
        {"name": "Address", "type": "textbox", "ref": ref_of(form, 'textbox "Address"'), "value": "1 Main St"},
        {"name": "Shipping", "type": "combobox", "ref": ref_of(form, 'combobox "Shipping"'), "value": "standard"}])
    done = act(shop, "browser_click", element="Place order", ref=ref_of(filled.output, "Place order"))
    assert "Thank you" in done.output and "/order/A1001" in done.extra["url"]
    for result in (page, added, checkout, filled, done):
        [shot] = result.images
        assert artifacts.read(shot["artifact"])[:8] == b"\x89PNG\r\n\x1a\n" and shot["width"] == 500
    reward, output = runtime.verify(sandbox, config, "ordered")
    assert reward == 1.0 and output["passed"] == output["total"] == 1
    # The same final page checked the other ways, on the real page.
    probe_config = {**config, "scene_config": {**config["scene_config"], "check": [
        {"type": "url", "reference_url": "http://127.0.0.1:8100/order/A1001"},
        {"type": "js", "predicate": "document.querySelector('h1').textContent === 'Thank you!'"},
        {"type": "program_html", "program_html": [
            {"url": "last", "locator": "", "required_contents": {"must_include": ["A1001", "standard"]}},
            {"url": "http://127.0.0.1:8100/cart", "locator": "document.querySelector('h1').textContent",
             "required_contents": {"exact_match": "Cart"}}]}]}}
    assert runtime.verify(sandbox, probe_config, "")[0] == 1.0
    failing = {**config, "scene_config": {**config["scene_config"], "check": [
        {"type": "js", "predicate": "document.title === 'Checkout'"}]}}
    assert runtime.verify(sandbox, failing, "")[0] == 0.0
    broken = {**config, "scene_config": {**config["scene_config"], "check": {"type": "js", "predicate": "nosuchvar.x"}}}
    with pytest.raises(SetupError, match="check cannot run"):
        runtime.verify(sandbox, broken, "")


def test_an_unknown_source_or_a_path_in_a_miniwob_task_is_a_setup_error() -> None:
    with pytest.raises(SetupError, match="source"):
        browser_config({"scene_config": {"source": "ftp"}})
    with pytest.raises(SetupError, match="task"):
        browser_config({"scene_config": {"source": "miniwob", "task": "../../etc/passwd"}})
    with pytest.raises(SetupError, match="allowed_origins"):
        browser_config({"scene_config": {"source": "url", "start_url": "https://example.com"}})


# --- episodes of the shared loop -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_a_miniwob_episode_with_vision_earns_the_pages_reward_and_shows_the_model_screenshots(
        artifact_root: Path, make_task: Any, viewer: Any, make_user: Any, client: Any) -> None:
    from trajplatform import artifacts

    config = config_for(CLICK_PROMPT, {**CLICK, "vision": True}, scene="gui", max_steps=4, timeout_s=90)
    with scripted(CLICK_PROMPT, call("browser_click", element="Ok button", ref="e7"), call("finish", answer="clicked")) as (
            server, llm):
        result = run(config, llm)
        requests = [r["body"] for r in server.model.requests]
    assert result.outcome == "success" and result.reward == 1.0, (result.outcome_reason, result.steps)
    assert result.verifier_output["check"]["raw_reward"] == 1.0
    assert result.verifier_output["decided_by"] == "check" and result.verifier_output["process"] == {
        "task_page": {"ok": True, "detail": ""}, "no_injected_reward": {"ok": True, "detail": ""},
        "completed": {"ok": True, "detail": ""}}
    first = result.messages[1]["content"]
    assert first.startswith(CLICK_PROMPT) and 'button "Ok" [ref=e7]' in first  # the initial observation
    start_image, step_image = [m for m in result.messages if m["role"] == "user" and isinstance(m["content"], list)]
    [click] = [s for s in result.steps if s["tool"] == "browser_click"]
    [ref] = click["images"]
    assert step_image["content"][1] == {"type": "image_url", "image_url": {"url": f"artifact:{ref['artifact']}"}}
    assert start_image["content"][1]["image_url"]["url"].startswith("artifact:")
    assert "base64" not in json.dumps(result.messages) + json.dumps(result.steps)
    # What the model was sent: the same parts, inlined as data: URLs.
    sent = [m for m in requests[1]["messages"] if m["role"] == "user" and isinstance(m["content"], list)]
    assert sent[-1]["content"][1]["image_url"]["url"] == artifacts.data_url(ref["artifact"])
    assert click["action"]["box"] and click["url"] == "http://127.0.0.1:8100/miniwob/click-button.html"
    tools = {t["function"]["name"] for t in result.tools}
    assert "browser_take_screenshot" in tools and not any(t.startswith("platform_") for t in tools)
    _console_shows_the_screenshot(result, ref["artifact"], make_task, viewer, make_user, client)


def _console_shows_the_screenshot(result: Any, sha: str, make_task: Any, viewer: Any, make_user: Any,
                                  client: Any) -> None:
    """Stored as the worker stores it, the step's screenshot is on the trajectory page with the
    clicked element's box drawn on it; the image is served to viewers only."""
    from apps.tasks.models import Trajectory
    from trajplatform import artifacts

    task = make_task(prompt=CLICK_PROMPT, scene="gui", scene_config=CLICK)
    row = Trajectory.objects.create(task=task, iteration=1, status="finished", messages=result.messages,
                                    steps=result.steps, tools=result.tools, outcome=result.outcome, reward=result.reward)
    artifacts.link_trajectories({row.pk: [row.steps, row.messages]})
    client.force_login(make_user(None))
    assert client.get(f"/artifacts/{sha}").status_code == 403
    client.force_login(viewer)
    page = client.get(f"/trajectories/{row.pk}/").content.decode()
    assert f'src="/artifacts/{sha}"' in page and 'class="action-box"' in page
    image = client.get(f"/artifacts/{sha}")
    assert image.status_code == 200 and image["Content-Type"] == "image/png"
    assert b"".join(image.streaming_content) == artifacts.read(sha)
    assert client.get(f"/artifacts/{'0' * 64}").status_code == 404


BUNDLED = {json.loads(line)["external_id"]: json.loads(line)
           for line in (Path(__file__).resolve().parents[2] / "examples" / "tasks" / "gui.jsonl").read_text().splitlines()}


def bundled(external_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    line = BUNDLED[external_id]
    config = config_for(line["prompt"], line["config"], scene="gui", max_steps=line["max_steps"], timeout_s=120)
    return config, line["reference_solution"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_the_bundled_wrong_solution_scores_zero_and_the_model_gets_text_only_without_vision(artifact_root: Path) -> None:
    config, solution = bundled("gui-miniwob-click-button-s3-wrong")
    with scripted(config["prompt"], *solution) as (_, llm):
        result = run(config, llm)
    assert result.outcome == "failure" and result.reward == 0.0
    assert result.verifier_output["check"]["raw_reward"] == -1.0
    assert not [m for m in result.messages if isinstance(m["content"], list)]
    assert [s["images"][0]["artifact"] for s in result.steps if s["tool"] == "browser_click"]  # still kept


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
@pytest.mark.parametrize("external_id", ["gui-miniwob-social-media-s1", "gui-site-mail-tidy"])
def test_bundled_scripts_replay_in_the_sandbox(external_id: str, artifact_root: Path) -> None:
    """The refs and points the build script recorded on the host are the sandbox's too."""
    config, solution = bundled(external_id)
    with scripted(config["prompt"], *solution) as (_, llm):
        result = run(config, llm)
    assert result.outcome == "success" and result.reward == 1.0, (result.outcome_reason, result.verifier_output)
    points = [s["action"].get("point") for s in result.steps if s["tool"] == "browser_mouse_click_xy"]
    assert all(points) and (points or external_id.startswith("gui-site"))


def test_the_social_media_script_replays_when_the_pages_images_are_slow(monkeypatch: pytest.MonkeyPatch,
                                                                      free_tcp_port: int) -> None:
    """The episode starts from the fully loaded page: on a loaded machine the page server answers
    social-media's icons (CSS images, the :hover ones too) late; before, the first snapshot then
    lacked their refs (the script's "Mute @leo" ref named nothing) and the hover swapping in an
    icon not yet loaded moved the click's target away (no menu). The browser on the host, no sandbox."""
    import time
    from pathlib import Path as _Path

    import miniwob

    from apps.engines.scenes.gui.server import Browser

    respond = PageServer.respond
    monkeypatch.setattr(PageServer, "respond", lambda self, raw: (
        time.sleep(0.3) if raw.endswith(".png") else None, respond(self, raw))[1])
    line = BUNDLED["gui-miniwob-social-media-s1"]
    [[more], [mute]] = [[c["arguments"] for c in step["tool_calls"]] for step in line["reference_solution"][:2]]
    config = miniwob_config(str(_Path(miniwob.__file__).parent / "html"), "social-media", 1, free_tcp_port)

    async def replay() -> tuple[str, Any]:
        browser = Browser(config)
        try:
            await browser.start()
            await browser.act("browser_mouse_click_xy", more)
            menu = await browser.act("browser_snapshot", {})
            await browser.act("browser_click", mute)
            return menu, await browser.page.evaluate("[WOB_RAW_REWARD_GLOBAL, WOB_DONE_GLOBAL]")
        finally:
            await browser.close()

    menu, reward = asyncio.run(replay())
    assert f'listitem [ref={mute["ref"]}]: Mute @leo' in menu, menu
    assert reward == [1, True]


class _CrashingGui(GuiRuntime):
    """The gui runtime whose browser dies before the agent's click (chromium killed)."""

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> Any:
        if name == "browser_click":
            killed = 0
            for bwrap in _bwraps_using(str(sandbox.workspace)):
                for pid in _descendants(bwrap):
                    try:
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    except OSError:
                        continue  # a short-lived helper (a shell, a renderer) that has just exited
                    if os.path.basename(cmdline[0]) == b"chromium" and not any(a.startswith(b"--type=") for a in cmdline):
                        os.kill(pid, signal.SIGKILL)  # the episode's own browser, started by this test
                        killed += 1
            assert killed == 1
        return super().execute_tool(name, args, sandbox, config, timeout=timeout)


def _descendants(pid: int) -> list[int]:
    out, stack = [], [pid]
    while stack:
        parent = stack.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(children)
            stack.extend(children)
    return out


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_a_browser_crash_mid_episode_is_an_infrastructure_error(artifact_root: Path) -> None:
    register_runtime("gui", _CrashingGui)
    try:
        config = config_for(CLICK_PROMPT, CLICK, scene="gui", max_steps=4, timeout_s=90)
        with scripted(CLICK_PROMPT, call("browser_click", element="Ok", ref="e7"), call("finish", answer="x")) as (_, llm):
            result = run(config, llm)
    finally:
        register_runtime("gui", "apps.engines.scenes.gui.runtime:GuiRuntime")
    assert result.outcome == "error" and result.error_kind == "infrastructure" and result.retryable, result.outcome_reason
    assert "browser" in result.outcome_reason
    assert issubclass(McpSessionError, InfrastructureError)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_a_stored_gui_episode_replays_from_its_records_without_a_browser(artifact_root: Path, make_task: Any) -> None:
    """replay_of: the hub answers every exchange (start, actions, screenshots, the verifier's
    evaluate) from the stored steps; the screenshots are the stored artifacts."""
    from apps.tasks.models import Trajectory

    config, solution = bundled("gui-miniwob-enter-text-s1")
    with scripted(config["prompt"], *solution) as (_, llm):
        first = run(config, llm)
    assert first.reward == 1.0, first.outcome_reason
    row = Trajectory.objects.create(task=make_task(prompt=config["prompt"], scene="gui"), iteration=1,
                                    status="finished", messages=first.messages, steps=first.steps, tools=first.tools,
                                    verifier_output=first.verifier_output, outcome=first.outcome, reward=first.reward)
    with scripted(config["prompt"], *solution) as (_, llm):
        again = run({**config, "replay_of": str(row.uuid)}, llm)
    assert again.outcome == "success" and again.reward == 1.0, again.outcome_reason
    assert [s["images"] for s in again.steps if s["tool"] != "finish"] == \
           [s["images"] for s in first.steps if s["tool"] != "finish"]
    assert again.verifier_output["check"]["raw_reward"] == 1.0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_on_opensandbox_the_browser_server_is_reached_over_streamable_http(
        opensandbox_backend: Any, fake: Any, settings: Any, artifact_root: Path) -> None:
    from tests.engines.test_envscaler_opensandbox import free_port

    settings.GUI_MCP_PORT = port = free_port()
    settings.GUI_MCP_HOST = "127.0.0.1"  # the fake's sandboxes share the host's network
    config, solution = bundled("gui-miniwob-click-test-2-s1")
    with scripted(config["prompt"], *solution) as (_, llm):
        result = run(config, llm, sandbox_backend=opensandbox_backend)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    assert result.sandbox["backend"] == "opensandbox"
    assert ("POST", "/mcp") in [(method, path) for sid, method, p, path in fake.forwarded
                                if sid == result.sandbox["id"] and p == port]
    assert [s["images"][0]["artifact"] for s in result.steps if s["tool"] == "browser_click"]
