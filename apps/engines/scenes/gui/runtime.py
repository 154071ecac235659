"""The gui scene runtime: an agent drives a real browser inside the task's sandbox.

Per episode: a sandbox of the `trajplatform-python` profile (Playwright and miniwob from the
platform's packages, Debian's /usr/bin/chromium) with no address-space limit (chromium reserves
~88 GiB of virtual memory; the memory cgroup bounds it, and the local backend refuses the scene
where there is none); our browser MCP server (server.py) written into it and started through
the MCP hub; then `platform_start` opens the start page:

* `source: miniwob`: the wheel's task page (`task`, e.g. "click-button") served by the browser
  server on the sandbox's loopback (127.0.0.1:8100, with the page's Content-Security-Policy;
  the page and the shared core/ and common/ files only), started the way BrowserGym does
  (`seed`, no time limit, the reward display hidden); the task is that one page. The utterance is
  the task's prompt, materialised at import with the seed; set-up refuses a page whose
  utterance differs from scene_config.utterance (a changed pin: re-record, examples/gui/build.py).
* `source: site`: a bundled app (`site`: shop, mail, admin; sites.py) served on the sandbox's
  loopback (127.0.0.1:8100), its state in /workspace/.gui/site-state.json.
* `source: url`: `start_url` on an external site, `allowed_origins` required (production:
  a backend with egress; the local backend refuses the open network).

The agent's tools are the server's browser_* tools (refs from the accessibility snapshot) and
finish; the platform-only tools (platform_start / platform_observe / platform_evaluate) are
never offered, and no script the agent puts into a page runs (the pages' CSP), so the agent
cannot reach the reward channel. Navigation is limited to the task's allowed set (the start
page's origin, MiniWoB's one page, or scene_config.allowed_origins).

After every action the platform (not the agent) takes a screenshot: it goes to the artifact
store (trajplatform/artifacts.py) and the step keeps its reference (`images`, the loop's image
observations), the page's `url` and `title` and the acted-on element's box (`action`, CSS
pixels of the screenshot), which the console draws. With scene_config `vision: true` the model
also sees the screenshot.
The start page is the episode's initial observation (text: URL, title, snapshot).

verify: checks.py on the final page, the site's state file or the answer (scene_config.check),
after the browser's page facts: a reward counts only from the task's own started page with no
injected script refused (verifier_output.process, decided_by).
A browser that dies ends its server: the hub raises McpSessionError, an InfrastructureError.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.engines.agent import image_parts, is_vision
from apps.engines.scenes.code_exec.runtime import TOOLS as CODE_EXEC_TOOLS
from apps.engines.scenes.gui import checks
from apps.engines.scenes.gui.server import AGENT_TOOLS, PLATFORM_TOOLS, miniwob_config
from apps.engines.mcp import EpisodeHubs, McpHub, McpServerSpec
from apps.engines.runtime import InfrastructureError, SceneRuntime, SetupError, ToolResult
from apps.engines.sandboxes import PLATFORM_PYTHON_PROFILE, Sandbox, SandboxSpec
from apps.engines.sandboxes.base import PLATFORM_PYTHON_PATH, SandboxFileNotFound
from trajplatform import artifacts

SCENE = "gui"
HERE = Path(__file__).resolve().parent
GUI_DIR = "/workspace/.gui"
SERVER_PATH = f"{GUI_DIR}/server.py"
CONFIG_PATH = f"{GUI_DIR}/config.json"
SHOTS_DIR = f"{GUI_DIR}/shots"
STATE_PATH = f"{GUI_DIR}/site-state.json"
MINIWOB_ROOT = f"{PLATFORM_PYTHON_PATH}/miniwob/html"  # task pages in miniwob/, their scripts in core/ and common/
SITE_PORT = 8100
SERVER = "browser"
DEFAULT_TIMEOUT_S = 600.0
TTL_MARGIN_S = 900.0
START_TIMEOUT_S = 90.0
VIEWPORT = (500, 360)
FINISH_TOOL = {"type": "function", "function": {
    **next(t["function"] for t in CODE_EXEC_TOOLS if t["function"]["name"] == "finish"),
    "description": "End the task. Call it once the task on the page is done; if the task asks a question, put "
                   "the answer in `answer`, otherwise a one-line summary of what you did.",
}}
VISION_TOOLS = ["browser_mouse_click_xy", "browser_take_screenshot"]  # offered to models that see images


def scene_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("scene_config") or {}


def browser_config(config: dict[str, Any]) -> dict[str, Any]:
    """What server.py gets: the start page, allowed origins and the source's set-up."""
    scene = scene_config(config)
    source = scene.get("source") or ("url" if scene.get("start_url") else "miniwob")
    out: dict[str, Any] = {"source": source, "shots_dir": SHOTS_DIR, "chromium": "/usr/bin/chromium",
                           "viewport": list(scene.get("viewport") or VIEWPORT)}
    if source == "miniwob":
        task = str(scene.get("task") or "")
        if not task or "/" in task or task.startswith("."):
            raise SetupError(f"a miniwob task names its page in scene_config.task (e.g. click-button), got {task!r}")
        out.update(miniwob_config(scene.get("miniwob_root") or MINIWOB_ROOT, task, int(scene.get("seed") or 0),
                                  int(scene.get("port") or SITE_PORT)))
    elif source == "site":
        port = int(scene.get("port") or SITE_PORT)
        origin = f"http://127.0.0.1:{port}"
        out.update(start_url=origin + (scene.get("start_path") or "/"), allowed_origins=[origin],
                   site={"name": scene.get("site") or "", "port": port, "state_path": STATE_PATH,
                         "data": scene.get("site_data")})
    elif source == "url":
        if not scene.get("start_url") or not scene.get("allowed_origins"):
            raise SetupError("a url task needs scene_config.start_url and scene_config.allowed_origins")
        out.update(start_url=scene["start_url"], allowed_origins=list(scene["allowed_origins"]))
    else:
        raise SetupError(f"scene_config.source must be miniwob, site or url, got {source!r}")
    return out


