"""Corrections (issue 28, item 5): a reviewer edits a trajectory (a thought, the final answer, a
dropped step); a new trajectory linked to the original holds the edits and the editor; the
original never changes."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.reviews.models import Correction
from apps.reviews.services import trajectory_correct
from apps.tasks.models import Trajectory
from tests.datasets.exporter_data import make_trajectory
from trajplatform.models import AuditEvent

pytestmark = pytest.mark.django_db

ORIGINAL_FIELDS = ("messages", "steps", "final_answer", "outcome", "reward", "status", "sample_index")


def _snapshot(t: Trajectory) -> dict:
    t.refresh_from_db()
    return {f: getattr(t, f) for f in ORIGINAL_FIELDS}


def test_a_correction_is_a_new_linked_trajectory_and_the_original_is_unchanged(client, reviewer, make_task):
    original = make_trajectory(make_task())
    before = _snapshot(original)
    first_call = original.steps[0]["tool_call_id"]
    client.force_login(reviewer)
    form = client.get(reverse("reviews:correct", args=[original.pk])).content.decode()
    assert 'id="correct-form"' in form and 'name="drop_1"' in form
    response = client.post(reverse("reviews:correct", args=[original.pk]), {
        "thought_1": "Now run the check.", "drop_0": "1", "final_answer": "2 3 5 7",
        "note": "the first listing was noise", **{f"thought_{i}": original.steps[i].get("thought") or ""
                                                for i in range(2, len(original.steps))}})
    correction = Correction.objects.get()
    corrected = correction.corrected
    assert response.url == reverse("reviews:trajectory", args=[corrected.pk])
    assert _snapshot(original) == before  # never changed
    assert (corrected.task_id, corrected.iteration, corrected.status) == (original.task_id, 1, "finished")
    assert corrected.sample_index == original.sample_index + 1 and corrected.uuid != original.uuid
    assert len(corrected.steps) == len(original.steps) - 1 and corrected.steps[0]["thought"] == "Now run the check."
    assert [s["index"] for s in corrected.steps] == list(range(len(corrected.steps)))
    assert corrected.final_answer == "2 3 5 7"
    # the dropped call and its result are gone from the messages; the edited thought is the reply's text
    ids = [c["id"] for m in corrected.messages for c in m.get("tool_calls") or []]
    assert first_call not in ids and all(m.get("tool_call_id") != first_call for m in corrected.messages)
    assert any(m.get("content") == "Now run the check." for m in corrected.messages if m.get("role") == "assistant")
    assert [d["edit"] for d in correction.diff] == ["thought", "drop_step", "final_answer"]
    assert (correction.editor, correction.note) == (reviewer, "the first listing was noise")
    assert AuditEvent.objects.filter(action="reviews.correction", actor=reviewer).count() == 1
    page = client.get(reverse("tasks:trajectory_detail", args=[corrected.pk])).content.decode()
    assert 'id="correction-of"' in page and f"trajectory #{original.pk}" in page
    page = client.get(reverse("tasks:trajectory_detail", args=[original.pk])).content.decode()
    assert 'id="corrections"' in page and f"#{corrected.pk}" in page


def test_a_correction_that_changes_nothing_or_names_missing_steps_is_refused(client, reviewer, viewer, make_task):
    original = make_trajectory(make_task())
    with pytest.raises(ValidationError, match="nothing changed"):
        trajectory_correct(trajectory=original, actor=reviewer, final_answer=original.final_answer)
    with pytest.raises(ValidationError, match="step 10 does not exist"):
        trajectory_correct(trajectory=original, actor=reviewer, drop_steps=[9])
    with pytest.raises(ValidationError, match="at least one step"):
        trajectory_correct(trajectory=original, actor=reviewer, drop_steps=list(range(len(original.steps))))
    client.force_login(reviewer)
    response = client.post(reverse("reviews:correct", args=[original.pk]), {"final_answer": original.final_answer})
    assert response.status_code == 400 and "nothing changed" in response.content.decode()
    client.force_login(viewer)
    assert client.get(reverse("reviews:correct", args=[original.pk])).status_code == 403
    assert not Correction.objects.exists() and Trajectory.objects.count() == 1
