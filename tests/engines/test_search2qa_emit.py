"""search2qa end to end through the worker (`manage.py synthesize --wait`): the factory's difficulty
stage runs a real deep_search solver, and the pair becomes a deep_search task in the output batch
with that passing run stored as its first trajectory; the QA exports read both sides."""
from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django_q.models import OrmQ

from apps.datasets.exporters import export_records, load_records
from apps.engines import generation
from apps.engines.offline_model import script_key
from apps.engines.runtime import EpisodeContext, SetupError, enter_episode, leave_episode
from apps.engines.scenes.search2qa import emit
from apps.engines.scenes.search2qa.prompts import stage_route
from apps.reviews.jobs import REVIEW_JOB
from apps.tasks.services import TransitionError, tasks_create, trajectory_attach_episode
from apps.tasks.models import Batch, Task, Trajectory
from trajplatform.audit import AuditEvent
from tests.engines.test_search2qa import (  # noqa: F401 (tiny_web: the autouse fixture)
    ADA, EVIDENCE, LOVELACE, QUESTION, call, explore, no_tool, qa, tiny_web,
)
from tests.tasks.test_synthesize import offline_only  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

SEED = "tiny emit"
PROMPT = "[s2q] explore the seed tiny emit"


def solver(answer: str = "1983") -> dict[str, Any]:
    return {"id": "solver", "prompt": QUESTION, "reference_solution": [
        call("search", query="language named after Lord Byron's daughter"),
        call("open", url=LOVELACE), call("open", url=ADA),
        call("finish", answer=answer, sources=[LOVELACE, ADA]),
    ]}


