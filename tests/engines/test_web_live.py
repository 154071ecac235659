"""The live web backend against a loopback fake search engine (SearXNG's JSON API) and page server:
extraction, redirects, limits, the private-address refusal, records, and a replay that sends nothing."""
from __future__ import annotations

import json
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from apps.engines.llm import cache_identity
from apps.engines.mcp import records as mcp_records
from apps.engines.mcp.records import Recording
from apps.engines.offline_model import running_offline_model
from apps.engines.runtime import InfrastructureError, SetupError, ToolError
from apps.engines.web import live as L
from apps.engines.web.toolset import WebToolset, web_toolset
from apps.tasks.selectors import trajectory_replay_record
from tests.engines.test_agent import call, client, config_for, llm_env, run  # noqa: F401 (fixture)
from trajplatform import webhooks

ARTICLE = """<html><head><title>The Analytical Engine</title></head><body>
<nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<article><h1>The Analytical Engine</h1>
<p>The Analytical Engine was a proposed mechanical general-purpose computer designed by Charles Babbage.
It was first described in 1837 as the successor to the Difference Engine.</p>
<p>Ada Lovelace wrote the first algorithm intended for it; see <a href="/lovelace.html#notes">her notes</a>
and <a href="https://elsewhere.example/engine">another page</a>.</p>
<p>The engine had an arithmetic logic unit, control flow with conditional branching and loops, and memory.</p>
</article><footer>Copyright nobody</footer></body></html>"""


class FakeWeb(BaseHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "text/html; charset=utf-8", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        FakeWeb.hits.append(self.path)
        port = self.server.server_address[1]
        parts = urlsplit(self.path)
        if parts.path == "/search":
            query = parse_qs(parts.query)["q"][0]
            results = [{"url": f"http://127.0.0.1:{port}/engine.html", "title": "The Analytical Engine",
                        "content": f"about {query}: Babbage's engine"},
                       {"url": f"http://127.0.0.1:{port}/lovelace.html", "title": "Ada Lovelace", "content": "notes"}]
            self._send(200, json.dumps({"results": results}).encode(), "application/json")
        elif parts.path == "/engine.html":
            self._send(200, ARTICLE.encode())
        elif parts.path == "/lovelace.html":
            self._send(200, b"<html><head><title>Ada Lovelace</title></head><body><p>Ada Lovelace, daughter of "
                            b"Lord Byron, wrote notes on the engine.</p></body></html>")
        elif parts.path == "/moved":
            self._send(302, b"", Location="/engine.html")
        elif parts.path == "/to-metadata":
            self._send(302, b"", Location="http://169.254.169.254/latest/meta-data/")
        elif parts.path == "/notes.txt":
            self._send(200, b"plain notes\nline two", "text/plain")
        elif parts.path == "/image.png":
            self._send(200, b"\x89PNG....", "image/png")
        elif parts.path == "/big.html":
            self._send(200, b"<p>" + b"x" * 5000 + b"</p>")
        else:
            self._send(404, b"not found")


@pytest.fixture
def fake_web(settings) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeWeb)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    FakeWeb.hits = []
    base = f"http://127.0.0.1:{server.server_address[1]}"
    settings.WEB_SEARXNG_URL = base
    settings.WEB_ALLOW_PRIVATE_TARGETS = True  # the loopback server; production refuses it
    settings.WEB_RATE_PER_S = 0
    try:
        yield base
    finally:
        server.shutdown()
        server.server_close()


def live_toolset() -> WebToolset:
    return web_toolset({"scene_config": {"web": {"backend": "live"}}})


def test_search_and_open_through_the_live_backend_are_recorded(fake_web):
    web = live_toolset()
    found = web.execute("search", {"query": "analytical engine", "k": 2}, timeout=5)
    assert found.extra["results"] == [
        {"rank": 1, "url": f"{fake_web}/engine.html", "title": "The Analytical Engine"},
        {"rank": 2, "url": f"{fake_web}/lovelace.html", "title": "Ada Lovelace"}]
    assert "about analytical engine" in found.output
    [record] = found.extra["web_calls"]
    assert record["server"] == "web" and record["tool"] == "search" and record["is_error"] is False
    assert json.loads(record["arguments"]) == {"k": 2, "query": "analytical engine"}

    opened = web.execute("open", {"url": f"{fake_web}/engine.html"}, timeout=5)
    assert "first described in 1837" in opened.output
    assert "Copyright nobody" not in opened.output  # trafilatura kept the article, not the footer
    assert f"— {fake_web}/lovelace.html" in opened.output and "https://elsewhere.example/engine" in opened.output
    [fetch] = opened.extra["web_calls"]
    assert fetch["tool"] == "fetch" and json.loads(fetch["content"][0]["text"])["extractor"] == "trafilatura"
    # reading on, finding in it and grading it make no new request
    hits = len(FakeWeb.hits)
    web.execute("open", {"url": f"{fake_web}/engine.html", "offset": 50}, timeout=5)
    web.execute("find", {"url": f"{fake_web}/engine.html", "pattern": "1837"}, timeout=5)
    assert "1837" in web.page_text(f"{fake_web}/engine.html")
    assert len(FakeWeb.hits) == hits
    assert web.page_text(f"{fake_web}/never-fetched.html") is None


