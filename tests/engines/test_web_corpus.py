"""The offline web: corpus builds from each kind of input, link resolution, BM25, and the toolset.

`build_tiny_corpus(directory)` is shared with other scenes' tests (search2qa): a handful of pages
with cross-links, written as a directory of HTML + Markdown + text and a JSONL file.
"""
from __future__ import annotations

import atexit
import functools
import gzip
import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from apps.engines.runtime import InfrastructureError, ToolError
from apps.engines.web import corpus as C
from apps.engines.web import opened_urls, web_tools, web_toolset

TINY_LICENCES = [{"source": "tiny", "name": "tiny test web", "licence": "CC0-1.0"}]


def write_tiny_site(root: Path) -> Path:
    site = root / "site"
    (site / "people").mkdir(parents=True)
    (site / "people" / "lovelace.html").write_text(
        "<html><head><title>Ada Lovelace</title><script>var x = 'nope';</script></head><body>"
        "<nav>Home | About</nav>"
        "<p>Ada Lovelace (1815-1852) was the daughter of Lord Byron. She worked with "
        "<a href='babbage.html#engine'>Charles Babbage</a> on the Analytical Engine.</p>"
        "<p>The programming language <a href='/languages/ada.md'>Ada</a> is named after her.</p>"
        "<p>See also <a href='https://elsewhere.example/x'>an outside page</a>.</p></body></html>")
    (site / "people" / "babbage.html").write_text(
        "<html><head><title>Charles Babbage</title></head><body><p>Charles Babbage designed the "
        "Difference Engine and the Analytical Engine, mechanical computers.</p>"
        "<p>He corresponded with <a href='lovelace.html'>Ada Lovelace</a>.</p></body></html>")
    (site / "languages").mkdir()
    (site / "languages" / "ada.md").write_text(
        "# Ada (programming language)\n\nAda is a structured, statically typed language, first standardised in "
        "1983 (Ada 83). It is named after [Ada Lovelace](../people/lovelace.html).\n\nAda's tasks run concurrently.\n")
    (site / "notes.txt").write_text("Railway notes\n\nThe Tech Model Railroad Club built a layout with relays.\n")
    return site


