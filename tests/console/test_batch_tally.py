"""The batch tallies (apps.reviews.tallies): the workers' count of a batch's spend, accepted
trajectories and human review progress equals the exact selectors' on a small fill, the pages read
it and say when it was counted, and the job is scheduled beside the overview's activity job. It
recounts only the batches the database triggers marked changed (inserts, deletes, updates of the
columns a tally reads, whoever wrote them) and every batch with full=True (`refresh_tallies --full`)."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from apps.reviews import selectors
from apps.reviews.models import BatchChange, BatchTally, Review
from apps.reviews.services import human_verdict_record
from apps.reviews.tallies import BATCH_TALLY_JOB, BATCH_TALLY_SCHEDULE, refresh_batch_tallies
from apps.tasks.models import Batch, Task, Trajectory
from trajplatform.schedules import ensure_periodic

pytestmark = pytest.mark.django_db


@pytest.fixture
def fill(awaiting, reviewer):
    """Two batches: 'big' with 5 awaiting items (costs, judge costs, two human verdicts, a failure)
    and 'small' with one; the exact counts are the selectors'."""
    big, small = Batch.objects.create(name="big", budget_usd=Decimal("10")), Batch.objects.create(name="small")
    items = awaiting(5, score=40, batch=big)
    for i, trajectory in enumerate(items):
        Trajectory.objects.filter(pk=trajectory.pk).update(cost_usd=Decimal("0.25") * (i + 1))
    Trajectory.objects.filter(pk=items[4].pk).update(outcome="failure", outcome_reason="verifier failed", reward=0.0)
    items[0].reviews.filter(kind="auto").update(cost_usd=Decimal("0.01"))
    human_verdict_record(trajectory=items[0], actor=reviewer, verdict="accept", reason="")
    human_verdict_record(trajectory=items[1], actor=reviewer, verdict="reject", reason="wrong file")
    awaiting(1, score=40, batch=small)
    return big, small, items


def exact(batch):
    return selectors.batch_spend(batch), selectors.batch_review_progress(batch.pk)


def test_the_tally_equals_the_exact_counts(fill):
    big, small, _items = fill
    moment = timezone.now() - timedelta(minutes=1)
    assert refresh_batch_tallies(now=moment) == 2
    for batch in (big, small):
        tally = selectors.batch_tally(batch.pk)
        spend, review = exact(batch)
        assert selectors.tally_spend(batch, tally) == {**spend, "computed_at": moment}
        assert selectors.tally_review_progress(tally) == {**review, "computed_at": moment}
    spend, review = exact(big)
    # 0.25+0.50+0.75+1.00+1.25 = 3.75 plus the judge's 0.01; accepted: the human accept and the two
    # unreviewed successes (the rejected one and the failure are not); reviewed: the two verdicts.
    assert (spend["spent_usd"], spend["judge_usd"], spend["accepted"]) == ("3.760000", "0.010000", 3)
    assert (review["total"], review["done"], review["left"]) == (5, 2, 3)


def test_a_later_run_recounts_what_changed(fill, reviewer):
    big, _small, items = fill
    refresh_batch_tallies()
    human_verdict_record(trajectory=items[2], actor=reviewer, verdict="reject", reason="no")
    assert selectors.batch_tally(big.pk).review_done == 2  # as of the last run
    refresh_batch_tallies()
    tally = selectors.batch_tally(big.pk)
    assert (tally.review_done, tally.accepted) == (3, 2) == (exact(big)[1]["done"], exact(big)[0]["accepted"])
    assert BatchTally.objects.count() == 2


def test_the_pages_read_the_tally_and_say_when(client, approver, fill):
    big, _small, _items = fill
    client.force_login(approver)
    batch_page, queue = f"/review/batches/{big.pk}/", reverse("reviews:work")
    assert "not counted yet" in client.get(batch_page).content.decode()
    assert "progress is not counted yet" in client.get(queue, {"batch": "big"}).content.decode()
    refresh_batch_tallies(now=timezone.now().replace(hour=9, minute=41))
    html = client.get(batch_page).content.decode()
    assert "Spent $3.760000 (the judge $0.010000) of a $10.000000 budget" in html
    assert "3 accepted trajectories, $1.253333 per accepted trajectory" in html and " 09:41 " in html
    html = client.get(queue, {"batch": "big"}).content.decode()
    assert "<strong>2</strong> of 5 reviewed, 3 left, as of 09:41" in html


def test_the_pages_queries_do_not_grow_with_the_batch(client, approver, awaiting):
    client.force_login(approver)
    counts = []
    for n in (2, 12):
        batch = awaiting(n, score=40)[0].task.batch
        refresh_batch_tallies()
        with CaptureQueriesContext(connection) as queries:
            assert client.get(f"/review/batches/{batch.pk}/").status_code == 200
            assert client.get(reverse("reviews:work"), {"batch": batch.name}).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_the_tally_job_is_scheduled_after_migrate():
    Schedule.objects.filter(name=BATCH_TALLY_SCHEDULE).delete()
    ensure_periodic()
    schedule = Schedule.objects.get(name=BATCH_TALLY_SCHEDULE)
    assert (schedule.func, schedule.minutes, schedule.repeats) == (BATCH_TALLY_JOB, 5, -1)


