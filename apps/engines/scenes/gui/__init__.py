"""The gui scene: a real browser in the sandbox (docs/gui.md).

- server.py: the browser MCP server on Playwright, run inside the sandbox (agent and platform-only tools).
- sites.py: the bundled web apps (shop, mail, admin) a `site` task serves on the sandbox's loopback.
- checks.py: the verifier's check kinds (miniwob, js, url, program_html, answer, site_state).
- runtime.py: the scene runtime on the MCP hub; screenshots into the artifact store.
"""
