#!/usr/bin/env python
"""Benchmark the MCP hub and the toucan dedup (issue 22's benchmarks).

    .venv/bin/python bench/mcp_hub.py [--start] [--call] [--dedup] [--rounds 7] [--calls 50] [--questions 10000]

With no sub-benchmark flag, all three run, in this order:

- `--start`: each bundled server (time, git, fetch, sqlite from examples/toucan/servers.json;
  memory and filesystem from servers-npm.json when `make install` put the npm packages in) as
  an episode starts it: in a fresh sandbox of the trajplatform-mcp profile, its fixtures
  installed (`install_fixtures`), then `McpHub.start` (spawn + MCP initialize + tools/list).
  Beside it, the same server started bare: the same python (/usr/bin/python3, which the
  sandbox runs), the same argv, env and packages (PYTHONPATH to the same host directories the
  profile binds), a fastmcp Client over stdio, no sandbox; its fixtures in a host directory
  standing for /workspace (the same `install_fixtures`, its commands run by the host shell;
  the fetch pages on a free port, not 8080). Sandbox creation (shown) is outside the ratio: an
  episode's sandbox exists anyway; fixtures and start are timed apart. The two alternate, server by
  server, for --rounds rounds; medians. Target: start in the sandbox <= 1.3x bare (overall:
  the ratio of the sums of the per-server medians).
- `--call`: one tools/call per server (a cheap read: get_current_time, git_status, fetch of a
  fixture page, list_tables, read_graph, list_directory) through `McpHub.call_tool` into the
  sandbox, beside the same call from a bare fastmcp Client to the bare server; alternating,
  --calls of each; medians and the ratio (no target).
- `--dedup`: --questions synthetic questions (templates x vocabulary, deterministic, about one
  in eight a light rewording of an earlier one) deduplicated by `questions.dedup_questions` as
  the pipeline's first pass does (the whole batch, the default threshold, the bundled MiniLM);
  questions per second (model load apart; the embedding's share shown) and the process's peak
  RSS (ru_maxrss; it includes what the other sub-benchmarks loaded when they ran first).

This is a benchmark, not a test: it prints numbers and a verdict and exits 0 either way (1 only
if it cannot run). It writes no rows (LocalBackend without records).
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TARGET_RATIO = 1.3
LIFETIME_S = 600.0
# One cheap read per server (arguments with /workspace paths; the bare side rewrites them).
CALLS = {
    "time": ("get_current_time", {"timezone": "UTC"}),
    "git": ("git_status", {"repo_path": "/workspace/repo"}),
    "fetch": ("fetch", {"url": "http://127.0.0.1:{port}/index.html", "max_length": 2000}),
    "sqlite": ("list_tables", {}),
    "memory": ("read_graph", {}),
    "filesystem": ("list_directory", {"path": "/workspace/files"}),
}


class HostWorkspace:
    """What `install_fixtures` needs of a sandbox, on a host directory standing for /workspace:
    paths and commands have /workspace rewritten to the directory; commands run in the host's shell."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.env = env

    def host(self, text: str) -> str:
        from apps.engines.sandboxes import WORKDIR

        return text.replace(WORKDIR, str(self.root))

    def write_file(self, path: str, data: bytes) -> None:
        target = Path(self.host(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def run(self, command: str | list[str], *, timeout: float, env: dict[str, str] | None = None) -> Any:
        argv = ["/bin/sh", "-c", self.host(command)] if isinstance(command, str) else [self.host(a) for a in command]
        done = subprocess.run(argv, cwd=self.root, env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)
        return SimpleNamespace(exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def bundled_records() -> list[Any]:
    """The bundled servers' checked records (the npm ones only when their packages are installed)."""
    from apps.engines.sandboxes.local import platform_mcp_packages
    from apps.engines.mcp_servers import load_records, parse_record

    records = [parse_record(r) for r in load_records(ROOT / "examples" / "toucan" / "servers.json")]
    if (Path(platform_mcp_packages()) / "node" / "node_modules").is_dir():
        records += [parse_record(r) for r in load_records(ROOT / "examples" / "toucan" / "servers-npm.json")]
    return records


class Bare:
    """One server started bare on the host, a fastmcp Client over stdio on an event loop of this thread."""

    def __init__(self, record: Any, tmp: Path):
        from apps.engines.sandboxes import PLATFORM_MCP_BUILTIN_PATH, PLATFORM_MCP_PATH, PLATFORM_PYTHON_PATH
        from apps.engines.sandboxes.local import (
            MCP_BUILTIN_SERVERS,
            SANDBOX_PATH,
            platform_mcp_packages,
            platform_python_packages,
        )
        from apps.engines.mcp_servers import resolved_spec

        self.root = Path(tempfile.mkdtemp(prefix="ws-", dir=tmp))
        self.fixtures = copy.deepcopy(record.fixtures)
        if "pages" in self.fixtures:
            self.fixtures["pages"]["port"] = free_port()
        self.spec = resolved_spec(record.spec, record.secrets, self.fixtures)
        host_paths = {PLATFORM_PYTHON_PATH: platform_python_packages(), PLATFORM_MCP_BUILTIN_PATH: MCP_BUILTIN_SERVERS,
                      PLATFORM_MCP_PATH: platform_mcp_packages()}  # longer prefixes first: mcp-builtin before mcp
        self.workspace = HostWorkspace(self.root, {"PATH": SANDBOX_PATH, "HOME": str(self.root), "LANG": "C.UTF-8",
                                                   "TMPDIR": "/tmp", "USER": "sandbox"})
        self._paths = host_paths

        def host(text: str) -> str:
            for inside, outside in self._paths.items():
                text = text.replace(inside, outside)
            return self.workspace.host(text)

        self.host = host
        python_path = f"{platform_python_packages()}:{platform_mcp_packages()}/python:{MCP_BUILTIN_SERVERS}"
        self.env = {**self.workspace.env, "PYTHONPATH": python_path,
                    **{k: host(v) for k, v in self.spec.env.items()}}
        self.argv = [host(a) for a in self.spec.argv]
        self.loop = asyncio.new_event_loop()
        self.client: Any = None

    def install(self) -> None:
        from apps.engines.scenes.toucan.fixtures import install_fixtures

        install_fixtures(self.workspace, self.fixtures)

    def start(self) -> float:
        """Spawn + initialize + tools/list; seconds."""
        from fastmcp import Client
        from fastmcp.client.transports import StdioTransport

        transport = StdioTransport(command=self.argv[0], args=self.argv[1:], env=self.env,
                                   cwd=self.host(self.spec.cwd or "/workspace"), keep_alive=False,
                                   log_file=self.root.parent / f"{self.root.name}.stderr")
        self.client = Client(transport, init_timeout=self.spec.start_timeout_s)
        started = time.perf_counter()
        self.loop.run_until_complete(self.client.__aenter__())
        self.loop.run_until_complete(self.client.list_tools())
        return time.perf_counter() - started

    def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        arguments = json.loads(self.host(json.dumps(arguments)))
        result = self.loop.run_until_complete(self.client.call_tool_mcp(tool, arguments))
        assert not result.is_error, result
        return result

    def close(self) -> None:
        if self.client is not None:
            self.loop.run_until_complete(self.client.__aexit__(None, None, None))
            self.client = None
        self.loop.close()


class InSandbox:
    """One server as an episode starts it: a fresh trajplatform-mcp sandbox, its fixtures, McpHub."""

    def __init__(self, backend: Any, record: Any):
        from apps.engines.sandboxes import PLATFORM_MCP_PROFILE, SandboxSpec
        from apps.engines.mcp_servers import resolved_spec

        self.record = record
        self.spec = resolved_spec(record.spec, record.secrets, record.fixtures)
        started = time.perf_counter()
        self.sandbox = backend.create(SandboxSpec(image=PLATFORM_MCP_PROFILE, labels={"purpose": "bench"},
                                                  ttl=LIFETIME_S + 300))
        self.create_s = time.perf_counter() - started
        self.hub: Any = None

    def install(self) -> None:
        from apps.engines.scenes.toucan.fixtures import install_fixtures

        install_fixtures(self.sandbox, self.record.fixtures)

    def start(self) -> float:
        from apps.engines.mcp import McpHub

        self.hub = McpHub([self.spec])
        started = time.perf_counter()
        self.hub.start(self.sandbox, lifetime=LIFETIME_S)
        return time.perf_counter() - started

    def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        result = self.hub.call_tool(f"{self.spec.prefix}{tool}", arguments, timeout=60)
        assert not result.extra.get("is_error"), result.output
        return result

    def close(self) -> None:
        self.sandbox.destroy(record=False)


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process's live descendants: a started
    server's process tree (the sandbox's wrappers and bwrap included), read from /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            rest = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry.name)] = int(rest[1])
        cpu[int(entry.name)] = (int(rest[11]) + int(rest[12])) / tick
    mine, total = {os.getpid()}, 0.0
    for _ in range(32):  # depth
        found = {pid for pid, parent in parents.items() if parent in mine and pid not in mine}
        if not found:
            break
        mine |= found
        total += sum(cpu[pid] for pid in found)
    return total


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_start(backend: Any, records: list[Any], rounds: int, tmp: Path) -> None:
    print(f"server start: spawn + initialize + tools/list, {rounds} rounds alternating, medians (ms)")
    print(f"  {'server':<11} {'create sbx':>10} {'fixtures sbx':>12} {'fixtures bare':>13} {'start sbx':>10} {'start bare':>10} "
          f"{'ratio':>6}   {'cpu sbx':>7} {'cpu bare':>8}")
    samples = {r.name: {"create": [], "fix_sbx": [], "fix_bare": [], "sbx": [], "bare": [], "cpu_sbx": [], "cpu_bare": []}
               for r in records}
    for round_no in range(rounds + 1):  # round 0 warms caches (page cache, first imports) and is dropped
        for record in records:
            for kind in ("sbx", "bare"):
                side = InSandbox(backend, record) if kind == "sbx" else Bare(record, tmp)
                try:
                    fixtures = timed(side.install)
                    start = side.start()
                    cpu = tree_cpu_s()
                finally:
                    side.close()
                if round_no and kind == "sbx":
                    samples[record.name]["create"].append(side.create_s)
                if round_no:
                    samples[record.name][f"fix_{kind}"].append(fixtures)
                    samples[record.name][kind].append(start)
                    samples[record.name][f"cpu_{kind}"].append(cpu)
    sums = {key: 0.0 for key in samples[records[0].name]}
    for record in records:
        got = {k: median_ms(v) for k, v in samples[record.name].items()}
        for key in sums:
            sums[key] += got[key]
        print(f"  {record.name:<11} {got['create']:10.0f} {got['fix_sbx']:12.0f} {got['fix_bare']:13.0f} {got['sbx']:10.0f} "
              f"{got['bare']:10.0f} {got['sbx'] / got['bare']:5.2f}x   {got['cpu_sbx']:7.0f} {got['cpu_bare']:8.0f}")
    ratio = sums["sbx"] / sums["bare"]
    with_fixtures = (sums["sbx"] + sums["fix_sbx"]) / (sums["bare"] + sums["fix_bare"])
    print(f"  overall start ratio (sums of medians): {ratio:.2f}x; fixtures + start: {with_fixtures:.2f}x; "
          f"CPU of the server's process tree until ready: {sums['cpu_sbx'] / sums['cpu_bare']:.2f}x")
    verdict = "MET" if ratio <= TARGET_RATIO else "NOT MET"
    print(f"  verdict: start in the sandbox {ratio:.2f}x bare, target <= {TARGET_RATIO}x: {verdict}")


