"""Judge-human agreement on a known example: rates and Cohen's kappa, per rubric dimension."""
from __future__ import annotations

import pytest
from django.urls import reverse

from apps.reviews.models import Review
from apps.reviews.selectors import cohen_kappa, judge_human_agreement
from tests.reviews.factories import auto_review, finished_trajectory

pytestmark = pytest.mark.django_db

# (judge overall, judge "reasoning", human verdict): the judge accepts at >= 80.
EXAMPLE = [
    (90, 90, "accept"), (85, 90, "accept"), (95, 90, "accept"), (80, 90, "accept"), (88, 90, "reject"),
    (50, 90, "needs_fix"), (60, 90, "reject"), (70, 90, "reject"), (20, 90, "needs_fix"), (79, 90, "accept"),
]


def test_cohen_kappa_by_hand():
    assert cohen_kappa([(True, True), (False, False)]) == 1.0
    assert cohen_kappa([(True, False), (False, True)]) == -1.0
    assert cohen_kappa([(True, True)] * 3) is None      # chance agreement 1: undefined
    assert cohen_kappa([]) is None


def test_agreement_per_dimension_on_a_known_example(make_task, make_user):
    task = make_task()
    first, second = make_user("reviewer"), make_user("reviewer")
    for i, (overall, reasoning, verdict) in enumerate(EXAMPLE):
        trajectory = finished_trajectory(task, sample=i)
        auto_review(trajectory, overall=overall, scores={
            "reasoning": {"score": reasoning, "rationale": ""}, "completeness": {"score": 100, "rationale": ""}})
        # An earlier, opposite verdict by someone else: only the latest counts.
        Review.objects.create(trajectory=trajectory, kind="human", status="done", reviewer=first, rationale="x",
                              verdict="reject" if verdict == "accept" else "accept")
        Review.objects.create(trajectory=trajectory, kind="human", status="done", reviewer=second, rationale="y",
                              verdict=verdict)
    auto_review(finished_trajectory(task, sample=99), overall=10)  # no human verdict: not a pair

    rows, verdicts = judge_human_agreement()
    table = {row.dimension: row for row in rows}
    assert verdicts == 2 * len(EXAMPLE)
    overall = table["overall"]
    # judge accepts 5 (90, 85, 95, 80, 88); humans accept 5; they agree on 8 of 10.
    assert (overall.pairs, overall.agree, overall.judge_accepts, overall.human_accepts) == (10, 8, 5, 5)
    assert overall.rate == pytest.approx(0.8) and overall.kappa == pytest.approx(0.6)
    reasoning = table["reasoning"]  # the judge accepts all 10: agreement 0.5, kappa 0
    assert reasoning.rate == pytest.approx(0.5) and reasoning.kappa == pytest.approx(0.0)
    assert table["completeness"].kappa == pytest.approx(0.0)
    assert list(table) == ["overall", "completeness", "reasoning"]


def test_the_agreement_page_shows_the_numbers(client, viewer, make_task, make_user):
    task = make_task()
    human = make_user("reviewer")
    for i, (overall, verdict) in enumerate([(90, "accept"), (30, "reject"), (85, "reject")]):
        trajectory = finished_trajectory(task, sample=i)
        auto_review(trajectory, overall=overall, scores={"tool_usage": {"score": overall, "rationale": ""}})
        Review.objects.create(trajectory=trajectory, kind="human", status="done", reviewer=human, rationale="r",
                              verdict=verdict)
    client.force_login(viewer)
    body = client.get(reverse("reviews:agreement")).content.decode()
    # 2 of 3 agree; judge accepts 2, human 1: po 2/3, pe 4/9, kappa (2/9)/(5/9) = 0.4
    assert '<tr data-dimension="overall"><td>overall</td><td class="num">3</td><td class="num">2</td>' in body
    assert "0.667" in body and "0.400" in body


def test_agreement_reads_the_latest_verdicts_of_its_window_and_the_page_says_so(client, viewer, make_task, make_user,
                                                                                        monkeypatch):
    task = make_task()
    human = make_user("reviewer")
    # Oldest first: two the judge and the human agree on, then one they disagree on, whose
    # trajectory is judged again later (its latest verdict, an accept, agrees).
    trajectories = [finished_trajectory(task, sample=i) for i in range(3)]
    for trajectory, overall in zip(trajectories, (90, 20, 90)):
        auto_review(trajectory, overall=overall)
    for trajectory, verdict in ((trajectories[0], "accept"), (trajectories[1], "reject"),
                                (trajectories[2], "reject"), (trajectories[2], "accept")):
        Review.objects.create(trajectory=trajectory, kind="human", status="done", reviewer=human, rationale="r",
                              verdict=verdict)

    def overall(window):
        rows, verdicts = judge_human_agreement(window=window)
        row = rows[0]
        return row.pairs, row.agree, verdicts

    assert overall(100) == (3, 3, 4)  # every verdict: the exact numbers
    assert overall(3) == (2, 2, 3)  # the latest three: trajectories 1 and 2 (its latest, the accept)
    assert overall(2) == (1, 1, 2)  # the latest two are both trajectory 2's: its latest counts
    client.force_login(viewer)
    body = client.get(reverse("reviews:agreement")).content.decode()
    assert "Over every human verdict (4)." in body
    monkeypatch.setattr("apps.reviews.selectors.AGREEMENT_WINDOW", 3)
    body = client.get(reverse("reviews:agreement")).content.decode()
    assert "Over the latest 3 human verdicts: older ones are not counted." in body
    assert '<tr data-dimension="overall"><td>overall</td><td class="num">2</td><td class="num">2</td>' in body
