"""The web toolset: search / open / find over a corpus (offline) or the live web, for any scene.

    tools = web_tools(("search", "open", "find"))          # OpenAI function schemas
    web = web_toolset(config)                              # config["scene_config"]["web"] picks the backend
    result = web.execute("search", {"query": "ada lovelace"}, timeout=30)   # a runtime.ToolResult
    web.page_text(url)                                     # the full text the agent could read
    opened_urls(steps)                                     # urls of an episode's successful opens

`scene_config.web`: {"backend": "corpus" | "live", "corpus": NAME (default WEB_CORPUS_DEFAULT)}.
Results (the step's `extra`): search -> {"results": [{rank, url, title}]}; open -> {"url",
"offset", "content_sha256"} (the hash of the whole page text); find -> {"url", "matches":
[{offset, line}]}; the live backend adds {"web_calls": [records]} (apps.engines.web.live).
A URL the backend does not have, or a pattern that is not a regular expression, is a ToolError:
the agent's mistake, told to it.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Protocol

import regex
from django.conf import settings

from apps.engines.llm import LLMError
from apps.engines.runtime import InfrastructureError, SetupError, ToolError, ToolResult, current_episode
from apps.engines.web.corpus import Corpus, CorpusError, Hit, Page, content_sha256
from apps.engines.web.live import LiveBackend

WINDOW_CHARS = 4000
MAX_LINKS = 40
MAX_K = 10
DEFAULT_K = 5
MAX_MATCHES = 20
FIND_TIMEOUT_S = 1.0
LINE_CHARS = 300

_SCHEMAS: dict[str, dict[str, Any]] = {
    "search": {
        "description": "Search the web. Returns numbered results: title — url — snippet.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "minLength": 1, "description": "what to look for"},
            "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "description": f"how many results (default {DEFAULT_K})"},
        }, "required": ["query"], "additionalProperties": False},
    },
    "open": {
        "description": f"Open a page: its text from `offset` ({WINDOW_CHARS} characters at a time) and its numbered "
                       "outgoing links.",
        "parameters": {"type": "object", "properties": {
            "url": {"type": "string", "minLength": 1},
            "offset": {"type": "integer", "minimum": 0, "description": "character offset to read from (default 0)"},
        }, "required": ["url"], "additionalProperties": False},
    },
    "find": {
        "description": "Find the lines of a page that match a regular expression (case-insensitive), with their "
                       "character offsets (to open the page there).",
        "parameters": {"type": "object", "properties": {
            "url": {"type": "string", "minLength": 1},
            "pattern": {"type": "string", "minLength": 1, "description": "a regular expression"},
        }, "required": ["url", "pattern"], "additionalProperties": False},
    },
    "browse": {
        "description": "Have a reader model read a whole page and answer a question about it (WebExplorer's browse). "
                       "Its answer can be wrong: check with open or find when it matters.",
        "parameters": {"type": "object", "properties": {
            "url": {"type": "string", "minLength": 1},
            "question": {"type": "string", "minLength": 1, "description": "what to look for on the page"},
        }, "required": ["url", "question"], "additionalProperties": False},
    },
}
TOOL_NAMES = ("search", "open", "find")  # the default set; "browse" is offered when a scene asks for it
BROWSE_CHARS = 60_000
BROWSE_MAX_TOKENS = 800
BROWSE_SYSTEM = ("You read one web page for a researcher and answer their question from the page alone: quote or "
                 "closely paraphrase what it says, name the facts that answer it, and say plainly when the page does "
                 "not answer it. Be brief.")


def web_tools(names: Iterable[str] = TOOL_NAMES) -> list[dict[str, Any]]:
    """The OpenAI function schemas of the named web tools."""
    tools = []
    for name in names:
        if name not in _SCHEMAS:
            raise ValueError(f"unknown web tool {name!r}; web tools: {', '.join(_SCHEMAS)}")
        tools.append({"type": "function", "function": {"name": name, **_SCHEMAS[name]}})
    return tools


class WebBackend(Protocol):
    """What the toolset needs of a backend. `calls` drains the records of live exchanges."""

    def search(self, query: str, k: int, *, timeout: float | None) -> list[Hit]: ...

    def page(self, url: str, *, timeout: float | None) -> Page | None: ...

    def known_page(self, url: str) -> Page | None:
        """The page if the backend has it without a request (corpus: any page; live: one fetched)."""

    def take_records(self) -> list[dict[str, Any]]: ...


class CorpusBackend:
    """The offline web: one built corpus, queried in the worker."""

    name = "corpus"

    def __init__(self, corpus: Corpus):
        self.corpus = corpus

    def search(self, query: str, k: int, *, timeout: float | None) -> list[Hit]:
        return self.corpus.search(query, k)

    def page(self, url: str, *, timeout: float | None) -> Page | None:
        return self.corpus.page(url)

    def known_page(self, url: str) -> Page | None:
        return self.corpus.page(url)

    def take_records(self) -> list[dict[str, Any]]:
        return []


def web_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The episode's `scene_config.web` with its defaults filled in."""
    web = dict(((config.get("scene_config") or {}).get("web")) or {})
    web.setdefault("backend", "corpus")
    if web["backend"] == "corpus":
        web.setdefault("corpus", settings.WEB_CORPUS_DEFAULT)
    return web