def bench_call(backend: Any, records: list[Any], calls: int, tmp: Path) -> None:
    print(f"one tools/call: McpHub.call_tool into the sandbox vs a bare client, {calls} calls alternating, medians")
    for record in records:
        tool, arguments = CALLS[record.name]
        if record.name == "fetch":
            sbx_args = json.loads(json.dumps(arguments).replace("{port}", str(record.fixtures["pages"]["port"])))
        else:
            sbx_args = arguments
        sbx, bare = InSandbox(backend, record), Bare(record, tmp)
        if record.name == "fetch":
            bare_args = json.loads(json.dumps(arguments).replace("{port}", str(bare.fixtures["pages"]["port"])))
        else:
            bare_args = arguments
        try:
            for side in (sbx, bare):
                side.install()
                side.start()
            sbx.call(tool, sbx_args)  # warm both (the first call imports what the tool needs)
            bare.call(tool, bare_args)
            hub_s: list[float] = []
            bare_s: list[float] = []
            for _ in range(calls):
                hub_s.append(timed(lambda: sbx.call(tool, sbx_args)))
                bare_s.append(timed(lambda: bare.call(tool, bare_args)))
        finally:
            bare.close()
            sbx.close()
        hub_ms, bare_ms = median_ms(hub_s), median_ms(bare_s)
        print(f"  {record.name:<11} {tool:<17} hub {hub_ms:8.2f} ms   bare {bare_ms:8.2f} ms   {hub_ms / bare_ms:5.2f}x")


