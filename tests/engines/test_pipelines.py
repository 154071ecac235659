"""Generation pipelines: stage storage, repair and drop, resume without paying twice, the job's
claim, tasks through the task service, the admin actions and the command, against the offline
scripted model (its request log counts the model calls)."""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from apps.engines import pipelines
from apps.engines.llm import LLMClient, Provider
from apps.engines.management.commands import synthesize_pipeline as pipeline_command
from apps.engines.models import PipelineRun, StageRun
from apps.engines.offline_model import MODEL_NAME, running_offline_model
from apps.engines.offline_model import script_key
from apps.engines.generation import TASK_STAGE, CodeStage, Drop, EpisodeStage, LLMStage, Pipeline, PipelineError, Template, stage_route
from apps.engines.pipelines import jobs as pipeline_jobs
from apps.engines.pipelines import services
from apps.tasks.models import Task
from trajplatform.audit import AuditEvent, audit_events_for

pytestmark = pytest.mark.django_db

SCENE = "code_exec"  # a real scene: the generated tasks are validated against its schema
QUESTION = Template(
    id="demo/question", version="2",
    system="You write programming tasks.",
    user=lambda inputs: f"Write one programming task about {inputs['seed']['topic']}. "
                        'Answer with JSON only: {"prompt": "<the task>"}.',
)
QUESTION_SCHEMA = {
    "type": "object", "required": ["prompt"], "additionalProperties": False,
    "properties": {"prompt": {"type": "string", "minLength": 20}},
}
CRASH_ON: set[str] = set()  # item keys whose gate "kills the worker" once


class SimulatedCrash(BaseException):
    """Not an Exception: nothing in the runner may catch it, as nothing survives a kill -9."""


def gate(inputs: dict[str, Any]) -> dict[str, Any]:
    key = inputs["key"]
    if key == os.environ.get("PIPELINE_TEST_HANG_ON"):  # the worker subprocess of the kill -9 test
        time.sleep(3600)
    if key in CRASH_ON:
        CRASH_ON.discard(key)
        raise SimulatedCrash(key)
    if "forbidden" in inputs["prompt"]:
        raise Drop("mentions a forbidden word")
    return {"length": len(inputs["prompt"])}


def dedup(items: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str, str] = {}
    out: dict[str, Any] = {}
    for key in sorted(items):
        prompt = items[key]["prompt"]
        out[key] = Drop(f"duplicate of {seen[prompt]}") if prompt in seen else {"unique": True}
        seen.setdefault(prompt, key)
    return out


def build_demo(config: dict[str, Any]) -> Pipeline:
    return Pipeline(
        name="demo",
        stages=(
            LLMStage(name="question", template=QUESTION, schema=QUESTION_SCHEMA, repairs=config.get("repairs", 1)),
            CodeStage(name="gate", fn=gate,
                      inputs=lambda s: {"key": s["seed"]["id"], "prompt": s["question"]["prompt"]}),
            CodeStage(name="dedup", scope="all", fn=dedup, inputs=lambda s: {"prompt": s["question"]["prompt"]}),
        ),
        task=lambda key, state: {"scene": SCENE, "prompt": state["question"]["prompt"], "max_steps": 3},
    )


def answer(key: str, content: Any, repair: int = 0) -> dict[str, Any]:
    """A one-step offline script answering the llm stage for `key` (the key-line convention)."""
    text = content if isinstance(content, str) else json.dumps(content)
    return {"id": f"demo-{key}-{repair}", "prompt": script_key(stage_route("demo/question", key, repair)),
            "reference_solution": [{"content": text}]}


def task_text(topic: str) -> str:
    return f"Write a Python function that handles {topic} and test it with pytest."


GOOD = {k: answer(k, {"prompt": task_text(k)}) for k in ("s1", "s2", "s3")}


@pytest.fixture(autouse=True)
def demo_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(pipelines.PIPELINES, SCENE, "tests.engines.test_pipelines:build_demo")
    monkeypatch.setattr(pipeline_jobs, "HEARTBEAT_S", 0.0)
    CRASH_ON.clear()
    yield
    CRASH_ON.clear()


@pytest.fixture
def model() -> Iterator[Any]:
    """Start the offline model with `scripts`; returns (server, client)."""
    servers = []

    def _start(*scripts: dict[str, Any]) -> tuple[Any, LLMClient]:
        cm = running_offline_model(scripts=list(scripts))
        server = cm.__enter__()
        servers.append(cm)
        return server, LLMClient([Provider("offline", server.url, MODEL_NAME)], limiters={})

    yield _start
    for cm in servers:
        cm.__exit__(None, None, None)


def seeds(*keys: str) -> list[dict[str, Any]]:
    return [{"id": k, "topic": k} for k in keys]


def calls_by_key(server: Any) -> dict[str, int]:
    """Model requests per key line (the route header the client sent the stand-in), from the
    offline model's request log; no prompt carries the key line."""
    counts: dict[str, int] = {}
    for request in server.model.requests:
        assert "[pipeline:" not in json.dumps(request["body"]["messages"])
        line = f"[{request['route']}]"
        counts[line] = counts.get(line, 0) + 1
    return counts


def create_and_run(llm: LLMClient, keys: tuple[str, ...] = ("s1", "s2", "s3"), **kw: Any) -> PipelineRun:
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds(*keys), actor=None, batch_name="gen", **kw)
    pipeline_jobs.run_pipeline(run.pk, llm=llm)
    run.refresh_from_db()
    return run


