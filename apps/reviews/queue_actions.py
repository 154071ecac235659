"""Writes of the review queue beyond claims: assignment to named reviewers, bulk actions, saved views.

    review_assign / review_unassign     an approver puts an item in a reviewer's queue, or takes it back
    review_bulk                         accept / reject / needs fix / assign / unassign many items, each
                                        through its own service and transaction (one audit row per item)
    saved_view_save / saved_view_delete a person's named filter sets of the queue
    review_assign_many                  the API's assign: many items to one reviewer, all or nothing
    saved_view_update                   rename a saved view or replace its filters (the API's PATCH)

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


def _view_name(name: str) -> str:
    """The name with its runs of spaces collapsed; ValidationError (on `name`) for an unusable one."""
    name = " ".join((name or "").split())
    if not name:
        raise ValidationError({"name": "give the view a name"})
    if "\x00" in name:
        raise ValidationError({"name": "a view's name may not contain NUL characters"})
    if len(name) > SavedView._meta.get_field("name").max_length:
        raise ValidationError({"name": "a view's name is at most 100 characters"})
    return name


def _check_view_query(query: str) -> None:
    if len(query) > SavedView._meta.get_field("query").max_length:
        raise ValidationError({"filters": "these filters are too long to save"})


def saved_view_save(*, user: Any, name: str, query: str) -> SavedView:
    """Save the queue's filters (a query string the caller normalised) under a name of the user's;
    the same name again replaces its filters, identical ones are a no-op (no audit row)."""
    if not getattr(user, "is_authenticated", False):
        raise PermissionDenied("saved views belong to a signed-in person")
    name = _view_name(name)
    _check_view_query(query)
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


# -- for the API: many items at once, all or nothing; a saved view changed by its id -----------------


class AssignRefused(AssignError):
    """Items review_assign refused (not finished, no free slot, a verdict given already); `errors`
    names each, `field` the request field they are about. Nothing was written."""

    def __init__(self, errors: list[str], *, field: str = "trajectories"):
        self.errors = errors
        self.field = field
        super().__init__("; ".join(errors))


def review_assign_many(*, trajectory_ids: list[int], assignee: Any, actor: Any
                       ) -> list[tuple[ReviewAssignment, bool]]:
    """Assign every listed trajectory to the reviewer (approvers), all or none, in one transaction:
    [(assignment, created)] by ascending trajectory id, an item already assigned to them kept as it is.
    Raises ValidationError on `assignee` (not an active reviewer) or `trajectories` (none, too many,
    unknown ids) before writing anything, AssignRefused listing every item review_assign refused."""
    _require_assigner(actor)
    ids = sorted(set(trajectory_ids))  # ascending: two approvers' overlapping requests lock in one order
    if not ids:
        raise ValidationError({"trajectories": "give at least one trajectory id"})
    if len(ids) > BULK_MAX:
        raise ValidationError({"trajectories": f"at most {BULK_MAX} items at once ({len(ids)} given)"})
    if not is_reviewer(assignee):
        raise ValidationError({"assignee": f"{assignee.get_username()} is not an active reviewer"})
    found = Trajectory.objects.in_bulk(ids)
    missing = [pk for pk in ids if pk not in found]
    if missing:
        raise ValidationError({"trajectories": "no trajectory has the id " + ", ".join(map(str, missing))})
    with transaction.atomic():
        held = set(ReviewAssignment.objects.filter(trajectory_id__in=ids, assignee=assignee,
                                                   status=ReviewAssignment.Status.ACTIVE).values_list("pk", flat=True))
        done, refused = [], []
        for pk in ids:
            try:
                done.append(review_assign(trajectory=found[pk], assignee=assignee, actor=actor))
            except AssignError as exc:  # its savepoint rolled back; the others' rows go with the raise below
                refused.append(f"{pk}: {exc}")
        if refused:
            raise AssignRefused(refused)
    return [(assignment, assignment.pk not in held) for assignment in done]


def saved_view_update(*, view: SavedView, actor: Any, name: str | None = None, query: str | None = None
                      ) -> SavedView:
    """Rename one of the actor's saved views and/or replace its filters (a query string the caller
    normalised); no change is a no-op (no audit row). Raises ValidationError on `name` when the actor
    has another view of that name (the console's save under that name would replace that one)."""
    if getattr(actor, "pk", None) != view.user_id:
        raise PermissionDenied("a saved view is changed by its owner")
    new_name = view.name if name is None else _view_name(name)
    if query is not None:
        _check_view_query(query)
    taken = ValidationError({"name": f"you have another view named {new_name!r}; delete or rename it first"})
    with transaction.atomic():
        view = SavedView.objects.select_for_update().get(pk=view.pk)
        old_name, new_query = view.name, view.query if query is None else query
        if (new_name, new_query) == (view.name, view.query):
            return view
        if new_name != view.name and SavedView.objects.filter(user_id=view.user_id, name=new_name).exists():
            raise taken
        view.name, view.query = new_name, new_query
        try:
            with transaction.atomic():
                view.save(update_fields=["name", "query", "updated_at"])
        except IntegrityError:  # the other view was saved a moment ago
            raise taken from None
        audit_record("reviews.saved_view_save", actor=actor, target=view, data={
            "name": new_name, "query": new_query, "created": False,
            **({"renamed_from": old_name} if new_name != old_name else {})})
    return view
