"""MCP servers of our own, run INSIDE the sandbox (profile trajplatform-mcp puts this directory,
read-only, on the sandbox's PYTHONPATH): `python3 -m sqlite_server --db PATH`."""
