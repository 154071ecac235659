#!/usr/bin/env python
"""Benchmark the gui scene (issue 25): episode start, peak memory, concurrent episodes per worker,
throughput, artifact bytes per step.

    .venv/bin/python bench/gui.py [--concurrency 1,4,8] [--episodes-per-slot 1]

The bundled tasks (examples/tasks/gui.jsonl: MiniWoB++ pages and the shop/mail/admin sites) run
through the shared loop (apps.engines.agent.run_episode) with the offline scripted model, in local
sandboxes, all episodes of a round on ONE event loop, as one worker runs them. For each
concurrency N a round starts N x --episodes-per-slot episodes at once and reports:

- start: per episode, sandbox creation + browser server start + chromium launch + the start
  page's first snapshot and screenshot (from the runtime's sandbox_spec call to its initial
  observation), median and max;
- peak memory: per episode, the sandbox's memory cgroup high-water mark (chromium, its
  renderer, the MCP server, the site: everything of the episode), median and max;
- failures: episodes that did not end as their script says (a success, or the wrong
  solution's failure); the round "sustains" N when there are none;
- throughput: episodes per minute over the round's wall clock;
- artifacts: screenshot bytes per step as stored (content-addressed, deduplicated) and as they
  would be without deduplication.

It writes its rows in a private SQLite database and its artifacts under a temporary MEDIA_ROOT
(both deleted at the end). A benchmark, not a test: exit 0 with numbers (1 if it cannot run).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TMP = tempfile.mkdtemp(prefix="bench-gui-")
os.environ["DATABASE_URL"] = f"sqlite:///{TMP}/db.sqlite3"
os.environ["MEDIA_ROOT"] = f"{TMP}/media"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
for name, value in (("FASTMCP_CHECK_FOR_UPDATES", "off"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    os.environ.setdefault(name, value)

TARGET_CONCURRENT = 8
TASKS = ROOT / "examples" / "tasks" / "gui.jsonl"
MEASURED: dict[str, dict[str, Any]] = {}  # episode key -> start_s, peak_mb


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def bench_runtime() -> type:
    from apps.engines.scenes.gui.runtime import GuiRuntime
    from apps.engines.runtime import current_episode

    class Measured(GuiRuntime):
        """The gui runtime, timing the start and reading the sandbox's memory high-water mark."""

        def sandbox_spec(self, config: dict[str, Any]) -> Any:
            current_episode().state["t0"] = time.monotonic()
            return super().sandbox_spec(config)

        def initial_observation(self, sandbox: Any, config: dict[str, Any]) -> Any:
            ctx = current_episode()
            MEASURED.setdefault(config["bench_key"], {})["start_s"] = time.monotonic() - ctx.state["t0"]
            return super().initial_observation(sandbox, config)

        def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> Any:
            memory = sandbox.cgroup.paths.get("memory")
            if memory:
                for name in ("memory.max_usage_in_bytes", "memory.peak"):  # cgroup v1, v2
                    path = Path(memory) / name
                    if path.exists():
                        MEASURED.setdefault(config["bench_key"], {})["peak_mb"] = int(path.read_text()) / 2**20
                        break
            return super().verify(sandbox, config, final_answer)

    return Measured


def configs(count: int) -> list[dict[str, Any]]:
    from apps.tasks.models import Task

    lines = [json.loads(line) for line in TASKS.read_text().splitlines()]
    out = []
    for i in range(count):
        line = lines[i % len(lines)]
        task = Task(scene="gui", prompt=line["prompt"], scene_config=line["config"], max_steps=line["max_steps"],
                    step_timeout_s=120, timeout_s=900)
        out.append({**task.config_snapshot(), "bench_key": f"{i}", "bench_expect": (
            "failure" if line["external_id"].endswith("-wrong") else "success"), "bench_id": line["external_id"]})
    return out


