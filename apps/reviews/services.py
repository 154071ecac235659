"""Writes of the review loop. Each is one transaction with its audit row; jobs go out on commit.

Lock order (the same as apps.tasks.services): the task row first, then its proposals/reviews.

    review_open / review_store          the review agent's automatic Review of one trajectory
    iteration_conclude                  weigh an iteration's reviews: complete, fail, or propose
    proposal_decide                     the one decide service (approve / reject / choose)
    proposal_propose                    a person proposes a change (tiered by the same policy)
    human_verdict_record                a reviewer's accept / reject / needs-fix on a trajectory
    task_end_loop / task_force_iteration

The loop, as decided here (docs/reviews.md):
* score of an iteration = mean overall of its finished trajectories' automatic reviews; it
  waits until every one is scored (a judge failure keeps the task `reviewing`, retried later);
* score >= quality_threshold -> completed;
* below, and iterations used up (current_iteration >= max_iterations) -> failed, with a
  reason naming the score, the threshold and the iterations;
* below, iterations left -> proposals tiered by the policy: green ones are applied at once;
  if no yellow/red one waits, the next iteration is queued right away, else the task waits
  (`waiting_approval`) until every pending proposal is decided, then the next iteration runs;
* a change people rejected for the task is never proposed for it again: another value or
  another remedy is, and when the rejected ones were all the review found, the task fails
  naming them (the audit row lists them under `not_proposed_again`);
* a person may end the loop early (the task completes; pending proposals are superseded) or
  force one more iteration (raising max_iterations by one when it was used up).
"""
from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from statistics import mean
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from apps.engines.toolargs import REFUSED_KINDS, ToolArguments
from apps.reviews import policy
from apps.reviews.models import Correction, Preference, Proposal, Review, ReviewAssignment, ReviewClaim
from apps.reviews.review_agent import Rejected, draft_proposals, overall_score
from apps.tasks.models import Task, Trajectory
from apps.tasks.services import TransitionError, task_start_iteration
from trajplatform import json_limits
from trajplatform.audit import audit_record
from trajplatform.redaction import storable
from trajplatform.webhooks import webhook_emit

REVIEW_AGENT = "review-agent"
DECISIONS = ("approve", "reject", "choose")
TERMINAL_LOOP = frozenset({Task.Status.COMPLETED, Task.Status.FAILED})


class DecisionError(Exception):
    """A decision that cannot be made as asked; the message says why (nothing was written)."""


class AlreadyDecided(DecisionError):
    """Someone else decided the proposal first."""


def webhook(event: str, data: dict[str, Any]) -> None:
    """Queue a webhook delivery inside the current transaction (delivered after commit)."""
    webhook_emit(event, data)


def _proposal_data(proposal: Proposal) -> dict[str, Any]:
    return {
        "proposal": proposal.pk, "task": proposal.task_id, "iteration": proposal.iteration, "field": proposal.field,
        "tier": proposal.tier, "status": proposal.status, "from": proposal.from_value, "to": proposal.to_value,
        "options": proposal.options, "chosen": proposal.chosen_option, "proposer": proposal.proposer,
        "decided_by": proposal.decided_by.get_username() if proposal.decided_by_id else None,
        "comment": proposal.comment,
    }


# -- automatic reviews ----------------------------------------------------------------------------


def review_open(*, trajectory: Trajectory) -> Review:
    """The trajectory's automatic review, created pending if it has none (safe under two jobs)."""
    existing = Review.objects.filter(trajectory=trajectory, kind=Review.Kind.AUTO).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return Review.objects.create(trajectory=trajectory, kind=Review.Kind.AUTO, status=Review.Status.PENDING)
    except IntegrityError:  # another job created it a moment ago
        return Review.objects.get(trajectory=trajectory, kind=Review.Kind.AUTO)


def review_store(*, review: Review, checks: dict[str, Any], result: Any = None, failure: Any = None) -> Review | None:
    """Store one judge attempt on a pending or judge_failed review, by compare-and-swap on its
    attempt count (a second job that judged the same trajectory stores nothing); None if lost.

    `result` is a review_agent.JudgeResult (status done, overall by the documented formula),
    `failure` a review_agent.JudgeFailed (status judge_failed, no score)."""
    now = timezone.now()
    if result is not None:
        fields: dict[str, Any] = {
            "status": Review.Status.DONE, "scores": result.scores, "suggestions": result.suggestions,
            "overall": overall_score(result.scores, checks, review.trajectory.reward), "rationale": result.summary,
            "judge_model": result.model[:200], "rubric_version": result.rubric_version, "judge_prompt": result.prompt,
            "judge_raw": result.raw, "error": "",
        }
    else:
        fields = {
            "status": Review.Status.JUDGE_FAILED, "scores": {}, "suggestions": [], "overall": None,
            "error": str(failure), "judge_model": (failure.model or "")[:200], "judge_prompt": failure.prompt,
            "judge_raw": failure.raw,
        }
    # The judge prompt quotes the task and the episode, the raw answer may echo them: stored as
    # trajectories are (configured secrets redacted, NUL and lone surrogates replaced).
    fields = {name: storable(value, labels=name == "error") for name, value in fields.items()}
    checks = storable(checks, labels=False)
    cost = Decimal(str(getattr(result if result is not None else failure, "cost_usd", 0) or 0))
    with transaction.atomic():
        won = Review.objects.filter(
            pk=review.pk, attempts=review.attempts, status__in=[Review.Status.PENDING, Review.Status.JUDGE_FAILED],
        ).update(checks=checks, attempts=review.attempts + 1, finished_at=now, cost_usd=F("cost_usd") + cost,
                 **fields)
        if not won:
            return None
        review = Review.objects.select_related("trajectory").get(pk=review.pk)
        audit_record("reviews.review_store", target=review, data={
            "trajectory": review.trajectory_id, "status": review.status, "overall": review.overall,
            "attempt": review.attempts, "judge_model": review.judge_model, "error": review.error,
            "cost_usd": str(cost),
            "checks_fired": sorted(k for k, v in checks.items() if v.get("fired")),
        })
    return review


