"""The admin's lists at 1440 px (issue 28): every key column visible without a horizontal scroll,
long text truncated with the whole value in its tooltip; the audit log's columns have readable
titles; data cards and checks render as escaped tables, not raw JSON; nothing becomes editable."""
from __future__ import annotations

import pytest
from django.urls import reverse

from apps.datasets.models import Dataset, DatasetVersion
from apps.reviews.models import Proposal
from apps.tasks.models import Batch, Task
from tests.conftest import PASSWORD
from tests.tasks.test_live_log_browser import daphne_server, page, static_root  # noqa: F401 (fixtures)
from tests.reviews.factories import auto_review, finished_trajectory
from trajplatform.audit import audit_record

LONG_MODEL = "Qwen/Qwen2.5-Coder-32B-Instruct-GPTQ-Int4-long-deployment-name"


def _rows(make_task, admin_user) -> dict[str, object]:
    """One row of every listed model, with the long values real data has."""
    batch = Batch.objects.create(name=f"nightly code_exec regression batch {Batch.objects.count()} with a long name",
                                 source_name="examples/tasks/a-very-long-directory-name/tasks.jsonl")
    task = make_task(batch=batch, external_id="swe-gym/django__django-15781-variant-with-a-long-id",
                     model=LONG_MODEL)
    trajectory = finished_trajectory(task, model=LONG_MODEL)
    review = auto_review(trajectory, 55.0, judge_model=LONG_MODEL,
                         checks={"invalid_arguments": {"fired": True, "detail": "<b>step 3</b>: bad path"},
                                 "sensitive_data": {"fired": False}})
    proposal = Proposal.objects.create(task=task, review=review, iteration=1, field="system_prompt_extra",
                                       to_value="Always run the tests before finishing " * 4, tier="yellow",
                                       proposer="review-agent")
    dataset = Dataset.objects.create(name=f"code-exec-sft-accepted-{Dataset.objects.count()}",
                                     description="Every accepted code_exec trajectory of November " * 5,
                                     created_by=admin_user)
    version = DatasetVersion.objects.create(
        dataset=dataset, number=1, created_by=admin_user, notes="first cut " * 20,
        data_card={"members": 12, "licences": ["MIT", "<script>x</script>"],
                   "splits": {"train": 11, "validation": 1}, "scenes": {"code_exec": 12}})
    audit_record("tasks.batch_import", actor=admin_user, target=batch, data={"tasks": 1})
    return {"task": task, "trajectory": trajectory, "review": review, "proposal": proposal,
            "dataset": dataset, "datasetversion": version, "batch": batch}


LISTS = [
    ("tasks", "batch"), ("tasks", "task"), ("tasks", "trajectory"), ("reviews", "review"),
    ("reviews", "proposal"), ("datasets", "dataset"), ("datasets", "datasetversion"), ("trajplatform", "auditevent"),
]


@pytest.mark.django_db(transaction=True)
def test_every_admin_list_fits_a_1440_px_screen(daphne_server, page, make_task, make_user):
    from playwright.sync_api import expect

    from tests.console.test_console_browser import shot

    admin_user = make_user("admin", is_superuser=True)
    rows = _rows(make_task, admin_user)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{daphne_server.url}/admin/login/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{daphne_server.url}/")
    overflowing = {}
    for app, model in LISTS:
        page.goto(f"{daphne_server.url}{reverse(f'admin:{app}_{model}_changelist')}")
        assert page.locator("#result_list tbody tr").count() >= 1, model
        widths = page.evaluate("""() => {
            const box = document.querySelector('#changelist .results');
            return [box.scrollWidth, box.clientWidth, document.documentElement.scrollWidth];
        }""")
        shot(page, f"admin-{model}-1440")
        if widths[0] > widths[1] or widths[2] > 1440:
            overflowing[model] = widths
    assert overflowing == {}
    for name, app in (("datasetversion", "datasets"), ("review", "reviews")):  # the readable JSON, looked at
        page.goto(f"{daphne_server.url}{reverse(f'admin:{app}_{name}_change', args=[rows[name].pk])}")
        expect(page.locator("table.readable-json").first).to_be_visible()
        shot(page, f"admin-{name}-change-1440")


@pytest.fixture
def admin_client(client, make_user, make_task):
    user = make_user("admin", is_superuser=True)
    client.force_login(user)
    client.rows = _rows(make_task, user)
    return client


def test_the_audit_log_columns_have_readable_titles(admin_client):
    html = admin_client.get(reverse("admin:trajplatform_auditevent_changelist")).content.decode()
    assert "Actor repr" not in html and "actor repr" not in html.lower()
    for title in ("When", "Actor", "Action", "Target"):
        assert f">{title}<" in html or f">{title}</a>" in html, title


def test_long_text_is_truncated_in_the_list_with_the_whole_value_in_its_title(admin_client):
    html = admin_client.get(reverse("admin:datasets_dataset_changelist")).content.decode()
    description = admin_client.rows["dataset"].description
    assert description not in html.replace(f'title="{description}"', "")
    assert f'title="{description}"' in html


def test_a_data_card_renders_as_an_escaped_table(admin_client):
    version = admin_client.rows["datasetversion"]
    html = admin_client.get(reverse("admin:datasets_datasetversion_change", args=[version.pk])).content.decode()
    assert '<table class="readable' in html
    assert "<th>licences</th>" in html and "<th>train</th>" in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html and "<script>x</script>" not in html
    assert '"licences":' not in html  # not the raw JSON dump


def test_review_checks_render_as_a_table_of_fired_and_passed(admin_client):
    review = admin_client.rows["review"]
    html = admin_client.get(reverse("admin:reviews_review_change", args=[review.pk])).content.decode()
    assert '<table class="readable' in html and "<th>invalid_arguments</th>" in html
    assert "&lt;b&gt;step 3&lt;/b&gt;" in html
    assert '"fired": true' not in html


@pytest.mark.parametrize("app, model", LISTS)
def test_the_lists_add_no_editable_field(admin_client, app, model):
    response = admin_client.get(reverse(f"admin:{app}_{model}_changelist"))
    assert response.status_code == 200
    assert response.context["cl"].list_editable == ()
    assert "form-0-" not in response.content.decode()


def test_the_task_change_page_refuses_a_post_even_from_a_superuser(client, make_user, make_task):
    admin_user = make_user("admin", is_superuser=True)
    rows = _rows(make_task, admin_user)
    client.force_login(admin_user)
    task = rows["task"]
    response = client.post(reverse("admin:tasks_task_change", args=[task.pk]), {"prompt": "changed"})
    assert response.status_code == 403
    assert Task.objects.get(pk=task.pk).prompt == task.prompt


@pytest.mark.parametrize("app, model", LISTS)
def test_the_short_columns_add_no_query_per_row(client, make_user, make_task, app, model):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    admin_user = make_user("admin", is_superuser=True)
    client.force_login(admin_user)
    url = reverse(f"admin:{app}_{model}_changelist")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200
        return len(captured)

    _rows(make_task, admin_user)
    one = queries()
    for _ in range(3):
        _rows(make_task, admin_user)
    assert queries() == one
