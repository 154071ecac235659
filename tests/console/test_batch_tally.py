"""The batch tallies (apps.reviews.tallies): the workers' count of a batch's spend, accepted
trajectories and human review progress equals the exact selectors' on a small fill, the pages read
it and say when it was counted, and the job is scheduled beside the overview's activity job."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from apps.reviews import selectors
from apps.reviews.models import BatchTally
from apps.reviews.services import human_verdict_record
from apps.reviews.tallies import BATCH_TALLY_JOB, BATCH_TALLY_SCHEDULE, refresh_batch_tallies
from apps.tasks.models import Batch, Trajectory
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
