"""The loop's transitions, each with its audit row and queued job; decisions (double click, two
deciders at once, the same-person red rule); human verdicts; judge failure and its retry."""
from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django_q.models import OrmQ, Schedule

from apps.reviews import jobs as review_jobs
from apps.reviews import policy
from apps.reviews.models import PolicyRule, Proposal, Review
from apps.reviews.services import (
    AlreadyDecided,
    DecisionError,
    human_verdict_record,
    iteration_conclude,
    proposal_decide,
    proposal_propose,
    task_end_loop,
    task_force_iteration,
)
from apps.tasks.models import Task
from apps.tasks.services import ROLLOUT_JOB, TransitionError
from tests.reviews.factories import auto_review, finished_trajectory, waiting_task
from tests.reviews.test_review_agent import FakeJudge
from trajplatform.audit import AuditEvent, audit_events_for

REVIEW_DIMS = ("tool_usage", "reasoning", "error_handling", "completeness")


def jobs_queued() -> list[str]:
    return [row.task["func"] for row in OrmQ.objects.all()]


def reviewing_task(make_task: Any, *, overall: float, checks: dict | None = None, **fields: Any) -> Task:
    task = make_task(**fields)
    auto_review(finished_trajectory(task), overall=overall, checks=checks or {})
    Task.objects.filter(pk=task.pk).update(status=Task.Status.REVIEWING, current_iteration=1)
    task.refresh_from_db()
    return task


# -- concluding an iteration --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_score_at_the_threshold_completes_the_task(make_task, django_capture_on_commit_callbacks):
    task = reviewing_task(make_task, overall=80.0)
    with django_capture_on_commit_callbacks(execute=True):
        iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert task.status == "completed" and task.finished_at is not None
    event = audit_events_for(task).get(action="reviews.iteration_conclude")
    assert event.data["score"] == 80.0 and event.data["decision"] == "threshold met"
    assert iteration_conclude(task_id=task.pk, iteration=1) is None  # a second job changes nothing


@pytest.mark.django_db
def test_green_proposals_are_applied_and_the_next_iteration_is_queued_at_once(
        make_task, django_capture_on_commit_callbacks):
    task = reviewing_task(make_task, overall=40.0, max_steps=10,
                          checks={"limit_exhausted": {"fired": True, "count": 1, "limit": "max_steps"}})
    with django_capture_on_commit_callbacks(execute=True):
        iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert (task.status, task.current_iteration, task.max_steps) == ("running", 2, 20)
    proposal = Proposal.objects.get(task=task)
    assert (proposal.tier, proposal.status, proposal.chosen_option) == ("green", "applied", 20)
    assert task.trajectories.get(iteration=2).config_snapshot["max_steps"] == 20
    assert list(audit_events_for(proposal).values_list("action", flat=True).order_by("id")) == [
        "reviews.proposal_create", "reviews.proposal_apply"]
    assert audit_events_for(task).filter(action="tasks.iteration_start").get().data["iteration"] == 2
    assert jobs_queued() == [ROLLOUT_JOB]


@pytest.mark.django_db
def test_yellow_or_red_proposals_make_the_task_wait(make_task, django_capture_on_commit_callbacks):
    task = reviewing_task(make_task, overall=40.0, timeout_s=600.0,
                          checks={"limit_exhausted": {"fired": True, "count": 1, "limit": "timeout"}})
    with django_capture_on_commit_callbacks(execute=True):
        iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert task.status == "waiting_approval" and task.current_iteration == 1
    proposal = Proposal.objects.get(task=task)
    assert (proposal.field, proposal.tier, proposal.status, proposal.to_value) == ("timeout_s", "red", "pending", 1200.0)
    assert task.timeout_s == 600.0 and jobs_queued() == []
    assert audit_events_for(task).get(action="reviews.iteration_conclude").data["decision"] == "waiting for approval"


@pytest.mark.django_db
def test_used_up_iterations_fail_the_task_with_a_readable_reason(make_task):
    task = reviewing_task(make_task, overall=62.5, max_iterations=1)
    iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert task.status == "failed"
    assert task.error == "quality 62.5 is below the threshold 80 after 1 of 1 iterations"
    assert not Proposal.objects.filter(task=task).exists()


