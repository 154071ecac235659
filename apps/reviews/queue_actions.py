"""Writes of the review queue beyond claims: assignment to named reviewers, bulk actions, saved views.

    review_assign / review_unassign     an approver puts an item in a reviewer's queue, or takes it back
    review_bulk                         accept / reject / needs fix / assign / unassign many items, each
                                        through its own service and transaction (one audit row per item)
    saved_view_save / saved_view_delete a person's named filter sets of the queue

An active assignment holds one of the item's REVIEW_REVIEWERS_PER_ITEM slots for its assignee, as an
unexpired claim does (services.slot_refusal counts both, once per person); the assignee's verdict
ends it (services.human_verdict_record).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.reviews import services
from apps.reviews.models import Review, ReviewAssignment, SavedView
from apps.tasks.models import Trajectory
from trajplatform.audit import audit_record

ASSIGN_PERMISSION = "reviews.assign_review"
VERDICT_ACTIONS = tuple(Review.Verdict.values)
BULK_ACTIONS = (*VERDICT_ACTIONS, "assign", "unassign")
BULK_MAX = 200
SAVED_VIEWS_MAX = 50


class AssignError(Exception):
    """An assignment that cannot be made as asked; the message says why (nothing was written)."""


def _require_assigner(actor: Any) -> None:
    if not getattr(actor, "is_authenticated", False) or not actor.has_perm(ASSIGN_PERMISSION):
        raise PermissionDenied("assigning review items needs the approver role")


def is_reviewer(user: Any) -> bool:
    return bool(user is not None and user.is_active and user.has_perm("reviews.add_review"))


def review_assign(*, trajectory: Trajectory, assignee: Any, actor: Any) -> ReviewAssignment:
    """Put a finished trajectory in a reviewer's queue (approvers): it holds a verdict slot for them
    until their verdict; their active assignment of it is returned as it is (no second row, no audit).
    Raises AssignError when the assignee is not an active reviewer or gave a verdict already, when
    the trajectory has not finished, or when no slot is free (verdicts, others' claims and assignments)."""
    _require_assigner(actor)
    name = assignee.get_username()
    if not is_reviewer(assignee):
        raise AssignError(f"{name} is not an active reviewer")
    try:
        with transaction.atomic():
            status = (Trajectory.objects.select_for_update().filter(pk=trajectory.pk)
                      .values_list("status", flat=True).first())
            if status not in Trajectory.FINAL:
                raise AssignError(f"trajectory {trajectory.pk} has not finished")
            active = ReviewAssignment.objects.filter(trajectory_id=trajectory.pk, assignee=assignee,
                                                     status=ReviewAssignment.Status.ACTIVE).first()
            if active is not None:
                return active
            refusal = services.slot_refusal(trajectory.pk, assignee, timezone.now(), who=name)
            if refusal:
                raise AssignError(refusal)
            with transaction.atomic():  # a savepoint: the losing insert of a race rolls back alone
                assignment = ReviewAssignment.objects.create(trajectory_id=trajectory.pk, assignee=assignee,
                                                             assigned_by=actor)
            audit_record("reviews.assign", actor=actor, target=assignment, data={
                "trajectory": trajectory.pk, "assignee": name})
    except IntegrityError:
        return ReviewAssignment.objects.get(trajectory_id=trajectory.pk, assignee=assignee,
                                            status=ReviewAssignment.Status.ACTIVE)
    return assignment


def review_unassign(*, trajectory: Trajectory, assignee: Any, actor: Any) -> ReviewAssignment | None:
    """Withdraw the assignee's active assignment of the trajectory (approvers, or the assignee handing
    it back); None if there was none."""
    if getattr(actor, "pk", None) != assignee.pk:
        _require_assigner(actor)
    with transaction.atomic():
        assignment = (ReviewAssignment.objects.select_for_update()
                      .filter(trajectory_id=trajectory.pk, assignee=assignee, status=ReviewAssignment.Status.ACTIVE)
                      .first())
        if assignment is None:
            return None
        assignment.status, assignment.ended_at = ReviewAssignment.Status.WITHDRAWN, timezone.now()
        assignment.save(update_fields=["status", "ended_at"])
        audit_record("reviews.unassign", actor=actor, target=assignment, data={
            "trajectory": trajectory.pk, "assignee": assignee.get_username()})
    return assignment


@dataclass
class BulkResult:
    """What a bulk action did: the trajectory ids it applied to, and why it did not apply to the others."""

    action: str
    done: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)


def _verdict(trajectory: Trajectory, actor: Any, verdict: str, reason: str) -> None:
    with transaction.atomic():
        # Locked first: two people's bulk verdicts on one item see each other's verdict (or claim).
        Trajectory.objects.select_for_update().filter(pk=trajectory.pk).values_list("pk").first()
        refusal = services.slot_refusal(trajectory.pk, actor, timezone.now())
        if refusal:
            raise services.ClaimError(refusal)
        services.human_verdict_record(trajectory=trajectory, actor=actor, verdict=verdict, reason=reason)


