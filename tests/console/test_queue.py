"""The human review queue (issue 28, item 2): claims with a reservation timeout, reviewers per
item, next, sampled audit of auto-accepted trajectories, progress; accept needs no reason."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse
from django.utils import timezone

from apps.reviews import selectors, services
from apps.reviews.models import Review, ReviewClaim
from apps.reviews.tallies import refresh_batch_tallies
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_the_queue_holds_what_the_judge_did_not_accept_and_a_sampled_audit(awaiting, settings):
    settings.REVIEW_AUDIT_SHARE = 0.0
    below = awaiting(2, score=60)
    accepted = awaiting(20, score=95)
    failed = awaiting(1, score=None)
    ids = set(selectors.human_queue().values_list("pk", flat=True))
    assert ids == {t.pk for t in below + failed}
    settings.REVIEW_AUDIT_SHARE = 1.0
    assert set(selectors.human_queue().values_list("pk", flat=True)) == {t.pk for t in below + accepted + failed}
    settings.REVIEW_AUDIT_SHARE = 0.5
    sampled = selectors.human_queue(judge="accepted")
    assert 0 < sampled.count() < 20 and all(t.audit for t in sampled)


def test_claim_reserves_an_item_and_a_second_reviewer_is_refused(awaiting, make_user):
    (item,) = awaiting(1)
    first, second = make_user("reviewer"), make_user("reviewer")
    claim = services.review_claim(trajectory=item, actor=first)
    assert claim.status == "active" and claim.expires_at > timezone.now() + timedelta(minutes=29)
    assert services.review_claim(trajectory=item, actor=first).pk == claim.pk  # own claim: no second row
    with pytest.raises(services.ClaimError, match=f"claimed by {first.username} until"):
        services.review_claim(trajectory=item, actor=second)
    assert ReviewClaim.objects.count() == 1
    assert AuditEvent.objects.filter(action="reviews.claim").count() == 1
    assert services.review_claim_next(actor=second, queue=selectors.human_queue(reviewer=second)) is None


def test_an_expired_claim_frees_the_item(awaiting, make_user):
    (item,) = awaiting(1)
    first, second = make_user("reviewer"), make_user("reviewer")
    old = services.review_claim(trajectory=item, actor=first)
    ReviewClaim.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    taken = services.review_claim(trajectory=item, actor=second)
    old.refresh_from_db()
    assert (old.status, taken.reviewer_id) == ("expired", second.pk)
    assert AuditEvent.objects.filter(action="reviews.claim").order_by("id").last().data["expired_claims"] == [old.pk]


def test_two_reviewers_per_item(awaiting, make_user, settings):
    settings.REVIEW_REVIEWERS_PER_ITEM = 2
    (item,) = awaiting(1)
    a, b, c = make_user("reviewer"), make_user("reviewer"), make_user("reviewer")
    services.review_claim(trajectory=item, actor=a)
    services.review_claim(trajectory=item, actor=b)
    with pytest.raises(services.ClaimError, match="claimed by"):
        services.review_claim(trajectory=item, actor=c)
    services.human_verdict_record(trajectory=item, actor=a, verdict="accept", reason="")
    assert selectors.human_queue().get().verdicts == 1  # still waiting for its second verdict
    services.human_verdict_record(trajectory=item, actor=b, verdict="reject", reason="wrong file")
    assert not selectors.human_queue().exists()
    assert set(ReviewClaim.objects.values_list("status", flat=True)) == {"done"}


def test_a_reviewer_who_judged_an_item_cannot_claim_it_again(awaiting, make_user, settings):
    settings.REVIEW_REVIEWERS_PER_ITEM = 2
    (item,) = awaiting(1)
    reviewer = make_user("reviewer")
    services.human_verdict_record(trajectory=item, actor=reviewer, verdict="accept", reason="")
    with pytest.raises(services.ClaimError, match="already gave a verdict"):
        services.review_claim(trajectory=item, actor=reviewer)
    assert not selectors.human_queue(reviewer=reviewer).exists()


def test_viewers_cannot_claim(awaiting, viewer):
    (item,) = awaiting(1)
    with pytest.raises(PermissionDenied, match="reviewer role"):
        services.review_claim(trajectory=item, actor=viewer)


def test_accept_needs_no_reason_reject_and_needs_fix_do(awaiting, reviewer):
    item, other = awaiting(2)
    review = services.human_verdict_record(trajectory=item, actor=reviewer, verdict="accept", reason="")
    assert (review.verdict, review.rationale) == ("accept", "")
    for verdict in ("reject", "needs_fix"):
        with pytest.raises(ValidationError, match="give a reason"):
            services.human_verdict_record(trajectory=other, actor=reviewer, verdict=verdict, reason=" ")
    assert not Review.objects.filter(trajectory=other, kind="human").exists()


def test_a_reviewer_works_through_the_queue_with_next(client, awaiting, reviewer):
    items = awaiting(3)
    client.force_login(reviewer)
    page = client.get(reverse("reviews:work"))
    assert page.status_code == 200 and all(f'id="item-{t.pk}"' in page.content.decode() for t in items)
    response = client.post(reverse("reviews:work_next"), {"queue": ""})
    assert response.url == reverse("reviews:trajectory", args=[items[0].pk]) + "?queue="
    html = client.get(response.url).content.decode()
    assert 'id="queuebar"' in html and "data-verdict-form" in html and "checked" not in html.split("verdict-choices")[1][:600]
    # accept: no reason; the verdict opens the next item
    response = client.post(reverse("reviews:verdict", args=[items[0].pk]), {"verdict": "accept", "queue": ""})
    assert response.url == reverse("reviews:trajectory", args=[items[1].pk]) + "?queue="
    # reject without a reason stays on the item, with the reason why
    response = client.post(reverse("reviews:verdict", args=[items[1].pk]), {"verdict": "reject", "queue": ""}, follow=True)
    assert "give a reason" in response.content.decode()
    assert ReviewClaim.objects.get(trajectory=items[1]).status == "active"
    # skip: released, the next one opens, the skipped one is not offered again right away
    response = client.post(reverse("reviews:release", args=[items[1].pk]), {"queue": "", "then": "next"})
    assert response.url == reverse("reviews:trajectory", args=[items[2].pk]) + "?queue="
    response = client.post(reverse("reviews:verdict", args=[items[2].pk]),
                           {"verdict": "needs_fix", "reason": "the test file is missing", "queue": ""}, follow=True)
    assert "Nothing left to review" in response.content.decode()
    assert selectors.reviewer_progress(reviewer) == {"total": 2, "today": 2}
    statuses = dict(ReviewClaim.objects.values_list("trajectory_id", "status"))
    assert statuses == {items[0].pk: "done", items[1].pk: "released", items[2].pk: "done"}


def test_the_queue_filters_by_batch_score_check_and_judge(client, awaiting, reviewer):
    low = awaiting(1, score=20)
    mid = awaiting(1, score=70, checks={"invalid_arguments": {"fired": True, "count": 2, "penalty": 5}})
    failed = awaiting(1, score=None)
    client.force_login(reviewer)

    def listed(**params):
        html = client.get(reverse("reviews:work"), params).content.decode()
        return {t.pk for t in low + mid + failed if f'id="item-{t.pk}"' in html}

    assert listed() == {low[0].pk, mid[0].pk, failed[0].pk}
    assert listed(score_min=50) == {mid[0].pk}
    assert listed(check="invalid_arguments") == {mid[0].pk}
    assert listed(judge="failed") == {failed[0].pk}
    assert listed(batch=low[0].task.batch.name) == {low[0].pk}
    page = client.get(reverse("reviews:work"), {"batch": low[0].task.batch.name}).content.decode()
    assert "This batch's progress is not counted yet: the workers count it every 5 minutes." in page
    refresh_batch_tallies()  # the workers' job
    page = client.get(reverse("reviews:work"), {"batch": low[0].task.batch.name}).content.decode()
    assert 'id="batch-progress"' in page and "0</strong> of 1 reviewed, 1 left, as of " in page
    assert client.get(reverse("reviews:work"), {"score_min": "abc", "check": "<x>"}).status_code == 200


def test_claiming_an_item_someone_holds_says_who(client, awaiting, make_user):
    (item,) = awaiting(1)
    holder, other = make_user("reviewer"), make_user("reviewer")
    services.review_claim(trajectory=item, actor=holder)
    client.force_login(other)
    response = client.post(reverse("reviews:claim", args=[item.pk]), {"queue": ""}, follow=True)
    assert f"claimed by {holder.username}" in response.content.decode()
    html = client.get(reverse("reviews:trajectory", args=[item.pk])).content.decode()
    assert 'id="claimed-by"' in html and holder.username in html


def test_the_queue_page_does_not_query_per_row(client, awaiting, reviewer, django_assert_max_num_queries):
    awaiting(30)
    client.force_login(reviewer)
    with django_assert_max_num_queries(12):
        assert client.get(reverse("reviews:work")).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_claiming_at_once_get_one_claim(awaiting, make_user):
    """Both reviewers race for the only slot from their own connections: one claim, one refusal."""
    import threading

    from django.db import connection

    (item,) = awaiting(1)
    reviewers = [make_user("reviewer"), make_user("reviewer")]
    barrier, results = threading.Barrier(2), {}

    def claim(reviewer):
        try:
            barrier.wait()
            results[reviewer.pk] = services.review_claim(trajectory=item, actor=reviewer).pk
        except services.ClaimError as exc:
            results[reviewer.pk] = str(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(r,)) for r in reviewers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claims = ReviewClaim.objects.filter(trajectory=item, status="active")
    assert claims.count() == 1
    refused = [v for v in results.values() if isinstance(v, str)]
    assert len(refused) == 1 and "claimed by" in refused[0]
    assert AuditEvent.objects.filter(action="reviews.claim").count() == 1
