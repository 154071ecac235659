"""Exportability known when a version is made (apps/datasets/exportability.py): the card's
per-format counts are what the exports then write; formats that do not apply are refused by
name; publishing warns about members their own scene's format would exclude."""
from __future__ import annotations

from typing import Any

import pytest
from django.utils.html import escape

from apps.datasets.exporters import FORMATS, format_table
from apps.datasets.jobs import export_run
from apps.datasets.models import DatasetVersion, ExportJob
from apps.datasets.services import ExportError, dataset_version_create, dataset_version_publish, export_start
from apps.datasets.views import ExportForm
from tests.datasets.version_data import (  # noqa: F401 (export_dir is a fixture)
    export_dir, make_trajectory, mixed_code_spec, no_dedup,
)
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db

@pytest.fixture
def version(make_task: Any, approver: Any) -> Any:
    """Verified and unverified code tasks (version_data.mixed_code_spec): rl-verl writes fewer lines."""
    return dataset_version_create(dataset_name="mixed", actor=approver, filter_spec=mixed_code_spec(make_task))


def _run(version: Any, fmt: str, split: str) -> ExportJob:
    job = export_start(version=version, fmt=fmt, split=split, actor=None, enqueue=False)
    return export_run(job.pk) or ExportJob.objects.get(pk=job.pk)


def test_the_cards_per_format_counts_equal_what_the_exports_write(version: Any) -> None:
    section = version.data_card["exportability"]
    measured = section["formats"]
    # Every format is either measured or said not to apply, with why.
    assert set(measured) | set(section["not_applicable"]) == set(FORMATS)
    assert "aitw" in section["not_applicable"] and "mobile_agent" in section["not_applicable"]["aitw"]
    assert "sft-openai-vision" in section["not_applicable"]
    assert measured["sft-openai"]["lines"] == {"all": 13, "train": version.counts["train"],
                                               "validation": version.counts["validation"]}
    assert measured["rl-verl"]["lines"]["all"] == 5  # one per task with ground truth
    assert measured["rl-verl"]["excluded"] == 8
    assert any("no ground truth" in r for r in measured["rl-verl"]["reasons"])
    assert measured["dpo-trl"]["lines"]["all"] == 5  # one pair per verified task
    compared = 0
    for fmt, tally in measured.items():
        for split in ("all", "train", "validation"):
            if tally["lines"][split] == 0:
                with pytest.raises(ExportError, match=f"format {fmt} would write no line"):
                    export_start(version=version, fmt=fmt, split=split, actor=None, enqueue=False)
                continue
            job = _run(version, fmt, split)
            assert job.status == "done", (fmt, split, job.error)
            assert job.lines == tally["lines"][split], (fmt, split)
            if split == "all":
                assert len(job.excluded) == tally["excluded"], fmt
            compared += 1
    assert compared >= 40


def test_formats_made_for_other_scenes_are_refused_by_name(version: Any) -> None:
    with pytest.raises(ExportError, match="format aitw does not apply to this version: aitw is made for "
                                          "mobile_agent trajectories; this version has code_exec"):
        export_start(version=version, fmt="aitw", split="all", actor=None, enqueue=False)
    assert not ExportJob.objects.exists()


def test_a_card_made_before_the_counts_refuses_only_by_scene(version: Any) -> None:
    from apps.datasets import exportability

    card = {k: v for k, v in version.data_card.items() if k != "exportability"}
    assert exportability.refusal(card, "sft-trl") == ""
    assert exportability.refusal(card, "qa").startswith("format qa does not apply to this version")
    offered = [o["format"] for o in exportability.offered(card)]
    assert "sft-trl" in offered and "qa" not in offered and "aitw" not in offered
    assert all(o["lines"] is None for o in exportability.offered(card))


def test_publishing_warns_about_members_their_own_scenes_format_excludes(make_task: Any, approver: Any) -> None:
    # A toucan-scene trajectory whose conversation has no user prompt: toucan's format cannot write it.
    good = make_task(scene="toucan", prompt="Find the weather in Paris.")
    make_trajectory(good, score=90)
    bad = make_task(scene="toucan", prompt="Find the weather in Rome.")
    make_trajectory(bad, score=90, messages=[{"role": "system", "content": "You are helpful."}])
    version = dataset_version_create(dataset_name="tc", actor=approver, filter_spec=no_dedup())
    tally = version.data_card["exportability"]["formats"]["toucan"]
    assert tally["lines"]["all"] == 1 and tally["by_scene"]["toucan"]["excluded"] == 1
    published = dataset_version_publish(version=version, actor=approver)
    assert published.status == "published"
    event = AuditEvent.objects.get(action="datasets.version_publish", target_id=str(version.pk))
    [warning] = event.data["warnings"]
    assert warning.startswith("toucan, toucan's format, would exclude 1 of this version's toucan rows (1 lines written)")


