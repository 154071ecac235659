#!/usr/bin/env python
"""Benchmark the mobile_agent device channel against the simulated device (issue 26): a report, no target.

    .venv/bin/python bench/mobile.py [--episodes 20] [--actions 50]

1. Per-episode start: `start_simulator` (a fresh device with the demo's contacts, its ADB server on
   127.0.0.1:<ephemeral>) + the channel's first contact (`get-state`) + the first observation
   (uiautomator dump over sync + screencap), p50 / p95 in ms, and the stop.
2. Actions through the unmodified adbutils (`input tap` on the Wi-Fi switch, `input text`,
   `input keyevent`, `input swipe`): actions/s alone, and actions/s with the observation the
   runtime takes after each one (dump + screencap; the PNG encode is the simulator's cost).
3. What one observation costs: uiautomator dump, screencap (bytes of PNG), `settings get` (a check).

A benchmark, not a test: it prints numbers and exits 0 (1 if it cannot run).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
os.environ.setdefault("ADBUTILS_ADB_PATH", "/bin/false")  # never a real adb server


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(values: list[float]) -> str:
    return (f"p50 {pct(values, 0.5) * 1000:.1f} ms, p95 {pct(values, 0.95) * 1000:.1f} ms, "
            f"max {max(values) * 1000:.1f} ms (n={len(values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--actions", type=int, default=50)
    args = parser.parse_args()
    import django

    django.setup()
    from apps.engines.scenes.mobile_agent.device import DeviceChannel, Endpoint
    from apps.engines.scenes.mobile_agent.sim import initial_state, start_simulator

    people = [{"display_name": f"Person {n}", "number": f"555-01{n:02d}"} for n in range(12)]
    starts, firsts, stops = [], [], []
    for _ in range(args.episodes):
        t0 = time.perf_counter()
        sim = start_simulator(initial_state({"contacts": people, "app": "com.android.settings"}))
        channel = DeviceChannel(Endpoint(sim.host, sim.port, sim.serial), mode="simulated")
        channel.require_device()
        t1 = time.perf_counter()
        channel.observe()
        t2 = time.perf_counter()
        sim.stop()
        t3 = time.perf_counter()
        starts.append(t1 - t0)
        firsts.append(t2 - t0)
        stops.append(t3 - t2)
    print(f"episode start (simulator + get-state): {ms(starts)}")
    print(f"episode start to the first observation: {ms(firsts)}")
    print(f"simulator stop: {ms(stops)}")

    sim = start_simulator(initial_state({"contacts": people, "app": "com.android.settings"}))
    channel = DeviceChannel(Endpoint(sim.host, sim.port, sim.serial), mode="simulated")
    actions = [lambda: channel.tap(626, 236), lambda: channel.input_text("hello world"),
               lambda: channel.keyevent(4), lambda: channel.swipe(360, 900, 360, 400, 300),
               lambda: channel.launch("com.android.settings", ".Settings")]
    try:
        t0 = time.perf_counter()
        for n in range(args.actions):
            actions[n % len(actions)]()
        bare = time.perf_counter() - t0
        print(f"actions through adbutils: {args.actions / bare:.1f} actions/s ({bare / args.actions * 1000:.1f} ms each)")
        per_step = []
        for n in range(args.actions):
            t = time.perf_counter()
            actions[n % len(actions)]()
            channel.observe()
            per_step.append(time.perf_counter() - t)
        print(f"action + observation (the runtime's step): {len(per_step) / sum(per_step):.1f} steps/s; {ms(per_step)}")
        dumps, shots, checks, sizes = [], [], [], []
        for _ in range(args.actions):
            t = time.perf_counter()
            channel.dump()
            dumps.append(time.perf_counter() - t)
            t = time.perf_counter()
            png = channel.device.shell(["screencap", "-p"], encoding=None)
            shots.append(time.perf_counter() - t)
            sizes.append(len(png))
            t = time.perf_counter()
            channel.shell("settings get global wifi_on")
            checks.append(time.perf_counter() - t)
        print(f"uiautomator dump + sync RECV: {ms(dumps)}")
        print(f"screencap -p: {ms(shots)}; PNG {statistics.mean(sizes) / 1024:.1f} KiB on average (720x1280)")
        print(f"a shell check (settings get, shell2 v1): {ms(checks)}")
        print(f"adb requests served: {sim.requests}")
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