def _finish(task: Task, status: str, reason: str, data: dict[str, Any], actor: Any = None,
            action: str = "reviews.iteration_conclude") -> None:
    task.status = status
    task.error = reason if status == Task.Status.FAILED else ""
    task.finished_at = timezone.now()
    task.save(update_fields=["status", "error", "finished_at", "updated_at"])
    audit_record(action, actor=actor, target=task, data={**data, "status": status, "reason": reason})
    webhook("task.finished", {"task": task.pk, "status": status, "iteration": task.current_iteration,
                              "reason": reason, **{k: v for k, v in data.items() if k in ("score", "threshold")}})


def _start_next(task: Task, actor: Any = None) -> None:
    """Inside the caller's transaction, with the task locked: run its next iteration."""
    if task.status != Task.Status.REVIEWING:
        task.status = Task.Status.REVIEWING
        task.save(update_fields=["status", "updated_at"])
    task_start_iteration(task=task, actor=actor)


def iteration_conclude(*, task_id: int, iteration: int) -> Task | None:
    """Weigh the reviews of a reviewing task's iteration and move it on (see the module docstring).

    A no-op (returns None) unless the task is reviewing this iteration and every finished
    trajectory of it has a scored review."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None or task.status != Task.Status.REVIEWING or task.current_iteration != iteration:
            return None
        trajectory_ids = list(Trajectory.objects.filter(
            task=task, iteration=iteration, status=Trajectory.Status.FINISHED).values_list("pk", flat=True))
        reviews = list(Review.objects.filter(trajectory_id__in=trajectory_ids, kind=Review.Kind.AUTO)
                       .select_related("trajectory"))
        by_status = {s: [r for r in reviews if r.status == s] for s in Review.Status.values}
        if len(reviews) < len(trajectory_ids) or by_status[Review.Status.PENDING]:
            return None
        failed = by_status[Review.Status.JUDGE_FAILED]
        if failed:
            note = (f"iteration {iteration}: the judge failed on {len(failed)} of {len(reviews)} trajectories "
                    f"({failed[0].error[:300]}); retried every few minutes")
            if task.error != note:
                task.error = note
                task.save(update_fields=["error", "updated_at"])
            return None
        threshold = task.quality_threshold
        data: dict[str, Any] = {"iteration": iteration, "threshold": threshold, "trajectories": len(reviews)}
        if not reviews:
            _finish(task, Task.Status.FAILED, f"iteration {iteration}: no trajectory finished, nothing to review", data)
            return task
        score = round(mean(r.overall for r in reviews), 1)
        data["score"] = score
        if score >= threshold:
            _finish(task, Task.Status.COMPLETED, "", {**data, "decision": "threshold met"})
            return task
        if task.current_iteration >= task.max_iterations:
            reason = (f"quality {score:g} is below the threshold {threshold} after {task.current_iteration} of "
                      f"{task.max_iterations} iterations")
            _finish(task, Task.Status.FAILED, reason, {**data, "decision": "iterations used up"})
            return task

        rejected = tuple(
            Rejected(field=p.field, value=value, proposal=p.pk, by=p.decided_by.get_username() if p.decided_by else "?")
            for p in Proposal.objects.filter(task=task, status=Proposal.Status.REJECTED)
            .select_related("decided_by").order_by("id")
            for value in [p.to_value, *(p.options or [])]
        )
        drafts = draft_proposals(task, reviews, rejected=rejected)
        not_again = [d.rejected for d in drafts if d.rejected is not None]
        drafts = [d for d in drafts if d.rejected is None]
        if not_again:
            data["not_proposed_again"] = [{"field": r.field, "to": r.value, "proposal": r.proposal,
                                           "rejected_by": r.by} for r in not_again]
        if not drafts and not_again:
            # The same config would only run into the same wall, and its remedy was refused.
            reason = (f"iteration {iteration}: quality {score:g} is below the threshold {threshold}, and the only "
                      f"changes the review found were rejected before: {'; '.join(r.note() for r in not_again)}")
            _finish(task, Task.Status.FAILED, reason, {**data, "decision": "only rejected changes"})
            return task
        errors = [r.trajectory for r in reviews if r.trajectory.outcome == Trajectory.Outcome.ERROR]
        if not drafts and len(errors) == len(reviews):
            # Nothing to change and nothing but errors: the same config would only fail again.
            reason = (f"iteration {iteration}: every trajectory ended in an error and the review found nothing to "
                      f"change (first: {errors[0].outcome_reason[:300]})")
            _finish(task, Task.Status.FAILED, reason, {**data, "decision": "only errors, nothing to change"})
            return task
        weakest = min(reviews, key=lambda r: r.overall)  # the proposals point at the weakest review
        now = timezone.now()
        changed: list[str] = []
        created = []
        for draft in drafts:
            proposal = Proposal.objects.create(
                task=task, review=weakest, iteration=iteration, field=draft.field,
                from_value=draft.from_value, to_value=draft.to_value, options=draft.options, tier=draft.tier,
                rationale=draft.rationale, impact_note=draft.impact_note, proposer=draft.proposer,
            )
            audit_record("reviews.proposal_create", target=proposal, data=_proposal_data(proposal))
            if draft.tier == policy.GREEN:
                changed.append(policy.apply_change(task, draft.field, draft.to_value, tier=policy.GREEN))
                proposal.status = Proposal.Status.APPLIED
                proposal.decided_at = now
                proposal.chosen_option = draft.to_value
                proposal.save(update_fields=["status", "decided_at", "chosen_option"])
                audit_record("reviews.proposal_apply", target=proposal, data=_proposal_data(proposal))
            else:
                webhook("proposal.created", _proposal_data(proposal))
            created.append(proposal)
        if changed:
            task.save(update_fields=sorted(set(changed)) + ["updated_at"])
        waiting = [p for p in created if p.status == Proposal.Status.PENDING]
        audit_record("reviews.iteration_conclude", target=task, data={
            **data, "decision": "waiting for approval" if waiting else "next iteration",
            "proposals": {p.pk: f"{p.tier} {p.field} {p.status}" for p in created},
        })
        if waiting:
            task.status = Task.Status.WAITING_APPROVAL
            task.error = ""
            task.save(update_fields=["status", "error", "updated_at"])
        else:
            _start_next(task)
    return task


# -- decisions ------------------------------------------------------------------------------------


def can_decide(actor: Any, proposal: Proposal) -> bool:
    """Reviewers decide yellow; approvers decide red (and may decide yellow)."""
    if not getattr(actor, "is_authenticated", False):
        return False
    if proposal.tier == Proposal.Tier.YELLOW:
        return actor.has_perm("reviews.decide_yellow_proposal") or actor.has_perm("reviews.decide_red_proposal")
    if proposal.tier == Proposal.Tier.RED:
        return actor.has_perm("reviews.decide_red_proposal")
    return False


def _chosen(proposal: Proposal, decision: str, option: Any) -> Any:
    if decision == "approve":
        return proposal.to_value
    options = proposal.options or []
    if not options:
        raise DecisionError(f"proposal {proposal.pk} has no options to choose from; approve or reject it")
    if isinstance(option, str) and option.strip().isdigit():
        option = int(option)
    if isinstance(option, int) and not isinstance(option, bool):
        if not 0 <= option < len(options):
            raise DecisionError(f"option {option} does not exist; choose 0 to {len(options) - 1}")
        return options[option]
    if option in options:
        return option
    raise DecisionError("choose one of the proposal's options")


def _same_decision(proposal: Proposal, actor: Any, decision: str, chosen: Any) -> bool:
    if proposal.decided_by_id != getattr(actor, "pk", None):
        return False
    if decision == "reject":
        return proposal.status == Proposal.Status.REJECTED
    return proposal.status == Proposal.Status.APPROVED and proposal.chosen_option == chosen


def proposal_decide(*, proposal: Proposal, actor: Any, decision: str, option: Any = None, comment: str = "") -> Proposal:
    """Approve, reject or choose an option of a pending yellow/red proposal the actor may decide.

    Approve/choose applies the value to the task, validated again against the field and the
    policy at the proposal's tier (nothing is written if it is not allowed). The person who
    proposed a change may always reject it (a withdrawal, audited as such) but never approve
    their own red change. A repeat of the same decision by the same person returns the proposal unchanged
    (no audit row); any other decision on a decided proposal raises AlreadyDecided naming who
    decided. When it was the task's last pending proposal, the next iteration starts."""
    if decision not in DECISIONS:
        raise DecisionError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    comment = (comment or "").strip()[:4000]
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=proposal.task_id)
        proposal = Proposal.objects.select_for_update(of=("self",)).select_related("decided_by").get(pk=proposal.pk)
        own = proposal.proposed_by_id is not None and proposal.proposed_by_id == getattr(actor, "pk", None)
        withdraw = own and decision == "reject"  # the proposer may always take their proposal back
        if not can_decide(actor, proposal) and not withdraw:
            who = "an approver" if proposal.tier == Proposal.Tier.RED else "a reviewer or approver"
            raise PermissionDenied(f"{proposal.tier} proposals are decided by {who}")
        chosen = None if decision == "reject" else _chosen(proposal, decision, option)
        if proposal.status != Proposal.Status.PENDING:
            if _same_decision(proposal, actor, decision, chosen):
                return proposal  # a double click: no-op, no audit row
            if proposal.decided_by_id:
                when = timezone.localtime(proposal.decided_at).strftime("%Y-%m-%d %H:%M")
                raise AlreadyDecided(f"already decided by {proposal.decided_by.get_username()} "
                                     f"({proposal.status} at {when})")
            raise AlreadyDecided(f"proposal {proposal.pk} is already {proposal.get_status_display()}")
        if proposal.tier == Proposal.Tier.RED and own and not withdraw:
            raise PermissionDenied("a red change cannot be approved by the person who proposed it "
                                   "(they may withdraw it: reject)")
        if decision != "reject":
            try:
                field = policy.apply_change(task, proposal.field, chosen, tier=proposal.tier)
            except ValidationError as exc:
                raise DecisionError("; ".join(exc.messages)) from None
            task.save(update_fields=[field, "updated_at"])
        proposal.status = Proposal.Status.REJECTED if decision == "reject" else Proposal.Status.APPROVED
        proposal.decided_by = actor
        proposal.decided_at = timezone.now()
        proposal.chosen_option = chosen
        proposal.comment = comment
        proposal.save(update_fields=["status", "decided_by", "decided_at", "chosen_option", "comment"])
        decided = "withdraw" if withdraw else decision
        audit_record("reviews.proposal_withdraw" if withdraw else "reviews.proposal_decide", actor=actor,
                     target=proposal, data={**_proposal_data(proposal), "decision": decided})
        webhook("proposal.decided", {**_proposal_data(proposal), "decision": decided})
        still_pending = Proposal.objects.filter(task=task, status=Proposal.Status.PENDING).exists()
        if not still_pending and task.status == Task.Status.WAITING_APPROVAL:
            _start_next(task, actor=actor)
    return proposal


