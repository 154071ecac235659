"""The multi_agent scene on the real loop: roles as sub-episodes over code_exec's sandbox and
verifier, driven by the offline scripted model; the sub-episodes stored as child trajectories."""
from __future__ import annotations

from typing import Any

import pytest

from apps.engines.offline_model import running_offline_model
from apps.engines.registry import SceneConfigError, validate_scene_config
from apps.tasks import jobs
from apps.tasks.models import Task, Trajectory
from apps.tasks.services import task_start_iteration, trajectories_finish
from tests.engines.test_agent import call, client, config_for, llm_env, run  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

PROMPT = "[team] Write add.py with add(a, b) returning the sum, and check it."
CODER = "[coder] Write add.py with a function add(a, b) that returns a + b."
TESTER = "[tester] Run python3 -c 'from add import add; print(add(2, 3))' and report what it prints."
VERIFIER = {"files": {"test_add.py": "from add import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
            "command": "python3 -m pytest -q"}
ROLES = [
    {"name": "planner", "system_prompt": "You plan and delegate; you do not write code.", "tools": ["read_file"]},
    {"name": "coder", "description": "writes code", "tools": ["write_file", "read_file", "run_shell"], "max_steps": 4},
    {"name": "tester", "description": "runs checks", "tools": ["run_shell"], "trainable": False},
]


def scene_config(**over: Any) -> dict[str, Any]:
    return {"base_scene": "code_exec", "base_config": {"verifier": VERIFIER}, "roles": ROLES, "lead": "planner",
            **over}


def scripts(body: str = "def add(a, b):\n    return a + b\n") -> list[dict[str, Any]]:
    return [
        {"id": "lead", "prompt": PROMPT, "reference_solution": [
            call("delegate", "the coder writes it", role="coder", instruction=CODER),
            call("delegate", role="tester", instruction=TESTER),
            call("finish", answer="add.py is written and prints 5 for add(2, 3)"),
        ]},
        {"id": "coder", "prompt": CODER, "reference_solution": [
            call("write_file", path="add.py", content=body),
            call("finish", answer="wrote add.py"),
        ]},
        {"id": "tester", "prompt": TESTER, "reference_solution": [
            call("run_shell", command="python3 -c 'from add import add; print(add(2, 3))'"),
            call("finish", answer="it prints 5"),
        ]},
    ]


def config(**over: Any) -> dict[str, Any]:
    return config_for(PROMPT, scene_config(**over), scene="multi_agent")


def test_the_lead_delegates_to_roles_that_act_in_its_sandbox_and_the_base_verifier_decides() -> None:
    with running_offline_model(scripts=scripts()) as server:
        result = run(config(), client(server.url))
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    assert [s["tool"] for s in result.steps] == ["delegate", "delegate", "finish"]
    assert result.steps[0]["output"] == "wrote add.py"
    assert result.steps[1]["subagent"] == {"role": "tester", "label": "tester#0", "outcome": "success",
                                           "reason": "finished (no verifier)", "steps": 2,
                                           "total_tokens": result.subepisodes[1].total_tokens}
    # Each role saw its own tools: the lead read_file + delegate + finish, the tester run_shell + finish.
    assert [t["function"]["name"] for t in result.tools] == ["read_file", "delegate", "finish"]
    coder, tester = result.subepisodes
    assert [t["function"]["name"] for t in tester.tools] == ["run_shell", "finish"]
    assert tester.tools[-1]["function"]["parameters"]["required"] == ["answer"]  # its report to the lead
    assert tester.steps[0]["output"].rstrip().endswith("5")  # the coder's file, in the same sandbox
    assert coder.messages[0]["content"].startswith("You are the coder of a team.")
    facts = result.verifier_output["multi_agent"]
    assert facts["roles_never_acted"] == [] and facts["shared_reward"] == 1.0
    assert [(d["role"], d["outcome"]) for d in facts["delegations"]] == [("coder", "success"), ("tester", "success")]
    assert result.verifier_output["passed"] == 1  # code_exec's pytest verifier


def test_a_wrong_role_makes_the_shared_reward_zero() -> None:
    with running_offline_model(scripts=scripts(body="def add(a, b):\n    return a - b\n")) as server:
        result = run(config(), client(server.url))
    assert (result.outcome, result.reward) == ("failure", 0.0)
    assert result.verifier_output["multi_agent"]["shared_reward"] == 0.0


def test_a_role_that_runs_out_of_steps_is_reported_to_the_lead_as_the_tools_result() -> None:
    lazy = scripts()
    lazy[1]["reference_solution"] = [call("read_file", path="nothing.txt")] * 5
    with running_offline_model(scripts=lazy) as server:
        result = run(config(), client(server.url))
    assert result.steps[0]["output"].startswith("coder did not finish (failure: max_steps (4) reached")
    assert result.steps[0]["subagent"]["outcome"] == "failure"
    assert result.reward == 0.0  # nobody wrote add.py


def test_a_role_naming_a_tool_the_base_scene_lacks_is_a_config_error() -> None:
    roles = [dict(ROLES[0]), {"name": "coder", "tools": ["write_file", "browse"]}]
    with running_offline_model(scripts=scripts()) as server:
        result = run(config(roles=roles), client(server.url))
    assert (result.outcome, result.error_kind, result.steps) == ("error", "config", [])
    assert "role coder names tools the code_exec scene does not have: browse" in result.outcome_reason


def test_cancel_reaches_the_roles() -> None:
    asked = {"n": 0}

    def should_cancel() -> bool:
        asked["n"] += 1
        return asked["n"] > 2  # the lead's first turn and the coder's first turn run, then stop

    with running_offline_model(scripts=scripts()) as server:
        result = run(config(), client(server.url), should_cancel=should_cancel)
    assert result.cancelled and result.outcome == "error"
    assert result.subepisodes[0].cancelled
    assert len(result.steps) == 1 and "cancelled" in result.steps[0]["output"]


def test_round_robin_every_role_takes_a_turn_and_consensus_is_reported() -> None:
    prompt = "[rr] Agree on 6*7."
    post = "Proposal: the answer is 42."
    roles = [{"name": "moderator"}, {"name": "alice", "tools": ["run_shell"]}, {"name": "bob", "tools": []}]

    def turn(role: str) -> str:
        return f"[moderator] {post}\n\nIt is your turn, {role}."

    rr_scripts = [
        {"id": "lead", "prompt": prompt, "reference_solution": [
            call("post", message=post), call("post", message="again?"), call("finish", answer="42")]},
        {"id": "alice", "prompt": turn("alice"), "reference_solution": [
            call("run_shell", command="echo $((6*7))"), call("say", message="42, checked", agree=True)]},
        {"id": "bob", "prompt": f"[alice] 42, checked\n\nIt is your turn, bob.", "reference_solution": [
            call("say", message="agreed", agree=True)]},
    ]
    cfg = config_for(prompt, {"base_scene": "code_exec", "protocol": "round_robin", "roles": roles,
                              "lead": "moderator", "max_rounds": 1, "consensus": "all_agree"}, scene="multi_agent")
    with running_offline_model(scripts=rr_scripts) as server:
        result = run(cfg, client(server.url))
    assert result.outcome == "success", result.outcome_reason
    first, again, _ = result.steps
    assert first["output"] == "[alice] 42, checked\n\n[bob] agreed\n\nEvery role agrees: finish with the group's answer."
    assert again["error"].startswith("the discussion has had its 1 rounds")
    alice, bob = result.subepisodes
    assert alice.steps[0]["output"].rstrip().endswith("42")
    assert "[moderator] Proposal: the answer is 42." in bob.messages[1]["content"]  # broadcast, named
    assert [t["function"]["name"] for t in bob.tools] == ["say"]
    rounds = result.verifier_output["multi_agent"]["rounds"]
    assert [(t["role"], t["agree"]) for t in rounds[0]["turns"]] == [("alice", True), ("bob", True)]


def test_sub_episodes_are_stored_as_child_trajectories_that_task_counts_leave_out(make_task) -> None:
    task = make_task(scene="multi_agent", prompt=PROMPT, scene_config=scene_config())
    task_start_iteration(task=task)
    [claim] = jobs.claim_trajectories(1, worker="w")
    trajectory = claim.trajectory
    with running_offline_model(scripts=scripts()) as server:
        result = run(trajectory.config_snapshot, client(server.url))
    [stored] = trajectories_finish([{"trajectory_id": trajectory.pk, "claim_token": claim.token, "result": result}])
    assert stored.outcome == "success"
    children = list(stored.subtrajectories())
    assert [(c.role, c.label, c.parent_step, c.status, c.outcome) for c in children] == [
        ("coder", "coder#0", 0, "finished", "success"), ("tester", "tester#0", 1, "finished", "success")]
    assert children[0].steps[0]["tool"] == "write_file" and children[0].content_sha256
    assert children[1].config_snapshot["scene_config"]["acting_role"] == "tester"
    assert (children[0].task_id, children[0].iteration, children[0].sample_index) == (task.pk, 1, 0)
    # Task-level counts see the lead only: the iteration ended and went to review.
    assert task.trajectories.count() == 1 and Trajectory.objects.count() == 1
    assert Trajectory.all_objects.count() == 3
    task.refresh_from_db()
    assert task.status == Task.Status.REVIEWING


@pytest.mark.parametrize("over, field, reason", [
    ({"lead": "boss"}, "config.lead", "must be one of the roles"),
    ({"base_scene": "multi_agent"}, "config.base_scene", "cannot compose multi_agent"),
    ({"base_scene": "nope"}, "config.base_scene", "unknown scene"),
    ({"roles": [{"name": "a"}, {"name": "a"}], "lead": "a"}, "config.roles", "must be unique"),
    ({"base_config": {"verifier": {"files": {}}}}, "config.base_config.verifier", "'command' is a required property"),
])
def test_bad_configs_are_refused_with_the_field(over: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(SceneConfigError) as err:
        validate_scene_config("multi_agent", scene_config(**over))
    assert any(f == field and reason in r for f, r in err.value.errors), err.value.errors


def _stored_episode(make_task: Any) -> Trajectory:
    task = make_task(scene="multi_agent", prompt=PROMPT, scene_config=scene_config())
    task_start_iteration(task=task)
    [claim] = jobs.claim_trajectories(1, worker="w")
    with running_offline_model(scripts=scripts()) as server:
        result = run(claim.trajectory.config_snapshot, client(server.url))
    [stored] = trajectories_finish([{"trajectory_id": claim.pk, "claim_token": claim.token, "result": result}])
    return stored


def _export(fmt: str, ids: list[int], **options: Any) -> tuple[list[dict[str, Any]], Any]:
    import io

    import orjson

    from apps.datasets.exporters import export_records, load_records

    out = io.BytesIO()
    result = export_records(fmt, load_records(ids), out, options=options or None)
    return [orjson.loads(line) for line in out.getvalue().splitlines()], result


def test_exports_give_each_trainable_roles_view_with_the_shared_reward(make_task) -> None:
    lead = _stored_episode(make_task)
    coder, tester = lead.subtrajectories()
    # Per-trajectory chat formats: the planner's and the coder's views (the tester is not trainable).
    lines, result = _export("sft-openai", [lead.pk])
    assert result.excluded == [] and len(lines) == 2
    assert lines[0]["messages"][1]["content"] == PROMPT
    assert lines[1]["messages"][1]["content"] == CODER
    # the coder's report to the lead (its finish) is its view's last assistant message (final_answer text);
    # the lead's delegate calls stay tool calls
    assert [c["function"]["name"] for m in lines[1]["messages"] if m["role"] == "assistant"
            for c in m.get("tool_calls") or ()] == ["write_file"]
    assert lines[1]["messages"][-1]["role"] == "assistant" and lines[1]["messages"][-1]["content"] == \
        coder.final_answer and "finish" not in {t["function"]["name"] for t in lines[1]["tools"]}
    assert "delegate" in {c["function"]["name"] for m in lines[0]["messages"] for c in m.get("tool_calls") or ()}
    tool, _ = _export("sft-openai", [lead.pk], final_answer="tool")
    assert [c["function"]["name"] for m in tool[1]["messages"] if m["role"] == "assistant"
            for c in m["tool_calls"]] == ["write_file", "finish"]
    rl, _ = _export("rl", [lead.pk], roles="all")
    assert [(r["trajectory_id"], r["reward"]) for r in rl] == [(lead.pk, 1.0), (coder.pk, 1.0), (tester.pk, 1.0)]
    only_lead, _ = _export("sharegpt", [lead.pk], roles="lead")
    assert len(only_lead) == 1
    named, _ = _export("sft-trl", [lead.pk], roles=["tester"])
    assert named[0]["messages"][1]["content"] == TESTER
    # raw: the whole multi-speaker record, sub-trajectories included.
    [raw], _ = _export("raw", [lead.pk])
    assert [(s["role"], s["label"], s["parent_step"]) for s in raw["subtrajectories"]] == [
        ("coder", "coder#0", 0), ("tester", "tester#0", 1)]
    # AgentJet's shape: per-agent timelines, the model's turns of trainable agents carry the loss.
    [aj], _ = _export("multiagent-agentjet", [lead.pk])
    assert aj["reward"] == 1.0 and aj["is_success"] is True
    assert [(t["agent"], t["trainable"]) for t in aj["timelines"]] == [
        ("planner", True), ("coder", True), ("tester", False)]
    coder_line = aj["timelines"][1]["messages"]
    assert [(m["role"], m["author"], m["loss_mask"]) for m in coder_line][:3] == [
        ("system", "env", 0), ("user", "env", 0), ("assistant", "llm", 1)]
    assert all(m["loss_mask"] == 0 for m in aj["timelines"][2]["messages"])
    # A scene's own format lists other scenes' trajectories as excluded, with the reason.
    from tests.datasets.exporter_data import make_trajectory

    other = make_trajectory(make_task(prompt="plain code_exec"))
    lines, result = _export("multiagent-agentjet", [other.pk, lead.pk])
    assert len(lines) == 1 and result.excluded == [{
        "trajectory_id": other.pk, "task_id": other.task_id,
        "reason": "multiagent-agentjet: for multi_agent trajectories, not code_exec"}]


def test_a_bad_roles_option_is_refused() -> None:
    with pytest.raises(ValueError, match="roles: one of trainable, lead, all"):
        _export("sft-openai", [], roles="everyone")


def test_review_checks_catch_a_repeated_delegation_and_one_nobody_answered(make_task) -> None:
    from apps.reviews.review_agent import run_checks

    twice = scripts()
    twice[0]["reference_solution"] = [
        call("delegate", role="coder", instruction=CODER),
        call("delegate", role="coder", instruction=CODER),
        call("delegate", role="tester", instruction=TESTER),
        call("finish", answer="done"),
    ]
    twice[2]["reference_solution"] = [call("run_shell", command="true")] * 3  # never finishes
    roles = [ROLES[0], ROLES[1], {**ROLES[2], "max_steps": 2}]
    task = make_task(scene="multi_agent", prompt=PROMPT, scene_config=scene_config(roles=roles))
    task_start_iteration(task=task)
    [claim] = jobs.claim_trajectories(1, worker="w")
    with running_offline_model(scripts=twice) as server:
        result = run(claim.trajectory.config_snapshot, client(server.url))
    [stored] = trajectories_finish([{"trajectory_id": claim.pk, "claim_token": claim.token, "result": result}])
    checks = run_checks(stored)
    assert checks["repeated_delegations"]["count"] == 1
    assert checks["repeated_delegations"]["detail"] == "coder got the same instruction in steps [0, 1]"
    assert checks["unanswered_delegations"]["detail"] == "tester#0 (step 2: failure)"
    assert checks["unanswered_delegations"]["penalty"] == 5
    assert [c.label for c in stored.subtrajectories()] == ["coder#0", "coder#1", "tester#0"]


def test_the_api_shows_the_roles_runs_and_each_is_retrievable(make_task) -> None:
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    lead = _stored_episode(make_task)
    user = get_user_model().objects.create_superuser("boss", "boss@example.org", "pw-123456789")
    api = APIClient()
    api.force_authenticate(user)
    body = api.get(f"/api/v1/trajectories/{lead.pk}").json()
    assert [(s["role"], s["label"], s["parent_step"], s["outcome"]) for s in body["subtrajectories"]] == [
        ("coder", "coder#0", 0, "success"), ("tester", "tester#0", 1, "success")]
    assert body["parent"] is None
    child = api.get(f"/api/v1/trajectories/{body['subtrajectories'][0]['id']}").json()
    assert (child["parent"], child["role"], child["messages"][1]["content"]) == (lead.pk, "coder", CODER)
    listed = api.get("/api/v1/trajectories").json()
    assert [t["id"] for t in listed["results"]] == [lead.pk]  # the list is of the tasks' own episodes


def test_a_platform_failure_inside_a_role_ends_the_whole_episode() -> None:
    from apps.engines.offline_model import MODEL_FAULT_PREFIX

    roles = [ROLES[0], {**ROLES[1], "model": MODEL_FAULT_PREFIX + "500"}, ROLES[2]]  # the coder's model is down
    with running_offline_model(scripts=scripts()) as server:
        result = run(config(roles=roles), client(server.url))
    assert (result.outcome, result.error_kind, result.retryable) == ("error", "infrastructure", True)
    assert result.outcome_reason.startswith("infrastructure: failed in step 0 (delegate): the coder sub-episode "
                                            "failed: LLM error")
    assert [s["tool"] for s in result.steps] == ["delegate"] and result.subepisodes[0].error_kind == "llm"


def test_roles_over_the_simulated_android_device_share_it_and_see_its_screen() -> None:
    prompt = "[phone] Have the operator turn off Wi-Fi."
    instruction = "[phone operator] Turn off Wi-Fi in Settings."
    cfg = config_for(prompt, {
        "base_scene": "mobile_agent", "lead": "lead",
        "base_config": {"mode": "simulated", "start_app": "com.android.settings", "checks": [
            {"type": "shell", "command": "settings get global wifi_on", "expect": {"equals": "0"}}]},
        "roles": [{"name": "lead", "tools": []}, {"name": "operator", "tools": ["click"]}]}, scene="multi_agent")
    steps = [
        {"id": "lead", "prompt": prompt, "reference_solution": [
            call("delegate", role="operator", instruction=instruction),
            call("finish", status="complete", summary="the operator turned Wi-Fi off")]},
        {"id": "operator", "prompt": instruction, "reference_solution": [
            call("click", index=4), call("finish", answer="Wi-Fi is off")]},
    ]
    with running_offline_model(scripts=steps) as server:
        result = run(cfg, client(server.url), sandbox_backend=None)
    assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
    operator = result.subepisodes[0]
    assert "Wi-Fi" in operator.messages[1]["content"]  # the role's first message shows the screen
    assert "Wi-Fi" in result.messages[1]["content"]    # and so does the lead's


def test_the_viewer_shows_the_roles_tree_and_opens_each_roles_view(make_task, client) -> None:
    from django.contrib.auth import get_user_model

    lead = _stored_episode(make_task)
    coder, tester = lead.subtrajectories()
    client.force_login(get_user_model().objects.create_superuser("boss", "boss@example.org", "pw-123456789"))
    page = client.get(f"/trajectories/{lead.pk}/").content.decode()
    assert 'id="subtrajectories"' in page and f'href="/trajectories/{coder.pk}/"' in page
    assert "<code>tester#0</code>" in page and "step 1" in page
    role = client.get(f"/trajectories/{coder.pk}/")
    assert role.status_code == 200
    body = role.content.decode()
    assert 'id="parent-episode"' in body and f'href="/trajectories/{lead.pk}/"' in body
    assert "write_file" in body  # the coder's own steps
    review = client.get(f"/review/trajectories/{tester.pk}/")
    assert review.status_code == 200 and 'id="parent-episode"' in review.content.decode()
    assert client.get(f"/trajectories/{coder.pk}/log?after=0").status_code == 200


def test_a_role_s_provider_is_asked_for_its_turns_and_an_unconfigured_one_is_a_config_error() -> None:
    from apps.engines.llm import LLMClient, Provider
    from apps.engines.offline_model import MODEL_NAME

    roles = [dict(ROLES[0]), {**ROLES[1], "provider": "vllm"}, dict(ROLES[2])]
    with running_offline_model(scripts=scripts()) as first, running_offline_model(scripts=scripts()) as second:
        llm = LLMClient([Provider("offline", first.url, MODEL_NAME), Provider("vllm", second.url, MODEL_NAME)],
                        limiters={})
        result = run(config(roles=roles), llm)
        assert (result.outcome, result.reward) == ("success", 1.0), result.outcome_reason
        coder, tester = result.subepisodes
        assert {s["llm"]["provider"] for s in coder.steps} == {"vllm"}
        assert {s["llm"]["provider"] for s in tester.steps + result.steps} == {"offline"}
        assert second.model.chat_requests == len(coder.steps) == 2  # only the coder's turns went there

        typo = [dict(ROLES[0]), {**ROLES[1], "provider": "deepsek"}]
        refused = run(config(roles=typo), llm)
    assert (refused.outcome, refused.error_kind, refused.steps) == ("error", "config", [])
    assert "role coder names provider 'deepsek', which is not configured (configured: offline, vllm" in \
        refused.outcome_reason
