"""Reads shared by the dataset services, pages, commands and the API."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet, Subquery

from apps.datasets.models import Dataset, DatasetMember, DatasetVersion, ExportJob, TemplateCheck
from apps.reviews.models import Review
from apps.tasks.models import Trajectory


class NotFound(Exception):
    """A dataset, version or export that does not exist (or is not downloadable)."""


# --- reviews, as annotations (never a query per row) ----------------------------------------

def latest_auto_overall() -> Subquery:
    """The overall score (0-100) of a trajectory's latest finished automatic review."""
    reviews = Review.objects.filter(
        trajectory=OuterRef("pk"), kind=Review.Kind.AUTO, status=Review.Status.DONE, overall__isnull=False
    ).order_by("-created_at", "-id")
    return Subquery(reviews.values("overall")[:1])


def latest_human_verdict() -> Subquery:
    """The verdict (accept / reject / revise) of a trajectory's latest human review that has one."""
    reviews = Review.objects.filter(trajectory=OuterRef("pk"), kind=Review.Kind.HUMAN).exclude(verdict="").exclude(
        status=Review.Status.JUDGE_FAILED
    ).order_by("-created_at", "-id")
    return Subquery(reviews.values("verdict")[:1])


def trajectories_with_reviews(queryset: QuerySet | None = None) -> QuerySet:
    qs = Trajectory.objects.all() if queryset is None else queryset
    return qs.annotate(review_overall=latest_auto_overall(), human_verdict=latest_human_verdict())


# --- datasets and versions ------------------------------------------------------------------

def dataset_list() -> QuerySet:
    return Dataset.objects.annotate(
        n_versions=Count("versions", distinct=True),
        latest_number=Max("versions__number"),
        latest_published=Max("versions__number", filter=Q(versions__status=DatasetVersion.Status.PUBLISHED)),
    ).order_by("name")


def dataset_get(name: str) -> Dataset:
    dataset = Dataset.objects.filter(name=name).first()
    if dataset is None:
        raise NotFound(f"no dataset named {name!r}")
    return dataset


def version_get(dataset_name: str, number: int | None = None) -> DatasetVersion:
    """A version by dataset name and number; without a number, the newest one."""
    qs = DatasetVersion.objects.select_related("dataset", "parent", "created_by").filter(dataset__name=dataset_name)
    version = qs.order_by("-number").first() if number is None else qs.filter(number=number).first()
    if version is None:
        if not Dataset.objects.filter(name=dataset_name).exists():
            raise NotFound(f"no dataset named {dataset_name!r}")
        raise NotFound(f"dataset {dataset_name!r} has no version {number}" if number is not None
                       else f"dataset {dataset_name!r} has no versions yet")
    return version


def versions_of(dataset: Dataset) -> QuerySet:
    return (
        DatasetVersion.objects.filter(dataset=dataset)
        .select_related("parent", "created_by")
        .annotate(n_members=Count("members"))
        .order_by("-number")
    )


def member_ids(version: DatasetVersion, split: str = "all") -> list[int]:
    """Trajectory ids of a version (or one split of it), in frozen position order."""
    qs = DatasetMember.objects.filter(version=version)
    if split != "all":
        qs = qs.filter(split=split)
    return list(qs.order_by("position").values_list("trajectory_id", flat=True))


def member_rows(version: DatasetVersion, split: str = "all") -> list[tuple[int, int, str]]:
    """(trajectory id, task id, frozen content hash) in position order."""
    qs = DatasetMember.objects.filter(version=version)
    if split != "all":
        qs = qs.filter(split=split)
    return list(qs.order_by("position").values_list("trajectory_id", "trajectory__task_id", "content_sha256"))


def members_page_queryset(version: DatasetVersion) -> QuerySet:
    return (
        DatasetMember.objects.filter(version=version)
        .select_related("trajectory__task")
        .only("position", "split", "content_sha256", "trajectory_id", "trajectory__model", "trajectory__outcome",
              "trajectory__reward", "trajectory__task_id", "trajectory__task__scene", "trajectory__task__prompt")
        .order_by("position")
    )


# --- exports ------------------------------------------------------------------------------

def exports_of(version: DatasetVersion) -> QuerySet:
    return ExportJob.objects.filter(version=version).select_related("requested_by").order_by("-created_at", "-id")


