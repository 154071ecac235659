"""docs/configuration.md lists every environment variable the platform reads, and only those.

Read by the platform: every env_str/env_int/env_bool/env_float/env_list call, os.environ.get,
os.getenv and os.environ[...] with a literal name in trajplatform/ and apps/ (settings.py and the
modules that read a variable where they use it; parsed with ast, so a name in a comment or a
docstring does not count), plus the variables the LLM provider profiles name
(apps/engines/profiles.json), which llm.py reads by those names. Named by the doc: the
backticked name in the first cell of each table row. Its "Set for libraries" table is the
exception: those are variables our code never reads, and each must be set by the Makefile or by
the code (os.environ.setdefault) for the library that does. A literal default in the code must
appear in the row's default cell, as must a profile's URL and current model.
"""
from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
PROFILES = ROOT / "apps" / "engines" / "profiles.json"
LIBRARIES_HEADING = "## Set for libraries"
ENV_FUNCTIONS = {"env_str", "env_int", "env_bool", "env_float", "env_list"}
MAY_READ = re.compile(r"environ|getenv|\benv_(?:str|int|bool|float|list)\(")
ROW = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|([^|]*)\|")


def _is_os_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _constant(node: ast.AST | None) -> object:
    """The value of a literal default (numbers combined by operators included), else None."""
    if node is None or not all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
                               for n in ast.walk(node)):
        return None
    return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}})  # literals only


def env_uses(source: str) -> tuple[dict[str, list[object]], set[str]]:
    """({name: [literal defaults]} read by the source, {names it sets with os.environ.setdefault})."""
    reads: dict[str, list[object]] = {}
    sets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _is_os_environ(node.value) and isinstance(node.ctx, ast.Load):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                reads.setdefault(node.slice.value, [])
            continue
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            continue
        func, name = node.func, node.args[0].value
        default = node.args[1] if len(node.args) > 1 else None
        if isinstance(func, ast.Name) and func.id in ENV_FUNCTIONS or (
                isinstance(func, ast.Attribute) and (func.attr == "get" and _is_os_environ(func.value)
                                                     or func.attr == "getenv")):
            found = reads.setdefault(name, [])
            value = _constant(default)
            if value not in (None, ""):
                found.append(value)
        elif isinstance(func, ast.Attribute) and func.attr == "setdefault" and _is_os_environ(func.value):
            sets.add(name)
    return reads, sets


@lru_cache(maxsize=1)
def platform_env() -> tuple[dict[str, list[object]], set[str]]:
    reads: dict[str, list[object]] = {}
    sets: set[str] = set()
    for folder in ("trajplatform", "apps"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            if not MAY_READ.search(source):
                continue  # cannot read a variable: not worth parsing
            file_reads, file_sets = env_uses(source)
            for name, defaults in file_reads.items():
                reads.setdefault(name, []).extend(defaults)
            sets |= file_sets
    for profile in json.loads(PROFILES.read_text(encoding="utf-8"))["profiles"].values():
        for key in ("key_var", "url_var", "model_var", "optional_key_var"):
            if profile.get(key):
                reads.setdefault(profile[key], [])
        for key, var in (("default_url", "url_var"), ("default_model", "model_var")):
            if profile.get(key) and profile.get(var) and profile[var] != "OFFLINE_MODEL_URL":
                reads[profile[var]].append(profile[key])
    return reads, sets


def doc_rows(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """({name: default cell} of the platform's tables, {name: value cell} of the libraries' table)."""
    platform: dict[str, str] = {}
    libraries: dict[str, str] = {}
    table = platform
    for line in text.splitlines():
        if line.startswith("## "):
            table = libraries if line.strip() == LIBRARIES_HEADING else platform
        match = ROW.match(line)
        if match:
            assert match.group(1) not in platform and match.group(1) not in libraries, f"{match.group(1)} listed twice"
            table[match.group(1)] = match.group(2)
    return platform, libraries


def shows_default(cell: str, default: object) -> bool:
    shown = re.findall(r"`([^`]*)`", cell)
    if isinstance(default, bool):
        return ("1" if default else "0") in shown
    if isinstance(default, (int, float)):
        return any(_number(item) == default for item in shown)
    return str(default) in shown


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def makefile_exports() -> set[str]:
    return set(re.findall(r"^export ([A-Z][A-Z0-9_]*)\s*[:?]?=", (ROOT / "Makefile").read_text(), re.M))


def test_every_variable_the_platform_reads_is_documented():
    reads, _ = platform_env()
    platform, _ = doc_rows(DOC.read_text(encoding="utf-8"))
    assert sorted(set(reads) - set(platform)) == []


def test_the_doc_lists_no_variable_nobody_reads():
    reads, _ = platform_env()
    platform, _ = doc_rows(DOC.read_text(encoding="utf-8"))
    assert sorted(set(platform) - set(reads)) == []


def test_each_literal_default_is_the_documented_one():
    reads, _ = platform_env()
    platform, _ = doc_rows(DOC.read_text(encoding="utf-8"))
    wrong = {name: (default, platform[name]) for name, defaults in reads.items() if name in platform
             for default in defaults if not shows_default(platform[name], default)}
    assert wrong == {}


def test_the_libraries_variables_are_set_by_us_and_read_only_by_the_libraries():
    reads, sets = platform_env()
    _, libraries = doc_rows(DOC.read_text(encoding="utf-8"))
    assert libraries, f"no table under {LIBRARIES_HEADING!r}"
    assert sorted(set(libraries) - makefile_exports() - sets) == []
    assert sorted(set(libraries) & set(reads)) == []


def test_the_checks_see_reads_defaults_and_rows_and_ignore_mentions():
    source = '''
"""Reads NOT_A_READ_IN_A_DOCSTRING."""
import os
# os.environ.get("NOT_A_READ_IN_A_COMMENT")
A = env_int("ALPHA_N", 32 << 20)
B = os.environ.get("BETA_URL", "http://x")
C = os.environ["GAMMA"]
D = os.getenv("DELTA_FLAG")
E = env_bool("EPS_ON", False)
os.environ.setdefault("ZETA_OFF", "1")
'''
    reads, sets = env_uses(source)
    assert reads == {"ALPHA_N": [33554432], "BETA_URL": ["http://x"], "GAMMA": [], "DELTA_FLAG": [], "EPS_ON": [False]}
    assert sets == {"ZETA_OFF"}
    doc = "## Some\n\n| `ALPHA_N` | `33554432` (32 MiB) | x |\n| `EPS_ON` | `0` | y |\n## Set for libraries\n| `ZETA_OFF` | `1` | z |\n"
    platform, libraries = doc_rows(doc)
    assert set(platform) == {"ALPHA_N", "EPS_ON"} and set(libraries) == {"ZETA_OFF"}
    assert set(reads) - set(platform) == {"BETA_URL", "GAMMA", "DELTA_FLAG"}  # what the first test reports
    assert shows_default(platform["ALPHA_N"], 33554432) and shows_default(platform["EPS_ON"], False)
    assert not shows_default(platform["ALPHA_N"], 64) and not shows_default("| `off` |", "on")
