"""The offline web: a read-only SQLite FTS5 (BM25) index over a document collection.

One corpus is one SQLite file, `<WEB_CORPUS_DIR>/<name>.sqlite`:

    page(id, url UNIQUE, key UNIQUE, title, text, links JSON [[anchor, url], ...], source)
    page_fts  fts5(title, text, content='page', tokenize='porter unicode61')   # BM25, title x5
    meta(key, value)    name, built_at, pages, sources, licences (JSON: one entry per source)

Inputs (`build_corpus(name, documents, licences)`; `manage.py corpus_build NAME --from ...`):
`iter_directory(path, base_url)` (HTML, Markdown, text), `iter_jsonl(path)` ({url, title, text,
links?}) and `iter_debian()` — the Debian documentation packages python3.11-doc (its HTML, under
https://docs.python.org/3.11/), dict-foldoc and dict-jargon (dictd entries under
https://foldoc.example/<head> and https://jargon.example/<head>). Links are resolved after every
document is read: relative hrefs against the page's URL, fragments dropped, dictionary
cross-references `{Charles\n   Babbage}` by their head (lowercased, whitespace collapsed); links
that leave the corpus are dropped (the corpus backend cannot open them). URLs are stable: the
same inputs give the same URLs, so scripts and recorded answers stay valid across rebuilds.

Queries (`Corpus.search`) run in the worker over an `immutable=1` read-only connection: the
query's words (stopwords dropped) become an OR of FTS5 strings, ranked by bm25 with a title
weight; snippets come from the top hits only. A build writes a temporary file (in a fresh private
directory beside the corpus) and renames it into place, so readers never see half a corpus.
"""
from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import re
import shutil
import sqlite3
import stat
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import quote, urldefrag, urljoin, urlsplit, urlunsplit

from django.conf import settings

SCHEMA_VERSION = 1
TITLE_WEIGHT = 5.0
SNIPPET_CHARS = 240
MAX_QUERY_TERMS = 16
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# Words too common to rank by; each one costs a walk through most of the index.
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were which who with"
    " what when where how why does did do".split()
)
_WORD_RE = re.compile(r"\w+", re.UNICODE)
# Personal e-mail addresses in documents (FOLDOC's 1990s contributors, ...) are not kept: episodes'
# observations, and the training data made of them, should not carry them.
EMAIL_RE = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
EMAIL_REMOVED = "[e-mail removed]"


class CorpusError(Exception):
    """A corpus cannot be built or opened (the message says which and why)."""


@dataclass
class Document:
    """One page of the corpus before its links are resolved. `links`: [(anchor, href)]."""

    url: str
    title: str
    text: str
    links: list[tuple[str, str]] = field(default_factory=list)
    source: str = ""
    # Names other documents' cross-references use for this page (dictionary heads).
    aliases: tuple[str, ...] = ()


@dataclass
class Hit:
    rank: int
    url: str
    title: str
    snippet: str


@dataclass
class Page:
    url: str
    title: str
    text: str
    links: list[tuple[str, str]]


@dataclass
class BuildReport:
    name: str
    path: Path
    pages: int
    links: int
    dropped_links: int
    seconds: float
    bytes: int
    sources: dict[str, int]
    licences: list[dict[str, str]]
    emails_removed: int = 0
    skipped: list[str] = field(default_factory=list)  # "<path>: why" of input files left out

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "pages": self.pages, "links": self.links,
                "dropped_links": self.dropped_links, "seconds": round(self.seconds, 2), "bytes": self.bytes,
                "sources": self.sources, "licences": self.licences, "emails_removed": self.emails_removed,
                "skipped": self.skipped}


# --- names and URLs ------------------------------------------------------------------------------


def corpus_dir() -> Path:
    return Path(settings.WEB_CORPUS_DIR)


def corpus_path(name: str) -> Path:
    """The file of the corpus `name` (CorpusError for a name that is not a plain identifier)."""
    if not NAME_RE.match(name or ""):
        raise CorpusError(f"corpus name {name!r} must match {NAME_RE.pattern}")
    return corpus_dir() / f"{name}.sqlite"


