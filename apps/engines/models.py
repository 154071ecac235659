"""Engine-side state: one `SandboxRecord` per sandbox any backend created for the platform.

The row exists before the backend is asked for the sandbox (state `creating`), so a worker
that crashes mid-create still leaves a trace, and the sandbox carries the row's id as a
label. The reconciler (`apps.engines.jobs.reconcile_sandboxes`) compares rows with what the
backends report and destroys what nobody owns. Rows change only through
`apps.engines.sandbox_records`; the admin shows them read-only.
"""
from __future__ import annotations

import uuid

from django.conf import settings
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


class PipelineRunStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class PipelineRun(models.Model):
    """One run of a scene's generation pipeline over a list of seeds, producing tasks in a batch.

    Changes only through `apps.engines.pipelines.services` (and its job, by compare-and-swap);
    every stage it ran is a `StageRun`, so a resumed run reuses what already finished.
    """

    Status = PipelineRunStatus
    FINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})

    # Identity outside this database: the LLM response cache and offline scripts key on it.
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    scene = models.CharField(max_length=32, db_index=True)
    name = models.CharField(max_length=100, help_text="the pipeline's name in the scene's registry entry")
    seeds = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    config = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    batch_name = models.CharField(max_length=200, help_text="the batch the generated tasks go into")
    batch = models.ForeignKey(
        "tasks.Batch", null=True, blank=True, on_delete=models.SET_NULL, related_name="pipeline_runs"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="pipeline_runs"
    )

    item_count = models.PositiveIntegerField(default=0, help_text="seeds (items) the run started with")
    items_done = models.PositiveIntegerField(default=0, help_text="items that went through every stage")
    items_dropped = models.PositiveIntegerField(default=0, help_text="items a validator or gate dropped")
    tasks_created = models.PositiveIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)

    worker = models.CharField(max_length=200, blank=True)
    claim_token = models.CharField(max_length=64, blank=True, editable=False)
    attempts = models.PositiveSmallIntegerField(default=0, help_text="times a worker has claimed it")
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=PipelineRunStatus.values), name="pipelinerun_status_valid"),
        ]
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="pipelinerun_heartbeat_idx")]

    def __str__(self) -> str:
        return f"pipeline run #{self.pk} ({self.scene}/{self.name})"


class StageRunKind(models.TextChoices):
    LLM = "llm", "llm"
    EPISODE = "episode", "episode"
    CODE = "code", "code"


class StageRunStatus(models.TextChoices):
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    DROPPED = "dropped", "dropped (item rejected)"
    FAILED = "failed", "failed (will run again on resume)"


