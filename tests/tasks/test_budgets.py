"""Cost budgets (apps/tasks/budgets.py): per batch, per user and the daily cap, enforced by the real
worker job and the real agent loop before each model call; a stand-in LLM client prices every
call at CALL_COST; a scene of its own needs no sandbox."""
from __future__ import annotations

import itertools
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.engines.llm import ChatResult
from apps.engines.registry import RUNTIMES, register_runtime
from apps.engines.runtime import SceneRuntime, ToolResult, current_episode
from apps.reviews.selectors import batch_spend
from apps.reviews.tallies import refresh_batch_tallies
from apps.tasks import budgets, jobs
from apps.tasks.models import Batch, Task, Trajectory, TrajectoryLog, UserBudget
from apps.tasks.services import task_start_iteration
from tests.api.conftest import client_as, make_token  # noqa: F401 (fixtures)
from trajplatform.audit import AuditEvent

SCENE = "budget_test"
CALL_COST = Decimal("0.01")
_ids = itertools.count(1)


class WorkRuntime(SceneRuntime):
    """`work` until the model finishes; `delegate` runs a sub-episode of the same scene."""

    scene_id = SCENE

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        def tool(name: str, **props: Any) -> dict[str, Any]:
            return {"type": "function", "function": {"name": name, "parameters": {
                "type": "object", "properties": props}}}
        return [tool("work"), tool("delegate"), tool("finish", answer={"type": "string"})]

    def system_prompt(self, config: dict[str, Any]) -> str:
        return "work, then finish"

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        if name == "delegate":
            child = current_episode().run_subepisode({**config, "prompt": "sub: work then finish"}, label="helper")
            return ToolResult(output=f"helper: {child.outcome} {child.outcome_reason}")
        return ToolResult(output="ok")


class PricedLLM:
    """Answers `work` (or `delegate`, for prompts that say so) until the episode has made
    `steps` calls, then `finish`; every call costs CALL_COST."""

    def __init__(self, steps: int = 10) -> None:
        self.steps = steps
        self.calls = 0
        self.primary = type("P", (), {"model": "priced-fake"})()

    async def achat(self, messages: list[dict[str, Any]], **kwargs: Any) -> ChatResult:
        self.calls += 1
        made = sum(1 for m in messages if m.get("role") == "assistant")
        prompt = messages[1]["content"]
        name = "work"
        if prompt.startswith("delegate") and made == 0:
            name = "delegate"
        if made + 1 >= self.steps:
            name = "finish"
        arguments = '{"answer": "done"}' if name == "finish" else "{}"
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{next(_ids)}", "type": "function", "function": {"name": name, "arguments": arguments}}]}
        return ChatResult(message=message, finish_reason="tool_calls",
                          usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                          cost_usd=CALL_COST, model="priced-fake", provider="fake", latency_ms=1)

    async def aclose(self) -> None:
        pass


@pytest.fixture(autouse=True)
def scene(settings: Any) -> Any:
    register_runtime(SCENE, WorkRuntime)
    settings.BUDGET_REFRESH_S = 0.0  # every read is fresh: the tests see each write at once
    budgets.invalidate()
    yield
    RUNTIMES.pop(SCENE, None)
    budgets.invalidate()  # no snapshot of this test's rows reaches another test


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> PricedLLM:
    model = PricedLLM()
    monkeypatch.setattr(jobs, "get_llm_client", lambda: model)
    return model


def started(batch: Batch, *, samples: int = 1, prompt: str = "work then finish", user: Any = None) -> Task:
    task = Task.objects.create(batch=batch, scene=SCENE, prompt=prompt, samples_per_iteration=samples,
                               created_by=user)
    task_start_iteration(task=task)
    task.refresh_from_db()
    return task


def spent_row(task: Task, cost: str, *, finished_at: Any = None, outcome: str = "success",
              iteration: int = 99, sample: int = 0) -> Trajectory:
    """A stored episode of `task` that cost `cost` (an older iteration: never claimed)."""
    return Trajectory.objects.create(task=task, iteration=iteration, sample_index=sample, status="finished",
                                     outcome=outcome, cost_usd=Decimal(cost),
                                     finished_at=finished_at or timezone.now())


