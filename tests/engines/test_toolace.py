"""The toolace scene: the simulated user, the gates, the generation pipeline, and trajectories from
the real loop (offline scripted model, local sandbox, the suite served by envscaler's server) with
the verifier's hard rules, follow-ups and the mt mode's re-fill.

The suites, tasks and solutions are the bundled demo's (examples/toolace/build.py).
"""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from apps.engines import ask_user
from apps.engines.offline_model import running_offline_model
from apps.engines.pipelines import jobs as pipeline_jobs
from apps.engines.pipelines import services as pipeline_services
from apps.engines.registry import RUNTIMES, _instances, get_runtime, register_runtime
from apps.engines.runtime import SceneRuntime, ToolResult, current_episode
from apps.engines.scenes.toolace import gates
from apps.engines.scenes.toolace.pipeline import build as build_pipeline
from apps.engines.scenes.toolace.runtime import ToolAceRuntime
from tests.engines.test_agent import call, client, config_for, llm_env, run  # noqa: F401 - llm_env is a fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

EXAMPLES = Path(settings.BASE_DIR) / "examples"
_spec = importlib.util.spec_from_file_location("toolace_build", EXAMPLES / "toolace" / "build.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)
SCRIPTS = json.loads((EXAMPLES / "pipelines" / "toolace" / "scripts.json").read_text())
SUITES = {"calendar-email": (demo.CAL_SUITE, demo.CAL_TASKS), "expense-reports": (demo.EXP_SUITE, demo.EXP_TASKS)}


def demo_task(key: str) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """(episode config, the scripted solution) of a demo task "<seed>.<flow>.<task id>", made by the
    pipeline's own task builder (a flow "x-<seed>": the cross-group suite of the two)."""
    seed, flow_id, task_id = key.split(".")
    suite, flows = SUITES[seed]
    if flow_id.startswith("x-"):
        combined = gates.combine_suites(suite, SUITES[flow_id[2:]][0])
        flows = demo.CROSS_TASKS
        flow = {**combined["flows"][0], "id": flow_id, "suite": combined, "cross_with": flow_id[2:]}
    else:
        flow = next(f for f in suite["flows"] if f["id"] == flow_id)
    entry = next(t for t in flows[flow_id] if t["task"]["id"] == task_id)
    row = build_pipeline({}).task(key, {"couple": suite, "flows": flow, "task_gate": entry["task"]})
    return config_for(row["prompt"], row["config"], scene="toolace", max_steps=row["max_steps"]), entry["solution"]


def solve(config: dict[str, Any], solution: list[dict[str, Any]]) -> Any:
    with running_offline_model(scripts=[{"id": "s", "prompt": config["prompt"], "reference_solution": solution}]) as srv:
        return run(config, client(srv.url))


# --- the loop's hooks, on a runtime of their own ------------------------------------------------


class _FollowUps(SceneRuntime):
    """No sandbox; `note(text)` and finish; two follow-ups; a transcript when the config asks for one."""

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        note = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return [{"type": "function", "function": {"name": "note", "parameters": note}},
                {"type": "function", "function": {"name": "finish", "parameters": {
                    "type": "object", "properties": {"answer": {"type": "string"}}}}}]

    def system_prompt(self, config: dict[str, Any]) -> str:
        return "Take notes."

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        return ToolResult(output=f"noted {args['text']}")

    def next_user_turn(self, config: dict[str, Any], final_answer: str) -> str | None:
        state = current_episode().state
        state["sent"] = state.get("sent", 0) + 1
        return {1: "And another?", 2: "One more."}.get(state["sent"])

    def transcript(self, config: dict[str, Any]) -> dict[str, Any] | None:
        if not config.get("scene_config", {}).get("rewrite"):
            return None
        return {"messages": [{"role": "user", "content": config["prompt"]}], "steps": [], "tools": []}


def test_the_loop_asks_for_follow_ups_after_each_finish_and_stores_a_runtimes_transcript() -> None:
    register_runtime("hooks_test", _FollowUps)
    try:
        steps = [call("note", text="a"), call("finish", answer="one"), call("finish", answer="two"),
                 call("note", text="b"), call("finish", answer="three")]
        config = config_for("Note things.", {}, scene="hooks_test")
        with running_offline_model(scripts=[{"id": "h", "prompt": "Note things.", "reference_solution": steps}]) as srv:
            result = run(config, client(srv.url))
            assert result.outcome == "success" and result.final_answer == "three"
            users = [m["content"] for m in result.messages if m["role"] == "user"]
            assert users == ["Note things.", "And another?", "One more."]
            assert [s["tool"] for s in result.steps] == ["note", "finish", "finish", "note", "finish"]
            config["scene_config"] = {"rewrite": True}
            rewritten = run(config, client(srv.url))
        assert (rewritten.messages, rewritten.steps, rewritten.tools) == (
            [{"role": "user", "content": "Note things."}], [], [])
    finally:
        RUNTIMES.pop("hooks_test", None)
        _instances.pop("hooks_test", None)


# --- the simulated user ------------------------------------------------------------------------


def test_the_deterministic_user_gives_the_facts_a_question_names_and_nothing_else() -> None:
    facts = {"manager_name": {"value": "Priya Natarajan", "aliases": ["boss"]}, "amount": 23.4}
    reply = ask_user.answer("Who is your manager? What is their name?", facts)
    assert (reply.text, reply.revealed) == ("The manager name is Priya Natarajan.", ["manager_name"])
    assert ask_user.answer("Who is your boss?", facts).revealed == ["manager_name"]  # by alias
    assert ask_user.answer("How much was it, what amount?", facts).text == "The amount is 23.4."
    unknown = ask_user.answer("What is your favourite colour?", facts)
    assert (unknown.text, unknown.revealed) == ("I don't know that.", [])
    assert reply.as_extra() == {"simulated_user": True, "user_simulator": "deterministic",
                                "revealed_facts": ["manager_name"]}
    with pytest.raises(ask_user.FactsError):
        ask_user.parse_facts(["not", "a", "dict"])


def test_the_llm_user_gets_its_own_prompt_and_model_and_revealed_facts_are_decided_in_code() -> None:
    asked: list[dict[str, Any]] = []
    counted: list[Any] = []

    class Chat:
        content, model, provider, usage, cost_usd, latency_ms, cached = "Oh, it was 23.4 dollars.", "m", "p", {}, 0, 1, False

    class Llm:
        def chat(self, messages: list[dict[str, Any]], **kw: Any) -> Chat:
            asked.append({"messages": messages, **kw})
            return Chat()

    simulator = ask_user.LLMSimulator(Llm(), model="user-model", prompt="You are Lena. Facts:\n{facts}",
                                      on_chat=counted.append)
    reply = ask_user.answer("How much was lunch?", {"amount": 23.4, "date": "2026-11-21"}, simulator=simulator)
    assert (reply.text, reply.revealed, reply.simulator) == ("Oh, it was 23.4 dollars.", ["amount"], "llm")
    assert asked[0]["model"] == "user-model" and len(counted) == 1
    assert asked[0]["messages"][0]["content"] == "You are Lena. Facts:\n- amount: 23.4\n- date: 2026-11-21"
    assert asked[0]["messages"][1] == {"role": "user", "content": "How much was lunch?"}


# --- the gates ---------------------------------------------------------------------------------


def test_the_suite_gate_passes_a_working_suite_and_names_an_operation_that_raises() -> None:
    report = gates.suite_gate(demo.CAL_SUITE)
    assert [s["operation"] for s in report["smoke"]] == [op["name"] for op in demo.CAL_OPS]
    with pytest.raises(gates.GateError) as broken:
        gates.suite_gate({**demo.CAL_SUITE, "code": demo.CAL_CODE_BUGGY})
    assert str(broken.value).startswith("suite.smoke: find_contact(")
    assert "undeclared AttributeError" in str(broken.value) and "Traceback" in str(broken.value)
    # A declared error is not a smoke failure; a static problem never reaches the sandbox.
    declared = copy.deepcopy(demo.CAL_SUITE)
    declared["operations"][2]["example"] = {"event_id": "EV-999"}  # cancel_event declares KeyError
    gates.suite_gate(declared)
    with pytest.raises(gates.GateError, match=r"^suite\.static: .*example arguments break the schema"):
        gates.suite_gate({**demo.CAL_SUITE, "operations": [{**demo.CAL_OPS[0], "example": {"date": 3}},
                                                           *demo.CAL_OPS[1:]]})


def test_the_task_gate_admits_by_replay_and_rejects_a_failing_check_a_raising_call_and_a_leak() -> None:
    calendar = {f"{f}.{t['task']['id']}": t["task"] for f, ts in demo.CAL_TASKS.items() for t in ts}
    verdicts = gates.task_gates(demo.CAL_SUITE, calendar)
    assert verdicts["schedule.debrief"].startswith("task.leak: the prompt contains hidden value(s) manager_name")
    assert verdicts["cleanup.vendor"].startswith("task.check: the check function does not pass")
    assert {k for k, v in verdicts.items() if v is None} == {
        "schedule.budget", "schedule.design-sync", "mail.offsite", "mail.omar-mt", "mail.parking", "cleanup.cancel-two"}
    dinner = next(t["task"] for t in demo.EXP_TASKS["items"] if t["task"]["id"] == "dinner")
    assert gates.task_gates(demo.EXP_SUITE, {"d": dinner})["d"] == (
        "task.replay: expected call 0 (add_expense) raised ValueError: 75 is over the meals limit of 60")
    weak = {**dinner, "type": "non_tool", "expected_calls": [],
            "check_func": "def check(env):\n    return len(env.reports) >= 2\n"}
    assert gates.task_gates(demo.EXP_SUITE, {"n": weak})["n"] == (
        "task.check: a non-tool task's check passes on a changed state (after create_report, add_expense, "
        "submit_report): it must assert the state unchanged")


# --- the pipeline ------------------------------------------------------------------------------


def test_the_pipeline_synthesizes_suites_and_admits_only_tasks_that_execute() -> None:
    from apps.engines.models import StageRun
    from apps.tasks.models import Task

    run = pipeline_services.pipeline_run_create(scene="toolace", seeds=demo.SEEDS, actor=None, batch_name="gen")
    with running_offline_model(scripts=SCRIPTS) as server:
        result = pipeline_jobs.run_pipeline(run.pk, llm=client(server.url))
    assert result["status"] == "completed", result
    couple = {r.item_key: r for r in StageRun.objects.filter(run=run, stage="couple")}
    assert couple["calendar-email"].status == "succeeded" and couple["calendar-email"].repair_attempts == 1
    assert couple["expense-reports"].repair_attempts == 0
    assert couple["weather"].status == "dropped" and "suite.smoke: get_forecast" in couple["weather"].error
    gate = StageRun.objects.get(run=run, stage="task_gate").parsed_output
    assert {k: v.split(":")[0] for k, v in gate["dropped"].items()} == demo.GATE_FAILS
    tasks = {t.external_id: t for t in Task.objects.filter(scene="toolace")}
    assert len(tasks) == 14
    cross = StageRun.objects.get(run=run, stage="cross").parsed_output["kept"]["calendar-email"]
    assert [c["with"] for c in cross["combined"]] == ["expense-reports"] and cross["rejected"] == {}
    both = tasks["toolace-calendar-email.x-expense-reports.review-and-submit"].scene_config
    assert both["suite"] == "calendar-email+expense-reports" and both["class_name"] == "CalendarMailExpenseReports"
    assert set(both["init_config"]) == {"calendar_mail", "expense_reports"}
    assert {"create_event", "submit_report"} <= {op["name"] for op in both["operations"]}
    lunch = tasks["toolace-expense-reports.items.lunch"].scene_config
    assert lunch["missing_params"] == ["amount"] and lunch["user_facts"] == {"amount": 23.4}
    assert lunch["code"] == demo.EXP_SUITE["code"] and lunch["generation"]["flow"]["id"] == "items"
    assert tasks["toolace-calendar-email.mail.omar-mt"].scene_config["mode"] == "mt"


# --- trajectories from the real loop -----------------------------------------------------------


def test_a_missing_parameter_is_asked_for_and_the_episode_is_rewarded_by_check_and_rules() -> None:
    config, solution = demo_task("expense-reports.items.lunch")
    assert isinstance(get_runtime("toolace"), ToolAceRuntime)
    result = solve(config, solution)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    asked = result.steps[0]
    assert asked["tool"] == "ask_user" and asked["simulated_user"] is True
    assert asked["output"] == "The amount is 23.4." and asked["revealed_facts"] == ["amount"]
    rules = result.verifier_output["rules"]
    assert all(r["passed"] for r in rules.values()) and rules["expected_calls"]["coverage"] == 1.0
    assert result.verifier_output["process"] == {
        name: {"ok": True, "relaxed": False, "detail": ""}
        for name in ("rule_filter", "asked_before_use", "target_tools")}  # one expected call: no order
    assert result.verifier_output["decided_by"] == "check"
    assert [t["function"]["name"] for t in result.tools] == [
        "create_report", "add_expense", "get_report", "list_reports", "submit_report", "ask_user", "finish"]


def test_an_llm_user_answers_through_the_episodes_model_client_and_is_recorded_and_counted() -> None:
    config, solution = demo_task("expense-reports.items.lunch")
    config["scene_config"]["user_simulator"] = {"kind": "llm", "model": "scripted-reference",
                                                 "prompt": "Answer briefly.\n{facts}"}
    config["scene_config"]["persona"] = "Lena Ortiz, a field engineer who files her expenses on the road"
    question = solution[0]["tool_calls"][0]["arguments"]["question"]
    scripts = [{"id": "agent", "prompt": config["prompt"], "reference_solution": solution},
               {"id": "user", "prompt": question, "reference_solution": [{"content": "Lunch came to 23.4, thanks."}]}]
    with running_offline_model(scripts=scripts) as server:
        result = run(config, client(server.url))
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    asked = result.steps[0]
    assert (asked["output"], asked["user_simulator"], asked["revealed_facts"]) == (
        "Lunch came to 23.4, thanks.", "llm", ["amount"])
    assert asked["user_simulator_llm"]["usage"]["total_tokens"] > 0
    # the simulated user's own prompt: the persona, the configured prompt, the facts (not the agent's)
    assert asked["user_simulator_llm"]["system"] == ("You are Lena Ortiz, a field engineer who files her expenses "
                                                     "on the road.\nAnswer briefly.\n- amount: 23.4")
    assert result.llm_calls == len(solution) + 1  # the agent's turns and the simulated user's
    # a simulated user whose model fails ends the episode as the platform's error, retryable
    config["scene_config"]["user_simulator"]["model"] = "no-such-model"
    with running_offline_model(scripts=scripts) as server:
        failed = run(config, client(server.url))
    assert (failed.outcome, failed.error_kind, failed.retryable) == ("error", "infrastructure", True)
    assert "the simulated user's model failed" in failed.outcome_reason


def test_a_cross_group_task_runs_on_both_suites_in_one_environment() -> None:
    config, solution = demo_task("calendar-email.x-expense-reports.review-and-submit")
    result = solve(config, solution)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    final = result.verifier_output["final_state"]
    assert final["reports"]["R-9"]["status"] == "submitted" and "EV-200" in final["events"]
    with pytest.raises(gates.GateError, match=r"cross\.static: .* \(operations in both: create_event\)"):
        gates.combine_suites(demo.CAL_SUITE, {**demo.EXP_SUITE, "operations": demo.CAL_OPS[1:2]})
    clashing = copy.deepcopy(demo.EXP_SUITE)
    clashing["code"] = clashing["code"].replace("self.limits", "self.events")
    with pytest.raises(gates.GateError, match="cross.clash: both parts keep the attribute.s. events"):
        gates.suite_gate(gates.combine_suites(demo.CAL_SUITE, clashing))


def test_composed_free_text_is_grounded_by_its_values_not_its_wording() -> None:
    config, solution = demo_task("calendar-email.mail.offsite")
    mail = {"to": "dana.whitfield", "subject": "Offsite agenda"}
    result = solve(config, [solution[0],
                            call("send_email", **mail, body="Hi Dana, here is the agenda for our offsite. See you there!"),
                            call("send_email", **mail, body="Hi Dana, the offsite moved to 2026-12-09, agenda attached."),
                            call("finish", answer="Sent.")])
    grounding = result.verifier_output["rules"]["grounding"]
    assert result.verifier_output["check_reward"] == 1.0 and result.reward == 0.0
    assert grounding["detail"] == ("step 2 (send_email): '2026-12-09' appears nowhere in the prompt, the user's "
                                   "turns or earlier tool outputs")


@pytest.mark.parametrize("key", ["calendar-email.mail.parking", "expense-reports.items.travel-450"])
def test_each_suites_wrong_solution_scores_zero_with_the_rule_named(key: str) -> None:
    config, solution = demo_task(key)
    result = solve(config, solution)
    assert (result.outcome, result.reward) == ("failure", 0.0)
    assert "grounding" in result.verifier_output["failed_rules"]
    assert "expected_calls" in result.verifier_output["failed_rules"]


def test_follow_ups_are_sent_after_each_finish_until_the_script_ends() -> None:
    config, solution = demo_task("calendar-email.schedule.budget")
    result = solve(config, solution)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    assert [m["role"] for m in result.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "user", "assistant", "tool", "assistant", "tool"]
    assert result.messages[6]["content"] == "Thanks. What else is on my calendar that day?"
    assert [s["tool"] for s in result.steps] == ["create_event", "finish", "list_events", "finish"]
    assert result.final_answer.startswith("On 2026-12-03: Team standup")
    assert result.verifier_output["rules"]["expected_answer"]["passed"]


def test_mt_executes_the_skeleton_refills_the_stale_suffix_and_stores_an_ordinary_dialogue() -> None:
    config, solution = demo_task("calendar-email.mail.omar-mt")
    result = solve(config, solution)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    mt_report = result.verifier_output["mt"]
    assert mt_report["consistent"] and mt_report["rounds"] == 1 and mt_report["refilled_turns"] == [1, 2]
    generation = mt_report["generation_messages"]
    assert "ohaddad" in generation[3]["content"] and "from_turn=1" in generation[3]["content"]
    # stored: the dialogue itself, with real outputs, as an agent episode would be
    assert [s["tool"] for s in result.steps] == ["find_contact", "send_email", "finish"]
    first, mail = result.steps[0], result.steps[1]
    assert first["output"] == '{"name": "Omar Haddad", "mailbox": "omar.haddad"}'
    assert first["skeleton_output"] == '{"name": "Omar Haddad", "mailbox": "ohaddad"}'
    assert (first["refilled"], mail["refilled"], mail["arguments"]["to"]) == (False, True, "omar.haddad")
    assert mail["state_changed"] is True and first["source"] == "mt"
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                    "assistant", "tool"]
    assert "write_dialogue" not in json.dumps(result.messages) and "ask_user" in [
        t["function"]["name"] for t in result.tools]


