"""`manage.py corpus_build`: the registry row, its audit rows, refusals, the console, the Debian corpus."""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from apps.engines.models import Corpus
from apps.engines.web import corpus as C
from apps.engines.web.selectors import corpus_licences
from apps.engines.web.services import corpus_inputs
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