def test_the_tallies_are_view_only_in_the_admin(client, make_user, fill):
    refresh_batch_tallies()
    client.force_login(make_user("admin", is_superuser=True))
    changelist = client.get("/admin/reviews/batchtally/")
    assert changelist.status_code == 200 and "3.760000" in changelist.content.decode()
    row = BatchTally.objects.get(batch__name="big")
    assert client.get(f"/admin/reviews/batchtally/{row.pk}/change/").status_code == 200
    assert client.post(f"/admin/reviews/batchtally/{row.pk}/change/", {"accepted": 99}).status_code == 403
    assert client.get("/admin/reviews/batchtally/add/").status_code == 403
    row.refresh_from_db()
    assert row.accepted == 3


# -- incremental: only the batches whose inputs changed are recounted (BatchChange, migration 0011) --


def counted_at(batch):
    return BatchTally.objects.get(batch=batch).computed_at


def test_only_a_changed_batch_is_recounted(fill, reviewer):
    big, small, items = fill
    first = timezone.now() - timedelta(minutes=10)
    assert refresh_batch_tallies(now=first) == 2
    assert BatchChange.objects.count() == 0  # the marks it read are gone
    with CaptureQueriesContext(connection) as queries:
        assert refresh_batch_tallies() == 0  # nothing changed: no batch recounted
    assert len(queries) <= 2 and counted_at(big) == counted_at(small) == first
    human_verdict_record(trajectory=items[2], actor=reviewer, verdict="accept", reason="")  # after the count
    assert set(BatchChange.objects.values_list("batch_id", flat=True)) == {big.pk}
    assert refresh_batch_tallies() == 1
    assert counted_at(small) == first and counted_at(big) > first
    assert selectors.tally_review_progress(selectors.batch_tally(big.pk))["done"] == exact(big)[1]["done"] == 3


def test_writes_that_bypass_the_services_mark_their_batch(fill):
    big, small, items = fill
    refresh_batch_tallies()
    Trajectory.objects.filter(pk=items[3].pk).update(heartbeat_at=timezone.now())  # a column no tally reads
    assert refresh_batch_tallies() == 0
    Trajectory.objects.filter(pk=items[3].pk).update(cost_usd=Decimal("2"))  # a job's update(): no service
    assert refresh_batch_tallies() == 1
    assert selectors.batch_tally(big.pk).spent_usd == Decimal(exact(big)[0]["spent_usd"]) == Decimal("4.76")
    Task.objects.filter(batch=small).update(current_iteration=2)  # its trajectories leave the queue
    assert refresh_batch_tallies() == 1
    assert selectors.batch_tally(small.pk).review_total == exact(small)[1]["total"] == 0


def test_deleting_verdicts_and_trajectories_is_recounted(fill):
    big, small, items = fill
    refresh_batch_tallies()
    Review.objects.filter(trajectory=items[0], kind="human").delete()
    assert refresh_batch_tallies() == 1
    tally = selectors.batch_tally(big.pk)
    # item 0 is an unreviewed success again: still accepted
    assert (tally.review_done, tally.accepted) == (1, 3) == (exact(big)[1]["done"], exact(big)[0]["accepted"])
    items[4].delete()  # with its automatic review (the collector deletes it first)
    assert refresh_batch_tallies() == 1
    tally = selectors.batch_tally(big.pk)
    assert (tally.review_total, tally.spent_usd) == (4, Decimal("2.51")) == (
        exact(big)[1]["total"], Decimal(exact(big)[0]["spent_usd"]))
    assert selectors.batch_tally(small.pk).review_total == 1


def test_a_new_batch_is_counted_and_full_recounts_every_batch(fill, awaiting):
    big, small, _items = fill
    refresh_batch_tallies()
    BatchChange.objects.all().delete()  # as if its marks were lost: only full sees the change now
    newer = Batch.objects.create(name="newer")
    assert refresh_batch_tallies() == 1 and selectors.batch_tally(newer.pk).review_total == 0
    Trajectory.objects.filter(task__batch=big).update(cost_usd=0)
    BatchChange.objects.all().delete()
    assert refresh_batch_tallies() == 0
    assert refresh_batch_tallies(full=True) == 3
    assert selectors.batch_tally(big.pk).spent_usd == Decimal("0.01")


def test_the_command_recounts_changed_or_every_batch(fill):
    out = StringIO()
    call_command("refresh_tallies", stdout=out)
    assert "Recounted 2 batch tally(ies): the batches changed since their last count" in out.getvalue()
    assert "team tally of" in out.getvalue()
    out = StringIO()
    call_command("refresh_tallies", "--no-team", stdout=out)
    assert "Recounted 0 batch tally(ies)" in out.getvalue() and "team" not in out.getvalue()
    out = StringIO()
    call_command("refresh_tallies", "--full", "--no-team", stdout=out)
    assert "Recounted 2 batch tally(ies): every batch" in out.getvalue()