@pytest.mark.django_db
def test_a_judge_failure_keeps_the_task_reviewing_with_no_score(make_task):
    task = make_task()
    trajectory = finished_trajectory(task)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.REVIEWING, current_iteration=1)
    counts = review_jobs.review_iteration(task.pk, 1, llm=FakeJudge("not json at all"))
    assert counts == {"reviewed": 0, "judge_failed": 1}
    review = Review.objects.get(trajectory=trajectory)
    assert (review.status, review.overall, review.scores, review.attempts) == ("judge_failed", None, {}, 1)
    assert "could not be used" in review.error and review.judge_raw == "not json at all" and review.judge_prompt
    assert audit_events_for(review).get().data["status"] == "judge_failed"
    task.refresh_from_db()
    assert task.status == "reviewing" and "the judge failed on 1 of 1 trajectories" in task.error

    # The scheduled retry asks again; a judge that answers now scores it and the loop goes on.
    good = '{"scores": {%s}}' % ", ".join(f'"{d}": {{"score": 95, "rationale": "ok"}}' for d in REVIEW_DIMS)
    report = review_jobs.retry_failed_judges(llm=FakeJudge(good))
    assert report == {"retried": 1, "scored": 1, "concluded": 1, "resumed": 0}
    review.refresh_from_db()
    assert (review.status, review.attempts, review.overall, review.error) == ("done", 2, 97.5, "")
    task.refresh_from_db()
    assert task.status == "completed"


@pytest.mark.django_db
def test_the_judge_retry_stops_after_max_attempts(make_task, settings):
    settings.REVIEW_JUDGE_MAX_ATTEMPTS = 2
    task = make_task()
    finished_trajectory(task)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.REVIEWING, current_iteration=1)
    review_jobs.review_iteration(task.pk, 1, llm=FakeJudge("nope"))
    assert review_jobs.retry_failed_judges(llm=FakeJudge("nope"))["retried"] == 1
    assert review_jobs.retry_failed_judges(llm=FakeJudge("nope"))["retried"] == 0
    assert Review.objects.get().attempts == 2


@pytest.mark.django_db
def test_migrate_registers_the_judge_retry_schedule():
    schedule = Schedule.objects.get(name=review_jobs.RETRY_SCHEDULE_NAME)
    assert schedule.func == review_jobs.RETRY_FUNC and schedule.repeats == -1


# -- decisions ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_choosing_a_yellow_option_applies_it_and_the_last_decision_starts_the_next_iteration(
        make_task, reviewer, approver, django_capture_on_commit_callbacks):
    w = waiting_task(make_task)
    with django_capture_on_commit_callbacks(execute=True):
        proposal_decide(proposal=w["yellow"], actor=reviewer, decision="choose", option=1, comment="cheaper")
    task = Task.objects.get(pk=w["task"].pk)
    assert task.model == "gpt-4o-mini" and task.status == "waiting_approval" and jobs_queued() == []
    event = audit_events_for(w["yellow"]).get()
    assert event.action == "reviews.proposal_decide" and event.actor == reviewer
    assert event.data["decision"] == "choose" and event.data["chosen"] == "gpt-4o-mini"
    assert event.data["comment"] == "cheaper"

    with django_capture_on_commit_callbacks(execute=True):
        proposal_decide(proposal=w["red"], actor=approver, decision="reject", comment="too costly")
    task.refresh_from_db()
    assert (task.status, task.current_iteration, task.timeout_s) == ("running", 2, 600.0)
    snapshot = task.trajectories.get(iteration=2).config_snapshot
    assert snapshot["model"] == "gpt-4o-mini" and snapshot["timeout_s"] == 600.0
    assert jobs_queued() == [ROLLOUT_JOB]
    assert audit_events_for(task).get(action="tasks.iteration_start").actor == approver


@pytest.mark.django_db
def test_a_double_click_is_a_no_op_and_another_decider_learns_who_decided(make_task, make_user):
    w = waiting_task(make_task)
    alice, bob = make_user("reviewer", username="alice"), make_user("approver", username="bob")
    first = proposal_decide(proposal=w["yellow"], actor=alice, decision="approve")
    again = proposal_decide(proposal=w["yellow"], actor=alice, decision="approve")
    assert first.pk == again.pk and again.chosen_option == "deepseek-flash"
    assert audit_events_for(w["yellow"]).count() == 1
    with pytest.raises(AlreadyDecided, match=r"already decided by alice \(approved at "):
        proposal_decide(proposal=w["yellow"], actor=bob, decision="reject")
    with pytest.raises(AlreadyDecided, match="already decided by alice"):
        proposal_decide(proposal=w["yellow"], actor=alice, decision="reject")


