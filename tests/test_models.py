"""Model invariants the database and the models enforce, whoever writes."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.datasets.models import Dataset, DatasetMember, DatasetVersion, ImmutableVersionError
from apps.reviews.models import Proposal, Review
from apps.tasks.models import Batch, Task, Trajectory, content_sha256

pytestmark = pytest.mark.django_db


def _refused(create: Any) -> None:
    """The write raises IntegrityError; the savepoint keeps the test's transaction usable."""
    with pytest.raises(IntegrityError), transaction.atomic():
        create()


# --- tasks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("priority", [0, 11])
def test_task_priority_outside_1_to_10_is_refused(make_task: Any, priority: int) -> None:
    _refused(lambda: make_task(priority=priority))


@pytest.mark.parametrize("priority", [1, 10])
def test_task_priority_bounds_are_accepted(make_task: Any, priority: int) -> None:
    assert make_task(priority=priority).priority == priority


def test_task_threshold_above_100_is_refused(make_task: Any) -> None:
    _refused(lambda: make_task(quality_threshold=101))
    assert make_task(quality_threshold=100).quality_threshold == 100


@pytest.mark.parametrize("temperature", [-0.1, 2.01])
def test_task_temperature_outside_0_to_2_is_refused(make_task: Any, temperature: float) -> None:
    _refused(lambda: make_task(temperature=temperature))


@pytest.mark.parametrize("temperature", [0.0, 2.0])
def test_task_temperature_bounds_are_accepted(make_task: Any, temperature: float) -> None:
    assert make_task(temperature=temperature).temperature == temperature


def test_task_status_must_be_a_known_status(make_task: Any) -> None:
    _refused(lambda: make_task(status="exploded"))


def test_external_id_is_unique_within_a_batch(make_task: Any) -> None:
    batch = Batch.objects.create(name="b")
    make_task(batch=batch, external_id="t-1")
    _refused(lambda: make_task(batch=batch, external_id="t-1"))
    assert Task.objects.filter(batch=batch).count() == 1


def test_external_id_may_repeat_across_batches(make_task: Any) -> None:
    first, second = make_task(external_id="t-1"), make_task(external_id="t-1")
    assert first.batch_id != second.batch_id


def test_empty_external_id_may_repeat_within_a_batch(make_task: Any) -> None:
    batch = Batch.objects.create(name="b")
    for _ in range(3):
        make_task(batch=batch, external_id="")
    assert Task.objects.filter(batch=batch, external_id="").count() == 3


# --- trajectories -------------------------------------------------------------------------------


def test_trajectory_is_unique_per_task_iteration_and_sample(make_task: Any) -> None:
    task = make_task()
    Trajectory.objects.create(task=task, iteration=1, sample_index=0)
    _refused(lambda: Trajectory.objects.create(task=task, iteration=1, sample_index=0))
    Trajectory.objects.create(task=task, iteration=1, sample_index=1)
    Trajectory.objects.create(task=task, iteration=2, sample_index=0)
    assert task.trajectories.count() == 3


def test_trajectory_iteration_starts_at_1(make_task: Any) -> None:
    _refused(lambda: Trajectory.objects.create(task=make_task(), iteration=0))


def test_finished_trajectory_needs_an_outcome(make_task: Any) -> None:
    _refused(lambda: Trajectory.objects.create(task=make_task(), iteration=1, status="finished", outcome=""))


@pytest.mark.parametrize("status", ["queued", "running", "cancelled"])
def test_unfinished_trajectory_has_no_outcome(make_task: Any, status: str) -> None:
    _refused(lambda: Trajectory.objects.create(task=make_task(), iteration=1, status=status, outcome="success"))


@pytest.mark.parametrize("outcome", ["success", "failure", "error"])
def test_finished_trajectory_with_an_outcome_is_accepted(make_task: Any, outcome: str) -> None:
    t = Trajectory.objects.create(task=make_task(), iteration=1, status="finished", outcome=outcome)
    assert Trajectory.objects.get(pk=t.pk).outcome == outcome


def test_content_hash_is_computed_on_save(make_task: Any) -> None:
    t = Trajectory.objects.create(task=make_task(), iteration=1, messages=[{"role": "user", "content": "hi"}])
    stored = Trajectory.objects.get(pk=t.pk).content_sha256
    assert len(stored) == 64
    assert stored == t.compute_content_sha256() == content_sha256(t.content())
    t.final_answer = "42"
    t.save()
    assert Trajectory.objects.get(pk=t.pk).content_sha256 == t.compute_content_sha256() != stored


