"""The review agent: deterministic checks, the judge's prompt and output, the overall formula, drafts."""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from apps.engines.llm import LLMUnavailable
from apps.engines.offline_model import JUDGE_ROUTE as OFFLINE_JUDGE_ROUTE
from apps.reviews import review_agent
from apps.reviews.review_agent import JudgeFailed, draft_proposals, judge, overall_score, run_checks
from tests.engines.test_agent import llm_env  # noqa: F401 - a fixture
from tests.reviews.factories import auto_review, finished_trajectory

pytestmark = pytest.mark.django_db


@dataclass
class FakeChat:
    content: str
    model: str = "judge-model"
    usage: dict = field(default_factory=dict)
    cost_usd: int = 0


class FakeJudge:
    """An LLM client double: answers with `reply` (or raises it) and records the request."""

    def __init__(self, reply: Any):
        self.reply = reply
        self.requests: list[dict[str, Any]] = []

    def chat(self, messages, **kwargs):
        self.requests.append({"messages": messages, **kwargs})
        if isinstance(self.reply, Exception):
            raise self.reply
        return FakeChat(self.reply)


def _step(index: int, tool: str, arguments: Any, **extra: Any) -> dict[str, Any]:
    return {"index": index, "turn": index + 1, "tool": tool, "arguments": arguments, "output": "", "exit_code": 0,
            **extra}


def test_a_clean_successful_trajectory_fires_no_check(make_task):
    checks = run_checks(finished_trajectory(make_task()))
    assert [k for k, v in checks.items() if v["fired"]] == []
    assert set(checks) == set(review_agent.CHECK_PENALTIES)


def test_each_check_fires_on_its_evidence(make_task):
    steps = [
        _step(0, "run_shell", '{"command": "ls"', error="the arguments of run_shell are not valid JSON (x at character 1)"),
        _step(1, "rm_rf", {}, error="unknown tool 'rm_rf'; available tools: run_shell, finish"),
        _step(2, "run_shell", {"command": 5}, error="invalid arguments for run_shell.command: 5 is not of type 'string'"),
        _step(3, "run_shell", {"cmd": "x"}, exit_code=1),
        _step(4, "run_shell", {"cmd": "x"}, exit_code=1),
        _step(5, "run_shell", {"cmd": "x"}, exit_code=1, output="mail bob@acme-mail.com, key [REDACTED]"),
    ]
    tools = [{"type": "function", "function": {"name": "run_shell", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "additionalProperties": True}}},
        {"type": "function", "function": {"name": "finish", "parameters": {"type": "object"}}}]
    trajectory = finished_trajectory(
        make_task(), steps=steps, tools=tools, outcome="failure", reward=None, final_answer="",
        outcome_reason="max_steps (6) reached without finish")
    checks = run_checks(trajectory)
    fired = {k: v["count"] for k, v in checks.items() if v["fired"]}
    assert fired == {"unparseable_calls": 1, "unknown_tools": 1, "invalid_arguments": 1, "repeated_actions": 1,
                     "unhandled_errors": 6, "limit_exhausted": 1, "empty_final_answer": 1, "sensitive_data": 2}
    assert checks["limit_exhausted"]["limit"] == "max_steps"
    assert "e-mail address in steps [5]" in checks["sensitive_data"]["detail"]
    assert checks["unhandled_errors"]["penalty"] == 15  # 5 each, capped


@pytest.fixture
def sandbox_root(settings):
    """A private SANDBOX_ROOT under /var/tmp (the sandbox user must be able to enter its parents)."""
    root = Path(tempfile.mkdtemp(prefix="t-review-", dir="/var/tmp"))
    root.chmod(0o711)
    settings.SANDBOX_ROOT, settings.SANDBOX_ALLOW_UNISOLATED, settings.SANDBOX_POOL_SIZE = root, False, 0
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("llm_env", "sandbox_root")
def test_call_checks_count_schema_violations_and_malformed_calls_the_real_loop_recorded(make_task):
    """3 calls that break their tool's schema and 1 malformed call, through apps.engines.agent:
    the step kinds the loop writes are what the checks count."""
    from apps.engines.sandboxes import get_backend
    from tests.engines.test_agent import SCHEMA_BREAKING_CALLS, canned, config_for, run

    task = make_task(prompt="Anything.")
    with canned(*SCHEMA_BREAKING_CALLS) as (_, llm):
        result = run(config_for(task.prompt), llm, sandbox_backend=get_backend("local", records=False))
    trajectory = finished_trajectory(task, steps=result.steps, tools=result.tools, messages=result.messages,
                                     outcome=result.outcome, reward=result.reward, final_answer=result.final_answer)
    checks = run_checks(trajectory)
    calls = {k: checks[k]["count"] for k in ("unparseable_calls", "unknown_tools", "invalid_arguments")
             if checks[k]["fired"]}
    assert calls == {"invalid_arguments": 3, "unparseable_calls": 1}
    assert checks["invalid_arguments"]["detail"] == "steps [0, 1, 2]"


