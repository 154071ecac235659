"""The whole loop with the real agent, the local sandbox and the offline model as agent and judge:
rollout -> review -> green change applied -> iteration 2 -> iterations used up."""
from __future__ import annotations

import pytest
from django_q.models import OrmQ

from apps.reviews.jobs import REVIEW_JOB, review_iteration
from apps.reviews.models import Proposal, Review
from apps.tasks import jobs
from apps.tasks.models import Task, Trajectory
from apps.tasks.services import task_start_iteration
from trajplatform.audit import audit_events_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings")]


def test_a_step_limit_hit_raises_max_steps_green_and_runs_iteration_two(offline_model, bundled_code_task):
    task = bundled_code_task(model="scripted-reference+fault=never_finish", max_steps=3, max_iterations=2)
    task_start_iteration(task=task)
    jobs.run_rollouts()
    task.refresh_from_db()
    assert task.status == Task.Status.REVIEWING
    assert [row.task["func"] for row in OrmQ.objects.all() if row.task["func"] == REVIEW_JOB] == [REVIEW_JOB]
    first = task.trajectories.get(iteration=1)
    assert first.outcome == "failure" and "max_steps (3)" in first.outcome_reason

    review_iteration(task.pk, 1)
    review = Review.objects.get(trajectory=first, kind="auto")
    assert review.status == "done" and review.judge_model == "scripted-reference"
    assert review.checks["limit_exhausted"]["fired"] and review.overall < 80
    assert "offline stand-in" in review.scores["completeness"]["rationale"]
    proposal = Proposal.objects.get(task=task, field="max_steps")
    assert (proposal.tier, proposal.status, proposal.from_value, proposal.to_value) == ("green", "applied", 3, 6)
    task.refresh_from_db()
    assert task.status == Task.Status.RUNNING and task.current_iteration == 2 and task.max_steps == 6
    second = task.trajectories.get(iteration=2)
    assert second.config_snapshot["max_steps"] == 6 and first.config_snapshot["max_steps"] == 3
    actions = list(audit_events_for(task).order_by("id").values_list("action", flat=True))
    assert actions[-3:] == ["tasks.iteration_finish", "reviews.iteration_conclude", "tasks.iteration_start"]

    jobs.run_rollouts()
    review_iteration(task.pk, 2)
    task.refresh_from_db()
    assert task.status == Task.Status.FAILED
    assert task.error.startswith("quality ") and "below the threshold 80 after 2 of 2 iterations" in task.error


def test_an_agent_stuck_repeating_a_call_gets_the_loop_hint_then_a_model_choice_never_more_steps(
        offline_model, bundled_code_task):
    """The issue's loop: never_finish repeats the call before finish until the limit. It used to
    double max_steps each iteration (6 -> 12 -> 24); now iteration 2 gets the loop hint (green)
    at the same limit, and when the agent still loops, a reviewer is offered another model."""
    from apps.reviews.review_agent import LOOP_HINT

    task = bundled_code_task(model="scripted-reference+fault=never_finish", max_steps=6, max_iterations=3)
    task_start_iteration(task=task)
    jobs.run_rollouts()
    review_iteration(task.pk, 1)
    first = Review.objects.get(trajectory__task=task, trajectory__iteration=1, kind="auto")
    assert first.checks["repeated_actions"]["fired"] and first.checks["limit_exhausted"]["stuck_on"]
    task.refresh_from_db()
    assert (task.status, task.current_iteration, task.max_steps) == (Task.Status.RUNNING, 2, 6)
    assert LOOP_HINT in task.system_prompt_extra
    assert not Proposal.objects.filter(task=task, field="max_steps").exists()

    jobs.run_rollouts()
    review_iteration(task.pk, 2)
    task.refresh_from_db()
    assert (task.status, task.max_steps) == (Task.Status.WAITING_APPROVAL, 6)
    model = Proposal.objects.get(task=task, field="model")
    assert (model.tier, model.status, model.proposer) == ("yellow", "pending", "rule:stuck")
    assert "loop hint already in the prompt" in model.rationale


def test_a_good_trajectory_completes_the_task_in_one_iteration(offline_model, bundled_code_task):
    task = bundled_code_task()
    task_start_iteration(task=task)
    jobs.run_rollouts()
    review_iteration(task.pk, 1)
    task.refresh_from_db()
    review = Review.objects.get(trajectory__task=task)
    assert (review.status, review.overall) == ("done", 100.0)
    assert task.status == Task.Status.COMPLETED and not Proposal.objects.filter(task=task).exists()
    assert Trajectory.objects.filter(task=task).count() == 1


def test_a_rejected_change_is_not_proposed_again_and_the_loop_ends_saying_why(offline_model, bundled_code_task,
                                                                               make_user):
    """Iteration 1 runs out of tokens: red max_tokens 1200 -> 2400, which an approver rejects.
    Iteration 2 runs the same config and runs out again: the same change is not proposed again,
    and with nothing else to try the task fails naming the rejected proposal."""
    from apps.reviews.services import proposal_decide

    approver = make_user("approver", username="ada")
    task = bundled_code_task(model="scripted-reference+fault=never_finish", max_steps=40, max_tokens=1200,
                             max_iterations=3)
    task_start_iteration(task=task)
    jobs.run_rollouts()
    first = task.trajectories.get(iteration=1)
    assert "token budget (1200) exhausted" in first.outcome_reason
    review_iteration(task.pk, 1)
    task.refresh_from_db()
    assert task.status == Task.Status.WAITING_APPROVAL
    red = Proposal.objects.get(task=task, status="pending")
    assert (red.field, red.tier, red.from_value, red.to_value) == ("max_tokens", "red", 1200, 2400)
    proposal_decide(proposal=red, actor=approver, decision="reject", comment="too costly")
    task.refresh_from_db()
    assert task.status == Task.Status.RUNNING and task.current_iteration == 2 and task.max_tokens == 1200

    jobs.run_rollouts()
    assert "token budget (1200) exhausted" in task.trajectories.get(iteration=2).outcome_reason
    review_iteration(task.pk, 2)
    task.refresh_from_db()
    assert not Proposal.objects.filter(task=task, iteration=2, field="max_tokens").exists()
    assert list(Proposal.objects.filter(task=task, status="pending")) == []
    assert task.status == Task.Status.FAILED and task.current_iteration == 2
    assert f"max_tokens = 2400 was rejected (proposal #{red.pk} by ada)" in task.error
    event = audit_events_for(task).filter(action="reviews.iteration_conclude").latest("id")
    assert event.data["not_proposed_again"] == [
        {"field": "max_tokens", "to": 2400, "proposal": red.pk, "rejected_by": "ada"}]
