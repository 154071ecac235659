"""A tenth scene is one package plus its tests (docs/new-scene.md): the toy scene of
tests/engines/toy_scene/ (scene.py + runtime.py), named in settings.SCENE_PACKAGES, is found by
the registry, its tasks validate against its declaration, an episode of it runs on the shared
loop, and its trajectory is judged with its own rubric."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import pytest
from django.apps import apps
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState
from django.test import override_settings

from apps.engines import registry
from apps.engines.runtime import NoEngineError, Scene, get_runtime
from apps.reviews.review_agent import judge, run_checks
from apps.tasks.models import Task
from apps.tasks.services import TaskCreateError, tasks_create
from tests.engines.test_agent import call, config_for, llm_env, run, scripted  # noqa: F401 (llm_env: a fixture)
from tests.engines.toy_scene.runtime import ToyRuntime
from tests.reviews.factories import finished_trajectory
from tests.reviews.test_review_agent import FakeJudge

ROOT = Path(__file__).resolve().parents[2]
TOY = "tests.engines.toy_scene"


@pytest.fixture
def toy() -> Iterator[Scene]:
    with override_settings(SCENE_PACKAGES=[TOY]):
        registry.load()
        yield registry.SCENES["toy"]
    registry.load()


def test_the_nine_scenes_are_declared_by_their_packages() -> None:
    assert list(registry.SCENES) == ["code_exec", "envscaler", "toolace", "search2qa", "toucan", "mobile_agent",
                                     "gui", "deep_search", "multi_agent"]
    for scene in registry.SCENES.values():
        assert registry.RUNTIMES[scene.id] == scene.runtime and scene.runtime.startswith(f"apps.engines.scenes.{scene.id}.")
        assert (ROOT / scene.docs).is_file(), scene.docs
    assert registry.PIPELINES == {"toolace": "apps.engines.scenes.toolace.pipeline:build",
                                  "toucan": "apps.engines.scenes.toucan.pipeline:build"}
    assert registry.export_scenes("qa") == ("search2qa", "deep_search") and registry.export_scenes("rl") == ()


def test_a_scene_package_named_in_settings_joins_every_scene_list(toy: Scene) -> None:
    assert list(registry.SCENES)[-1] == "toy" and registry.SCENE_CHOICES[-1] == ("toy", "Toy (sums)")
    assert isinstance(get_runtime("toy"), ToyRuntime)
    assert registry.rubric_for("toy") == toy.rubric and registry.rubric_id("toy") == "toy@2"
    assert "toy" not in registry.PIPELINES


def test_a_new_scene_is_a_valid_task_scene_and_needs_no_migration(toy: Scene) -> None:
    Task._meta.get_field("scene").validate("toy", None)  # the model's choices (forms, full_clean) have it
    loader = MigrationLoader(None, ignore_no_migrations=True)  # makemigrations' view of the models, no database
    assert MigrationAutodetector(loader.project_state(), ProjectState.from_apps(apps)).changes(loader.graph) == {}


def test_without_the_setting_the_toy_scene_is_unknown() -> None:
    assert "toy" not in registry.SCENES and "toy" not in registry.RUNTIMES
    with pytest.raises(NoEngineError, match="unknown scene 'toy'"):
        get_runtime("toy")


def test_a_package_that_declares_no_scene_is_refused() -> None:
    try:
        with override_settings(SCENE_PACKAGES=["tests.engines"]):
            with pytest.raises(registry.SceneDeclarationError, match="tests.engines: no scene.py"):
                registry.load()
        with override_settings(SCENE_PACKAGES=["tests.engines.no_such_package"]):
            with pytest.raises(registry.SceneDeclarationError, match="no_such_package not found"):
                registry.load()
        with override_settings(SCENE_PACKAGES=[TOY, TOY]):
            with pytest.raises(registry.SceneDeclarationError, match="'toy' is declared twice"):
                registry.load()
    finally:
        registry.load()
    assert "gui" in registry.SCENES


@pytest.mark.django_db
def test_a_toy_task_validates_against_its_declaration(toy: Scene, make_user) -> None:
    admin = make_user("admin")
    task = tasks_create(items=[{"scene": "toy", "prompt": "2 + 3?", "config": {"a": 2, "b": 3}}],
                        actor=admin).tasks[0]
    assert (task.scene, task.scene_config) == ("toy", {"note": "", "a": 2, "b": 3})  # defaults filled in
    for scene_config, problem in [({"a": 2}, "'b' is a required property"),
                                  ({"a": 2, "b": 3, "expected": 6}, "is not 2 + 3"),  # the declared check
                                  ({"a": 2, "b": "3"}, "'3' is not of type 'integer'")]:
        with pytest.raises(TaskCreateError, match=re.escape(problem)):
            tasks_create(items=[{"scene": "toy", "prompt": "2 + 3?", "config": scene_config}], actor=admin)
    assert Task.objects.count() == 1


@pytest.mark.django_db
def test_a_toy_episode_runs_on_the_loop_and_is_judged_with_its_rubric(toy: Scene, llm_env, make_task) -> None:  # noqa: F811
    prompt = "What is 2 + 3?"
    with scripted(prompt, call("add", a=2, b=3), call("finish", answer="5")) as (server, llm):
        result = run(config_for(prompt, {"a": 2, "b": 3}, scene="toy"), llm)
    assert (result.outcome, result.reward) == ("success", 1.0)
    assert [s["tool"] for s in result.steps] == ["add", "finish"] and result.steps[0]["output"] == "5"
    task = make_task(scene="toy", prompt=prompt, scene_config={"a": 2, "b": 3})
    trajectory = finished_trajectory(task, steps=result.steps, tools=result.tools, final_answer="5")
    reply = json.dumps({"scores": {d: {"score": 95, "rationale": "ok"} for d in toy.rubric}, "summary": "fine"})
    judged = judge(trajectory, run_checks(trajectory), llm=FakeJudge(reply))
    assert set(judged.scores) == {"arithmetic", "completeness"} and judged.rubric_version == "toy@2"