@pytest.mark.django_db(transaction=True)
def test_a_batch_over_budget_stops_its_running_episode_at_the_next_model_call_and_its_queued_ones_wait(
        llm: PricedLLM, admin_user_role: Any) -> None:
    batch = Batch.objects.create(name="capped")
    budgets.batch_set_budget(batch=batch, budget_usd="0.05", actor=admin_user_role)
    task = started(batch, samples=3)

    report = jobs.run_rollouts(batch_id=batch.pk, concurrency=1)

    assert report["claimed"] == 1 and report["error"] == 1
    first = Trajectory.objects.get(task=task, status="finished")
    # Five calls at $0.01 reach the $0.05 budget; the sixth is not made.
    assert llm.calls == 5 and first.cost_usd == Decimal("0.05")
    assert first.outcome == "error" and first.outcome_reason.startswith("budget: batch 'capped' spent $0.05")
    assert first.attempts == 1  # not queued again as a retryable error
    assert TrajectoryLog.objects.filter(trajectory=first, kind="error", message__startswith="budget:").exists()
    waiting = Trajectory.objects.filter(task=task, status="queued")
    assert waiting.count() == 2 and not waiting.filter(attempts__gt=0).exists()
    assert not jobs.claimable().filter(task=task).exists()
    task.refresh_from_db()
    assert task.status == "running"
    assert jobs.run_rollouts(batch_id=batch.pk)["claimed"] == 0  # a later job still leaves them

    budgets.batch_set_budget(batch=batch, budget_usd="1", actor=admin_user_role)
    event = AuditEvent.objects.filter(action="tasks.batch_budget").latest("id")
    assert event.data == {"before": "0.050000", "budget_usd": "1.000000"} and event.actor == admin_user_role

    report = jobs.run_rollouts(batch_id=batch.pk, concurrency=2)
    assert report["claimed"] == 2 and report["success"] == 2
    first.refresh_from_db()
    assert first.outcome == "error" and first.attempts == 1  # the stopped one is not re-run
    assert batch_spend(batch)["spent_usd"] == "0.250000"


@pytest.mark.django_db(transaction=True)
def test_a_job_does_not_claim_for_a_budget_its_own_episodes_spent_before_its_snapshot_knows(
        llm: PricedLLM, admin_user_role: Any, settings: Any) -> None:
    settings.BUDGET_REFRESH_S = 600.0  # the snapshot taken at the first claim stays all job long
    batch = Batch.objects.create(name="stale snapshot")
    budgets.batch_set_budget(batch=batch, budget_usd="0.05", actor=admin_user_role)
    task = started(batch, samples=3)

    report = jobs.run_rollouts(batch_id=batch.pk, concurrency=1)

    assert report["claimed"] == 1 and llm.calls == 5
    assert Trajectory.objects.filter(task=task, status="queued", attempts=0).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_queued_trajectory_is_not_claimed_once_the_stored_spend_reached_the_budget(llm: PricedLLM,
                                                                                      admin_user_role: Any) -> None:
    batch = Batch.objects.create(name="spent before")
    task = started(batch)
    spent_row(task, "0.50")
    budgets.batch_set_budget(batch=batch, budget_usd=0.5, actor=admin_user_role)
    assert jobs.run_rollouts(batch_id=batch.pk)["claimed"] == 0 and llm.calls == 0
    budgets.batch_set_budget(batch=batch, budget_usd=None, actor=admin_user_role)  # cleared: no budget
    assert jobs.run_rollouts(batch_id=batch.pk)["success"] == 1