def write_tiny_jsonl(root: Path) -> Path:
    path = root / "docs.jsonl"
    rows = [
        {"url": "https://wiki.example/TMRC", "title": "TMRC",
         "text": "The Tech Model Railroad Club at MIT is a wellspring of hacker culture. Its Signals and Power "
                 "subcommittee ran the relays.",
         "links": ["https://wiki.example/MIT", ["hacker", "https://wiki.example/Hacker"]]},
        {"url": "https://wiki.example/MIT", "title": "MIT",
         "text": "The Massachusetts Institute of Technology is a university in Cambridge, Massachusetts."},
        {"url": "https://wiki.example/Hacker", "title": "Hacker",
         "text": "A hacker enjoys exploring the details of programmable systems. Corrections to "
                 "<editor@wiki.example> or j.doe+jargon@mail.wiki.example.",
         "links": [["TMRC", "https://wiki.example/TMRC#history"]]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def build_tiny_corpus(directory: Path, name: str = "tiny") -> C.BuildReport:
    """Build the tiny corpus `name` into `directory` (site + JSONL: 7 pages)."""
    directory.mkdir(parents=True, exist_ok=True)
    docs = [*C.iter_directory(write_tiny_site(directory), "https://tiny.example/"),
            *C.iter_jsonl(write_tiny_jsonl(directory))]
    return C.build_corpus(name, docs, licences=TINY_LICENCES, path=directory / f"{name}.sqlite")


@functools.cache
def debian_corpus() -> C.BuildReport:
    """The Debian documentation corpus (APT_DEMO's packages, in APT_TEST), built once per test
    session into a temporary directory: about 5 s on an idle machine, several times that under load."""
    directory = Path(tempfile.mkdtemp(prefix="test-debian-corpus-"))
    atexit.register(shutil.rmtree, directory, True)
    return C.build_corpus("debian-docs", C.iter_debian(), licences=C.DEBIAN_LICENCES,
                          path=directory / "debian-docs.sqlite")


@pytest.fixture
def tiny_corpus(tmp_path, settings):
    settings.WEB_CORPUS_DIR = tmp_path / "corpora"
    report = build_tiny_corpus(settings.WEB_CORPUS_DIR)
    settings.WEB_CORPUS_DEFAULT = "tiny"
    return report


def test_it_builds_a_corpus_from_a_directory_and_a_jsonl_with_links_resolved(tiny_corpus):
    corpus = C.Corpus.named("tiny")
    assert tiny_corpus.pages == 7 and corpus.pages == 7
    assert tiny_corpus.sources == {"site": 4, "docs": 3}
    lovelace = corpus.page("https://tiny.example/people/lovelace.html")
    assert lovelace.title == "Ada Lovelace"
    assert "daughter of Lord Byron" in lovelace.text
    assert "var x" not in lovelace.text and "Home | About" not in lovelace.text  # script and nav dropped
    # relative, fragment and root-relative hrefs resolve to corpus URLs; the outside link is dropped
    assert lovelace.links == [("Charles Babbage", "https://tiny.example/people/babbage.html"),
                              ("Ada", "https://tiny.example/languages/ada.md")]
    ada = corpus.page("https://tiny.example/languages/ada.md")
    assert ada.title == "Ada (programming language)"
    assert ada.links == [("Ada Lovelace", "https://tiny.example/people/lovelace.html")]
    assert corpus.page("https://wiki.example/Hacker").links == [("TMRC", "https://wiki.example/TMRC")]
    assert corpus.page("https://tiny.example/notes.txt").title == "Railway notes"
    assert corpus.licences == TINY_LICENCES
    # personal e-mail addresses are not kept
    assert corpus.page("https://wiki.example/Hacker").text.endswith(
        "Corrections to <[e-mail removed]> or [e-mail removed].")
    assert tiny_corpus.emails_removed == 2 and corpus.meta["emails_removed"] == "2"


def test_page_lookup_ignores_fragments_and_trailing_slashes(tiny_corpus):
    corpus = C.Corpus.named("tiny")
    assert corpus.page("https://TINY.example/people/babbage.html#top").url == "https://tiny.example/people/babbage.html"
    assert corpus.page("https://wiki.example/MIT/").title == "MIT"
    assert corpus.page("https://tiny.example/nowhere.html") is None


def test_bm25_ranks_the_title_match_first(tiny_corpus):
    corpus = C.Corpus.named("tiny")
    hits = corpus.search("Charles Babbage", 5)
    assert hits[0].url == "https://tiny.example/people/babbage.html"
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert hits[0].url not in [h.url for h in hits[1:]]
    assert corpus.search("TMRC hacker culture", 3)[0].url == "https://wiki.example/TMRC"
    # stopwords do not drown the query; punctuation and quotes in it are no FTS5 syntax error
    assert corpus.search('what is "the" (language) named after Lovelace?', 3)[0].title in (
        "Ada Lovelace", "Ada (programming language)")
    assert corpus.search("zzzyxw", 3) == []


def test_a_rebuild_replaces_the_corpus_for_new_readers(tiny_corpus, settings):
    before = C.Corpus.named("tiny")
    time.sleep(0.01)
    C.build_corpus("tiny", [C.Document(url="https://x.example/a", title="Only", text="only page")],
                   licences=[], path=settings.WEB_CORPUS_DIR / "tiny.sqlite")
    after = C.Corpus.named("tiny")
    assert after is not before and after.pages == 1


def test_corpus_names_are_plain_identifiers(settings, tmp_path):
    settings.WEB_CORPUS_DIR = tmp_path
    with pytest.raises(C.CorpusError, match="must match"):
        C.corpus_path("../etc/passwd")
    with pytest.raises(C.CorpusError, match="not built"):
        C.Corpus.named("missing")


def test_a_dictd_dictionary_becomes_pages_with_normalised_cross_references(tmp_path):
    entries = [
        ("Ada Lovelace", "<person> The daughter of Lord Byron; worked with {Charles\n   Babbage}. The\n"
                         "   language {Ada} was named after her. See {Lovelace (http://x.example/)}."),
        ("Charles Babbage", "Designed {analytical engines}."),
        ("Ada", "A language named after {Ada Lovelace}."),
        ("analytical engine", "A mechanical computer."),
        ("ADA", "Another ADA, differing in case only."),
    ]
    blob, index = b"", []
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def enc(n: int) -> str:
        out = ""
        while True:
            out = b64[n % 64] + out
            n //= 64
            if not n:
                return out

    for head, body in entries:
        raw = f"{head}\n\n   {body}\n\n".encode()
        index.append(f"{head.lower()}\t{enc(len(blob))}\t{enc(len(raw))}")
        if head == "Ada Lovelace":
            index.append(f"lovelace\t{enc(len(blob))}\t{enc(len(raw))}")  # an alias head, same entry
        blob += raw
    (tmp_path / "mini.index").write_text("\n".join(sorted(index)) + "\n")
    with gzip.open(tmp_path / "mini.dict.dz", "wb") as fh:
        fh.write(blob)
    docs = list(C.iter_dictd("mini", "https://mini.example/", root=tmp_path))
    assert [d.url for d in docs] == ["https://mini.example/ada_lovelace", "https://mini.example/charles_babbage",
                                     "https://mini.example/ada", "https://mini.example/analytical_engine",
                                     "https://mini.example/ada_(2)"]
    report = C.build_corpus("mini", docs, licences=[], path=tmp_path / "mini.sqlite")
    corpus = C.Corpus(report.path)
    page = corpus.page("https://mini.example/ada_lovelace")
    # a wrapped cross-reference, a plain one, and one with a "(url)" tail resolving to an alias head
    assert page.links == [("Charles Babbage", "https://mini.example/charles_babbage"),
                          ("Ada", "https://mini.example/ada")]
    assert "Charles Babbage" in page.text and "{" not in page.text
    assert corpus.page("https://mini.example/charles_babbage").links == [
        ("analytical engines", "https://mini.example/analytical_engine")]  # plural resolves to the head


# --- the toolset ---------------------------------------------------------------------------------


def _config(**web):
    return {"scene": "deep_search", "scene_config": {"web": web} if web else {}}


def test_web_tools_are_openai_schemas():
    names = [t["function"]["name"] for t in web_tools()]
    assert names == ["search", "open", "find"]
    assert web_tools(["open"])[0]["function"]["parameters"]["required"] == ["url"]
    with pytest.raises(ValueError):
        web_tools(["browse_the_void"])


def test_search_open_find_over_the_default_corpus(tiny_corpus):
    web = web_toolset(_config())
    result = web.execute("search", {"query": "Charles Babbage", "k": 2}, timeout=5)
    assert result.output.splitlines()[0].startswith("1. Charles Babbage — https://tiny.example/people/babbage.html — ")
    assert result.extra["results"][0] == {"rank": 1, "url": "https://tiny.example/people/babbage.html",
                                          "title": "Charles Babbage"}
    assert len(result.extra["results"]) <= 2

    opened = web.execute("open", {"url": "https://tiny.example/people/lovelace.html"}, timeout=5)
    assert "daughter of Lord Byron" in opened.output
    assert "[1] Charles Babbage — https://tiny.example/people/babbage.html" in opened.output
    text = web.page_text("https://tiny.example/people/lovelace.html")
    assert opened.extra == {"url": "https://tiny.example/people/lovelace.html", "offset": 0,
                            "content_sha256": C.content_sha256(text)}
    assert web.page_text("https://tiny.example/missing.html") is None
    later = web.execute("open", {"url": "https://tiny.example/people/lovelace.html", "offset": 20}, timeout=5)
    assert text[20:60] in later.output and later.extra["offset"] == 20

    found = web.execute("find", {"url": "https://tiny.example/languages/ada.md", "pattern": "named after"}, timeout=5)
    line = found.extra["matches"][0]
    assert "named after" in line["line"]
    assert web.page_text("https://tiny.example/languages/ada.md")[line["offset"]:].startswith(line["line"][:20])
    assert found.output.startswith(f"offset {line['offset']}: ")


def test_agent_mistakes_are_tool_errors(tiny_corpus):
    web = web_toolset(_config(backend="corpus", corpus="tiny"))
    with pytest.raises(ToolError, match="no page at"):
        web.execute("open", {"url": "https://tiny.example/missing.html"})
    with pytest.raises(ToolError, match="not a regular expression"):
        web.execute("find", {"url": "https://wiki.example/MIT", "pattern": "(unclosed"})
    with pytest.raises(ToolError, match="past the end"):
        web.execute("open", {"url": "https://wiki.example/MIT", "offset": 10_000})
    with pytest.raises(ToolError, match="empty"):
        web.execute("search", {"query": "  "})


def test_a_missing_corpus_or_backend_is_the_platforms_error(settings, tmp_path):
    settings.WEB_CORPUS_DIR = tmp_path
    with pytest.raises(InfrastructureError, match="corpus_build"):
        web_toolset(_config(corpus="not-built"))
    with pytest.raises(InfrastructureError, match="unknown web backend"):
        web_toolset(_config(backend="carrier-pigeon"))


def test_opened_urls_are_the_successful_open_steps():
    steps = [
        {"tool": "search", "results": [{"url": "https://a.example/"}]},
        {"tool": "open", "url": "https://a.example/1", "offset": 0},
        {"tool": "open", "arguments": {"url": "https://a.example/2"}, "error": "no page at https://a.example/2"},
        {"tool": "find", "url": "https://a.example/3"},
    ]
    assert opened_urls(steps) == {"https://a.example/1"}