PROPOSABLE = frozenset({Task.Status.WAITING_APPROVAL, Task.Status.QUEUED, Task.Status.FAILED, Task.Status.CANCELLED})


def proposal_propose(*, task: Task, actor: Any, field: str, to_value: Any, options: list[Any] | None = None,
                     rationale: str = "") -> Proposal:
    """A person proposes a change for a task that is not running (waiting for approval, queued,
    failed or cancelled); the policy sets the tier.

    The value and every option must be valid for the field and allowed by the policy at that tier
    (DecisionError otherwise, nothing written). Green changes are applied at once (as the review
    agent's are); yellow and red ones wait."""
    if not getattr(actor, "is_authenticated", False) or not actor.has_perm("reviews.decide_yellow_proposal"):
        raise PermissionDenied("proposing changes needs the reviewer role")
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.status not in PROPOSABLE:
            # Not while `running` or `reviewing`: the review job is about to decide that iteration
            # itself. A failed or cancelled task's change applies to its retry.
            raise TransitionError(f"task {task.pk} is {task.status}; people propose changes while it waits for "
                                  "approval, before it starts, or after it failed or was cancelled")
        try:
            current = policy.current_value(task, field)
            tier = policy.validate_proposal(task, field, to_value, options or [])
        except ValidationError as exc:
            raise DecisionError("; ".join(exc.messages)) from None
        proposal = Proposal.objects.create(
            task=task, iteration=task.current_iteration, field=field, from_value=current, to_value=to_value,
            options=list(options or ([to_value] if tier == policy.YELLOW else [])), tier=tier,
            rationale=rationale, impact_note=policy.impact_note(field), proposer=actor.get_username(),
            proposed_by=actor,
        )
        audit_record("reviews.proposal_create", actor=actor, target=proposal, data=_proposal_data(proposal))
        if tier == policy.GREEN:
            task.save(update_fields=[policy.apply_change(task, field, to_value, tier=tier), "updated_at"])
            proposal.status = Proposal.Status.APPLIED
            proposal.decided_at = timezone.now()
            proposal.chosen_option = to_value
            proposal.save(update_fields=["status", "decided_at", "chosen_option"])
            audit_record("reviews.proposal_apply", actor=actor, target=proposal, data=_proposal_data(proposal))
        else:
            webhook("proposal.created", _proposal_data(proposal))
    return proposal