class StageRun(models.Model):
    """One stage of a pipeline run for one item: what went in, what came out, what it cost.

    Unique per (run, stage, item key): a stage that finished (succeeded or dropped its item) is
    reused on resume and never paid for twice.
    """

    Kind = StageRunKind
    Status = StageRunStatus
    FINISHED = frozenset({Status.SUCCEEDED, Status.DROPPED})

    run = models.ForeignKey(PipelineRun, on_delete=models.CASCADE, related_name="stage_runs")
    stage = models.CharField(max_length=100)
    index = models.PositiveSmallIntegerField(help_text="the stage's position in the pipeline, from 0")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    item_key = models.CharField(max_length=200, help_text="the item (seed, question) this stage ran for")
    inputs = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    template_id = models.CharField(max_length=200, blank=True)
    template_version = models.CharField(max_length=40, blank=True)
    prompt_hash = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the first rendered prompt")
    raw_output = models.TextField(blank=True)
    parsed_output = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    validator_result = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    repair_attempts = models.PositiveSmallIntegerField(default=0)
    llm_calls = models.PositiveSmallIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=0, help_text="times the stage started for this item")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING, db_index=True)
    error = models.TextField(blank=True, help_text="why the item was dropped or the stage failed")
    task = models.ForeignKey(
        "tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="stage_runs",
        help_text="the task this stage produced",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index", "item_key"]
        constraints = [
            models.UniqueConstraint(fields=["run", "stage", "item_key"], name="stagerun_unique_item"),
            models.CheckConstraint(condition=Q(kind__in=StageRunKind.values), name="stagerun_kind_valid"),
            models.CheckConstraint(condition=Q(status__in=StageRunStatus.values), name="stagerun_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.stage}[{self.item_key}] of run #{self.run_id}"


class McpServer(models.Model):
    """One registered MCP server (the toucan scene's registry; apps/engines/mcp_servers.py).

    `spec` is the hub's `McpServerSpec` as JSON (launch argv/env/cwd/transport, package, deny
    and platform tools) with secrets only as `${NAME}` references to `secrets`, which are names
    of environment variables or settings, never values. `tools` is the snapshot of the server's
    own tools/list taken in a sandbox at registration (name, description, input_schema per
    tool), `tools_sha256` the SHA-256 of its canonical JSON. Rows change only through the
    registry's services; the admin shows them read-only.
    """

    name = models.CharField(max_length=64, unique=True)
    spec = models.JSONField(encoder=DjangoJSONEncoder, help_text="the hub's McpServerSpec (apps/engines/mcp/spec.py)")
    labels = models.JSONField(default=dict, blank=True, help_text='Toucan\'s labels: {"primary": str, "secondary": [str]}')
    secrets = models.JSONField(default=list, blank=True, help_text="names of the env vars / settings the launch needs")
    fixtures = models.JSONField(default=dict, blank=True, help_text="files, a seed git repo, pages to serve")
    state_probe = models.JSONField(null=True, blank=True, help_text='{"command": [...]} or {"tool": name, "arguments": {}}')
    tools = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    tools_sha256 = models.CharField(max_length=64, blank=True)
    snapshot_at = models.DateTimeField(null=True, blank=True)
    snapshot_start_ms = models.PositiveIntegerField(null=True, blank=True,
                                                    help_text="spawn + initialize + tools/list at the snapshot")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    @property
    def package(self) -> dict[str, str]:
        return dict(self.spec.get("package") or {})

    @property
    def deny_tools(self) -> list[str]:
        return list(self.spec.get("deny_tools") or [])


class Corpus(models.Model):
    """One built offline-web corpus (apps/engines/web/corpus.py): where its file is and what it holds.

    Written by `apps.engines.corpora.corpus_build` after `manage.py corpus_build` (one
    audit row per build); the admin shows rows read-only. `licences` (one entry per source: name,
    licence, attribution, copyright file) travel into the data card of a dataset built on it.
    """

    name = models.CharField(max_length=64, unique=True)
    path = models.CharField(max_length=500, help_text="the SQLite file (under WEB_CORPUS_DIR)")
    sha256 = models.CharField(max_length=64, help_text="of the file as built")
    pages = models.PositiveIntegerField(default=0)
    links = models.PositiveIntegerField(default=0, help_text="resolved links between its pages")
    bytes = models.PositiveBigIntegerField(default=0)
    sources = models.JSONField(default=dict, blank=True, help_text="pages per source")
    inputs = models.JSONField(default=list, blank=True, help_text="what it was built from (--from ...)")
    licences = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    build_seconds = models.FloatField(default=0.0)
    built_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "corpora"

    def __str__(self) -> str:
        return self.name


class TextEmbedding(models.Model):
    """One text's embedding by one model, computed once and read by every dedup after it.

    Keyed by the SHA-256 of the text (UTF-8) and the model's name, so the same prompt or action
    sequence shared by many trajectories, versions and pipeline runs is embedded once. The
    vector is float32, little-endian, `dim` values (bytes on both databases; see
    docs/datasets.md for why not pgvector). Rows are written only by
    apps.engines.embeddings.embed_stored (insert, ignoring a row another worker wrote first);
    they are never edited: a text's vector under a model does not change.
    """

    sha256 = models.CharField(max_length=64, help_text="SHA-256 (hex) of the text, UTF-8")
    model = models.CharField(max_length=100, help_text="the embedding model's name")
    dim = models.PositiveSmallIntegerField()
    vector = models.BinaryField(help_text="float32 little-endian, dim values")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["sha256", "model"], name="engines_textembedding_sha_model"),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.sha256[:12]}"
