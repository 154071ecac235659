"""Every module of the platform has a place in the layering `lint-imports` checks.

import-linter's layers contract constrains only the modules its layers name; a new module outside
them would be free to import anything. This test fails when a module of apps/ or trajplatform/
is neither inside a layer of .importlinter nor a page (views, admin, urls, consumers, api,
management commands, migrations, the AppConfig modules), which sit above every layer.
"""
from __future__ import annotations

import configparser
import re
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PAGE = re.compile(r"^(apps\.\w+|trajplatform)\.(views|admin|urls|consumers|api|management|migrations|apps)(\.|$)")
PACKAGES = {"apps", "trajplatform"} | {f"apps.{p.name}" for p in (ROOT / "apps").iterdir() if (p / "__init__.py").exists()}


def layer_items(config_text: str) -> list[str]:
    config = configparser.ConfigParser()
    config.read_string(config_text)
    return [t for t in config["importlinter:contract:layers"]["layers"].split() if t not in {"|", ":"}]


def outside_layers(modules: set[str], items: list[str]) -> list[str]:
    return sorted(m for m in modules
                  if m not in PACKAGES and not PAGE.match(m)
                  and not any(m == item or m.startswith(item + ".") for item in items))


def test_every_module_is_in_a_layer_or_a_page():
    graph = grimp.build_graph("apps", "trajplatform", cache_dir=None)
    missing = outside_layers(set(graph.modules), layer_items((ROOT / ".importlinter").read_text()))
    assert not missing, "modules in no layer of .importlinter: " + ", ".join(missing)


def test_a_module_left_out_is_reported():
    items = layer_items("[importlinter:contract:layers]\nlayers =\n    apps.tasks\n    apps.engines.llm : apps.engines.agent\n")
    modules = {"apps.tasks.models", "apps.engines.llm", "apps.engines.newthing", "apps.tasks.views", "apps.engines"}
    assert outside_layers(modules, items) == ["apps.engines.newthing"]