# -- human verdicts ----------------------------------------------------------------------------------


def _clean_step_flags(trajectory: Trajectory, step_flags: Any) -> list[dict[str, Any]]:
    if not step_flags:
        return []
    if not isinstance(step_flags, list):
        raise ValidationError("step_flags must be a list of {step, note}")
    count = len(trajectory.steps) if isinstance(trajectory.steps, list) else 0
    flags = []
    for item in step_flags:
        if not isinstance(item, dict) or isinstance(item.get("step"), bool) or not isinstance(item.get("step"), int):
            raise ValidationError("each step flag needs an integer `step`")
        if not 0 <= item["step"] < count:
            raise ValidationError(f"step {item['step']} does not exist (the trajectory has {count} steps)")
        flags.append({"step": item["step"], "note": str(item.get("note") or "")[:1000]})
    return flags


def human_verdict_record(*, trajectory: Trajectory, actor: Any, verdict: str, reason: str,
                         step_flags: Any = None) -> Review:
    """A reviewer's verdict on a finished trajectory: Review(kind=human, status done).

    Raises ValidationError on a bad verdict, an empty reason for reject / needs-fix (accept needs
    none) or flags naming missing steps; closes the actor's claim on it (the review queue).
    Repeating the caller's latest identical verdict returns it (no new row, no audit)."""
    if not getattr(actor, "is_authenticated", False) or not actor.has_perm("reviews.add_review"):
        raise PermissionDenied("human verdicts need the reviewer role")
    if verdict not in Review.Verdict.values:
        raise ValidationError(f"verdict must be one of {', '.join(Review.Verdict.values)}")
    reason = storable((reason or "").strip(), labels=False)  # NUL replaced: PostgreSQL text holds none
    if not reason and verdict != Review.Verdict.ACCEPT:
        raise ValidationError(f"give a reason for the verdict {Review.Verdict(verdict).label!r} (only accept needs none)")
    with transaction.atomic():
        trajectory = Trajectory.objects.select_for_update().get(pk=trajectory.pk)
        if trajectory.status not in Trajectory.FINAL:
            raise ValidationError("the trajectory has not finished yet")
        flags = _clean_step_flags(trajectory, step_flags)
        latest = (Review.objects.filter(trajectory=trajectory, kind=Review.Kind.HUMAN, reviewer=actor)
                  .order_by("-created_at", "-id").first())
        if latest is not None and (latest.verdict, latest.rationale, latest.step_flags) == (verdict, reason, flags):
            return latest
        review = Review.objects.create(
            trajectory=trajectory, kind=Review.Kind.HUMAN, status=Review.Status.DONE, verdict=verdict,
            rationale=reason[:10000], step_flags=flags, reviewer=actor, finished_at=timezone.now(),
        )
        # The verdict ends the reviewer's claim and assignment of the item (its slot is now a verdict).
        closed = ReviewClaim.objects.filter(trajectory=trajectory, reviewer=actor, status=ReviewClaim.Status.ACTIVE
                                            ).update(status=ReviewClaim.Status.DONE, ended_at=review.finished_at)
        assignment = ReviewAssignment.objects.filter(
            trajectory=trajectory, assignee=actor, status=ReviewAssignment.Status.ACTIVE,
        ).update(status=ReviewAssignment.Status.DONE, ended_at=review.finished_at)
        audit_record("reviews.human_verdict", actor=actor, target=review, data={
            "trajectory": trajectory.pk, "verdict": verdict, "reason": reason[:500], "step_flags": flags,
            "claim_closed": bool(closed), "assignment_closed": bool(assignment),
        })
    return review


