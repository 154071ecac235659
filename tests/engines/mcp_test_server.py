"""A tiny MCP server for the hub's tests; runs INSIDE a sandbox (the platform's python profile).

    python3 mcp_test_server.py NAME                  # stdio
    python3 mcp_test_server.py NAME HOST PORT        # streamable HTTP at /mcp
"""
from __future__ import annotations

import base64
import os
import sys
import time

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from mcp.types import ImageContent, ResourceLink, TextContent

NAME = sys.argv[1]
mcp = FastMCP(NAME)
COUNTER = {"n": 0}
# A real 1x1 PNG: the artifact store measures every image it keeps and refuses bytes that are not one.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


@mcp.tool
def echo(text: str) -> str:
    """Say the text back, with the server's name."""
    COUNTER["n"] += 1
    return f"{NAME}: {text}"


@mcp.tool
def fail(message: str) -> str:
    """Refuse with the message."""
    raise ToolError(message)


@mcp.tool
def nap(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return f"slept {seconds}"


@mcp.tool
def picture() -> list:
    """A caption and a PNG."""
    return [TextContent(type="text", text="a picture"), ImageContent(type="image", data=PNG, mimeType="image/png")]


@mcp.tool
def link() -> list:
    """A resource link."""
    return [ResourceLink(type="resource_link", name="report", uri="file:///workspace/report.txt",
                         description="the report")]


@mcp.tool
def counter() -> dict:
    """Platform only: how many echoes so far."""
    return dict(COUNTER)


@mcp.tool
def wipe() -> str:
    """Denied to everyone."""
    return "wiped"


@mcp.tool
def crash() -> str:
    """The server dies."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        mcp.run(transport="http", host=sys.argv[2], port=int(sys.argv[3]), show_banner=False,
                host_origin_protection=False)
    else:
        mcp.run(transport="stdio", show_banner=False)
