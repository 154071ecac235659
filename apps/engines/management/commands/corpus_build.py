"""`manage.py corpus_build NAME --from SOURCE [...]`: build an offline-web corpus (docs/web.md)."""
from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.engines.web.corpus import CorpusError
from apps.engines.corpora import corpus_build

HELP = """\
Build the corpus NAME (a read-only SQLite FTS5 index at WEB_CORPUS_DIR/NAME.sqlite) that the web
toolset's corpus backend searches (scene_config.web.corpus; WEB_CORPUS_DEFAULT names the default),
and register it with its licences (carried into the data cards of datasets built on it).

--from takes, one or more times:
  debian      the Debian documentation: python3.11-doc's HTML, dict-foldoc and dict-jargon
              (apt-get install python3.11-doc dict-foldoc dict-jargon; `make demo` does it)
  DIRECTORY   its .html/.htm/.md/.markdown/.txt files, at --base-url + their relative path
  FILE.jsonl  one {"url", "title", "text", "links"?: [url | [anchor, url]]} per line

A directory or JSONL needs --licence (what its documents are under, e.g. CC-BY-4.0). Links
between pages are resolved (relative hrefs, fragments, dictionary cross-references); links out
of the corpus are dropped. E-mail addresses in the documents are replaced by "[e-mail removed]"
(episodes and the datasets made of them carry none) unless --keep-emails. An older build of NAME
is replaced at once (readers never see half); a build that fails leaves it and its registry row
as they were.

A directory is read without following symbolic links (to files or directories: nothing outside
it is read) or opening special files; a file over WEB_CORPUS_MAX_FILE_BYTES, a name that is not
UTF-8, a file that cannot be read or parsed is left out, and named on stderr ("skipped ...").
"""


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", metavar="NAME", help="the corpus name (letters, digits, . _ -)")
        parser.add_argument("--from", dest="inputs", action="append", required=True, metavar="SOURCE",
                            help="debian | DIRECTORY | FILE.jsonl (repeatable)")
        parser.add_argument("--base-url", default="", help="the URL a directory's files are served at")
        parser.add_argument("--licence", default="", help="the licence of a directory's or JSONL's documents")
        parser.add_argument("--keep-emails", action="store_true", help="keep e-mail addresses in the documents")
        parser.add_argument("--json", action="store_true", help="print the build report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            row, report = corpus_build(name=options["name"], inputs=options["inputs"], base_url=options["base_url"],
                                       licence=options["licence"], keep_emails=options["keep_emails"],
                                       actor_repr="manage.py corpus_build")
        except (CorpusError, OSError) as exc:
            raise CommandError(str(exc)) from None
        for line in report.skipped:
            self.stderr.write(f"skipped {line}")
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict() | {"sha256": row.sha256}))
            return
        sources = ", ".join(f"{k} {v}" for k, v in report.sources.items())
        self.stdout.write(
            f"corpus {row.name}: {report.pages} pages ({sources}), {report.links} links "
            f"({report.dropped_links} leaving the corpus dropped), {report.emails_removed} e-mail addresses removed, "
            f"{len(report.skipped)} input files skipped, {report.bytes / 1e6:.1f} MB, "
            f"built in {report.seconds:.1f} s ({report.pages / max(report.seconds, 1e-9):.0f} docs/s) -> {report.path}"
        )
        self.stdout.write("licences: " + "; ".join(f"{l['source']}: {l['licence']}" for l in row.licences))