@pytest.mark.django_db
def test_reviewers_cannot_decide_red_and_nobody_approves_their_own_red_proposal(make_task, reviewer, approver,
                                                                                make_user, viewer):
    w = waiting_task(make_task)
    with pytest.raises(PermissionDenied, match="decided by an approver"):
        proposal_decide(proposal=w["red"], actor=reviewer, decision="approve")
    with pytest.raises(PermissionDenied):
        proposal_decide(proposal=w["yellow"], actor=viewer, decision="approve")
    own = proposal_propose(task=w["task"], actor=approver, field="max_tokens", to_value=50_000,
                           rationale="more room")
    assert (own.tier, own.status, own.proposer, own.proposed_by) == ("red", "pending", approver.username, approver)
    with pytest.raises(PermissionDenied, match="person who proposed it"):
        proposal_decide(proposal=own, actor=approver, decision="approve")
    other = make_user("approver")
    proposal_decide(proposal=own, actor=other, decision="approve")
    assert Task.objects.get(pk=w["task"].pk).max_tokens == 50_000
    assert not AuditEvent.objects.filter(action="reviews.proposal_decide", actor=approver).exists()


@pytest.mark.django_db
def test_bad_decisions_write_nothing(make_task, approver):
    w = waiting_task(make_task)
    for kwargs, message in [({"decision": "maybe"}, "decision must be one of"),
                            ({"decision": "choose", "option": 5}, "option 5 does not exist"),
                            ({"decision": "choose", "option": "nonsense"}, "choose one of")]:
        with pytest.raises(DecisionError, match=message):
            proposal_decide(proposal=w["yellow"], actor=approver, **kwargs)
    bad = Proposal.objects.create(task=w["task"], iteration=1, field="scene_config.network", to_value="egress",
                                  tier="red", proposer="review-agent")
    with pytest.raises(DecisionError, match="does not accept"):
        proposal_decide(proposal=bad, actor=approver, decision="approve")
    assert Proposal.objects.filter(status="pending").count() == 3
    assert not AuditEvent.objects.filter(action="reviews.proposal_decide").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("field, to_value, options, message", [
    ("model", "gpt-4o-mini", ["gpt-4o-mini", "unlisted-model-xyz"], "option 1: .*not one of the allowed values"),
    ("model", "unlisted-model-xyz", [], "does not allow changing model to 'unlisted-model-xyz'"),
    ("quality_threshold", 70, [70, 5], "option 1: .*quality_threshold to 5: it is outside the policy's bounds"),
    ("quality_threshold", 5, [], "bounds 50 to 100"),
    ("max_steps", 30, [61], "option 0: changing max_steps to 61 is a yellow change; a green proposal"),
    ("max_tokens", 4000, "4000", "options must be a list"),
])
def test_a_proposal_whose_value_or_options_the_policy_refuses_writes_nothing(make_task, approver, field, to_value,
                                                                             options, message):
    w = waiting_task(make_task)
    before = Task.objects.get(pk=w["task"].pk)
    with pytest.raises(DecisionError, match=message):
        proposal_propose(task=w["task"], actor=approver, field=field, to_value=to_value, options=options)
    assert Proposal.objects.count() == 2 and not AuditEvent.objects.exists()
    after = Task.objects.get(pk=w["task"].pk)
    assert (after.model, after.quality_threshold, after.max_steps) == (before.model, before.quality_threshold,
                                                                      before.max_steps)