def test_every_stage_run_is_stored_with_inputs_hash_outputs_tokens(model: Any) -> None:
    server, llm = model(*GOOD.values())
    run = create_and_run(llm)
    assert run.status == PipelineRun.Status.COMPLETED, run.error
    question = StageRun.objects.get(run=run, stage="question", item_key="s1")
    assert question.kind == "llm" and question.status == StageRun.Status.SUCCEEDED
    assert (question.template_id, question.template_version) == ("demo/question", "2")
    assert len(question.prompt_hash) == 64 and question.inputs["seed"] == {"id": "s1", "topic": "s1"}
    assert json.loads(question.raw_output) == question.parsed_output == {"prompt": task_text("s1")}
    assert question.validator_result["valid"] is True
    assert question.llm_calls == 1 and question.total_tokens > 0 and question.prompt_tokens > 0
    gate_row = StageRun.objects.get(run=run, stage="gate", item_key="s1")
    assert gate_row.kind == "code" and gate_row.parsed_output == {"length": len(task_text("s1"))}
    assert StageRun.objects.get(run=run, stage="dedup").item_key == "*"
    assert run.items_done == run.tasks_created == 3 and run.items_dropped == 0
    assert run.llm_calls == 3 and run.total_tokens == sum(
        StageRun.objects.filter(run=run).values_list("total_tokens", flat=True))
    # The same prompt hash for the same rendered prompt: the hash identifies the prompt.
    other = create_and_run(llm, keys=("s1",))
    assert StageRun.objects.get(run=other, stage="question").prompt_hash == question.prompt_hash


def test_tasks_go_through_the_task_service_with_audit_rows_and_link_their_stage_run(model: Any) -> None:
    _, llm = model(*GOOD.values())
    run = create_and_run(llm)
    tasks = list(Task.objects.filter(batch=run.batch).order_by("external_id"))
    assert [t.external_id for t in tasks] == ["demo-s1", "demo-s2", "demo-s3"]
    assert run.batch.name == "gen" and run.batch.source_format == "pipeline" and run.batch.task_count == 3
    assert all(t.status == Task.Status.RUNNING for t in tasks)  # started by tasks_create, like the API's
    for task in tasks:
        producer = task.stage_runs.get()
        assert producer.run == run and producer.stage == TASK_STAGE
        assert producer.inputs["task"]["prompt"] == task.prompt
        assert audit_events_for(task).filter(action="tasks.task_create").count() == 1
    assert audit_events_for(run).filter(action="engines.pipeline_start").count() == 1
    finish = audit_events_for(run).get(action="engines.pipeline_finish")
    assert finish.data["status"] == "completed" and finish.data["tasks_created"] == "3"


def test_invalid_output_gets_a_repair_turn_with_the_error(model: Any) -> None:
    server, llm = model(
        answer("s1", {"prompt": "too short"}),
        answer("s1", {"prompt": task_text("repaired")}, repair=1),
    )
    run = create_and_run(llm, keys=("s1",))
    row = StageRun.objects.get(run=run, stage="question")
    assert row.status == StageRun.Status.SUCCEEDED and row.repair_attempts == 1 and row.llm_calls == 2
    assert row.parsed_output == {"prompt": task_text("repaired")}
    turns = row.validator_result["turns"]
    assert "schema: at prompt" in turns[0]["error"] and turns[1]["error"] is None
    repair_request = list(server.model.requests)[-1]["body"]["messages"]
    assert [m["role"] for m in repair_request] == ["system", "user", "assistant", "user"]
    assert "schema: at prompt" in repair_request[-1]["content"]
    assert list(server.model.requests)[-1]["route"] == stage_route("demo/question", "s1", repair=1)
    assert "[pipeline:" not in json.dumps(repair_request)


def test_still_invalid_after_the_repairs_drops_the_item_with_the_reason(model: Any) -> None:
    _, llm = model(GOOD["s1"], answer("s2", {"prompt": "too short"}),
                   answer("s2", {"prompt": "still short"}, repair=1))
    run = create_and_run(llm, keys=("s1", "s2"), config={"repairs": 2})
    row = StageRun.objects.get(run=run, stage="question", item_key="s2")
    assert row.status == StageRun.Status.DROPPED and row.parsed_output is None
    assert row.llm_calls == 3 and row.repair_attempts == 2  # no script for repair 2: a plain-text answer
    assert row.error.startswith("invalid output after 2 repair(s): the answer is not JSON")
    assert [t["error"] is not None for t in row.validator_result["turns"]] == [True, True, True]
    assert not StageRun.objects.filter(run=run, item_key="s2").exclude(stage="question").exists()
    assert run.status == PipelineRun.Status.COMPLETED and run.items_dropped == 1 and run.tasks_created == 1


def test_an_unparseable_answer_is_rejected_never_passed_on(model: Any) -> None:
    _, llm = model(answer("s1", "Sure! Here is a great task: write a web server."))
    run = create_and_run(llm, keys=("s1",), config={"repairs": 0})
    row = StageRun.objects.get(run=run, stage="question")
    assert row.status == StageRun.Status.DROPPED and row.parsed_output is None
    assert "not JSON" in row.error and row.validator_result["valid"] is False
    assert list(StageRun.objects.filter(run=run).values_list("stage", flat=True)) == ["question", "dedup"]
    assert StageRun.objects.get(run=run, stage="dedup").inputs == {}
    assert run.tasks_created == 0 and not Task.objects.exists()


def test_code_gates_drop_items_and_all_item_stages_see_every_live_item(model: Any) -> None:
    _, llm = model(GOOD["s1"], answer("s2", {"prompt": task_text("s1")}),
                   answer("s3", {"prompt": task_text("forbidden things")}))
    run = create_and_run(llm)
    assert StageRun.objects.get(run=run, stage="gate", item_key="s3").error == "mentions a forbidden word"
    dedup_row = StageRun.objects.get(run=run, stage="dedup")
    assert set(dedup_row.inputs) == {"s1", "s2"}
    assert dedup_row.parsed_output["dropped"] == {"s2": "duplicate of s1"}
    assert run.tasks_created == 1 and run.items_dropped == 2