async def round_of(n: int, llm: Any, backend: Any) -> dict[str, Any]:
    from apps.engines.agent import run_episode
    from apps.engines.llm import cache_identity

    MEASURED.clear()
    items = configs(n)
    started = time.monotonic()
    results = await asyncio.gather(*[
        run_episode(config=c, llm=llm, sandbox_backend=backend, cache_key_extra=cache_identity(uuid.uuid4()))
        for c in items])
    wall = time.monotonic() - started
    failures = [(c["bench_id"], r.outcome, r.outcome_reason[:120]) for c, r in zip(items, results)
                if r.outcome != c["bench_expect"]]
    starts = [m["start_s"] for m in MEASURED.values() if "start_s" in m]
    peaks = [m["peak_mb"] for m in MEASURED.values() if "peak_mb" in m]
    refs = [ref for r in results for s in r.steps for ref in s.get("images") or []]
    steps = sum(1 for r in results for s in r.steps if s.get("images"))
    return {"n": n, "wall_s": wall, "failures": failures, "starts": starts, "peaks": peaks,
            "per_min": 60 * len(results) / wall, "steps": steps,
            "ref_bytes": sum(r["bytes"] for r in refs), "shas": {r["artifact"] for r in refs}}


def summary(values: list[float], unit: str) -> str:
    if not values:
        return "n/a"
    return f"median {statistics.median(values):.1f} {unit}, max {max(values):.1f} {unit}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated episodes at once (default 1,4,8)")
    parser.add_argument("--episodes-per-slot", type=int, default=1)
    args = parser.parse_args()
    setup_django()
    from apps.engines.llm import LLMClient, Provider
    from apps.engines.offline_model import MODEL_NAME, running_offline_model
    from apps.engines.registry import register_runtime
    from apps.engines.sandboxes.local import LocalBackend
    from trajplatform import artifacts

    register_runtime("gui", bench_runtime())
    backend = LocalBackend(records=False, root=Path(TMP) / "sandboxes")
    (Path(TMP) / "sandboxes").mkdir(mode=0o711)
    os.chmod(TMP, 0o711)
    print(f"gui bench: bundled tasks {TASKS.relative_to(ROOT)}, one event loop (one worker), chromium "
          f"{os.popen('/usr/bin/chromium --version 2>/dev/null').read().strip() or '?'}, {os.cpu_count()} cores")
    verdict_n = 0
    with running_offline_model([TASKS]) as server:
        for n in [int(x) for x in args.concurrency.split(",") if x.strip()]:
            llm = LLMClient([Provider("offline", server.url, MODEL_NAME, "")], limiters={})
            out = asyncio.run(_round(n * args.episodes_per_slot, llm, backend))
            stored = sum(a.size for a in artifacts.Artifact.objects.filter(sha256__in=out["shas"]))
            ok = not out["failures"]
            verdict_n = n if ok and n > verdict_n else verdict_n
            print(f"\n{n * args.episodes_per_slot} episodes at once: {'all as scripted' if ok else 'FAILURES'}; "
                  f"wall {out['wall_s']:.1f} s, {out['per_min']:.1f} episodes/min")
            print(f"  start (sandbox + browser + first snapshot): {summary(out['starts'], 's')}")
            print(f"  peak memory per episode (memory cgroup):    {summary(out['peaks'], 'MiB')}")
            if out["steps"]:
                print(f"  artifacts: {out['steps']} steps with a screenshot, {stored / out['steps'] / 1024:.1f} KiB/step "
                      f"stored (dedup: {len(out['shas'])} distinct), {out['ref_bytes'] / out['steps'] / 1024:.1f} "
                      "KiB/step without dedup")
            for failure in out["failures"]:
                print(f"  failed: {failure}")
    print(f"\nverdict: one worker sustained {verdict_n} concurrent gui episodes without failures "
          f"(target >= {TARGET_CONCURRENT}): {'met' if verdict_n >= TARGET_CONCURRENT else 'NOT met'}")
    return 0


async def _round(n: int, llm: Any, backend: Any) -> dict[str, Any]:
    try:
        return await round_of(n, llm, backend)
    finally:
        await llm.aclose()


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        import shutil

        shutil.rmtree(TMP, ignore_errors=True)
