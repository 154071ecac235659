"""Engine-side state: one `SandboxRecord` per sandbox any backend created for the platform.

The row exists before the backend is asked for the sandbox (state `creating`), so a worker
that crashes mid-create still leaves a trace, and the sandbox carries the row's id as a
label. The reconciler (`apps.engines.jobs.reconcile_sandboxes`) compares rows with what the
backends report and destroys what nobody owns. Rows change only through
`apps.engines.sandboxes.records`; the admin shows them read-only.
"""
from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q


class SandboxState(models.TextChoices):
    CREATING = "creating", "creating"
    READY = "ready", "ready (owned)"
    POOLED = "pooled", "pooled (warm, unowned)"
    DESTROYED = "destroyed", "destroyed"
    FAILED = "failed", "failed to create"


class SandboxRecord(models.Model):
    """A sandbox the platform created: where it lives, who owns it, when it must go."""

    State = SandboxState
    LIVE = frozenset({State.CREATING, State.READY, State.POOLED})
    FINAL = frozenset({State.DESTROYED, State.FAILED})

    backend = models.CharField(max_length=32, db_index=True, help_text='"local" or "opensandbox"')
    external_id = models.CharField(
        max_length=128, blank=True, help_text="the backend's sandbox id; empty until the backend answered"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.CREATING, db_index=True)
    host = models.CharField(
        max_length=200, blank=True, help_text="machine that created it (a local sandbox lives only there)"
    )
    image = models.CharField(max_length=300, blank=True, help_text="OpenSandbox image or local runtime profile")
    labels = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    spec = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder, help_text="limits it was created with")
    downgrades = models.JSONField(
        default=list, blank=True, encoder=DjangoJSONEncoder,
        help_text="isolation features the host could not provide for this sandbox",
    )
    pool_key = models.CharField(
        max_length=64, blank=True, db_index=True, help_text="set while the sandbox waits in the warm pool"
    )
    trajectory = models.ForeignKey(
        "tasks.Trajectory", null=True, blank=True, on_delete=models.SET_NULL, related_name="sandboxes"
    )

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True, help_text="taken from the warm pool")
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True, help_text="TTL: reaped after this")
    destroyed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    destroy_reason = models.CharField(max_length=200, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["backend", "external_id"], condition=~Q(external_id=""), name="sandbox_backend_external_id_unique"
            ),
            models.CheckConstraint(condition=Q(state__in=SandboxState.values), name="sandbox_state_valid"),
        ]
        indexes = [
            models.Index(fields=["backend", "state"], name="sandbox_backend_state_idx"),
            models.Index(fields=["state", "expires_at"], name="sandbox_state_expiry_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.backend}:{self.external_id or f'#{self.pk} (creating)'}"

    @property
    def is_live(self) -> bool:
        return self.state in self.LIVE
