"""The team page /review/team/ (issue 40, item 4): per reviewer, verdicts per day and week, the
acceptance rate, agreement with the judge (Cohen's kappa, selectors.cohen_kappa), open and done
assignments, held claims; a constant number of queries whatever the team's size."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.reviews import queue_actions, selectors, services
from apps.reviews.models import Review

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
    assert [cell(html, "alice", c) for c in ("today", "week", "total")] == ["5", "6", "6"]
    assert cell(html, "alice", "acceptance") == "33%"  # 2 accepts of 6 verdicts
    assert cell(html, "alice", "agreement") == "100% of 5" and cell(html, "alice", "kappa") == "1.00"
    assert [cell(html, "bob", c) for c in ("total", "acceptance", "agreement", "kappa")] == \
        ["3", "100%", "0% of 3", "0.00"]
    assert 'href="/review/work/?assigned=bob">2</a>' in cell(html, "bob", "open")
    assert cell(html, "bob", "claims") == "1" and cell(html, "carol", "total") == "0"
    bars = row(html, "alice").split('class="day-bars"')[1]
    assert bars.count("<span") == selectors.TEAM_DAYS
    rows, dates = selectors.team()
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
    small = queries()
    team(12)
    assert queries() == small <= 10


def test_the_team_page_needs_the_viewer_role(client, make_user):
    client.force_login(make_user(None))
    assert client.get(reverse("reviews:team")).status_code == 403
