"""The corpus table's services and selectors: building and registering a corpus (one audit row
per build), and the licences a data card names.

The web toolset (apps.engines.web) builds and reads the corpus files and imports no app; this
module is the engine app's side that keeps the `Corpus` rows.

`corpus_build(name, inputs, ...)` reads the inputs, writes the corpus file (apps.engines.web.corpus)
and registers it in the `Corpus` table: the file is written to a temporary name, then the row and
the audit row are written and the file renamed into place inside one transaction (a failed build
leaves the older corpus and its row as they were, and no new file).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.engines.models import Corpus
from apps.engines.web import corpus as C
from trajplatform.audit import audit_record

DEBIAN = "debian"
SKIPPED_AUDITED = 100


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def corpus_inputs(inputs: list[str], *, base_url: str = "", licence: str = "",
                  skipped: list[str] | None = None) -> tuple[Iterator[C.Document], list[dict[str, str]]]:
    """The documents and licences of `--from` inputs: "debian", a directory (needs `base_url`) or a .jsonl file.

    A directory or JSONL needs `licence` (what the operator says it is under): a corpus
    without a recorded licence cannot be carried into a data card. A directory's files that
    are left out (links, oversized, undecodable names: C.iter_directory) go into `skipped`."""
    licences: list[dict[str, str]] = []
    sources: list[Iterator[C.Document]] = []
    for item in inputs:
        if item == DEBIAN:
            sources.append(C.iter_debian())
            licences += C.DEBIAN_LICENCES
            continue
        path = Path(item)
        if not licence:
            raise C.CorpusError(f"--from {item}: say what licence its documents are under (--licence)")
        if path.is_dir():
            if not base_url:
                raise C.CorpusError(f"--from {item}: a directory needs --base-url (the URL its files are served at)")
            sources.append(C.iter_directory(path, base_url, skipped=skipped))
            licences.append({"source": path.name, "name": str(path), "licence": licence})
        elif path.is_file() and path.suffix == ".jsonl":
            sources.append(C.iter_jsonl(path))
            licences.append({"source": path.stem, "name": str(path), "licence": licence})
        else:
            raise C.CorpusError(f"--from {item}: not 'debian', a directory or a .jsonl file")

    def chain() -> Iterator[C.Document]:
        for source in sources:
            yield from source

    return chain(), licences


def corpus_build(*, name: str, inputs: list[str], base_url: str = "", licence: str = "", keep_emails: bool = False,
                 actor: Any = None, actor_repr: str | None = None) -> tuple[Corpus, C.BuildReport]:
    """Build the corpus `name` from `inputs` and register it (CorpusError for bad inputs; nothing written).

    The report's `skipped` names the input files left out; the audit row counts them and
    names the first SKIPPED_AUDITED."""
    path = C.corpus_path(name)
    skipped: list[str] = []
    documents, licences = corpus_inputs(inputs, base_url=base_url, licence=licence, skipped=skipped)
    registered: list[Corpus] = []

    def publish(tmp: Path, report: C.BuildReport) -> None:
        sha256 = _file_sha256(tmp)
        with transaction.atomic():
            row, created = Corpus.objects.select_for_update().update_or_create(name=name, defaults={
                "path": str(report.path), "sha256": sha256, "pages": report.pages, "links": report.links,
                "bytes": report.bytes, "sources": report.sources, "inputs": list(inputs), "licences": licences,
                "build_seconds": round(report.seconds, 3), "built_at": timezone.now(),
            })
            audit_record("engines.corpus_build", actor=actor, actor_repr=actor_repr, target=row, data={
                "created": created, "inputs": list(inputs), "pages": report.pages, "links": report.links,
                "dropped_links": report.dropped_links, "emails_removed": report.emails_removed, "sha256": sha256, "licences": [l["licence"] for l in licences],
                "skipped": len(report.skipped), "skipped_files": report.skipped[:SKIPPED_AUDITED],
            })
            os.replace(tmp, report.path)  # last: if the rename fails, the rows roll back
        registered.append(row)

    report = C.build_corpus(name, documents, licences=licences, path=path, keep_emails=keep_emails,
                            skipped=skipped, publish=publish)
    return registered[0], report



# --- reads (data cards) -------------------------------------------------------------------------


def corpus_licences(names: list[str]) -> list[dict[str, str]]:
    """The licences of the registered corpora among `names` (a selector for data cards), each once."""
    seen: set[tuple[str, str]] = set()
    out: list[dict[str, str]] = []
    for row in Corpus.objects.filter(name__in=names).order_by("name"):
        for entry in row.licences:
            key = (row.name, entry.get("source", ""))
            if key not in seen:
                seen.add(key)
                out.append({"corpus": row.name, **entry})
    return out


# Scenes whose tasks read the web toolset's `scene_config.web`.
WEB_SCENES = ("deep_search", "search2qa")


def scene_corpora(scene_configs: Iterable[tuple[str, dict[str, Any] | None]]) -> list[str]:
    """The corpora episodes of these (scene, scene_config) pairs search (their scene_config.web;
    the default corpus when a web scene's task names none and uses the corpus backend)."""
    names: set[str] = set()
    for scene, scene_config in scene_configs:
        if scene not in WEB_SCENES:
            continue
        web = (scene_config or {}).get("web") or {}
        if web.get("backend", "corpus") == "corpus":
            names.add(web.get("corpus") or settings.WEB_CORPUS_DEFAULT)
    return sorted(names)


def scene_corpus_licences(scene_configs: Iterable[tuple[str, dict[str, Any] | None]]) -> list[dict[str, str]]:
    """The licences of the corpora these tasks' (scene, scene_config) pairs search (a data card's `licences`)."""
    return corpus_licences(scene_corpora(scene_configs))
