"""Imports sit at the top of a module; one inside a function says why it waits.

The layering (.importlinter, `make lint-imports`) counts every import statement, but an import
placed inside a function also hides a module's dependencies from its reader. It is allowed only
where it defers a heavy import or follows Django's AppConfig.ready pattern, and then the line
carries `# deferred: <reason>`.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, source line) of every import statement inside a function or method of the file."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    found.append((inner.lineno, lines[inner.lineno - 1].strip()))
    return sorted(set(found))


def product_modules() -> list[Path]:
    return sorted(p for top in ("apps", "trajplatform") for p in (ROOT / top).rglob("*.py")
                  if "migrations" not in p.parts)


def test_every_import_inside_a_function_says_why_it_is_deferred():
    undeclared = [f"{path.relative_to(ROOT)}:{line}: {source}"
                  for path in product_modules()
                  for line, source in imports_inside_functions(path)
                  if "# deferred:" not in source]
    assert not undeclared, "imports inside functions without a '# deferred: <reason>':\n" + "\n".join(undeclared)


def test_the_check_sees_an_import_inside_a_method(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\nclass A:\n    def f(self):\n        import json\n"
                      "        from x import y  # deferred: heavy\n        return json\n")
    assert imports_inside_functions(module) == [(5, "import json"), (6, "from x import y  # deferred: heavy")]