@pytest.mark.django_db(transaction=True)
def test_the_daily_cap_counts_what_finished_today_across_batches(llm: PricedLLM, settings: Any) -> None:
    settings.BUDGET_DAILY_USD = 0.03
    earlier = Task.objects.create(batch=Batch.objects.create(name="earlier"), scene=SCENE, prompt="p")
    spent_row(earlier, "0.02")
    spent_row(earlier, "5.00", finished_at=timezone.now() - timedelta(days=1, hours=1), sample=1)  # yesterday
    task = started(Batch.objects.create(name="today"), samples=2)

    report = jobs.run_rollouts(batch_id=task.batch_id, concurrency=1)

    assert report["claimed"] == 1 and llm.calls == 1  # $0.02 stored + $0.01 in flight reach $0.03
    stopped = Trajectory.objects.get(task=task, status="finished")
    assert stopped.outcome_reason.startswith("budget: the daily cap (BUDGET_DAILY_USD) spent $0.03")
    assert Trajectory.objects.filter(task=task, status="queued").count() == 1
    assert not jobs.claimable().exists()  # the cap holds every batch's queue

    settings.BUDGET_DAILY_USD = 0  # 0: no cap
    assert jobs.run_rollouts(batch_id=task.batch_id)["success"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_user_budget_covers_the_tasks_they_created_in_any_batch(llm: PricedLLM, make_user: Any,
                                                                  admin_user_role: Any) -> None:
    alice, bob = make_user("reviewer", "alice"), make_user("reviewer", "bob")
    budgets.user_set_budget(user=alice, budget_usd="0.10", actor=admin_user_role)
    assert AuditEvent.objects.filter(action="tasks.user_budget", target_id=str(alice.pk)).exists()
    spent_row(Task.objects.create(batch=Batch.objects.create(name="alice old"), scene=SCENE, prompt="p",
                                  created_by=alice), "0.08")
    mine = started(Batch.objects.create(name="alice new"), user=alice)
    theirs = started(Batch.objects.create(name="bob's"), user=bob)

    jobs.run_rollouts(concurrency=2)

    stopped = Trajectory.objects.get(task=mine)
    assert stopped.outcome == "error" and stopped.outcome_reason.startswith("budget: user alice spent $0.10")
    assert stopped.cost_usd == Decimal("0.02")
    assert Trajectory.objects.get(task=theirs).outcome == "success"  # bob has no budget

    budgets.user_set_budget(user=alice, budget_usd=None, actor=admin_user_role)
    assert not UserBudget.objects.filter(user=alice).exists()
    assert AuditEvent.objects.filter(action="tasks.user_budget").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_sub_episode_s_calls_count_against_the_budget_and_stop_the_whole_episode(llm: PricedLLM,
                                                                                    admin_user_role: Any) -> None:
    batch = Batch.objects.create(name="delegating")
    budgets.batch_set_budget(batch=batch, budget_usd="0.04", actor=admin_user_role)
    task = started(batch, prompt="delegate, then finish")

    jobs.run_rollouts(batch_id=batch.pk)

    parent = Trajectory.objects.get(task=task)
    # 1 call of the parent (delegate) + 3 of the helper reach $0.04; the helper's 4th is refused
    # and the parent ends with it, with the helper's cost in its own.
    assert llm.calls == 4 and parent.cost_usd == Decimal("0.04")
    assert parent.outcome == "error" and parent.outcome_reason.startswith("budget: batch 'delegating'")
    child = parent.subtrajectories().get()
    assert child.cost_usd == Decimal("0.03") and child.outcome_reason.startswith("budget:")
    # The parent's cost includes the child's: the spend counts it once.
    assert batch_spend(batch)["spent_usd"] == "0.040000"


@pytest.mark.django_db
def test_the_api_shows_spend_budget_and_cost_per_accepted_trajectory(client_as: Any, make_user: Any) -> None:
    from apps.reviews.models import Review

    batch = Batch.objects.create(name="shown", budget_usd=Decimal("1.5"))
    task = Task.objects.create(batch=batch, scene="code_exec", prompt="p")
    success = spent_row(task, "0.30", iteration=1)
    Trajectory.all_objects.create(task=task, iteration=1, parent=success, label="helper#0", status="finished",
                                  outcome="success", cost_usd=Decimal("0.10"))  # inside the parent's 0.30
    failed_but_accepted = spent_row(task, "0.20", outcome="failure", iteration=1, sample=1)
    success_but_rejected = spent_row(task, "0.10", iteration=1, sample=2)
    reviewer = make_user("reviewer")
    for trajectory, verdict in ((failed_but_accepted, "accept"), (success_but_rejected, "reject")):
        Review.objects.create(trajectory=trajectory, kind="human", status="done", verdict=verdict, reviewer=reviewer)

    body = client_as("viewer").get(f"/api/v1/batches/{batch.pk}").json()

    assert body["budget"] == {"budget_usd": "1.500000", "spent_usd": "0.600000", "judge_usd": "0.000000",
                              "remaining_usd": "0.900000",
                              "over_budget": False, "accepted": 2, "cost_per_accepted_usd": "0.300000"}


@pytest.mark.django_db
@pytest.mark.parametrize("value", [-1, "-0.01", "abc", "NaN", "Infinity", True, {"usd": 1}, [], 1e12])
def test_a_bad_budget_is_a_400_naming_the_field_and_changes_nothing(client_as: Any, value: Any) -> None:
    batch = Batch.objects.create(name="guarded")
    response = client_as("admin").post(f"/api/v1/batches/{batch.pk}/budget", {"budget_usd": value}, format="json")
    assert response.status_code == 400, response.content
    assert "budget_usd" in response.json()["error"]["details"]["fields"]
    batch.refresh_from_db()
    assert batch.budget_usd is None
    assert not AuditEvent.objects.filter(action="tasks.batch_budget").exists()


@pytest.mark.django_db
def test_setting_a_budget_over_the_api_takes_an_admin(client_as: Any) -> None:
    batch = Batch.objects.create(name="set over http")
    path = f"/api/v1/batches/{batch.pk}/budget"
    assert client_as("approver").post(path, {"budget_usd": 5}, format="json").status_code == 403
    response = client_as("admin").post(path, {"budget_usd": "12.5"}, format="json")
    assert response.status_code == 200
    assert response.json()["budget"]["budget_usd"] == "12.500000"
    assert client_as("admin").post(path, {"budget_usd": None}, format="json").json()["budget"]["budget_usd"] is None
    assert AuditEvent.objects.filter(action="tasks.batch_budget").count() == 2


@pytest.mark.django_db
def test_the_console_sets_a_batch_budget_through_the_service_and_shows_the_spend(client: Any,
                                                                                 admin_user_role: Any) -> None:
    batch = Batch.objects.create(name="console")
    spent_row(Task.objects.create(batch=batch, scene="code_exec", prompt="p"), "0.25")
    client.force_login(admin_user_role)
    changelist = "/admin/tasks/batch/"

    bad = client.post(changelist, {"action": "set_budget", "_selected_action": [batch.pk], "budget_usd": "-3"},
                      follow=True)
    assert "Budget not set: a budget cannot be negative" in bad.content.decode()
    batch.refresh_from_db()
    assert batch.budget_usd is None

    client.post(changelist, {"action": "set_budget", "_selected_action": [batch.pk], "budget_usd": "0.20"})
    batch.refresh_from_db()
    assert batch.budget_usd == Decimal("0.2")
    assert AuditEvent.objects.filter(action="tasks.batch_budget", actor=admin_user_role).exists()
    page = client.get(f"/admin/tasks/batch/{batch.pk}/change/").content.decode()
    assert "$0.250000 spent (of it $0.000000 by the judge) of $0.200000 (over budget: its queued trajectories wait)" in page


@pytest.mark.django_db
def test_the_console_user_budget_page_writes_through_the_service(client: Any, admin_user_role: Any,
                                                                 make_user: Any) -> None:
    carol = make_user("reviewer", "carol")
    client.force_login(admin_user_role)
    bad = client.post("/admin/tasks/userbudget/add/", {"user": carol.pk, "budget_usd": "-1"})
    assert bad.status_code == 200 and not UserBudget.objects.exists()  # the form's error, no row
    client.post("/admin/tasks/userbudget/add/", {"user": carol.pk, "budget_usd": "7"})
    row = UserBudget.objects.get(user=carol)
    assert row.budget_usd == Decimal("7")
    assert AuditEvent.objects.filter(action="tasks.user_budget", actor=admin_user_role).count() == 1
    client.post(f"/admin/tasks/userbudget/{row.pk}/delete/", {"post": "yes"})
    assert not UserBudget.objects.exists()
    assert AuditEvent.objects.filter(action="tasks.user_budget").count() == 2


@pytest.mark.django_db
def test_without_budgets_nothing_is_held_back(make_task: Any) -> None:
    task = make_task()
    task_start_iteration(task=task)
    assert budgets.snapshot().blocked() is None
    assert jobs.claimable().filter(task=task).count() == 1


@pytest.mark.django_db
def test_metrics_show_today_s_spend_and_the_daily_cap(client: Any, make_task: Any, settings: Any) -> None:
    settings.BUDGET_DAILY_USD = 20
    task = make_task()
    spent_row(task, "1.25")
    spent_row(task, "4.00", finished_at=timezone.now() - timedelta(days=1, hours=1), sample=1)
    text = client.get("/metrics").content.decode()
    assert 'trajplatform_llm_spend_usd{scope="today"} 1.25' in text
    assert "trajplatform_budget_daily_usd 20.0" in text


@pytest.mark.django_db
def test_the_batch_page_shows_spend_and_cost_per_accepted_trajectory(client: Any, viewer: Any) -> None:
    batch = Batch.objects.create(name="paged", budget_usd=Decimal("2"))
    task = Task.objects.create(batch=batch, scene="code_exec", prompt="p")
    spent_row(task, "0.30", iteration=1)
    spent_row(task, "0.10", outcome="failure", iteration=1, sample=1)
    client.force_login(viewer)
    page = client.get(f"/review/batches/{batch.pk}/").content.decode()
    assert "Spend and accepted trajectories not counted yet: the workers count them every 5 minutes." in page
    refresh_batch_tallies()  # the workers' job
    page = client.get(f"/review/batches/{batch.pk}/").content.decode()
    assert "Spent $0.400000 (the judge $0.000000) of a $2.000000 budget" in page
    assert "1 accepted trajectories, $0.400000 per accepted trajectory" in page and ", as of " in page
