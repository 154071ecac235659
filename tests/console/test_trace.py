"""The trace first (issue 40, items 1 and 2), on trajectories the real loop wrote with the offline
model and stored as the worker stores them: the page opens on the task then the trace; a
multi_agent delegate step holds the role's run in place (its steps, the episode's shared reward,
not "—"); round-robin turns read as one conversation per role; every span has its timeline bar,
tokens and cost; a mobile_agent tap is drawn on the screen the agent tapped (the previous step's
screenshot), never on the result, which is shown beside it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lxml import html as lxml_html

from apps.engines.offline_model import running_offline_model
from apps.tasks import jobs
from apps.tasks.models import Trajectory
from apps.tasks.services import task_start_iteration, trajectories_finish
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_agent import call, client, llm_env, run  # noqa: F401 (llm_env is a fixture)
from tests.engines.test_gui import artifact_root  # noqa: F401 (a fixture)
from tests.engines.test_multi_agent import PROMPT, scene_config, scripts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("llm_env")]

DEMO = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "mobile_agent.jsonl"
MOBILE = {row["external_id"]: row for row in map(json.loads, DEMO.read_text(encoding="utf-8").splitlines()) if row}


def stored(make_task: Any, scripts: list[dict[str, Any]], **task: Any) -> Trajectory:
    """One iteration of a task run by the offline model through the loop, stored by trajectories_finish."""
    made = make_task(**task)
    task_start_iteration(task=made)
    [claim] = jobs.claim_trajectories(1, worker="w")
    backend = {"sandbox_backend": None} if made.scene == "mobile_agent" else {}
    with running_offline_model(scripts=scripts) as server:
        result = run(claim.trajectory.config_snapshot, client(server.url), **backend)
    [row] = trajectories_finish([{"trajectory_id": claim.pk, "claim_token": claim.token, "result": result}])
    return row


def page(client_: Any, url: str) -> Any:
    response = client_.get(url)
    assert response.status_code == 200, url
    return lxml_html.fromstring(response.content.decode())


def ids_in_order(doc: Any) -> list[str]:
    return [e.get("id") for e in doc.iter() if isinstance(e.tag, str) and e.get("id")]


@pytest.mark.usefixtures("sandbox_settings")
def test_a_delegate_step_opens_the_roles_run_in_place_with_the_shared_reward(make_task, reviewer, client):
    lead = stored(make_task, scripts(), scene="multi_agent", prompt=PROMPT, scene_config=scene_config())
    assert (lead.outcome, lead.reward) == ("success", 1.0), lead.outcome_reason
    coder, tester = lead.subtrajectories()
    assert coder.reward is None  # as stored: the episode's reward is the lead's
    client.force_login(reviewer)
    for url in (f"/trajectories/{lead.pk}/", f"/review/trajectories/{lead.pk}/"):
        doc = page(client, url)
        order = ids_in_order(doc)
        # the task first, then the trace; the judge beside it; the log after both
        assert order.index("task") < order.index("steps") < order.index("live-log")
        # step 1 delegated to the coder: the coder's run and its own steps sit right under it, before step 2
        assert order.index("step-1") < order.index(f"run-{coder.pk}") < order.index(f"run-{coder.pk}-step-1") \
            < order.index("step-2") < order.index(f"run-{tester.pk}") < order.index("step-3")
        coder_run = doc.get_element_by_id(f"run-{coder.pk}")
        assert coder_run.xpath(".//*[@class='shared-reward']")[0].text == "1.0"
        assert "write_file" in coder_run.text_content() and "wrote add.py" in coder_run.text_content()
        # the coder's steps are not the lead's: j/k and the flags index the lead's own steps only
        assert "child-step" in doc.get_element_by_id(f"run-{coder.pk}-step-1").get("class")
        assert doc.get_element_by_id(f"run-{coder.pk}-step-1").get("data-step-index") is None
        assert doc.get_element_by_id("step-2").get("data-step-index") == "1"
        # every span has its timeline bar; the delegate step lasts at least as long as the run it started
        assert len(doc.xpath("//details[contains(@class, 'step')]//span[@class='timeline']")) == \
            len(lead.steps) + len(coder.steps) + len(tester.steps)
    # the role's own page: the episode's reward, never "—"
    doc = page(client, f"/trajectories/{coder.pk}/")
    assert doc.get_element_by_id("shared-reward").text == "1.0"


@pytest.mark.usefixtures("sandbox_settings")
def test_round_robin_turns_read_as_one_conversation_per_role(make_task, viewer, client):
    prompt, post = "[rr] Agree on 6*7.", "Proposal: the answer is 42."
    roles = [{"name": "moderator"}, {"name": "alice", "tools": ["run_shell"]}, {"name": "bob", "tools": []}]
    rr = [
        {"id": "lead", "prompt": prompt, "reference_solution": [call("post", message=post), call("finish", answer="42")]},
        {"id": "alice", "prompt": f"[moderator] {post}\n\nIt is your turn, alice.", "reference_solution": [
            call("run_shell", command="echo $((6*7))"), call("say", message="42, checked", agree=True)]},
        {"id": "bob", "prompt": "[alice] 42, checked\n\nIt is your turn, bob.", "reference_solution": [
            call("say", message="agreed", agree=True)]},
    ]
    lead = stored(make_task, rr, scene="multi_agent", prompt=prompt, scene_config={
        "base_scene": "code_exec", "protocol": "round_robin", "roles": roles, "lead": "moderator", "max_rounds": 1})
    alice, bob = lead.subtrajectories()
    client.force_login(viewer)
    doc = page(client, f"/trajectories/{lead.pk}/")
    # the post step holds both turns in place
    order = ids_in_order(doc)
    assert order.index("step-1") < order.index(f"run-{alice.pk}") < order.index(f"run-{bob.pk}") < order.index("step-2")
    convos = doc.get_element_by_id("role-conversations")
    per_role = {a.xpath(".//h3")[0].text_content().strip(): [p.text for p in a.xpath(".//pre")]
                for a in convos.xpath(".//article")}
    assert per_role == {"moderator": [post], "alice": ["42, checked"], "bob": ["agreed"]}


@pytest.mark.usefixtures("artifact_root")
def test_a_tap_is_drawn_on_the_screen_the_agent_tapped_and_the_result_is_beside_it(make_task, viewer, client,
                                                                                    monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/bin/false")  # never a real adb server
    row = MOBILE["mobile-calc-37x36"]  # a vision task: the model was shown each screen
    trajectory = stored(make_task, [{"id": "s", "prompt": row["prompt"], "reference_solution": row["reference_solution"]}],
                        scene="mobile_agent", prompt=row["prompt"], scene_config=row["config"], max_steps=row["max_steps"])
    assert trajectory.reward == 1.0, trajectory.outcome_reason
    steps = trajectory.steps
    taps = [i for i, s in enumerate(steps) if isinstance(s.get("action"), dict) and s["action"].get("type") == "click"]
    assert len(taps) >= 2 and taps[0] > 0
    client.force_login(viewer)
    doc = page(client, f"/trajectories/{trajectory.pk}/")
    for i in taps:
        step = doc.get_element_by_id(f"step-{i + 1}")
        before = step.xpath(".//figure[@data-shot='before']")[0]
        after = step.xpath(".//figure[@data-shot='after']")[0]
        # the box and the point are on the previous step's screenshot: what the agent saw when it tapped
        assert before.xpath(".//img/@src") == [f"/artifacts/{steps[i - 1]['images'][-1]['artifact']}"]
        assert before.xpath(".//span[@class='action-box']") and before.xpath(".//span[@class='action-point']")
        left = float(before.xpath(".//span[@class='action-point']/@style")[0].split("left: ")[1].split("%")[0])
        assert left == pytest.approx(100 * steps[i]["action"]["x"] / steps[i - 1]["images"][-1]["width"], abs=0.01)
        # the result is beside it, with nothing drawn on it
        assert after.xpath(".//img/@src") == [f"/artifacts/{steps[i]['images'][-1]['artifact']}"]
        assert not after.xpath(".//span[@class='action-box' or @class='action-point']")
        assert steps[i - 1]["images"][-1]["artifact"] != steps[i]["images"][-1]["artifact"]
    # the first step acted on the start screen the model was shown (the first user message's image)
    first = doc.get_element_by_id("step-1").xpath(".//figure[@data-shot='before']//img/@src")
    start = next(p["image_url"]["url"] for m in trajectory.messages if isinstance(m.get("content"), list)
                 for p in m["content"] if p.get("type") == "image_url")
    assert first == [f"/artifacts/{start.split(':', 1)[1]}"]


@pytest.mark.usefixtures("sandbox_settings")
def test_the_trace_reads_its_sub_episodes_in_one_query_per_depth(make_task, viewer, client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    lead = stored(make_task, scripts(), scene="multi_agent", prompt=PROMPT, scene_config=scene_config())
    client.force_login(viewer)
    with CaptureQueriesContext(connection) as queries:
        assert client.get(f"/trajectories/{lead.pk}/").status_code == 200
    children = [q["sql"] for q in queries.captured_queries if '"parent_id" IN' in q["sql"]]
    assert len(children) == 2  # the roles, then their (no) roles: not one query per role or per step
