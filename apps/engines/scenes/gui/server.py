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
snapshot. Navigation is limited to CONFIG.allowed_origins (an http(s) origin, an origin with
a path prefix ending in "/" or one exact path, or a file:// path prefix), always compared on
the decoded, normalised path (`allowed`): the navigate tool refuses others, every other request
of the page is aborted, a navigation the page itself starts elsewhere is answered "204 No
Content" (the browser stays on its page, which stays usable) and the step is an error.

CONFIG.source "miniwob" serves the MiniWoB++ wheel's html/ directory on 127.0.0.1:CONFIG.pages.port
(`PageServer`, a thread of this process): the task's own page and the shared core/ and common/
files, nothing else (no other task's page), and the page with a Content-Security-Policy whose
script-src is the page's own script files and the hashes of its inline scripts. Markup the agent
gets into the page (MiniWoB's terminal renders typed text as HTML) can therefore run no script:
no inline handler, no javascript: URL, no other script file. Such a blocked attempt is kept
(`blocked_scripts`, from the console) and the verifier fails the episode on it. The task is one
page: after the start every navigation of the page is refused (a reload would restart the
problem unseeded), and the page the platform started carries a per-episode token that a
reloaded page does not have (`page_facts`: the verifier reads a reward only from that page).

Platform-only tools (the runtime's spec keeps them from the agent; with the page's CSP no
script of the agent's runs in the page, so the agent cannot reach the reward channel,
e.g. MiniWoB's core.endEpisode): platform_start (launch, open the start page, the source's
init: MiniWoB seeded the way BrowserGym does, then the page's stylesheet images loaded and no request
pending, so the first snapshot is of the fully started page), platform_observe (a screenshot written to
CONFIG.shots_dir, URL, title, the last action's element box), platform_evaluate (a
JavaScript expression on the page, for the verifier; its answer also carries `page_facts`).

When the browser dies the server exits (status 75): the hub sees its server gone and the
loop ends the episode as an infrastructure error, never as the agent's failure.

CONFIG.source "site" also serves one of the bundled web apps (sites.py, next to this file) on
127.0.0.1:CONFIG.site.port in a thread of this process: locally every stdio server has a
network namespace of its own, so the app must live in the browser's.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import posixpath
import re
import secrets
import sys
import threading
import time
from html.parser import HTMLParser
from socketserver import ThreadingMixIn
from typing import Any, Callable
from urllib.parse import unquote, urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

BROWSER_GONE_EXIT = 75
SNAPSHOT_MAX_CHARS = 20000
REF_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

# MiniWoB's start, as BrowserGym does it: seeded, no time limit, the human display hidden.
# `core.startEpisode` is emptied so a finished episode stays finished (no new problem, no
# START cover that a further click would restart with a zero reward).
# The page the platform started carries `token` under `mark` (not writable), which a reloaded page has not.
MINIWOB_INIT = """({seed, mark, token}) => {
  Math.seedrandom(seed);
  Object.defineProperty(window, mark, {value: token, writable: false, configurable: false, enumerable: false});
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


# Resolves after two rendered frames: the first frame's style and layout have run (and asked for their files).
FRAMES = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"
# The images the page's own stylesheets name (a :hover icon too), loaded before the first observation: an image
# that comes later has no size until it does, so a hover that swaps one in would move the click's target away.
CSS_IMAGES = r"""async () => {
  const urls = new Set();
  for (const sheet of document.styleSheets) {
    let rules;
    try { rules = sheet.cssRules; } catch (e) { continue; }
    for (const rule of rules) {
      for (const m of rule.cssText.matchAll(/url\(\s*(["']?)([^"')]+)\1\s*\)/g)) {
        const url = new URL(m[2], sheet.href || document.baseURI);
        if (url.origin === location.origin) urls.add(url.href);
      }
    }
  }
  await Promise.all([...urls].map((url) => new Promise((done) => {
    const image = new Image();
    image.onload = image.onerror = done;
    image.src = url;
  })));
  return urls.size;
}"""
EPISODE_MARK = "__trajplatform_episode"
MINIWOB_SHARED = ("/core/", "/common/")  # the scripts, styles and images the task pages share; no task page is there
UNSAFE_URL_CHARS = re.compile(r"[\\\x00-\x1f\x7f]")  # a backslash or control: browsers rewrite or drop them


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or DEFAULT_PORTS.get(scheme)
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


def clean_path(raw: str) -> str | None:
    """A URL path decoded (percent-escapes) and normalised ("/a/%2e%2e/b" -> "/b"), or None when
    it is not a plain path: a backslash or a control character once decoded (browsers rewrite
    or drop them), or escapes left after one decoding ("%252e")."""
    path = unquote(raw or "/", errors="strict")
    if UNSAFE_URL_CHARS.search(path) or unquote(path) != path or not path.startswith("/"):
        return None
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    return normal + ("/" if path.endswith("/") and normal != "/" else "")


def within(path: str, prefix: str) -> bool:
    """`prefix` "" or ending in "/": `path` inside it; otherwise exactly that path."""
    if not prefix or prefix.endswith("/"):
        return path.startswith(prefix or "/")
    return path == prefix


def allowed(url: str, origins: list[str]) -> bool:
    """Whether the page may load `url`: about:blank, or an allowed origin (with a path prefix or
    an exact path when the entry has one) / file:// prefix, on the decoded, normalised path."""
    if url in ("about:blank", "about:srcdoc"):
        return True
    if UNSAFE_URL_CHARS.search(url):  # "http://a\\@b/": Python and the browser disagree on the host
        return False
    try:
        parts = urlsplit(url)
        path = clean_path(parts.path)
    except (ValueError, UnicodeDecodeError):
        return False
    scheme = parts.scheme.lower()
    if path is None or (scheme == "file" and parts.netloc not in ("", "localhost")):
        return False
    for entry in origins:
        if entry.startswith("file://"):
            prefix = clean_path(entry[7:])
            if scheme == "file" and prefix and within(path, prefix.rstrip("/") + "/"):
                return True
        elif scheme in DEFAULT_PORTS and origin_of(entry) == origin_of(url):
            prefix = clean_path(urlsplit(entry).path or "/")
            if prefix and within(path, prefix):
                return True
    return False


class _Scripts(HTMLParser):
    """The <script> elements of a page: the src of each file and the text of each inline one."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.files: list[str] = []
        self.inline: list[str] = []
        self._text: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            src = dict(attrs).get("src")
            if src:
                self.files.append(src)
            else:
                self._text = []

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._text is not None:
            self.inline.append("".join(self._text))
            self._text = None


def page_csp(html_text: str, page_url: str) -> str:
    """The Content-Security-Policy of a task page: script only from the page's own script files
    and its inline scripts (by SHA-256, as the browser hashes them: newlines normalised), so
    nothing put into the page later runs (no inline handler, javascript: URL or other file)."""
    parser = _Scripts()
    parser.feed(html_text.replace("\r\n", "\n").replace("\r", "\n"))
    parser.close()
    origin = f"{urlsplit(page_url).scheme}://{urlsplit(page_url).netloc}"
    base = posixpath.dirname(urlsplit(page_url).path) + "/"
    sources = []
    for src in parser.files:
        path = clean_path(src if src.startswith("/") else base + src)
        if path and not urlsplit(src).scheme:
            sources.append(origin + path)
    hashes = [f"'sha256-{base64.b64encode(hashlib.sha256(t.encode()).digest()).decode()}'" for t in parser.inline]
    return ("default-src 'none'; script-src " + " ".join(sources + hashes or ["'none'"]) +
            f"; style-src {origin} 'unsafe-inline'; img-src {origin} data:; font-src {origin} data:; "
            f"connect-src {origin}; media-src {origin}; object-src 'none'; frame-src 'none'; worker-src 'none'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class PageServer:
    """The MiniWoB++ pages of one task on 127.0.0.1:`port`: the task's page (with its CSP) and the
    shared core/ and common/ files from `root` (the wheel's html/); anything else is 404.
    Paths are decoded and normalised before the check, and the file must resolve inside `root`."""

    TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css", ".png": "image/png",
             ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".svg": "image/svg+xml",
             ".json": "application/json", ".woff": "font/woff", ".woff2": "font/woff2", ".ttf": "font/ttf"}

    def __init__(self, root: str, page: str, port: int):
        self.root = os.path.realpath(root)
        self.page = page  # "/miniwob/<task>.html"
        self.port = int(port)
        self.origin = f"http://127.0.0.1:{self.port}"

    def serves(self, path: str | None) -> bool:
        return path is not None and (path == self.page or
                                     (path.startswith(MINIWOB_SHARED) and not path.endswith((".html", ".htm"))))

    def file(self, path: str | None) -> str | None:
        """The file behind a request path, or None (not served, missing, or resolving outside root)."""
        if not self.serves(path):
            return None
        real = os.path.realpath(os.path.join(self.root, str(path).lstrip("/")))
        if not real.startswith(self.root + os.sep) or not os.path.isfile(real):
            return None
        return real

    def respond(self, raw_path: str) -> tuple[str, list[tuple[str, str]], bytes]:
        try:
            path = clean_path(raw_path)
        except UnicodeDecodeError:
            path = None
        real = self.file(path)
        if real is None:
            return "404 Not Found", [("Content-Type", "text/plain")], b"not part of this task\n"
        with open(real, "rb") as fh:
            data = fh.read()
        headers = [("Content-Type", self.TYPES.get(os.path.splitext(real)[1].lower(), "application/octet-stream")),
                   ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")]
        if path == self.page:
            headers.append(("Content-Security-Policy", page_csp(data.decode("utf-8"), self.origin + self.page)))
        return "200 OK", headers, data

    def wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        # RAW_URI / REQUEST_URI are not set by wsgiref: PATH_INFO is the once-decoded path, re-quoted
        # only for the check (clean_path decodes again and refuses what a second decoding changes).
        raw = environ.get("PATH_INFO", "/").encode("latin-1").decode("utf-8", "replace")
        status, headers, data = self.respond(raw.replace("%", "%25"))
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, headers, data = "405 Method Not Allowed", [("Content-Type", "text/plain")], b""
        start_response(status, [*headers, ("Content-Length", str(len(data)))])
        return [data]

    def serve_in_thread(self) -> Any:
        class Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:  # stdout/stderr belong to the MCP server
                pass

        server = make_server("127.0.0.1", self.port, self.wsgi, server_class=Server, handler_class=Quiet)
        threading.Thread(target=server.serve_forever, name="miniwob-pages", daemon=True).start()
        return server


def miniwob_config(root: str, task: str, seed: int, port: int) -> dict[str, Any]:
    """The browser's config for a MiniWoB task page served by PageServer (the runtime's and the
    example builder's): the page and the shared files are all the page may load."""
    origin = f"http://127.0.0.1:{int(port)}"
    page = f"/miniwob/{task}.html"
    return {"source": "miniwob", "start_url": origin + page, "seed": int(seed), "single_page": True,
            "allowed_origins": [origin + page] + [origin + prefix for prefix in MINIWOB_SHARED],
            "pages": {"root": root, "page": page, "port": int(port)}}


class Browser:
    """One chromium, one page, for one episode."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.origins: list[str] = list(config.get("allowed_origins") or [])
        self.single_page = bool(config.get("single_page"))  # MiniWoB: the task is its start page, never reloaded
        self.token = secrets.token_hex(16)  # marks the page the platform started (MINIWOB_INIT)
        self.playwright: Any = None
        self.browser: Any = None
        self.page: Any = None
        self.pages: Any = None  # the PageServer's httpd, for source miniwob
        self.started = False
        self.dialog: Any = None
        self.last_action: dict[str, Any] = {}
        self.refused: list[str] = []  # navigations and new windows refused, in order
        self.blocked_loads: list[str] = []  # other requests of the page refused (a missing file, another origin)
        self.blocked_scripts: list[str] = []  # the page's CSP refusals: script the agent put into the page
        self.loading: set[Any] = set()  # the page's requests not finished yet (`quiet`)
        self.shots = 0
        self.lock = asyncio.Lock()

    # -- life

    async def start(self) -> dict[str, Any]:
        from playwright.async_api import async_playwright  # deferred: playwright (heavy), sandbox only

        started = time.monotonic()
        if self.config.get("pages"):
            pages = self.config["pages"]
            self.pages = PageServer(pages["root"], pages["page"], pages["port"]).serve_in_thread()
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
        context.on("page", self._on_popup)
        self.page.on("dialog", self._on_dialog)
        self.page.on("crash", lambda *_: self._gone("the page crashed"))
        self.page.on("console", self._on_console)
        self.page.on("request", lambda request: self.loading.add(request))
        self.page.on("requestfinished", lambda request: self.loading.discard(request))
        self.page.on("requestfailed", lambda request: self.loading.discard(request))
        launched = time.monotonic()
        info: dict[str, Any] = {}
        start_timeout = float(self.config.get("start_timeout_ms") or 60000)
        await self.page.goto(self.config["start_url"], wait_until="load", timeout=start_timeout)
        source = self.config.get("source")
        if source == "miniwob":
            await self.page.wait_for_function("() => typeof core !== 'undefined' && typeof genProblem === 'function'",
                                              timeout=start_timeout)
            info = await self.page.evaluate(MINIWOB_INIT, {"seed": int(self.config.get("seed") or 0),
                                                           "mark": EPISODE_MARK, "token": self.token})
            await self.page.wait_for_function("() => WOB_TASK_READY === true", timeout=start_timeout)
            # The problem's markup loads files of its own (social-media's icons are CSS images): an
            # element whose image is not there yet has no box and no ref, so the first snapshot's refs
            # would differ from a run where it came in time.
            try:
                await asyncio.wait_for(self.page.evaluate(CSS_IMAGES), start_timeout / 1000)
            except asyncio.TimeoutError:
                raise TimeoutError(f"the task page's images did not load in {start_timeout:.0f} ms") from None
            if not await self.quiet(start_timeout):
                raise TimeoutError(f"the task page's files did not finish loading in {start_timeout:.0f} ms: "
                                   f"{', '.join(sorted(r.url for r in self.loading))}")
        self.started = True
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
        if self.pages is not None:
            self.pages.shutdown()

    def _gone(self, why: str) -> None:
        sys.stderr.write(f"trajplatform-browser: {why}; exiting\n")
        sys.stderr.flush()
        os._exit(BROWSER_GONE_EXIT)

    async def _route(self, route: Any) -> None:
        request = route.request
        navigation = request.is_navigation_request()
        if allowed(request.url, self.origins) and not (navigation and self.single_page and self.started):
            await route.continue_()
            return
        if navigation:  # "204 No Content": the browser stays on its page (no error page is committed)
            self.refused.append(request.url)
            await route.fulfill(status=204, body="")
        else:
            if len(self.blocked_loads) < 50:
                self.blocked_loads.append(request.url)
            await route.abort("blockedbyclient")

    async def _on_popup(self, page: Any) -> None:
        """A new window (target=_blank, window.open): the agent has one page; close it."""
        if page is not self.page:
            self.refused.append(page.url or "a new window")
            await page.close()

    def _on_console(self, message: Any) -> None:
        """A CSP refusal after the start: script put into the page (loading, the pages' own libraries
        refuse themselves a test handler: jQuery 1.12's support check)."""
        text = str(message.text or "")
        if self.started and "Content Security Policy" in text and "script-src" in text and len(self.blocked_scripts) < 50:
            self.blocked_scripts.append(text[:300])

    async def page_facts(self) -> dict[str, Any]:
        """What the verifier needs to trust the page's own reward: the page is the task's start
        page, still the document the platform started (its token), and nothing was injected."""
        url = self.page.url
        start = urlsplit(self.config.get("start_url") or "")
        here = urlsplit(url)
        try:
            marked = await self.page.evaluate("(mark) => window[mark] || null", EPISODE_MARK)
        except Exception:  # noqa: BLE001 - a page that cannot answer is not the started one
            marked = None
        return {"url": url, "task_page": (here.scheme, here.netloc, here.path) == (start.scheme, start.netloc, start.path),
                "started_page": marked == self.token if self.config.get("source") == "miniwob" else None,
                "refused": self.refused[-20:], "blocked_loads": self.blocked_loads[-20:],
                "blocked_scripts": list(self.blocked_scripts)}

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

    async def quiet(self, timeout_ms: float) -> bool:
        """Wait until the page has rendered a frame with none of its requests pending, twice in a row
        (a file that a frame's style or layout asks for, e.g. a CSS image, is requested during that
        frame); False when that did not happen within `timeout_ms` (a page held by a dialog too)."""
        async def calm() -> None:
            frames = 0
            while frames < 2:
                await self.page.evaluate(FRAMES)
                frames = 0 if self.loading else frames + 1
                if self.loading:
                    await asyncio.sleep(0.01)

        try:
            await asyncio.wait_for(calm(), timeout_ms / 1000)
        except asyncio.TimeoutError:
            return False
        return True

    async def settle(self, refused_before: int) -> None:
        try:
            await self.page.wait_for_load_state("load", timeout=3000)
        except Exception:  # noqa: BLE001 - a slow page is reported as it is
            pass
        if self.config.get("source") == "miniwob" and self.dialog is None:
            try:  # the files the action made the page ask for (an icon it shows): in its snapshot too
                await self.quiet(3000)
            except Exception:  # noqa: BLE001 - a slow page is reported as it is
                pass
        if not allowed(self.page.url, self.origins):  # the last resort: the route refuses before this
            left = self.page.url
            await self.page.go_back()
            raise PermissionError(f"the page went to {left}, outside this task's allowed origins; it was taken back")
        if len(self.refused) > refused_before:
            why = "this task is one page" if self.single_page else "this task does not allow it"
            raise PermissionError(f"the page tried to open {self.refused[refused_before]}: refused, {why}; the browser "
                                  f"stays on {self.page.url}")

    async def act(self, name: str, args: dict[str, Any]) -> str:
        if self.dialog is not None and name not in ("browser_handle_dialog", "browser_snapshot"):
            raise RuntimeError(f'a {self.dialog.type} dialog is open ("{self.dialog.message}"): '
                               "answer it with browser_handle_dialog first")
        self.last_action = {"tool": name}
        page = self.page
        refused_before = len(self.refused)
        one_page = (f"this task is one page ({self.config.get('start_url')}): navigation is refused, the page "
                    "stays as it is")
        if name == "browser_navigate":
            url = str(args.get("url") or "")
            if not allowed(url, self.origins):
                raise PermissionError(f"navigation to {url!r} is refused: this task allows only "
                                      f"{', '.join(self.origins) or 'its start page'}")
            if self.single_page:
                raise PermissionError(one_page)
            await page.goto(url, wait_until="load")
            done = f"Navigated to {url}"
        elif name == "browser_navigate_back":
            if self.single_page:
                raise PermissionError(one_page)
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
        await self.settle(refused_before)
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
    from fastmcp import FastMCP  # deferred: fastmcp (1.3 s import), sandbox server only
    from fastmcp.tools import Tool  # deferred: fastmcp (1.3 s import), sandbox server only
    from fastmcp.tools.base import ToolResult  # deferred: fastmcp (1.3 s import), sandbox server only

    browser = Browser(config)
    if config.get("source") == "site":
        import sites  # deferred: a sibling file, importable in the sandbox

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
                        facts = await browser.page_facts()  # of the page the agent left, before any goto
                        if arguments.get("url"):  # WebArena's program_html opens a target page first
                            if not allowed(arguments["url"], browser.origins):
                                raise PermissionError(f"{arguments['url']} is outside the task's allowed origins")
                            await browser.page.goto(arguments["url"], wait_until="load")
                        value = await browser.page.evaluate(str(arguments.get("expression") or "null"))
                        return ToolResult(content=json.dumps({"value": value, "page": facts}, default=str))
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
