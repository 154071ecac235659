"""The artifact store: binary observations (screenshots) kept by content hash, outside the JSON rows.

    ref = store(png_bytes, "image/png", width=500, height=360)
    # {"artifact": "<sha256>", "mime": "image/png", "bytes": 5123, "width": 500, "height": 360}
    read(ref["artifact"]) -> bytes;  data_url(sha) -> "data:image/png;base64,…" (for a model call)

Content-addressed: the key is the SHA-256 of the bytes, the file `<sha[:2]>/<sha><ext>` in the
storage `STORAGES["artifacts"]` (settings: ARTIFACTS_STORAGE_BACKEND, any Django storage
backend, e.g. django-storages' S3 one, with ARTIFACTS_STORAGE_OPTIONS as JSON; by default files
under MEDIA_ROOT/artifacts). Storing the same bytes twice writes one file and one row (dedup).

Steps and messages reference artifacts by their hash (`{"artifact": sha, ...}`, or the URL
`artifact:<sha>` in an image content part), never by base64. When a trajectory is stored
(apps.tasks.services.trajectories_finish) `link_trajectory` records which artifacts it uses
(`ArtifactUse`); deleting a trajectory, by any path, cascades to its uses, and an artifact no
trajectory uses any more is deleted with its file once the deletion commits. Artifacts of
episodes never stored (a worker lost mid-episode) have no use: `sweep` removes those older
than a day. Writes here are the data plane (like log lines): no audit rows.

Every image kept (PNG, JPEG, WebP, GIF) is measured from its header first
(trajplatform.images.measure): more than IMAGE_MAX_BYTES bytes or IMAGE_MAX_PIXELS pixels, or
bytes that are not the declared type, are refused with an ArtifactError before anything is
written, and the stored width/height are the measured ones, not what the caller said.

`step_screenshot(record, seen)` is what the console draws for a step: the acted-on element on
the screenshot the agent acted on (`seen`: the previous step's image, or the start page's,
`first_image(messages)`), and the step's own image (the result) beside it.
"""
from __future__ import annotations

import base64
import hashlib
import re
from datetime import timedelta
from typing import Any, Iterable

from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import IntegrityError, models, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.urls import reverse
from django.utils import timezone

from trajplatform import images
from trajplatform.schedules import ensure_schedule

SHA_RE = re.compile(r"^[0-9a-f]{64}$")
URL_PREFIX = "artifact:"
EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif"}
MAX_BYTES = 32 << 20


class ArtifactError(ValueError):
    """An artifact that cannot be stored or found."""


class Artifact(models.Model):
    """One stored blob, named by the SHA-256 of its bytes."""

    sha256 = models.CharField(max_length=64, unique=True)
    mime = models.CharField(max_length=100)
    size = models.PositiveBigIntegerField()
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        app_label = "trajplatform"

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.mime}, {self.size} bytes)"

    @property
    def name(self) -> str:
        return file_name(self.sha256, self.mime)

    def ref(self) -> dict[str, Any]:
        ref: dict[str, Any] = {"artifact": self.sha256, "mime": self.mime, "bytes": self.size}
        if self.width and self.height:
            ref.update(width=self.width, height=self.height)
        return ref


class ArtifactUse(models.Model):
    """A trajectory refers to an artifact; deleted with the trajectory (cascade)."""

    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="uses")
    trajectory = models.ForeignKey("tasks.Trajectory", on_delete=models.CASCADE, related_name="artifact_uses")

    class Meta:
        app_label = "trajplatform"
        constraints = [models.UniqueConstraint(fields=["artifact", "trajectory"], name="artifact_use_unique")]


def storage() -> Any:
    return storages["artifacts"]


def file_name(sha: str, mime: str) -> str:
    return f"{sha[:2]}/{sha}{EXTENSIONS.get(mime, '.bin')}"


