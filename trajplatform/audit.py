"""The append-only audit log.

Services write one `AuditEvent` per state change, inside their own transaction, through
`audit_record`. Action names are a closed set registered in `ACTIONS`; an unregistered name
is a programming error and raises. Rows are never edited or deleted: the model, its
queryset and the admin all refuse, and so does the database: triggers installed by migration
0004 (APPEND_ONLY_SQL) abort any UPDATE or DELETE of the table (and TRUNCATE on PostgreSQL),
whatever path the statement took (`bulk_create(update_conflicts=True)`, a plain QuerySet, raw
SQL). Only `manage.py flush`, which empties every table, lifts them inside its transaction.

Deleting a user writes nothing here: `actor` keeps the deleted user's id (no database
constraint, DO_NOTHING) and reads as None, and `actor_repr` still names them.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.fields.related_descriptors import ForwardManyToOneDescriptor

# action name -> what it records. Add new actions here, next to their service.
ACTIONS: dict[str, str] = {
    "auth.bootstrap_admin": "an admin account was created or updated from the command line",
    "auth.role_grant": "a user was given a role (group) and staff access",
    "auth.user_create": "an account was created (in the admin, or with a role by manage.py create_user)",
    "auth.user_change": "an account's details (name, email, active, password) were changed in the admin",
    "auth.api_token_create": "an API token was created for a user (the plain token was shown once)",
    "auth.api_token_revoke": "an API token was revoked",
    "api.webhook_endpoint_create": "a webhook callback URL was registered for an API token",
    "api.webhook_endpoint_delete": "a webhook callback URL was removed",
    "api.webhook_redeliver": "failed webhook deliveries were queued for one more attempt",
    "tasks.batch_import": "a batch of tasks was imported from a file",
    "datasets.trajectories_import": "trajectories (with their tasks and latest reviews) were imported from a raw export",
    "tasks.task_create": "a task was created",
    "tasks.task_cancel": "a task was cancelled",
    "tasks.task_requeue": "a finished task was queued again",
    "tasks.trajectory_attach": "an episode run elsewhere (search2qa's solver) was stored as a task's queued trajectory",
    "engines.sandbox_destroy": "an operator destroyed a sandbox from the console",
    "engines.sandbox_reap": "the reconciler destroyed a sandbox nobody owned, whose owner finished or whose TTL passed",
    "engines.envscaler_import": "EnvScaler environments and scenarios were validated and imported as a batch of tasks",
    "engines.pipeline_start": "a generation pipeline run was created and queued (or a queued one dispatched again)",
    "engines.pipeline_cancel": "a generation pipeline run was cancelled (at once if queued, between stages if running)",
    "engines.pipeline_resume": "a failed or cancelled pipeline run was queued again; its finished stages are reused",
    "engines.pipeline_finish": "a pipeline run ended (completed, failed or cancelled) with its counts",
    "engines.pipeline_requeue": "the reaper re-queued (or failed) a running pipeline run whose worker was gone",
    "engines.mcp_server_register": "an MCP server was registered or re-registered with a tool snapshot from a sandbox",
    "engines.mcp_server_resnapshot": "a registered MCP server's tools/list was taken again in a sandbox (hashes recorded)",
    "engines.mcp_server_set_enabled": "a registered MCP server was enabled or disabled",
    "engines.corpus_build": "an offline-web corpus was built (or rebuilt) and registered with its licences",
    "tasks.iteration_start": "an iteration of a task started: its trajectories were queued for the workers",
    "tasks.tasks_enqueue": "queued tasks (e.g. a whole batch) were started in one go",
    "tasks.iteration_finish": "every trajectory of a task's iteration ended; the task moved on to review",
    "tasks.rollout_retry": "a trajectory ended in a retryable error (LLM 5xx/429, lost sandbox) and was queued again",
    "tasks.batch_budget": "a batch's cost budget was set, changed or cleared",
    "tasks.user_budget": "a user's cost budget (everything their tasks spend) was set, changed or cleared",
    "tasks.rollout_requeue": "the reaper re-queued a running trajectory whose worker stopped sending heartbeats",
    "reviews.review_store": "the review agent stored an automatic review of a trajectory (scored, or judge failed)",
    "reviews.iteration_conclude": "the reviews of a task's iteration were weighed: completed, failed, or proposals made",
    "reviews.proposal_create": "a change for a task's next iteration was proposed (tier set by the server policy)",
    "reviews.proposal_apply": "a green proposal was applied to the task automatically",
    "reviews.proposal_decide": "a person approved, rejected or chose an option of a yellow or red proposal",
    "reviews.proposal_withdraw": "the person who proposed a change withdrew it (it is rejected)",
    "reviews.human_verdict": "a reviewer recorded a verdict (accept, reject, needs fix) on a trajectory",
    "reviews.claim": "a reviewer claimed a trajectory in the human review queue (reserved until the claim expires)",
    "reviews.claim_release": "a reviewer released their claim on a trajectory without a verdict",
    "reviews.assign": "an approver assigned a review queue item to a named reviewer (it holds a slot for them)",
    "reviews.unassign": "an approver withdrew a reviewer's assignment of a review queue item",
    "reviews.saved_view_save": "a person saved the review queue's filters under a name (or changed a saved view's filters)",
    "reviews.saved_view_delete": "a person deleted one of their saved views of the review queue",
    "reviews.preference": "a reviewer preferred one rollout of a task over another (the DPO exporters take it first)",
    "reviews.correction": "a reviewer corrected a trajectory: a new trajectory linked to the unchanged original",
    "reviews.loop_end": "a person ended a task's review loop early",
    "reviews.policy_change": "an admin created, changed or deleted a rule of the three-tier risk policy",
    "reviews.force_iteration": "a person forced one more iteration of a task",
    "tasks.rollout_abandon": "the reaper gave up on a trajectory whose workers kept vanishing and finished it as an error",
    "datasets.dataset_create": "a dataset (a named series of versions) was created",
    "datasets.version_create": "a dataset version was built from a filter spec: members, split and data card frozen",
    "datasets.version_build_start": "a build of a dataset version was queued for the workers (console builder, API)",
    "datasets.version_build_finish": "a queued version build wrote its version (in the same transaction)",
    "datasets.version_build_fail": "a queued version build failed; no version was written",
    "datasets.version_build_requeue": "the reaper put a build whose worker died back in the queue, or failed it after its claims",
    "datasets.version_publish": "a dataset version was published and can never change again",
    "datasets.export_start": "an export of a dataset version (format, split) was queued",
    "datasets.export_finish": "an export file was completely written and renamed into place (checksum recorded)",
    "datasets.export_fail": "an export failed; no file was put in place",
    "datasets.export_requeue": "the export reaper put a job whose worker died back in the queue, or failed it after its claims",
    "datasets.exportability_queue": "a new version's exportability measurement (every format's dry run) was queued",
    "datasets.exportability_finish": "a version's exportability measurement finished and its counts were put in its card",
    "datasets.exportability_fail": "a version's exportability measurement failed; its exports and publishing refuse",
    "datasets.exportability_requeue": "the reaper put a measurement whose worker died back in the queue (it resumes), or failed it after its claims",
    "datasets.template_check": "a finished export was rendered through a chat template and checked (per-record report)",
}


class AuditEventError(Exception):
    """An attempt to change or delete audit history, or to record an unknown action."""


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AuditEventError("audit events are append-only: update() is refused")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditEventError("audit events are append-only: delete() is refused")

    def bulk_update(self, objs: Any, fields: Any, batch_size: int | None = None) -> int:
        raise AuditEventError("audit events are append-only: bulk_update() is refused")

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if kwargs.get("update_conflicts") or kwargs.get("ignore_conflicts"):
            raise AuditEventError("audit events are append-only: bulk_create() may not resolve conflicts")
        return super().bulk_create(objs, *args, **kwargs)


class _ActorDescriptor(ForwardManyToOneDescriptor):
    """`event.actor` is None once the user is deleted (the id stays in `actor_id`)."""

    def __get__(self, instance: Any, cls: Any = None) -> Any:
        try:
            return super().__get__(instance, cls)
        except self.field.related_model.DoesNotExist:
            self.field.set_cached_value(instance, None)
            return None


class ActorField(models.ForeignKey):
    """A foreign key that reads as None when its row is gone."""

    forward_related_accessor_class = _ActorDescriptor


class AuditEvent(models.Model):
    # Deleting a user must not UPDATE audit rows (the database refuses): no constraint, no
    # ON DELETE action; the id stays and actor_repr names the user.
    actor = ActorField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
        related_name="+",
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
        base_manager_name = "objects"  # Django's internal paths get the refusing queryset too
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


# The database's own refusal (migration 0004). SQLite's RAISE(ABORT) and PostgreSQL's
# restrict_violation both reach Django as IntegrityError.
AUDIT_TABLE = "trajplatform_auditevent"
_REFUSAL = "audit events are append-only"
_NO_UPDATE, _NO_DELETE = f"{AUDIT_TABLE}_no_update", f"{AUDIT_TABLE}_no_delete"
_NO_CHANGE, _NO_TRUNCATE, _REFUSE = f"{AUDIT_TABLE}_no_change", f"{AUDIT_TABLE}_no_truncate", f"{AUDIT_TABLE}_refuse"
TRIGGERS = {"sqlite": (_NO_UPDATE, _NO_DELETE), "postgresql": (_NO_CHANGE, _NO_TRUNCATE)}
APPEND_ONLY_SQL: dict[str, list[str]] = {
    "sqlite": [
        f"CREATE TRIGGER {_NO_UPDATE} BEFORE UPDATE ON {AUDIT_TABLE} "
        f"BEGIN SELECT RAISE(ABORT, '{_REFUSAL}: UPDATE is refused'); END",
        f"CREATE TRIGGER {_NO_DELETE} BEFORE DELETE ON {AUDIT_TABLE} "
        f"BEGIN SELECT RAISE(ABORT, '{_REFUSAL}: DELETE is refused'); END",
    ],
    "postgresql": [
        f"CREATE FUNCTION {_REFUSE}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"RAISE EXCEPTION '{_REFUSAL}: % is refused', TG_OP USING ERRCODE = 'restrict_violation'; END $$",
        f"CREATE TRIGGER {_NO_CHANGE} BEFORE UPDATE OR DELETE ON {AUDIT_TABLE} "
        f"FOR EACH ROW EXECUTE FUNCTION {_REFUSE}()",
        f"CREATE TRIGGER {_NO_TRUNCATE} BEFORE TRUNCATE ON {AUDIT_TABLE} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {_REFUSE}()",
    ],
}
DROP_APPEND_ONLY_SQL: dict[str, list[str]] = {
    "sqlite": [f"DROP TRIGGER IF EXISTS {_NO_UPDATE}", f"DROP TRIGGER IF EXISTS {_NO_DELETE}"],
    "postgresql": [f"DROP FUNCTION IF EXISTS {_REFUSE}() CASCADE"],  # its triggers with it
}


def _run(connection: Any, statements: dict[str, list[str]]) -> None:
    if connection.vendor not in statements:
        raise AuditEventError(f"no append-only triggers for the {connection.vendor} database; add them")
    with connection.cursor() as cursor:
        for sql in statements[connection.vendor]:
            cursor.execute(sql)


def append_only_triggers_installed(connection: Any) -> bool:
    """Whether the refusing triggers are in place on this database."""
    names = TRIGGERS[connection.vendor]
    query = {
        "sqlite": "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s AND name IN (%s, %s)",
        "postgresql": "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname IN (%s, %s)",
    }[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(query, [AUDIT_TABLE, *names])
        return cursor.fetchone()[0] == len(names)


def install_append_only_triggers(connection: Any) -> None:
    """Create the triggers that refuse UPDATE / DELETE (/ TRUNCATE) of the audit table."""
    _run(connection, APPEND_ONLY_SQL)


def drop_append_only_triggers(connection: Any) -> None:
    """Remove them (migrating backwards, or `flush` inside its own transaction)."""
    _run(connection, DROP_APPEND_ONLY_SQL)


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
