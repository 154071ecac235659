"""The toucan scene end to end: registered MCP servers (examples/toucan/servers.json: PyPI's
mcp-server-time, -git, -fetch and our sqlite server) started in a real local sandbox by the MCP
hub, the shared agent loop, the offline scripted model, and the verifier (quality.py) run on the
steps the loop wrote.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from apps.engines import registry as runtime_registry
from apps.engines.models import McpServer
from apps.engines.runtime import get_runtime
from apps.engines.sandboxes import get_backend
from apps.engines.scenes.toucan import quality, questions
from apps.engines.mcp_servers import load_records, parse_record, take_snapshot
from apps.engines.scenes.toucan.runtime import ToucanRuntime
from tests.engines.test_agent import (  # noqa: F401 - llm_env is a fixture
    assert_no_sandbox_left,
    call,
    config_for,
    llm_env,
    run,
    scripted,
)
from tests.engines.test_envscaler_runtime import _bwraps_using
from tests.tasks.test_synthesize import offline_only  # noqa: F401 - a fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

EXAMPLES = Path(settings.BASE_DIR) / "examples"
RECORDS = {r["name"]: r for r in load_records(EXAMPLES / "toucan" / "servers.json")}
_SNAPSHOTS: dict[str, Any] = {}


def _descendants(pids: list[int]) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _kill_and_wait(pids: list[int]) -> None:
    """SIGKILL the processes and everything below them (the server inside bwrap's namespace too,
    not left to bwrap's --die-with-parent, which a loaded machine delivers late), then wait until
    they are gone, so the next call meets a dead server."""
    victims = _descendants(pids)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(_alive, victims)):
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def register(*names: str) -> dict[str, McpServer]:
    """Bundled servers as registry rows; their tools/list snapshots are taken once per session (in
    a sandbox, as registration does) and the rows written for each test."""
    rows = {}
    for name in names:
        record = parse_record(RECORDS[name])
        if name not in _SNAPSHOTS:
            _SNAPSHOTS[name] = take_snapshot(record)
        snapshot = _SNAPSHOTS[name]
        rows[name] = McpServer.objects.create(
            name=name, spec=record.spec.to_dict(), labels=record.labels, secrets=record.secrets,
            fixtures=record.fixtures, state_probe=record.state_probe, tools=snapshot.tools,
            tools_sha256=snapshot.sha256)
    return rows


@pytest.fixture
def registered() -> dict[str, McpServer]:
    return register("time", "git", "sqlite")


def toucan(prompt: str, servers: list[str], targets: list[str], check: dict[str, Any] | None = None,
           **fields: Any) -> dict[str, Any]:
    scene = {"target_servers": servers, "target_tools": targets, **({"check": check} if check else {})}
    fields.setdefault("step_timeout_s", 30.0)
    fields.setdefault("timeout_s", 120.0)
    return config_for(prompt, scene, scene="toucan", **fields)


def test_the_runtime_is_registered_and_offers_the_servers_tools_named_server__tool(registered: Any) -> None:
    runtime = get_runtime("toucan")
    assert isinstance(runtime, ToucanRuntime)
    tools = {t["function"]["name"]: t["function"] for t in runtime.tools(toucan("q", ["time", "git"], []))}
    assert {"time__convert_time", "time__get_current_time", "git__git_log", "git__git_create_branch",
            "finish"} <= set(tools)
    assert all(name == "finish" or name.split("__")[0] in ("time", "git") for name in tools)
    assert tools["time__convert_time"]["parameters"] == next(
        t["input_schema"] for t in registered["time"].tools if t["name"] == "convert_time")


def test_registry_labels_drive_featured_and_power_law_sampling(registered: Any) -> None:
    import random

    from apps.engines.scenes.toucan.pipeline import server_records

    records = {r["name"]: r for r in server_records()}
    assert (records["time"]["rank"], records["time"]["labels"]["featured"]) == (1, True)
    assert records["sqlite"]["labels"]["featured"] is False and "SQLite" in records["sqlite"]["description"]
    featured = questions.plan_questions(list(records.values()), {"sampling": "featured", "total": 30},
                                        rng=random.Random(5))
    assert {p["servers"][0]["name"] for p in featured} == {"time", "git"}
    drawn = questions.plan_questions(list(records.values()), {"sampling": "power_law", "total": 600,
                                                              "power_law_alpha": 2.0}, rng=random.Random(5))
    counts = {name: sum(p["servers"][0]["name"] == name for p in drawn) for name in records}
    assert counts["time"] > counts["git"] > counts["sqlite"]  # ranks 1, 2, 4


def test_a_server_that_needs_egress_is_a_config_error_on_the_local_backend_never_run_offline(registered: Any) -> None:
    time_row = registered["time"]
    McpServer.objects.create(name="online", spec={**time_row.spec, "name": "online", "network": "egress"},
                             labels={}, tools=time_row.tools, tools_sha256=time_row.tools_sha256)
    config = toucan("What time is it in Tokyo?", ["online"], ["online__get_current_time"])
    assert ToucanRuntime().sandbox_spec(config).network == "open"  # what OpenSandbox is asked for
    assert ToucanRuntime().sandbox_spec(toucan("q", ["time"], ["time__get_current_time"])).network == "none"
    with scripted(config["prompt"], call("online__get_current_time", timezone="Asia/Tokyo"),
                  call("finish", answer="x")) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.error_kind, result.retryable) == ("error", "config", False)
    assert "only network='none'" in result.outcome_reason and result.steps == []


def test_an_unregistered_server_is_refused_with_its_name(registered: Any) -> None:
    config = toucan("What time is it?", ["time", "weather"], [])
    with scripted(config["prompt"], call("finish", answer="x")) as (_, llm):
        result = run(config, llm)
    assert result.outcome == "error" and "weather are not registered" in result.outcome_reason


def test_a_time_question_with_an_answer_check_and_a_recovered_tool_error(registered: Any) -> None:
    config = toucan("When it is 12:00 UTC on 2026-01-15, what time is it in Tokyo?", ["time"], ["time__convert_time"],
                    {"type": "answer", "expected": "21:00", "match": "contains"})
    steps = [
        call("time__convert_time", source_timezone="UTC", time="12:00", target_timezone="Mars/Olympus"),
        call("time__convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo"),
        call("finish", answer="It is 21:00 in Tokyo."),
    ]
    with scripted(config["prompt"], *steps) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    bad, good, _ = result.steps
    assert bad["is_error"] is True and bad["output"].startswith("error: ") and bad["server"] == "time"
    assert good["is_error"] is False and "T21:00:00+09:00" in good["output"] and good["mcp_tool"] == "convert_time"
    assert [r["method"] for r in bad["mcp_calls"]] == ["tools/list", "tools/call"]
    out = result.verifier_output
    assert out["method"] == "check" and out["check"]["passed"] is True
    assert out["tool_call_accuracy"]["desired_tools_used_percentage"] == 1.0
    assert out["rule_filter"] == {"passed": True, "failed": [], "tool_responses": 2, "error_responses": 1,
                                  "error_steps": [0]}
    # The verifier's functions on the steps the loop stored give what the runtime computed.
    assert quality.rule_filter(result.steps, result.final_answer)["error_responses"] == 1
    assert quality.called_tools(result.steps) == ["time__convert_time", "time__convert_time"]
    assert_no_sandbox_left(get_backend("local"))


def test_a_git_task_is_decided_by_its_state_check_in_the_sandbox(registered: Any) -> None:
    check = {"type": "state", "probe": "git -C /workspace/repo branch --list release-1 --format='%(refname:short)'",
             "expect": "release-1"}
    config = toucan("In my repository at /workspace/repo, create a branch release-1 from main.", ["git"],
                    ["git__git_create_branch"], check)
    create = call("git__git_create_branch", repo_path="/workspace/repo", branch_name="release-1", base_branch="main")
    with scripted(config["prompt"], create, call("finish", answer="Created release-1.")) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.reward) == ("success", 1.0), (result.outcome_reason, result.verifier_output)
    assert result.verifier_output["check"]["stdout"].strip() == "release-1"

    with scripted(config["prompt"], call("git__git_branch", repo_path="/workspace/repo", branch_type="local"),
                  call("finish", answer="Created release-1.")) as (_, llm):
        lazy = run(config, llm)
    assert (lazy.outcome, lazy.reward) == ("failure", 0.0)
    assert lazy.verifier_output["tool_call_accuracy"]["missing_tools"] == ["git__git_create_branch"]


def test_without_a_check_the_reward_is_the_target_tool_share_gated_by_the_rule_filter_and_the_order(
        registered: Any) -> None:
    config = toucan("What is the newest commit message in /workspace/repo, and what time is 12:00 UTC in Tokyo?",
                    ["git", "time"], ["git__git_log", "time__convert_time"])
    config["scene_config"]["order"] = "any"
    with scripted(config["prompt"], call("git__git_log", repo_path="/workspace/repo", max_count=1),
                  call("finish", answer="document usage")) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.reward) == ("failure", 0.5)
    out = result.verifier_output
    assert out["method"] == "tool_accuracy_proxy" and out["tool_call_accuracy"]["order_correctness"] is False
    assert (out["decided_by"], out["process"]["target_tools"]["ok"]) == ("target_tools", False)
    assert "document usage" in result.steps[0]["output"]


def test_a_server_dying_mid_episode_is_an_infrastructure_error(registered: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    class Killing(ToucanRuntime):
        def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                         timeout: float | None = None) -> Any:
            if name == "time__get_current_time":
                _kill_and_wait(_bwraps_using(str(sandbox.workspace)))
            return super().execute_tool(name, args, sandbox, config, timeout=timeout)

    monkeypatch.setitem(runtime_registry._instances, "toucan", Killing())
    config = toucan("What time is it in Tokyo now?", ["time"], ["time__get_current_time"])
    with scripted(config["prompt"], call("time__get_current_time", timezone="Asia/Tokyo"),
                  call("finish", answer="x")) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.error_kind, result.retryable) == ("error", "infrastructure", True)
    assert result.steps[0]["error_kind"] == "infrastructure"
    assert_no_sandbox_left(get_backend("local"))


def test_a_page_served_on_the_sandbox_loopback_is_fetched_and_the_answer_checked() -> None:
    register("fetch")
    config = toucan("On which day and at what time does the reading club of the library at "
                    "http://127.0.0.1:8080/events.html meet?", ["fetch"], ["fetch__fetch"],
                    {"type": "answer", "expected": "17:30", "match": "contains"})
    with scripted(config["prompt"], call("fetch__fetch", url="http://127.0.0.1:8080/events.html"),
                  call("finish", answer="Every Tuesday at 17:30.")) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.reward) == ("success", 1.0), (result.outcome_reason, result.steps)
    assert "Reading club: every Tuesday at 17:30" in result.steps[0]["output"]


def test_sqlite_insert_then_query_with_a_state_check(registered: Any) -> None:
    probe = ("python3 -c \"import sqlite3; print(sqlite3.connect('/workspace/data.db')"
             ".execute('select stock from products where name=\\'tripod\\'').fetchone()[0])\"")
    config = toucan("We received 5 tripods; set the tripod stock to 5 and tell me the total units in stock.",
                    ["sqlite"], ["sqlite__write_query", "sqlite__read_query"], {"type": "state", "probe": probe,
                                                                                 "expect": "5"})
    with scripted(config["prompt"], call("sqlite__write_query", query="UPDATE products SET stock = 5 WHERE name = 'tripod'"),
                  call("sqlite__read_query", query="SELECT SUM(stock) AS total FROM products"),
                  call("finish", answer="Tripod stock is 5; 20 units in total.")) as (_, llm):
        result = run(config, llm)
    assert (result.outcome, result.reward) == ("success", 1.0), (result.outcome_reason, result.verifier_output,
                                                                  [s["output"] for s in result.steps])
    assert "20" in result.steps[1]["output"]
    assert result.verifier_output["tool_call_accuracy"]["order_correctness"] is True
    assert json.dumps(result.verifier_output)  # stored as JSON


# -- the bundled examples: ready tasks and the generation pipeline, with the offline model --------

TASK_FILE = EXAMPLES / "tasks" / "toucan.jsonl"
BUNDLED = [json.loads(line) for line in TASK_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_there_are_at_least_ten_ready_tasks_each_with_a_check_and_a_script() -> None:
    assert len(BUNDLED) >= 10 and len({t["external_id"] for t in BUNDLED}) == len(BUNDLED)
    assert all(t["config"]["check"]["type"] in ("answer", "state") and t["reference_solution"] for t in BUNDLED)
    assert {s for t in BUNDLED for s in t["config"]["target_servers"]} <= set(RECORDS)


def _command(name: str, *args: str) -> str:
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.usefixtures("offline_only")
def test_synthesize_runs_every_bundled_task_to_success_in_the_real_sandbox() -> None:
    from apps.tasks.models import Task, Trajectory

    register(*sorted({s for t in BUNDLED for s in t["config"]["target_servers"]}))
    output = _command("synthesize", "--tasks", str(TASK_FILE), "--batch", "toucan-examples", "--wait",
                      "--start-offline-model", "--concurrency", "2")
    trajectories = Trajectory.objects.filter(task__batch__name="toucan-examples")
    failed = {t.task.external_id: (t.outcome, t.outcome_reason, t.verifier_output.get("check"))
              for t in trajectories.select_related("task") if t.reward != 1.0}
    assert failed == {}, output
    assert trajectories.count() == len(BUNDLED)
    assert set(Task.objects.filter(batch__name="toucan-examples").values_list("status", flat=True)) == {"completed"}
    for trajectory in trajectories:
        assert trajectory.verifier_output["method"] == "check"
        assert trajectory.verifier_output["rule_filter"]["passed"], trajectory.task.external_id
        assert all(s.get("mcp_calls") for s in trajectory.steps if s["tool"] != "finish")


@pytest.mark.usefixtures("offline_only")
def test_the_pipeline_generates_dedups_and_checks_questions_then_runs_them() -> None:
    from apps.engines.models import PipelineRun, StageRun
    from apps.tasks.models import Task, Trajectory

    register("time", "git", "sqlite")
    output = _command("synthesize_pipeline", "toucan", "--seeds", str(EXAMPLES / "toucan" / "seeds.jsonl"),
                      "--batch", "toucan-generated", "--wait", "--start-offline-model")
    run = PipelineRun.objects.get()
    dropped = dict(StageRun.objects.filter(run=run, status=StageRun.Status.DROPPED).values_list("item_key", "error"))
    gate = StageRun.objects.get(run=run, stage="dedup")
    assert "time-1.q1" in gate.parsed_output["dropped"], output
    assert gate.parsed_output["dropped"]["time-1.q1"].startswith("near duplicate of time-1.q0")
    assert dropped["time-1.q2"] == "below the quality thresholds: verifiable 1 < 2; stability 1 < 3", dropped
    tasks = {t.external_id: t for t in Task.objects.filter(batch__name="toucan-generated")}
    assert sorted(tasks) == ["toucan-git-sqlite.q0", "toucan-time-1.q0"]
    generated = tasks["toucan-git-sqlite.q0"].scene_config
    assert generated["target_tools"] == ["git__git_log", "sqlite__read_query"]
    assert generated["question_quality_assessment"]["stability"]["score"] == 5
    assert generated["generation"]["templates"] == {"toucan/question": "1", "toucan/qc": "1"}
    for trajectory in Trajectory.objects.filter(task__batch__name="toucan-generated"):
        assert (trajectory.outcome, trajectory.reward) == ("success", 1.0), trajectory.verifier_output
        assert trajectory.verifier_output["method"] == "tool_accuracy_proxy"
    _exports_as_toucan_rows([t.pk for t in Trajectory.objects.filter(task__batch__name="toucan-generated")])


def _exports_as_toucan_rows(ids: list[int]) -> None:
    """The generated trajectories as rows of the released Toucan dataset: valid lines whose JSON-text
    columns carry both assessments (tests/datasets/test_anchor_rows.py compares them with real rows)."""
    import io
    import json

    import orjson

    from apps.datasets.exporters import export_records, load_records, validate_line

    buf = io.BytesIO()
    result = export_records("toucan", load_records(ids), buf)
    rows = [orjson.loads(line) for line in buf.getvalue().splitlines()]
    assert result.lines == len(ids) == 2 and result.excluded == []
    row = next(r for r in rows if r["target_tools"] == "git_log, read_query")
    assert set(row) == {"uuid", "subset_name", "messages", "question", "available_tools", "target_tools",
                        "question_quality_assessment", "response_quality_assessment", "metadata"}
    messages = json.loads(row["messages"])
    assert row["question"] == messages[1]["content"] and row["question"].startswith("Before I tag a release")
    assert {m["function_call"]["name"] for m in messages if "function_call" in m} >= {"git-git_log", "sqlite-read_query"}
    assert json.loads(row["question_quality_assessment"])["verifiable"]["score"] == 5
    rqa = json.loads(row["response_quality_assessment"])
    assert (rqa["desired_tools_used_percentage"], rqa["order_correctness"]) == (1.0, True)
    assert rqa["completeness"]["score"] in range(1, 6) and rqa["conciseness"]["score"] in range(1, 6)
    assert rqa["overall_score"] == (rqa["completeness"]["score"] + rqa["conciseness"]["score"]) / 2
    metadata = json.loads(row["metadata"])
    assert metadata["rule_filter"] == {"passed": True, "failed": []} and metadata["judge_model"] == "scripted-reference"
    assert [s["server_name"] for s in metadata["mcp_servers"]] == ["git", "sqlite"]
    assert metadata["verifier"] == "tool_accuracy_proxy"
    assert validate_line("toucan", row) == []


def test_a_replay_starts_no_server_reproduces_the_steps_and_does_not_rerun_a_state_check(
    registered: Any, make_task: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uuid

    from apps.engines.llm import cache_identity
    from apps.engines.mcp import McpSession
    from apps.engines.offline_model import running_offline_model
    from apps.tasks.models import Trajectory
    from tests.engines.test_agent import client

    def no_session(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a replay started an MCP session")

    answer = toucan("When it is 12:00 UTC, what time is it in Tokyo?", ["time"], ["time__convert_time"],
                    {"type": "answer", "expected": "21:00", "match": "contains"})
    branch = toucan(f"Create the branch release-2 in {'/workspace/repo'}.", ["git"], ["git__git_create_branch"],
                    {"type": "state", "probe": "git -C /workspace/repo rev-parse --abbrev-ref release-2",
                     "expect": "release-2"})
    scripts = [
        {"id": "a", "prompt": answer["prompt"], "reference_solution": [
            call("time__convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo"),
            call("finish", answer="21:00")]},
        {"id": "b", "prompt": branch["prompt"], "reference_solution": [
            call("git__git_create_branch", repo_path="/workspace/repo", branch_name="release-2"),
            call("finish", answer="done")]},
    ]
    recorded = {}
    with running_offline_model(scripts=scripts) as server:
        for name, config in (("answer", answer), ("branch", branch)):
            original = uuid.uuid4()
            result = run(config, client(server.url), cache_key_extra=cache_identity(original))
            assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
            Trajectory.objects.create(uuid=original, task=make_task(scene="toucan"), iteration=1,
                                      steps=result.steps, verifier_output=result.verifier_output)
            recorded[name] = (original, result)
        monkeypatch.setattr(McpSession, "__init__", no_session)
        replays = {name: run({**config, "replay_of": str(recorded[name][0])}, client(server.url))
                   for name, config in (("answer", answer), ("branch", branch))}

    def without_llm(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in step.items() if k != "llm"} for step in items]

    original_answer, replayed_answer = recorded["answer"][1], replays["answer"]
    assert (replayed_answer.outcome, replayed_answer.reward) == ("success", 1.0), replayed_answer.outcome_reason
    assert without_llm(replayed_answer.steps) == without_llm(original_answer.steps)
    assert replayed_answer.verifier_output["check"] == original_answer.verifier_output["check"]
    replayed_branch = replays["branch"]
    assert replayed_branch.verifier_output["method"] == "tool_accuracy_proxy" and replayed_branch.reward == 1.0
    assert "does not re-run the state check" in replayed_branch.verifier_output["note_replay"]
    assert_no_sandbox_left(get_backend("local"))


@pytest.mark.usefixtures("offline_only")
def test_a_quality_check_that_cannot_be_parsed_rejects_the_question_never_passes_it(tmp_path: Path) -> None:
    from apps.engines.models import PipelineRun, StageRun
    from apps.tasks.models import Task

    register("time")
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"id": "s", "servers": ["time"], "num_tools": 1, "total": 2, "seed": 3}) + "\n")
    good = {"server_analysis": "converts times", "target_tools": [{"server": "time", "tool": "convert_time"}]}
    scripts = tmp_path / "scripts.json"
    scripts.write_text(json.dumps([
        {"prompt": "[pipeline:toucan/question key=s.q0]", "reference_solution": [{"content": json.dumps(
            {**good, "question": "I land in Tokyo at 12:00 UTC. What is the local time there then?"})}]},
        {"prompt": "[pipeline:toucan/question key=s.q1]", "reference_solution": [{"content": json.dumps(
            {**good, "question": "Our Kolkata office opens when it is 03:30 UTC. What is its local opening time?"})}]},
        # Prose instead of the six dimensions, and a repair that still rates before reasoning.
        {"prompt": "[pipeline:toucan/qc key=s.q0]", "reference_solution": [{"content": "A fine question, 5/5."}]},
        {"prompt": "[pipeline:toucan/qc key=s.q0 repair=1]", "reference_solution": [{"content": json.dumps(
            {d: {"rating": s[4], "reasoning": "ok"} for d, s in questions.QC_SCALES.items()})}]},
        # A dimension missing: no repair script, so the repair turn's answer is not a check either.
        {"prompt": "[pipeline:toucan/qc key=s.q1]", "reference_solution": [{"content": json.dumps(
            {"question_quality": {"reasoning": "clear", "rating": "excellent"}})}]},
    ]))
    _command("synthesize_pipeline", "toucan", "--seeds", str(seeds), "--batch", "qc-garbage", "--wait",
             "--generate-only", "--start-offline-model", "--solutions", str(scripts))
    run = PipelineRun.objects.get()
    qc = {r.item_key: r for r in StageRun.objects.filter(run=run, stage="qc")}
    assert {k: r.status for k, r in qc.items()} == {"s.q0": "dropped", "s.q1": "dropped"}
    assert "rating comes before the reasoning" in qc["s.q0"].error and qc["s.q0"].repair_attempts == 1
    assert "'tool_selection_difficulty' is a required property" in qc["s.q1"].validator_result["turns"][0]["error"]
    assert not Task.objects.filter(batch__name="qc-garbage").exists()