# -- ending or extending the loop ------------------------------------------------------------------


def _require_task_control(actor: Any) -> None:
    if not getattr(actor, "is_authenticated", False) or not actor.has_perm("tasks.change_task"):
        raise PermissionDenied("controlling a task's loop needs the reviewer role")


def _supersede_pending(task: Task, note: str) -> int:
    return Proposal.objects.filter(task=task, status=Proposal.Status.PENDING).update(
        status=Proposal.Status.SUPERSEDED, comment=note[:4000])


def task_end_loop(*, task: Task, actor: Any, reason: str = "") -> Task:
    """End a reviewing or waiting task's loop now: it completes; pending proposals are superseded."""
    _require_task_control(actor)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.status == Task.Status.COMPLETED:
            return task  # repeat click
        if task.status not in (Task.Status.REVIEWING, Task.Status.WAITING_APPROVAL):
            raise TransitionError(f"task {task.pk} is {task.status}; only a reviewing or waiting task's loop can end")
        superseded = _supersede_pending(task, f"superseded: {actor.get_username()} ended the loop")
        _finish(task, Task.Status.COMPLETED, "", {
            "iteration": task.current_iteration, "ended_by": actor.get_username(), "comment": reason,
            "superseded_proposals": superseded,
        }, actor=actor, action="reviews.loop_end")
    return task


def task_force_iteration(*, task: Task, actor: Any, reason: str = "") -> Task:
    """Start one more iteration of a reviewing, waiting, completed or failed task now, with its
    current config; pending proposals are superseded; max_iterations grows by one if used up."""
    _require_task_control(actor)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        allowed = (Task.Status.REVIEWING, Task.Status.WAITING_APPROVAL, *TERMINAL_LOOP)
        if task.status not in allowed or task.cancel_requested or task.current_iteration == 0:
            raise TransitionError(f"task {task.pk} is {task.status}; only a reviewed task can be forced to iterate")
        raised = task.current_iteration >= task.max_iterations
        if raised:
            if task.max_iterations >= Task._meta.get_field("max_iterations").validators[-1].limit_value:
                raise TransitionError(f"task {task.pk} already has the most iterations allowed")
            task.max_iterations = task.current_iteration + 1
        superseded = _supersede_pending(task, f"superseded: {actor.get_username()} forced another iteration")
        previous = task.status
        task.status = Task.Status.REVIEWING
        task.finished_at = None
        task.save(update_fields=["max_iterations", "status", "finished_at", "updated_at"])
        audit_record("reviews.force_iteration", actor=actor, target=task, data={
            "from": previous, "iteration": task.current_iteration + 1, "max_iterations": task.max_iterations,
            "max_iterations_raised": raised, "superseded_proposals": superseded, "comment": reason,
        })
        _start_next(task, actor=actor)
    return task


# -- the policy table ----------------------------------------------------------------------------------


def _require_policy_admin(actor: Any) -> None:
    if not getattr(actor, "is_authenticated", False) or not actor.has_perm("reviews.change_policyrule"):
        raise PermissionDenied("the policy is edited by admins")


def policy_rule_save(*, rule: Any, actor: Any, changed: list[str]) -> Any:
    """Create or change a policy rule (admins); its audit row lists the new values."""
    _require_policy_admin(actor)
    with transaction.atomic():
        created = rule.pk is None
        rule.full_clean()
        rule.save()
        audit_record("reviews.policy_change", actor=actor, target=rule, data={
            "created": created, "changed": sorted(changed), "field": rule.field, "tier": rule.tier,
            "min_value": rule.min_value, "max_value": rule.max_value, "allowed_values": rule.allowed_values,
            "out_of_bounds_tier": rule.out_of_bounds_tier, "enabled": rule.enabled,
        })
    return rule


def policy_rule_delete(*, rule: Any, actor: Any) -> None:
    """Delete a policy rule (admins): its field is then never changed by a proposal."""
    _require_policy_admin(actor)
    with transaction.atomic():
        audit_record("reviews.policy_change", actor=actor, target=rule, data={"deleted": True, "field": rule.field})
        rule.delete()


# -- the human review queue: claims ----------------------------------------------------------------


class ClaimError(Exception):
    """A claim that cannot be taken or released; the message says why."""