def test_call_checks_read_steps_stored_before_the_loop_recorded_error_kinds(make_task):
    """Rows written by the old loop: a schema violation kept the JSON text as its arguments."""
    steps = [_step(i, "run_shell", '{"command": 5}', exit_code=None,
                   error="invalid arguments for run_shell.command: 5 is not of type 'string'") for i in range(3)]
    steps.append(_step(3, "run_shell", '{"command": "ls"', exit_code=None,
                       error="the arguments of run_shell are not valid JSON (x at character 1)"))
    checks = run_checks(finished_trajectory(make_task(), steps=steps))
    assert (checks["invalid_arguments"]["count"], checks["unparseable_calls"]["count"]) == (3, 1)


def test_a_failed_verifier_and_an_error_outcome_fire(make_task):
    task = make_task()
    assert run_checks(finished_trajectory(task, outcome="failure", reward=0.5))["verifier"]["fired"]
    errored = run_checks(finished_trajectory(task, sample=1, outcome="error", reward=None,
                                             outcome_reason="LLM error: 503"))
    assert errored["episode_error"]["fired"] and not errored["empty_final_answer"]["fired"]


def test_the_overall_formula():
    scores = {"a": {"score": 80}, "b": {"score": 60}}
    none = {"x": {"penalty": 0}}
    assert overall_score(scores, none, None) == 70.0
    assert overall_score(scores, none, 1.0) == 85.0            # 0.5 * 70 + 0.5 * 100
    assert overall_score(scores, {"x": {"penalty": 15}, "y": {"penalty": 10}}, 0.5) == 35.0
    assert overall_score({"a": {"score": 5}}, {"x": {"penalty": 30}}, None) == 0.0   # clamped


def test_the_judge_prompt_carries_the_rubric_evidence_and_the_marker(make_task):
    trajectory = finished_trajectory(make_task(scene="envscaler", scene_config={"env_name": "x"}))
    checks = run_checks(trajectory)
    reply = json.dumps({"scores": {d: {"score": 90, "rationale": "fine"} for d in review_agent.RUBRICS["envscaler"]},
                        "suggestions": [{"field": "temperature", "to": 0.2, "rationale": "less random"}],
                        "summary": "good"})
    client = FakeJudge(f"Here you go:\n```json\n{reply}\n```")
    result = judge(trajectory, checks, llm=client)
    assert set(result.scores) == {"tool_selection", "tool_execution", "reasoning", "completeness", "efficiency"}
    assert result.suggestions == [{"field": "temperature", "to": 0.2, "rationale": "less random"}]
    assert result.model == "judge-model" and result.rubric_version == "envscaler@1"
    system = client.requests[0]["messages"][0]["content"]
    assert "trajplatform" not in system and "[" not in system.splitlines()[0]  # no routing marker for a real model
    assert review_agent.JUDGE_ROUTE == OFFLINE_JUDGE_ROUTE
    user = client.requests[0]["messages"][1]["content"]
    evidence = json.loads(user.split(review_agent.EVIDENCE_OPEN)[1].split(review_agent.EVIDENCE_CLOSE)[0])
    assert evidence["dimensions"] == list(review_agent.RUBRICS["envscaler"]) and evidence["reward"] == 1.0
    assert client.requests[0]["temperature"] == 0.0


@pytest.mark.parametrize("reply, message", [
    ("I think it is fine.", "no JSON object"),
    ('{"scores": {"tool_usage": 50}', "not valid JSON"),
    ('{"verdict": "ok"}', "no `scores`"),
    ('{"scores": {"tool_usage": {"score": 150}}}', "from 0 to 100"),
    ('{"scores": {"tool_usage": {"score": 50}}}', "scores no `reasoning`"),
])
def test_unusable_judge_output_is_a_judge_failure_never_a_score(make_task, reply, message):
    trajectory = finished_trajectory(make_task())
    with pytest.raises(JudgeFailed, match=message) as excinfo:
        judge(trajectory, run_checks(trajectory), llm=FakeJudge(reply))
    assert excinfo.value.raw == reply and excinfo.value.prompt


def test_an_unreachable_judge_is_a_judge_failure(make_task):
    trajectory = finished_trajectory(make_task())
    with pytest.raises(JudgeFailed, match="could not be reached: LLMUnavailable"):
        judge(trajectory, run_checks(trajectory), llm=FakeJudge(LLMUnavailable("HTTP 503 from offline")))