ADJECTIVES = ("blue", "broken", "overdue", "quarterly", "archived", "draft", "urgent", "shared", "nightly", "legacy",
              "weekly", "signed", "missing", "cached", "regional", "annual", "pending", "refunded", "encrypted", "spare")
NOUNS = ("invoice", "tripod", "lamp order", "reading club", "release branch", "customer table", "lens stock",
         "meeting note", "library page", "flight booking", "sensor log", "payroll export", "shipping label",
         "backup job", "tax form", "recipe card", "bike rental", "hotel voucher", "exam timetable", "garden plan",
         "sales report", "vaccine record", "bus schedule", "podcast feed", "warehouse map", "commit history",
         "knowledge graph", "todo list", "price list", "museum ticket")
PLACES = ("Tokyo", "Lisbon", "New York", "Nairobi", "Sydney", "Reykjavik", "Santiago", "Mumbai", "Toronto", "Oslo",
          "Cairo", "Lima", "Seoul", "Berlin", "Honolulu", "Jakarta")
TIMES = ("9:00 tomorrow", "noon on Monday", "the end of the month", "14 March", "next Tuesday at 17:30",
         "the last release", "yesterday evening", "Friday 18:00", "the first of June", "midnight UTC")
TEMPLATES = (
    "What time will it be in {place} when the {adj} {noun} is due at {time}?",
    "Which commits touched the {adj} {noun} since {time}, and who wrote them?",
    "List every row of the {noun} table whose status is {adj}, sorted by date.",
    "Fetch the page about the {adj} {noun} and tell me what it says about {place}.",
    "Remember that the {adj} {noun} belongs to the {place} office, then show me the whole graph.",
    "How many {adj} entries does the {noun} have compared with {time}?",
    "Create a table for the {adj} {noun} with one column per weekday and add a row for {place}.",
    "Is the {adj} {noun} in {place} still valid after {time}? Give me the exact date.",
    "Convert {time} in {place} to UTC and note it next to the {adj} {noun}.",
    "Find the file that mentions the {adj} {noun} and summarise it in two sentences.",
    "Which branch holds the newest version of the {adj} {noun}, and is it merged into main?",
    "Compare the {adj} {noun} totals for {place} before and after {time}.",
)
CONTEXTS = (
    "I am preparing the {place} budget review.", "My manager in {place} asked for it by {time}.",
    "We moved the {noun} to a new system last week.", "The {adj} copy in the shared drive looks wrong.",
    "A customer from {place} complained about it.", "Our auditors want a paper trail.",
    "I only have my phone with me.", "The old spreadsheet was lost when the laptop died.",
    "This is for a school project on {noun}s.", "Someone renamed the {adj} folder yesterday.",
    "The deadline moved to {time}.", "I am new to the team and do not know the tools.",
)
ASKS = ("Please be precise.", "Give me the exact figure.", "Keep it short.", "Explain each step.",
        "Answer in a table.", "Tell me if anything is missing.", "")