def _require_reviewer(actor: Any) -> None:
    if not getattr(actor, "is_authenticated", False) or not actor.has_perm("reviews.add_review"):
        raise PermissionDenied("the review queue needs the reviewer role")


def slot_refusal(trajectory_id: int, actor: Any, now: Any, *, who: str = "you") -> str | None:
    """Why the actor cannot take one of the trajectory's REVIEW_REVIEWERS_PER_ITEM verdict slots, or
    None: they gave a verdict already, or the verdicts and other people's reservations (unexpired
    claims, active assignments; one per person) fill every slot."""
    per_item = max(1, settings.REVIEW_REVIEWERS_PER_ITEM)
    judged = Review.objects.filter(trajectory_id=trajectory_id, kind=Review.Kind.HUMAN)
    if judged.filter(reviewer=actor).exists():
        return f"{who} already gave a verdict on trajectory {trajectory_id}"
    verdicts = judged.values("reviewer").distinct().count()
    claimed = {c.reviewer_id: f"{c.reviewer.get_username()} until {timezone.localtime(c.expires_at):%H:%M}"
               for c in ReviewClaim.objects.filter(trajectory_id=trajectory_id, status=ReviewClaim.Status.ACTIVE,
                                                   expires_at__gt=now).exclude(reviewer=actor)
               .select_related("reviewer").order_by("slot")}
    assigned = {a.assignee_id: a.assignee.get_username() for a in ReviewAssignment.objects.filter(
        trajectory_id=trajectory_id, status=ReviewAssignment.Status.ACTIVE).exclude(assignee=actor)
        .select_related("assignee").order_by("id") if a.assignee_id not in claimed}
    if verdicts + len(claimed) + len(assigned) < per_item:
        return None
    held = ([f"claimed by {', '.join(claimed.values())}"] if claimed else []) + \
        ([f"assigned to {', '.join(assigned.values())}"] if assigned else [])
    if held:
        return f"trajectory {trajectory_id} is {' and '.join(held)}"
    return f"trajectory {trajectory_id} already has its {per_item} verdict(s)"


def review_claim(*, trajectory: Trajectory, actor: Any) -> ReviewClaim:
    """Reserve one of the trajectory's REVIEW_REVIEWERS_PER_ITEM verdict slots for the actor until
    REVIEW_CLAIM_MINUTES from now; the actor's own unexpired claim is returned as it is.

    Raises ClaimError when every slot is taken (by verdicts or unexpired claims of others), when the
    actor already gave a verdict, or when the trajectory has not finished. Claims past their expiry
    are marked expired here (listed in the audit row). Two reviewers racing for the last slot insert
    the same (trajectory, slot) under a partial unique constraint: one of them gets ClaimError."""
    _require_reviewer(actor)
    per_item = max(1, settings.REVIEW_REVIEWERS_PER_ITEM)
    now = timezone.now()
    active = ReviewClaim.objects.filter(trajectory_id=trajectory.pk, status=ReviewClaim.Status.ACTIVE)
    try:
        with transaction.atomic():
            own = active.filter(reviewer=actor, expires_at__gt=now).first()
            if own is not None:
                return own
            expired = list(active.filter(expires_at__lte=now).values_list("pk", flat=True))
            if expired:
                ReviewClaim.objects.filter(pk__in=expired, status=ReviewClaim.Status.ACTIVE).update(
                    status=ReviewClaim.Status.EXPIRED, ended_at=now)
            status = Trajectory.objects.filter(pk=trajectory.pk).values_list("status", flat=True).first()
            if status not in Trajectory.FINAL:
                raise ClaimError(f"trajectory {trajectory.pk} has not finished")
            refusal = slot_refusal(trajectory.pk, actor, now)
            if refusal:
                raise ClaimError(refusal)
            free = set(range(per_item)) - set(active.values_list("slot", flat=True))
            if not free:  # another reviewer's claim committed since the check above (a race)
                raise IntegrityError("no free slot")
            slot = min(free)
            with transaction.atomic():  # a savepoint: the losing insert of a race rolls back alone
                claim = ReviewClaim.objects.create(
                    trajectory_id=trajectory.pk, reviewer=actor, slot=slot,
                    expires_at=now + timedelta(minutes=settings.REVIEW_CLAIM_MINUTES))
            audit_record("reviews.claim", actor=actor, target=claim, data={
                "trajectory": trajectory.pk, "slot": slot, "expires_at": claim.expires_at.isoformat(),
                "expired_claims": expired,
            })
    except IntegrityError:
        raise ClaimError(f"trajectory {trajectory.pk} was claimed by another reviewer a moment ago") from None
    return claim


def review_claim_release(*, trajectory: Trajectory, actor: Any) -> ReviewClaim | None:
    """Give back the actor's active claim on the trajectory (no verdict); None if they held none."""
    _require_reviewer(actor)
    with transaction.atomic():
        claim = (ReviewClaim.objects.select_for_update()
                 .filter(trajectory_id=trajectory.pk, reviewer=actor, status=ReviewClaim.Status.ACTIVE).first())
        if claim is None:
            return None
        claim.status, claim.ended_at = ReviewClaim.Status.RELEASED, timezone.now()
        claim.save(update_fields=["status", "ended_at"])
        audit_record("reviews.claim_release", actor=actor, target=claim, data={"trajectory": trajectory.pk})
    return claim


NEXT_CANDIDATES = 25  # items tried per "next" before saying the queue is taken