def server_spec(config: dict[str, Any]) -> McpServerSpec:
    """The browser server as the hub starts it; platform tools kept from the agent, and the
    screenshot and point-click tools too unless the model sees images."""
    return McpServerSpec(
        name=SERVER, argv=["python3", SERVER_PATH, "serve", CONFIG_PATH], namespace="",
        # OpenSandbox: streamable HTTP on GUI_MCP_HOST:GUI_MCP_PORT (each sandbox has its own network)
        http_argv=["python3", SERVER_PATH, "serve", CONFIG_PATH, "{host}", "{port}"],
        port=settings.GUI_MCP_PORT, host=settings.GUI_MCP_HOST,
        package={"kind": "module", "name": "trajplatform-browser", "version": "1"},
        platform_tools=sorted(PLATFORM_TOOLS), deny_tools=[] if is_vision(config) else list(VISION_TOOLS),
        call_timeout_s=30.0, start_timeout_s=60.0,
        network="egress" if scene_config(config).get("source") == "url" else "none")


def agent_tools(config: dict[str, Any]) -> list[dict[str, Any]]:
    spec = server_spec(config)
    return [{"type": "function", "function": {"name": name, "description": description, "parameters": schema}}
            for name, (description, schema) in AGENT_TOOLS.items() if spec.offers(name)]


def page_text(state: dict[str, Any]) -> str:
    return (f"### Page\n- Page URL: {state.get('url', '')}\n- Page Title: {state.get('title', '')}\n"
            f"### Snapshot\n```yaml\n{state.get('snapshot', '')}\n```")


@dataclass
class _Live:
    """One episode's hub, its start page and the screenshots taken."""

    hub: McpHub
    start: dict[str, Any] = field(default_factory=dict)
    initial_shot: dict[str, Any] | None = None
    shots: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _json(response: Any, what: str) -> dict[str, Any]:
    if response.is_error:
        raise SetupError(f"the browser could not {what}: {response.text}")
    try:
        return json.loads(response.text)
    except ValueError:
        raise SetupError(f"the browser answered {what} with something that is not JSON: {response.text[:200]}") from None


