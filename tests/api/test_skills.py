"""PLATFORM_SKILLS_URL: VibeDataBot's skill manifest decides the enabled scenes, or start-up fails."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from apps.engines.registry import SCENES
from trajplatform import skills
from trajplatform.skills import SkillManifestUnavailable, fetch_manifest, load_skills

ROOT = Path(__file__).resolve().parents[2]


def skill(scene: str, **extra: Any) -> dict[str, Any]:
    return {"skill_id": f"trajectory-{scene}", "sig_owner": "trajectory-synthesis", "status": "active",
            "description": f"{scene} skill", **extra}


MANIFEST = {"skills": [
    skill("search2qa", required_params=["seed", "qa_mode", 3], defaults={"qa_mode": "question"},
          trigger_keywords=["qa", 1],
          must_clarify=[{"param": "qa_mode", "question": "Which mode?", "options": [
              {"value": "question", "label": "Question", "hint": "h"},
              {"value": "answer", "label": "Answer", "maps_to": {"qa_mode": "answer"}}, "junk"]},
              {"param": "broken"}, {"param": "_scale_preset", "question": "How many?", "options": "not a list"}]),
    skill("toucan", status="stub"),
    skill("code_exec", sig_owner="someone-else"),
    skill("no_such_scene"),
    {"skill_id": "search-gui", "sig_owner": "trajectory-synthesis", "status": "active", "description": "x"},
    skill("gui", description=None),
    "not an object",
]}


@pytest.fixture(autouse=True)
def _forget_manifest() -> Iterator[None]:
    yield
    skills.reset_skills()


def test_only_active_trajectory_skills_of_known_scenes_are_enabled(receiver: Any, client_as: Any) -> None:
    receiver.body = json.dumps(MANIFEST).encode()
    catalog = load_skills(receiver.url)
    assert set(catalog) == {"search2qa"}
    assert receiver.requests[-1]["path"] == "/api/skills"
    entry = catalog["search2qa"]
    assert entry.required_params == ["seed", "qa_mode"] and entry.trigger_keywords == ["qa"]
    assert [m["param"] for m in entry.must_clarify] == ["qa_mode", "_scale_preset"]
    assert len(entry.must_clarify[0]["options"]) == 2 and entry.must_clarify[1]["options"] == []
    assert entry.must_clarify[0]["options"][1]["maps_to"] == {"qa_mode": "answer"}

    body = client_as("viewer").get("/api/v1/scenes").json()
    assert [s["id"] for s in body] == ["search2qa"]
    assert body[0]["skill"]["skill_id"] == "trajectory-search2qa"
    assert body[0]["config_schema"] == SCENES["search2qa"].config_schema
    assert client_as("viewer").get("/api/v1/scenes/code_exec").status_code == 404


@pytest.mark.django_db
def test_unset_enables_every_scene(client_as: Any) -> None:
    load_skills("")
    body = client_as("viewer").get("/api/v1/scenes").json()
    assert [s["id"] for s in body] == list(SCENES) and all(s["skill"] is None for s in body)
    envscaler = next(s for s in body if s["id"] == "envscaler")
    assert envscaler["required_params"] == ["env_name"] and envscaler["config_schema"]["type"] == "object"


def _closed_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(("status", "body", "reason"), [
    (500, b"{}", "HTTP 500"),
    (200, b"<html>", "did not return JSON"),
    (200, b'{"items": []}', "no 'skills' list"),
    (200, json.dumps({"skills": [skill("toucan", status="stub")]}).encode(), "no active"),
])
def test_a_bad_manifest_fails_with_the_reason(receiver: Any, status: int, body: bytes, reason: str) -> None:
    receiver.statuses = [status]
    receiver.body = body
    with pytest.raises(SkillManifestUnavailable, match=reason):
        fetch_manifest(receiver.url)


def test_an_unreachable_manifest_fails_fast() -> None:
    url = _closed_url()
    with pytest.raises(SkillManifestUnavailable, match="ConnectError"):
        fetch_manifest(url, timeout_s=2)


def test_start_up_refuses_with_a_clear_message_when_unreachable() -> None:
    env = {**os.environ, "PLATFORM_SKILLS_URL": _closed_url(), "DJANGO_SETTINGS_MODULE": "trajplatform.settings"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "SkillManifestUnavailable" in result.stderr and "PLATFORM_SKILLS_URL=" in result.stderr


def test_start_up_loads_the_manifest(receiver: Any) -> None:
    receiver.body = json.dumps({"skills": [skill("code_exec")]}).encode()
    env = {**os.environ, "PLATFORM_SKILLS_URL": receiver.url, "DJANGO_SETTINGS_MODULE": "trajplatform.settings"}
    code = "import django; django.setup(); from trajplatform.skills import enabled_scene_ids; print(enabled_scene_ids())"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['code_exec']"
