"""The search2qa scene: a WebExplorer / ASearcher-style factory of verified multi-hop QA pairs.

runtime.py (the stages, in the task's episode and its sub-episodes), prompts.py (stage prompts,
finish tools, key lines for the offline model), gates.py (the code gates), emit.py (the
deep_search task with its executed solver run). See docs/search2qa.md.
"""
