"""The system prompt agrees with the final answer's form (issue 38 item 1): in the default text form every
chat line's system message says to answer in text. Each scene's runtime declares, beside its system
prompt, the rewrites of the sentences that name its finish tool (`text_form_rewrites`); these tests render
the CURRENT prompt of every scene in every branch that mentions finish and check that after the rewrites
nothing names the finish tool and the prompt still says how to end (in text); then a real-loop code_exec
episode's sft-trl line, a multi_agent team's lines (delegate stays a tool), the tool form (the prompt as it
ran) and an episode recorded by an older prompt (counted on the export and the card, warned about)."""
from __future__ import annotations

import io
import logging
import re
from typing import Any

import orjson
import pytest

from apps.datasets.exportability import measure
from apps.datasets.exporters import export_records, load_records
from apps.datasets.exporters.answers import as_text
from apps.engines.registry import get_runtime, text_form_rewrites
from apps.tasks.models import Trajectory

CODE = {"verifier": {"command": "test -f hello.txt"}}
OPS = [{"name": "add_item", "description": "add an item",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}]
ENV = {"env_name": "shop", "env_description": "a small shop", "operations": OPS}
ROLES = [{"name": "planner", "description": "plans"}, {"name": "coder", "description": "codes"}]


def _team(protocol: str, acting: str | None = None) -> dict[str, Any]:
    scene = {"base_scene": "code_exec", "base_config": CODE, "protocol": protocol, "roles": ROLES, "lead": "planner"}
    return {**scene, "acting_role": acting} if acting else scene


# (scene, episode config) for every branch of each scene's prompt that names its finish tool
CASES: list[tuple[str, dict[str, Any]]] = [
    ("code_exec", {"scene_config": {}}),
    ("code_exec", {"scene_config": CODE, "max_steps": 8}),
    ("envscaler", {"scene_config": ENV, "max_steps": 5}),
    ("envscaler", {"scene_config": {"env_name": "shop", "operations": []}}),
    # toolace's mt mode prompt is the generation conversation's: its dialogue is stored under this one
    ("toolace", {"scene_config": ENV, "max_steps": 6}),
    ("gui", {"scene_config": {}}),
    ("gui", {"scene_config": {"vision": True}, "max_steps": 4}),
    ("mobile_agent", {"scene_config": {}}),
    ("mobile_agent", {"scene_config": {"vision": True}, "max_steps": 4}),
    ("toucan", {"scene_config": {"target_servers": ["weather"]}, "max_steps": 4}),
    ("deep_search", {"scene_config": {}}),
    ("deep_search", {"scene_config": {"output": "report", "browse": True, "explore": True}, "max_steps": 9}),
    ("search2qa", {"scene_config": {"seed": "Ada Lovelace"}}),
    ("search2qa", {"scene_config": {"seed": "Ada Lovelace", "qa_mode": "answer"}}),
    *[("search2qa", {"scene_config": {}, "search2qa_stage": stage}) for stage in ("evolve", "no_tool", "uniqueness")],
    ("multi_agent", {"scene_config": _team("delegate")}),
    ("multi_agent", {"scene_config": _team("delegate", "coder")}),
    ("multi_agent", {"scene_config": _team("round_robin")}),
    ("multi_agent", {"scene_config": _team("round_robin", "coder")}),
]
FINISH_TOOLS = {"search2qa": ("propose_qa", "evolve_qa", "answer", "judge_uniqueness"), "multi_agent": ("say",)}


def _named(text: str, scene: str) -> list[str]:
    """Where a prompt names a finish tool: a call `name(`, "call(s/ing) name", `name`, the word finish."""
    found = re.findall(r"(?i)\bfinish\b", text)
    for name in FINISH_TOOLS.get(scene, ()):
        found += re.findall(rf"(?i)\b{name}\(|\bcall(?:s|ing)?\s+`?{name}\b|`{name}`", text)
    return found


