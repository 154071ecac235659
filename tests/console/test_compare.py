"""The aligned comparison (issue 40, item 3): two rollouts of one task the real loop ran (offline
model, code_exec sandbox), side by side with their steps aligned: a step only one of them took
leaves a gap instead of shifting the rest, the first divergence is marked, differing actions and
observations carry their diffs; A / B store a preference through preference_record (audit row),
tie and skip store nothing, and each moves on to the batch's next task to compare."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.urls import reverse
from lxml import html as lxml_html

from apps.engines.offline_model import running_offline_model
from apps.reviews.alignment import align
from apps.reviews.models import Preference
from apps.tasks import jobs
from apps.tasks.models import Batch
from apps.tasks.services import task_start_iteration, trajectories_finish
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_agent import call, client, llm_env, run  # noqa: F401 (llm_env is a fixture)
from trajplatform.models import AuditEvent

PROMPT = "Write hello.py that prints hello, then run it."
WRITE = call("write_file", path="hello.py", content="print('hello')\n")
SAME = [WRITE, call("run_shell", command="python3 hello.py"), call("finish", answer="it prints hello")]
# B looks around first (a step A never took), then runs it differently
OTHER = [WRITE, call("run_shell", command="ls"), call("run_shell", command="python3 -u hello.py"),
         call("finish", answer="it prints hello")]


def two_rollouts(make_task: Any, batch: Batch, a: list[Any], b: list[Any]) -> tuple[Any, Any]:
    task = make_task(prompt=PROMPT, batch=batch, samples_per_iteration=2)
    task_start_iteration(task=task)
    claims = jobs.claim_trajectories(2, worker="w")
    finished = []
    for claim, script in zip(sorted(claims, key=lambda c: c.pk), (a, b)):
        with running_offline_model(scripts=[{"id": "s", "prompt": PROMPT, "reference_solution": script}]) as server:
            result = run(claim.trajectory.config_snapshot, client(server.url))
        finished += trajectories_finish([{"trajectory_id": claim.pk, "claim_token": claim.token, "result": result}])
    return finished[0], finished[1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("llm_env", "sandbox_settings")
def test_two_rollouts_are_aligned_with_the_first_divergence_and_a_pick_is_stored(make_task, reviewer, client):
    batch = Batch.objects.create(name="compare")
    a, b = two_rollouts(make_task, batch, SAME, OTHER)
    later_a, later_b = two_rollouts(make_task, batch, SAME, SAME)
    client.force_login(reviewer)
    url = reverse("reviews:compare", args=[a.task_id])
    doc = lxml_html.fromstring(client.get(url, {"a": a.pk, "b": b.pk}).content.decode())
    rows = doc.xpath("//table[@id='aligned']/tbody/tr[@data-row]")
    cells = [[td.text_content().split() for td in row.xpath("./td")] for row in rows]
    tools = [[c[2] if c[0] == "step" else "-" for c in row] for row in cells]
    # write_file matches; B's extra "ls" is a gap in A, not a shift; then the two runs face each other
    assert tools == [["write_file", "write_file"], ["-", "run_shell"], ["run_shell", "run_shell"],
                     ["finish", "finish"]]
    assert [r.get("data-row") for r in doc.xpath("//tr[@id='first-divergence']")] == ["2"]
    assert "no step here" in rows[1].xpath("./td")[0].text_content()
    run_b = rows[2].xpath("./td")[1]
    assert "python3 -u hello.py" in run_b.xpath(".//pre[contains(@class, 'diff')]")[0].text_content()
    assert "differs" in run_b.get("class")
    assert rows[0].get("class") == ""  # the same write, the same result
    # B is better, with a reason: stored as every preference is; the batch's next task opens
    response = client.post(reverse("reviews:prefer", args=[a.task_id]),
                           {"a": a.pk, "b": b.pk, "decision": "b", "note": "B checked the folder first"})
    assert response.url == reverse("reviews:compare", args=[later_a.task_id])
    pick = Preference.objects.get()
    assert (pick.chosen_id, pick.rejected_id, pick.note) == (b.pk, a.pk, "B checked the folder first")
    assert AuditEvent.objects.filter(action="reviews.preference", actor=reviewer).count() == 1
    # the later task's rollouts agree throughout: nothing marked
    doc = lxml_html.fromstring(client.get(response.url).content.decode())
    assert not doc.xpath("//tr[@id='first-divergence']") and "no divergence" in doc.get_element_by_id(
        "aligned-section").text_content()
    # a tie and a skip store nothing; an unknown decision is refused with a message
    for decision in ("tie", "skip"):
        response = client.post(reverse("reviews:prefer", args=[later_a.task_id]),
                               {"a": later_a.pk, "b": later_b.pk, "decision": decision}, follow=True)
        assert "no preference stored" in response.content.decode()
    response = client.post(reverse("reviews:prefer", args=[later_a.task_id]),
                           {"a": later_a.pk, "b": later_b.pk, "decision": "maybe"}, follow=True)
    assert "Unknown decision" in response.content.decode()
    assert Preference.objects.count() == 1


def _rollout(pk: int, tools: list[str], results: list[str] | None = None) -> Any:
    results = results or ["ok"] * len(tools)
    return SimpleNamespace(pk=pk, steps=[{"tool": t, "arguments": {}, "output": r} for t, r in zip(tools, results)])


def test_three_rollouts_share_the_gap_rows_and_a_different_result_is_a_divergence():
    a = _rollout(1, ["read", "write", "finish"])
    b = _rollout(2, ["read", "ls", "write", "finish"])
    c = _rollout(3, ["read", "ls", "cat", "write", "finish"], ["ok", "ok", "ok", "EACCES", "ok"])
    result = align([a, b, c])
    shape = [[cell.tool if cell else None for cell in row.cells] for row in result.rows]
    assert shape == [["read", "read", "read"], [None, "ls", "ls"], [None, None, "cat"],
                     ["write", "write", "write"], ["finish", "finish", "finish"]]
    assert result.first == 1 and result.rows[1].first
    write = result.rows[3]
    assert write.same_action and not write.same_result and write.differs
    assert "EACCES" in write.cells[2].result_diff and not write.cells[1].result_diff
    assert align([a, _rollout(4, ["read", "write", "finish"])]).first is None


def test_long_arguments_are_paired_by_their_head_and_deep_json_is_shown_not_parsed():
    body = "x = 1\n" * 1700  # ~10 KB files: the similarity reads a bounded head of each call
    a = SimpleNamespace(pk=1, steps=[{"tool": "write_file", "arguments": {"path": f"f{i}.py", "content": body + "a"},
                                      "output": "ok"} for i in range(20)])
    b = SimpleNamespace(pk=2, steps=[{"tool": "write_file", "arguments": {"path": f"f{i}.py", "content": body + "b"},
                                      "output": "ok"} for i in range(20)])
    result = align([a, b])
    assert len(result.rows) == 20 and all(row.cells[0] and row.cells[1] for row in result.rows)
    assert result.first == 0 and not result.rows[0].same_action
    deep = "[" * 5000 + "]" * 5000  # nested beyond what json parses safely: shown as the text it is
    c = SimpleNamespace(pk=3, steps=[{"tool": "run", "arguments": deep, "output": "ok"}])
    [row] = align([c, c]).rows
    assert row.same_action


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["a", "b"])
def test_a_unicode_digit_as_a_rollout_id_is_refused_not_a_500(make_task, reviewer, client, field):
    task = make_task(prompt="anything")
    client.force_login(reviewer)
    data = {"a": "1", "b": "2", "decision": "a", field: "\u00b2"}  # '²'.isdigit() is True, int('²') raises
    response = client.post(reverse("reviews:prefer", args=[task.pk]), data, follow=True)
    assert response.status_code == 200
    assert "Pick a preferred rollout (A) and the one it beats (B)." in response.content.decode()
    assert not Preference.objects.exists()
    page = client.get(reverse("reviews:compare", args=[task.pk]), {"a": "\u00b2", "b": "1"})
    assert page.status_code in (200, 302)
