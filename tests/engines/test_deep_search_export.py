"""deep_search trajectories through the worker (`manage.py synthesize --wait`) and through every export
format: the steps' web extras (results, url, content_sha256) do not trip any exporter, a correct and a
wrong rollout of one question pair up for DPO, and a dataset's data card carries the corpus licences."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from apps.datasets.exporters import FORMATS, export_records, load_records, validate_line
from apps.engines.offline_model import running_offline_model
from apps.tasks.models import Task, Trajectory
from tests.engines.test_agent import call, client, config_for, run
from tests.engines.test_web_corpus import write_tiny_jsonl, write_tiny_site
from tests.tasks.test_synthesize import offline_only  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

LOVELACE = "https://tiny.example/people/lovelace.html"
ADA = "https://tiny.example/languages/ada.md"
QUESTION = "[dsx] In what year was the language named after Lord Byron's daughter first standardised?"
RESEARCH = [call("search", query="daughter of Lord Byron"), call("open", url=LOVELACE), call("open", url=ADA)]
# Formats that every scene's trajectories must render (the others are scene-specific or need reviews).
GENERAL = ("sft-openai", "sft-trl", "dpo-openai", "dpo-trl", "rl", "rl-verl", "rl-agentjet", "sharegpt", "alpaca",
           "raw", "atif", "adp", "kto-trl", "dpo-step-trl", "qa", "qa-verl")


@pytest.fixture
def tiny_web(settings, tmp_path):
    """The tiny corpus, built and registered by corpus_build (so its licences are on record)."""
    settings.WEB_CORPUS_DIR = tmp_path / "corpora"
    call_command("corpus_build", "tiny", "--from", str(write_tiny_site(tmp_path)), "--from",
                 str(write_tiny_jsonl(tmp_path)), "--base-url", "https://tiny.example/", "--licence", "CC0-1.0",
                 stdout=io.StringIO())


def rollouts(tmp_path: Path) -> tuple[Task, list[Trajectory]]:
    """A correct rollout through the worker, then a wrong one of the same task (sample 1) from the loop."""
    row = {"external_id": "dsx-1", "scene": "deep_search", "prompt": QUESTION, "max_steps": 8,
           "config": {"expected_answer": "1983", "aliases": ["Ada 83"], "web": {"corpus": "tiny"}}}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    right = [{"id": "right", "prompt": QUESTION, "reference_solution": [
        *RESEARCH, call("finish", answer="1983", sources=[LOVELACE, ADA])]}]
    (tmp_path / "right.json").write_text(json.dumps(right))
    out = io.StringIO()
    call_command("synthesize", "--tasks", str(tmp_path / "tasks.jsonl"), "--batch", "dsx", "--wait",
                 "--start-offline-model", "--solutions", str(tmp_path / "right.json"), stdout=out, stderr=out)
    task = Task.objects.get(batch__name="dsx")
    good = Trajectory.objects.get(task=task)
    wrong_script = [{"id": "wrong", "prompt": QUESTION, "reference_solution": [
        *RESEARCH, call("finish", answer="1979", sources=[ADA])]}]
    with running_offline_model(scripts=wrong_script) as server:
        result = run(config_for(QUESTION, task.scene_config, scene="deep_search", max_steps=8), client(server.url),
                     sandbox_backend=None)
    bad = Trajectory.objects.create(
        task=task, iteration=good.iteration, sample_index=1, status=Trajectory.Status.FINISHED,
        messages=result.messages, tools=result.tools, steps=result.steps, final_answer=result.final_answer,
        outcome=result.outcome, outcome_reason=result.outcome_reason, reward=result.reward,
        verifier_output=result.verifier_output, config_snapshot=task.config_snapshot(), model=good.model)
    return task, [good, bad]


@pytest.mark.usefixtures("offline_only", "tiny_web")
def test_deep_search_rollouts_go_through_every_export_format(tmp_path: Path) -> None:
    task, (good, bad) = rollouts(tmp_path)
    assert (good.status, good.outcome, good.reward) == ("finished", "success", 1.0), good.outcome_reason
    assert [s["tool"] for s in good.steps] == ["search", "open", "open", "finish"]
    assert good.steps[1]["content_sha256"] and good.steps[0]["results"][0]["url"] == LOVELACE
    assert (bad.outcome, bad.reward) == ("failure", 0.0)

    rendered: dict[str, list[dict[str, Any]]] = {}
    for name in FORMATS:
        buf = io.BytesIO()
        result = export_records(name, load_records([good.pk, bad.pk]), buf)
        lines = [json.loads(line) for line in buf.getvalue().splitlines()]
        for line in lines:
            assert validate_line(name, line) == [], name
        rendered[name] = lines
        if name in GENERAL:
            assert lines, (name, result.excluded)
    # the pair: the correct rollout is chosen over the wrong one
    [pair] = rendered["dpo-trl"]
    assert "1983" in json.dumps(pair["chosen"]) and "1979" in json.dumps(pair["rejected"])
    # the web tools' results reach the training rows as tool messages
    assert "Ada Lovelace" in json.dumps(rendered["sft-openai"][0]["messages"])
    assert rendered["qa"][0]["answer"] == "1983"


@pytest.mark.usefixtures("offline_only", "tiny_web")
def test_a_dataset_card_names_the_corpus_licences(tmp_path: Path) -> None:
    from apps.datasets.models import DatasetVersion

    rollouts(tmp_path)
    call_command("dataset_create", "dsx-data", "--batch", "dsx", "--no-near-dedup", "--no-progress", stdout=io.StringIO())
    card = DatasetVersion.objects.get(dataset__name="dsx-data").data_card
    assert card["licences"] == [
        {"corpus": "tiny", "source": "site", "name": str(tmp_path / "site"), "licence": "CC0-1.0"},
        {"corpus": "tiny", "source": "docs", "name": str(tmp_path / "docs.jsonl"), "licence": "CC0-1.0"}]