@pytest.mark.django_db
@pytest.mark.parametrize("field, to_value, options, decision, message", [
    ("model", "unlisted-model-xyz", ["unlisted-model-xyz"], "approve", "not one of the allowed values"),
    ("model", "deepseek-flash", ["deepseek-flash", "unlisted-model-xyz"], "choose", "not one of the allowed values"),
    ("quality_threshold", 5, [5], "approve", "outside the policy's bounds 50 to 100"),
    ("max_tokens", 200_000, [200_000], "approve", "is a red change; a yellow proposal cannot apply it"),
])
def test_a_decision_applies_only_what_the_policy_allows(make_task, approver, field, to_value, options, decision,
                                                        message):
    """Rows written past proposal_propose (or before a rule was tightened) are checked again."""
    w = waiting_task(make_task)
    task = w["task"]
    before = policy.current_value(task, field)
    stored = Proposal.objects.create(task=task, iteration=1, field=field, from_value=before, to_value=to_value,
                                     options=options, tier="yellow", proposer="review-agent")
    with pytest.raises(DecisionError, match=message):
        proposal_decide(proposal=stored, actor=approver, decision=decision, option=len(options) - 1)
    assert policy.current_value(Task.objects.get(pk=task.pk), field) == before
    assert Proposal.objects.get(pk=stored.pk).status == "pending"
    assert not AuditEvent.objects.filter(action="reviews.proposal_decide").exists()


@pytest.mark.django_db
def test_a_rule_tightened_after_proposing_is_applied_at_decision_time(make_task, reviewer):
    w = waiting_task(make_task)
    PolicyRule.objects.filter(field="model").update(allowed_values=["gpt-4o-mini"])
    with pytest.raises(DecisionError, match="deepseek-flash.*not one of the allowed values"):
        proposal_decide(proposal=w["yellow"], actor=reviewer, decision="approve")
    PolicyRule.objects.filter(field="model").update(tier="red")
    with pytest.raises(DecisionError, match="is a red change; a yellow proposal cannot apply it"):
        proposal_decide(proposal=w["yellow"], actor=reviewer, decision="choose", option=1)
    PolicyRule.objects.filter(field="model").update(tier="yellow")
    proposal_decide(proposal=w["yellow"], actor=reviewer, decision="choose", option=1)
    assert Task.objects.get(pk=w["task"].pk).model == "gpt-4o-mini"


@pytest.mark.django_db
def test_the_proposer_may_withdraw_a_red_change_but_never_approve_it(make_task, reviewer, approver,
                                                                    django_capture_on_commit_callbacks):
    w = waiting_task(make_task)
    mine = proposal_propose(task=w["task"], actor=approver, field="max_tokens", to_value=50_000)
    with pytest.raises(PermissionDenied, match="person who proposed it"):
        proposal_decide(proposal=mine, actor=approver, decision="approve")
    withdrawn = proposal_decide(proposal=mine, actor=approver, decision="reject", comment="not needed after all")
    assert (withdrawn.status, withdrawn.decided_by, withdrawn.chosen_option) == ("rejected", approver, None)
    event = audit_events_for(mine).latest("id")
    assert (event.action, event.actor, event.data["decision"]) == ("reviews.proposal_withdraw", approver, "withdraw")
    assert event.data["comment"] == "not needed after all"
    assert proposal_decide(proposal=mine, actor=approver, decision="reject").pk == mine.pk  # repeat: no-op
    assert audit_events_for(mine).count() == 2

    # A reviewer may propose a red change they could never sign off, and take it back.
    theirs = proposal_propose(task=w["task"], actor=reviewer, field="timeout_s", to_value=900.0)
    assert theirs.tier == "red"
    with pytest.raises(PermissionDenied, match="decided by an approver"):
        proposal_decide(proposal=theirs, actor=reviewer, decision="approve")
    proposal_decide(proposal=theirs, actor=reviewer, decision="reject")
    assert Proposal.objects.get(pk=theirs.pk).status == "rejected"
    assert audit_events_for(theirs).latest("id").action == "reviews.proposal_withdraw"
    assert Task.objects.get(pk=w["task"].pk).max_tokens != 50_000


@pytest.mark.django_db
def test_the_api_answers_400_for_an_option_the_policy_refuses(make_task, approver):
    from rest_framework.test import APIClient

    w = waiting_task(make_task)
    stored = Proposal.objects.create(task=w["task"], iteration=1, field="quality_threshold", from_value=80,
                                     to_value=70, options=[70, 5], tier="yellow", proposer="review-agent")
    client = APIClient()
    client.force_authenticate(approver)
    response = client.post(f"/api/v1/proposals/{stored.pk}/decide", {"decision": "choose", "option": 1},
                           format="json")
    assert response.status_code == 400, response.content
    assert "outside the policy's bounds" in response.json()["error"]["message"]
    assert Task.objects.get(pk=w["task"].pk).quality_threshold == 80