def test_the_version_page_offers_only_the_formats_that_apply_with_their_counts(
        client: Any, approver: Any, version: Any) -> None:
    client.force_login(approver)
    url = f"/datasets/{version.dataset.name}/v{version.number}/"
    html = client.get(url).content.decode()
    form = html.split('id="export-form"')[1].split("</form>")[0]
    lines = {row.name: escape(row.line) for row in format_table()}  # each labelled with its line of the table
    assert f'<option value="sft-trl">sft-trl — 13 lines — {lines["sft-trl"]}</option>' in form
    assert f'<option value="rl-verl">rl-verl — 5 lines, 8 excluded — {lines["rl-verl"]}</option>' in form
    for absent in ("aitw", "qa", "sft-openai-vision", "multiagent-agentjet"):
        assert f'value="{absent}"' not in form
    assert 'name="roles"' not in form  # no per-role views: not a multi_agent version
    assert 'data-format="rl-verl"><td>rl-verl</td><td>5</td>' in html  # the card's table


def test_the_console_refuses_an_inapplicable_format_by_name_and_queues_nothing(
        client: Any, approver: Any, version: Any) -> None:
    client.force_login(approver)
    url = f"/datasets/{version.dataset.name}/v{version.number}/export/"
    page = client.post(url, {"format": "aitw", "split": "all"}, follow=True).content.decode()
    assert ("format aitw does not apply to this version: "
            "aitw is made for mobile_agent trajectories; this version has code_exec") in page
    page = client.post(url, {"format": "sft-trl", "split": "all", "roles": "lead"}, follow=True).content.decode()
    assert "roles: only multi_agent versions have per-role views; this version has code_exec" in page
    assert not ExportJob.objects.exists()
    page = client.post(url, {"format": "sft-trl", "split": "train"}, follow=True).content.decode()
    assert ExportJob.objects.get().format == "sft-trl"


def test_the_api_accepts_only_formats_that_apply_and_names_the_field(approver: Any, version: Any) -> None:
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(approver)
    url = f"/api/v1/datasets/{version.dataset.name}/versions/{version.number}/exports"
    detail = api.get(f"/api/v1/datasets/{version.dataset.name}/versions/{version.number}").json()
    offered = {o["format"]: o["lines"] for o in detail["export_formats"]}
    assert offered["sft-trl"] == 13 and "aitw" not in offered and "qa-verl" not in offered
    refused = api.post(url, {"format": "qa-verl"}, format="json")
    assert refused.status_code == 400
    [message] = refused.json()["error"]["details"]["fields"]["format"]
    assert message.startswith("format qa-verl does not apply to this version: qa-verl is made for")
    roles = api.post(url, {"format": "sft-trl", "roles": "lead"}, format="json")
    assert roles.status_code == 400
    assert roles.json()["error"]["details"]["fields"]["roles"] == [
        "roles: only multi_agent versions have per-role views; this version has code_exec"]
    assert not ExportJob.objects.exists()
    started = api.post(url, {"format": "rl-verl", "split": "train"}, format="json")
    assert started.status_code == 202, started.json()


def test_a_refusal_only_the_service_makes_is_answered_under_its_field_in_the_api_and_the_form(
        client: Any, approver: Any, version: Any) -> None:
    # The exporter changed after the version froze its version: neither the serializer nor the
    # form knows that; the service's refusal names the field and both answer under it.
    frozen = {**version.exporter_versions, "sft-trl": "0"}
    DatasetVersion.objects.filter(pk=version.pk).update(exporter_versions=frozen)
    version.refresh_from_db()
    reason = (f"{version} was frozen with sft-trl exporter 0, but {FORMATS['sft-trl'].version} is installed; "
              "its files would differ from the version's record. Create a new version to export with it.")
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(approver)
    refused = api.post(f"/api/v1/datasets/{version.dataset.name}/versions/{version.number}/exports",
                       {"format": "sft-trl"}, format="json")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid" and error["details"] == {"fields": {"format": [reason]}}
    assert error["message"] == f"format: {reason}"
    form = ExportForm(version, {"format": "sft-trl", "split": "all"})
    assert form.start(approver) is None and form.errors == {"format": [reason]}
    form = ExportForm(version, {"format": "csv", "split": "all"})
    assert form.start(approver) is None and form.problems().startswith("format: unknown format 'csv'; formats: ")
    assert not ExportJob.objects.exists()
