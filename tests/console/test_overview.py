"""The operator overview (issue 40, item 8): tasks by their real states (a not-started batch's tasks
are "not started", not "queued"), the batches in progress, and throughput, acceptance rate and cost
per accepted trajectory per day, read from the rows the scheduled activity job computes; the same
number of queries however much data there is."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import Schedule

from apps.reviews.models import Review
from apps.reviews.services import human_verdict_record
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.services import tasks_enqueue
from tests.reviews.factories import auto_review, finished_trajectory
from trajplatform import overview
from trajplatform.activity import ActivityDay
from trajplatform.schedules import ensure_periodic

pytestmark = pytest.mark.django_db


def batch_of(make_task, name: str, n: int) -> Batch:
    batch = Batch.objects.create(name=name)
    for _ in range(n):
        make_task(batch=batch)
    return batch


def html_of(client, make_user) -> str:
    client.force_login(make_user("admin"))
    response = client.get("/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_not_started_batchs_tasks_are_not_started_not_queued(client, make_user, make_task):
    imported = batch_of(make_task, "imported, never started", 3)
    started = batch_of(make_task, "started", 2)
    make_task(batch=started)
    assert tasks_enqueue(batch=started, actor=make_user("reviewer")) == 3

    states = {s.key: s.n for s in overview.task_states()}
    assert states == {"not_started": 3, "queued": 0, "running": 3, "reviewing": 0, "waiting_approval": 0,
                      "completed": 0, "failed": 0, "cancelled": 0}
    live = overview.live_trajectories()
    assert (live["queued"], live["running"]) == (3, 0)  # the started tasks' rollouts wait for a worker

    html = html_of(client, make_user)
    assert '<li class="" data-state="not_started"' in html and '<span class="n">3</span> not started' in html
    assert '<li class="zero" data-state="queued"' in html
    in_progress = html[html.index('id="batches-in-progress"'):]
    assert "started</a>" in in_progress and imported.name not in in_progress
    assert "3 running" in in_progress and "0/3" in in_progress
    assert "1 batch not started" in html


def test_a_requeued_task_is_queued_and_its_batch_in_progress(make_task):
    batch = batch_of(make_task, "half done", 1)
    task = make_task(batch=batch)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.QUEUED, current_iteration=1)
    Task.objects.filter(batch=batch).exclude(pk=task.pk).update(status=Task.Status.COMPLETED, current_iteration=1)

    assert {s.key: s.n for s in overview.task_states() if s.n} == {"queued": 1, "completed": 1}
    rows, more, not_started = overview.batches_in_progress()
    assert [(r["batch"], r["final"], r["total"], r["percent"]) for r in rows] == [(batch, 1, 2, 50)]
    assert rows[0]["states"] == [("queued", 1), ("completed", 1)] and not more and not_started == 0


def test_finished_and_not_started_batches_are_not_in_progress(make_task):
    done = batch_of(make_task, "done", 2)
    Task.objects.filter(batch=done).update(status=Task.Status.COMPLETED, current_iteration=1)
    batch_of(make_task, "not started", 2)
    assert overview.batches_in_progress() == ([], False, 1)


def seed_activity(make_task, make_user, now):
    """Three days of work: today 3 finished (2 successes, one rejected by a person; a failure a person
    accepted), yesterday 1 failure, a cancelled run that cost money; judge calls on some."""
    task = make_task()
    reviewer = make_user("reviewer")
    today = [finished_trajectory(task, sample=i, outcome=outcome, finished_at=now - timedelta(minutes=5),
                                 cost_usd=Decimal("0.10"))
             for i, outcome in enumerate(("success", "success", "failure"))]
    human_verdict_record(trajectory=today[1], actor=reviewer, verdict="reject", reason="the answer is wrong")
    human_verdict_record(trajectory=today[2], actor=reviewer, verdict="accept", reason="")
    auto_review(today[0], 90.0, cost_usd=Decimal("0.05"))
    yesterday = finished_trajectory(task, sample=3, outcome="failure", finished_at=now - timedelta(days=1),
                                    cost_usd=Decimal("0.20"))
    auto_review(yesterday, 10.0, cost_usd=Decimal("0.01"))
    Trajectory.objects.create(task=task, iteration=1, sample_index=4, status=Trajectory.Status.CANCELLED,
                              finished_at=now - timedelta(minutes=1), cost_usd=Decimal("0.30"))
    # a sub-episode's cost is already in its parent's: never counted twice
    Trajectory.all_objects.create(task=task, iteration=1, sample_index=0, parent=today[0], label="coder#0",
                                  status=Trajectory.Status.FINISHED, outcome="success",
                                  finished_at=now - timedelta(minutes=5), cost_usd=Decimal("9"))
    # outside the window: not drawn
    finished_trajectory(task, sample=5, finished_at=now - timedelta(days=overview.WINDOW_DAYS + 3))


NOON = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)


def test_the_job_computes_throughput_acceptance_and_cost_per_day(make_task, make_user):
    seed_activity(make_task, make_user, NOON)

    assert overview.refresh_activity(now=NOON) == overview.WINDOW_DAYS
    today, yesterday = NOON.date(), NOON.date() - timedelta(days=1)
    rows = {r.day: r for r in ActivityDay.objects.all()}
    assert len(rows) == overview.WINDOW_DAYS and min(rows) == today - timedelta(days=overview.WINDOW_DAYS - 1)
    t = rows[today]
    assert (t.finished, t.succeeded, t.accepted, t.human_reviewed) == (3, 2, 2, 2)
    assert (t.cost_usd, t.judge_usd) == (Decimal("0.60"), Decimal("0.05"))  # the cancelled run's cost counts
    y = rows[yesterday]
    assert (y.finished, y.accepted, y.cost_usd, y.judge_usd) == (1, 0, Decimal("0.20"), Decimal("0.01"))
    assert all(r.finished == 0 for d, r in rows.items() if d not in (today, yesterday))

    drawn = overview.activity(today=today)
    points = {p["day"]: p for p in drawn["points"]}
    assert points[today]["rate"] == pytest.approx(200 / 3)
    assert points[today]["per_accepted"] == Decimal("0.325") and points[today]["per_accepted_text"] == "$0.3250"
    assert points[yesterday]["rate"] == 0 and points[yesterday]["per_accepted"] is None  # nothing to divide by
    assert points[today - timedelta(days=2)]["rate"] is None  # nothing finished: no rate, not 0 %
    assert (drawn["finished"], drawn["accepted"], drawn["spent_text"], drawn["per_accepted_text"]) == (
        4, 2, "$0.8600", "$0.4300")


def test_a_rerun_recomputes_only_the_recent_days_until_the_older_ones_are_stale(make_task, make_user):
    seed_activity(make_task, make_user, NOON)
    assert overview.refresh_activity(now=NOON) == overview.WINDOW_DAYS
    assert overview.refresh_activity(now=NOON + timedelta(minutes=5)) == overview.RECENT_DAYS
    # a late verdict on an older day shows once its row is stale
    old = finished_trajectory(make_task(), finished_at=NOON - timedelta(days=5), outcome="failure")
    human_verdict_record(trajectory=old, actor=make_user("reviewer"), verdict="accept", reason="")
    assert overview.refresh_activity(now=NOON + timedelta(minutes=10)) == overview.RECENT_DAYS
    assert ActivityDay.objects.get(day=old.finished_at.date()).accepted == 0
    assert overview.refresh_activity(now=NOON + timedelta(hours=1, minutes=1)) == overview.WINDOW_DAYS
    assert ActivityDay.objects.get(day=old.finished_at.date()).accepted == 1


def test_the_page_draws_the_three_charts_and_the_numbers(client, make_user, make_task):
    now = timezone.now()
    seed_activity(make_task, make_user, now)
    overview.refresh_activity(now=now)

    html = html_of(client, make_user)
    for chart in ("chart-throughput", "chart-acceptance", "chart-cost", "chart-backlog"):
        figure = html[html.index(f'id="{chart}"'):]
        assert figure.index("<svg") < figure.index("</figure>")
    throughput = html[html.index('id="chart-throughput"'):html.index('id="chart-acceptance"')]
    assert f"{now:%m-%d} accepted: 2" in throughput and f"{now:%m-%d} not accepted: 1" in throughput
    assert "4 finished, 2 accepted (50 %)" in html and "$0.4300 per accepted trajectory" in html
    table = html[html.index('id="activity-table"'):]
    assert f"<td>{now:%Y-%m-%d}</td><td class=\"num\">3</td><td class=\"num\">2</td><td class=\"num\">67 %</td>" in table
    assert "Computed " in html and "not computed yet" not in html


def test_before_the_job_has_run_the_page_says_so_and_draws_no_zeros(client, make_user, make_task):
    finished_trajectory(make_task())
    html = html_of(client, make_user)
    assert "Not computed yet: the workers compute it every 5 minutes" in html
    assert "the review queue (counted by the activity job, not run yet)" in html
    assert html.count("no data</title>") == 4 * overview.WINDOW_DAYS and "<rect" not in html.split('id="activity"')[1]


def test_the_activity_job_is_scheduled_after_migrate():
    Schedule.objects.filter(name=overview.ACTIVITY_SCHEDULE).delete()
    ensure_periodic()
    schedule = Schedule.objects.get(name=overview.ACTIVITY_SCHEDULE)
    assert (schedule.func, schedule.minutes, schedule.repeats) == (overview.ACTIVITY_JOB, 5, -1)


def test_the_review_backlog_is_counted_by_the_job_and_kept_per_day(client, make_user, make_task):
    task = make_task()
    Task.objects.filter(pk=task.pk).update(current_iteration=1, status=Task.Status.WAITING_APPROVAL)
    items = [finished_trajectory(task, sample=i) for i in range(3)]
    for item in items:
        auto_review(item, 40.0)
    overview.refresh_activity(now=NOON - timedelta(days=1))
    human_verdict_record(trajectory=items[0], actor=make_user("reviewer"), verdict="accept", reason="")
    overview.refresh_activity(now=NOON)
    backlog = {r.day: r.awaiting_review for r in ActivityDay.objects.all()}
    assert backlog[NOON.date()] == 2 and backlog[NOON.date() - timedelta(days=1)] == 3
    assert backlog[NOON.date() - timedelta(days=2)] is None  # never counted that day: no data, not 0

    overview.refresh_activity()
    html = html_of(client, make_user)
    assert '<span class="n">2</span> trajectories awaiting a human verdict' in html
    assert "awaiting a human verdict: 2</title>" in html[html.index('id="chart-backlog"'):]


def test_the_last_hour_is_counted_up_to_its_cap(make_task, monkeypatch):
    task = make_task()
    for i in range(3):
        finished_trajectory(task, sample=i)
    monkeypatch.setattr(overview, "LAST_HOUR_CAP", 2)
    assert overview.live_trajectories()["last_hour"] == 2 and overview.live_trajectories()["last_hour_more"]
    monkeypatch.setattr(overview, "LAST_HOUR_CAP", 3)
    assert (overview.live_trajectories()["last_hour"], overview.live_trajectories()["last_hour_more"]) == (3, False)


def page_queries(client) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/").status_code == 200
    return len(queries)


def test_the_page_runs_the_same_queries_for_more_data(client, make_user, make_task):
    client.force_login(make_user("admin"))
    seed_activity(make_task, make_user, timezone.now())
    overview.refresh_activity()
    started = batch_of(make_task, "first", 2)
    tasks_enqueue(batch=started, actor=make_user("reviewer"))
    small = page_queries(client)
    for n in range(overview.BATCHES_SHOWN + 3):
        batch = batch_of(make_task, f"more {n}", 3)
        tasks_enqueue(batch=batch, actor=make_user("reviewer"))
        task = Task.objects.filter(batch=batch).first()
        for i in range(3):
            auto_review(finished_trajectory(task, iteration=1, sample=5 + i), 30.0)
    batch_of(make_task, "idle", 4)
    overview.refresh_activity(now=timezone.now() + timedelta(hours=2))
    large = page_queries(client)
    assert large == small <= 12
    html = client.get("/").content.decode()
    assert html.count('class="progressbar"') == overview.BATCHES_SHOWN and "every batch</a>" in html


def test_only_an_admin_sees_the_overview(client, make_user):
    for role in ("viewer", "reviewer", "approver"):
        client.force_login(make_user(role))
        assert client.get("/").status_code == 302
    assert not Review.objects.exists()


def test_the_activity_rows_are_view_only_in_the_admin(client, make_user):
    overview.refresh_activity(now=NOON)
    client.force_login(make_user("admin", is_superuser=True))
    changelist = client.get("/admin/trajplatform/activityday/")
    assert changelist.status_code == 200 and f"{NOON:%b}" in changelist.content.decode()
    row = ActivityDay.objects.get(day=NOON.date())
    assert client.get(f"/admin/trajplatform/activityday/{row.pk}/change/").status_code == 200
    assert client.post(f"/admin/trajplatform/activityday/{row.pk}/change/", {"finished": 99}).status_code == 403
    assert client.get("/admin/trajplatform/activityday/add/").status_code == 403
    row.refresh_from_db()
    assert row.finished == 0