def test_content_hash_ignores_bookkeeping_fields(make_task: Any) -> None:
    t = Trajectory.objects.create(task=make_task(), iteration=1, messages=[{"role": "user", "content": "hi"}])
    before = t.content_sha256
    t.worker, t.prompt_tokens = "worker-7", 99
    t.save()
    assert Trajectory.objects.get(pk=t.pk).content_sha256 == before


def test_update_fields_with_messages_also_updates_the_hash(make_task: Any) -> None:
    t = Trajectory.objects.create(task=make_task(), iteration=1)
    empty = t.content_sha256
    t.messages = [{"role": "assistant", "content": "done"}]
    t.save(update_fields=["messages"])
    stored = Trajectory.objects.get(pk=t.pk)
    assert stored.messages == [{"role": "assistant", "content": "done"}]
    assert stored.content_sha256 == stored.compute_content_sha256() != empty


def test_content_hash_is_canonical_json() -> None:
    assert content_sha256({"b": 1, "a": [1, "é"]}) == content_sha256({"a": [1, "é"], "b": 1})
    # sha256 of '{"a":[1,"é"],"b":1}' in UTF-8: sorted keys, no whitespace, no ASCII escaping.
    import hashlib

    assert content_sha256({"b": 1, "a": [1, "é"]}) == hashlib.sha256('{"a":[1,"é"],"b":1}'.encode()).hexdigest()


# --- reviews and proposals ----------------------------------------------------------------------


@pytest.fixture
def trajectory(make_task: Any) -> Trajectory:
    return Trajectory.objects.create(task=make_task(), iteration=1, status="finished", outcome="success")


def test_human_review_needs_a_reviewer(trajectory: Trajectory, reviewer: Any) -> None:
    _refused(lambda: Review.objects.create(trajectory=trajectory, kind="human", status="done", overall=80))
    assert Review.objects.create(trajectory=trajectory, kind="human", reviewer=reviewer, overall=80).reviewer == reviewer


def test_automatic_review_needs_no_reviewer(trajectory: Trajectory) -> None:
    assert Review.objects.create(trajectory=trajectory, kind="auto", overall=50).reviewer is None


def test_judge_failed_review_carries_no_score(trajectory: Trajectory) -> None:
    _refused(lambda: Review.objects.create(trajectory=trajectory, kind="auto", status="judge_failed", overall=0))
    r = Review.objects.create(trajectory=trajectory, kind="auto", status="judge_failed", error="timeout")
    assert r.overall is None


@pytest.mark.parametrize("overall", [-1, 100.5])
def test_review_score_is_0_to_100(trajectory: Trajectory, overall: float) -> None:
    _refused(lambda: Review.objects.create(trajectory=trajectory, kind="auto", overall=overall))


def _proposal(task: Task, **fields: Any) -> Proposal:
    fields.setdefault("tier", "yellow")
    return Proposal.objects.create(task=task, iteration=1, field="temperature", proposer="review-agent", **fields)


@pytest.mark.parametrize("status", ["approved", "rejected"])
def test_decided_proposal_needs_decider_and_time(make_task: Any, approver: Any, status: str) -> None:
    task = make_task()
    _refused(lambda: _proposal(task, status=status))
    _refused(lambda: _proposal(task, status=status, decided_by=approver))
    _refused(lambda: _proposal(task, status=status, decided_at=timezone.now()))
    p = _proposal(task, status=status, decided_by=approver, decided_at=timezone.now())
    assert p.status == status


@pytest.mark.parametrize("tier", ["yellow", "red"])
def test_only_green_proposals_can_be_applied(make_task: Any, tier: str) -> None:
    task = make_task()
    _refused(lambda: _proposal(task, tier=tier, status="applied"))
    assert _proposal(task, tier="green", status="applied").status == "applied"


# --- dataset versions ---------------------------------------------------------------------------


@pytest.fixture
def draft(make_task: Any) -> DatasetVersion:
    dataset = Dataset.objects.create(name="code-sft")
    return DatasetVersion.objects.create(dataset=dataset, number=1)


def _trajectories(make_task: Any, n: int) -> list[Trajectory]:
    task = make_task()
    return [
        Trajectory.objects.create(task=task, iteration=1, sample_index=i, status="finished", outcome="success")
        for i in range(n)
    ]


def _publish(version: DatasetVersion) -> DatasetVersion:
    version.status = DatasetVersion.Status.PUBLISHED
    version.published_at = timezone.now()
    version.save()
    return version


