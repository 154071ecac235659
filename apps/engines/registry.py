"""The scene registry: every scene the platform knows, collected from the scenes' declarations.

Each package under apps/engines/scenes/ with a scene.py declares one scene (`SCENE`, an
apps.engines.runtime.Scene); settings.SCENE_PACKAGES names scene packages elsewhere. Everything
keyed by scene id derives from those declarations: `SCENES` (model choices, import
validation, the API's /scenes), the runtimes (`get_runtime`), the review rubrics, the
generation pipelines and the scene-only export formats. Adding a scene is one package
(docs/new-scene.md).

A task's `scene_config` is validated against its scene's JSON schema (jsonschema, draft
2020-12) when the task is created or imported. Runtimes, checks and pipelines are named as
"module:attribute" and imported on first use, so loading the registry imports no runtime.
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from types import ModuleType
from typing import Any

from django.conf import settings

from apps.engines import scenes as builtin_scenes
from apps.engines.runtime import (
    GENERIC_RUBRIC,
    NoEngineError,
    Scene,
    SceneConfigError,
    SceneRuntime,
    install_scene_directory,
)

__all__ = ["PIPELINES", "RUBRICS", "RUNTIMES", "SCENES", "SCENE_CHOICES", "Scene", "SceneConfigError", "export_scenes",
           "get_runtime", "get_scene", "has_runtime", "load", "register_runtime", "rubric_for", "rubric_id",
           "scene_choices", "text_form_rewrites", "validate_scene_config"]

# All filled by load(), in place (modules that imported them see the update).
SCENES: dict[str, Scene] = {}
SCENE_CHOICES: list[tuple[str, str]] = []
RUNTIMES: dict[str, str] = {}  # scene id -> "module:Class"; register_runtime adds runtimes of its own
RUBRICS: dict[str, dict[str, str]] = {}
PIPELINES: dict[str, str] = {}  # scene id -> "module:function" building its Pipeline from a run's config
_instances: dict[str, SceneRuntime] = {}


class SceneDeclarationError(Exception):
    """A scene package whose scene.py does not declare a usable scene."""


def _declaration(package: str) -> Scene:
    try:
        module = importlib.import_module(f"{package}.scene")
    except ModuleNotFoundError as exc:
        if exc.name == package:
            raise SceneDeclarationError(f"scene package {package} not found (settings.SCENE_PACKAGES)") from None
        if exc.name == f"{package}.scene":
            raise SceneDeclarationError(f"scene package {package}: no scene.py") from None
        raise
    scene = getattr(module, "SCENE", None)
    if not isinstance(scene, Scene):
        raise SceneDeclarationError(f"{package}.scene: SCENE must be an apps.engines.runtime.Scene, "
                                    f"got {type(scene).__name__}")
    return scene


def scene_packages() -> list[str]:
    """The packages declaring scenes: each package under apps/engines/scenes with a scene.py,
    then settings.SCENE_PACKAGES."""
    found = [f"{builtin_scenes.__name__}.{m.name}" for m in pkgutil.iter_modules(builtin_scenes.__path__)
             if m.ispkg and importlib.util.find_spec(f"{builtin_scenes.__name__}.{m.name}.scene") is not None]
    return sorted(found) + [p for p in settings.SCENE_PACKAGES if p not in found]


def load() -> None:
    """(Re)collect the declarations (at import; again after settings.SCENE_PACKAGES changes)."""
    declared: list[Scene] = []
    for package in scene_packages():
        scene = _declaration(package)
        clash = next((s for s in declared if s.id == scene.id), None)
        if clash is not None:
            raise SceneDeclarationError(f"scene id {scene.id!r} is declared twice ({package})")
        declared.append(scene)
    declared.sort(key=lambda s: (s.order, s.id))
    for table in (SCENES, RUBRICS, PIPELINES):
        table.clear()
    for scene_id in [s for s in RUNTIMES if s in _declared_runtimes]:
        RUNTIMES.pop(scene_id)
        _instances.pop(scene_id, None)
    _declared_runtimes.clear()
    for scene in declared:
        SCENES[scene.id] = scene
        RUBRICS[scene.id] = scene.rubric
        if scene.pipeline:
            PIPELINES[scene.id] = scene.pipeline
        if scene.runtime and scene.id not in RUNTIMES:
            RUNTIMES[scene.id] = scene.runtime
            _declared_runtimes.add(scene.id)
    SCENE_CHOICES[:] = [(s.id, s.title) for s in SCENES.values()]


_declared_runtimes: set[str] = set()


def scene_choices() -> list[tuple[str, str]]:
    """(id, title) of every scene: the model field's choices, a callable so that a new scene needs
    no migration (Django calls it where the choices are used and keeps the reference in migrations)."""
    return list(SCENE_CHOICES)


def get_scene(scene_id: str) -> Scene:
    try:
        return SCENES[scene_id]
    except KeyError:
        raise KeyError(f"unknown scene {scene_id!r}; valid scenes: {', '.join(SCENES)}") from None


def scene_ids() -> list[str]:
    return list(SCENES)


def validate_scene_config(scene_id: str, config: Any) -> dict[str, Any]:
    """Return the config with the scene's defaults filled in, or raise SceneConfigError."""
    scene = get_scene(scene_id)
    if not isinstance(config, dict):
        raise SceneConfigError([("config", f"must be a JSON object, got {type(config).__name__}")])
    errors = sorted(scene.validator().iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise SceneConfigError(
            [("config" + "".join(f".{p}" for p in e.absolute_path), e.message) for e in errors]
        )
    config = {**scene.defaults, **config}
    if scene.check:
        problems = _attribute(scene.check)(config)
        if problems:
            raise SceneConfigError(problems)
    return config


def _attribute(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


# -- runtimes ------------------------------------------------------------------------------------

def register_runtime(scene_id: str, target: str | type[SceneRuntime]) -> None:
    """Register a runtime class (or its "module:Class" path) for a scene id, in place of the
    declared one (bench and tests run scenes with runtimes of their own)."""
    _instances.pop(scene_id, None)
    _declared_runtimes.discard(scene_id)
    if isinstance(target, str):
        RUNTIMES[scene_id] = target
    else:
        RUNTIMES[scene_id] = f"{target.__module__}:{target.__qualname__}"
        _instances[scene_id] = target()


def has_runtime(scene_id: str) -> bool:
    return scene_id in RUNTIMES


def get_runtime(scene_id: str) -> SceneRuntime:
    """The runtime of a scene; NoEngineError("scene X has no engine yet") when there is none."""
    if scene_id in _instances:
        return _instances[scene_id]
    target = RUNTIMES.get(scene_id)
    if target is None:
        if scene_id in SCENES:
            raise NoEngineError(f"scene {scene_id} has no engine yet")
        raise NoEngineError(f"unknown scene {scene_id!r}; valid scenes: {', '.join(SCENES)}")
    runtime = _attribute(target)()
    _instances[scene_id] = runtime
    return runtime


def text_form_rewrites(scene_id: str, scene_config: dict[str, Any] | None = None) -> dict[str, str | None]:
    """How the scene's system prompt reads when an export ends its episodes on a text answer
    (apps/datasets/exporters/answers.py): its runtime's `text_form_rewrites`, each sentence that names
    the finish tool -> its text-form sentence (None drops it); a scene composing another
    (scene_config.base_scene, multi_agent) adds the base scene's. {} for a scene without a runtime or
    a runtime that declares none (the export then counts its prompts as unrewritten)."""
    if not has_runtime(scene_id):
        return {}
    rewrites = dict(getattr(get_runtime(scene_id), "text_form_rewrites", None) or {})
    base = (scene_config or {}).get("base_scene")
    if isinstance(base, str) and base and base != scene_id:
        rewrites = {**text_form_rewrites(base), **rewrites}
    return rewrites


# -- review rubrics, export formats --------------------------------------------------------------

def rubric_for(scene_id: str) -> dict[str, str]:
    """The judge's criteria for the scene's trajectories (the generic ones for an unknown scene)."""
    return RUBRICS.get(scene_id, GENERIC_RUBRIC)


def rubric_id(scene_id: str) -> str:
    """scene@version: what a cached judge answer is keyed by."""
    scene = SCENES.get(scene_id)
    return f"{scene_id}@{scene.rubric_version if scene else '1'}"


def export_scenes(format_name: str) -> tuple[str, ...]:
    """The scenes that declare an export format as theirs, in scene order; () for a format of all scenes."""
    return tuple(s.id for s in SCENES.values() if format_name in s.export_formats)


load()
_self: ModuleType = sys.modules[__name__]
install_scene_directory(_self)  # type: ignore[arg-type]  # this module is the scene directory