def test_drafts_come_from_rules_and_suggestions_tiered_by_the_policy_not_the_judge(make_task):
    task = make_task(max_steps=10, temperature=0.7)
    trajectory = finished_trajectory(task)
    review = auto_review(trajectory, checks={
        "limit_exhausted": {"fired": True, "count": 1, "limit": "max_steps"},
        "unhandled_errors": {"fired": True, "count": 2},
    }, suggestions=[
        {"field": "temperature", "to": 0.3, "tier": "red", "rationale": "the judge calls it red"},
        {"field": "model", "to": "gpt-4o-mini", "rationale": "stronger"},
        {"field": "model", "to": "other", "rationale": "duplicate field: ignored"},
        {"field": "status", "to": "completed", "rationale": "not a config field"},
        {"field": "scene_config.image", "to": "python:3.12", "rationale": "newer python"},
        {"field": "quality_threshold", "to": 5, "rationale": "refused by the bounds"},
    ])
    drafts = {d.field: d for d in draft_proposals(task, [review])}
    assert set(drafts) == {"max_steps", "system_prompt_extra", "temperature", "model", "scene_config.image"}
    assert (drafts["max_steps"].tier, drafts["max_steps"].to_value, drafts["max_steps"].proposer) == (
        "green", 20, "rule:max_steps")
    assert drafts["system_prompt_extra"].tier == "green"
    assert review_agent.HINTS["unhandled_errors"] in drafts["system_prompt_extra"].to_value
    assert drafts["temperature"].tier == "green"  # the policy's tier, not the judge's "red"
    model = drafts["model"]
    assert model.tier == "yellow" and model.options[0] == "gpt-4o-mini" and 2 <= len(model.options) <= 4
    assert drafts["scene_config.image"].tier == "red" and "sandbox image" in drafts["scene_config.image"].impact_note


def test_the_toucan_rubric_judges_completeness_and_conciseness_under_its_own_version():
    from apps.reviews.review_agent import RUBRICS, rubric_id

    assert {"completeness", "conciseness"} <= set(RUBRICS["toucan"])
    assert rubric_id("toucan") == "toucan@2" and rubric_id("code_exec") == "code_exec@1"


def test_addresses_at_reserved_example_domains_are_not_personal_data() -> None:
    from apps.reviews.review_agent import _sensitive_hits

    assert _sensitive_hits("mail dana@example.org, ops@mail.example.com, a@b.test or x@shop.example") == []
    assert _sensitive_hits("write to ana@examples.org") == ["e-mail address"]
    assert _sensitive_hits("write to ana@example.org.evil.io") == ["e-mail address"]


@pytest.mark.django_db(transaction=True)
def test_the_judge_s_cost_is_stored_on_its_review_and_counts_against_the_batch_budget(
        offline_model: Any, make_task: Any, admin_user_role: Any, settings: Any) -> None:
    """The real judge through the real LLM client and the offline model, priced by LLM_PRICES."""
    from decimal import Decimal

    from apps.engines.offline_model import MODEL_NAME
    from apps.reviews.jobs import review_one
    from apps.reviews.models import Review
    from apps.reviews.selectors import batch_spend
    from apps.tasks import budgets
    from apps.tasks.models import Batch
    from trajplatform.audit import AuditEvent

    settings.LLM_PRICES = {MODEL_NAME: ["1000", "1000"]}  # $0.001 a token, in and out
    batch = Batch.objects.create(name="judged")
    task = make_task(batch=batch, status="running")
    trajectory = finished_trajectory(task, cost_usd=Decimal("0.01"))
    review = review_one(trajectory)
    assert review.status == Review.Status.DONE and review.cost_usd > 0
    usage_cost = review.cost_usd
    audit = AuditEvent.objects.get(action="reviews.review_store", target_id=str(review.pk))
    assert Decimal(audit.data["cost_usd"]) == usage_cost

    spend = batch_spend(batch)
    assert Decimal(spend["judge_usd"]) == usage_cost
    assert Decimal(spend["spent_usd"]) == Decimal("0.01") + usage_cost
    # A budget the episode alone has not spent is spent once the judge's cost is added: the batch's
    # queued trajectories wait.
    budgets.batch_set_budget(batch=batch, budget_usd=str(Decimal("0.01") + usage_cost / 2), actor=admin_user_role)
    snap = budgets.snapshot(max_age_s=0)
    assert snap.batches[batch.pk].over().startswith("batch 'judged' spent $")
    assert snap.blocked() is not None
    settings.BUDGET_DAILY_USD = 100
    assert budgets.snapshot(max_age_s=0).day.spent == trajectory.cost_usd * (trajectory.finished_at is not None) + usage_cost


