"""The toolace pipeline's cross-group suites (issue 24): the run config's `cross` ("named",
"all_pairs", "none") and `max_cross_pairs`, on real pipeline runs (the offline scripted model, the
suite and task gates in the local sandbox) over the demo's seeds plus a third suite, a notebook.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from apps.engines.offline_model import running_offline_model
from apps.engines.generation import PipelineError
from apps.engines.pipelines import jobs as pipeline_jobs
from apps.engines.pipelines import services as pipeline_services
from apps.engines.scenes.toolace.pipeline import build as build_pipeline
from tests.engines.test_agent import client, config_for, llm_env, run  # noqa: F401 - llm_env is a fixture
from tests.engines.test_toolace import SCRIPTS, demo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

# -- a third admitted suite: a notebook (no class, operation or attribute in common with the others)

NOTES_CODE = '''\
class Notebook:
    """Notes by id."""

    def __init__(self, notes=None, next_note=2):
        self.notes = dict(notes or {})
        self.next_note = next_note

    def add_note(self, title, text=""):
        if not title.strip():
            raise ValueError("the title is empty")
        note_id = f"N-{self.next_note}"
        self.next_note += 1
        self.notes[note_id] = {"title": title, "text": text}
        return {"note_id": note_id}

    def get_note(self, note_id):
        if note_id not in self.notes:
            raise KeyError(f"no note {note_id}")
        return {"note_id": note_id, **self.notes[note_id]}
'''
NOTES_OPS = [
    demo.op("add_note", "Add a note.", demo.obj(["title"], title=demo.STR, text={**demo.STR, "default": ""}),
            {"type": "object", "properties": {"note_id": demo.STR}}, [("ValueError", "the title is empty")],
            {"title": "Groceries"}),
    demo.op("get_note", "A note by its id.", demo.obj(["note_id"], note_id=demo.STR), {"type": "object"},
            [("KeyError", "no such note")], {"note_id": "N-1"}),
]
NOTES_SUITE = demo.suite("Notebook", "A personal notebook.", NOTES_OPS, NOTES_CODE,
                         {"notes": {"N-1": {"title": "Welcome", "text": "hello"}}}, [],
                         [demo.flow("write", "write a note", "add_note")])
NOTES_SEED = {"id": "notes", "domain": "a personal notebook", "tools": [{"name": "add_note", "description": "Add"}]}
NOTED = 'any(n["title"] == "{title}" for n in env.notes.values())'
NOTES_TASKS = {
    "notes.write": [demo.task("bank", "single", "Add a note titled 'Call the bank'.",
                              [("add_note", {"title": "Call the bank"})],
                              "return " + NOTED.format(title="Call the bank"), None)],
    "calendar-email.x-notes": [demo.task(
        "dentist", "parallel", "Put 'Dentist' on my calendar for 2026-12-07 from 08:00 to 08:30 and add a note "
        "titled 'Dentist'.",
        [("create_event", {"title": "Dentist", "date": "2026-12-07", "start": "08:00", "end": "08:30"}),
         ("add_note", {"title": "Dentist"})],
        'return (any(e["title"] == "Dentist" for e in env.events.values())\n'
        '        and ' + NOTED.format(title="Dentist") + ")", None)],
    "expense-reports.x-notes": [demo.task(
        "submitted", "parallel", "Submit expense report R-9 and add a note titled 'R-9 submitted'.",
        [("submit_report", {"report_id": "R-9"}), ("add_note", {"title": "R-9 submitted"})],
        'return env.reports["R-9"]["status"] == "submitted" and ' + NOTED.format(title="R-9 submitted"),
        [demo.parallel(("submit_report", {"report_id": "R-9"}), ("add_note", {"title": "R-9 submitted"})),
         demo.finish("Submitted R-9 and noted it.")])],
}
NOTES_SCRIPTS = [
    demo.content("[pipeline:toolace/refine key=notes]", demo.ops_only(NOTES_OPS, "add_note")),
    demo.content("[pipeline:toolace/expand key=notes]", demo.ops_only(NOTES_OPS)),
    demo.content("[pipeline:toolace/couple key=notes]", NOTES_SUITE),
    *[demo.content(f"[pipeline:toolace/tasks key={key}]", {"items": [t["task"] for t in tasks]})
      for key, tasks in NOTES_TASKS.items()],
]
CAL, EXP, WEATHER = demo.SEEDS


def run_pipeline(seeds: list[dict[str, Any]], config: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A real run: (the run, the cross stage's answer per seed, the created tasks by external id)."""
    from apps.engines.models import StageRun
    from apps.tasks.models import Task

    run_ = pipeline_services.pipeline_run_create(scene="toolace", seeds=seeds, actor=None, batch_name="gen",
                                                 config=config)
    with running_offline_model(scripts=SCRIPTS + NOTES_SCRIPTS) as server:
        result = pipeline_jobs.run_pipeline(run_.pk, llm=client(server.url))
    assert result["status"] == "completed", result
    cross = StageRun.objects.get(run=run_, stage="cross").parsed_output["kept"]
    return run_, cross, {t.external_id: t for t in Task.objects.filter(batch__name="gen")}


def made(cross: dict[str, Any]) -> dict[str, list[str]]:
    return {seed: [c["with"] for c in answer["combined"]] for seed, answer in cross.items()}


def cross_flows(tasks: dict[str, Any]) -> set[str]:
    return {t.scene_config["suite"] for t in tasks.values() if "+" in t.scene_config["suite"]}


