"""The toucan scene (Toucan, arXiv 2510.01179): questions synthesized over real MCP servers.

- registry.py: the MCP server registry (`McpServer`): records validated, their tools
  snapshotted from a real tools/list in a sandbox, stored with an audit row.
- fixtures.py: what a server's episode starts with (files, a seed git repo, pages served on
  the sandbox's loopback), set up inside the sandbox before the server starts.
- servers/: MCP servers of our own, run inside the sandbox (sqlite_server).

See docs/mcp.md ("MCP server registry").
"""