def review_claim_next(*, actor: Any, queue: Any) -> ReviewClaim | None:
    """The actor's next item: their own unexpired claim in `queue` (a queryset of trajectories from
    selectors.human_queue for the actor), else the first item they can claim; None if none."""
    _require_reviewer(actor)
    now = timezone.now()
    own = (ReviewClaim.objects.filter(reviewer=actor, status=ReviewClaim.Status.ACTIVE, expires_at__gt=now,
                                      trajectory__in=queue.values("pk")).order_by("claimed_at").first())
    if own is not None:
        return own
    assigned = ReviewAssignment.objects.filter(assignee=actor, status=ReviewAssignment.Status.ACTIVE
                                               ).values("trajectory_id")
    candidates = [*queue.filter(pk__in=assigned)[:NEXT_CANDIDATES],
                  *queue.filter(open_slots__gt=0).exclude(pk__in=assigned)[:NEXT_CANDIDATES]]
    for trajectory in candidates:
        try:
            return review_claim(trajectory=trajectory, actor=actor)
        except ClaimError:
            continue  # taken meanwhile: try the next one
    return None


# -- preferences between rollouts -----------------------------------------------------------------


def preference_record(*, chosen: Trajectory, rejected: Trajectory, actor: Any, note: str = "") -> Preference:
    """A reviewer prefers `chosen` over `rejected`, two finished rollouts of one task; repeating the
    actor's latest preference of that task returns it (no new row, no audit). Raises ValidationError
    for one trajectory twice, rollouts of two tasks, or unfinished ones."""
    _require_reviewer(actor)
    if chosen.pk == rejected.pk:
        raise ValidationError("pick two different rollouts")
    with transaction.atomic():
        pair = {t.pk: t for t in Trajectory.objects.select_for_update().filter(pk__in=[chosen.pk, rejected.pk])}
        chosen, rejected = pair[chosen.pk], pair[rejected.pk]
        if chosen.task_id != rejected.task_id:
            raise ValidationError("a preference compares two rollouts of one task")
        if chosen.status != Trajectory.Status.FINISHED or rejected.status != Trajectory.Status.FINISHED:
            raise ValidationError("both rollouts must have finished")
        note = storable((note or "").strip()[:2000], labels=False)
        latest = Preference.objects.filter(task_id=chosen.task_id, reviewer=actor).first()
        if latest is not None and (latest.chosen_id, latest.rejected_id, latest.note) == (chosen.pk, rejected.pk, note):
            return latest
        preference = Preference.objects.create(task_id=chosen.task_id, chosen=chosen, rejected=rejected,
                                               reviewer=actor, note=note)
        audit_record("reviews.preference", actor=actor, target=preference, data={
            "task": chosen.task_id, "chosen": chosen.pk, "rejected": rejected.pk, "note": note[:500]})
    return preference


# -- corrections -----------------------------------------------------------------------------------

CORRECTED_FIELDS = ("iteration", "status", "tools", "outcome", "outcome_reason", "reward", "verifier_output", "model",
                    "config_snapshot", "prompt_tokens", "completion_tokens", "total_tokens", "started_at")


def _drop_calls(messages: list[Any], call_ids: set[str]) -> list[Any]:
    """The messages without the dropped calls: their tool_calls entries, their tool results, and an
    assistant message left with neither text nor calls."""
    kept = []
    for message in messages:
        if not isinstance(message, dict):
            kept.append(message)
            continue
        if message.get("role") == "tool" and str(message.get("tool_call_id") or "") in call_ids:
            continue
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list):
            remaining = [c for c in calls if not (isinstance(c, dict) and str(c.get("id") or "") in call_ids)]
            if len(remaining) != len(calls):
                if not remaining and not message.get("content"):
                    continue
                message = {**message, "tool_calls": remaining} if remaining else \
                    {k: v for k, v in message.items() if k != "tool_calls"}
        kept.append(message)
    return kept