def test_all_pairs_combines_every_admitted_pair_once_in_seed_order_and_makes_their_tasks() -> None:
    _, cross, tasks = run_pipeline([CAL, EXP, WEATHER, NOTES_SEED], {"cross": "all_pairs"})
    # the weather suite was dropped at the suite gate: no pair has it; each pair once, under its first seed
    assert made(cross) == {"calendar-email": ["expense-reports", "notes"], "expense-reports": ["notes"], "notes": []}
    assert all(a["rejected"] == {} and a["skipped"] == {} for a in cross.values())
    assert [c["suite"]["class_name"] for c in cross["calendar-email"]["combined"]] == [
        "CalendarMailExpenseReports", "CalendarMailNotebook"]
    assert cross_flows(tasks) == {"calendar-email+expense-reports", "calendar-email+notes", "expense-reports+notes"}
    assert {"toolace-calendar-email.x-expense-reports.review-and-submit", "toolace-calendar-email.x-notes.dentist",
            "toolace-expense-reports.x-notes.submitted", "toolace-notes.write.bank"} <= set(tasks)
    assert not [k for k in tasks if ".x-calendar-email." in k or "notes.x-" in k]
    assert len(tasks) == 14 + 3  # the demo's 14, the notebook's own and its two cross-group tasks
    # a cross-group task the pipeline made runs on both suites in one environment and is rewarded
    task = tasks["toolace-expense-reports.x-notes.submitted"]
    assert task.scene_config["class_name"] == "ExpenseReportsNotebook"
    assert set(task.scene_config["init_config"]) == {"expense_reports", "notebook"}
    config = config_for(task.prompt, task.scene_config, scene="toolace", max_steps=task.max_steps)
    solution = NOTES_TASKS["expense-reports.x-notes"][0]["solution"]
    with running_offline_model(scripts=[{"id": "s", "prompt": task.prompt, "reference_solution": solution}]) as srv:
        result = run(config, client(srv.url))
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    final = result.verifier_output["final_state"]
    assert final["reports"]["R-9"]["status"] == "submitted" and final["notes"]["N-2"]["title"] == "R-9 submitted"


def test_pairs_past_max_cross_pairs_are_recorded_as_skipped_and_make_no_tasks() -> None:
    _, cross, tasks = run_pipeline([CAL, EXP, NOTES_SEED], {"cross": "all_pairs", "max_cross_pairs": 1})
    assert made(cross) == {"calendar-email": ["expense-reports"], "expense-reports": [], "notes": []}
    assert cross["calendar-email"]["skipped"] == {"notes": "cross: over max_cross_pairs=1 (pair 2 of 3)"}
    assert cross["expense-reports"]["skipped"] == {"notes": "cross: over max_cross_pairs=1 (pair 3 of 3)"}
    assert cross_flows(tasks) == {"calendar-email+expense-reports"}


def test_named_pairs_are_made_once_under_the_first_seed_that_names_them() -> None:
    # both name each other, the calendar a seed that is not in the run, the notebook in a bad shape
    seeds = [{**CAL, "cross_with": ["expense-reports", "nowhere", "notes"]}, {**EXP, "cross_with": ["calendar-email"]},
             {**NOTES_SEED, "cross_with": "calendar-email"}]
    _, cross, tasks = run_pipeline(seeds, {})  # the defaults: named, at most 4 pairs
    assert made(cross) == {"calendar-email": ["expense-reports", "notes"], "expense-reports": [], "notes": []}
    assert cross["calendar-email"]["rejected"] == {"nowhere": "cross: that seed's suite was not admitted"}
    assert cross["expense-reports"]["skipped"] == {"calendar-email": "cross: the pair is made under calendar-email"}
    assert cross["notes"]["rejected"] == {"cross_with": "cross: cross_with must be a list of seed ids"}
    assert cross_flows(tasks) == {"calendar-email+expense-reports", "calendar-email+notes"}
    assert not [k for k in tasks if ".x-calendar-email." in k]


def test_cross_none_makes_no_combined_suite_and_records_the_named_ones_as_skipped() -> None:
    _, cross, tasks = run_pipeline([CAL, EXP], {"cross": "none"})
    assert made(cross) == {"calendar-email": [], "expense-reports": []}
    assert cross["calendar-email"]["skipped"] == {"expense-reports": "cross: the run's cross is 'none'"}
    assert cross_flows(tasks) == set() and len(tasks) == 14 - 1


@pytest.mark.parametrize(("config", "message"), [
    ({"cross": "both"}, "cross must be one of 'named', 'all_pairs', 'none', not 'both'"),
    ({"cross": ["all_pairs"]}, "cross must be one of"),
    ({"max_cross_pairs": -1}, "max_cross_pairs must be a whole number from 0 to 100, not -1"),
    ({"max_cross_pairs": "4"}, "max_cross_pairs must be a whole number"),
    ({"max_cross_pairs": True}, "max_cross_pairs must be a whole number"),
    ({"max_cross_pairs": 101}, "max_cross_pairs must be a whole number"),
])
def test_a_bad_cross_config_is_refused_by_name_and_nothing_is_written(config: dict[str, Any], message: str,
                                                                        tmp_path: Any) -> None:
    from apps.engines.models import PipelineRun, StageRun
    from apps.tasks.models import Batch
    from trajplatform.audit import AuditEvent

    with pytest.raises(PipelineError, match=message):
        build_pipeline(config)
    with pytest.raises(PipelineError, match=message):
        pipeline_services.pipeline_run_create(scene="toolace", seeds=[CAL, EXP], actor=None, config=config)
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps(CAL) + "\n")
    with pytest.raises(CommandError, match=message):
        call_command("synthesize_pipeline", "toolace", "--seeds", str(seeds), "--config", json.dumps(config))
    assert not (PipelineRun.objects.exists() or StageRun.objects.exists() or Batch.objects.exists()
                or AuditEvent.objects.exists())