def export_checksums(version: DatasetVersion) -> list[dict[str, Any]]:
    """The data card's export section: every completed export file and its SHA-256."""
    return [
        {"job": j.pk, "format": j.format, "format_version": j.format_version, "split": j.split,
         "file": j.file_name, "sha256": j.sha256, "lines": j.lines, "bytes": j.bytes, "members": j.members,
         "excluded": len(j.excluded or []), "finished_at": j.finished_at}
        for j in ExportJob.objects.filter(version=version, status=ExportJob.Status.DONE).order_by("format", "split", "id")
    ]


def template_checks(version: DatasetVersion) -> list[dict[str, Any]]:
    """The data card's chat-template section: every check of the version's exports, newest first."""
    return [
        {"id": c.pk, "export": c.export_id, "format": c.format, "template": c.template,
         "template_sha256": c.template_sha256, "records": c.records, "passed": c.passed, "failed": c.failed,
         "mask": (c.summary or {}).get("mask"), "reasoning_kept": (c.summary or {}).get("reasoning_kept"),
         "reasoning_stripped": (c.summary or {}).get("reasoning_stripped"),
         "properties": (c.summary or {}).get("properties", []), "render_errors": [
             {"error": e["error"], "records": e["records"]} for e in (c.summary or {}).get("render_errors", [])],
         "created_at": c.created_at}
        for c in TemplateCheck.objects.filter(version=version).order_by("-created_at", "-id")
    ]


def export_for_download(job_id: int) -> tuple[ExportJob, Path]:
    """A finished export under DATASET_EXPORT_DIR and its file; NotFound otherwise."""
    job = ExportJob.objects.select_related("version__dataset").filter(pk=job_id, status=ExportJob.Status.DONE).first()
    if job is None or not job.in_export_dir:
        raise NotFound("no such export")
    root = Path(settings.DATASET_EXPORT_DIR).resolve()
    path = Path(job.path).resolve()
    if root not in path.parents or not path.is_file():
        raise NotFound("the export file is no longer on disk")
    return job, path


# --- comparison ---------------------------------------------------------------------------

def version_overlap(a: DatasetVersion, b: DatasetVersion) -> dict[str, int]:
    """Members in both versions, only in A, only in B (by trajectory), and by content hash."""
    in_b = DatasetMember.objects.filter(version=b, trajectory_id=OuterRef("trajectory_id"))
    hash_in_b = DatasetMember.objects.filter(version=b, content_sha256=OuterRef("content_sha256"))
    a_stats = DatasetMember.objects.filter(version=a).aggregate(
        total=Count("id"),
        both=Count("id", filter=Q(Exists(in_b))),
        same_content=Count("id", filter=Q(Exists(hash_in_b))),
    )
    b_total = DatasetMember.objects.filter(version=b).count()
    return {
        "a_total": a_stats["total"],
        "b_total": b_total,
        "both": a_stats["both"],
        "only_a": a_stats["total"] - a_stats["both"],
        "only_b": b_total - a_stats["both"],
        "same_content_hash": a_stats["same_content"],
    }


DISTRIBUTIONS = (("by_scene", "scene"), ("by_model", "model"), ("by_outcome", "outcome"))


def version_compare(a: DatasetVersion, b: DatasetVersion) -> dict[str, Any]:
    """Counts, distributions (from the two data cards) and member overlap of two versions."""
    card_a, card_b = a.data_card or {}, b.data_card or {}
    counts_keys = sorted(set(a.counts or {}) | set(b.counts or {}))
    distributions = []
    for key, label in DISTRIBUTIONS:
        da, db = card_a.get(key) or {}, card_b.get(key) or {}
        names = sorted(set(da) | set(db), key=lambda n: (-(da.get(n, 0) + db.get(n, 0)), n))
        distributions.append({"name": label, "rows": [(n, da.get(n, 0), db.get(n, 0)) for n in names]})
    quantile_rows = []
    for key in ("turns", "text_tokens", "usage_tokens"):
        qa, qb = card_a.get(key) or {}, card_b.get(key) or {}
        quantile_rows.append({"name": key, "a": qa, "b": qb})
    spec_a, spec_b = a.filter_spec or {}, b.filter_spec or {}
    return {
        "a": a,
        "b": b,
        "counts": [(k, (a.counts or {}).get(k), (b.counts or {}).get(k)) for k in counts_keys],
        "distributions": distributions,
        "quantiles": quantile_rows,
        "score_histograms": (card_a.get("score_histogram"), card_b.get("score_histogram")),
        "reward_histograms": (card_a.get("reward_histogram"), card_b.get("reward_histogram")),
        "overlap": version_overlap(a, b),
        "spec_changes": [(k, spec_a.get(k), spec_b.get(k)) for k in sorted(set(spec_a) | set(spec_b))
                         if spec_a.get(k) != spec_b.get(k)],
    }
