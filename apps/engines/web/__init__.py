"""The web toolset shared by scenes (search2qa, deep_search, ...): docs/web.md.

corpus.py builds and queries the offline web (SQLite FTS5), live.py searches and fetches the
real web (recorded for replay), toolset.py turns either into the search / open / find tools.
"""
from apps.engines.web.toolset import WebToolset, episode_toolset, opened_urls, web_tools, web_toolset

__all__ = ["WebToolset", "episode_toolset", "opened_urls", "web_tools", "web_toolset"]
