"""The live web backend: ddgs (or SearXNG) search and page fetches, every response recorded for replay.

Search: `ddgs.DDGS().text(query, max_results=k)`, or the SearXNG JSON API at WEB_SEARXNG_URL
(operator configuration, like WEBHOOK_URL: its address is not checked). Fetch: http(s) only; the
URL's host is resolved and every address checked by the webhooks' SSRF policy
(trajplatform.webhooks: loopback, private, link-local, metadata, reserved ... refused unless
WEB_ALLOW_PRIVATE_TARGETS), then the request connects to the checked address (the host stays in
the Host header, SNI and certificate check), so a name re-resolving in between reaches nothing;
redirects are followed by hand, each hop checked the same way, at most MAX_REDIRECTS. Bodies are
capped at WEB_MAX_PAGE_BYTES, requests at WEB_FETCH_TIMEOUT_S (or the step's timeout if
shorter), and the worker sends at most WEB_RATE_PER_S requests a second. HTML is reduced to its
main text by trafilatura (the whole visible text by lxml when trafilatura finds no main
content; the record says which), links by lxml.

Records: every search and fetch — answers and refusals alike — becomes a record in the shape of
the MCP hub's (apps.engines.mcp.records: server "web", method "tools/call", tool "search" or
"fetch", canonical arguments and their sha256, one text block holding the JSON result, or
is_error with the message), put on the step as `web_calls`. With config `replay_of` the backend
answers from that trajectory's records through the same `Recording` and sends nothing; an
exchange it has no record for is an InfrastructureError, never a live request.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Iterable
from urllib.parse import urldefrag, urlencode, urljoin, urlsplit

from django.conf import settings

from apps.engines.mcp.records import CALL, McpReplayMiss, Recording, call_record, stored_trajectory
from apps.engines.runtime import InfrastructureError, ToolError
from apps.engines.web.corpus import Hit, Page, html_document, url_key
from trajplatform import webhooks

SERVER = "web"
MAX_REDIRECTS = 5
USER_AGENT = "trajplatform-web/1 (+research agent; respects rate limits)"
TEXT_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "text/markdown")


class _RateLimit:
    """At most `per_s` requests a second from this process (a shared minimum interval)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0

    def wait(self, per_s: float) -> None:
        if per_s <= 0:
            return
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next)
            self._next = at + 1.0 / per_s
        if at > now:
            time.sleep(at - now)


RATE = _RateLimit()


# --- search providers ---------------------------------------------------------------------------


def ddgs_search(query: str, k: int, timeout: float) -> list[dict[str, str]]:
    from ddgs import DDGS  # deferred: heavy (ddgs), only for this search provider
    from ddgs.exceptions import DDGSException  # deferred: with ddgs

    try:
        rows = DDGS(timeout=max(1, int(timeout))).text(query, max_results=k)
    except DDGSException as exc:
        raise InfrastructureError(f"web search failed: {exc}") from None
    return [{"url": r.get("href") or "", "title": r.get("title") or "", "snippet": r.get("body") or ""} for r in rows]


def searxng_search(query: str, k: int, timeout: float) -> list[dict[str, str]]:
    import httpx  # deferred: heavy (httpx), only when the live web is asked

    url = settings.WEB_SEARXNG_URL.rstrip("/") + "/search?" + urlencode({"q": query, "format": "json"})
    try:
        response = httpx.get(url, timeout=timeout, headers={"User-Agent": USER_AGENT})
        response.raise_for_status()
        rows = response.json().get("results") or []
    except (httpx.HTTPError, ValueError) as exc:
        raise InfrastructureError(f"web search failed ({settings.WEB_SEARXNG_URL}): {exc}") from None
    return [{"url": str(r.get("url") or ""), "title": str(r.get("title") or ""), "snippet": str(r.get("content") or "")}
            for r in rows[:k] if isinstance(r, dict)]


def default_searcher() -> Callable[[str, int, float], list[dict[str, str]]]:
    return searxng_search if settings.WEB_SEARXNG_URL else ddgs_search


# --- fetching ----------------------------------------------------------------------------------