def store(data: bytes, mime: str, *, width: int | None = None, height: int | None = None) -> dict[str, Any]:
    """Keep `data` (once per content) and return its reference for a step or a message; an image
    is measured first and refused (ArtifactError, nothing written) past the image limits."""
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ArtifactError("an artifact needs non-empty bytes")
    if len(data) > MAX_BYTES:
        raise ArtifactError(f"an artifact is at most {MAX_BYTES} bytes, got {len(data)}")
    if mime in images.FORMATS:
        try:
            size = images.measure(bytes(data), mime)
        except images.ImageError as exc:
            raise ArtifactError(str(exc)) from None
        width, height = size.width, size.height
    sha = hashlib.sha256(data).hexdigest()
    found = Artifact.objects.filter(sha256=sha).first()
    if found is not None:
        return found.ref()
    name = file_name(sha, mime)
    files = storage()
    if not files.exists(name):
        # The name is the content: a concurrent writer saving the same name writes the same bytes.
        saved = files.save(name, ContentFile(bytes(data)))
        if saved != name:  # a backend that renamed rather than overwrote: keep one copy
            files.delete(saved)
    try:
        with transaction.atomic():
            artifact = Artifact.objects.create(sha256=sha, mime=mime, size=len(data), width=width, height=height)
    except IntegrityError:
        artifact = Artifact.objects.get(sha256=sha)
    return artifact.ref()


def get(sha: str) -> Artifact:
    if not isinstance(sha, str) or not SHA_RE.match(sha):
        raise ArtifactError(f"not an artifact hash: {sha!r}")
    try:
        return Artifact.objects.get(sha256=sha)
    except Artifact.DoesNotExist:
        raise ArtifactError(f"no artifact {sha}") from None


def read(sha: str) -> bytes:
    artifact = get(sha)
    with storage().open(artifact.name, "rb") as fh:
        return fh.read()


def data_url(sha: str) -> str:
    """The artifact inlined as a data: URL (what a model API takes for an image)."""
    artifact = get(sha)
    return f"data:{artifact.mime};base64,{base64.b64encode(read(sha)).decode('ascii')}"


