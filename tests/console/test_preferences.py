"""Side by side and preferences (issue 28, item 4): all rollouts of a task next to each other, a
"prefer A over B" action, and recorded preferences feeding the DPO exporters ahead of automatic
pairing with the reviewer and time in the pair's metadata."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.reviews.models import Preference
from apps.reviews.services import preference_record
from tests.datasets.exporter_data import make_review
from tests.datasets.test_exporters import PROMPT, _calls, _rollout, export
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def three(make_task):
    task = make_task(prompt=PROMPT)
    return task, [_rollout(task, 0, reward=1.0), _rollout(task, 1, reward=0.9),
                  _rollout(task, 2, outcome="failure", reward=0.0)]


def test_the_side_by_side_page_shows_every_rollout_and_records_a_pick(client, reviewer, three):
    task, (a, b, c) = three
    make_review(a, overall=88)
    client.force_login(reviewer)
    html = client.get(reverse("reviews:compare", args=[task.pk])).content.decode()
    assert all(f'id="rollout-{t.pk}"' in html for t in (a, b, c)) and ">88<" in html and 'id="prefer-form"' in html
    response = client.post(reverse("reviews:prefer", args=[task.pk]), {"decision": "a", "a": b.pk, "b": a.pk,
                                                                       "note": "b explains its steps"}, follow=True)
    assert f"#{b.pk} preferred over #{a.pk}" in response.content.decode()
    pick = Preference.objects.get()
    assert (pick.chosen_id, pick.rejected_id, pick.reviewer, pick.note) == (b.pk, a.pk, reviewer, "b explains its steps")
    assert AuditEvent.objects.filter(action="reviews.preference", actor=reviewer).count() == 1
    # the same pick again: no second row, no second audit row
    client.post(reverse("reviews:prefer", args=[task.pk]), {"decision": "a", "a": b.pk, "b": a.pk,
                                                            "note": "b explains its steps"})
    assert Preference.objects.count() == 1 and AuditEvent.objects.filter(action="reviews.preference").count() == 1


def test_bad_picks_are_refused_and_write_nothing(client, reviewer, viewer, three, make_task):
    task, (a, b, _c) = three
    other = _rollout(make_task(prompt="another task"), 0)
    client.force_login(reviewer)
    for data in ({"decision": "a", "a": a.pk}, {"decision": "a", "a": a.pk, "b": a.pk},
                 {"decision": "b", "a": a.pk, "b": other.pk}, {"decision": "a", "a": "x", "b": "9" * 30},
                 {"a": a.pk, "b": b.pk}, {"chosen": a.pk, "rejected": b.pk}):
        response = client.post(reverse("reviews:prefer", args=[task.pk]), data, follow=True)
        assert response.status_code == 200 and "messages" in response.content.decode()
    with pytest.raises(ValidationError, match="one task"):
        preference_record(chosen=a, rejected=other, actor=reviewer)
    client.force_login(viewer)
    assert client.post(reverse("reviews:prefer", args=[task.pk]), {"decision": "a", "a": a.pk, "b": b.pk}).status_code == 403
    assert not Preference.objects.exists()


def test_a_recorded_preference_is_the_dpo_pair_with_its_reviewer_and_time(three, reviewer):
    task, (a, b, c) = three
    ids = [a.pk, b.pk, c.pk]
    _, (auto_line,), _ = export("dpo-trl", ids)
    assert _calls(auto_line["chosen"])[0].startswith("i1s0_") and "metadata" not in auto_line  # automatic: a over c
    pick = preference_record(chosen=b, rejected=a, actor=reviewer)  # a margin of 0.1: never paired automatically
    result, (line,), _ = export("dpo-trl", ids)
    assert _calls(line["chosen"])[0].startswith("i1s1_") and _calls(line["rejected"])[0].startswith("i1s0_")
    assert line["metadata"]["preference"] == {"reviewer": reviewer.username, "at": pick.created_at.isoformat(),
                                              "chosen": b.pk, "rejected": a.pk}
    assert [e["trajectory_id"] for e in result.excluded] == [c.pk]
    _, (openai_line,), _ = export("dpo-openai", ids)
    assert "metadata" not in openai_line and _calls(openai_line["preferred_output"])[0].startswith("i1s1_")