def _checked_addresses(url: str) -> list[Any]:
    """The addresses `url`'s host resolves to, every one allowed (ToolError: the agent asked for it)."""
    try:
        addresses = webhooks.resolve_target(url, allow_private=True)
    except webhooks.WebhookTargetError as exc:
        raise ToolError(f"cannot fetch {url}: {exc}") from None
    if not settings.WEB_ALLOW_PRIVATE_TARGETS:
        for ip in addresses:
            if problem := webhooks._address_problem(ip):
                raise ToolError(f"refused: {urlsplit(url).hostname} resolves to {ip}, {problem}; the web tools "
                                "fetch public addresses only")
    return addresses


def _get_pinned(url: str, timeout: float, max_bytes: int) -> tuple[int, str, bytes, dict[str, str]]:
    """GET `url` from an address `_checked_addresses` allowed; (status, content type, body, headers)."""
    import httpx  # deferred: heavy (httpx), only when the live web is asked

    addresses = _checked_addresses(url)
    target = httpx.URL(url)
    extensions = {"sni_hostname": target.raw_host.decode("ascii")} if target.scheme == "https" else {}
    headers = {"Host": target.netloc.decode("ascii"), "User-Agent": USER_AGENT, "Accept": "text/html, text/plain;q=0.9"}
    error: Exception | None = None
    with httpx.Client(timeout=timeout, follow_redirects=False) as client:
        for ip in addresses:
            request = client.build_request("GET", target.copy_with(host=str(ip)), headers=headers, extensions=extensions)
            try:
                response = client.send(request, stream=True)
            except httpx.ConnectError as exc:
                error = exc
                continue
            except httpx.HTTPError as exc:
                raise ToolError(f"fetching {url} failed: {type(exc).__name__}: {exc}") from None
            try:
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise ToolError(f"{url} is larger than {max_bytes} bytes")
            except httpx.HTTPError as exc:
                raise ToolError(f"fetching {url} failed: {type(exc).__name__}: {exc}") from None
            finally:
                response.close()
            content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
            return response.status_code, content_type, bytes(body), dict(response.headers)
    raise ToolError(f"cannot connect to {url}: {error}")


