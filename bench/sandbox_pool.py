#!/usr/bin/env python
"""Benchmark the per-image warm pool on OpenSandbox: is an episode's sandbox start hidden?

    .venv/bin/python bench/sandbox_pool.py [--episodes 6] [--start-ms 1500] [--model-ms 600]

Runs code_exec episodes (run_shell, then finish) through the real agent loop on the OpenSandbox
backend against the loopback fake (tests/engines/opensandbox_fake.py), whose sandbox create is
made to take --start-ms (a container start; the fake itself starts none), with a model stand-in
answering each call after --model-ms. The task names an image (`scene_config.image`), so the
pool that serves it is SANDBOX_POOL_IMAGES's, not the default shape's. Two passes, one after the
other, --episodes episodes each:

- cold: no pool; the episode creates its sandbox while the model answers the first turn;
- warm: SANDBOX_POOL_IMAGES="<image>=1"; the pool is refilled between episodes (the reconciler's
  and `acquire`'s refill job, outside the timed part).

Printed per pass (medians): `acquire` (the sandbox start the episode waits on: create or claim),
how long the first tool call waited for the sandbox after the model's first answer, and the
episode's wall time; then the ratio warm/cold of each. "Hidden" means the first tool call did
not wait for the sandbox. A benchmark, not a test: it prints numbers and exits 0 (1 only if it
cannot run). A throwaway SQLite database in a temporary TRAJ_VAR_DIR; never the project's var/.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMAGE = "python:3.11"


def slow_fake(root: Path, start_s: float) -> Any:
    """The loopback fake, its sandbox create taking `start_s` (a container starting)."""
    from tests.engines.opensandbox_fake import FakeOpenSandbox

    class SlowStartFake(FakeOpenSandbox):
        async def create_or_list(self, request: Any) -> Any:
            if request.method == "POST":
                await asyncio.sleep(start_s)
            return await super().create_or_list(request)

    return SlowStartFake(root)


class TimedModel:
    """Answers after `latency_s`: run_shell first, then finish; notes when the first answer came."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.first_answer: float | None = None
        self.primary = type("P", (), {"model": "bench-timed"})()

    async def achat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        from decimal import Decimal

        from apps.engines.llm import ChatResult

        await asyncio.sleep(self.latency_s)
        made = sum(1 for m in messages if m.get("role") == "assistant")
        if made == 0:
            call = {"name": "run_shell", "arguments": '{"command": "echo ready"}'}
            self.first_answer = time.perf_counter()
        else:
            call = {"name": "finish", "arguments": '{"answer": "done"}'}
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{made}", "type": "function", "function": call}]}
        return ChatResult(message=message, finish_reason="tool_calls", usage={}, cost_usd=Decimal(0),
                          model="bench-timed", provider="bench", latency_ms=int(self.latency_s * 1000))

    async def aclose(self) -> None:
        pass


def run_pass(episodes: int, model_ms: float, *, warm: bool) -> dict[str, list[float]]:
    from django.conf import settings

    from apps.engines import lease
    from apps.engines.agent import run_episode
    from apps.engines.sandboxes import acquire
    from apps.engines.sandbox_records import fill_pool

    settings.SANDBOX_POOL_IMAGES = f"{IMAGE}=1" if warm else ""
    acquired: list[float] = []

    def timed_acquire(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return acquire(*args, **kwargs)
        finally:
            acquired.append((time.perf_counter() - started) * 1000)

    lease.acquire = timed_acquire  # the agent's sandbox lease acquires through it
    out: dict[str, list[float]] = {"acquire_ms": [], "first_tool_waited_ms": [], "episode_ms": []}
    config = {"scene": "code_exec", "prompt": "say ready", "scene_config": {"image": IMAGE},
              "max_steps": 4, "timeout_s": 120}
    try:
        for _ in range(episodes):
            fill_pool()  # the refill job's work, off the episode's clock
            model = TimedModel(model_ms / 1000)
            ready: list[float] = []

            def on_event(kind: str, message: str, data: dict[str, Any]) -> None:
                if kind == "system" and message == "set-up done":
                    ready.append(time.perf_counter())

            started = time.perf_counter()
            result = asyncio.run(run_episode(config=config, llm=model, sandbox_backend="opensandbox",
                                             on_event=on_event))
            out["episode_ms"].append((time.perf_counter() - started) * 1000)
            if result.outcome != "success":
                raise RuntimeError(f"the episode ended {result.outcome}: {result.outcome_reason}")
            out["first_tool_waited_ms"].append(max(0.0, (ready[0] - model.first_answer) * 1000))
        out["acquire_ms"] = acquired
    finally:
        lease.acquire = acquire
        settings.SANDBOX_POOL_IMAGES = ""
        fill_pool()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--start-ms", type=float, default=1500.0, help="the fake's sandbox create time")
    parser.add_argument("--model-ms", type=float, default=600.0, help="the model stand-in's latency per call")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-sandbox-pool-", dir="/var/tmp"))
    fake = slow_fake(tmp / "fake", args.start_ms / 1000)
    (tmp / "fake").mkdir()
    try:
        fake.start()
        from bench.rollout_overhead import setup_django

        setup_django(tmp, database_url=None, env={
            "SANDBOX_BACKEND": "opensandbox", "OPENSANDBOX_URL": fake.url, "OPENSANDBOX_API_KEY": fake.api_key,
            "SANDBOX_POOL_SIZE": "0"})
        import logging

        logging.getLogger("apps.engines.sandboxes").setLevel(logging.ERROR)  # the fake's downgrade notes
        cold = run_pass(args.episodes, args.model_ms, warm=False)
        warm = run_pass(args.episodes, args.model_ms, warm=True)
    except Exception as exc:
        print(f"cannot run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        fake.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"code_exec episodes on OpenSandbox (loopback fake, create {args.start_ms:.0f} ms), model "
          f"{args.model_ms:.0f} ms per call, {args.episodes} episodes per pass; medians:")
    print(f"{'':>6} {'acquire ms':>11} {'first tool waited ms':>21} {'episode ms':>11}")
    for name, rows in (("cold", cold), ("warm", warm)):
        print(f"{name:>6} {statistics.median(rows['acquire_ms']):>11.1f} "
              f"{statistics.median(rows['first_tool_waited_ms']):>21.1f} {statistics.median(rows['episode_ms']):>11.1f}")
    for key in ("acquire_ms", "episode_ms"):
        ratio = statistics.median(warm[key]) / statistics.median(cold[key])
        print(f"ratio warm/cold {key[:-3]}: {ratio:.3f}")
    hidden = statistics.median(warm["first_tool_waited_ms"]) == 0.0
    print(f"sandbox start hidden with a warm pool: {'yes' if hidden else 'no'} (the first tool call waited "
          f"{statistics.median(warm['first_tool_waited_ms']):.1f} ms warm, "
          f"{statistics.median(cold['first_tool_waited_ms']):.1f} ms cold)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
