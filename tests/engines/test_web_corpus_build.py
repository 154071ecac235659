"""`manage.py corpus_build`: the registry row, its audit rows, refusals, the console, the Debian corpus."""
from __future__ import annotations

import io
import json
import os

import pytest
from django.core.management import CommandError, call_command

from apps.engines.models import Corpus
from apps.engines.web import corpus as C
from apps.engines.corpora import corpus_inputs, corpus_licences
from tests.engines.test_web_corpus import debian_corpus, write_tiny_jsonl, write_tiny_site
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def corpus_dir(settings, tmp_path):
    settings.WEB_CORPUS_DIR = tmp_path / "corpora"
    return settings.WEB_CORPUS_DIR


def test_it_builds_registers_and_audits_a_corpus(corpus_dir, tmp_path):
    site, jsonl = write_tiny_site(tmp_path), write_tiny_jsonl(tmp_path)
    out = io.StringIO()
    call_command("corpus_build", "tiny", "--from", str(site), "--from", str(jsonl), "--base-url",
                 "https://tiny.example/", "--licence", "CC0-1.0", stdout=out)
    assert "corpus tiny: 7 pages" in out.getvalue()
    row = Corpus.objects.get(name="tiny")
    assert row.pages == 7 and row.path == str(corpus_dir / "tiny.sqlite") and len(row.sha256) == 64
    assert row.sources == {"site": 4, "docs": 3}
    assert [l["licence"] for l in row.licences] == ["CC0-1.0", "CC0-1.0"]
    event = AuditEvent.objects.get(action="engines.corpus_build")
    assert event.target_id == str(row.pk) or int(event.target_id) == row.pk
    assert event.data["created"] is True and event.data["pages"] == 7 and event.data["emails_removed"] == 2
    assert event.actor_repr == "manage.py corpus_build"
    assert C.Corpus.named("tiny").search("Charles Babbage", 1)[0].title == "Charles Babbage"

    call_command("corpus_build", "tiny", "--from", str(jsonl), "--licence", "CC0-1.0", "--json", "--keep-emails",
                 stdout=(out := io.StringIO()))
    assert json.loads(out.getvalue())["pages"] == 3 and json.loads(out.getvalue())["emails_removed"] == 0
    assert "editor@wiki.example" in C.Corpus.named("tiny").page("https://wiki.example/Hacker").text
    assert Corpus.objects.get(name="tiny").pages == 3  # one row, rebuilt
    assert AuditEvent.objects.filter(action="engines.corpus_build").count() == 2
    assert corpus_licences(["tiny", "other"]) == [
        {"corpus": "tiny", "source": "docs", "name": str(jsonl), "licence": "CC0-1.0"}]


@pytest.mark.parametrize("argv, message", [
    (["--from", "{jsonl}"], "--licence"),
    (["--from", "{site}", "--licence", "MIT"], "--base-url"),
    (["--from", "/nonexistent/place", "--licence", "MIT"], "not 'debian', a directory"),
])
def test_it_refuses_inputs_it_cannot_describe_and_writes_nothing(corpus_dir, tmp_path, argv, message):
    paths = {"site": str(write_tiny_site(tmp_path)), "jsonl": str(write_tiny_jsonl(tmp_path))}
    with pytest.raises(CommandError, match=message):
        call_command("corpus_build", "tiny", *[a.format(**paths) for a in argv])
    assert not Corpus.objects.exists() and not AuditEvent.objects.filter(action="engines.corpus_build").exists()
    assert not (corpus_dir / "tiny.sqlite").exists()


def test_a_bad_jsonl_line_is_named(corpus_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"url": "https://a.example/", "text": "fine"}\n{"title": "no url"}\n')
    with pytest.raises(CommandError, match=r"bad.jsonl:2: a document needs a string url and text"):
        call_command("corpus_build", "bad", "--from", str(bad), "--licence", "MIT")