def _set_thought(messages: list[Any], call_id: str, thought: str) -> list[Any]:
    """The assistant message that made the call carries the thought as its text."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if call_id and isinstance(calls, list) and any(isinstance(c, dict) and str(c.get("id") or "") == call_id
                                                       for c in calls):
            message = {**message, "content": thought}
        out.append(message)
    return out


def _parse_arguments(steps: list[Any], tools: Any, edits: dict[int, str]) -> dict[int, dict[str, Any]]:
    """Edited tool-call arguments (JSON text per step index) parsed and checked against the schema
    of the tool each step called, as the trajectory offered it; unchanged ones left out. Raises
    ValidationError naming every step whose arguments are not a JSON object its tool accepts."""
    checks = ToolArguments([t for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
                           if isinstance(tools, list) else [])
    parsed, errors = {}, []
    for i, text in sorted(edits.items()):
        if not 0 <= i < len(steps) or not isinstance(steps[i], dict):
            continue  # reported with the other missing steps
        tool = str(steps[i].get("tool") or "?")
        try:
            value = json_limits.loads(text)
        except ValueError as exc:
            errors.append(f"step {i + 1} ({tool}): the arguments are not valid JSON: {exc}")
            continue
        before = steps[i].get("arguments")
        if isinstance(before, str):
            try:
                before = json_limits.loads(before)
            except ValueError:
                pass
        if value == before:
            continue
        if isinstance(value, str):  # a JSON string (checks.parse would decode it again and store it double-encoded)
            errors.append(f"step {i + 1}: the arguments of {tool} must be a JSON object, got str")
            continue
        if steps[i].get("format") not in (None, "native"):
            # a text-format call lives in the message's text, which an edit here would not change
            errors.append(f"step {i + 1} ({tool}): a tool call written as text ({steps[i]['format']}) "
                          "cannot have its arguments edited; drop the step instead")
            continue
        if steps[i].get("error_kind") in REFUSED_KINDS:
            # The call never ran: its result is the refusal of the old arguments, which would then
            # answer the new ones (a valid call answered "not valid JSON" in every export).
            errors.append(f"step {i + 1} ({tool}): the call was refused for its arguments and never ran, so "
                          "there is no result for other arguments; drop the step instead")
            continue
        _args, problem, _kind = checks.parse(tool, value)
        if problem:
            errors.append(f"step {i + 1}: {problem}")
            continue
        parsed[i] = storable(value, labels=False)
    if errors:
        raise ValidationError(errors)
    return parsed


def _set_arguments(messages: list[Any], call_id: str, arguments: dict[str, Any]) -> list[Any]:
    """The assistant message's call `call_id` carries the edited arguments (as the API sends them: JSON text)."""
    text = json.dumps(arguments, ensure_ascii=False)
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if call_id and isinstance(calls, list) and any(isinstance(c, dict) and str(c.get("id") or "") == call_id
                                                       for c in calls):
            calls = [{**c, "function": {**(c.get("function") or {}), "arguments": text}}
                     if isinstance(c, dict) and str(c.get("id") or "") == call_id else c for c in calls]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def trajectory_correct(*, trajectory: Trajectory, actor: Any, thoughts: dict[int, str] | None = None,
                       final_answer: str | None = None, drop_steps: list[int] | None = None,
                       arguments: dict[int, str] | None = None, note: str = "") -> Correction:
    """A reviewer's correction: a new finished trajectory (same task and iteration, the next free
    sample index) with the edited thoughts, tool-call arguments (JSON text, checked against the
    tool's schema; the step keeps its recorded result and says its arguments were edited), final
    answer and without the dropped steps (steps and messages alike), linked to the original by a
    Correction holding the diff; the original is not changed. Raises ValidationError for unknown
    steps, arguments that are not JSON or break the tool's schema, an unfinished trajectory or no change."""
    _require_reviewer(actor)
    thoughts, drop = dict(thoughts or {}), sorted(set(drop_steps or []))
    edits = dict(arguments or {})
    with transaction.atomic():
        original = Trajectory.objects.select_for_update().get(pk=trajectory.pk)
        if original.status != Trajectory.Status.FINISHED:
            raise ValidationError("only a finished trajectory can be corrected")
        steps = [dict(s) if isinstance(s, dict) else s for s in (original.steps if isinstance(original.steps, list) else [])]
        messages = list(original.messages) if isinstance(original.messages, list) else []
        missing = sorted(i for i in [*thoughts, *drop, *edits] if not 0 <= i < len(steps) or not isinstance(steps[i], dict))
        if missing:
            raise ValidationError(f"step {missing[0] + 1} does not exist in trajectory {original.pk}")
        new_arguments = _parse_arguments(steps, original.tools, {i: t for i, t in edits.items() if i not in drop})
        if drop and len(drop) == len(steps):
            raise ValidationError("a correction keeps at least one step")
        diff: list[dict[str, Any]] = []
        for i, text in sorted(thoughts.items()):
            text = storable(text.strip(), labels=False)
            before = steps[i].get("thought") or ""
            if text != before and i not in drop:
                diff.append({"edit": "thought", "step": i, "before": before, "after": text})
                steps[i]["thought"] = text
                messages = _set_thought(messages, str(steps[i].get("tool_call_id") or ""), text)
        for i, value in new_arguments.items():
            diff.append({"edit": "arguments", "step": i, "before": steps[i].get("arguments"), "after": value})
            steps[i]["arguments"] = value
            steps[i]["arguments_edited"] = True  # its result is still the one the original arguments got
            messages = _set_arguments(messages, str(steps[i].get("tool_call_id") or ""), value)
        for i in drop:
            diff.append({"edit": "drop_step", "step": i, "before": {k: steps[i].get(k) for k in ("tool", "arguments")},
                         "after": None})
        if drop:
            messages = _drop_calls(messages, {str(steps[i].get("tool_call_id")) for i in drop if steps[i].get("tool_call_id")})
            steps = [s for i, s in enumerate(steps) if i not in drop]
            for n, step in enumerate(steps):
                step["index"] = n
        answer = original.final_answer
        if final_answer is not None and storable(final_answer.strip(), labels=False) != original.final_answer:
            answer = storable(final_answer.strip(), labels=False)
            diff.append({"edit": "final_answer", "before": original.final_answer, "after": answer})
        if not diff:
            raise ValidationError("nothing changed: edit a thought, a tool call's arguments or the final answer, "
                                  "or drop a step")
        used = Trajectory.objects.filter(task_id=original.task_id, iteration=original.iteration).values_list(
            "sample_index", flat=True)
        corrected = Trajectory.objects.create(
            task_id=original.task_id, sample_index=max(used) + 1, messages=messages, steps=steps,
            final_answer=answer, finished_at=timezone.now(), **{f: getattr(original, f) for f in CORRECTED_FIELDS})
        correction = Correction.objects.create(original=original, corrected=corrected, editor=actor, diff=diff,
                                               note=storable((note or "").strip()[:2000], labels=False))
        audit_record("reviews.correction", actor=actor, target=correction, data={
            "original": original.pk, "corrected": corrected.pk, "edits": [d["edit"] for d in diff]})
    return correction