def refs_in(value: Any) -> set[str]:
    """The artifact hashes a step, message or any JSON value refers to."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            sha = item.get("artifact")
            if isinstance(sha, str) and SHA_RE.match(sha):
                found.add(sha)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and item.startswith(URL_PREFIX) and SHA_RE.match(item[len(URL_PREFIX):]):
            found.add(item[len(URL_PREFIX):])
    return found


def link_trajectories(payloads: dict[int, Iterable[Any]]) -> int:
    """Record the artifacts each trajectory's stored JSON (steps, messages…) refers to; call
    inside the transaction that stores them. Returns how many uses were added."""
    wanted = {tid: set().union(*(refs_in(v) for v in values)) for tid, values in payloads.items()}
    shas = set().union(*wanted.values()) if wanted else set()
    if not shas:
        return 0
    ids = dict(Artifact.objects.filter(sha256__in=shas).values_list("sha256", "pk"))
    uses = [ArtifactUse(artifact_id=ids[sha], trajectory_id=tid)
            for tid, found in wanted.items() for sha in sorted(found) if sha in ids]
    ArtifactUse.objects.bulk_create(uses, ignore_conflicts=True)
    return len(uses)


def delete_unused(artifact_ids: Iterable[int]) -> int:
    """Delete those of the artifacts no trajectory uses, rows and files; how many went."""
    unused = list(Artifact.objects.filter(pk__in=set(artifact_ids), uses__isnull=True))
    files = storage()
    for artifact in unused:
        artifact.delete()
        files.delete(artifact.name)
    return len(unused)


def sweep(older_than: timedelta = timedelta(days=1)) -> int:
    """Remove artifacts no trajectory uses that are older than `older_than` (episodes never stored)."""
    ids = Artifact.objects.filter(uses__isnull=True, created_at__lt=timezone.now() - older_than).values_list("pk", flat=True)
    return delete_unused(list(ids))


SWEEP_SCHEDULE = "artifacts-sweep"
SWEEP_JOB = "trajplatform.artifacts.sweep"


def ensure_sweep_schedule(using: str = "default") -> None:
    """Register the hourly sweep of artifacts no stored episode took (idempotent; run after migrate)."""
    ensure_schedule(name=SWEEP_SCHEDULE, func=SWEEP_JOB, minutes=60, using=using)


@receiver(post_delete, sender=ArtifactUse, dispatch_uid="trajplatform.artifacts.release")
def _released(sender: Any, instance: ArtifactUse, **kwargs: Any) -> None:
    # A trajectory's deletion cascades here; its artifacts go once that deletion commits, and
    # only those no other trajectory uses (the same screenshot in two episodes stays).
    # robust: a storage that fails to delete a file is logged; the trajectory's deletion stands.
    artifact_id = instance.artifact_id
    transaction.on_commit(lambda: delete_unused([artifact_id]), robust=True)


def _image(ref: Any) -> dict[str, Any] | None:
    if not isinstance(ref, dict) or not isinstance(ref.get("artifact"), str) or not SHA_RE.match(ref["artifact"]):
        return None
    return {"url": reverse("artifact", args=[ref["artifact"]]), "width": ref.get("width"), "height": ref.get("height")}


def step_screenshot(record: Any, seen: Any = None) -> dict[str, Any] | None:
    """What the console draws for a step: the screenshot the agent acted on (`seen`, the previous
    step's last image or the start page's, an artifact ref) with the acted-on element's box or
    point on it, as percentages of that image so the drawing scales with it, and the step's own
    last image (the page after the action) beside it; None when there is neither."""
    after = _image(record["images"][-1]) if isinstance(record, dict) and isinstance(record.get("images"), list) \
        and record["images"] else None
    before = _image(seen)
    if before is None and after is None:
        return None
    shot: dict[str, Any] = {"before": before, "after": after}
    action = record.get("action") if isinstance(record, dict) and isinstance(record.get("action"), dict) else {}
    width, height = (before or {}).get("width"), (before or {}).get("height")
    # The box and point were measured before the action (the server reads them, then acts), in the
    # pixels of the page the agent saw: drawn on the before image only, never on the result.
    if before is not None and isinstance(width, (int, float)) and isinstance(height, (int, float)) \
            and width > 0 and height > 0:
        box, point = action.get("box"), action.get("point")
        if isinstance(box, dict) and all(isinstance(box.get(k), (int, float)) for k in ("x", "y", "width", "height")):
            before["box"] = {"left": 100 * box["x"] / width, "top": 100 * box["y"] / height,
                             "width": 100 * box["width"] / width, "height": 100 * box["height"] / height}
        if isinstance(point, dict) and all(isinstance(point.get(k), (int, float)) for k in ("x", "y")):
            before["point"] = {"left": 100 * point["x"] / width, "top": 100 * point["y"] / height}
    shot["drawn"] = bool(before and ("box" in before or "point" in before))
    shot["has_action"] = bool(isinstance(action.get("box"), dict) or isinstance(action.get("point"), dict))
    return shot


def first_image(messages: Any) -> dict[str, Any] | None:
    """The last image of the messages before the first assistant reply (the start page a vision
    model was shown), as an artifact ref with its stored size; None when there is none."""
    sha = None
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            break
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            url = (part.get("image_url") or {}).get("url", "") if isinstance(part, dict) else ""
            if isinstance(url, str) and url.startswith(URL_PREFIX) and SHA_RE.match(url[len(URL_PREFIX):]):
                sha = url[len(URL_PREFIX):]
    if sha is None:
        return None
    row = Artifact.objects.filter(sha256=sha).only("sha256", "mime", "size", "width", "height").first()
    return row.ref() if row is not None else None
