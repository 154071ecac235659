"""What a file says that an import or export used to drop, kept (the review of issue 39's readers)."""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.datasets.test_interchange import ATIF_RFC_EXAMPLE, import_file, real_trajectory  # noqa: F401
from tests.datasets.interchange.test_export_schemas import atif_problems
from tests.datasets.interchange.test_real_files import FIXTURES, export
from tests.datasets.test_vision_export import episodes  # noqa: F401 (fixture: a real gui vision episode)
from tests.engines.test_gui import artifact_root  # noqa: F401 (fixture)
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_agent import llm_env  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = {"type": "function", "function": {
    "name": "financial_search", "description": "Look up a ticker's market data.",
    "parameters": {"type": "object", "properties": {"ticker": {"type": "string"}, "metric": {
        "type": "string", "enum": ["price", "volume"]}}, "required": ["ticker", "metric"]}}}


def test_atif_tool_definitions_are_the_trajectory_s_tools_and_ours_go_out_as_them(
        tmp_path: Path, real_trajectory: Any) -> None:  # noqa: F811
    doc = copy.deepcopy(ATIF_RFC_EXAMPLE)
    doc["agent"]["tool_definitions"] = [SEARCH["function"]]  # the inner form some producers write
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(doc))
    [t] = import_file(path, "--format", "atif", "--outcome", "success")
    # before: a spec guessed from the calls, without its description, types, enum or required list
    assert t.tools == [SEARCH]
    [line], _ = export("atif", [t])
    assert line["agent"] == doc["agent"]  # the file's agent, as it was
    [line], _ = export("atif", [real_trajectory])
    assert line["agent"]["tool_definitions"] == real_trajectory.tools and real_trajectory.tools
    bad = copy.deepcopy(doc)
    bad["agent"]["tool_definitions"] = [{"description": "no name"}]
    path.write_text(json.dumps(bad))
    with pytest.raises(Exception, match="nothing was imported"):
        import_file(path, "--format", "atif", "--outcome", "success", "--batch", "bad")


def test_what_atif_says_about_training_on_its_steps_is_said_at_import(tmp_path: Path) -> None:
    doc = copy.deepcopy(ATIF_RFC_EXAMPLE)
    doc["schema_version"] = "ATIF-v1.7"
    doc["steps"][1]["is_copied_context"] = True
    doc["steps"][2]["llm_call_count"] = 0
    doc["subagent_trajectories"] = [{"schema_version": "ATIF-v1.7", "trajectory_id": "sub-1",
                                     "agent": {"name": "helper", "version": "1"},
                                     "steps": [{"step_id": 1, "source": "user", "message": "look it up"}]}]
    path = tmp_path / "copied.json"
    path.write_text(json.dumps(doc))
    err = io.StringIO()
    call_command("import_trajectories", str(path), "--format", "atif", "--outcome", "success", stdout=io.StringIO(),
                 stderr=err)
    # before: nothing said; the copied and the scripted turns went into every chat export as the model's own
    session = doc["session_id"]
    assert [line for line in err.getvalue().splitlines() if "copied" in line or "model" in line
            or "subagent" in line] == [
        f"warning: copied.json: {session}: steps 2 are copied context (is_copied_context: ATIF says not to train on "
        "them); the chat exports train on every assistant turn",
        f"warning: copied.json: {session}: agent steps 3 ran no model (llm_call_count 0); the chat exports train on "
        "them as assistant turns",
        f"warning: copied.json: {session}: 1 embedded subagent trajectories (subagent_trajectories) are kept with the "
        "record for the export, not imported as trajectories of their own"]


def test_messages_after_mini_swe_agent_s_exit_message_are_refused_not_dropped(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "mini_swe_agent/calc-toolcall.traj.json").read_text())
    doc["messages"].append({"role": "user", "content": "one more thing"})
    path = tmp_path / "after-exit.traj.json"
    path.write_text(json.dumps(doc))
    err = io.StringIO()
    with pytest.raises(CommandError):  # before: imported, the message after the exit silently gone
        call_command("import_trajectories", str(path), "--format", "mini-swe-agent", "--outcome", "success",
                     stdout=io.StringIO(), stderr=err)
    exit_at = len(doc["messages"]) - 2
    assert f"after-exit.traj.json:1: not a mini-swe-agent trajectory: line.messages[{exit_at}]: the exit message must " \
           "be the last (1 after it)" in err.getvalue()


def test_a_real_vision_episode_goes_out_as_atif_with_its_screenshots_and_comes_back(
        episodes: list[int], sandbox_settings: Any, llm_env: Any, artifact_root: Path,  # noqa: F811
        tmp_path: Path) -> None:
    from apps.tasks.models import Trajectory
    from trajplatform import artifacts

    original = Trajectory.objects.get(pk=episodes[0])
    # before: excluded ('line.steps[2].message: a string (may be empty) or content parts'): no ATIF line at all
    [line], excluded = export("atif", [original])
    assert excluded == [] and atif_problems(line) == []
    shown = [p["image_url"]["url"].removeprefix("artifact:") for m in original.messages
             if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"]
    images = [p for s in line["steps"] if isinstance(s["message"], list) for p in s["message"] if p["type"] == "image"]
    assert [p["source"] for p in images] == [{"media_type": artifacts.get(sha).mime, "path": artifacts.data_url(sha)}
                                             for sha in shown] and len(shown) > 1
    path = tmp_path / "gui.atif.jsonl"
    path.write_text(json.dumps(line) + "\n")
    Trajectory.objects.filter(pk__in=episodes).delete()  # the screenshots go with them
    assert not artifacts.Artifact.objects.filter(sha256__in=shown).exists()
    [back] = import_file(path, "--format", "atif", "--batch", "gui-back")
    assert back.messages == original.messages and back.steps == original.steps
    assert set(back.artifact_uses.values_list("artifact__sha256", flat=True)) == set(shown)
    assert all(artifacts.read(sha)[:4] == b"\x89PNG" for sha in shown)
    # another tool's ATIF file with an inlined image: a user message with the stored image
    doc = copy.deepcopy(ATIF_RFC_EXAMPLE)
    doc["steps"][0]["message"] = [{"type": "text", "text": "What does the chart say?"}, images[0]]
    path.write_text(json.dumps(doc))
    [foreign] = import_file(path, "--format", "atif", "--outcome", "success", "--batch", "chart")
    assert foreign.messages[0]["content"] == [{"type": "text", "text": "What does the chart say?"}, {
        "type": "image_url", "image_url": {"url": f"artifact:{shown[0]}"}}]
    [again], _ = export("atif", [foreign])
    assert again["steps"][0]["message"] == doc["steps"][0]["message"]
