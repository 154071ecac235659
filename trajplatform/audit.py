"""The append-only audit log.

Services write one `AuditEvent` per state change, inside their own transaction, through
`audit_record`. Action names are a closed set registered in `ACTIONS`; an unregistered name
is a programming error and raises. Rows are never edited or deleted: the model, its
queryset and the admin all refuse.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

# action name -> what it records. Add new actions here, next to their service.
ACTIONS: dict[str, str] = {
    "auth.bootstrap_admin": "an admin account was created or updated from the command line",
    "auth.role_grant": "a user was given a role (group) and staff access",
    "tasks.batch_import": "a batch of tasks was imported from a file",
    "tasks.task_create": "a task was created",
    "tasks.task_cancel": "a task was cancelled",
    "tasks.task_requeue": "a finished task was queued again",
    "engines.sandbox_destroy": "an operator destroyed a sandbox from the console",
    "engines.sandbox_reap": "the reconciler destroyed a sandbox nobody owned, whose owner finished or whose TTL passed",
    "tasks.iteration_start": "an iteration of a task started: its trajectories were queued for the workers",
    "tasks.tasks_enqueue": "queued tasks (e.g. a whole batch) were started in one go",
    "tasks.iteration_finish": "every trajectory of a task's iteration ended; the task moved on (completed or failed)",
    "tasks.rollout_retry": "a trajectory ended in a retryable error (LLM 5xx/429, lost sandbox) and was queued again",
    "tasks.rollout_requeue": "the reaper re-queued a running trajectory whose worker stopped sending heartbeats",
    "tasks.rollout_abandon": "the reaper gave up on a trajectory whose workers kept vanishing and finished it as an error",
}


class AuditEventError(Exception):
    """An attempt to change or delete audit history, or to record an unknown action."""


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AuditEventError("audit events are append-only: update() is refused")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditEventError("audit events are append-only: delete() is refused")


class AuditEvent(models.Model):
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text so the row still says who acted after the user is deleted.
    actor_repr = models.CharField(max_length=200)
    action = models.CharField(max_length=64, db_index=True, help_text="one of trajplatform.audit.ACTIONS")
    target_type = models.CharField(max_length=100, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=300, blank=True)
    data = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        app_label = "trajplatform"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id", "-created_at"], name="audit_target_idx")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_repr} {self.action} {self.target_repr}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AuditEventError("audit events are append-only: an existing row cannot be saved again")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AuditEventError("audit events are append-only: delete() is refused")


def target_type_of(obj: models.Model) -> str:
    return obj._meta.label_lower


def audit_record(
    action: str,
    *,
    actor: Any = None,
    target: models.Model | None = None,
    data: dict[str, Any] | None = None,
    actor_repr: str | None = None,
) -> AuditEvent:
    """Append one audit row; call inside the service's transaction."""
    if action not in ACTIONS:
        raise AuditEventError(f"unregistered audit action {action!r}; add it to trajplatform.audit.ACTIONS")
    if actor is not None and not getattr(actor, "is_authenticated", False):
        actor = None
    if actor_repr is None:
        actor_repr = actor.get_username() if actor is not None else "system"
    event = AuditEvent(
        actor=actor,
        actor_repr=actor_repr[:200],
        action=action,
        target_type=target_type_of(target) if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:300] if target is not None else "",
        data=data or {},
    )
    event.save()
    return event


def audit_events_for(obj: models.Model) -> AuditEventQuerySet:
    return AuditEvent.objects.filter(target_type=target_type_of(obj), target_id=str(obj.pk))