def test_a_run_resumed_after_a_crash_mid_stage_pays_no_finished_stage_twice(model: Any) -> None:
    server, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2", "s3"), actor=None, batch_name="gen")
    CRASH_ON.add("s2")
    with pytest.raises(SimulatedCrash):
        pipeline_jobs.run_pipeline(run.pk, llm=llm)
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.RUNNING  # as a killed worker leaves it
    assert StageRun.objects.get(run=run, stage="gate", item_key="s2").status == StageRun.Status.RUNNING
    assert calls_by_key(server) == {script_key(stage_route("demo/question", k)): 1 for k in ("s1", "s2", "s3")}

    # The job that died is no longer alive: the reaper re-queues the run at once.
    assert pipeline_jobs.reap_pipeline_runs()["requeued"] == 1
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.QUEUED
    assert audit_events_for(run).filter(action="engines.pipeline_requeue").count() == 1
    pipeline_jobs.run_pipeline(run.pk, llm=llm)
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.COMPLETED and run.attempts == 2 and run.tasks_created == 3
    # Not one more model call: every question had finished before the crash.
    assert calls_by_key(server) == {script_key(stage_route("demo/question", k)): 1 for k in ("s1", "s2", "s3")}
    attempts = dict(StageRun.objects.filter(run=run, stage="question").values_list("item_key", "attempts"))
    assert attempts == {"s1": 1, "s2": 1, "s3": 1}
    assert StageRun.objects.get(run=run, stage="gate", item_key="s2").attempts == 2
    assert StageRun.objects.get(run=run, stage="gate", item_key="s1").attempts == 1


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_crash_inside_an_llm_stage_reruns_only_unstored_answers_and_pays_none_twice(
        model: Any, monkeypatch: pytest.MonkeyPatch, concurrency: int) -> None:
    server, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2", "s3"), actor=None, batch_name="gen",
                                       config={"concurrency": concurrency})
    real_chat = llm.chat

    def dying_chat(messages: list[dict[str, Any]], **kw: Any) -> Any:
        result = real_chat(messages, **kw)
        if kw["cache_key_extra"]["item"] == "s2" and not getattr(dying_chat, "died", False):
            dying_chat.died = True  # type: ignore[attr-defined]
            raise SimulatedCrash("killed after the answer came back, before it was stored")
        return result

    monkeypatch.setattr(llm, "chat", dying_chat)
    with pytest.raises(SimulatedCrash):
        pipeline_jobs.run_pipeline(run.pk, llm=llm)
    # The broker delivers the dead worker's job again: the job itself takes the run back.
    assert pipeline_jobs.run_pipeline(run.pk, llm=llm)["status"] == "completed"
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.COMPLETED and run.tasks_created == 3
    attempts = dict(StageRun.objects.filter(run=run, stage="question").values_list("item_key", "attempts"))
    if concurrency == 1:  # one call at a time: s1 was stored before s2's worker died, s3 had not started
        assert attempts == {"s1": 1, "s2": 2, "s3": 1}
    else:  # all three in flight: those not stored before the worker died ran again
        assert attempts["s2"] == 2 and set(attempts.values()) <= {1, 2}
    # The answers that came back before the crash were in the LLM response cache (keyed by the
    # run's UUID): a stage that ran twice was paid once.
    assert calls_by_key(server) == {script_key(stage_route("demo/question", k)): 1 for k in ("s1", "s2", "s3")}


def test_creating_a_run_queues_its_job_and_schedules_the_reaper_on_commit(
        django_capture_on_commit_callbacks: Any) -> None:
    from django_q.models import OrmQ, Schedule

    with django_capture_on_commit_callbacks(execute=True):
        run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1"), actor=None, batch_name="gen")
        assert not OrmQ.objects.exists()
    assert [row.task["args"] for row in OrmQ.objects.all()] == [(run.pk,)]
    assert Schedule.objects.get(name=services.REAP_SCHEDULE_NAME).func == services.REAP_FUNC


def test_the_reaper_leaves_live_runs_alone_and_fails_a_run_that_keeps_losing_workers(model: Any) -> None:
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1"), actor=None, batch_name="gen")
    assert pipeline_jobs.claim_run(run.pk, f"{socket.gethostname()}:1:x") is not None  # pid 1 lives
    assert pipeline_jobs.reap_pipeline_runs() == {"requeued": 0, "failed": 0, "dispatched": 0}
    PipelineRun.objects.filter(pk=run.pk).update(heartbeat_at=run.created_at - pipeline_jobs.timedelta(hours=1),
                                                 attempts=pipeline_jobs.PIPELINE_MAX_CLAIMS)
    assert pipeline_jobs.reap_pipeline_runs()["failed"] == 1
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.FAILED and "no heartbeat" in run.error and "resume it" in run.error