def check_web_config(config: dict[str, Any]) -> None:
    """SetupError when the episode's web settings cannot work (an unknown backend, a corpus that is
    not built): for a runtime's `tools()`, so the episode ends as a config error before its first
    turn. Touches no database (tools() runs on the event loop)."""
    web = web_settings(config)
    if web["backend"] == "corpus":
        try:
            Corpus.named(web["corpus"])
        except CorpusError as exc:
            raise SetupError(str(exc)) from None
    elif web["backend"] != "live":
        raise SetupError(f"unknown web backend {web['backend']!r} (corpus | live)")


def episode_toolset(config: dict[str, Any]) -> "WebToolset":
    """The running episode's toolset, made once per episode and kept in its state (a live backend
    keeps its rate limit and its recorded exchanges; sub-episodes in the same environment share it).
    Outside an episode (a test, a script) a toolset of its own."""
    try:
        state = current_episode().state
    except LookupError:
        return web_toolset(config)
    if "web" not in state:
        state["web"] = web_toolset(config)
    return state["web"]


def web_toolset(config: dict[str, Any], *, steps: Iterable[dict[str, Any]] = ()) -> "WebToolset":
    """The toolset an episode's config asks for (InfrastructureError when the corpus is not built).

    `steps`: recorded steps whose live exchanges it knows (page_text of a page fetched there)."""
    web = web_settings(config)
    backend = web["backend"]
    if backend == "corpus":
        try:
            return WebToolset(CorpusBackend(Corpus.named(web["corpus"])))
        except CorpusError as exc:
            raise InfrastructureError(str(exc)) from None
    if backend == "live":
        return WebToolset(LiveBackend.for_config(config, steps=steps))
    raise InfrastructureError(f"unknown web backend {backend!r} (corpus | live)")


