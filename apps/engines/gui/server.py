"""The gui scene's browser: a fastmcp server on Playwright that runs INSIDE the task's sandbox.

    python3 server.py serve CONFIG.json          # stdio MCP server (the hub starts it)

It imports nothing from the platform (the sandbox has the platform's site-packages on
PYTHONPATH: fastmcp, playwright, miniwob) and drives Debian's /usr/bin/chromium headless.

Agent tools, modelled on the de-facto browser MCP tool set (@playwright/mcp, ref-based):
browser_navigate, browser_navigate_back, browser_snapshot, browser_click, browser_type,
browser_select_option, browser_press_key, browser_hover, browser_drag, browser_fill_form,
browser_handle_dialog, browser_wait_for, and for models that see the screenshots
browser_take_screenshot and browser_mouse_click_xy (a point of the screenshot). Elements are addressed by the
`ref` of the page's accessibility snapshot (Playwright's `aria_snapshot(mode="ai")`:
`button "Submit" [ref=e5]`); every action answers with the page's URL, title and a fresh
snapshot. Navigation is limited to CONFIG.allowed_origins (an http(s) origin, or a file://
path prefix): the navigate tool refuses others, every request of the page to another origin
is aborted, and a page that ends up elsewhere is taken back.

Platform-only tools (the runtime's spec keeps them from the agent, so the agent cannot reach
the reward channel, e.g. MiniWoB's core.endEpisode): platform_start (launch, open the start
page, the source's init: MiniWoB seeded the way BrowserGym does), platform_observe (a
screenshot written to CONFIG.shots_dir, URL, title, the last action's element box),
platform_evaluate (a JavaScript expression on the page, for the verifier).

When the browser dies the server exits (status 75): the hub sees its server gone and the
loop ends the episode as an infrastructure error, never as the agent's failure.

CONFIG.source "site" also serves one of the bundled web apps (sites.py, next to this file) on
127.0.0.1:CONFIG.site.port in a thread of this process: locally every stdio server has a
network namespace of its own, so the app must live in the browser's.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
import time
from typing import Any
from urllib.parse import urlsplit

BROWSER_GONE_EXIT = 75
SNAPSHOT_MAX_CHARS = 20000
REF_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

# MiniWoB's start, as BrowserGym does it: seeded, no time limit, the human display hidden.
# `core.startEpisode` is emptied so a finished episode stays finished (no new problem, no
# START cover that a further click would restart with a zero reward).
MINIWOB_INIT = """(seed) => {
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = 1000000000;
  core.startEpisodeReal();
  core.startEpisode = function () {};
  core.clearTimer();
  document.body.removeEventListener('click', core.canvasDrawClick);
  for (const id of ['reward-display', 'click-canvas', 'sync-task-cover']) {
    const el = document.getElementById(id);
    if (el) el.style.display = 'none';
  }
  return {utterance: core.getUtterance(), ready: WOB_TASK_READY};
}"""


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or DEFAULT_PORTS.get(scheme)
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


def allowed(url: str, origins: list[str]) -> bool:
    """Whether the page may load `url`: about:blank, or an allowed origin / file:// prefix."""
    if url in ("about:blank", "about:srcdoc"):
        return True
    scheme = urlsplit(url).scheme.lower()
    if scheme == "file":
        path = os.path.normpath(urlsplit(url).path)
        return any(o.startswith("file://") and (path + "/").startswith(os.path.normpath(o[7:]) + "/")
                   for o in origins)
    if scheme not in DEFAULT_PORTS:
        return False
    return any(not o.startswith("file://") and origin_of(o) == origin_of(url) for o in origins)


