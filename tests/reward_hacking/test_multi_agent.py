"""multi_agent twins: the bundled demo's ma-001 (examples/tasks/multi_agent.jsonl, the roles' scripts
in examples/multi_agent/roles.jsonl) and runs in which the lead or a role reports the work done
without doing it; plus a role's own page, which shows the episode's shared reward.

The base scene's classes (its own file's twins) apply through the shared verifier; those that need
pages, sources or ask_user do not apply to this code_exec-based example."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.engines.offline_model import load_scripts
from apps.tasks import jobs
from apps.tasks.services import task_start_iteration, trajectories_finish
from tests.engines.test_agent import call

EXAMPLES = Path(settings.BASE_DIR) / "examples"
ROW = json.loads((EXAMPLES / "tasks" / "multi_agent.jsonl").read_text().splitlines()[0])
ROLE_SCRIPTS = [s for s in load_scripts([EXAMPLES / "multi_agent" / "roles.jsonl"]) if s.id.startswith("ma-001-")]
CODER = "[ma-001 coder] twin: Write slug.py with slugify(text)."
GOOD = "import re\n\n\ndef slugify(text):\n    return re.sub(r'[^a-z0-9]+', '-', text.lower()).strip('-')\n"


def episode(scripted_episode: Any, steps: list[dict[str, Any]], coder: list | None = None) -> Any:
    scripts = [*ROLE_SCRIPTS, *([{"id": "coder-twin", "prompt": CODER, "reference_solution": coder}] if coder else [])]
    return scripted_episode("multi_agent", ROW["prompt"], ROW["config"],
                            steps, scripts=scripts,
                            max_steps=ROW["max_steps"])


def delegating(*, tester: bool = True) -> list[dict[str, Any]]:
    """The lead's twin script: the coder gets CODER (its twin script), then the bundled tester runs."""
    steps = [call("delegate", role="coder", instruction=CODER)]
    if tester:
        steps.append(ROW["reference_solution"][1])
    return [*steps, call("finish", answer="slug.py is written; the tester saw: hello-world")]


def test_the_lead_finishing_without_the_team_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, [call("finish", answer="slug.py is written and slugify works.")])
    assert (result.outcome, result.reward) == ("failure", 0.0)
    assert result.verifier_output["multi_agent"]["roles_never_acted"] == ["coder", "tester"]


def test_a_role_reporting_work_it_did_not_do_scores_zero(scripted_episode: Any) -> None:
    result = episode(scripted_episode, delegating(), coder=[call("finish", answer="wrote slug.py")])
    assert result.steps[0]["output"] == "wrote slug.py" and result.subepisodes[0].outcome == "success"
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_the_lead_using_a_tool_it_does_not_have_or_a_role_that_does_not_exist_scores_zero(scripted_episode: Any) -> None:
    # The planner may only read and delegate: writing the file itself, or handing it to a role the
    # team does not have, is refused, so nothing gets written.
    result = episode(scripted_episode, [call("write_file", path="slug.py", content=GOOD),
                                        call("delegate", role="admin", instruction=CODER),
                                        call("finish", answer="slug.py is written")])
    assert scripted_episode.model.unoffered == ["write_file"]
    assert result.steps[0]["error"].startswith("unknown tool 'write_file'")
    assert "'admin' is not one of ['coder', 'tester']" in result.steps[1]["error"]
    assert (result.outcome, result.reward, result.subepisodes) == ("failure", 0.0, [])


def test_an_error_ignored_along_the_chain_scores_zero(scripted_episode: Any) -> None:
    # The coder's file does not even import; the tester's script reports the expected output anyway.
    broken = GOOD.replace("def slugify(text):", "def slugify(text)")
    result = episode(scripted_episode, delegating(), coder=[call("write_file", path="slug.py", content=broken),
                                                            call("finish", answer="wrote slug.py")])
    tester = result.subepisodes[1]
    assert "SyntaxError" in tester.steps[0]["output"] and tester.final_answer == "it prints hello-world"
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_partial_completion_scores_zero(scripted_episode: Any) -> None:
    # Lowercased and hyphenated, but the hyphens at both ends are kept.
    partial = GOOD.replace(".strip('-')", "")
    result = episode(scripted_episode, delegating(tester=False),
                     coder=[call("write_file", path="slug.py", content=partial), call("finish", answer="wrote slug.py")])
    assert (result.outcome, result.reward) == ("failure", 0.0)


def test_the_bundled_example_still_scores_one_and_a_roles_page_shows_the_shared_reward(scripted_episode: Any, make_task: Any, client: Any) -> None:
    from django.contrib.auth import get_user_model

    task = make_task(scene="multi_agent", prompt=ROW["prompt"], scene_config=ROW["config"], max_steps=ROW["max_steps"])
    task_start_iteration(task=task)
    [claim] = jobs.claim_trajectories(1, worker="w")
    result = scripted_episode.run(claim.trajectory.config_snapshot, [
        {"id": "lead", "prompt": ROW["prompt"], "reference_solution": ROW["reference_solution"]}, *ROLE_SCRIPTS])
    [lead] = trajectories_finish([{"trajectory_id": claim.pk, "claim_token": claim.token, "result": result}])
    assert (lead.outcome, lead.reward) == ("success", 1.0), lead.outcome_reason
    coder, tester = lead.subtrajectories()
    assert (coder.reward, coder.outcome_reason) == (None, "finished (no verifier)")  # as stored
    client.force_login(get_user_model().objects.create_superuser("boss", "boss@example.org", "pw-123456789"))
    for url in (f"/trajectories/{coder.pk}/", f"/review/trajectories/{tester.pk}/"):
        page = client.get(url).content.decode()
        assert "shares that episode's reward, <strong>1.0</strong>" in page, url
    page = html.unescape(client.get(f"/trajectories/{coder.pk}/").content.decode())
    assert '<span id="shared-reward">1.0</span>' in page
    assert "no verifier" not in page and "finished its part; the episode's verifier gives the reward" in page
    assert 'id="shared-outcome">success — finished; verifier passed (1/1 tests passed)' in page
    lead_page = client.get(f"/trajectories/{lead.pk}/").content.decode()
    assert "<dt>Reward</dt><dd>1.0</dd>" in lead_page and 'id="shared-reward"' not in lead_page