def test_draft_can_be_edited_given_members_and_published(draft: DatasetVersion, make_task: Any) -> None:
    t1, t2 = _trajectories(make_task, 2)
    draft.notes = "first cut"
    draft.save()
    m1 = DatasetMember.objects.create(version=draft, position=0, trajectory=t1, content_sha256=t1.content_sha256)
    DatasetMember.objects.bulk_create([DatasetMember(version=draft, position=1, trajectory=t2, content_sha256="x")])
    m1.split = "validation"
    m1.save()
    DatasetMember.objects.filter(version=draft, position=1).update(content_sha256=t2.content_sha256)

    _publish(draft)

    stored = DatasetVersion.objects.get(pk=draft.pk)
    assert (stored.status, stored.notes, stored.members.count()) == ("published", "first cut", 2)


def test_published_without_a_time_is_refused(draft: DatasetVersion) -> None:
    draft.status = DatasetVersion.Status.PUBLISHED
    _refused(draft.save)


def test_version_numbers_are_unique_per_dataset(draft: DatasetVersion) -> None:
    _refused(lambda: DatasetVersion.objects.create(dataset=draft.dataset, number=1))


@pytest.fixture
def published(draft: DatasetVersion, make_task: Any) -> DatasetVersion:
    (t,) = _trajectories(make_task, 1)
    DatasetMember.objects.create(version=draft, position=0, trajectory=t, content_sha256=t.content_sha256)
    return _publish(draft)


def test_published_version_cannot_be_saved(published: DatasetVersion) -> None:
    published.notes = "sneaky"
    with pytest.raises(ImmutableVersionError):
        published.save()
    assert DatasetVersion.objects.get(pk=published.pk).notes == ""


def test_stale_draft_copy_cannot_overwrite_a_published_version(published: DatasetVersion) -> None:
    stale = DatasetVersion.objects.get(pk=published.pk)
    stale.status = DatasetVersion.Status.DRAFT
    with pytest.raises(ImmutableVersionError):
        stale.save()
    assert DatasetVersion.objects.get(pk=published.pk).is_published


def test_published_version_cannot_be_deleted(published: DatasetVersion) -> None:
    with pytest.raises(ImmutableVersionError):
        published.delete()
    with pytest.raises(ImmutableVersionError):
        DatasetVersion.objects.filter(pk=published.pk).delete()
    assert DatasetVersion.objects.filter(pk=published.pk).exists()


def test_published_version_cannot_be_updated_through_a_queryset(published: DatasetVersion) -> None:
    with pytest.raises(ImmutableVersionError):
        DatasetVersion.objects.filter(pk=published.pk).update(notes="sneaky")
    with pytest.raises(ImmutableVersionError):
        DatasetVersion.objects.all().update(notes="sneaky")
    assert DatasetVersion.objects.get(pk=published.pk).notes == ""


def test_drafts_next_to_a_published_version_stay_editable(published: DatasetVersion) -> None:
    other = DatasetVersion.objects.create(dataset=published.dataset, number=2)
    assert DatasetVersion.objects.filter(status="draft").update(notes="next") == 1
    other.refresh_from_db()
    assert other.notes == "next"
    DatasetVersion.objects.filter(pk=other.pk).delete()
    assert list(DatasetVersion.objects.values_list("pk", flat=True)) == [published.pk]


def test_members_of_a_published_version_cannot_be_added(published: DatasetVersion, make_task: Any) -> None:
    (t,) = _trajectories(make_task, 1)
    with pytest.raises(ImmutableVersionError):
        DatasetMember.objects.create(version=published, position=1, trajectory=t, content_sha256=t.content_sha256)
    with pytest.raises(ImmutableVersionError):
        DatasetMember.objects.bulk_create(
            [DatasetMember(version=published, position=1, trajectory=t, content_sha256=t.content_sha256)]
        )
    assert published.members.count() == 1


def test_members_of_a_published_version_cannot_be_changed_or_deleted(published: DatasetVersion) -> None:
    member = published.members.get()
    member.split = "validation"
    with pytest.raises(ImmutableVersionError):
        member.save()
    with pytest.raises(ImmutableVersionError):
        member.delete()
    with pytest.raises(ImmutableVersionError):
        DatasetMember.objects.filter(pk=member.pk).update(split="validation")
    with pytest.raises(ImmutableVersionError):
        DatasetMember.objects.filter(version=published).delete()
    stored = DatasetMember.objects.get(pk=member.pk)
    assert stored.split == "train"
