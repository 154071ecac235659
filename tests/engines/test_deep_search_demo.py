"""The bundled deep_search demo (examples/tasks/deep_search.jsonl) replayed over the real Debian corpus
(APT_DEMO's packages; CI installs them through APT_TEST): every scripted research path runs through
the shared loop and the offline model, and earns the reward the demo promises — 1.0 for each
multi-hop question, 0.0 for the one answered wrongly on purpose. Also: import_tasks accepts the
file, and the exports carry deep_search trajectories."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.engines.offline_model import running_offline_model
from tests.engines.test_agent import client, config_for, llm_env, run  # noqa: F401 (fixture)
from tests.engines.test_web_corpus import debian_corpus

DEMO = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "deep_search.jsonl"
ROWS = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()]


@pytest.fixture
def corpus_settings(settings):
    settings.WEB_CORPUS_DIR = debian_corpus().path.parent


def test_the_demo_file_has_multi_hop_questions_and_one_wrong_script():
    assert len(ROWS) >= 9
    for row in ROWS:
        assert row["scene"] == "deep_search" and row["config"]["web"]["corpus"] == "debian-docs"
        assert len(row["config"]["sources"]) >= 1
    assert sum(len(r["config"]["sources"]) >= 2 for r in ROWS) >= 8  # multi-hop: two pages or more
    assert [r["external_id"] for r in ROWS if r["external_id"].endswith("-wrong")] == ["deep-search-pascal-year-wrong"]


@pytest.mark.django_db
@pytest.mark.usefixtures("llm_env", "corpus_settings")
def test_every_demo_script_replays_over_the_debian_corpus_with_its_reward():
    scripts = [{"id": r["external_id"], "prompt": r["prompt"], "reference_solution": r["reference_solution"]}
               for r in ROWS]
    results: dict[str, Any] = {}
    with running_offline_model(scripts=scripts) as server:
        for row in ROWS:
            config = config_for(row["prompt"], row["config"], scene="deep_search", max_steps=row["max_steps"])
            results[row["external_id"]] = run(config, client(server.url), sandbox_backend=None)
    for external_id, result in results.items():
        expected = 0.0 if external_id.endswith("-wrong") else 1.0
        assert result.reward == expected, (external_id, result.outcome_reason, result.verifier_output)
        assert not any(s.get("error") for s in result.steps), (external_id, [s.get("error") for s in result.steps])
        gold = next(r for r in ROWS if r["external_id"] == external_id)["config"]["sources"]
        assert set(gold) <= set(result.verifier_output["opened"]), external_id
        assert result.verifier_output["sources_ok"] is True
    wrong = results["deep-search-pascal-year-wrong"].verifier_output
    assert wrong["em"] == 0.0 and wrong["normalized_answer"] == "1968"


@pytest.mark.django_db
def test_import_tasks_accepts_the_demo_file():
    from django.core.management import call_command

    from apps.tasks.models import Task

    call_command("import_tasks", str(DEMO), "--batch", "deep-search-demo")
    tasks = Task.objects.filter(scene="deep_search")
    assert tasks.count() == len(ROWS)
    assert all(t.scene_config["require_sources"] is True for t in tasks)
