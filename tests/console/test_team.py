"""The team page /review/team/ (issue 40): per reviewer, verdicts per day and week, the acceptance
rate, agreement with the judge (Cohen's kappa, selectors.cohen_kappa) as the team tally job last
counted them (apps.reviews.tallies.refresh_team_tally, the page says when), open and done
assignments and held claims as of now; a constant number of queries whatever the team's size."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from apps.reviews import queue_actions, selectors, services
from apps.reviews.models import Review, ReviewerTally
from apps.reviews.tallies import TEAM_TALLY_JOB, TEAM_TALLY_SCHEDULE, refresh_team_tally
from trajplatform.schedules import ensure_periodic

pytestmark = pytest.mark.django_db


def row(html: str, username: str) -> str:
    return html.split(f'data-reviewer="{username}"')[1].split("</tr>")[0]


def cell(html: str, username: str, column: str) -> str:
    return row(html, username).split(f'data-col="{column}">')[1].split("</td>")[0]


def test_the_team_page_counts_throughput_acceptance_agreement_and_assignments(
        client, awaiting, make_user, approver, viewer, settings):
    settings.REVIEW_QUALITY_THRESHOLD = 80
    settings.REVIEW_AUDIT_SHARE = 1.0
    alice, bob = make_user("reviewer", username="alice"), make_user("reviewer", username="bob")
    make_user("reviewer", username="carol")  # on the team, nothing decided yet
    low = awaiting(3, score=40)   # the judge rejects these
    high = awaiting(2, score=95)  # and accepts these (the audit sample)
    # alice agrees with the judge on all five: kappa 1
    for t in low:
        services.human_verdict_record(trajectory=t, actor=alice, verdict="reject", reason="no")
    for t in high:
        services.human_verdict_record(trajectory=t, actor=alice, verdict="accept", reason="")
    # bob accepts everything the judge rejected: agreement 0 of 3, kappa 0 (no better than chance)
    for t in low:
        services.human_verdict_record(trajectory=t, actor=bob, verdict="accept", reason="")
    # one of alice's verdicts was two days ago; a changed verdict counts once for agreement (the latest)
    Review.objects.filter(reviewer=alice, trajectory=low[0]).update(created_at=timezone.now() - timedelta(days=2))
    services.human_verdict_record(trajectory=low[1], actor=alice, verdict="needs_fix", reason="almost")
    extra = awaiting(2)
    for t in extra:
        queue_actions.review_assign(trajectory=t, assignee=bob, actor=approver)
    services.review_claim(trajectory=extra[0], actor=bob)

    client.force_login(viewer)
    html = client.get(reverse("reviews:team")).content.decode()
    assert "Verdicts, acceptance and agreement not counted yet" in html
    assert cell(html, "alice", "total") == "0" and 'href="/review/work/?assigned=bob">2</a>' in cell(html, "bob", "open")
    refresh_team_tally(now=timezone.now().replace(hour=9, minute=41))
    html = client.get(reverse("reviews:team")).content.decode()
    assert "Verdicts, acceptance and agreement as of " in html and " 09:41 " in html
    assert [cell(html, "alice", c) for c in ("today", "week", "total")] == ["5", "6", "6"]
    assert cell(html, "alice", "acceptance") == "33%"  # 2 accepts of 6 verdicts
    assert cell(html, "alice", "agreement") == "100% of 5" and cell(html, "alice", "kappa") == "1.00"
    assert [cell(html, "bob", c) for c in ("total", "acceptance", "agreement", "kappa")] == \
        ["3", "100%", "0% of 3", "0.00"]
    assert 'href="/review/work/?assigned=bob">2</a>' in cell(html, "bob", "open")
    assert cell(html, "bob", "claims") == "1" and cell(html, "carol", "total") == "0"
    bars = row(html, "alice").split('class="day-bars"')[1]
    assert bars.count("<span") == selectors.TEAM_DAYS
    rows, dates, _counted_at = selectors.team()
    by_name = {r.username: r for r in rows}
    assert by_name["alice"].per_day[-1] == 5 and by_name["alice"].per_day[-3] == 1 and dates[-1] == timezone.localdate()
    assert by_name["alice"].kappa == selectors.cohen_kappa([(False, False)] * 3 + [(True, True)] * 2)


def test_the_team_page_reads_a_constant_number_of_queries(client, awaiting, make_user, approver, viewer):
    client.force_login(viewer)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("reviews:team")).status_code == 200
        return len(captured)

    def team(n: int) -> None:
        items = awaiting(n)
        for i, item in enumerate(items):
            person = make_user("reviewer")
            services.human_verdict_record(trajectory=item, actor=person, verdict="accept", reason="")
            queue_actions.review_assign(trajectory=awaiting(1)[0], assignee=person, actor=approver)

    team(2)
    refresh_team_tally()
    small = queries()
    team(12)
    refresh_team_tally()
    assert queries() == small <= 10


def test_the_team_page_needs_the_viewer_role(client, make_user):
    client.force_login(make_user(None))
    assert client.get(reverse("reviews:team")).status_code == 403


def test_a_verdict_counts_on_the_page_after_the_next_tally(client, awaiting, make_user, viewer):
    alice = make_user("reviewer", username="alice")
    items = awaiting(2)
    services.human_verdict_record(trajectory=items[0], actor=alice, verdict="accept", reason="")
    refresh_team_tally()
    client.force_login(viewer)
    services.human_verdict_record(trajectory=items[1], actor=alice, verdict="reject", reason="no")
    html = client.get(reverse("reviews:team")).content.decode()
    assert cell(html, "alice", "total") == "1" and cell(html, "alice", "acceptance") == "100%"  # as of the tally
    refresh_team_tally()
    html = client.get(reverse("reviews:team")).content.decode()
    assert cell(html, "alice", "total") == "2" and cell(html, "alice", "acceptance") == "50%"


def test_the_team_tally_equals_the_exact_count_and_drops_people_without_verdicts(awaiting, make_user):
    alice, bob = make_user("reviewer", username="alice"), make_user("reviewer", username="bob")
    item = awaiting(1)[0]
    services.human_verdict_record(trajectory=item, actor=alice, verdict="accept", reason="")
    services.human_verdict_record(trajectory=item, actor=bob, verdict="reject", reason="no")
    bob.groups.clear()  # left the team since: counted for their verdicts, not as a reviewer
    assert refresh_team_tally() == 2
    exact = selectors.team_counts()
    for person in (alice, bob):
        tally = ReviewerTally.objects.get(reviewer=person)
        assert (tally.total, tally.accepts, tally.per_day, tally.both_reject, tally.human_accepts_only) == (
            exact[person.pk].total, exact[person.pk].accepts, exact[person.pk].per_day,
            exact[person.pk].both_reject, exact[person.pk].human_accepts_only)
    assert ReviewerTally.objects.get(reviewer=alice).human_accepts_only == 1  # the judge scored 60: below 80
    Review.objects.filter(reviewer=bob).delete()
    assert refresh_team_tally() == 1
    assert list(ReviewerTally.objects.values_list("reviewer__username", flat=True)) == ["alice"]


def test_the_team_tally_job_is_scheduled_after_migrate():
    Schedule.objects.filter(name=TEAM_TALLY_SCHEDULE).delete()
    ensure_periodic()
    schedule = Schedule.objects.get(name=TEAM_TALLY_SCHEDULE)
    assert (schedule.func, schedule.minutes, schedule.repeats) == (TEAM_TALLY_JOB, 5, -1)