def review_bulk(*, trajectory_ids: list[int], actor: Any, action: str, reason: str = "",
                assignee: Any = None) -> BulkResult:
    """Apply one action to many review queue items: a verdict (accept, reject, needs_fix; the reason
    is required for the last two) through human_verdict_record, refused for an item whose slots are
    taken by others' claims or assignments; assign / unassign (approvers) through review_assign /
    review_unassign. Each item is its own transaction with its own audit row: a refused item is
    reported with its reason and the others go on. Raises PermissionDenied / ValidationError before
    touching any item when the actor may not do the action or the request is malformed."""
    if action not in BULK_ACTIONS:
        raise ValidationError(f"unknown bulk action {action[:40]!r}; actions: {', '.join(BULK_ACTIONS)}")
    ids = list(dict.fromkeys(trajectory_ids))
    if not ids:
        raise ValidationError("select at least one item")
    if len(ids) > BULK_MAX:
        raise ValidationError(f"at most {BULK_MAX} items at once ({len(ids)} selected)")
    reason = (reason or "").strip()
    if action in VERDICT_ACTIONS:
        if not getattr(actor, "is_authenticated", False) or not actor.has_perm("reviews.add_review"):
            raise PermissionDenied("human verdicts need the reviewer role")
        if not reason and action != Review.Verdict.ACCEPT:
            raise ValidationError(f"give a reason for the verdict {Review.Verdict(action).label!r} "
                                  "(only accept needs none)")
    else:
        if action == "assign" or getattr(actor, "pk", None) != getattr(assignee, "pk", None):
            _require_assigner(actor)
        if assignee is None:
            raise ValidationError(f"{action}: choose a reviewer")
    found = Trajectory.objects.in_bulk(ids)
    result = BulkResult(action=action)
    for pk in ids:
        trajectory = found.get(pk)
        if trajectory is None:
            result.failed.append((pk, "no such trajectory"))
            continue
        try:
            if action == "assign":
                review_assign(trajectory=trajectory, assignee=assignee, actor=actor)
            elif action == "unassign":
                if review_unassign(trajectory=trajectory, assignee=assignee, actor=actor) is None:
                    raise AssignError(f"trajectory {pk} is not assigned to {assignee.get_username()}")
            else:
                _verdict(trajectory, actor, action, reason)
        except (ValidationError, services.ClaimError, AssignError) as exc:
            message = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
            result.failed.append((pk, message))
        else:
            result.done.append(pk)
    return result


# -- saved views -------------------------------------------------------------------------------------


def saved_view_save(*, user: Any, name: str, query: str) -> SavedView:
    """Save the queue's filters (a query string the caller normalised) under a name of the user's;
    the same name again replaces its filters, identical ones are a no-op (no audit row)."""
    if not getattr(user, "is_authenticated", False):
        raise PermissionDenied("saved views belong to a signed-in person")
    name = " ".join((name or "").split())
    if not name:
        raise ValidationError("give the view a name")
    if "\x00" in name:
        raise ValidationError("a view's name may not contain NUL characters")
    if len(name) > SavedView._meta.get_field("name").max_length:
        raise ValidationError("a view's name is at most 100 characters")
    if len(query) > SavedView._meta.get_field("query").max_length:
        raise ValidationError("these filters are too long to save")
    with transaction.atomic():
        view = SavedView.objects.select_for_update().filter(user=user, name=name).first()
        created = view is None
        if view is None:
            if SavedView.objects.filter(user=user).count() >= SAVED_VIEWS_MAX:
                raise ValidationError(f"you have {SAVED_VIEWS_MAX} saved views; delete one first")
            try:
                with transaction.atomic():
                    view = SavedView.objects.create(user=user, name=name, query=query)
            except IntegrityError:
                raise ValidationError(f"a view named {name!r} was saved a moment ago; save again to replace it") \
                    from None
        elif view.query == query:
            return view
        else:
            view.query = query
            view.save(update_fields=["query", "updated_at"])
        audit_record("reviews.saved_view_save", actor=user, target=view, data={
            "name": name, "query": query, "created": created})
    return view


def saved_view_delete(*, view: SavedView, actor: Any) -> None:
    """Delete one of the actor's saved views (nobody deletes another person's)."""
    if getattr(actor, "pk", None) != view.user_id:
        raise PermissionDenied("a saved view is deleted by its owner")
    with transaction.atomic():
        audit_record("reviews.saved_view_delete", actor=actor, target=view, data={"name": view.name,
                                                                                 "query": view.query})
        view.delete()