class GuiRuntime(SceneRuntime):
    scene_id = SCENE

    def __init__(self) -> None:
        self._episodes = EpisodeHubs(SetupError, "no browser was started in sandbox {sandbox}")

    # -- what the agent sees

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        return agent_tools(config) + [json.loads(json.dumps(FINISH_TOOL))]

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    text_form_rewrites: dict[str, str | None] = {
        "When the task is done, call finish; if it asks a question, put the answer in `answer`.":
            "When the task is done, reply in text without a tool call; if it asks a question, that reply is the "
            "answer.",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        lines = [
            "You operate a web browser with tools to complete the user's task on the page that is open.",
            "Each tool result shows the page's URL, title and accessibility snapshot; elements carry references "
            "like [ref=e5]: pass the exact ref (and a short description as `element`) to click, type into or "
            "select an element. Refs change when the page changes: use the latest snapshot.",
            "Only the task's own site can be opened. Do not guess refs that are not in the snapshot.",
            "When the task is done, call finish; if it asks a question, put the answer in `answer`.",
        ]
        if is_vision(config):
            lines.append("After every action you also see a screenshot of the page.")
        if config.get("max_steps"):
            lines.append(f"You have at most {int(config['max_steps'])} replies.")
        return "\n".join(lines)

    # -- the sandbox

    def sandbox_spec(self, config: dict[str, Any]) -> SandboxSpec:
        scene = scene_config(config)
        lifetime = float(config.get("timeout_s") or DEFAULT_TIMEOUT_S) + TTL_MARGIN_S
        return SandboxSpec(
            image=scene.get("image") or PLATFORM_PYTHON_PROFILE, labels={"scene": SCENE}, ttl=lifetime,
            memory_mb=int(scene.get("memory_mb") or 2048), pids=512, open_files=4096,
            # chromium reserves ~88 GiB of address space it never uses: the memory cgroup bounds it
            address_space_mb=None, network=server_spec(config).sandbox_network)

    def setup(self, sandbox: Sandbox, config: dict[str, Any]) -> None:
        browser = browser_config(config)
        hub = McpHub.for_episode([server_spec(config)], config)
        live = _Live(hub)
        self._episodes.add(sandbox, live)
        if not hub.replaying:
            sandbox.write_file(SERVER_PATH, (HERE / "server.py").read_bytes())
            sandbox.write_file(f"{GUI_DIR}/sites.py", (HERE / "sites.py").read_bytes())
            sandbox.write_file(CONFIG_PATH, json.dumps(browser).encode("utf-8"))
        hub.start(sandbox, lifetime=float(config.get("timeout_s") or DEFAULT_TIMEOUT_S) + TTL_MARGIN_S)
        live.start = _json(hub.call_platform(SERVER, "platform_start", {}, timeout=START_TIMEOUT_S), "open the start page")
        expected = scene_config(config).get("utterance")
        if expected is not None and live.start.get("utterance") != expected:
            raise SetupError(f"the MiniWoB page's utterance for seed {browser.get('seed')} is "
                             f"{live.start.get('utterance')!r}, the task was made with {expected!r} "
                             "(the pinned page or browser changed: re-record with examples/gui/build.py)")
        if is_vision(config):  # only a model that sees images is shown the start page's screenshot
            live.initial_shot = self._observe(sandbox, live).get("screenshot")

    def initial_observation(self, sandbox: Sandbox, config: dict[str, Any]) -> str | list[dict[str, Any]]:
        """The start page as the model first sees it: text appended to the task's prompt, and
        for a vision task its screenshot."""
        live = self._episodes.get(sandbox)
        text = "The browser shows the start page.\n" + page_text(live.start)
        if not is_vision(config) or not live.initial_shot:
            return text
        return [{"type": "text", "text": text}, *image_parts([live.initial_shot])]

    # -- tools

    def _observe(self, sandbox: Sandbox, live: _Live) -> dict[str, Any]:
        """The platform's look at the page after a step: URL, title, screenshot artifact, action box."""
        with live.lock:
            index = live.shots
            live.shots += 1
        response = live.hub.call_platform(SERVER, "platform_observe", {"index": index})
        if response.is_error:
            return {"observe_error": response.text}
        observed = json.loads(response.text)
        out: dict[str, Any] = {"url": observed.get("url", ""), "title": observed.get("title", "")}
        if observed.get("action"):
            out["action"] = observed["action"]
        path = observed.get("screenshot")
        if path:
            try:
                data = sandbox.read_file(path, max_bytes=settings.IMAGE_MAX_BYTES + 1)
                out["screenshot"] = artifacts.store(data, "image/png", width=observed.get("width"),
                                                    height=observed.get("height"))
            except artifacts.ArtifactError as exc:  # past IMAGE_MAX_BYTES / IMAGE_MAX_PIXELS: named, not kept
                out["observe_error"] = f"the screenshot was not kept: {exc}"
            except SandboxFileNotFound:
                if not live.hub.replaying:
                    raise InfrastructureError(f"the browser's screenshot {path} is missing from the sandbox") from None
                try:  # a replay: the recorded screenshot is already in the store
                    out["screenshot"] = artifacts.get(str(observed.get("sha256"))).ref()
                except artifacts.ArtifactError:
                    pass
        return out

    def execute_tool(
        self, name: str, args: dict[str, Any], sandbox: Sandbox, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        live = self._episodes.get(sandbox)
        # ToolError (a tool not offered: platform-only, denied, unknown) goes to the agent;
        # McpSessionError (the browser server is gone) is an InfrastructureError.
        result = live.hub.call_tool(name, args, timeout=timeout)
        observed = self._observe(sandbox, live)
        shot = observed.pop("screenshot", None)
        result.extra.update(observed)  # url, title, the acted-on element's box
        if shot:
            result.images = [shot]  # the step's `images`: what the console draws on, what vision sees
        result.extra["mcp_calls"] = result.extra.get("mcp_calls", []) + live.hub.take_records()
        return result

    # -- after finish

    def verify(self, sandbox: Sandbox, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        check = scene_config(config).get("check")
        if not check:
            return None, {}
        live = self._episodes.get(sandbox)

        def evaluate(expression: str, url: str | None) -> Any:
            args = {"expression": expression, **({"url": url} if url else {})}
            response = live.hub.call_platform(SERVER, "platform_evaluate", args)
            if response.is_error:
                raise checks.CheckError(f"evaluating {expression[:80]!r} on the page failed: {response.text}")
            return json.loads(response.text).get("value")

        def site_state() -> dict[str, Any]:
            try:
                return json.loads(sandbox.read_file(STATE_PATH))
            except SandboxFileNotFound:
                raise checks.CheckError("the task's site wrote no state file (is it a site task?)") from None

        response = live.hub.call_platform(SERVER, "platform_evaluate", {"expression": "location.href"})
        if response.is_error:
            raise SetupError(f"the task's check cannot run: the browser cannot read the page: {response.text}")
        answer = json.loads(response.text)
        url, facts = answer.get("value"), answer.get("page") or {}
        source = browser_config(config)["source"]
        process = checks.process_conditions(source, facts)
        gate = next((name for name, c in process.items() if not c["ok"] and not c.get("relaxed")), None)
        if gate is not None:  # the page cannot be trusted: its reward (or state) is not read at all
            reward, details = 0.0, {"type": "not run", "passed": False, "reason": process[gate]["detail"]}
        else:
            try:
                reward, details = checks.run_check(check, checks.Probe(final_answer=final_answer, url=str(url or ""),
                                                                       evaluate=evaluate, site_state=site_state))
            except checks.CheckError as exc:
                raise SetupError(f"the task's check cannot run: {exc}") from None
            process.update(checks.completion_conditions(details))
        parts = details.get("checks") or [details]
        output: dict[str, Any] = {"check": details, "reward": reward, "url": url,
                                  "passed": sum(1 for d in parts if d.get("passed")), "total": len(parts),
                                  "process": process, "decided_by": gate or "check"}
        if facts.get("refused"):
            output["refused_navigations"] = facts["refused"]
        if details.get("reason"):
            output["note"] = f"MiniWoB: {details['reason']}" if details.get("type") == "miniwob" else details["reason"]
        records = live.hub.take_records()
        if records:
            output["mcp_calls"] = records
        return reward, output
