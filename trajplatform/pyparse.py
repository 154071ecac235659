"""Parsing Python source into an AST from several threads at once.

CPython 3.11 keeps the recursion depth of its AST conversion (`ast2obj`) in per-interpreter
state. When a garbage collection inside one thread's `ast.parse` runs a finalizer, the GIL may
pass to another thread that parses too, and the first one then fails with
`SystemError: AST constructor recursion depth mismatch` (CPython gh-106905, fixed in 3.12.5 and
3.13, never in 3.11). Pipelines gate generated code in worker threads (envscaler's static checks,
toolace's suite and task gates), so every `ast.parse` of ours goes through `parse_python`, which
holds one process-wide lock while parsing (re-entrant: a finalizer that parses on the same thread
nests properly). `make demo`'s toolace pipeline met the failure; tests/test_pyparse.py
reproduces it with raw `ast.parse` and sees none through this function.
"""
from __future__ import annotations

import ast
import threading

_lock = threading.RLock()


def parse_python(source: str | bytes, *, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, safe to call from any thread (raises SyntaxError /
    ValueError exactly as ast.parse does)."""
    with _lock:
        return ast.parse(source, filename=filename, mode=mode)