def test_failed_process_conditions_fire_also_where_the_task_relaxed_them_so_a_hollow_success_stays_below_80(
        make_task):
    process = {"rule_filter": {"ok": False, "detail": "failed rules: no_tool_calls", "relaxed": True},
               "target_tools": {"ok": True, "detail": ""}, "sources_opened": {"detail": "no ok given"}}
    trajectory = finished_trajectory(make_task(), reward=1.0, verifier_output={"process": process, "reward": 1.0})
    checks = run_checks(trajectory)
    fired = checks["process_conditions"]
    assert (fired["fired"], fired["count"], fired["penalty"], fired["conditions"]) == (
        True, 2, 50, ["rule_filter", "sources_opened"])
    assert fired["detail"] == ("rule_filter: failed rules: no_tool_calls (relaxed by the task); "
                               "sources_opened: no ok given")
    perfect = {"completeness": {"score": 100}}
    assert overall_score(perfect, checks, 1.0) == 50.0
    one = run_checks(finished_trajectory(make_task(), sample=1, verifier_output={
        "process": {"tool_order": {"ok": False, "detail": "out of order", "relaxed": True}}}))
    assert overall_score(perfect, one, 1.0) == 75.0 < make_task().quality_threshold
    clean = run_checks(finished_trajectory(make_task(), sample=2, verifier_output={
        "process": {"rule_filter": {"ok": True, "detail": ""}}}))
    assert not clean["process_conditions"]["fired"] and overall_score(perfect, clean, 1.0) == 100.0


def _looping(task, sample=0, **fields):
    steps = [_step(0, "run_shell", {"command": "ls"})] + [
        _step(i, "run_shell", {"command": "pytest -q"}, exit_code=1) for i in range(1, 12)]
    return finished_trajectory(task, sample=sample, steps=steps, outcome="failure", reward=0.0, final_answer="",
                               outcome_reason="max_steps (12) reached without finish", **fields)


def test_a_limit_hit_by_steps_that_repeat_one_action_is_stuck_not_short_of_budget(make_task):
    task = make_task(max_steps=12, model="deepseek-chat")
    looping = _looping(task)
    checks = run_checks(looping)
    assert checks["limit_exhausted"]["stuck_on"] == f"run_shell x11 (steps {list(range(1, 12))})"
    assert checks["repeated_actions"]["fired"]
    review = auto_review(looping, overall=20.0, checks=checks, suggestions=[
        {"field": "max_steps", "to": 40, "rationale": "the judge wants more steps"},
        {"field": "timeout_s", "to": 1200.0, "rationale": "and more time"},
        {"field": "max_steps", "to": 6, "rationale": "fewer steps is no raise"}])
    drafts = {d.field: d for d in draft_proposals(task, [review])}
    assert set(drafts) == {"system_prompt_extra", "max_steps"} and drafts["max_steps"].to_value == 6
    hint = drafts["system_prompt_extra"]
    assert (hint.tier, hint.proposer) == ("green", "rule:prompt_hint")
    assert hint.to_value.endswith(review_agent.LOOP_HINT)
    assert review_agent.HINTS["repeated_actions"] not in hint.to_value
    assert "stuck at the limit repeating run_shell x11" in hint.rationale

    task.system_prompt_extra = hint.to_value  # the hints were applied, the agent still loops
    second = _looping(task, sample=1)
    again = auto_review(second, overall=20.0, checks=run_checks(second))
    drafts = {d.field: d for d in draft_proposals(task, [again])}
    assert set(drafts) == {"model"}
    assert (drafts["model"].tier, drafts["model"].proposer, drafts["model"].to_value) == (
        "yellow", "rule:stuck", "scripted-reference")
    assert 2 <= len(drafts["model"].options) <= 4 and "deepseek-chat" not in drafts["model"].options


def test_a_limit_hit_while_making_progress_still_raises_the_limit(make_task):
    task = make_task(max_steps=12)
    steps = [_step(i, "run_shell", {"command": f"step {i}"}) for i in range(12)]
    checks = run_checks(finished_trajectory(task, steps=steps, outcome="failure", reward=0.0, final_answer="",
                                            outcome_reason="max_steps (12) reached without finish"))
    assert checks["limit_exhausted"]["fired"] and checks["limit_exhausted"]["stuck_on"] == ""
    drafts = {d.field: d for d in draft_proposals(task, [auto_review(task.trajectories.get(), checks=checks)])}
    assert (drafts["max_steps"].tier, drafts["max_steps"].to_value) == ("green", 24)