def test_redirects_plain_text_and_refusals(fake_web):
    web = live_toolset()
    moved = web.execute("open", {"url": f"{fake_web}/moved"}, timeout=5)
    assert moved.extra["url"] == f"{fake_web}/engine.html"
    assert web.page_text(f"{fake_web}/moved") == web.page_text(f"{fake_web}/engine.html")
    assert "line two" in web.execute("open", {"url": f"{fake_web}/notes.txt"}, timeout=5).output
    with pytest.raises(ToolError, match="image/png, not a text page"):
        web.execute("open", {"url": f"{fake_web}/image.png"}, timeout=5)
    with pytest.raises(ToolError, match="HTTP 404"):
        web.execute("open", {"url": f"{fake_web}/missing"}, timeout=5)
    with pytest.raises(ToolError, match="only http"):
        web.execute("open", {"url": "file:///etc/passwd"}, timeout=5)


def test_a_page_over_the_size_limit_is_refused(fake_web, settings):
    settings.WEB_MAX_PAGE_BYTES = 1000
    with pytest.raises(ToolError, match="larger than 1000 bytes"):
        live_toolset().execute("open", {"url": f"{fake_web}/big.html"}, timeout=5)


@pytest.mark.parametrize("url, problem", [
    ("http://127.0.0.1:{port}/engine.html", "a loopback address"),
    ("http://10.1.2.3/", "a private address"),
    ("http://169.254.169.254/latest/meta-data/", "a cloud metadata service"),
    ("http://[::1]:{port}/engine.html", "a loopback address"),
    ("http://intranet.test/", "a private address"),
])
def test_private_addresses_are_refused_before_any_request(fake_web, settings, monkeypatch, url, problem):
    settings.WEB_ALLOW_PRIVATE_TARGETS = False
    real = webhooks._getaddrinfo

    def scripted(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "intranet.test":  # a public-looking name that resolves inside
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.168.7.7", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(webhooks, "_getaddrinfo", scripted)
    port = urlsplit(fake_web).port
    web = live_toolset()
    with pytest.raises(ToolError, match=f"refused: .*{problem}"):
        web.execute("open", {"url": url.format(port=port)}, timeout=5)
    assert FakeWeb.hits == []


def test_a_redirect_to_a_private_address_is_refused_at_the_hop(fake_web, settings, monkeypatch):
    # The loopback server stands for a public site: only its own address is allowed.
    original = webhooks._address_problem
    monkeypatch.setattr(webhooks, "_address_problem", lambda ip: None if str(ip) == "127.0.0.1" else original(ip))
    settings.WEB_ALLOW_PRIVATE_TARGETS = False
    with pytest.raises(ToolError, match="169.254.169.254, a cloud metadata service"):
        live_toolset().execute("open", {"url": f"{fake_web}/to-metadata"}, timeout=5)
    assert FakeWeb.hits == ["/to-metadata"]


def test_the_rate_limit_spaces_requests(fake_web, settings):
    import time

    settings.WEB_RATE_PER_S = 20.0
    web = live_toolset()
    started = time.monotonic()
    for i in range(4):
        web.execute("search", {"query": f"q{i}"}, timeout=5)
    assert time.monotonic() - started >= 3 / 20.0 - 0.01


def test_a_search_engine_failure_is_the_platforms(settings):
    settings.WEB_SEARXNG_URL = "http://127.0.0.1:9"  # nothing listens
    settings.WEB_RATE_PER_S = 0
    with pytest.raises(InfrastructureError, match="web search failed"):
        live_toolset().execute("search", {"query": "x"}, timeout=2)


def test_ddgs_is_the_default_search(settings, monkeypatch):
    settings.WEB_SEARXNG_URL = ""
    settings.WEB_RATE_PER_S = 0
    seen = {}

    class FakeDDGS:
        def __init__(self, timeout: int) -> None:
            seen["timeout"] = timeout

        def text(self, query: str, max_results: int) -> list[dict[str, str]]:
            seen["query"] = (query, max_results)
            return [{"title": "T", "href": "https://a.example/", "body": "B"}]

    import ddgs

    monkeypatch.setattr(ddgs, "DDGS", FakeDDGS)
    result = live_toolset().execute("search", {"query": "x", "k": 3}, timeout=7)
    assert seen == {"timeout": 7, "query": ("x", 3)}
    assert result.extra["results"] == [{"rank": 1, "url": "https://a.example/", "title": "T"}]


def test_replaying_the_records_makes_no_request(fake_web):
    web = live_toolset()
    steps = []
    for name, args in (("search", {"query": "engine"}), ("open", {"url": f"{fake_web}/engine.html"}),
                       ("open", {"url": f"{fake_web}/missing"})):
        try:
            steps.append({"tool": name, **web.execute(name, args, timeout=5).extra})
        except ToolError as exc:  # the failed exchange's record rides on the error, for the step
            steps.append({"tool": name, "error": str(exc), **exc.extra})
    assert steps[2]["web_calls"][0]["is_error"] is True
    hits = len(FakeWeb.hits)
    replay = WebToolset(L.LiveBackend(recording=Recording(L.web_records(steps), source="test")))
    assert replay.execute("search", {"query": "engine"}).extra["results"] == steps[0]["results"]
    assert replay.execute("open", {"url": f"{fake_web}/engine.html"}).extra["content_sha256"] == \
        steps[1]["content_sha256"]
    with pytest.raises(ToolError, match="HTTP 404"):
        replay.execute("open", {"url": f"{fake_web}/missing"})
    with pytest.raises(InfrastructureError, match="no recorded response for search"):
        replay.execute("search", {"query": "something new"})
    assert len(FakeWeb.hits) == hits


@pytest.mark.django_db(transaction=True)  # the tools run in worker threads, on their own connections
def test_a_deep_search_episode_on_the_live_web_replays_without_the_web(fake_web, llm_env, make_task):
    from apps.tasks.models import Trajectory

    prompt = "[live] When was the Analytical Engine first described?"
    scripts = [{"id": "live", "prompt": prompt, "reference_solution": [
        call("search", query="Analytical Engine"), call("open", url=f"{fake_web}/gone.html"),
        call("open", url=f"{fake_web}/engine.html"), call("finish", answer="1837", sources=[f"{fake_web}/engine.html"])]}]
    config = config_for(prompt, {"expected_answer": "1837", "web": {"backend": "live"}}, scene="deep_search")
    original = uuid.uuid4()
    with running_offline_model(scripts=scripts) as server:
        first = run(config, client(server.url), sandbox_backend=None, cache_key_extra=cache_identity(original))
        assert (first.outcome, first.reward) == ("success", 1.0), first.outcome_reason
        Trajectory.objects.create(uuid=original, task=make_task(scene="deep_search"), iteration=1,
                                  steps=first.steps, verifier_output=first.verifier_output)
        hits = len(FakeWeb.hits)
        again = run({**config, "replay_of": str(original)}, client(server.url), sandbox_backend=None)
    assert (again.outcome, again.reward) == ("success", 1.0), again.outcome_reason
    assert len(FakeWeb.hits) == hits
    assert first.steps[1]["error"].endswith("answered HTTP 404") and first.steps[1]["web_calls"][0]["is_error"]
    assert again.steps[1]["error"] == first.steps[1]["error"]  # the refusal replayed from its record
    assert [s.get("results") or s.get("content_sha256") for s in again.steps] == \
        [s.get("results") or s.get("content_sha256") for s in first.steps]


def test_replays_read_stored_trajectories_through_the_installed_reader() -> None:
    """The core imports no app: a replay's records come from the reader TasksConfig.ready installs."""
    recorded = {"server": "web", "method": "tools/call", "tool": "open", "args_sha256": "x", "content": []}
    stored = {"u-1": {"steps": [{"mcp_calls": [recorded], "web_calls": [recorded]}], "verifier_output": None}}
    previous = mcp_records.set_trajectory_reader(stored.get)
    try:
        assert Recording.of_trajectory("u-1").total == 1
        assert L._recording_of("u-1").total == 1
        with pytest.raises(InfrastructureError, match="names no stored trajectory: u-2"):
            L._recording_of("u-2")
        mcp_records.set_trajectory_reader(None)
        with pytest.raises(SetupError, match="no stored-trajectory reader is installed"):
            Recording.of_trajectory("u-1")
    finally:
        mcp_records.set_trajectory_reader(previous)
    assert previous is trajectory_replay_record