def fetch_page(url: str, timeout: float) -> dict[str, Any]:
    """Fetch a page (redirects followed and checked) and extract its text and links."""
    url, _ = urldefrag(url.strip())
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise ToolError(f"cannot fetch {url!r}: only http(s) URLs")
    deadline = time.monotonic() + timeout
    current = url
    for _hop in range(MAX_REDIRECTS + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            raise ToolError(f"fetching {url} timed out")
        status, content_type, body, headers = _get_pinned(current, min(left, settings.WEB_FETCH_TIMEOUT_S),
                                                          settings.WEB_MAX_PAGE_BYTES)
        if status in (301, 302, 303, 307, 308) and headers.get("location"):
            current = urldefrag(urljoin(current, headers["location"]))[0]
            if urlsplit(current).scheme.lower() not in ("http", "https"):
                raise ToolError(f"{url} redirects to {current!r}, not an http(s) URL")
            continue
        if status >= 400:
            raise ToolError(f"{current} answered HTTP {status}")
        if content_type and content_type not in TEXT_TYPES:
            raise ToolError(f"{current} is {content_type}, not a text page")
        return extract(current, body, content_type)
    raise ToolError(f"{url}: more than {MAX_REDIRECTS} redirects")


def extract(url: str, body: bytes, content_type: str) -> dict[str, Any]:
    """A fetched page as {url, title, text, links, extractor}."""
    if content_type in ("text/plain", "text/markdown"):
        text = body.decode("utf-8", "replace")
        return {"url": url, "title": (text.strip().splitlines() or [url])[0][:200], "text": text, "links": [],
                "extractor": "plain"}
    import trafilatura  # deferred: heavy (trafilatura), only to extract a fetched page

    doc = html_document(body, url, source="live")
    if doc is None:
        raise ToolError(f"{url}: the page could not be parsed as HTML")
    main = trafilatura.extract(body.decode("utf-8", "replace"), url=url, include_tables=True, favor_recall=True)
    links, seen = [], set()
    for anchor, href in doc.links:
        target = urldefrag(urljoin(url, href))[0]
        if urlsplit(target).scheme in ("http", "https") and target not in seen and target != url:
            seen.add(target)
            links.append([anchor, target])
    return {"url": url, "title": doc.title, "text": main or doc.text, "links": links,
            "extractor": "trafilatura" if main else "lxml"}


# --- the backend -------------------------------------------------------------------------------


def web_records(steps: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live-web records on recorded steps, in order."""
    return [r for step in steps or [] for r in (step.get("web_calls") or [])]


def _recording_of(trajectory_uuid: str) -> Recording:
    row = stored_trajectory(trajectory_uuid)
    source = f"trajectory {trajectory_uuid}"
    if row is None:
        raise InfrastructureError(f"replay_of names no stored trajectory: {trajectory_uuid}")
    return Recording(web_records(row["steps"]), source=source)


class LiveBackend:
    """The live web for one episode: requests (or a replay), the pages fetched, the records to put on steps."""

    name = "live"

    def __init__(self, *, searcher: Callable[[str, int, float], list[dict[str, str]]] | None = None,
                 fetcher: Callable[[str, float], dict[str, Any]] = fetch_page, recording: Recording | None = None,
                 known: Iterable[dict[str, Any]] = ()):
        self.searcher = searcher or default_searcher()
        self.fetcher = fetcher
        self.recording = recording
        self.records: list[dict[str, Any]] = []
        self.pages: dict[str, Page] = {}
        for record in known:
            if record.get("tool") == "fetch" and not record.get("is_error"):
                self._remember(_payload(record))

    @classmethod
    def for_config(cls, config: dict[str, Any], *, steps: Iterable[dict[str, Any]] = ()) -> "LiveBackend":
        replay_of = config.get("replay_of")
        return cls(recording=_recording_of(str(replay_of)) if replay_of else None, known=web_records(steps))

    @property
    def replaying(self) -> bool:
        return self.recording is not None

    def _exchange(self, tool: str, arguments: dict[str, Any], live: Callable[[], Any]) -> Any:
        """One recorded exchange: the replayed record, or a live call recorded (errors too)."""
        if self.recording is not None:
            try:
                record = self.recording.take(SERVER, CALL, tool, arguments)
            except McpReplayMiss as exc:
                raise InfrastructureError(str(exc)) from None
            self.records.append(record)
            if record.get("is_error"):
                raise ToolError(record.get("error") or "error")
            return _payload(record)
        record = call_record(SERVER, tool, arguments, platform=False)
        started = time.monotonic()
        RATE.wait(settings.WEB_RATE_PER_S)
        try:
            result = live()
        except ToolError as exc:
            self.records.append({**record, "is_error": True, "error": str(exc), "content": [],
                                 "duration_ms": int((time.monotonic() - started) * 1000)})
            raise
        self.records.append({**record, "is_error": False, "duration_ms": int((time.monotonic() - started) * 1000),
                             "content": [{"type": "text", "text": json.dumps(result, ensure_ascii=False)}]})
        return result

    def search(self, query: str, k: int, *, timeout: float | None) -> list[Hit]:
        wait = min(timeout or settings.WEB_FETCH_TIMEOUT_S, settings.WEB_FETCH_TIMEOUT_S)
        rows = self._exchange("search", {"query": query, "k": k}, lambda: self.searcher(query, k, wait))
        return [Hit(rank=i, url=r["url"], title=r["title"], snippet=" ".join(r["snippet"].split())[:300])
                for i, r in enumerate(rows, 1)]

    def page(self, url: str, *, timeout: float | None) -> Page | None:
        known = self.known_page(url)
        if known is not None:
            return known  # fetched once per episode: reading on (another offset) makes no request
        wait = min(timeout or settings.WEB_FETCH_TIMEOUT_S, settings.WEB_FETCH_TIMEOUT_S)
        fetched = self._exchange("fetch", {"url": url}, lambda: self.fetcher(url, wait))
        page = self._remember(fetched)
        self.pages.setdefault(url_key(url), page)  # the URL asked for, when a redirect moved it
        return page

    def known_page(self, url: str) -> Page | None:
        return self.pages.get(url_key(url))

    def _remember(self, fetched: dict[str, Any]) -> Page:
        page = Page(url=fetched["url"], title=fetched["title"], text=fetched["text"],
                    links=[tuple(link) for link in fetched.get("links") or []])
        self.pages[url_key(page.url)] = page
        return page

    def take_records(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records


def _payload(record: dict[str, Any]) -> Any:
    blocks = record.get("content") or []
    return json.loads(blocks[0]["text"]) if blocks else None