def test_the_console_shows_corpora_read_only(corpus_dir, tmp_path, client, make_user):
    call_command("corpus_build", "tiny", "--from", str(write_tiny_jsonl(tmp_path)), "--licence", "CC0-1.0",
                 stdout=io.StringIO())
    row = Corpus.objects.get()
    client.force_login(make_user("admin", is_superuser=True))
    page = client.get("/admin/engines/corpus/")
    assert page.status_code == 200 and b"CC0-1.0" in page.content
    assert client.get("/admin/engines/corpus/add/").status_code == 403
    detail = client.get(f"/admin/engines/corpus/{row.pk}/change/")
    assert detail.status_code == 200
    posted = client.post(f"/admin/engines/corpus/{row.pk}/change/", {"name": "renamed", "pages": 1})
    assert posted.status_code == 403
    assert client.post(f"/admin/engines/corpus/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Corpus.objects.get().name == "tiny"


def test_the_debian_corpus():
    """The bundled Debian documentation (APT_DEMO, part of APT_TEST): pages, cross-links, licences.
    `--from debian` reads exactly this (corpus_inputs); the command itself is driven above."""
    documents, licences = corpus_inputs(["debian"])
    assert licences == C.DEBIAN_LICENCES
    assert {l["source"]: l["licence"] for l in licences} == {
        "python3.11-doc": "PSF-2.0", "foldoc": "GFDL-1.1-or-later", "jargon": "public-domain"}
    report = debian_corpus()
    assert report.sources["python3.11-doc"] > 400 and report.sources["foldoc"] > 10_000
    assert report.sources["jargon"] > 2_000 and report.links > 50_000
    assert report.emails_removed > 100  # FOLDOC's contributors' addresses
    corpus = C.Corpus(report.path)
    assert "guido@cwi.nl" not in corpus.page("https://foldoc.example/python").text
    lovelace = corpus.page("https://foldoc.example/ada_lovelace")
    assert ("Charles Babbage", "https://foldoc.example/charles_babbage") in lovelace.links
    assert corpus.page("https://foldoc.example/charles_babbage") is not None
    assert corpus.search("Tech Model Railroad Club", 3)[0].url in (
        "https://foldoc.example/tmrc", "https://jargon.example/tmrc")
    asyncio_page = corpus.page("https://docs.python.org/3.11/library/asyncio-task.html")
    assert "TaskGroup" in asyncio_page.text and "¶" not in asyncio_page.text
    assert "    async with asyncio.TaskGroup() as tg:" in asyncio_page.text  # code keeps its indentation
    assert any(url.startswith("https://docs.python.org/3.11/library/") for _, url in asyncio_page.links)


def test_a_directory_is_read_without_leaving_it(corpus_dir, tmp_path, settings):
    """Probes of issue 36: a link to a file or directory outside, an oversized (sparse) file, a name
    that is not UTF-8, a FIFO: each is left out and named, the rest is built."""
    settings.WEB_CORPUS_MAX_FILE_BYTES = 100_000
    secret = tmp_path / "outside" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n")
    (tmp_path / "outside" / "private.html").write_text("<p>private outside page shadowhash</p>")
    site = write_tiny_site(tmp_path)
    (site / "shadow.html").symlink_to(secret)
    (site / "inner.html").symlink_to(site / "people" / "babbage.html")  # inside, still a link
    (site / "elsewhere").symlink_to(secret.parent, target_is_directory=True)
    with open(site / "huge.txt", "wb") as fh:
        fh.truncate(2 << 30)  # sparse: 2 GB that take no disk
    fd = os.open(os.fsencode(site) + b"/caf\xe9.html", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"<p>latin-1 name</p>")
    os.close(fd)
    os.mkfifo(site / "pipe.md")
    err = io.StringIO()
    call_command("corpus_build", "tiny", "--from", str(site), "--base-url", "https://tiny.example/",
                 "--licence", "CC0-1.0", "--json", stdout=(out := io.StringIO()), stderr=err)
    report = json.loads(out.getvalue())
    assert report["pages"] == 4
    why = {line.split(": ", 1)[0].removeprefix(str(site) + "/"): line.split(": ", 1)[1] for line in report["skipped"]}
    assert why == {
        "elsewhere": "a symbolic link to a directory (not followed)",
        "huge.txt": f"{2 << 30} bytes, over WEB_CORPUS_MAX_FILE_BYTES (100000)",
        "caf\\xe9.html": "a file name that is not UTF-8",
        "inner.html": "a symbolic link (not followed)",
        "pipe.md": "not a regular file",
        "shadow.html": "a symbolic link (not followed)",
    }
    assert err.getvalue().count("skipped ") == 6 and f"skipped {site}/shadow.html" in err.getvalue()
    corpus = C.Corpus.named("tiny")
    assert corpus.search("root saltsalt hashhashhash shadowhash", 5) == [] and corpus.pages == 4
    event = AuditEvent.objects.get(action="engines.corpus_build")
    assert event.data["skipped"] == 6 and len(event.data["skipped_files"]) == 6


def test_a_failed_build_leaves_the_older_corpus_and_its_row(corpus_dir, tmp_path, monkeypatch):
    site, jsonl = write_tiny_site(tmp_path), write_tiny_jsonl(tmp_path)
    call_command("corpus_build", "tiny", "--from", str(jsonl), "--licence", "CC0-1.0", stdout=io.StringIO())
    before = Corpus.objects.get()
    old_bytes = (corpus_dir / "tiny.sqlite").read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"url": "https://a.example/", "text": "fine"}\n{"title": "no url"}\n')
    with pytest.raises(CommandError, match="bad.jsonl:2"):  # fails while reading its inputs
        call_command("corpus_build", "tiny", "--from", str(site), "--from", str(bad), "--base-url",
                     "https://tiny.example/", "--licence", "MIT")

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("apps.engines.corpora.audit_record", refuse)  # fails while registering it
    with pytest.raises(CommandError, match="No space left"):
        call_command("corpus_build", "tiny", "--from", str(site), "--base-url", "https://tiny.example/",
                     "--licence", "MIT", stdout=io.StringIO())
    assert (corpus_dir / "tiny.sqlite").read_bytes() == old_bytes
    assert sorted(p.name for p in corpus_dir.iterdir()) == ["tiny.sqlite"]  # no temporary left
    after = Corpus.objects.get()
    assert (after.sha256, after.pages, after.built_at) == (before.sha256, 3, before.built_at)
    assert AuditEvent.objects.filter(action="engines.corpus_build").count() == 1
