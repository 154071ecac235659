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
