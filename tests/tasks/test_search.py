"""The trajectory search (apps.tasks.views._search): what it matches, and on PostgreSQL the trigram
indexes that serve its substring matches (tasks' migration 0008)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from apps.tasks.models import Trajectory
from tests.reviews.factories import finished_trajectory


@pytest.fixture
def rows(make_task):
    socks = finished_trajectory(make_task(prompt="Sort the SOCKS by colour.", external_id="laundry-7"),
                                final_answer="sorted")
    primes = finished_trajectory(make_task(prompt="Count the primes below 100."), final_answer="There are 25 Primes.")
    other = finished_trajectory(make_task(prompt="Name a colour."), final_answer="blue")
    sub = Trajectory.all_objects.create(task=other.task, parent=other, iteration=1, status="finished", outcome="success",
                                        final_answer="socks in a sub-episode")
    return socks, primes, other, sub


def listed(client, rows, **params):
    page = client.get(reverse("tasks:trajectory_list"), params)
    assert page.status_code == 200
    html = page.content.decode()
    return {t.pk for t in rows if f'href="{reverse("tasks:trajectory_detail", args=[t.pk])}"' in html}


def test_the_search_matches_prompt_answer_external_id_and_ids(client, viewer, rows):
    socks, primes, other, _sub = rows
    client.force_login(viewer)
    assert listed(client, rows, q="socks") == {socks.pk}  # the prompt, any case; not a sub-episode's answer
    assert listed(client, rows, q="primes") == {primes.pk}  # prompt and answer: listed once
    assert listed(client, rows, q="25 prim") == {primes.pk}  # the answer alone
    assert listed(client, rows, q="colour") == {socks.pk, other.pk}
    assert listed(client, rows, q="laundry-7") == {socks.pk}  # the external id
    assert listed(client, rows, q="laundry") == set()  # the external id is matched whole
    assert listed(client, rows, q=str(other.pk)) == {other.pk}
    assert listed(client, rows, q=str(primes.task_id)) >= {primes.pk}
    assert listed(client, rows, q="colour", outcome="failure") == set()  # with the other filters
    assert listed(client, rows, q="100%") == set()  # LIKE's wildcards are literal
    assert listed(client, rows, q="nothing like it") == set()


def test_postgresql_serves_the_substring_matches_from_trigram_indexes(client, viewer, rows):
    """PostgreSQL's trigram indexes serve the search (the PostgreSQL pass); SQLite has none and scans."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE '%trgm'")
            assert cursor.fetchall() == []
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE %s", ["%_trgm"])
        assert {r[0] for r in cursor.fetchall()} == {"tasks_task_prompt_trgm", "tasks_trajectory_final_answer_trgm"}
    from apps.tasks.models import Task

    # Django's own icontains SQL (UPPER(col::text) LIKE UPPER(%q%)) must match the indexes'
    # expression; with the scans of the whole table priced out, only the index can serve it.
    for queryset, index in ((Task.objects.filter(prompt__icontains="socks"), "tasks_task_prompt_trgm"),
                            (Trajectory.all_objects.filter(final_answer__icontains="primes"),
                             "tasks_trajectory_final_answer_trgm")):
        sql, params = queryset.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_indexscan = off")
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(r[0] for r in cursor.fetchall())
        assert f"Bitmap Index Scan on {index}" in plan, plan