class WebToolset:
    """search / open / find over one backend, formatted for the model, recorded on the step."""

    def __init__(self, backend: WebBackend):
        self.backend = backend

    def execute(self, name: str, args: dict[str, Any], *, timeout: float | None = None) -> ToolResult:
        started = time.monotonic()
        try:
            if name == "search":
                result = self._search(str(args.get("query") or ""), int(args.get("k") or DEFAULT_K), timeout)
            elif name == "open":
                result = self._open(str(args.get("url") or ""), int(args.get("offset") or 0), timeout)
            elif name == "find":
                result = self._find(str(args.get("url") or ""), str(args.get("pattern") or ""), timeout)
            elif name == "browse":
                result = self._browse(str(args.get("url") or ""), str(args.get("question") or ""), timeout)
            else:
                raise ToolError(f"unknown web tool {name!r}")
        except ToolError as exc:
            records = self.backend.take_records()  # a refused or failed fetch is replayed too
            if records:
                raise ToolError(str(exc), extra={**exc.extra, "web_calls": records}) from None
            raise
        result.duration_ms = int((time.monotonic() - started) * 1000)
        records = self.backend.take_records()
        if records:
            result.extra["web_calls"] = records
        return result

    def page_text(self, url: str) -> str | None:
        """The full text of a page as the agent could read it, without a new request (the corpus's
        page, or the live page fetched in this episode or in the `steps` given); None if unknown."""
        page = self.backend.known_page(url)
        return page.text if page is not None else None

    def _page(self, url: str, timeout: float | None) -> Page:
        if not url.strip():
            raise ToolError("url is empty")
        page = self.backend.page(url, timeout=timeout)
        if page is None:
            raise ToolError(f"no page at {url} (open a url from a search result or a page's links)")
        return page

    def _search(self, query: str, k: int, timeout: float | None) -> ToolResult:
        if not query.strip():
            raise ToolError("query is empty")
        hits = self.backend.search(query, max(1, min(k, MAX_K)), timeout=timeout)
        if not hits:
            output = f"no results for {query!r}"
        else:
            output = "\n".join(f"{h.rank}. {h.title} — {h.url} — {h.snippet}" for h in hits)
        return ToolResult(output=output, extra={"results": [{"rank": h.rank, "url": h.url, "title": h.title} for h in hits]})

    def _open(self, url: str, offset: int, timeout: float | None) -> ToolResult:
        page = self._page(url, timeout)
        text = page.text
        if offset < 0 or (offset >= len(text) and offset > 0):
            raise ToolError(f"offset {offset} is past the end of {page.url} ({len(text)} characters)")
        window = text[offset:offset + WINDOW_CHARS]
        end = offset + len(window)
        head = f"{page.title}\n{page.url}\n[characters {offset}-{end} of {len(text)}"
        head += f"; open with offset={end} for more]" if end < len(text) else "]"
        parts = [head, "", window]
        if page.links:
            shown = page.links[:MAX_LINKS]
            parts += ["", f"Links ({len(page.links)}):"]
            parts += [f"[{i}] {anchor or target} — {target}" for i, (anchor, target) in enumerate(shown, 1)]
            if len(page.links) > MAX_LINKS:
                parts.append(f"… {len(page.links) - MAX_LINKS} more links not shown")
        return ToolResult(output="\n".join(parts),
                          extra={"url": page.url, "offset": offset, "content_sha256": content_sha256(text)})

    def _find(self, url: str, pattern: str, timeout: float | None) -> ToolResult:
        try:
            compiled = regex.compile(pattern, regex.IGNORECASE)
        except regex.error as exc:
            raise ToolError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        page = self._page(url, timeout)
        matches: list[dict[str, Any]] = []
        offset = 0
        try:
            for line in page.text.split("\n"):
                if compiled.search(line, timeout=FIND_TIMEOUT_S):
                    matches.append({"offset": offset, "line": line[:LINE_CHARS]})
                    if len(matches) >= MAX_MATCHES:
                        break
                offset += len(line) + 1
        except TimeoutError:
            raise ToolError(f"pattern {pattern!r} took too long on {page.url}; use a simpler one") from None
        if not matches:
            output = f"no line of {page.url} matches {pattern!r}"
        else:
            output = "\n".join(f"offset {m['offset']}: {m['line']}" for m in matches)
        return ToolResult(output=output, extra={"url": page.url, "matches": matches})


    def _browse(self, url: str, question: str, timeout: float | None) -> ToolResult:
        """A second model call reads the page (its first BROWSE_CHARS characters) and answers `question`.

        The reader's prompt starts with a key line `[web/browse url=<page url>] <question>` (the
        offline model's content scripts match it); its tokens and cost are the episode's
        (`count_model_call`) and are kept on the step under `browse`."""
        if not question.strip():
            raise ToolError("question is empty")
        page = self._page(url, timeout)
        try:
            ctx = current_episode()
        except LookupError:
            raise InfrastructureError("browse reads the page with the episode's model: it runs inside an episode") from None
        text = page.text[:BROWSE_CHARS]
        cut = f"\n[the page goes on: {len(page.text) - BROWSE_CHARS} more characters not shown]" if len(page.text) > BROWSE_CHARS else ""
        messages = [{"role": "system", "content": BROWSE_SYSTEM},
                    {"role": "user", "content": f"[web/browse url={page.url}] {question}\n\n{page.title}\n{page.url}\n\n{text}{cut}"}]
        trajectory = getattr(ctx.trajectory, "uuid", "") or ""
        try:
            chat = ctx.llm.chat(messages, model=ctx.config.get("model") or None, temperature=0.0,
                                max_tokens=BROWSE_MAX_TOKENS, timeout=timeout,
                                # one reading per trajectory, step and page: a retried episode replays it
                                cache_key_extra={"web_browse": str(trajectory), "label": ctx.label, "step": len(ctx.steps)})
        except LLMError as exc:
            raise InfrastructureError(f"the page reader's model failed: {type(exc).__name__}: {exc}") from None
        ctx.count_model_call(chat)
        answer = (chat.content or "").strip() or "(the reader gave no answer)"
        return ToolResult(output=f"{page.title}\n{page.url}\n\n{answer}", extra={
            "url": page.url, "content_sha256": content_sha256(page.text), "browse": {
                "question": question, "model": chat.model, "provider": chat.provider, "usage": dict(chat.usage),
                "cost_usd": str(chat.cost_usd), "latency_ms": chat.latency_ms, "cached": chat.cached,
                "chars_read": len(text)}})


READ_TOOLS = ("open", "browse")


def opened_urls(steps: Iterable[dict[str, Any]]) -> set[str]:
    """The URLs an episode successfully read (its `open` and `browse` steps without an error)."""
    return {step["url"] for step in steps or []
            if step.get("tool") in READ_TOOLS and not step.get("error") and isinstance(step.get("url"), str)}
