#!/usr/bin/env python
"""Benchmark the offline web (issue 23): corpus build, size, `search` and `open` latency, in one run.

    .venv/bin/python bench/web_search.py [--rounds 5] [--k 5] [--corpus PATH]

1. Build the Debian documentation corpus (python3.11-doc, dict-foldoc, dict-jargon: APT_DEMO) into a
   temporary file, as `manage.py corpus_build NAME --from debian` does: documents/s, pages, links,
   file size (and gzipped size). With --corpus PATH an existing build is measured instead.
2. `search` through the web toolset (WebToolset over the corpus backend, the formatted result the
   model gets): QUERIES (multi-word natural-language questions, single terms, names, rare and
   common words) x --rounds, after one warm-up pass; p50 / p95 / max in ms. Target: p50 <= 10 ms
   (a first attempt measured 44-149 ms per query with OR-joined quoted terms and bm25 weights).
3. `open` of the top hit of each query (window 0), p50 / p95 in ms.

A benchmark, not a test: it prints numbers and a verdict and exits 0 either way (1 if it cannot run).
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")

QUERIES = [
    "ada lovelace daughter of lord byron",
    "which language was named after the first programmer",
    "tech model railroad club MIT hacker culture",
    "asyncio TaskGroup create_task",
    "charles babbage analytical engine",
    "python dictionary comprehension syntax",
    "what is a foo switch",
    "garbage collection reference counting cycles",
    "lisp machine symbolics",
    "unix",
    "the",
    "regular expression lookahead assertion",
    "who wrote the jargon file",
    "dataclasses field default_factory",
    "hacker ethic",
    "kludge",
    "byte order endianness big endian little endian",
    "context manager with statement __enter__ __exit__",
    "RFC 822 email address format",
    "xyzzy magic word colossal cave adventure",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--corpus", type=Path, help="measure this built corpus instead of building one")
    args = parser.parse_args()

    import django

    django.setup()
    from apps.engines.web import corpus as C
    from apps.engines.web.toolset import CorpusBackend, WebToolset

    tmp = Path(tempfile.mkdtemp(prefix="bench-web-"))
    try:
        if args.corpus:
            path = args.corpus
            print(f"corpus: {path} (not rebuilt)")
        else:
            try:
                report = C.build_corpus("bench", C.iter_debian(), licences=C.DEBIAN_LICENCES, path=tmp / "bench.sqlite")
            except C.CorpusError as exc:
                print(f"cannot build the Debian corpus: {exc}", file=sys.stderr)
                return 1
            path = report.path
            with path.open("rb") as src, gzip.open(tmp / "bench.sqlite.gz", "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            gz = (tmp / "bench.sqlite.gz").stat().st_size
            print(f"build: {report.pages} pages ({', '.join(f'{k} {v}' for k, v in report.sources.items())}), "
                  f"{report.links} links, {report.seconds:.1f} s = {report.pages / report.seconds:.0f} docs/s; "
                  f"size {report.bytes / 1e6:.1f} MB ({gz / 1e6:.1f} MB gzipped)")
        web = WebToolset(CorpusBackend(C.Corpus(path, name="bench")))
        for query in QUERIES:  # warm-up: first touch of the pages, mmap
            web.execute("search", {"query": query, "k": args.k})
        search_ms: list[float] = []
        per_query: dict[str, list[float]] = {q: [] for q in QUERIES}
        tops: dict[str, str] = {}
        for _ in range(args.rounds):
            for query in QUERIES:
                started = time.perf_counter()
                result = web.execute("search", {"query": query, "k": args.k})
                ms = (time.perf_counter() - started) * 1000
                search_ms.append(ms)
                per_query[query].append(ms)
                if result.extra["results"]:
                    tops[query] = result.extra["results"][0]["url"]
        open_ms: list[float] = []
        for _ in range(args.rounds):
            for url in tops.values():
                started = time.perf_counter()
                web.execute("open", {"url": url})
                open_ms.append((time.perf_counter() - started) * 1000)
        slowest = max(per_query, key=lambda q: statistics.median(per_query[q]))
        p50 = statistics.median(search_ms)
        print(f"search (k={args.k}, {len(QUERIES)} queries x {args.rounds}): p50 {p50:.2f} ms, "
              f"p95 {percentile(search_ms, 0.95):.2f} ms, max {max(search_ms):.2f} ms; "
              f"slowest query {slowest!r} (median {statistics.median(per_query[slowest]):.2f} ms)")
        print(f"open (window 0 of each top hit, {len(open_ms)} calls): p50 {statistics.median(open_ms):.2f} ms, "
              f"p95 {percentile(open_ms, 0.95):.2f} ms")
        print(f"verdict: search p50 {p50:.2f} ms {'<=' if p50 <= 10 else '>'} 10 ms target "
              f"({'met' if p50 <= 10 else 'NOT met'}); first attempt 44-149 ms = "
              f"{44 / p50:.0f}-{149 / p50:.0f}x slower")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