def test_mt_with_a_clarification_turn_and_no_refill() -> None:
    config, solution = demo_task("expense-reports.file.lodging-mt")
    result = solve(config, solution)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    asked = result.steps[0]
    assert (asked["tool"], asked["output"], asked["skeleton_output"]) == (
        "ask_user", "The date is 2026-11-19.", "2026-11-19")
    assert result.verifier_output["mt"]["rounds"] == 0 and not any(s["refilled"] for s in result.steps)


def test_mt_that_never_agrees_with_the_real_outputs_scores_zero() -> None:
    config, solution = demo_task("calendar-email.mail.omar-mt")
    config["scene_config"]["refine_rounds"] = 0
    result = solve(config, [solution[0], call("finish", answer="Sent.")])
    assert result.reward == 0.0 and "mt_consistent" in result.verifier_output["failed_rules"]
    # what ran (the prefix before the stale suffix) is still the stored dialogue
    assert [s["tool"] for s in result.steps] == ["find_contact"]


def test_stale_values_come_from_json_leaves_or_tokens_with_digits() -> None:
    from apps.engines.scenes.toolace import mt
    from apps.engines.scenes.toolace.rules import Context

    assert mt.simulated_values('{"id": "R-20", "total": 300, "ok": true}') == {"R-20", "300"}
    assert mt.simulated_values("Booked EV-201 for 2026-11-19.") == {"EV-201", "2026-11-19"}
    seen = Context()
    seen.add("Add it to report R-9.")
    assert mt.stale_values("Booked EV-201 in R-9 on 2026-11-19.", "Booked EV-200 in R-9 on 2026-11-19.", seen) == {
        "EV-201"}
    assert mt.depends_on([{"role": "assistant", "tool_calls": [{"name": "cancel_event",
                                                                "arguments": {"event_id": "EV-201"}}]}], {"EV-201"})
