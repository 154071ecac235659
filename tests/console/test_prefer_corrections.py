"""Datasets can prefer corrected versions (issue 28, item 5): under `prefer_corrections` a trajectory
a reviewer corrected is replaced by its latest correction (made by the real trajectory_correct); the
data card says how many; reachable from dataset_create, the API and the console's builder."""
from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from apps.datasets.models import DatasetVersion, VersionBuild
from apps.datasets.services import FilterSpecError, dataset_version_create, version_preview
from apps.reviews.services import trajectory_correct
from tests.datasets.exporter_data import make_trajectory
from tests.datasets.version_data import no_dedup, run_build
from tests.reviews.factories import auto_review
from trajplatform.api_models import api_token_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def corrected(make_task, reviewer) -> dict[str, Any]:
    """Two tasks' trajectories; the first was scored 70 by the judge and corrected by a reviewer."""
    original = make_trajectory(make_task(prompt="Print the first ten primes."))
    auto_review(original, 70.0)
    other = make_trajectory(make_task(prompt="Count the files."))
    auto_review(other, 90.0)
    correction = trajectory_correct(trajectory=original, actor=reviewer, final_answer="2 3 5 7 11 13 17 19 23 29",
                                    note="tidier answer")
    return {"original": original, "other": other, "corrected": correction.corrected, "reviewer": reviewer}


def _members(version: DatasetVersion) -> set[int]:
    return set(version.members.values_list("trajectory_id", flat=True))


def test_by_default_a_version_keeps_originals_and_corrections_alike(corrected, approver):
    spec = no_dedup(dedup={"exact": False, "near": False})  # an answer-only edit is an exact duplicate otherwise
    version = dataset_version_create(dataset_name="plain", filter_spec=spec, actor=approver)
    assert _members(version) == {corrected["original"].pk, corrected["other"].pk, corrected["corrected"].pk}
    assert version.filter_spec["prefer_corrections"] is False
    assert version.counts["corrections_preferred"] == 0
    assert version.data_card["corrections"] == {"preferred": False, "replaced": []}


def test_prefer_corrections_replaces_a_corrected_trajectory_by_its_correction(corrected, approver):
    version = dataset_version_create(dataset_name="fixed", filter_spec=no_dedup(prefer_corrections=True),
                                     actor=approver)
    assert _members(version) == {corrected["corrected"].pk, corrected["other"].pk}
    assert version.counts["corrections_preferred"] == 1 and version.counts["in_scope"] == 2
    assert version.data_card["corrections"] == {
        "preferred": True, "replaced": [{"original": corrected["original"].pk, "corrected": corrected["corrected"].pk}]}
    # the original is unchanged and still a trajectory of its own
    corrected["original"].refresh_from_db()
    assert corrected["original"].final_answer != "2 3 5 7 11 13 17 19 23 29"


def test_a_correction_is_judged_by_its_originals_score_until_it_has_its_own(corrected, approver):
    spec = no_dedup(prefer_corrections=True, min_score=65)
    preview = version_preview(spec)
    assert {r.trajectory_id for r in preview["sample"]} == {corrected["corrected"].pk, corrected["other"].pk}
    assert [r.score for r in preview["sample"] if r.corrects] == [70.0]
    auto_review(corrected["corrected"], 50.0)  # its own score, once it has one, decides
    preview = version_preview(spec)
    assert {r.trajectory_id for r in preview["sample"]} == {corrected["other"].pk}
    assert preview["excluded"] == 1


def test_a_correction_of_a_correction_is_preferred_over_both(corrected, approver):
    second = trajectory_correct(trajectory=corrected["corrected"], actor=corrected["reviewer"],
                                final_answer="2, 3, 5, 7, 11, 13, 17, 19, 23, 29").corrected
    version = dataset_version_create(dataset_name="twice", filter_spec=no_dedup(prefer_corrections=True),
                                     actor=approver)
    assert _members(version) == {second.pk, corrected["other"].pk}
    assert version.data_card["corrections"]["replaced"] == [{"original": corrected["original"].pk,
                                                            "corrected": second.pk}]


def test_a_non_boolean_prefer_corrections_is_refused():
    with pytest.raises(FilterSpecError) as caught:
        version_preview({"prefer_corrections": "yes"})
    assert caught.value.errors == {"prefer_corrections": "must be true or false"}


def test_a_parent_stored_before_the_option_shows_no_spec_change(corrected, approver):
    first = dataset_version_create(dataset_name="grown", filter_spec=no_dedup(), actor=approver)
    spec = dict(first.filter_spec)
    del spec["prefer_corrections"]  # as versions built before the option were stored
    DatasetVersion.objects.filter(pk=first.pk).update(filter_spec=spec, status="published", published_at=timezone.now())
    second = dataset_version_create(dataset_name="grown", filter_spec=no_dedup(), actor=approver)
    assert "prefer_corrections" not in second.data_card["diff"]["filter_spec_changed"]
    third = dataset_version_create(dataset_name="grown", filter_spec=no_dedup(prefer_corrections=True),
                                   actor=approver, parent=first)
    assert third.data_card["diff"]["filter_spec_changed"]["prefer_corrections"] == {"from": False, "to": True}


def test_dataset_create_takes_prefer_corrections(corrected, approver):
    out = StringIO()
    call_command("dataset_create", "cmd", "--prefer-corrections", "--no-near-dedup", "--no-progress",
                 "--user", approver.username, stdout=out, stderr=StringIO())
    version = DatasetVersion.objects.get(dataset__name="cmd")
    assert _members(version) == {corrected["corrected"].pk, corrected["other"].pk}
    assert version.filter_spec["prefer_corrections"] is True


def test_the_api_filter_spec_takes_prefer_corrections(corrected, approver):
    _token, raw = api_token_create(user=approver, name="tests", actor=approver)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post("/api/v1/datasets/api-fixed/versions",
                           {"filter_spec": no_dedup(prefer_corrections=True)}, format="json")
    assert response.status_code == 202, response.content
    assert run_build(response.json()["id"]).counts["corrections_preferred"] == 1
    response = client.post("/api/v1/datasets/api-fixed/versions", {"filter_spec": {"prefer_corrections": 1}},
                           format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"]["errors"][0]["field"] == "prefer_corrections"


def test_the_builder_form_previews_and_creates_with_corrections_preferred(client, corrected, approver):
    client.force_login(approver)
    form = {"dataset": "from-form", "prefer_corrections": "on", "dedup_exact": "on"}
    page = client.get(reverse("datasets:builder")).content.decode()
    assert 'name="prefer_corrections"' in page
    fragment = client.get(reverse("datasets:builder_preview"), form).content.decode()
    assert f"corrects #{corrected['original'].pk}" in fragment
    assert "1 of those passing is a reviewer&#x27;s correction in place of its original" in fragment
    response = client.post(reverse("datasets:builder"), form)
    assert response.status_code == 302, response.content.decode()[:2000]
    version = run_build(VersionBuild.objects.get().pk)
    assert version == DatasetVersion.objects.get(dataset__name="from-form")
    assert _members(version) == {corrected["corrected"].pk, corrected["other"].pk}
