"""The trajectory viewer (issue 28, item 3): collapsed steps with a one-line summary, code as
highlighted source, file writes as diffs, errors in red, state before / after, no "live" label on a
finished trajectory; the list's score, verdict and batch columns, filters and search."""
from __future__ import annotations

import pytest
from django.urls import reverse

from apps.tasks.models import Trajectory
from tests.reviews.factories import auto_review, finished_trajectory

pytestmark = pytest.mark.django_db

STEPS = [
    {"index": 0, "turn": 1, "tool": "write_file", "arguments": {"path": "primes.py", "content": "print(2)\n"},
     "observation": "Print the first primes.", "thought": "start small", "output": "wrote 9 bytes", "exit_code": 0,
     "duration_ms": 3, "llm": {"usage": {"total_tokens": 321}}},
    {"index": 1, "turn": 2, "tool": "write_file",
     "arguments": {"path": "primes.py", "content": "for p in (2, 3, 5):\n    print(p)\n"},
     "observation": "wrote 9 bytes", "thought": "", "output": "wrote 33 bytes", "exit_code": 0, "duration_ms": 2},
    {"index": 2, "turn": 3, "tool": "run_shell", "arguments": {"command": "python primes.py | grep -c ."},
     "observation": "wrote 33 bytes", "thought": "", "output": "Traceback: boom", "exit_code": 1, "duration_ms": 40},
    {"index": 3, "turn": 4, "tool": "add_item", "arguments": {"name": "milk"}, "observation": "", "thought": "",
     "output": "error: no such list", "env_error": "no such list", "exit_code": None,
     "state_before": {"lists": {}}, "state_after": {"lists": {}}},
    {"index": 4, "turn": 5, "tool": "add_list", "arguments": {"name": "shop"}, "observation": "", "thought": "",
     "output": "ok", "exit_code": None, "state_before": {"lists": {}}, "state_after": {"lists": {"shop": []}}},
]


@pytest.fixture
def rich(make_task):
    task = make_task()
    return finished_trajectory(task, steps=STEPS)


def test_steps_are_collapsed_lines_with_tool_summary_outcome_time_and_tokens(client, viewer, rich):
    client.force_login(viewer)
    html = client.get(reverse("tasks:trajectory_detail", args=[rich.pk])).content.decode()
    assert html.count('<details class="step') == len(STEPS)
    assert "<details class=\"step is-ok\" id=\"step-1\"" in html and " open" not in html.split('id="step-1"')[1][:40]
    first = html.split('id="step-1"')[1].split("</summary>")[0]
    for part in ("write_file", "primes.py", "exit 0", "3 ms", "321 tokens"):
        assert part in first, part
    assert '<details class="step is-error" id="step-3"' in html  # exit 1 in red
    assert '<details class="step is-error" id="step-4"' in html  # an environment error is never green
    assert "environment error" in html.split('id="step-4"')[1].split("</summary>")[0]


def test_code_is_highlighted_and_a_rewrite_is_a_diff(client, viewer, rich):
    client.force_login(viewer)
    html = client.get(reverse("tasks:trajectory_detail", args=[rich.pk])).content.decode()
    step1 = html.split('id="step-1"')[1].split('id="step-2"')[0]
    assert "new file" in step1 and 'class="highlight"' in step1 and "\\n" not in step1
    step2 = html.split('id="step-2"')[1].split('id="step-3"')[0]
    assert '<pre class="text diff">' in step2
    assert '<span class="del">-print(2)</span>' in step2 and '<span class="add">+    print(p)</span>' in step2
    step3 = html.split('id="step-3"')[1].split('id="step-4"')[0]
    assert 'class="highlight"' in step3 and "grep" in step3 and "part result error" in step3


def test_state_before_and_after_is_a_diff(client, viewer, rich):
    client.force_login(viewer)
    html = client.get(reverse("tasks:trajectory_detail", args=[rich.pk])).content.decode()
    step4 = html.split('id="step-4"')[1].split('id="step-5"')[0]
    assert "State before → after" in step4 and "unchanged" in step4
    step5 = html.split('id="step-5"')[1]
    assert '<span class="add">+    &quot;shop&quot;: []</span>' in step5


def test_an_observation_that_repeats_the_previous_result_is_not_shown_again(client, viewer, rich):
    client.force_login(viewer)
    html = client.get(reverse("tasks:trajectory_detail", args=[rich.pk])).content.decode()
    assert html.count("wrote 33 bytes") == 1 and "Print the first primes." in html


def test_a_finished_trajectory_is_not_labelled_live(client, viewer, rich, make_task):
    client.force_login(viewer)
    html = client.get(reverse("tasks:trajectory_detail", args=[rich.pk])).content.decode()
    assert 'data-final="true"' in html and "Live log" not in html
    running = Trajectory.objects.create(task=make_task(), iteration=1, status="running")
    html = client.get(reverse("tasks:trajectory_detail", args=[running.pk])).content.decode()
    assert 'data-final="false"' in html and "Live log" in html


def test_the_list_has_score_verdict_batch_and_review_link_and_searches(client, viewer, make_task, reviewer):
    from apps.reviews.services import human_verdict_record

    a = finished_trajectory(make_task(prompt="Sort the socks by colour."), final_answer="sorted")
    b = finished_trajectory(make_task(prompt="Count the primes below 100."), final_answer="25")
    auto_review(a, 73.0)
    human_verdict_record(trajectory=a, actor=reviewer, verdict="reject", reason="odd socks left")
    client.force_login(viewer)
    html = client.get(reverse("tasks:trajectory_list")).content.decode()
    for header in ("Batch", "Score", "Verdict", "Review"):
        assert f"<th>{header}</th>" in html
    assert ">73<" in html and 'verdict-reject' in html and a.task.batch.name in html
    assert f'href="{reverse("reviews:trajectory", args=[a.pk])}"' in html

    def listed(**params):
        page = client.get(reverse("tasks:trajectory_list"), params).content.decode()
        return {t.pk for t in (a, b) if f'href="{reverse("tasks:trajectory_detail", args=[t.pk])}"' in page}

    assert listed(q="socks") == {a.pk}
    assert listed(q=str(b.pk)) == {b.pk}
    assert listed(verdict="reject") == {a.pk}
    assert listed(verdict="none") == {b.pk}
    assert listed(batch=b.task.batch.name) == {b.pk}
    assert client.get(reverse("tasks:trajectory_list"), {"q": "a\x00b", "batch": "x"}).status_code == 200


def test_the_list_does_not_query_per_row(client, viewer, make_task, django_assert_max_num_queries):
    for _ in range(20):
        auto_review(finished_trajectory(make_task()), 50.0)
    client.force_login(viewer)
    with django_assert_max_num_queries(8):
        assert client.get(reverse("tasks:trajectory_list")).status_code == 200
