"""The admin is a door too: its POSTs go through the services (tiers, audit rows, starting tasks)."""
from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from apps.datasets.models import Dataset, DatasetMember, DatasetVersion
from apps.reviews.models import Proposal, Review
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.services import batch_import
from trajplatform.audit import AuditEvent
from trajplatform.webhooks import WebhookEndpoint

pytestmark = pytest.mark.django_db

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples" / "tasks"
PROPOSE_URL = reverse("admin:reviews_proposal_add")


@pytest.fixture(autouse=True)
def dispatched(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Rollout jobs are enqueued on commit; record the calls instead of touching the broker."""
    from apps.tasks import services

    calls: list[Any] = []
    monkeypatch.setattr(services, "dispatch_rollouts", lambda **kw: calls.append(kw))
    return calls


def url(model: str, view: str, *args: Any) -> str:
    app = {"batch": "tasks", "task": "tasks", "trajectory": "tasks", "review": "reviews", "proposal": "reviews",
           "webhookendpoint": "trajplatform", "user": "auth", "group": "auth"}[model]
    return reverse(f"admin:{app}_{model}_{view}", args=args)


def action(client: Any, model: str, name: str, pks: list[Any]) -> str:
    response = client.post(url(model, "changelist"), {"action": name, "_selected_action": [str(p) for p in pks]},
                           follow=True)
    assert response.status_code == 200
    return response.content.decode()


def actions(model: str) -> set[str]:
    from django.contrib import admin

    return {a.__name__ if callable(a) else a for a in admin.site._registry[
        {"batch": Batch, "task": Task}[model]].actions}


def waiting_task(make_task: Any, **fields: Any) -> Task:
    return make_task(status=Task.Status.WAITING_APPROVAL, current_iteration=1, max_tokens=1200, **fields)


# --- item 1: the run config changes only by a proposal -----------------------------------------

RED_FORM = {
    "max_tokens": "1999999", "timeout_s": "7200", "step_timeout_s": "600",
    "scene_config": '{"image": "attacker/image"}', "model": "unlisted-model", "prompt": "changed",
    "priority": "9", "temperature": "0.1",
}


@pytest.mark.parametrize("role", ["reviewer", "approver", "admin"])
def test_posting_the_task_change_form_changes_no_governed_field(
    client: Any, make_user: Any, make_task: Any, role: str
) -> None:
    task = waiting_task(make_task, scene_config={"image": "python:3.11"})
    before = Task.objects.filter(pk=task.pk).values().get()
    client.force_login(make_user(role, is_superuser=role == "admin"))

    response = client.post(url("task", "change", task.pk), {**RED_FORM, "scene": "code_exec", "batch": task.batch_id})

    assert response.status_code == 403
    assert Task.objects.filter(pk=task.pk).values().get() == before
    assert not Proposal.objects.exists() and not AuditEvent.objects.exists()


def test_a_red_change_proposed_in_the_admin_waits_for_an_approver(
    client: Any, reviewer: Any, approver: Any, make_task: Any
) -> None:
    task = waiting_task(make_task)
    client.force_login(reviewer)
    form = client.get(f"{PROPOSE_URL}?task={task.pk}").content.decode()
    assert "max_tokens: red" in form and f'value="{task.pk}"' in form

    response = client.post(PROPOSE_URL, {"task": task.pk, "field": "max_tokens", "value": "2400",
                                         "rationale": "answers are cut off"}, follow=True)

    proposal = Proposal.objects.get(task=task)
    assert (proposal.tier, proposal.status, proposal.proposed_by, proposal.to_value) == ("red", "pending", reviewer, 2400)
    assert "red, pending: an approver decides" in response.content.decode()
    assert Task.objects.get(pk=task.pk).max_tokens == 1200
    event = AuditEvent.objects.get(action="reviews.proposal_create")
    assert (event.actor, event.target_id) == (reviewer, str(proposal.pk))

    # The reviewer who proposed it cannot apply it; an approver can, through the same service.
    action(client, "proposal", "approve_proposed_value", [proposal.pk])
    assert Proposal.objects.get(pk=proposal.pk).status == "pending"
    client.force_login(approver)
    assert "Approved 1 proposal(s)" in action(client, "proposal", "approve_proposed_value", [proposal.pk])
    assert Task.objects.get(pk=task.pk).max_tokens == 2400
    assert AuditEvent.objects.filter(action="reviews.proposal_decide", actor=approver).count() == 1


def test_a_green_change_is_applied_at_once_and_a_yellow_one_waits_for_a_reviewer(
    client: Any, reviewer: Any, make_task: Any
) -> None:
    task = waiting_task(make_task)
    client.force_login(reviewer)

    client.post(PROPOSE_URL, {"task": task.pk, "field": "temperature", "value": "0.3"})
    client.post(PROPOSE_URL, {"task": task.pk, "field": "model", "value": "gpt-4o-mini"})

    green, yellow = Proposal.objects.filter(task=task).order_by("pk")
    assert (green.tier, green.status, yellow.tier, yellow.status) == ("green", "applied", "yellow", "pending")
    task.refresh_from_db()
    assert (task.temperature, task.model) == (0.3, "")
    assert AuditEvent.objects.filter(action="reviews.proposal_apply", actor=reviewer).count() == 1


def test_a_scene_config_key_is_proposed_as_text_and_refused_values_are_reported(
    client: Any, reviewer: Any, make_task: Any
) -> None:
    task = waiting_task(make_task, scene_config={"image": "python:3.11"})
    client.force_login(reviewer)

    client.post(PROPOSE_URL, {"task": task.pk, "field": "scene_config.image", "value": "attacker/image"})
    refused = client.post(PROPOSE_URL, {"task": task.pk, "field": "top_p", "value": "0.05"})

    proposal = Proposal.objects.get(task=task)
    assert (proposal.field, proposal.to_value, proposal.tier, proposal.status) == (
        "scene_config.image", "attacker/image", "red", "pending")
    assert Task.objects.get(pk=task.pk).scene_config == {"image": "python:3.11"}
    assert refused.status_code == 200 and "does not allow changing top_p" in refused.content.decode()


def test_proposing_follows_the_service_rules(client: Any, viewer: Any, reviewer: Any, make_task: Any) -> None:
    running, waiting = make_task(status="running"), waiting_task(make_task)
    client.force_login(viewer)
    assert client.get(PROPOSE_URL).status_code == 403
    assert client.post(PROPOSE_URL, {"task": waiting.pk, "field": "temperature", "value": "0.3"}).status_code == 403

    client.force_login(reviewer)
    response = client.post(PROPOSE_URL, {"task": running.pk, "field": "temperature", "value": "0.3"})
    assert response.status_code == 200
    assert "people propose changes while it waits for approval" in response.content.decode()
    response = client.post(PROPOSE_URL, {"task": 999999, "field": "temperature", "value": "0.3"})
    assert "there is no task 999999" in response.content.decode()
    assert not Proposal.objects.exists() and not AuditEvent.objects.exists()


# --- item 2: what the admin writes is audited; history is not deletable ---------------------------


@pytest.fixture
def history(make_task: Any, reviewer: Any) -> dict[str, Any]:
    task = make_task(status=Task.Status.COMPLETED, current_iteration=1)
    trajectory = Trajectory.objects.create(task=task, iteration=1, status="finished", outcome="success")
    published = Trajectory.objects.create(task=task, iteration=1, sample_index=1, status="finished", outcome="success")
    review = Review.objects.create(trajectory=trajectory, kind="auto", status="done", overall=90)
    verdict = Review.objects.create(trajectory=trajectory, kind="human", status="done", verdict="accept",
                                    reviewer=reviewer, rationale="fine")
    proposal = Proposal.objects.create(task=task, review=review, iteration=1, field="temperature", from_value=0.7,
                                       to_value=0.2, tier="yellow", proposer="review-agent")
    version = DatasetVersion.objects.create(dataset=Dataset.objects.create(name="d"), number=1)
    DatasetMember.objects.create(version=version, position=0, trajectory=published,
                                 content_sha256=published.content_sha256)
    DatasetVersion.objects.filter(pk=version.pk).update(status="published", published_at=timezone.now())
    return {"review": review, "verdict": verdict, "proposal": proposal, "trajectory": trajectory,
            "published": published, "task": task, "batch": task.batch}


@pytest.mark.parametrize("name", ["review", "verdict", "proposal", "trajectory", "published", "task", "batch"])
def test_history_cannot_be_deleted_in_the_admin_even_by_a_superuser(
    client: Any, make_user: Any, history: dict[str, Any], name: str
) -> None:
    obj = history[name]
    model = {"verdict": "review", "published": "trajectory"}.get(name, name)
    client.force_login(make_user("admin", is_superuser=True))

    assert client.get(url(model, "delete", obj.pk)).status_code == 403
    assert client.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    assert "delete_selected" not in client.get(url(model, "changelist")).content.decode()
    client.post(url(model, "changelist"), {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"})

    assert type(obj).objects.filter(pk=obj.pk).exists()


def test_batches_have_no_add_or_change_form(client: Any, admin_user_role: Any, make_task: Any) -> None:
    batch = make_task().batch
    client.force_login(admin_user_role)
    assert client.get(url("batch", "add")).status_code == 403
    assert client.post(url("batch", "change", batch.pk), {"name": "renamed", "notes": "x"}).status_code == 403
    assert Batch.objects.get(pk=batch.pk).name == batch.name and not AuditEvent.objects.exists()


def test_webhook_endpoints_are_deleted_through_the_service_and_not_edited(
    client: Any, admin_user_role: Any
) -> None:
    endpoint = WebhookEndpoint.objects.create(owner=admin_user_role, url="https://hooks.example.test/x")
    client.force_login(admin_user_role)
    assert client.post(url("webhookendpoint", "change", endpoint.pk),
                       {"owner": admin_user_role.pk, "url": "http://127.0.0.1:9/", "active": "on"}).status_code == 403
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).url == "https://hooks.example.test/x"

    response = client.post(url("webhookendpoint", "delete", endpoint.pk), {"post": "yes"})

    assert response.status_code == 302 and not WebhookEndpoint.objects.exists()
    event = AuditEvent.objects.get(action="api.webhook_endpoint_delete")
    assert (event.actor, event.target_id) == (admin_user_role, str(endpoint.pk))


def test_roles_change_only_through_the_audited_action(client: Any, admin_user_role: Any, make_user: Any) -> None:
    from django.contrib.auth.models import Group

    target = make_user("viewer")
    client.force_login(admin_user_role)
    page = client.get(url("user", "change", target.pk))
    data = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None and k != "password"}
    data.update(groups=[Group.objects.get(name="admin").pk], is_superuser="on", is_staff="on",
                date_joined_0="2026-01-01", date_joined_1="00:00:00")
    client.post(url("user", "change", target.pk), data)

    target.refresh_from_db()
    assert not target.is_superuser and list(target.groups.values_list("name", flat=True)) == ["viewer"]
    assert client.get(url("user", "delete", target.pk)).status_code == 403
    assert client.post(url("group", "change", Group.objects.get(name="viewer").pk), {"name": "x"}).status_code == 403


# --- item 3: every task that is created or re-queued starts ------------------------------------------


def test_a_task_added_in_the_admin_is_created_by_the_service_and_starts_after_commit(
    client: Any, reviewer: Any, django_capture_on_commit_callbacks: Any, dispatched: list[Any]
) -> None:
    client.force_login(reviewer)
    data = {"batch_name": "by hand", "scene": "code_exec", "prompt": "Print primes.", "scene_config": "{}",
            "expected_tools": "[]", "temperature": "0.7", "max_steps": "15", "step_timeout_s": "30",
            "timeout_s": "600", "max_iterations": "3", "quality_threshold": "80", "samples_per_iteration": "2",
            "priority": "5"}
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url("task", "add"), data)

    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    task = Task.objects.get()
    assert (task.status, task.current_iteration, task.created_by, task.batch.name) == ("running", 1, reviewer, "by hand")
    assert list(task.trajectories.order_by("sample_index").values_list("iteration", "sample_index", "status")) == [
        (1, 0, "queued"), (1, 1, "queued")]
    assert dispatched, "no rollout job was enqueued on commit"
    assert {e.action for e in AuditEvent.objects.filter(actor=reviewer)} == {"tasks.task_create", "tasks.tasks_enqueue"}


def test_the_add_form_refuses_another_users_batch_and_writes_nothing(
    client: Any, reviewer: Any, make_task: Any
) -> None:
    taken = make_task().batch
    client.force_login(reviewer)
    response = client.post(url("task", "add"), {
        "batch_name": taken.name, "scene": "code_exec", "prompt": "x", "scene_config": "{}", "expected_tools": "[]",
        "temperature": "0.7", "max_steps": "15", "step_timeout_s": "30", "timeout_s": "600", "max_iterations": "3",
        "quality_threshold": "80", "samples_per_iteration": "1", "priority": "5"})
    assert response.status_code == 200
    assert "was not created by you" in str(response.context["adminform"].form.errors["batch_name"])
    assert Task.objects.count() == 1 and not AuditEvent.objects.exists()


@pytest.mark.parametrize("status", [Task.Status.FAILED, Task.Status.CANCELLED])
def test_retry_action_requeues_and_starts_the_next_iteration_after_commit(
    client: Any, reviewer: Any, make_task: Any, django_capture_on_commit_callbacks: Any, dispatched: list[Any],
    status: str
) -> None:
    task = make_task(status=status, current_iteration=1, cancel_requested=status == Task.Status.CANCELLED)
    client.force_login(reviewer)
    with django_capture_on_commit_callbacks(execute=True):
        assert "Retried 1" in action(client, "task", "retry_selected", [task.pk])

    task.refresh_from_db()
    assert (task.status, task.current_iteration, task.cancel_requested) == ("running", 2, False)
    assert list(task.trajectories.values_list("iteration", "status")) == [(2, "queued")]
    assert dispatched
    assert [e.action for e in AuditEvent.objects.order_by("pk")] == ["tasks.task_requeue", "tasks.iteration_start"]


def test_start_and_cancel_actions_for_tasks(
    client: Any, reviewer: Any, make_task: Any, django_capture_on_commit_callbacks: Any, dispatched: list[Any]
) -> None:
    fresh, done = make_task(), make_task(status=Task.Status.COMPLETED)
    client.force_login(reviewer)
    assert {"start_selected", "cancel_selected", "retry_selected"} <= actions("task")
    with django_capture_on_commit_callbacks(execute=True):
        body = action(client, "task", "start_selected", [fresh.pk, done.pk])
    assert "Started 1 (1 not queued: left as they are)" in body
    fresh.refresh_from_db()
    assert fresh.status == "running" and fresh.trajectories.filter(iteration=1, status="queued").exists()
    assert dispatched

    assert "Cancelled 1" in action(client, "task", "cancel_selected", [fresh.pk])
    assert Task.objects.get(pk=fresh.pk).status == "cancelled"


def _imported(name: str, n: int) -> Batch:
    rows = ({"scene": "code_exec", "prompt": f"task {i}"} for i in range(n))
    return batch_import(rows=rows, name=name, source_name=f"{name}.jsonl", source_sha256="", source_format="trajplatform",
                        actor=None)


def test_batch_actions_start_cancel_and_retry_whole_batches(
    client: Any, reviewer: Any, django_capture_on_commit_callbacks: Any, dispatched: list[Any]
) -> None:
    batch = _imported("imported", 3)
    client.force_login(reviewer)

    with django_capture_on_commit_callbacks(execute=True):
        assert "Started 3 task(s)" in action(client, "batch", "start_batches", [batch.pk])
    assert set(batch.tasks.values_list("status", flat=True)) == {"running"}
    assert Trajectory.objects.filter(task__batch=batch, iteration=1).count() == 3 and dispatched

    first = batch.tasks.order_by("pk").first()
    Task.objects.filter(pk=first.pk).update(status=Task.Status.FAILED)
    assert "Cancelled 2 task(s)" in action(client, "batch", "cancel_batches", [batch.pk])
    assert AuditEvent.objects.filter(action="tasks.task_cancel", actor=reviewer).count() == 2

    dispatched.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert "Retried 3 task(s)" in action(client, "batch", "retry_batches", [batch.pk])
    assert set(batch.tasks.values_list("status", "current_iteration")) == {("running", 2)}
    assert len(dispatched) == 1, "one enqueue for the whole batch"
    assert AuditEvent.objects.filter(action="tasks.task_requeue", actor=reviewer).count() == 3


def test_an_imported_batch_is_shown_as_not_started_until_it_starts(client: Any, viewer: Any, reviewer: Any) -> None:
    waiting, started = _imported("waiting", 2), _imported("started", 1)
    client.force_login(reviewer)
    action(client, "batch", "start_batches", [started.pk])
    client.force_login(viewer)

    listing = client.get(url("batch", "changelist"))
    rows = {b.pk: b for b in listing.context["cl"].result_list}
    assert '<td class="field-state">not started</td>' in listing.content.decode()
    assert rows[waiting.pk].n_not_started == 2 and rows[started.pk].n_not_started == 0
    not_started = client.get(url("batch", "changelist"), {"state": "not_started"}).context["cl"].result_list
    assert [b.pk for b in not_started] == [waiting.pk]
    in_progress = client.get(url("batch", "changelist"), {"state": "in_progress"}).context["cl"].result_list
    assert [b.pk for b in in_progress] == [started.pk]
    tasks = client.get(url("task", "changelist"), {"started": "no"}).context["cl"].result_list
    assert {t.batch_id for t in tasks} == {waiting.pk}
    page = client.get(url("batch", "change", waiting.pk)).content.decode()
    assert f'not started — <a href="{url("batch", "changelist")}?id__exact={waiting.pk}">' in page
    only = client.get(url("batch", "changelist"), {"id__exact": waiting.pk}).context["cl"].result_list
    assert [b.pk for b in only] == [waiting.pk]


def test_import_tasks_leaves_the_batch_not_started_unless_asked_to_start(dispatched: list[Any]) -> None:
    out = StringIO()
    call_command("import_tasks", str(EXAMPLES / "demo.jsonl"), "--batch", "demo", "--once", stdout=out)
    demo = Batch.objects.get(name="demo")
    assert set(demo.tasks.values_list("status", "current_iteration")) == {("queued", 0)}
    assert "Not started: run the batch's Start action" in out.getvalue()

    out = StringIO()
    call_command("import_tasks", str(EXAMPLES / "demo.jsonl"), "--batch", "demo", "--once", "--start", stdout=out)
    assert f"Started {demo.tasks.count()} not-started task(s)" in out.getvalue()
    assert set(demo.tasks.values_list("status", flat=True)) == {"running"}

    call_command("import_tasks", str(EXAMPLES / "demo.jsonl"), "--batch", "demo-2", "--start", stdout=StringIO())
    assert set(Batch.objects.get(name="demo-2").tasks.values_list("status", flat=True)) == {"running"}