def synthetic_questions(n: int, seed: int = 22) -> list[tuple[str, str]]:
    """n (key, question) pairs, deterministic: a context sentence, a template and a request, with
    vocabulary in the slots; about one in eight is a light rewording of an earlier question (a near
    duplicate the dedup should drop; some others land within the threshold of each other by chance)."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []

    def fill(text: str) -> str:
        return text.format(adj=rng.choice(ADJECTIVES), noun=rng.choice(NOUNS), place=rng.choice(PLACES),
                           time=rng.choice(TIMES))

    for i in range(n):
        if out and rng.random() < 0.125:
            base = out[rng.randrange(len(out))][1]
            text = rng.choice(("Please: ", "Quick question. ", "Hi! ", "")) + base.rstrip(".?") + rng.choice(("?", ", thanks.", " please."))
        else:
            text = " ".join(part for part in (fill(rng.choice(CONTEXTS)), fill(rng.choice(TEMPLATES)), rng.choice(ASKS)) if part)
        out.append((f"q{i:05d}", text))
    return out


def bench_dedup(n: int) -> None:
    from apps.datasets.dedup import sentence_embedder
    from apps.engines.scenes.toucan import questions

    batch = synthetic_questions(n)
    load_s = timed(lambda: sentence_embedder(["warm up the model"]))
    embedding_s: list[float] = []

    def embedder(texts: Any) -> Any:  # the pipeline's default embedder, timed
        started = time.perf_counter()
        vectors = sentence_embedder(texts)
        embedding_s.append(time.perf_counter() - started)
        return vectors

    started = time.perf_counter()
    verdicts = questions.dedup_questions(batch, embedder=embedder)
    elapsed = time.perf_counter() - started
    dropped = sum(1 for v in verdicts.values() if v)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"dedup of {n} questions (threshold {questions.DEFAULT_DEDUP_THRESHOLD:g}, bundled MiniLM, CPU)")
    print(f"  model load {load_s:.1f} s; dedup {elapsed:.1f} s (embedding {sum(embedding_s):.1f} s of it) = "
          f"{n / elapsed:.0f} questions/s; {dropped} near duplicates dropped; peak RSS {peak_mib:.0f} MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", action="store_true", help="server start in the sandbox vs bare (target <= 1.3x)")
    parser.add_argument("--call", action="store_true", help="one tools/call through the hub vs a bare client")
    parser.add_argument("--dedup", action="store_true", help="dedup of --questions synthetic questions")
    parser.add_argument("--rounds", type=int, default=7, help="start rounds per server and side (default 7)")
    parser.add_argument("--calls", type=int, default=50, help="tool calls per server and side (default 50)")
    parser.add_argument("--questions", type=int, default=10_000, help="questions to dedup (default 10000)")
    parser.add_argument("--servers", default="", help="comma-separated server names (default: every bundled one)")
    options = parser.parse_args()
    everything = not (options.start or options.call or options.dedup)

    import django

    django.setup()
    from apps.engines.sandboxes import SandboxUnavailable
    from apps.engines.sandboxes.local import LocalBackend

    print(f"python {sys.version.split()[0]}; {os.cpu_count()} CPUs; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if everything or options.start or options.call:
        try:
            records = bundled_records()
        except SandboxUnavailable as exc:
            print(f"cannot run: {exc}")
            return 1
        if options.servers:
            wanted = options.servers.split(",")
            records = [r for r in records if r.name in wanted]
        backend = LocalBackend(records=False)
        with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
            if everything or options.start:
                bench_start(backend, records, options.rounds, Path(tmp))
            if everything or options.call:
                bench_call(backend, records, options.calls, Path(tmp))
    if everything or options.dedup:
        bench_dedup(options.questions)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