def test_a_job_at_its_time_budget_hands_the_run_over_to_a_follow_up_job(
        model: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    from django_q.models import OrmQ

    from apps.tasks import jobs as rollout_jobs

    server, llm = model(*GOOD.values())
    monkeypatch.setattr(rollout_jobs, "_job_budget_s", lambda: 0.0)
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2", "s3"), actor=None, batch_name="gen",
                                       start=False, config={"concurrency": 1})
    jobs_run = 0
    while True:
        with django_capture_on_commit_callbacks(execute=True):
            result = pipeline_jobs.run_pipeline(run.pk, llm=llm)
        jobs_run += 1
        assert jobs_run <= 10  # one per stage run: 3 questions, 3 gates, the dedup, 3 tasks
        if result["status"] != pipeline_jobs.HANDED_OVER:
            break
        run.refresh_from_db()
        assert run.status == PipelineRun.Status.QUEUED and run.attempts == 0  # a hand-over is no failed attempt
        assert [row.task["args"] for row in OrmQ.objects.all()][-1] == (run.pk,)  # the follow-up job
    run.refresh_from_db()
    assert result["status"] == "completed" and run.tasks_created == 3 and run.attempts == 1
    assert jobs_run == 10  # each job ran one stage run, then handed over
    assert calls_by_key(server) == {script_key(stage_route("demo/question", k)): 1 for k in ("s1", "s2", "s3")}
    assert audit_events_for(run).filter(action="engines.pipeline_requeue").count() == jobs_run - 1


def test_double_delivery_is_harmless(model: Any) -> None:
    server, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1"), actor=None, batch_name="gen")
    claim = pipeline_jobs.claim_run(run.pk, "elsewhere:1:abc")
    assert claim is not None and pipeline_jobs.claim_run(run.pk, "elsewhere:2:def") is None
    assert pipeline_jobs.run_pipeline(run.pk, llm=llm) == {"claimed": False}  # the second delivery
    assert server.model.chat_requests == 0 and not StageRun.objects.exists()
    PipelineRun.objects.filter(pk=run.pk).update(status=PipelineRun.Status.QUEUED, claim_token="")
    first = pipeline_jobs.run_pipeline(run.pk, llm=llm)
    assert first["status"] == "completed"
    assert pipeline_jobs.run_pipeline(run.pk, llm=llm) == {"claimed": False}
    assert server.model.chat_requests == 1 and Task.objects.count() == 1


def test_a_worker_that_lost_its_claim_stops_without_finishing_the_run(model: Any) -> None:
    _, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2"), actor=None, batch_name="gen")
    claim = pipeline_jobs.claim_run(run.pk, "host:1:x")
    PipelineRun.objects.filter(pk=run.pk).update(claim_token="someone-else")
    with pytest.raises(pipelines.runner.Stopped):
        claim.beat()
    assert pipeline_jobs._execute(claim, llm) == {"claimed": True, "status": "lost"}
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.RUNNING and not audit_events_for(run).filter(
        action="engines.pipeline_finish").exists()


def test_cancel_and_resume_are_audited_transitions(model: Any) -> None:
    _, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1"), actor=None, batch_name="gen")
    services.pipeline_run_cancel(run=run, actor=None, reason="not now")
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.CANCELLED and run.error == "not now"
    services.pipeline_run_cancel(run=run, actor=None)  # repeat: no-op
    assert audit_events_for(run).filter(action="engines.pipeline_cancel").count() == 1
    assert pipeline_jobs.run_pipeline(run.pk, llm=llm) == {"claimed": False}
    with pytest.raises(services.TransitionError):
        services.pipeline_run_start(run=run, actor=None)
    services.pipeline_run_resume(run=run, actor=None)
    assert pipeline_jobs.run_pipeline(run.pk, llm=llm)["status"] == "completed"
    with pytest.raises(services.TransitionError):
        services.pipeline_run_resume(run=run, actor=None)
    assert audit_events_for(run).filter(action="engines.pipeline_resume").count() == 1


def test_a_running_run_stops_between_stages_when_cancelled(model: Any) -> None:
    _, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2"), actor=None, batch_name="gen")

    def cancel_then_gate(inputs: dict[str, Any]) -> dict[str, Any]:
        services.pipeline_run_cancel(run=run, actor=None)
        return {"ok": True}

    from tests.engines import test_pipelines as me

    original = me.gate
    me.gate = cancel_then_gate  # build_demo looks the gate up when the run starts
    try:
        result = pipeline_jobs.run_pipeline(run.pk, llm=llm)
    finally:
        me.gate = original
    run.refresh_from_db()
    assert result["status"] == run.status == PipelineRun.Status.CANCELLED
    assert StageRun.objects.filter(run=run, stage="gate").count() == 1 and run.tasks_created == 0


def scene_without_pipeline() -> str:
    from apps.engines.registry import SCENES

    return next(scene for scene in SCENES if scene not in pipelines.PIPELINES)


def test_bad_seeds_and_unknown_scenes_are_refused_before_anything_is_written() -> None:
    bare = scene_without_pipeline()
    with pytest.raises(PipelineError, match=f"^scene {bare} has no generation pipeline yet$"):
        services.pipeline_run_create(scene=bare, seeds=seeds("a"), actor=None)
    with pytest.raises(PipelineError, match="unknown scene 'nope'"):
        services.pipeline_run_create(scene="nope", seeds=seeds("a"), actor=None)
    with pytest.raises(PipelineError, match="repeated"):
        services.pipeline_run_create(scene=SCENE, seeds=seeds("a", "a"), actor=None)
    with pytest.raises(PipelineError, match="non-empty list"):
        services.pipeline_run_create(scene=SCENE, seeds=[], actor=None)
    for bad in (0, "8", 65, True):
        with pytest.raises(PipelineError, match="'concurrency' must be a whole number from 1 to 64"):
            services.pipeline_run_create(scene=SCENE, seeds=seeds("a"), actor=None, config={"concurrency": bad})
    assert not PipelineRun.objects.exists() and not AuditEvent.objects.filter(action__startswith="engines.").exists()