class Browser:
    """One chromium, one page, for one episode."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.origins: list[str] = list(config.get("allowed_origins") or [])
        self.playwright: Any = None
        self.browser: Any = None
        self.page: Any = None
        self.dialog: Any = None
        self.last_action: dict[str, Any] = {}
        self.shots = 0
        self.lock = asyncio.Lock()

    # -- life

    async def start(self) -> dict[str, Any]:
        from playwright.async_api import async_playwright

        started = time.monotonic()
        self.playwright = await async_playwright().start()
        self.browser = await self.playwright.chromium.launch(
            executable_path=self.config.get("chromium") or "/usr/bin/chromium", headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-extensions"])
        self.browser.on("disconnected", self._disconnected)
        width, height = self.config.get("viewport") or (500, 360)
        context = await self.browser.new_context(viewport={"width": width, "height": height},
                                                 device_scale_factor=1, accept_downloads=False,
                                                 service_workers="block")
        await context.route("**/*", self._route)
        context.set_default_timeout(float(self.config.get("action_timeout_ms") or 5000))
        # Loading a page is the browser's work, not the agent's: a loaded machine gets time.
        context.set_default_navigation_timeout(float(self.config.get("navigation_timeout_ms") or 30000))
        self.page = await context.new_page()
        self.page.on("dialog", self._on_dialog)
        self.page.on("crash", lambda *_: self._gone("the page crashed"))
        launched = time.monotonic()
        info: dict[str, Any] = {}
        start_timeout = float(self.config.get("start_timeout_ms") or 60000)
        await self.page.goto(self.config["start_url"], wait_until="load", timeout=start_timeout)
        source = self.config.get("source")
        if source == "miniwob":
            await self.page.wait_for_function("() => typeof core !== 'undefined' && typeof genProblem === 'function'",
                                              timeout=start_timeout)
            info = await self.page.evaluate(MINIWOB_INIT, int(self.config.get("seed") or 0))
            await self.page.wait_for_function("() => WOB_TASK_READY === true", timeout=start_timeout)
        state = await self.state()
        return {**info, **state, "launch_ms": int((launched - started) * 1000),
                "start_ms": int((time.monotonic() - started) * 1000)}

    def _disconnected(self, *_: Any) -> None:
        self._gone("the browser disconnected")

    async def close(self) -> None:
        """End the browser on purpose (the recorder's way out; the server just exits)."""
        if self.browser is not None:
            self.browser.remove_listener("disconnected", self._disconnected)
            await self.browser.close()
        if self.playwright is not None:
            await self.playwright.stop()

    def _gone(self, why: str) -> None:
        sys.stderr.write(f"trajplatform-browser: {why}; exiting\n")
        sys.stderr.flush()
        os._exit(BROWSER_GONE_EXIT)

    async def _route(self, route: Any) -> None:
        if allowed(route.request.url, self.origins):
            await route.continue_()
        else:
            await route.abort("blockedbyclient")

    def _on_dialog(self, dialog: Any) -> None:
        self.dialog = dialog

    # -- observation

    async def snapshot(self) -> str:
        if self.dialog is not None:
            return f'(a {self.dialog.type} dialog is open: "{self.dialog.message}"; answer it with browser_handle_dialog)'
        text = await self.page.aria_snapshot(mode="ai")
        if len(text) > SNAPSHOT_MAX_CHARS:
            text = text[:SNAPSHOT_MAX_CHARS] + "\n[... snapshot cut ...]"
        return text

    async def state(self) -> dict[str, Any]:
        title = "" if self.dialog is not None else await self.page.title()
        return {"url": self.page.url, "title": title, "snapshot": await self.snapshot()}

    async def report(self, done: str) -> str:
        state = await self.state()
        return (f"{done}\n### Page\n- Page URL: {state['url']}\n- Page Title: {state['title']}\n"
                f"### Snapshot\n```yaml\n{state['snapshot']}\n```")

    async def observe(self, index: int) -> dict[str, Any]:
        directory = self.config.get("shots_dir") or "/tmp"
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"step-{int(index):04d}.png")
        if self.dialog is not None:  # a screenshot would wait for the dialog
            return {"url": self.page.url, "title": "", "screenshot": None, "action": self.last_action,
                    "dialog": self.dialog.message}
        data = await self.page.screenshot(type="png", animations="disabled", caret="initial")
        with open(path, "wb") as fh:
            fh.write(data)
        width, height = self.config.get("viewport") or (500, 360)
        return {"url": self.page.url, "title": await self.page.title(), "screenshot": path,
                "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "width": width, "height": height,
                "action": self.last_action}

    # -- actions

    def locate(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not REF_RE.match(ref):
            raise ValueError(f"ref must be an element reference from the page snapshot (like e5), got {ref!r}")
        return self.page.locator(f"aria-ref={ref}")

    async def box(self, locator: Any) -> dict[str, float] | None:
        try:
            box = await locator.bounding_box(timeout=1000)
        except Exception:  # noqa: BLE001 - the box is only for drawing the action
            return None
        return {k: round(v, 1) for k, v in box.items()} if box else None

    async def settle(self) -> None:
        try:
            await self.page.wait_for_load_state("load", timeout=3000)
        except Exception:  # noqa: BLE001 - a slow page is reported as it is
            pass
        if not allowed(self.page.url, self.origins):
            left = self.page.url
            await self.page.go_back()
            raise PermissionError(f"the page went to {left}, outside this task's allowed origins; it was taken back")

    async def act(self, name: str, args: dict[str, Any]) -> str:
        if self.dialog is not None and name not in ("browser_handle_dialog", "browser_snapshot"):
            raise RuntimeError(f'a {self.dialog.type} dialog is open ("{self.dialog.message}"): '
                               "answer it with browser_handle_dialog first")
        self.last_action = {"tool": name}
        page = self.page
        if name == "browser_navigate":
            url = str(args.get("url") or "")
            if not allowed(url, self.origins):
                raise PermissionError(f"navigation to {url!r} is refused: this task allows only "
                                      f"{', '.join(self.origins) or 'its start page'}")
            await page.goto(url, wait_until="load")
            done = f"Navigated to {url}"
        elif name == "browser_navigate_back":
            await page.go_back()
            done = "Navigated back"
        elif name == "browser_snapshot":
            done = "Snapshot"
        elif name in ("browser_click", "browser_hover"):
            target = self.locate(args.get("ref"))
            self.last_action["box"] = await self.box(target)
            if name == "browser_hover":
                await target.hover()
                done = f"Hovered {args.get('element') or args.get('ref')}"
            else:
                button = args.get("button") or "left"
                if args.get("doubleClick"):
                    await target.dblclick(button=button)
                else:
                    await target.click(button=button)
                done = f"Clicked {args.get('element') or args.get('ref')}"
        elif name == "browser_type":
            target = self.locate(args.get("ref"))
            self.last_action["box"] = await self.box(target)
            text = str(args.get("text") or "")
            if args.get("slowly"):
                await target.press_sequentially(text)
            else:
                await target.fill(text)
            if args.get("submit"):
                await target.press("Enter")
            done = f"Typed {text!r} into {args.get('element') or args.get('ref')}"
        elif name == "browser_select_option":
            target = self.locate(args.get("ref"))
            self.last_action["box"] = await self.box(target)
            values = [str(v) for v in args.get("values") or []]
            await target.select_option(values)
            done = f"Selected {values} in {args.get('element') or args.get('ref')}"
        elif name == "browser_press_key":
            await page.keyboard.press(str(args.get("key") or ""))
            done = f"Pressed {args.get('key')}"
        elif name == "browser_drag":
            start, end = self.locate(args.get("startRef")), self.locate(args.get("endRef"))
            self.last_action.update(box=await self.box(start), end_box=await self.box(end))
            await start.drag_to(end)
            done = f"Dragged {args.get('startElement') or args.get('startRef')} to {args.get('endElement') or args.get('endRef')}"
        elif name == "browser_fill_form":
            filled = []
            for field in args.get("fields") or []:
                target = self.locate(field.get("ref"))
                kind, value = field.get("type") or "textbox", field.get("value")
                if kind in ("checkbox", "radio"):
                    await target.set_checked(str(value).lower() in ("true", "1", "yes", "on"))
                elif kind == "combobox":
                    await target.select_option(str(value))
                else:
                    await target.fill(str(value if value is not None else ""))
                filled.append(field.get("name") or field.get("ref"))
            done = f"Filled {', '.join(map(str, filled))}"
        elif name == "browser_handle_dialog":
            if self.dialog is None:
                raise RuntimeError("no dialog is open")
            dialog, self.dialog = self.dialog, None
            if args.get("accept"):
                await dialog.accept(args.get("promptText") or "")
            else:
                await dialog.dismiss()
            done = f"{'Accepted' if args.get('accept') else 'Dismissed'} the {dialog.type} dialog"
        elif name == "browser_wait_for":
            if args.get("text"):
                await page.get_by_text(str(args["text"])).first.wait_for(state="visible")
            if args.get("textGone"):
                await page.get_by_text(str(args["textGone"])).first.wait_for(state="hidden")
            if args.get("time"):
                await asyncio.sleep(min(float(args["time"]), 10.0))
            done = "Waited"
        elif name == "browser_mouse_click_xy":
            x, y = float(args.get("x", -1)), float(args.get("y", -1))
            width, height = self.config.get("viewport") or (500, 360)
            if not (0 <= x < width and 0 <= y < height):
                raise ValueError(f"({x:g}, {y:g}) is outside the {width}x{height} viewport")
            self.last_action["point"] = {"x": x, "y": y}
            # Point first, as a hand does: a :hover style may swap the element (an icon's image)
            # and a click sent in the same instant lands on what was under it before.
            await page.mouse.move(x, y)
            await page.wait_for_timeout(100)
            await page.mouse.click(x, y)
            done = f"Clicked at ({x:g}, {y:g})" + (f" on {args['element']}" if args.get("element") else "")
        elif name == "browser_take_screenshot":
            done = "Screenshot taken: the platform attaches the page's image to this step"
        else:
            raise ValueError(f"unknown tool {name}")
        await self.settle()
        return await self.report(done)


REF = {"type": "string", "description": "Exact target element reference from the page snapshot"}
ELEMENT = {"type": "string", "description": "Human-readable element description, for the record"}
NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


AGENT_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "browser_navigate": ("Navigate to a URL (only the task's own site is reachable)",
                         _schema({"url": {"type": "string", "description": "The URL to navigate to"}}, ["url"])),
    "browser_navigate_back": ("Go back to the previous page", NO_ARGS),
    "browser_snapshot": ("Capture the accessibility snapshot of the current page (better than a screenshot)", NO_ARGS),
    "browser_click": ("Perform click on a web page", _schema({
        "element": ELEMENT, "ref": REF,
        "doubleClick": {"type": "boolean", "description": "Whether to perform a double click"},
        "button": {"type": "string", "enum": ["left", "right", "middle"]}}, ["ref"])),
    "browser_type": ("Type text into an editable element", _schema({
        "element": ELEMENT, "ref": REF, "text": {"type": "string", "description": "Text to type"},
        "submit": {"type": "boolean", "description": "Whether to press Enter after"},
        "slowly": {"type": "boolean", "description": "Type one character at a time (triggers key handlers)"}},
        ["ref", "text"])),
    "browser_select_option": ("Select an option in a dropdown", _schema({
        "element": ELEMENT, "ref": REF,
        "values": {"type": "array", "items": {"type": "string"}, "description": "Values to select"}},
        ["ref", "values"])),
    "browser_press_key": ("Press a key on the keyboard", _schema({
        "key": {"type": "string", "description": "Name of the key, e.g. ArrowLeft, Enter, or a character"}}, ["key"])),
    "browser_hover": ("Hover over an element", _schema({"element": ELEMENT, "ref": REF}, ["ref"])),
    "browser_drag": ("Drag and drop between two elements", _schema({
        "startElement": ELEMENT, "startRef": REF, "endElement": ELEMENT, "endRef": REF}, ["startRef", "endRef"])),
    "browser_fill_form": ("Fill several form fields at once", _schema({"fields": {"type": "array", "minItems": 1, "items": _schema({
        "name": {"type": "string"}, "ref": REF,
        "type": {"type": "string", "enum": ["textbox", "checkbox", "radio", "combobox", "slider"]},
        "value": {"type": "string"}}, ["ref", "type", "value"])}}, ["fields"])),
    "browser_handle_dialog": ("Accept or dismiss an open dialog", _schema({
        "accept": {"type": "boolean"}, "promptText": {"type": "string"}}, ["accept"])),
    "browser_wait_for": ("Wait for text to appear or disappear, or for a time in seconds (at most 10)", _schema({
        "time": {"type": "number", "minimum": 0, "maximum": 10}, "text": {"type": "string"},
        "textGone": {"type": "string"}}, [])),
    "browser_mouse_click_xy": ("Click at a point of the screenshot (CSS pixels from its top left)", _schema({
        "element": ELEMENT, "x": {"type": "number", "description": "X coordinate"},
        "y": {"type": "number", "description": "Y coordinate"}}, ["x", "y"])),
    "browser_take_screenshot": ("Take a screenshot of the current page (shown to models that see images)", NO_ARGS),
}
PLATFORM_TOOLS = {
    "platform_start": ("platform only: launch the browser and open the start page", NO_ARGS),
    "platform_observe": ("platform only: screenshot and page state after a step",
                         _schema({"index": {"type": "integer", "minimum": 0}}, ["index"])),
    "platform_evaluate": ("platform only: evaluate a JavaScript expression on the page",
                          _schema({"expression": {"type": "string"}, "url": {"type": "string"}}, ["expression"])),
}


