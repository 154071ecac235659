"""Datasets and their versions. A published version never changes."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q


class ImmutableVersionError(Exception):
    """An attempt to change, or change the members of, a published dataset version."""


class Dataset(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="datasets"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DatasetVersionQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        if self.filter(status=DatasetVersion.Status.PUBLISHED).exists():
            raise ImmutableVersionError("published dataset versions cannot be updated")
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        if self.filter(status=DatasetVersion.Status.PUBLISHED).exists():
            raise ImmutableVersionError("published dataset versions cannot be deleted")
        return super().delete()


class DatasetVersion(models.Model):
    """A frozen selection of trajectories: filter spec, ordered members with hashes, data card."""

    class Status(models.TextChoices):
        DRAFT = "draft", "draft"
        PUBLISHED = "published", "published"

    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.DRAFT, db_index=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    filter_spec = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    counts = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    data_card = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    exporter_versions = models.JSONField(default=dict, blank=True)
    split_seed = models.IntegerField(default=0)
    notes = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="dataset_versions"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)

    objects = DatasetVersionQuerySet.as_manager()

    class Meta:
        ordering = ["dataset", "-number"]
        permissions = [("publish_datasetversion", "Can publish dataset versions")]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="datasetversion_unique_number"),
            models.CheckConstraint(
                condition=~Q(status="published") | Q(published_at__isnull=False), name="datasetversion_published_at"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dataset.name} v{self.number}"

    @property
    def is_published(self) -> bool:
        return self.status == self.Status.PUBLISHED

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The row in the database decides, not this instance: a stale copy that still says
        # "draft" must not overwrite a version someone else published.
        if self.pk is not None and DatasetVersion.objects.filter(pk=self.pk, status=self.Status.PUBLISHED).exists():
            raise ImmutableVersionError(f"{self} is published and cannot change")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        if DatasetVersion.objects.filter(pk=self.pk, status=self.Status.PUBLISHED).exists():
            raise ImmutableVersionError(f"{self} is published and cannot be deleted")
        return super().delete(*args, **kwargs)


class DatasetMemberQuerySet(models.QuerySet):
    def _touches_published(self) -> bool:
        return self.filter(version__status=DatasetVersion.Status.PUBLISHED).exists()

    def update(self, **kwargs: Any) -> int:
        if self._touches_published():
            raise ImmutableVersionError("members of a published dataset version cannot be updated")
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        if self._touches_published():
            raise ImmutableVersionError("members of a published dataset version cannot be deleted")
        return super().delete()

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list:
        objs = list(objs)
        version_ids = {o.version_id for o in objs}
        if DatasetVersion.objects.filter(pk__in=version_ids, status=DatasetVersion.Status.PUBLISHED).exists():
            raise ImmutableVersionError("members cannot be added to a published dataset version")
        return super().bulk_create(objs, *args, **kwargs)


class DatasetMember(models.Model):
    """One trajectory in a version, at its position, with the content hash it was frozen with."""

    class Split(models.TextChoices):
        TRAIN = "train", "train"
        VALIDATION = "validation", "validation"

    version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="members")
    position = models.PositiveIntegerField()
    trajectory = models.ForeignKey("tasks.Trajectory", on_delete=models.PROTECT, related_name="dataset_memberships")
    content_sha256 = models.CharField(max_length=64)
    split = models.CharField(max_length=12, choices=Split.choices, default=Split.TRAIN)

    objects = DatasetMemberQuerySet.as_manager()

    class Meta:
        ordering = ["version", "position"]
        constraints = [
            models.UniqueConstraint(fields=["version", "position"], name="datasetmember_unique_position"),
            models.UniqueConstraint(fields=["version", "trajectory"], name="datasetmember_unique_trajectory"),
        ]

    def __str__(self) -> str:
        return f"{self.version} #{self.position}: trajectory {self.trajectory_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if DatasetVersion.objects.filter(pk=self.version_id, status=DatasetVersion.Status.PUBLISHED).exists():
            raise ImmutableVersionError("members of a published dataset version cannot change")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        if DatasetVersion.objects.filter(pk=self.version_id, status=DatasetVersion.Status.PUBLISHED).exists():
            raise ImmutableVersionError("members of a published dataset version cannot be deleted")
        return super().delete(*args, **kwargs)


class ExportJob(models.Model):
    """One export of a version's split in one format: queued -> running -> done | failed.

    The file is written to `<path>.tmp` (and, for resumption, `<path>.parts/`) and renamed to
    `path` only when complete, so `path` never holds a half-written file. A done job is never
    changed again: its SHA-256, line count and exclusions are part of the version's data card.
    """

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    class Split(models.TextChoices):
        ALL = "all", "all"
        TRAIN = "train", "train"
        VALIDATION = "validation", "validation"

    FINAL = frozenset({Status.DONE, Status.FAILED})
    ACTIVE = frozenset({Status.QUEUED, Status.RUNNING})
    # How an export's options are recorded (read back by `layout` and `roles`): the Hugging Face
    # layout in format_version ("<exporter version>+hf", apps/datasets/hf_layout.py); a server-side
    # export's roles choice other than the default in its file name, `<format>-<split>.roles-lead.jsonl`
    # (services.export_path: one file per choice).
    HF_SUFFIX = "+hf"
    ROLES_MARK = ".roles-"
    ROLES = ("trainable", "lead", "all")  # multi_agent: every role not marked trainable: false, the lead, all

    version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, related_name="exports")
    format = models.CharField(max_length=40)
    format_version = models.CharField(max_length=40, blank=True)
    split = models.CharField(max_length=12, choices=Split.choices, default=Split.ALL)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    path = models.CharField(max_length=1000, help_text="where the finished file is (renamed there when complete)")
    in_export_dir = models.BooleanField(
        default=True, help_text="written under DATASET_EXPORT_DIR (downloadable); false for a command's --out path"
    )
    sha256 = models.CharField(max_length=64, blank=True)
    lines = models.PositiveIntegerField(null=True, blank=True)
    bytes = models.PositiveBigIntegerField(null=True, blank=True)
    members = models.PositiveIntegerField(null=True, blank=True, help_text="trajectories fed to the exporter")
    excluded = models.JSONField(default=list, blank=True, encoder=DjangoJSONEncoder)
    options = models.JSONField(default=dict, blank=True, help_text=(
        "export options other than the format's defaults that the job runs with and the file name does not "
        "carry (final_answer); exporters.check_options accepted them before the job was made"))
    resumed_chunks = models.PositiveIntegerField(default=0, help_text="chunks reused from an interrupted run")
    error = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="dataset_exports"
    )
    worker = models.CharField(max_length=200, blank=True)
    claims = models.PositiveSmallIntegerField(
        default=0, help_text="times a worker took the job; the export reaper gives up after EXPORT_MAX_CLAIMS")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["queued", "running", "done", "failed"]), name="exportjob_status_valid"
            ),
            models.CheckConstraint(condition=Q(split__in=["all", "train", "validation"]), name="exportjob_split_valid"),
            # Refuse to queue the same file twice: one active job per destination.
            models.UniqueConstraint(
                fields=["path"], condition=Q(status__in=["queued", "running"]), name="exportjob_one_active_per_path"
            ),
            models.CheckConstraint(
                condition=~Q(status="done") | (Q(finished_at__isnull=False) & ~Q(sha256="")),
                name="exportjob_done_has_checksum",
            ),
        ]
        indexes = [models.Index(fields=["version", "format", "split", "status"], name="exportjob_lookup_idx")]

    def __str__(self) -> str:
        return f"export #{self.pk} {self.format}/{self.split}"

    @property
    def file_name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def layout(self) -> str:
        """"hf" (the Hugging Face layout: a folder of Parquet shards and a card) or "jsonl" (one file)."""
        return "hf" if self.format_version.endswith(self.HF_SUFFIX) else "jsonl"

    @property
    def roles(self) -> str:
        """Whose views a multi_agent export's per-role formats write: "trainable" (the default,
        and what every other export has), "lead" or "all"."""
        name = self.file_name
        if self.in_export_dir and self.ROLES_MARK in name:
            roles = name.rsplit(self.ROLES_MARK, 1)[1].removesuffix(".jsonl").removesuffix(".hf")
            if roles in self.ROLES:
                return roles
        return self.ROLES[0]

    @property
    def final_answer(self) -> str | None:
        """How the chat formats end an episode in this export: "text" or "tool" (exporters/answers.py),
        None for the format's default."""
        return (self.options or {}).get("final_answer")