def url_key(url: str) -> str:
    """The lookup key of a URL: no fragment, scheme and host lowercased, no trailing slash."""
    url, _ = urldefrag(url.strip())
    parts = urlsplit(url)
    path = parts.path.rstrip("/") or "/"
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def head_key(head: str) -> str:
    """A dictionary head as cross-references name it: lowercased, whitespace collapsed."""
    return " ".join(head.split()).lower()


def head_url(base: str, head: str) -> str:
    return base + quote(head_key(head).replace(" ", "_"), safe="()_-.,'+!*")


# --- inputs --------------------------------------------------------------------------------------

_SKIP_TAGS = ("script", "style", "noscript", "nav", "header", "footer")


def html_document(raw: bytes | str, url: str, *, source: str, select: str | None = None) -> Document | None:
    """A Document from an HTML page (lxml): its title, visible text and <a href> links.

    `select`: an XPath for the main content (the rest — navigation, sidebars — is left out)."""
    import lxml.html  # deferred: heavy (lxml), only to parse a page

    try:
        root = lxml.html.fromstring(raw)
    except (ValueError, lxml.etree.ParserError):
        return None
    title = " ".join((root.findtext(".//title") or "").split())
    body = root
    if select:
        found = root.xpath(select)
        if found:
            body = found[0]
    for bad in body.xpath("|".join(f".//{t}" for t in _SKIP_TAGS) + "|.//a[@class='headerlink']"):
        bad.drop_tree()  # headerlink: Sphinx's "¶" anchors
    links = []
    for a in body.iter("a"):
        href = a.get("href")
        if href and not href.startswith(("javascript:", "mailto:")):
            links.append((" ".join(a.text_content().split()), href))
    for br in body.iter("br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "pre"):
        br.tail = "\n" + (br.tail or "")
    text = _clean_text(body.text_content())
    if not title:
        first = next((line for line in text.splitlines() if line.strip()), "")
        title = first[:200]
    return Document(url=url, title=title, text=text, links=links, source=source)


def _clean_text(text: str) -> str:
    """Blank runs collapsed, trailing space cut; a line's indentation kept (code stays readable)."""
    lines = []
    for line in text.replace("\r", "").expandtabs(4).split("\n"):
        words = " ".join(line.split())
        lines.append(" " * min(len(line) - len(line.lstrip()), 24) + words if words else "")
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


_MD_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_document(text: str, url: str, *, source: str) -> Document:
    heading = re.search(r"^#\s+(.+)$", text, re.M)
    title = heading.group(1).strip() if heading else (text.strip().splitlines() or [url])[0][:200]
    links = [(m.group(1), m.group(2)) for m in _MD_LINK.finditer(text)]
    return Document(url=url, title=title, text=_clean_text(_MD_LINK.sub(r"\1", text)), links=links, source=source)


def max_file_bytes() -> int:
    return int(settings.WEB_CORPUS_MAX_FILE_BYTES)


def display_name(path: str) -> str:
    """A file name as a report shows it: bytes that are not UTF-8 as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


_DIRECTORY_SUFFIXES = (".html", ".htm", ".md", ".markdown", ".txt")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _read_capped(name: str, dir_fd: int, cap: int) -> bytes:
    """The bytes of the regular file `name` in `dir_fd`, never through a symbolic link (O_NOFOLLOW,
    no race between a check and the open), at most `cap` of them; ValueError says why not."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("a symbolic link (not followed)") from None
        raise ValueError(f"cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > cap:
            raise ValueError(f"{st.st_size} bytes, over WEB_CORPUS_MAX_FILE_BYTES ({cap})")
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= cap:  # the file may grow while it is read: never more than cap + 1 bytes
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise ValueError(f"grew over WEB_CORPUS_MAX_FILE_BYTES ({cap}) while read")
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _directory_document(raw: bytes, rel: str, url: str, source: str) -> Document | None:
    suffix = os.path.splitext(rel)[1].lower()
    if suffix in (".html", ".htm"):
        return html_document(raw, url, source=source)
    text = raw.decode("utf-8", "replace")
    if suffix in (".md", ".markdown"):
        return markdown_document(text, url, source=source)
    text = _clean_text(text)
    stem = os.path.splitext(os.path.basename(rel))[0]
    return Document(url=url, title=(text.splitlines() or [stem])[0][:200], text=text, source=source)


def iter_directory(path: str | Path, base_url: str, *, source: str = "",
                   skipped: list[str] | None = None) -> Iterator[Document]:
    """Every .html/.htm/.md/.markdown/.txt file under `path`, at `base_url` + its relative path.

    Only what is inside `path` is read: symbolic links (to files or directories) are not
    followed, nor are special files opened; a file over WEB_CORPUS_MAX_FILE_BYTES, a name that
    is not UTF-8 (a URL cannot carry it), an unreadable or unparseable file is left out and named
    in `skipped` ("<path>: why"), and the rest is read."""
    root = Path(path)
    if not root.is_dir():
        raise CorpusError(f"{root} is not a directory")
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    source = source or root.name
    top = root.resolve()  # the directory named may itself be a link; nothing under it is followed
    cap = max_file_bytes()
    skips = skipped if skipped is not None else []
    found: list[tuple[tuple[str, ...], Document]] = []

    def skip(rel: str, why: str) -> None:
        skips.append(f"{display_name(os.path.join(root, rel))}: {why}")

    # fwalk: every directory is opened by a file descriptor relative to its parent's, never
    # through a link (follow_symlinks=False), and every file relative to its directory's.
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(top, follow_symlinks=False):
        here = os.path.relpath(dirpath, top)
        here = "" if here == "." else here
        for name in sorted(dirnames):
            rel = os.path.join(here, name)
            try:
                is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                is_link = False
            if is_link or not _utf8(name):
                dirnames.remove(name)
                skip(rel, "a symbolic link to a directory (not followed)" if is_link
                     else "a directory name that is not UTF-8 (left out with everything in it)")
        for name in sorted(filenames):
            rel = os.path.join(here, name)
            if not rel.lower().endswith(_DIRECTORY_SUFFIXES):
                continue
            if not _utf8(name):
                skip(rel, "a file name that is not UTF-8")
                continue
            try:
                raw = _read_capped(name, dir_fd, cap)
            except ValueError as exc:
                skip(rel, str(exc))
                continue
            doc = _directory_document(raw, rel, base_url + quote(Path(rel).as_posix()), source)
            if doc is None:
                skip(rel, "empty, or not parseable as HTML")
            elif doc.text:
                found.append((Path(rel).parts, doc))
    found.sort(key=lambda item: item[0])
    for _, doc in found:
        yield doc


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's surrogate escapes of bytes that are not UTF-8
        return False
    return True


def iter_jsonl(path: str | Path, *, source: str = "") -> Iterator[Document]:
    """Documents from a JSONL file: one {"url", "title", "text", "links"?: [url | [anchor, url]]} a line."""
    path = Path(path)
    source = source or path.stem
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("url"), str) or not isinstance(row.get("text"), str):
                raise CorpusError(f"{path}:{n}: a document needs a string url and text")
            links = []
            for link in row.get("links") or []:
                if isinstance(link, str):
                    links.append(("", link))
                elif isinstance(link, (list, tuple)) and len(link) == 2:
                    links.append((str(link[0]), str(link[1])))
                else:
                    raise CorpusError(f"{path}:{n}: a link is a URL or [anchor, url]")
            yield Document(url=row["url"], title=str(row.get("title") or row["url"]), text=row["text"],
                           links=links, source=str(row.get("source") or source))


# Debian documentation packages (make demo / APT_TEST install them).
PYTHON_DOC_DIR = Path("/usr/share/doc/python3.11/html")
PYTHON_DOC_BASE = "https://docs.python.org/3.11/"
DICTD_DIR = Path("/usr/share/dictd")
DICTIONARIES = {"foldoc": "https://foldoc.example/", "jargon": "https://jargon.example/"}
DEBIAN_LICENCES = [
    {"source": "python3.11-doc", "name": "Python 3.11 documentation", "licence": "PSF-2.0",
     "copyright_file": "/usr/share/doc/python3.11-doc/copyright",
     "attribution": "Copyright Python Software Foundation; the Python documentation"},
    {"source": "foldoc", "name": "FOLDOC, the Free On-line Dictionary of Computing", "licence": "GFDL-1.1-or-later",
     "copyright_file": "/usr/share/doc/dict-foldoc/copyright",
     "attribution": "The Free On-line Dictionary of Computing, http://www.foldoc.org/, Editor Denis Howe"},
    {"source": "jargon", "name": "The Jargon File", "licence": "public-domain",
     "copyright_file": "/usr/share/doc/dict-jargon/copyright",
     "attribution": "The on-line hacker Jargon File (Debian packaging GPL-2+)"},
]
# Sphinx pages that are indexes, not content.
_PYTHON_SKIP = re.compile(r"^(genindex.*|py-modindex|search|_.*|.*/_.*)\.html$|^_")
_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_XREF = re.compile(r"\{([^{}]{1,120})\}")


def _b64(text: str) -> int:
    n = 0
    for ch in text:
        n = n * 64 + _B64[ch]
    return n


def iter_python_doc(root: Path = PYTHON_DOC_DIR) -> Iterator[Document]:
    if not root.is_dir():
        raise CorpusError(f"{root} is missing: apt-get install python3.11-doc")
    for file in sorted(root.rglob("*.html")):
        rel = file.relative_to(root).as_posix()
        if _PYTHON_SKIP.match(rel):
            continue
        doc = html_document(file.read_bytes(), PYTHON_DOC_BASE + rel, source="python3.11-doc",
                            select="//div[@role='main']")
        if doc is not None and doc.text:
            doc.title = re.sub(r"\s+—\s+Python 3\.11.*$", "", doc.title)
            yield doc


def iter_dictd(name: str, base_url: str, root: Path = DICTD_DIR) -> Iterator[Document]:
    """The entries of a dictd dictionary (`<name>.index` + gzip'd `<name>.dict.dz`).

    Several index heads may point at one entry (aliases); the entry's page is at its first
    head, and `{cross references}` become links (resolved by head after the build)."""
    index, data = root / f"{name}.index", root / f"{name}.dict.dz"
    if not index.exists() or not data.exists():
        raise CorpusError(f"{index} is missing: apt-get install dict-{name}")
    blob = gzip.open(data).read()
    entries: dict[int, tuple[int, list[str]]] = {}
    for line in index.read_text("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        offset, length = _b64(parts[1]), _b64(parts[2])
        entries.setdefault(offset, (length, []))[1].append(parts[0])
    seen_urls: set[str] = set()
    for offset in sorted(entries):
        length, heads = entries[offset]
        raw = blob[offset:offset + length].decode("utf-8", "replace")
        lines = raw.strip("\n").split("\n")
        title = lines[0].strip() if lines else heads[0]
        if not title:
            continue
        url = head_url(base_url, title)
        n = 1
        while url in seen_urls:  # heads differing in case only ("ADA", "Ada"): numbered in index order
            n += 1
            url = head_url(base_url, title) + f"_({n})"
        seen_urls.add(url)
        body = textwrap.dedent("\n".join(lines[1:]))
        links = [(" ".join(m.group(1).split()), "xref:" + head_key(m.group(1))) for m in _XREF.finditer(body)]
        text = _clean_text(title + "\n" + _XREF.sub(lambda m: " ".join(m.group(1).split()), body))
        yield Document(url=url, title=title, text=text, links=links, source=name,
                       aliases=tuple(dict.fromkeys([head_key(title), *(head_key(h) for h in heads)])))


def iter_debian() -> Iterator[Document]:
    """The bundled Debian documentation: python3.11-doc, FOLDOC and the Jargon File."""
    yield from iter_python_doc()
    for name, base in DICTIONARIES.items():
        yield from iter_dictd(name, base)


# --- build ---------------------------------------------------------------------------------------

_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE page (id INTEGER PRIMARY KEY, url TEXT NOT NULL UNIQUE, key TEXT NOT NULL UNIQUE,
                   title TEXT NOT NULL, text TEXT NOT NULL, links TEXT NOT NULL, source TEXT NOT NULL);
CREATE VIRTUAL TABLE page_fts USING fts5(title, text, content='page', content_rowid='id',
                                         tokenize='porter unicode61');
"""


def _head_variants(head: str) -> Iterator[str]:
    """A cross-reference's head, then without a trailing "(url)", then singular ("{protocols}")."""
    yield head
    bare = re.sub(r"\s*\([^)]*\)$", "", head)
    if bare != head:
        yield bare
    for plural, singular in (("ies", "y"), ("es", ""), ("s", "")):
        if bare.endswith(plural) and len(bare) > len(plural) + 1:
            yield bare[: -len(plural)] + singular


def _resolve_links(docs: list[Document]) -> tuple[int, int]:
    """Resolve every document's links to corpus URLs in place; (kept, dropped)."""
    by_key = {url_key(d.url): d.url for d in docs}
    by_head: dict[tuple[str, str], str] = {}
    by_any_head: dict[str, str] = {}
    for d in docs:
        for alias in d.aliases:
            by_head.setdefault((d.source, alias), d.url)
            by_any_head.setdefault(alias, d.url)
    kept = dropped = 0
    for d in docs:
        resolved: list[tuple[str, str]] = []
        seen: set[str] = set()
        for anchor, href in d.links:
            if href.startswith("xref:"):
                target = None
                for head in _head_variants(href[5:]):
                    target = by_head.get((d.source, head)) or by_any_head.get(head)
                    if target:
                        break
            else:
                target = by_key.get(url_key(urljoin(d.url, href)))
            if target is None or target == d.url or target in seen:
                dropped += target is None
                continue
            seen.add(target)
            resolved.append((anchor, target))
        d.links = resolved
        kept += len(resolved)
    return kept, dropped


def build_corpus(name: str, documents: Iterable[Document], *, licences: list[dict[str, str]],
                 path: Path | None = None, keep_emails: bool = False, skipped: list[str] | None = None,
                 publish: Callable[[Path, BuildReport], None] | None = None) -> BuildReport:
    """Write the corpus `name` from `documents` (replacing an older build atomically); e-mail
    addresses in titles and texts become EMAIL_REMOVED unless `keep_emails`. `skipped`: the
    inputs' list of files left out (iter_directory's), carried into the report.

    The corpus is written to a temporary file; `publish(tmp, report)` (default: rename it to
    `path`) must put it in place, and whatever it raises leaves the older build untouched and
    the temporary file removed: nothing half-built is ever at `path`."""
    started = time.monotonic()
    path = path or corpus_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    docs: list[Document] = []
    seen: set[str] = set()
    for doc in documents:
        key = url_key(doc.url)
        if key in seen:
            continue  # first wins: a stable choice for duplicate URLs
        seen.add(key)
        docs.append(doc)
    if not docs:
        raise CorpusError(f"corpus {name}: no documents")
    kept, dropped = _resolve_links(docs)
    emails = 0
    if not keep_emails:
        for d in docs:
            d.text, n = EMAIL_RE.subn(EMAIL_REMOVED, d.text)
            d.title, m = EMAIL_RE.subn(EMAIL_REMOVED, d.title)
            emails += n + m
    # A fresh directory of ours (mkdtemp: an unpredictable name, mode 0700) next to `path`: no one
    # can plant a link at the temporary file's name, and the rename stays on one filesystem.
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp = staging / path.name
    sources: dict[str, int] = {}
    try:
        db = sqlite3.connect(tmp)
        db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + _DDL)
        rows = []
        for i, d in enumerate(docs, 1):
            sources[d.source] = sources.get(d.source, 0) + 1
            rows.append((i, d.url, url_key(d.url), d.title, d.text,
                         json.dumps(d.links, ensure_ascii=False), d.source))
        db.executemany("INSERT INTO page VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        db.execute("INSERT INTO page_fts(page_fts) VALUES ('rebuild')")
        db.execute("INSERT INTO page_fts(page_fts) VALUES ('optimize')")
        meta = {"name": name, "schema": str(SCHEMA_VERSION), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "pages": str(len(docs)), "links": str(kept), "sources": json.dumps(sources), "emails_removed": str(emails),
                "licences": json.dumps(licences, ensure_ascii=False)}
        db.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
        db.commit()
        db.execute("VACUUM")
        db.close()
        report = BuildReport(name=name, path=path, pages=len(docs), links=kept, dropped_links=dropped,
                             seconds=time.monotonic() - started, bytes=tmp.stat().st_size, sources=sources,
                             licences=licences, emails_removed=emails, skipped=list(skipped or []))
        if publish is None:
            os.replace(tmp, path)
        else:
            publish(tmp, report)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


# --- queries -------------------------------------------------------------------------------------


def fts_query(text: str) -> str:
    """An FTS5 MATCH expression for free text: its words (stopwords dropped) as OR-ed strings."""
    words = [w.lower() for w in _WORD_RE.findall(text)]
    terms = list(dict.fromkeys(w for w in words if w not in STOPWORDS)) or list(dict.fromkeys(words))
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in terms[:MAX_QUERY_TERMS])


class Corpus:
    """A built corpus, opened read-only; one SQLite connection per thread."""

    def __init__(self, path: Path, *, name: str = ""):
        self.path = Path(path)
        if not self.path.exists():
            raise CorpusError(f"corpus {name or self.path.stem!r} is not built ({self.path} is missing): "
                              f"run manage.py corpus_build {name or self.path.stem} --from ...")
        self.name = name or self.path.stem
        self._local = threading.local()
        self.meta = {k: v for k, v in self._db().execute("SELECT key, value FROM meta")}

    @classmethod
    def named(cls, name: str) -> "Corpus":
        return _open_cached(name)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            # immutable=1: no locks, no journal checks — the file is only ever replaced, never changed.
            uri = "file:" + quote(str(self.path.resolve())) + "?mode=ro&immutable=1"
            db = sqlite3.connect(uri, uri=True, check_same_thread=False)
            db.execute("PRAGMA mmap_size=268435456")
            db.execute("PRAGMA query_only=1")
            self._local.db = db
        return db

    @property
    def licences(self) -> list[dict[str, str]]:
        return json.loads(self.meta.get("licences") or "[]")

    @property
    def pages(self) -> int:
        return int(self.meta.get("pages") or 0)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        expression = fts_query(query)
        if not expression:
            return []
        db = self._db()
        try:
            ranked = db.execute(
                f"SELECT rowid FROM page_fts WHERE page_fts MATCH ? ORDER BY bm25(page_fts, {TITLE_WEIGHT}, 1.0), rowid"
                " LIMIT ?", (expression, int(k)),
            ).fetchall()
        except sqlite3.OperationalError as exc:
            raise CorpusError(f"search {query!r}: {exc}") from None
        hits = []
        for rank, (rowid,) in enumerate(ranked, 1):
            url, title, text = db.execute("SELECT url, title, text FROM page WHERE id = ?", (rowid,)).fetchone()
            hits.append(Hit(rank=rank, url=url, title=title, snippet=snippet(text, query)))
        return hits

    def page(self, url: str) -> Page | None:
        row = self._db().execute("SELECT url, title, text, links FROM page WHERE key = ?", (url_key(url),)).fetchone()
        if row is None:
            return None
        return Page(url=row[0], title=row[1], text=row[2], links=[tuple(link) for link in json.loads(row[3])])

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


def snippet(text: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """About `width` characters of `text` around the first query word it contains."""
    flat = " ".join(text.split())
    words = [w for w in (w.lower() for w in _WORD_RE.findall(query)) if w not in STOPWORDS]
    lower = flat.lower()
    at = min((i for i in (lower.find(w) for w in words) if i >= 0), default=0)
    start = max(0, at - width // 4)
    piece = flat[start:start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


_cache: dict[tuple[str, int, int], Corpus] = {}
_cache_lock = threading.Lock()


def _open_cached(name: str) -> Corpus:
    path = corpus_path(name)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise CorpusError(f"corpus {name!r} is not built ({path} is missing): "
                          f"run manage.py corpus_build {name} --from ...") from None
    key = (str(path), stat.st_ino, stat.st_mtime_ns)  # a rebuild replaces the file: a new key
    with _cache_lock:
        corpus = _cache.get(key)
        if corpus is None:
            for old in [k for k in _cache if k[0] == key[0]]:
                del _cache[old]
            corpus = _cache[key] = Corpus(path, name=name)
    return corpus


def content_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