@pytest.mark.django_db(transaction=True)
def test_two_people_deciding_at_once_one_wins_the_other_hears_who(make_task, make_user):
    w = waiting_task(make_task)
    deciders = [make_user("approver", username="ann"), make_user("approver", username="ben")]
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def decide(user: Any, decision: str) -> None:
        try:
            barrier.wait(5)
            proposal_decide(proposal=w["yellow"], actor=user, decision=decision)
            results[user.username] = "ok"
        except AlreadyDecided as exc:
            results[user.username] = str(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(u, d)) for u, d in zip(deciders, ("approve", "reject"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winner = next(name for name, r in results.items() if r == "ok")
    loser = next(name for name in results if name != winner)
    assert results[loser].startswith(f"already decided by {winner}")
    proposal = Proposal.objects.get(pk=w["yellow"].pk)
    assert proposal.decided_by.username == winner
    assert AuditEvent.objects.filter(action="reviews.proposal_decide").count() == 1


# -- people ending or extending the loop ------------------------------------------------------------------


@pytest.mark.django_db
def test_ending_the_loop_completes_the_task_and_supersedes_pending_proposals(make_task, reviewer):
    w = waiting_task(make_task)
    task = task_end_loop(task=w["task"], actor=reviewer, reason="good enough")
    assert task.status == "completed"
    assert set(Proposal.objects.values_list("status", flat=True)) == {"superseded"}
    event = audit_events_for(task).get(action="reviews.loop_end")
    assert event.actor == reviewer and event.data["superseded_proposals"] == 2 and event.data["comment"] == "good enough"
    assert task_end_loop(task=task, actor=reviewer).status == "completed"  # repeat click
    with pytest.raises(AlreadyDecided, match="is already superseded"):
        proposal_decide(proposal=w["yellow"], actor=reviewer, decision="approve")


@pytest.mark.django_db
def test_forcing_an_iteration_past_max_iterations_raises_it_by_one(make_task, reviewer,
                                                                   django_capture_on_commit_callbacks):
    task = reviewing_task(make_task, overall=40.0, max_iterations=1)
    iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert task.status == "failed"
    with django_capture_on_commit_callbacks(execute=True):
        task_force_iteration(task=task, actor=reviewer, reason="one more try")
    task.refresh_from_db()
    assert (task.status, task.current_iteration, task.max_iterations) == ("running", 2, 2)
    event = audit_events_for(task).get(action="reviews.force_iteration")
    assert event.data["max_iterations_raised"] is True and event.data["from"] == "failed"
    assert jobs_queued() == [ROLLOUT_JOB]
    with pytest.raises(TransitionError):
        task_force_iteration(task=task, actor=reviewer)  # running: nothing to force


@pytest.mark.django_db
def test_viewers_cannot_end_or_force(make_task, viewer):
    w = waiting_task(make_task)
    for service in (task_end_loop, task_force_iteration):
        with pytest.raises(PermissionDenied):
            service(task=w["task"], actor=viewer)


# -- human verdicts ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_human_verdict_is_a_human_review_with_flags_and_an_audit_row(make_task, reviewer):
    trajectory = finished_trajectory(make_task())
    review = human_verdict_record(trajectory=trajectory, actor=reviewer, verdict="needs_fix",
                                  reason="the answer is right but step 1 is noise",
                                  step_flags=[{"step": 0, "note": "noise"}])
    assert (review.kind, review.status, review.verdict, review.reviewer) == ("human", "done", "needs_fix", reviewer)
    assert review.step_flags == [{"step": 0, "note": "noise"}]
    assert audit_events_for(review).get().data["verdict"] == "needs_fix"
    again = human_verdict_record(trajectory=trajectory, actor=reviewer, verdict="needs_fix",
                                 reason="the answer is right but step 1 is noise",
                                 step_flags=[{"step": 0, "note": "noise"}])
    assert again.pk == review.pk and Review.objects.filter(kind="human").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("kwargs, message", [
    ({"verdict": "revise", "reason": "x"}, "verdict must be one of"),
    ({"verdict": "reject", "reason": "  "}, "give a reason"),
    ({"verdict": "needs_fix", "reason": ""}, "give a reason"),
    ({"verdict": "reject", "reason": "x", "step_flags": [{"step": 9}]}, "step 9 does not exist"),
    ({"verdict": "reject", "reason": "x", "step_flags": [{"note": "no step"}]}, "integer `step`"),
])
def test_bad_verdicts_are_refused_and_write_nothing(make_task, reviewer, kwargs, message):
    trajectory = finished_trajectory(make_task())
    with pytest.raises(ValidationError, match=message):
        human_verdict_record(trajectory=trajectory, actor=reviewer, **kwargs)
    assert not Review.objects.exists()


@pytest.mark.django_db
def test_viewers_cannot_give_verdicts(make_task, viewer):
    with pytest.raises(PermissionDenied):
        human_verdict_record(trajectory=finished_trajectory(make_task()), actor=viewer, verdict="accept", reason="x")


def rejected_before(task: Task, approver: Any, field: str, to_value: Any, options: list | None = None) -> Proposal:
    from django.utils import timezone

    return Proposal.objects.create(task=task, iteration=1, field=field, from_value=None, to_value=to_value,
                                   options=options or [], tier="yellow" if options else "red", proposer="rule:x",
                                   status="rejected", decided_by=approver, decided_at=timezone.now())


@pytest.mark.django_db
def test_a_rejected_change_is_not_proposed_again_and_another_remedy_goes_ahead(
        make_task, make_user, django_capture_on_commit_callbacks):
    approver = make_user("approver", username="ada")
    task = reviewing_task(make_task, overall=40.0, checks={
        "limit_exhausted": {"fired": True, "count": 1, "limit": "timeout"},
        "repeated_actions": {"fired": True, "count": 1}})
    old = rejected_before(task, approver, "timeout_s", 1200.0)
    with django_capture_on_commit_callbacks(execute=True):
        iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert list(Proposal.objects.exclude(pk=old.pk).values_list("field", "status")) == [
        ("system_prompt_extra", "applied")]
    assert task.status == "running" and task.current_iteration == 2 and task.timeout_s == 600.0
    event = audit_events_for(task).get(action="reviews.iteration_conclude")
    assert event.data["decision"] == "next iteration"
    assert event.data["not_proposed_again"] == [
        {"field": "timeout_s", "to": 1200.0, "proposal": old.pk, "rejected_by": "ada"}]


@pytest.mark.django_db
def test_when_every_change_found_was_rejected_the_task_fails_saying_why(make_task, approver):
    task = reviewing_task(make_task, overall=40.0,
                          checks={"limit_exhausted": {"fired": True, "count": 1, "limit": "timeout"}})
    old = rejected_before(task, approver, "timeout_s", 1200)  # an int equals the float the rule drafts
    iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert task.status == "failed" and Proposal.objects.count() == 1
    assert task.error == (f"iteration 1: quality 40 is below the threshold 80, and the only changes the review "
                          f"found were rejected before: timeout_s = 1200 was rejected (proposal #{old.pk} by "
                          f"{approver.username})")
    assert audit_events_for(task).get(action="reviews.iteration_conclude").data["decision"] == "only rejected changes"


@pytest.mark.django_db
def test_a_yellow_change_whose_value_was_rejected_falls_back_to_an_option_nobody_rejected(make_task, approver):
    task = reviewing_task(make_task, overall=40.0)
    Review.objects.filter(trajectory__task=task).update(suggestions=[
        {"field": "model", "to": "deepseek-flash", "options": ["deepseek-flash", "gpt-4o-mini", "gemini-3.7-flash"],
         "rationale": "a stronger model"}])
    old = rejected_before(task, approver, "model", "deepseek-flash", ["deepseek-flash", "gpt-4o-mini"])
    iteration_conclude(task_id=task.pk, iteration=1)
    proposal = Proposal.objects.get(task=task, status="pending")
    assert (proposal.field, proposal.to_value) == ("model", "gemini-3.7-flash")
    assert "deepseek-flash" not in proposal.options and "gpt-4o-mini" not in proposal.options
    assert f"was rejected (proposal #{old.pk}" in proposal.rationale


@pytest.mark.django_db
def test_an_iteration_of_only_errors_with_nothing_to_change_fails_the_task(make_task):
    task = make_task()
    auto_review(finished_trajectory(task, outcome="error", reward=None,
                                    outcome_reason="scene gui has no engine yet"), overall=5.0)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.REVIEWING, current_iteration=1)
    iteration_conclude(task_id=task.pk, iteration=1)
    task.refresh_from_db()
    assert task.status == "failed" and task.current_iteration == 1
    assert "every trajectory ended in an error" in task.error and "no engine yet" in task.error


@pytest.mark.django_db
def test_people_propose_only_while_the_task_is_not_running(make_task, reviewer):
    task = reviewing_task(make_task, overall=40.0)
    with pytest.raises(TransitionError, match="waits for approval"):
        proposal_propose(task=task, actor=reviewer, field="prompt", to_value="A clearer task.")
    running = make_task(status="running")
    with pytest.raises(TransitionError, match="is running"):
        proposal_propose(task=running, actor=reviewer, field="temperature", to_value=0.2)
    w = waiting_task(make_task)
    green = proposal_propose(task=w["task"], actor=reviewer, field="temperature", to_value=0.2)
    assert (green.tier, green.status) == ("green", "applied") and Task.objects.get(pk=w["task"].pk).temperature == 0.2
    with pytest.raises(DecisionError, match="does not allow"):
        proposal_propose(task=w["task"], actor=reviewer, field="model", to_value="unlisted-model")


@pytest.mark.django_db
def test_webhooks_go_out_for_created_and_decided_proposals_and_finished_tasks(make_task, approver, settings):
    import json as _json

    from trajplatform.webhooks import WebhookDelivery

    settings.WEBHOOK_URL, settings.WEBHOOK_SECRET = "http://127.0.0.1:9/hook", "s3cret"
    settings.WEBHOOK_EVENTS = ["proposal.created", "proposal.decided", "task.finished"]
    task = reviewing_task(make_task, overall=40.0,
                          checks={"limit_exhausted": {"fired": True, "count": 1, "limit": "timeout"}})
    iteration_conclude(task_id=task.pk, iteration=1)
    proposal = Proposal.objects.get(task=task)
    proposal_decide(proposal=proposal, actor=approver, decision="reject", comment="no")
    assert Task.objects.get(pk=task.pk).status == "running"  # no webhook for a task moving on
    good = reviewing_task(make_task, overall=90.0)
    iteration_conclude(task_id=good.pk, iteration=1)
    events = [(d.event, _json.loads(d.body)["data"]) for d in WebhookDelivery.objects.order_by("id")]
    assert [e for e, _ in events] == ["proposal.created", "proposal.decided", "task.finished"]
    assert events[0][1]["tier"] == "red" and events[1][1]["decided_by"] == approver.username
    assert events[1][1]["decision"] == "reject" and events[1][1]["comment"] == "no"
    assert events[2][1] == {"task": good.pk, "status": "completed", "iteration": 1, "reason": "", "score": 90.0,
                            "threshold": 80}


@pytest.mark.django_db
def test_a_reviewing_task_whose_review_job_was_lost_is_picked_up_by_the_schedule(make_task):
    from datetime import timedelta

    from django.utils import timezone

    task = make_task()
    finished_trajectory(task)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.REVIEWING, current_iteration=1)
    good = '{"scores": {%s}}' % ", ".join(f'"{d}": {{"score": 90, "rationale": "ok"}}' for d in REVIEW_DIMS)
    assert review_jobs.retry_failed_judges(llm=FakeJudge(good))["resumed"] == 0  # just moved: a job may be on it
    Task.objects.filter(pk=task.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert review_jobs.retry_failed_judges(llm=FakeJudge(good))["resumed"] == 1
    assert Task.objects.get(pk=task.pk).status == "completed"


@pytest.mark.django_db
def test_a_failed_tasks_red_change_is_approved_then_applies_to_its_retry(make_task, reviewer, approver):
    from apps.tasks.services import task_requeue
    task = make_task(status="failed", max_tokens=1200)
    red = proposal_propose(task=task, actor=reviewer, field="max_tokens", to_value=2400)
    assert (red.tier, red.status) == ("red", "pending")
    proposal_decide(proposal=red, actor=approver, decision="approve")
    task.refresh_from_db()
    assert (task.status, task.max_tokens) == ("failed", 2400)  # applied; nothing started by the decision
    task_requeue(task=task, actor=reviewer)
    task.refresh_from_db()
    assert task.status == "running" and task.max_tokens == 2400
