#!/usr/bin/env python
"""Benchmark the envscaler scene's environment transport: MCP over stdio into a local sandbox.

    .venv/bin/python bench/envscaler.py [--calls 200] [--starts 5]

Measures (median and p90):

- one tools/call to a bundled environment (WarehouseInventory.get_stock) served by fastmcp
  inside a bubblewrap sandbox, the platform being a fastmcp Client over stdio (what every
  agent step costs), beside the same call to the same server script run in-process
  (fastmcp's in-memory transport: no process, no pipes, no sandbox);
- starting an environment: spawn + MCP initialize + tools/list (what every episode's set-up
  costs), beside the same server started over stdio without a sandbox.

This is a benchmark, not a test: it prints numbers and ratios and exits 0.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")


def stats(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
    return f"median {statistics.median(values) * 1000:8.2f} ms   p90 {p90 * 1000:8.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--starts", type=int, default=5)
    options = parser.parse_args()

    import django

    django.setup()
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport

    from apps.engines.scenes.envscaler import server as env_server
    from apps.engines.scenes.envscaler.runtime import SERVER_ENV, SERVER_PATH, SERVER_SOURCE, SPEC_PATH, server_spec
    from apps.engines.mcp.session import McpSession as EnvSession
    from apps.engines.sandboxes import PLATFORM_PYTHON_PROFILE, SandboxSpec
    from apps.engines.sandboxes.local import LocalBackend

    examples = Path(__file__).resolve().parent.parent / "examples" / "envscaler"
    metadata = {e["env_name"]: e for e in json.loads((examples / "metadata.json").read_text())}
    scenario = next(s for s in json.loads((examples / "scenarios.json").read_text())
                    if s["env_name"] == "WarehouseInventory")
    env = metadata["WarehouseInventory"]
    spec = server_spec({"env_name": env["env_name"], "code": env["code"], "operations": env["operations"],
                        "init_config": scenario["init_config"]})
    args = {"sku": "SKU-100"}

    async def in_memory() -> tuple[list[float], float]:
        started = time.perf_counter()
        async with Client(env_server.build_server(spec)) as client:
            await client.list_tools()
            start = time.perf_counter() - started
            times = []
            for _ in range(options.calls):
                t = time.perf_counter()
                await client.call_tool_mcp("get_stock", args)
                times.append(time.perf_counter() - t)
        return times, start

    memory_calls, _ = asyncio.run(in_memory())

    backend = LocalBackend(records=False)
    sandbox_calls: list[float] = []
    sandbox_starts: list[float] = []
    with backend.create(SandboxSpec(image=PLATFORM_PYTHON_PROFILE)) as sandbox:
        sandbox.write_file(SERVER_PATH, SERVER_SOURCE.read_bytes())
        sandbox.write_file(SPEC_PATH, json.dumps(spec).encode())
        for i in range(options.starts):
            t = time.perf_counter()
            session = EnvSession.start(sandbox.stdio_command(["python3", SERVER_PATH, "serve", SPEC_PATH],
                                                             lifetime=600, env=SERVER_ENV), start_timeout=60)
            sandbox_starts.append(time.perf_counter() - t)
            if i == 0:
                for _ in range(options.calls):
                    t = time.perf_counter()
                    session.call("get_stock", args, timeout=30)
                    sandbox_calls.append(time.perf_counter() - t)
            session.close()

    plain_starts = []
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(spec))

        async def plain_start() -> None:
            transport = StdioTransport(command=sys.executable, args=[str(SERVER_SOURCE), "serve", str(spec_file)],
                                       env=dict(SERVER_ENV), keep_alive=False, log_file=Path(tmp) / "err")
            async with Client(transport) as client:
                await client.list_tools()

        for _ in range(options.starts):
            t = time.perf_counter()
            asyncio.run(plain_start())
            plain_starts.append(time.perf_counter() - t)

    print(f"tools/call, in-process (memory transport): {stats(memory_calls)}")
    print(f"tools/call, stdio into the sandbox:        {stats(sandbox_calls)}")
    print(f"  ratio sandbox/in-process (median):       "
          f"{statistics.median(sandbox_calls) / statistics.median(memory_calls):.2f}x")
    print(f"start + initialize, stdio, no sandbox:     {stats(plain_starts)}")
    print(f"start + initialize, stdio, in the sandbox: {stats(sandbox_starts)}")
    print(f"  ratio sandbox/plain (median):            "
          f"{statistics.median(sandbox_starts) / statistics.median(plain_starts):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