def test_a_batch_name_taken_meanwhile_fails_the_task_step_for_a_resume(model: Any) -> None:
    from apps.tasks.models import Batch

    _, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1"), actor=None, batch_name="taken")
    Batch.objects.create(name="taken", source_format="api")  # an API batch took the name before the first task
    pipeline_jobs.run_pipeline(run.pk, llm=llm)
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.FAILED and "a batch named 'taken' already exists" in run.error
    row = StageRun.objects.get(run=run, stage=TASK_STAGE)
    assert row.status == StageRun.Status.FAILED and "BatchNameTaken" in row.error and row.task is None


def test_a_failing_stage_fails_the_run_and_resume_reruns_only_it(model: Any) -> None:
    _, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2"), actor=None, batch_name="gen")
    from tests.engines import test_pipelines as me

    original = me.gate

    def broken(inputs: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the gate's service is down")

    me.gate = broken
    try:
        pipeline_jobs.run_pipeline(run.pk, llm=llm)
    finally:
        me.gate = original
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.FAILED and "the gate's service is down" in run.error
    assert StageRun.objects.get(run=run, stage="gate", item_key="s1").status == StageRun.Status.FAILED
    services.pipeline_run_resume(run=run, actor=None)
    pipeline_jobs.run_pipeline(run.pk, llm=llm)
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.COMPLETED and run.tasks_created == 2 and run.llm_calls == 2


# -- episode stages: the shared agent loop -------------------------------------------------------


def build_with_episode(config: dict[str, Any]) -> Pipeline:
    return Pipeline(
        name="episodic",
        stages=(
            EpisodeStage(
                name="probe",
                config=lambda inputs: {"scene": SCENE, "prompt": inputs["seed"]["topic"], "max_steps": 2},
                validator=lambda result, inputs: None if result["outcome"] == "success" else "the probe failed",
            ),
        ),
        task=lambda key, state: {"scene": SCENE, "prompt": task_text(key)},
    )


def test_an_episode_stage_runs_the_shared_loop_and_gates_on_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.engines import agent

    seen: list[dict[str, Any]] = []

    async def fake_episode(*, config: dict[str, Any], llm: Any, cache_key_extra: Any = None, **kw: Any) -> Any:
        seen.append({"config": config, "cache_key_extra": cache_key_extra})
        ok = config["prompt"] != "bad"
        return agent.EpisodeResult(outcome="success" if ok else "failure", final_answer="42", llm_calls=2,
                                   total_tokens=30, prompt_tokens=20, completion_tokens=10)

    monkeypatch.setattr(agent, "run_episode", fake_episode)
    monkeypatch.setitem(pipelines.PIPELINES, SCENE, "tests.engines.test_pipelines:build_with_episode")
    run = services.pipeline_run_create(scene=SCENE, seeds=[{"id": "a", "topic": "good"}, {"id": "b", "topic": "bad"}],
                                       actor=None, batch_name="gen")
    pipeline_jobs.run_pipeline(run.pk, llm=object())
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.COMPLETED and run.tasks_created == 1
    good = StageRun.objects.get(run=run, stage="probe", item_key="a")
    assert good.kind == "episode" and good.parsed_output["outcome"] == "success" and good.raw_output == "42"
    assert (good.llm_calls, good.total_tokens) == (2, 30)
    bad = StageRun.objects.get(run=run, stage="probe", item_key="b")
    assert bad.status == StageRun.Status.DROPPED and bad.error == "the probe failed"
    assert seen[0]["config"]["prompt"] == "good"
    assert seen[0]["cache_key_extra"] == {"pipeline_run": str(run.uuid), "stage": "probe", "item": "a"}


def test_an_episode_lost_to_infrastructure_fails_the_stage_for_a_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.engines import agent

    async def lost(**kw: Any) -> Any:
        return agent.EpisodeResult(outcome="error", error_kind="infrastructure", retryable=True,
                                   outcome_reason="sandbox lost")

    monkeypatch.setattr(agent, "run_episode", lost)
    monkeypatch.setitem(pipelines.PIPELINES, SCENE, "tests.engines.test_pipelines:build_with_episode")
    run = services.pipeline_run_create(scene=SCENE, seeds=[{"id": "a", "topic": "good"}], actor=None, batch_name="g")
    pipeline_jobs.run_pipeline(run.pk, llm=object())
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.FAILED and "sandbox lost" in run.error
    assert StageRun.objects.get(run=run).status == StageRun.Status.FAILED


def build_fan_out(config: dict[str, Any]) -> Pipeline:
    many = Template(id="demo/many", version="1", user=lambda inputs: f"Two tasks about {inputs['seed']['topic']}.")
    return Pipeline(
        name="fan",
        stages=(
            LLMStage(name="questions", template=many, fan_out=True, schema={
                "type": "object", "required": ["items"],
                "properties": {"items": {"type": "array", "items": QUESTION_SCHEMA | {"properties": {
                    "prompt": {"type": "string", "minLength": 20}, "id": {"type": "string"}}}}}}),
            CodeStage(name="gate", fn=lambda inputs: {"ok": True}, inputs=lambda s: {"q": s["questions"]}),
        ),
        task=lambda key, state: {"scene": SCENE, "prompt": state["questions"]["prompt"]},
    )


def test_a_fan_out_stage_makes_an_item_of_each_element(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pipelines.PIPELINES, SCENE, "tests.engines.test_pipelines:build_fan_out")
    by_id = {"items": [{"id": "a", "prompt": task_text("a")}, {"id": "b", "prompt": task_text("b")}]}
    no_ids = {"items": [{"prompt": task_text("c")}, {"prompt": task_text("d")}]}
    _, llm = model(*[{"id": f"many-{k}", "prompt": script_key(stage_route("demo/many", k)), "reference_solution": [
        {"content": json.dumps(out)}]} for k, out in (("s1", by_id), ("s2", no_ids))])
    run = create_and_run(llm, keys=("s1", "s2"))
    assert run.status == PipelineRun.Status.COMPLETED, run.error
    assert sorted(StageRun.objects.filter(run=run, stage="gate").values_list("item_key", flat=True)) == [
        "s1.a", "s1.b", "s2.0", "s2.1"]
    assert StageRun.objects.get(run=run, stage="gate", item_key="s1.b").inputs == {
        "q": {"id": "b", "prompt": task_text("b")}}
    assert sorted(Task.objects.values_list("external_id", flat=True)) == ["fan-s1.a", "fan-s1.b", "fan-s2.0",
                                                                          "fan-s2.1"]


# -- the admin -----------------------------------------------------------------------------------


def test_the_admin_shows_stage_runs_and_its_actions_go_through_the_services(model: Any, admin_client: Any) -> None:
    _, llm = model(*GOOD.values())
    run = create_and_run(llm, keys=("s1",))
    page = admin_client.get(reverse("admin:engines_pipelinerun_change", args=[run.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    task = Task.objects.get()
    assert reverse("admin:tasks_task_change", args=[task.pk]) in body and "demo/question" not in body
    producer = task.stage_runs.get()
    task_page = admin_client.get(reverse("admin:tasks_task_change", args=[task.pk])).content.decode()
    assert reverse("admin:engines_stagerun_change", args=[producer.pk]) in task_page
    assert f"pipeline run #{run.pk} (demo), item s1" in task_page
    row = StageRun.objects.get(run=run, stage="question")
    detail = admin_client.get(reverse("admin:engines_stagerun_change", args=[row.pk])).content.decode()
    assert "demo/question" in detail and "&quot;prompt&quot;" in detail  # the JSON, indented and escaped
    assert admin_client.get(reverse("admin:engines_pipelinerun_changelist")).status_code == 200

    queued = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1"), actor=None, batch_name="gen")
    url = reverse("admin:engines_pipelinerun_changelist")
    admin_client.post(url, {"action": "cancel_selected", "_selected_action": [queued.pk]})
    queued.refresh_from_db()
    assert queued.status == PipelineRun.Status.CANCELLED
    assert audit_events_for(queued).get(action="engines.pipeline_cancel").actor_repr == "admin"
    response = admin_client.post(url, {"action": "resume_selected", "_selected_action": [queued.pk, run.pk]},
                                 follow=True)
    queued.refresh_from_db()
    assert queued.status == PipelineRun.Status.QUEUED
    assert "Resumed 1" in response.content.decode() and "only a failed or cancelled run resumes" in \
        response.content.decode()
    admin_client.post(url, {"action": "start_selected", "_selected_action": [queued.pk]})
    assert audit_events_for(queued).filter(action="engines.pipeline_start").count() == 2
    # Read-only: no add page, no edits by POST to the change page.
    assert admin_client.get(reverse("admin:engines_pipelinerun_add")).status_code == 403
    admin_client.post(reverse("admin:engines_pipelinerun_change", args=[queued.pk]), {"status": "completed"})
    queued.refresh_from_db()
    assert queued.status == PipelineRun.Status.QUEUED


# -- the command ---------------------------------------------------------------------------------


def pipeline_cmd(*args: str) -> str:
    out = io.StringIO()
    call_command("synthesize_pipeline", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_the_command_refuses_unknown_scenes_and_bad_seed_files(tmp_path: Path) -> None:
    seeds_file = tmp_path / "seeds.jsonl"
    seeds_file.write_text('{"id": "a"}\n', encoding="utf-8")
    bare = scene_without_pipeline()
    with pytest.raises(CommandError, match=f"scene {bare} has no generation pipeline yet"):
        pipeline_cmd(bare, "--seeds", str(seeds_file))
    with pytest.raises(CommandError, match="unknown scene 'nope'"):
        pipeline_cmd("nope", "--seeds", str(seeds_file))
    with pytest.raises(CommandError, match="no such file"):
        pipeline_cmd(SCENE, "--seeds", str(tmp_path / "missing.jsonl"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a"}\n{"id": \n', encoding="utf-8")
    with pytest.raises(CommandError, match=r"broken.jsonl:2: malformed JSON"):
        pipeline_cmd(SCENE, "--seeds", str(broken))
    (tmp_path / "seeds.txt").write_text("a\n")
    with pytest.raises(CommandError, match="must be .jsonl or .json"):
        pipeline_cmd(SCENE, "--seeds", str(tmp_path / "seeds.txt"))
    (tmp_path / "obj.json").write_text('{"id": "a"}')
    with pytest.raises(CommandError, match="holds a list of seeds"):
        pipeline_cmd(SCENE, "--seeds", str(tmp_path / "obj.json"))
    with pytest.raises(CommandError, match="goes with --wait"):
        pipeline_cmd(SCENE, "--seeds", str(seeds_file), "--start-offline-model")
    with pytest.raises(CommandError, match="--seeds FILE is required"):
        pipeline_cmd(SCENE)
    assert not PipelineRun.objects.exists()


def test_the_command_without_wait_queues_the_run_for_the_workers(tmp_path: Path,
                                                                   django_capture_on_commit_callbacks: Any) -> None:
    from django_q.models import OrmQ

    seeds_file = tmp_path / "seeds.json"
    seeds_file.write_text(json.dumps(seeds("s1", "s2", "s3")), encoding="utf-8")
    with django_capture_on_commit_callbacks(execute=True):
        output = pipeline_cmd(SCENE, "--seeds", str(seeds_file), "--limit", "2", "--batch", "later")
    run = PipelineRun.objects.get()
    assert run.status == PipelineRun.Status.QUEUED and len(run.seeds) == 2 and run.batch_name == "later"
    assert [row.task["func"] for row in OrmQ.objects.all()] == [services.JOB_FUNC]
    assert [row.task["args"] for row in OrmQ.objects.all()] == [(run.pk,)]
    assert "queued for the worker cluster" in output and f"/admin/engines/pipelinerun/{run.pk}/change/" in output


# `synthesize_pipeline --wait` polls (every IDLE_POLL_S) for as long as another holder keeps the run,
# as it must for a cluster worker. In a test nothing else ever frees it: a run left held (a claim
# by a name that looks alive, or a claim that keeps failing) made the command poll for ever, and the
# module hung after one failure. The command's run_pipeline fails after this many unclaimed polls.
MAX_UNCLAIMED_POLLS = 40  # 20 s at IDLE_POLL_S = 0.5


@pytest.fixture(autouse=True)
def command_wait_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    real = pipeline_jobs.run_pipeline
    unclaimed = {"n": 0}

    def run_pipeline(run_id: int, **kw: Any) -> dict[str, Any]:
        result = real(run_id, **kw)
        unclaimed["n"] = 0 if result.get("claimed") else unclaimed["n"] + 1
        if unclaimed["n"] > MAX_UNCLAIMED_POLLS:
            run = PipelineRun.objects.get(pk=run_id)
            raise AssertionError(f"pipeline run #{run_id} stayed {run.status} (worker {run.worker!r}) for "
                                 f"{MAX_UNCLAIMED_POLLS} polls: nothing in this test will free it")
        return result

    monkeypatch.setattr(pipeline_jobs, "run_pipeline", run_pipeline)


@pytest.fixture
def offline_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from tests.tasks.test_synthesize import offline_only

    yield from offline_only.__wrapped__(tmp_path, monkeypatch)  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_the_command_generates_with_the_offline_model_end_to_end(tmp_path: Path, offline_url: str) -> None:
    seeds_file = tmp_path / "seeds.jsonl"
    seeds_file.write_text("".join(json.dumps(s) + "\n" for s in seeds("s1", "s2", "s3", "s4")), encoding="utf-8")
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([GOOD["s1"], GOOD["s2"], answer("s3", {"prompt": task_text("s1")}),
                                   answer("s4", "I cannot do that.")]), encoding="utf-8")
    output = pipeline_cmd(SCENE, "--seeds", str(seeds_file), "--batch", "generated", "--wait", "--generate-only",
                          "--start-offline-model", "--solutions", str(scripts))
    run = PipelineRun.objects.get()
    assert run.status == PipelineRun.Status.COMPLETED and run.tasks_created == 2 and run.items_dropped == 2
    assert sorted(Task.objects.filter(batch__name="generated").values_list("external_id", flat=True)) == [
        "demo-s1", "demo-s2"]
    assert "started in this process with 4 reference solution(s)" in output
    assert "stage 4/4 tasks" in output
    assert (f"Pipeline run #{run.pk} {SCENE}/demo: completed; 4 seed(s) -> 2 item(s) through every stage, "
            "2 dropped; 2 task(s) in batch 'generated'") in output
    assert "dropped at question (1): invalid output after 1 repair(s): the answer is not JSON" in output
    assert "dropped at dedup (1): duplicate of s1" in output
    assert "| 2 dropped | 2 tasks |" in output
    assert "model calls:  5;" in output  # s4 had one repair turn
    assert f"/admin/engines/pipelinerun/{run.pk}/change/" in output


def build_bundled(config: dict[str, Any]) -> Pipeline:
    """Restates a bundled code task (its verifier comes with the seed): the rollouts can succeed."""
    return Pipeline(
        name="bundled",
        stages=(LLMStage(name="question", template=QUESTION, schema=QUESTION_SCHEMA),),
        task=lambda key, state: {**{k: v for k, v in state["seed"]["task"].items() if k != "reference_solution"},
                                 "prompt": state["question"]["prompt"]},
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings")
def test_the_command_generates_then_rolls_out_and_reviews_the_batch(tmp_path: Path, offline_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings

    from apps.tasks.models import Trajectory

    monkeypatch.setitem(pipelines.PIPELINES, SCENE, "tests.engines.test_pipelines:build_bundled")
    bundled = Path(settings.BASE_DIR) / "examples" / "tasks" / "code_exec.jsonl"
    task = json.loads(bundled.read_text(encoding="utf-8").splitlines()[0])
    seeds_file = tmp_path / "seeds.jsonl"
    seeds_file.write_text(json.dumps({"id": "b1", "topic": "intervals", "task": task}) + "\n", encoding="utf-8")
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([answer("b1", {"prompt": task["prompt"]})]), encoding="utf-8")
    output = pipeline_cmd(SCENE, "--seeds", str(seeds_file), "--batch", "rolled", "--wait", "--start-offline-model",
                          "--solutions", str(scripts), str(bundled))
    trajectory = Trajectory.objects.get(task__batch__name="rolled")
    assert (trajectory.outcome, trajectory.reward) == ("success", 1.0)
    assert trajectory.task.stage_runs.get().run.status == PipelineRun.Status.COMPLETED
    assert "1 task(s) in batch 'rolled'" in output and "1 task(s): 1 done, 0 failed" in output


WORKER_SCRIPT = textwrap.dedent("""
    import os, django
    django.setup()
    from apps.engines import pipelines
    from apps.engines.llm import LLMClient, Provider
    from apps.engines.pipelines import jobs

    pipelines.PIPELINES["code_exec"] = "tests.engines.test_pipelines:build_demo"
    llm = LLMClient([Provider("offline", os.environ["PIPELINE_TEST_MODEL_URL"], "scripted-reference")])
    jobs.run_pipeline(int(os.environ["PIPELINE_TEST_RUN"]), llm=llm)
""")


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_stage_is_resumed_and_pays_no_finished_stage_twice(model: Any) -> None:
    from tests.tasks.test_jobs import REPO, _database_url

    server, llm = model(*GOOD.values())
    run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2", "s3"), actor=None, batch_name="gen",
                                       config={"concurrency": 1})
    env = {**os.environ, "DATABASE_URL": _database_url(), "DJANGO_SETTINGS_MODULE": "trajplatform.settings",
           "PIPELINE_TEST_MODEL_URL": server.url, "PIPELINE_TEST_RUN": str(run.pk), "PIPELINE_TEST_HANG_ON": "s2"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):  # the worker is inside the gate stage of s2
            if StageRun.objects.filter(run=run, stage="gate", item_key="s2", status="running").exists():
                break
            assert worker.poll() is None, worker.stdout.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("the worker never reached the gate of s2")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.RUNNING and run.attempts == 1  # left behind by the dead worker
    assert calls_by_key(server) == {script_key(stage_route("demo/question", k)): 1 for k in ("s1", "s2", "s3")}
    finished_before = set(StageRun.objects.filter(run=run, status__in=StageRun.FINISHED).values_list("pk", "attempts"))
    assert len(finished_before) == 4  # three questions, the gate of s1

    # Its heartbeat is fresh; the process that held it is gone: re-queued at once.
    assert pipeline_jobs.reap_pipeline_runs()["requeued"] == 1
    assert pipeline_jobs.run_pipeline(run.pk, llm=llm)["status"] == "completed"
    run.refresh_from_db()
    assert run.tasks_created == 3 and run.attempts == 2
    assert calls_by_key(server) == {script_key(stage_route("demo/question", k)): 1 for k in ("s1", "s2", "s3")}
    assert finished_before <= set(StageRun.objects.filter(run=run).values_list("pk", "attempts"))  # untouched
    assert StageRun.objects.get(run=run, stage="gate", item_key="s2").attempts == 2


@pytest.mark.django_db(transaction=True)
def test_the_command_resumes_a_failed_run_where_it_stopped(tmp_path: Path, offline_url: str) -> None:
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps(list(GOOD.values())), encoding="utf-8")
    port = int(offline_url.rsplit(":", 1)[1].split("/")[0])
    with running_offline_model([scripts], port=port) as server:
        run = services.pipeline_run_create(scene=SCENE, seeds=seeds("s1", "s2"), actor=None, batch_name="gen",
                                           start=False)
        from tests.engines import test_pipelines as me

        original = me.gate
        me.gate = lambda inputs: (_ for _ in ()).throw(RuntimeError("gate down"))
        try:
            pipeline_jobs.run_pipeline(run.pk)
        finally:
            me.gate = original
        run.refresh_from_db()
        assert run.status == PipelineRun.Status.FAILED
        with pytest.raises(CommandError, match=f"--resume: no pipeline run #{run.pk + 1}"):
            pipeline_cmd(SCENE, "--resume", str(run.pk + 1), "--wait")
        output = pipeline_cmd(SCENE, "--resume", str(run.pk), "--wait", "--generate-only")
        assert server.model.chat_requests == 2  # the questions of the first attempt were not asked again
    run.refresh_from_db()
    assert run.status == PipelineRun.Status.COMPLETED and run.tasks_created == 2
    assert f"Resuming pipeline run #{run.pk} (2 seed(s))" in output and ": completed;" in output
    with pytest.raises(CommandError, match="only a failed or cancelled run resumes"):
        pipeline_cmd(SCENE, "--resume", str(run.pk))


@pytest.mark.django_db(transaction=True)
def test_the_command_waits_for_a_run_another_worker_holds_and_follows_hand_overs(
        tmp_path: Path, offline_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = pipeline_jobs.run_pipeline
    answers = iter([{"claimed": False}, {"claimed": True, "status": pipeline_jobs.HANDED_OVER}])
    calls = []

    def run_pipeline(run_id: int, **kw: Any) -> dict[str, Any]:
        calls.append(run_id)
        return next(answers, None) or real(run_id, **kw)

    monkeypatch.setattr(pipeline_jobs, "run_pipeline", run_pipeline)
    seeds_file = tmp_path / "seeds.json"
    seeds_file.write_text(json.dumps(seeds("s1")), encoding="utf-8")
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([GOOD["s1"]]), encoding="utf-8")
    output = pipeline_cmd(SCENE, "--seeds", str(seeds_file), "--wait", "--generate-only", "--start-offline-model",
                          "--solutions", str(scripts))
    assert len(calls) == 3 and ": completed;" in output and PipelineRun.objects.get().tasks_created == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_the_command_fails_instead_of_waiting_for_ever_on_a_run_nothing_frees(
        tmp_path: Path, offline_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_jobs, "claim_run", lambda run_id, worker: None)  # always "another worker has it"
    monkeypatch.setattr(pipeline_command, "IDLE_POLL_S", 0.01)
    seeds_file = tmp_path / "seeds.json"
    seeds_file.write_text(json.dumps(seeds("s1")), encoding="utf-8")
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([GOOD["s1"]]), encoding="utf-8")
    started = time.monotonic()
    with pytest.raises(CommandError, match=r"stayed queued .* nothing in this test will free it"):
        pipeline_cmd(SCENE, "--seeds", str(seeds_file), "--wait", "--generate-only", "--start-offline-model",
                     "--solutions", str(scripts))
    assert time.monotonic() - started < 30