def _record(scene: str, config: dict[str, Any], prompt: str) -> dict[str, Any]:
    return {"trajectory_id": 1, "task_id": 1, "task": {"scene": scene, "scene_config": config["scene_config"]},
            "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "do it"}]}


@pytest.mark.parametrize(("scene", "config"), CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_every_scenes_prompt_reads_as_answer_in_text_after_its_rewrites(scene: str, config: dict[str, Any]) -> None:
    prompt = get_runtime(scene).system_prompt(config)
    assert _named(prompt, scene), "the prompt as it runs names its finish tool"
    stale: list[str] = []
    [system, user] = as_text(_record(scene, config, prompt), stale)["messages"]
    assert stale == []
    assert _named(system["content"], scene) == [], system["content"]
    assert "in text" in system["content"], system["content"]  # it says how to end: with a text reply
    assert user == {"role": "user", "content": "do it"}
    if config.get("max_steps"):
        assert f"You have at most {config['max_steps']} replies." in system["content"]


@pytest.mark.parametrize("scene", sorted({s for s, _ in CASES}))
def test_every_declared_sentence_is_in_the_current_prompt(scene: str) -> None:
    """A rewrite whose sentence the prompt no longer has is a prompt edited without its text form."""
    prompts = "\n".join(get_runtime(s).system_prompt(c) for s, c in CASES if s == scene)
    own = get_runtime(scene).text_form_rewrites
    assert own and [old for old in own if old not in prompts] == []


def test_multi_agent_takes_its_base_scenes_rewrites_and_delegate_stays() -> None:
    rewrites = text_form_rewrites("multi_agent", _team("delegate"))
    assert set(get_runtime("code_exec").text_form_rewrites) < set(rewrites)
    prompt = get_runtime("multi_agent").system_prompt({"scene_config": _team("delegate")})
    text = as_text(_record("multi_agent", {"scene_config": _team("delegate")}, prompt))["messages"][0]["content"]
    assert "Hand work to a role with delegate(role, instruction)" in text
    assert "- run_shell(command)" in text and "## The environment" in text


# -- on the real loop's episodes (fixtures of test_final_answers) ---------------------------------------------------

from tests.datasets.test_final_answers import _hello, _store, loop_ids  # noqa: E402, F401 (loop_ids is a fixture)
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: E402, F401 - fixtures
from tests.engines.test_agent import llm_env  # noqa: E402, F401 (fixture)


def _lines(fmt: str, ids: list[int], **options: Any) -> tuple[Any, list[dict[str, Any]]]:
    buf = io.BytesIO()
    result = export_records(fmt, load_records(ids), buf, options=options or None)
    return result, [orjson.loads(line) for line in buf.getvalue().splitlines()]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_a_real_code_exec_episodes_sft_trl_line_says_to_answer_in_text(loop_ids: dict[str, int]) -> None:
    ran = _hello("native").messages[0]["content"]
    assert "Call finish(answer) when you are done" in ran  # the prompt the model saw
    result, [line] = _lines("sft-trl", [loop_ids["native"]])
    system = line["messages"][0]
    assert system["role"] == "system" and _named(system["content"], "code_exec") == []
    assert "then reply in text, without a tool call, with your answer" in system["content"]
    assert "run_shell(command)" in system["content"]
    assert line["messages"][-1]["role"] == "assistant" and not line["messages"][-1].get("tool_calls")
    assert result.stale_prompts == []
    # the tool form keeps the prompt as it ran
    _, [tool_line] = _lines("sft-trl", [loop_ids["native"]], final_answer="tool")
    assert tool_line["messages"][0]["content"] == ran


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_a_json_text_episodes_tool_section_loses_finish(loop_ids: dict[str, int]) -> None:
    ran = _hello("json").messages[0]["content"]
    assert "## How to call a tool" in ran and "\n- finish: " in ran
    result, [line] = _lines("sft-trl", [loop_ids["json"]])
    system = line["messages"][0]["content"]
    assert _named(system, "code_exec") == [] and result.stale_prompts == []
    assert "when you are done, reply in text with no JSON object" in system
    assert "\n- write_file: " in system and "\n- run_shell: " in system  # the other tools stay listed
    assert line["messages"][-1]["content"] == "hello.txt written"
    _, [tool_line] = _lines("sft-trl", [loop_ids["json"]], final_answer="tool")
    assert tool_line["messages"][0]["content"] == ran


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_a_multi_agent_teams_lines_say_to_answer_in_text(loop_ids: dict[str, int]) -> None:
    _, lines = _lines("sft-trl", [loop_ids["multi_agent"]])
    assert len(lines) >= 2  # the lead's view and a delegated role's
    for line in lines:
        system = line["messages"][0]["content"]
        assert _named(system, "multi_agent") == [] and "in text" in system, system
    assert any("delegate(role, instruction)" in line["messages"][0]["content"] for line in lines)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "llm_env")
def test_an_older_prompt_no_rewrite_matches_is_counted_and_warned(make_task: Any, caplog: Any) -> None:

    played = _hello("native")
    old = [{**played.messages[0], "content": "You are an agent. Call the finish tool when done."}, *played.messages[1:]]
    pk = _store(make_task(prompt="hello", external_id="old"), played, messages=old).pk
    with caplog.at_level(logging.WARNING, logger="apps.datasets.exporters"):
        result, [line] = _lines("sft-trl", [pk])
    assert line["messages"][0]["content"] == old[0]["content"]  # exported as it is, not guessed at
    assert [s["trajectory_id"] for s in result.stale_prompts] == [pk]
    assert "'finish'" in result.stale_prompts[0]["reason"]
    assert "1 record(s) end on a text answer but their system prompt still names the finish tool" in caplog.text
    # the card counts them per format (and only for the text form); the dry run logs nothing
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="apps.datasets.exporters"):
        card = measure([(pk, Trajectory.objects.get(pk=pk).task_id, "train")], ["code_exec"])
    assert card["formats"]["sft-trl"]["stale_prompts"] == 1 and card["formats"]["sharegpt"]["stale_prompts"] == 1
    assert "stale_prompts" not in card["formats"]["raw"]
    assert "still names the finish tool" not in caplog.text
