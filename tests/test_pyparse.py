"""trajplatform.pyparse: parsing from several threads at once (CPython 3.11's ast2obj keeps its
recursion depth in per-interpreter state; a finalizer run by a collection inside one thread's
parse lets another thread parse and the first fails with SystemError — it failed `make demo`'s
toolace pipeline)."""
from __future__ import annotations

import gc
import sys
import threading
from pathlib import Path
from typing import Callable

import pytest

from trajplatform.pyparse import parse_python

SOURCE = (Path(__file__).resolve().parent.parent / "apps" / "engines" / "scenes" / "envscaler" / "importer.py").read_text()


class _Finalized:
    """Garbage in a reference cycle whose finalizer runs Python code (a GIL switch point)."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(50))


def _parse_in_threads(parse: Callable[[str], object], threads: int = 4, rounds: int = 40) -> list[str]:
    errors: list[str] = []

    def work() -> None:
        for _ in range(rounds):
            for _ in range(20):
                _Finalized()
            try:
                parse(SOURCE)
            except SystemError as exc:
                errors.append(str(exc))
                return

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 5, 5)
    try:
        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    return errors


def test_parsing_from_many_threads_never_fails_with_a_system_error() -> None:
    assert _parse_in_threads(parse_python) == []


def test_it_parses_and_refuses_as_ast_parse_does() -> None:
    import ast

    tree = parse_python("def check(env):\n    return env['x'] == 1\n")
    assert isinstance(tree, ast.Module) and tree.body[0].name == "check"
    assert isinstance(parse_python("f(a=1)", mode="eval"), ast.Expression)
    with pytest.raises(SyntaxError):
        parse_python("def (")
    with pytest.raises((SyntaxError, ValueError)):  # NUL bytes: ValueError before 3.11.4, SyntaxError since
        parse_python("x = 1\0")