class TemplateCheck(models.Model):
    """A finished export rendered through one chat template (templates.py); part of the version's card.

    Written once by the template_check_record service and never changed.
    """

    version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, related_name="template_checks")
    export = models.ForeignKey(ExportJob, on_delete=models.PROTECT, related_name="template_checks")
    template = models.CharField(max_length=200)
    template_sha256 = models.CharField(max_length=64)
    format = models.CharField(max_length=40)
    records = models.PositiveIntegerField()
    passed = models.PositiveIntegerField()
    failed = models.PositiveIntegerField()
    summary = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder,
                               help_text="totals and the failing records with their problems")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="template_checks"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["version", "template", "-created_at"]

    def __str__(self) -> str:
        return f"{self.version} {self.format} through {self.template}: {self.passed}/{self.records}"


class WorkerJob(models.Model):
    """The state a worker's job row shares (a version build, an exportability run): queued ->
    running -> done | failed, claimed by compare-and-swap on status, with the claiming worker, a
    heartbeat, one timestamp per milestone and a readable error."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    FINAL = frozenset({Status.DONE, Status.FAILED})
    ACTIVE = frozenset({Status.QUEUED, Status.RUNNING})

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]


class VersionBuild(WorkerJob):
    """One request to build a dataset version, run by a worker: queued -> running -> done | failed.

    The console's builder and the API create it and return at once; the job
    (apps.datasets.jobs.run_version_build) calls services.dataset_version_create, which writes
    the version and marks the build done in one transaction, so a build is done exactly when
    its version exists. Progress (stage, done of total) is written as the job goes and read by
    the build page over /ws/version-builds/<id>/.
    """

    dataset_name = models.CharField(max_length=100)
    filter_spec = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder,
                                   help_text="the spec as given (validated again by the job)")
    parent = models.ForeignKey(DatasetVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    notes = models.TextField(blank=True)
    stage = models.CharField(max_length=40, blank=True, help_text="the step the job is in (scanned, reading, dedup, ...)")
    done = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    version = models.OneToOneField(DatasetVersion, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="build")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="version_builds")
    claims = models.PositiveSmallIntegerField(
        default=0, help_text="times a worker took the build; the reaper gives up after BUILD_MAX_CLAIMS")

    class Meta(WorkerJob.Meta):
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["queued", "running", "done", "failed"]), name="versionbuild_status_valid"),
            models.CheckConstraint(condition=~Q(status="done") | Q(version__isnull=False),
                                   name="versionbuild_done_has_version"),
        ]

    def __str__(self) -> str:
        return f"version build #{self.pk} of {self.dataset_name}"


class ExportabilityRun(WorkerJob):
    """The dry run of every applicable export format over a version's members (exportability.py),
    run by a worker once the version is written: queued -> running -> done | failed.

    A row of its own rather than fields on the version: the run writes its heartbeat, progress and
    partial tallies after every chunk, which must not rewrite the version row every page reads (nor
    touch the immutability guard of a published one); the row only matters while the version is
    measured. When done, the section is in `version.data_card["exportability"]` and `tallies` is
    emptied. `tallies` is JSON as text, not a JSONField: PostgreSQL's jsonb reorders keys, and the
    order the reasons were first met breaks `most_common`'s ties as an uninterrupted run breaks
    them, so a resumed run's card equals a single run's.
    """

    version = models.OneToOneField(DatasetVersion, on_delete=models.CASCADE, related_name="exportability_run")
    done = models.PositiveIntegerField(default=0, help_text="members measured (those of the finished chunks)")
    total = models.PositiveIntegerField(default=0, help_text="the version's members")
    chunks_done = models.PositiveIntegerField(
        default=0, help_text="chunks finished and counted in `tallies`; a resumed run starts after them")
    tallies = models.TextField(blank=True, help_text="the partial counts after `chunks_done` chunks (JSON text)")
    claims = models.PositiveSmallIntegerField(
        default=0, help_text="times a worker took the run; the reaper gives up after EXPORTABILITY_MAX_CLAIMS")

    class Meta(WorkerJob.Meta):
        constraints = [
            models.CheckConstraint(condition=Q(status__in=["queued", "running", "done", "failed"]),
                                   name="exportabilityrun_status_valid"),
        ]

    def __str__(self) -> str:
        return f"exportability of version #{self.version_id} ({self.status}, {self.done} of {self.total})"