def synthesize(tmp_path: Path, scripts: list[dict[str, Any]], prompts: tuple[str, ...] = (PROMPT,), **scene: Any) -> str:
    tasks = tmp_path / "s2q.jsonl"
    tasks.write_text("".join(json.dumps({
        "external_id": f"s2q-emit-{i}", "scene": "search2qa", "prompt": prompt, "max_steps": 10,
        "config": {"seed": SEED, "max_evolutions": 0, "difficulty_check": "full", **scene}}) + "\n"
        for i, prompt in enumerate(prompts)))
    solutions = tmp_path / "scripts.json"
    solutions.write_text(json.dumps(scripts))
    out = io.StringIO()
    call_command("synthesize", "--tasks", str(tasks), "--batch", "s2q", "--wait", "--start-offline-model",
                 "--solutions", str(solutions), stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.usefixtures("offline_only")
def test_a_verified_pair_becomes_a_deep_search_task_with_the_passing_solver_run_attached(tmp_path: Path) -> None:
    synthesize(tmp_path, [explore(PROMPT, qa()), no_tool(SEED, "1980"), solver()])
    factory = Trajectory.objects.get(task__batch__name="s2q")
    assert (factory.outcome, factory.reward) == ("success", 1.0), factory.outcome_reason
    out = factory.verifier_output
    assert [g["name"] for g in out["gates"] if g["passed"]] == [
        "answer_not_in_question", "short_answer", "evidence_opened", "evidence_quotes", "distinct_pages",
        "answer_in_evidence", "no_tool_fails", "tool_solver_passes"]
    emitted = out["emitted"]
    assert emitted["batch"] == "s2q-qa" and emitted["created"] is True

    task = Task.objects.get(pk=emitted["task_id"])
    assert task.batch.name == "s2q-qa" and task.scene == "deep_search" and task.prompt == QUESTION
    assert task.scene_config["expected_answer"] == "1983"
    assert task.scene_config["sources"] == [LOVELACE, ADA]
    assert task.scene_config["web"] == {"backend": "corpus", "corpus": "tiny"}  # named, not a default
    made = task.scene_config["generation"]
    assert made["pipeline"] == "search2qa" and made["seed"] == SEED
    assert made["source_trajectory"] == str(factory.uuid) and made["source_task"] == factory.task_id
    assert "no_tool_fails" in [g["name"] for g in made["gates"]]
    # The solver run is the task's first rollout: its config is the task's, it ran for real.
    [solved] = Trajectory.objects.filter(task=task)
    assert solved.pk == emitted["trajectory_id"] and solved.iteration == 1
    assert (solved.status, solved.outcome, solved.reward) == ("finished", "success", 1.0)
    assert solved.config_snapshot == task.config_snapshot()
    assert [s["tool"] for s in solved.steps] == ["search", "open", "open", "finish"]
    assert solved.messages[1] == {"role": "user", "content": QUESTION}
    assert solved.verifier_output["em"] == 1.0 and solved.verifier_output["sources_ok"] is True
    assert task.status == Task.Status.REVIEWING  # handed to the review agent like any rollout
    assert (task.pk, 1) in [row.task["args"] for row in OrmQ.objects.all() if row.task["func"] == REVIEW_JOB]
    actions = list(AuditEvent.objects.filter(target_type="tasks.task", target_id=str(task.pk))
                   .values_list("action", flat=True))
    assert "tasks.task_create" in actions and "tasks.iteration_finish" in actions
    attach = AuditEvent.objects.get(action="tasks.trajectory_attach")
    assert attach.data["source"] == {"scene": "search2qa", "task": factory.task_id, "trajectory": str(factory.uuid)}

    # Both sides export as a QA pair; verl's row carries the answer as ground truth.
    buf = io.BytesIO()
    result = export_records("qa", load_records([factory.pk, solved.pk]), buf)
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert result.lines == 2 and not result.excluded
    assert {(row["question"], row["answer"]) for row in lines} == {(QUESTION, "1983")}
    assert lines[0]["sources"] == [e["url"] for e in EVIDENCE]
    assert lines[0]["gates"] == [{k: g[k] for k in ("name", "passed", "reason")} for g in out["gates"]]
    buf = io.BytesIO()
    export_records("qa-verl", load_records([solved.pk]), buf)
    [verl] = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert verl["reward_model"] == {"style": "rule", "ground_truth": "1983"}
    assert verl["prompt"][-1] == {"role": "user", "content": QUESTION} and verl["prompt"][0]["role"] == "system"
    assert verl["extra_info"]["sources"] == [LOVELACE, ADA]


@pytest.mark.usefixtures("offline_only")
def test_a_solver_that_misses_fails_the_last_gate_and_nothing_is_emitted(tmp_path: Path) -> None:
    synthesize(tmp_path, [explore(PROMPT, qa()), no_tool(SEED, "1980"), solver("1979")])
    factory = Trajectory.objects.get(task__batch__name="s2q", iteration=1)  # the review loop tries again
    assert factory.reward == 0.0 and factory.outcome == "failure"
    gate = factory.verifier_output["gates"][-1]
    assert gate["name"] == "tool_solver_passes" and not gate["passed"]
    assert "did not pass" in gate["reason"] and "emitted" not in factory.verifier_output
    assert not Batch.objects.filter(name="s2q-qa").exists()
    assert not Task.objects.filter(scene="deep_search").exists()
    buf = io.BytesIO()
    result = export_records("qa", load_records([factory.pk]), buf)
    assert result.lines == 0
    assert result.excluded[0]["reason"] == "qa: the pair did not pass every gate (failed: tool_solver_passes)"


@pytest.mark.usefixtures("offline_only")
def test_the_same_pair_made_twice_is_one_task_and_its_solver_run_is_attached_once(tmp_path: Path) -> None:
    again = PROMPT + " (again)"
    synthesize(tmp_path, [explore(PROMPT, qa()), explore(again, qa()), no_tool(SEED, "1980"), solver()],
               prompts=(PROMPT, again))
    first, second = Trajectory.objects.filter(task__batch__name="s2q").order_by("task__external_id")
    assert first.reward == second.reward == 1.0
    made = [t.verifier_output["emitted"] for t in (first, second)]
    assert made[0]["task_id"] == made[1]["task_id"]
    assert sorted(m["created"] for m in made) == [False, True]
    assert [m["trajectory_id"] is None for m in sorted(made, key=lambda m: m["created"])] == [True, False]
    assert Task.objects.filter(scene="deep_search").count() == 1
    assert Trajectory.objects.filter(task__scene="deep_search").count() == 1
    assert AuditEvent.objects.filter(action="tasks.trajectory_attach").count() == 1


def test_an_episode_is_attached_only_to_a_single_queued_trajectory(make_user: Any) -> None:
    item = {"scene": "deep_search", "prompt": "Which year?", "config": {"expected_answer": "1983"},
            "samples_per_iteration": 2}
    task = tasks_create(items=[item], actor=make_user("admin")).tasks[0]
    with pytest.raises(TransitionError, match="has 2 trajectories"):
        trajectory_attach_episode(task=task, result=None, source={"scene": "search2qa"})
    assert set(Trajectory.objects.filter(task=task).values_list("status", flat=True)) == {"queued"}
    assert not AuditEvent.objects.filter(action="tasks.trajectory_attach").exists()


def test_stage_keys_name_the_stage_the_seed_and_the_round() -> None:
    assert script_key(stage_route("evolve", "Ada Lovelace", 2)) == "[pipeline:search2qa/evolve key=seed=ada-lovelace round=2]"


class RecordingStore:
    """A platform store that keeps what the scene hands it (a test double of apps.engines.pipelines.store)."""

    def __init__(self) -> None:
        self.emitted: list[dict[str, Any]] = []

    def task_prompts(self, scene: str) -> Any:
        return iter(())

    def mcp_servers(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        return []

    def task_config(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"scene": item["scene"], "prompt": item["prompt"]}

    def emit(self, item: dict[str, Any], **how: Any) -> dict[str, Any]:
        self.emitted.append({"item": item, **how})
        return {"task_id": 7, "external_id": item["external_id"], "batch": how["batch_name"](None), "created": True,
                "trajectory_id": None, "trajectory_uuid": None}


@pytest.fixture
def in_episode() -> Any:
    token = enter_episode(EpisodeContext(SimpleNamespace(trajectory=None)))
    yield
    leave_episode(token)


@pytest.mark.django_db  # no thread of its own writes: a rolled-back test, not the module's flushed one
def test_the_scene_writes_no_task_itself_it_hands_the_pair_to_the_installed_platform_store(in_episode: Any) -> None:
    store = RecordingStore()
    previous = generation.set_platform_store(store)
    try:
        item = {"external_id": "search2qa-1", "scene": "deep_search", "prompt": QUESTION, "config": {}}
        gates = [{"name": "short_answer", "passed": True}, {"name": "uniqueness", "passed": False}]
        emitted = emit.emit_task({"scene_config": {}}, item, None, gates)
        [handed] = store.emitted
        assert handed["item"] is item and handed["source"] == "search2qa" and handed["attach"] is None
        assert handed["trajectory"] is None
        assert (handed["batch_name"](None), handed["batch_name"]("s2q")) == ("search2qa-output", "s2q-qa")
        assert emitted["passed_gates"] == ["short_answer"] and emitted["batch"] == "search2qa-output"
        emit.emit_task({"scene_config": {"output_batch": "mine"}}, item, None, gates)
        assert store.emitted[-1]["batch_name"]("s2q") == "mine"
        assert emit.solver_config(item) == {"scene": "deep_search", "prompt": QUESTION}
        assert not Task.objects.exists()
    finally:
        generation.set_platform_store(previous)


@pytest.mark.django_db  # no thread of its own writes: a rolled-back test, not the module's flushed one
def test_an_invalid_emitted_task_is_a_setup_error_naming_the_field_and_writes_nothing(in_episode: Any) -> None:
    item = {"external_id": "search2qa-1", "scene": "deep_search", "config": {}}  # no prompt
    with pytest.raises(SetupError, match="the emitted deep_search task is invalid: prompt: required field is missing"):
        emit.solver_config(item)
    with pytest.raises(SetupError, match="the emitted deep_search task is invalid: prompt: required field"):
        emit.emit_task({"scene_config": {}}, item, None, [])
    assert not Task.objects.exists() and not Batch.objects.exists()


@pytest.mark.django_db  # no thread of its own writes: a rolled-back test, not the module's flushed one
def test_without_an_installed_platform_store_the_scene_says_so() -> None:
    previous = generation.set_platform_store(None)
    try:
        with pytest.raises(RuntimeError, match="no platform store is installed"):
            generation.platform_store()
    finally:
        generation.set_platform_store(previous)