def build_server(config: dict[str, Any]) -> Any:
    from fastmcp import FastMCP
    from fastmcp.tools import Tool
    from fastmcp.tools.base import ToolResult

    browser = Browser(config)
    if config.get("source") == "site":
        import sites  # next to this file

        sites.serve_in_thread(config["site"])

    class BrowserTool(Tool):
        async def run(self, arguments: dict[str, Any]) -> ToolResult:
            async with browser.lock:
                try:
                    if self.name == "platform_start":
                        return ToolResult(content=json.dumps(await browser.start()))
                    if browser.page is None:
                        return ToolResult(content="the browser has not been started", is_error=True)
                    if self.name == "platform_observe":
                        return ToolResult(content=json.dumps(await browser.observe(int(arguments.get("index") or 0))))
                    if self.name == "platform_evaluate":
                        if arguments.get("url"):  # WebArena's program_html opens a target page first
                            if not allowed(arguments["url"], browser.origins):
                                raise PermissionError(f"{arguments['url']} is outside the task's allowed origins")
                            await browser.page.goto(arguments["url"], wait_until="load")
                        value = await browser.page.evaluate(str(arguments.get("expression") or "null"))
                        return ToolResult(content=json.dumps({"value": value}, default=str))
                    return ToolResult(content=await browser.act(self.name, arguments or {}))
                except Exception as exc:  # the page refused: the agent (or the verifier) reads why
                    if browser.browser is not None and not browser.browser.is_connected():
                        browser._gone(f"the browser is gone ({exc})")
                    message = str(exc).split("\nCall log:")[0].strip()
                    return ToolResult(content=f"{type(exc).__name__}: {message}", is_error=True)

    mcp = FastMCP("trajplatform-browser")
    for name, (description, schema) in {**AGENT_TOOLS, **PLATFORM_TOOLS}.items():
        mcp.add_tool(BrowserTool(name=name, description=description, parameters=schema))
    return mcp


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 5) or argv[1] != "serve":
        print("usage: server.py serve CONFIG.json [HOST PORT]   (stdio, or streamable HTTP on HOST:PORT)",
              file=sys.stderr)
        return 2
    with open(argv[2], encoding="utf-8") as fh:
        config = json.load(fh)
    if len(argv) == 5:  # backends without pipes (OpenSandbox): reached through the sandbox's endpoint
        build_server(config).run(transport="http", host=argv[3], port=int(argv[4]), show_banner=False,
                                 host_origin_protection=False)
    else:
        build_server(config).run(transport="stdio", show_banner=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
