"""ATIF and Agent Data Protocol export and import, mini-swe-agent import: round trips on a trajectory
the real agent loop produced (offline scripted model, local sandbox) and on the rich episode, and
other tools' files (the ATIF RFC's example, an ADP trajectory, mini-swe-agent text and tool-call mode)."""
from __future__ import annotations

import base64
import io
import json
from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import CommandError, call_command

from apps.datasets.exporters import export_records, load_records, validate_line
from apps.tasks.models import Task, Trajectory
from tests.datasets.exporter_data import make_review, make_trajectory
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_agent import HELLO, HELLO_STEPS, config_for, llm_env, run, scripted  # noqa: F401
from tests.datasets.test_vision_export import episodes  # noqa: F401 (fixture: a real gui vision episode)
from tests.engines.test_gui import artifact_root  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def export(fmt: str, ids: list[int]) -> bytes:
    out = io.BytesIO()
    result = export_records(fmt, load_records(ids), out)
    assert result.lines == len(ids), result.excluded
    return out.getvalue()


def import_file(path: Path, *args: str) -> list[Trajectory]:
    before = set(Trajectory.objects.values_list("pk", flat=True))
    call_command("import_trajectories", str(path), *args, stdout=StringIO(), stderr=StringIO())
    return list(Trajectory.objects.exclude(pk__in=before).order_by("pk"))


def normalized(data: bytes, fmt: str) -> list[dict[str, Any]]:
    """Lines with the ids and batch a re-import changes taken out."""
    out = []
    for line in data.splitlines():
        obj = orjson.loads(line)
        record = obj["extra" if fmt == "atif" else "details"]["trajplatform"]
        record["trajectory_id"] = record["task_id"] = 0
        record["task"]["batch"] = ""
        obj["session_id" if fmt == "atif" else "id"] = "x"
        if fmt == "atif":
            obj["trajectory_id"] = "x"
        obj.pop("notes", None)  # names the ids too
        out.append(obj)
    return out


@pytest.fixture
def real_trajectory(make_task: Any, sandbox_settings: Any, llm_env: Any, reviewer: Any) -> Trajectory:  # noqa: F811
    """One code_exec episode of the real loop, stored as the rollout job stores it."""
    with scripted(HELLO, *HELLO_STEPS) as (_server, llm):
        result = run(config_for(HELLO), llm)
    assert result.outcome == "success"
    task = make_task(prompt=HELLO, external_id="hello-1")
    trajectory = Trajectory.objects.create(
        task=task, iteration=1, sample_index=0, status="finished", messages=result.messages, tools=result.tools,
        steps=result.steps, final_answer=result.final_answer, outcome=result.outcome,
        outcome_reason=result.outcome_reason, reward=result.reward, model=result.model,
        prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
        total_tokens=result.total_tokens)
    make_review(trajectory, overall=88)
    make_review(trajectory, kind="human", verdict="accept", reviewer=reviewer)
    return trajectory


@pytest.mark.parametrize("fmt", ["atif", "adp"])
def test_a_real_loop_trajectory_goes_out_and_comes_back_unchanged(real_trajectory: Trajectory, fmt: str,
                                                                 tmp_path: Path) -> None:
    data = export(fmt, [real_trajectory.pk])
    line = orjson.loads(data)
    assert validate_line(fmt, line) == []
    if fmt == "atif":
        assert line["schema_version"] == "ATIF-v1.7" and [s["source"] for s in line["steps"]] == [
            "system", "user", "agent", "agent", "agent"]
        write = line["steps"][2]
        assert write["message"] == "Write it." and write["tool_calls"][0]["function_name"] == "write_file"
        assert write["tool_calls"][0]["arguments"] == {"path": "hello.txt", "content": "hello\n"}
        assert write["observation"]["results"][0]["source_call_id"] == write["tool_calls"][0]["tool_call_id"]
        assert line["final_metrics"]["total_prompt_tokens"] == real_trajectory.prompt_tokens
        assert set(write["extra"]) == {"trajplatform_arguments"}
    else:
        assert line["schema_version"] == "1.5.0" and line["content"][0]["source"] == "user"
        assert [i["class_"] for i in line["content"]][:3] == ["text_observation", "api_action", "text_observation"]
        assert line["content"][1]["kwargs"] == {"path": "hello.txt", "content": "hello\n"}
        assert line["details"]["system"] == real_trajectory.messages[0]["content"]
        assert "trajplatform_messages" not in line["details"]  # the standard items say it all
    path = tmp_path / f"out.{fmt}.jsonl"
    path.write_bytes(data)
    [back] = import_file(path, "--format", fmt, "--batch", f"back-{fmt}")
    assert back.messages == real_trajectory.messages and back.tools == real_trajectory.tools
    assert back.steps == real_trajectory.steps and back.content_sha256 == real_trajectory.content_sha256
    assert back.reviews.filter(kind="human", verdict="accept").exists()
    assert normalized(export(fmt, [back.pk]), fmt) == normalized(data, fmt)


@pytest.mark.parametrize("fmt", ["atif", "adp"])
def test_the_rich_episode_round_trips_parallel_calls_null_content_and_reasoning(make_task: Any, fmt: str,
                                                                               tmp_path: Path) -> None:
    original = make_trajectory(make_task(prompt="Écris primes.py ✓"))
    data = export(fmt, [original.pk])
    assert validate_line(fmt, orjson.loads(data)) == []
    path = tmp_path / f"rich.{fmt}.jsonl"
    path.write_bytes(data)
    [back] = import_file(path, "--format", fmt, "--batch", "rich")
    assert back.messages == original.messages
    assert normalized(export(fmt, [back.pk]), fmt) == normalized(data, fmt)


ATIF_RFC_EXAMPLE = {  # the RFC's section IV example (abridged metrics)
    "schema_version": "ATIF-v1.4", "session_id": "025B810F-B3A2-4C67-93C0-FE7A142A947A",
    "agent": {"name": "harbor-agent", "version": "1.0.0", "model_name": "gemini-2.5-flash", "extra": {}},
    "notes": "Initial test trajectory", "extra": {},
    "final_metrics": {"total_prompt_tokens": 1120, "total_completion_tokens": 124, "total_cached_tokens": 200,
                      "total_cost_usd": 0.00078, "total_steps": 3, "extra": {}},
    "steps": [
        {"step_id": 1, "timestamp": "2025-10-11T10:30:00Z", "source": "user",
         "message": "What is the current trading price of Alphabet (GOOGL)?", "extra": {}},
        {"step_id": 2, "source": "agent", "model_name": "gemini-2.5-flash", "reasoning_effort": "medium",
         "message": "I will search for the current trading price and volume for GOOGL.",
         "reasoning_content": "The request requires two data points.",
         "tool_calls": [
             {"tool_call_id": "call_price_1", "function_name": "financial_search",
              "arguments": {"ticker": "GOOGL", "metric": "price"}},
             {"tool_call_id": "call_volume_2", "function_name": "financial_search",
              "arguments": {"ticker": "GOOGL", "metric": "volume"}}],
         "observation": {"results": [
             {"source_call_id": "call_price_1", "content": "GOOGL is currently trading at $185.35"},
             {"source_call_id": "call_volume_2", "content": "GOOGL volume: 1.5M shares traded."}]},
         "metrics": {"prompt_tokens": 520, "completion_tokens": 80, "cached_tokens": 200, "cost_usd": 0.00045}},
        {"step_id": 3, "source": "agent", "model_name": "gemini-2.5-flash",
         "message": "Alphabet (GOOGL) is trading at $185.35 with a volume of 1.5M shares traded."},
    ],
}


def test_an_atif_file_from_harbor_comes_in_with_its_provenance(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(ATIF_RFC_EXAMPLE))
    with pytest.raises(CommandError, match="nothing was imported"):
        import_file(path, "--format", "atif")
    [t] = import_file(path, "--format", "atif", "--outcome", "success")
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert t.messages[1]["reasoning_content"] == "The request requires two data points."
    assert [json.loads(c["function"]["arguments"]) for c in t.messages[1]["tool_calls"]] == [
        {"ticker": "GOOGL", "metric": "price"}, {"ticker": "GOOGL", "metric": "volume"}]
    assert t.messages[3] == {"role": "tool", "tool_call_id": "call_volume_2", "name": "financial_search",
                             "content": "GOOGL volume: 1.5M shares traded."}
    assert [tool["function"]["name"] for tool in t.tools] == ["financial_search"]
    assert (t.outcome, t.reward, t.model, t.prompt_tokens) == ("success", None, "gemini-2.5-flash", 1120)
    source = t.config_snapshot["imported_from"]
    assert source["format"] == "atif" and source["agent"]["name"] == "harbor-agent"
    assert source["session_id"] == ATIF_RFC_EXAMPLE["session_id"] and source["file"] == "trajectory.json"
    task = Task.objects.get(pk=t.task_id)
    assert task.external_id == ATIF_RFC_EXAMPLE["session_id"] and task.scene == "code_exec"
    assert task.prompt.startswith("What is the current trading price")
    # It goes out again as SFT data.
    assert validate_line("sft-openai", orjson.loads(export("sft-openai", [t.pk]))) == []


def test_an_adp_trajectory_comes_in_and_bad_items_are_refused(tmp_path: Path) -> None:
    adp = {"schema_version": "1.2.0", "id": "nemotron-42", "content": [
        {"class_": "text_observation", "content": "List the files.", "source": "user_msg"},
        {"class_": "api_action", "function": "execute_bash", "kwargs": {"command": "ls"}, "tool_call_id": "c1",
         "description": "I will list them."},
        {"class_": "text_observation", "content": "a.txt", "source": "environment", "tool_call_id": "c1"},
        {"class_": "message_action", "content": "There is a.txt."}],
        "details": {"dataset": "example"}}
    path = tmp_path / "adp.jsonl"
    path.write_text(json.dumps(adp) + "\n")
    [t] = import_file(path, "--format", "adp", "--outcome", "failure", "--scene", "code_exec")
    # 1.2.0's user_msg is read as user; the file's spelling is kept for the way back
    assert t.messages[0].pop("provenance") == {"format": "adp", "adp": {"source": "user_msg"}}
    assert t.messages == [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "I will list them.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "execute_bash", "content": "a.txt"},
        {"role": "assistant", "content": "There is a.txt."}]
    assert t.outcome == "failure" and t.config_snapshot["imported_from"]["details"] == {"dataset": "example"}
    assert t.config_snapshot["imported_from"]["kept"] == {"details": {"dataset": "example"}}
    adp["content"].append({"class_": "video_observation", "url": "https://example.org"})
    path.write_text(json.dumps(adp) + "\n")
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("import_trajectories", str(path), "--format", "adp", "--outcome", "success", "--batch", "x",
                     stdout=StringIO(), stderr=err)
    assert "adp.jsonl:1: not ADP: line.content[4].class_: one of text_observation" in err.getvalue()


def test_mini_swe_agent_trajectories_come_in_in_text_and_tool_call_mode(tmp_path: Path) -> None:
    text_mode = {
        "info": {"model_stats": {"instance_cost": 0.05, "api_calls": 2}, "mini_version": "2.0.0",
                 "config": {"model": {"model_name": "claude-sonnet"}, "agent_type": "DefaultAgent"},
                 "exit_status": "Submitted", "submission": "diff --git a/x b/x"},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "<task>Fix the bug</task>"},
            {"role": "assistant", "content": "THOUGHT: look.\n```mswea_bash_command\nls -la\n```",
             "extra": {"actions": [{"command": "ls -la"}], "cost": 0.003}},
            {"role": "user", "content": "<returncode>0</returncode>\n<output>x.py</output>",
             "extra": {"returncode": 0}},
            {"role": "assistant", "content": "THOUGHT: done.\n```mswea_bash_command\necho COMPLETE\n```"},
            {"role": "user", "content": "<returncode>0</returncode>\n<output></output>"},
            {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}],
        "instance_id": "owner__repo__123", "trajectory_format": "mini-swe-agent-1.1"}
    path = tmp_path / "owner__repo__123.traj.json"
    path.write_text(json.dumps(text_mode))
    [t] = import_file(path, "--format", "mini-swe-agent", "--outcome", "success")
    assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert json.loads(t.messages[2]["tool_calls"][0]["function"]["arguments"]) == {"command": "ls -la"}
    assert json.loads(t.messages[4]["tool_calls"][0]["function"]["arguments"]) == {"command": "echo COMPLETE"}
    assert t.messages[3]["tool_call_id"] == t.messages[2]["tool_calls"][0]["id"]
    assert t.final_answer == "diff --git a/x b/x" and t.model == "claude-sonnet"
    assert t.config_snapshot["imported_from"]["exit_status"] == "Submitted"
    assert Task.objects.get(pk=t.task_id).external_id == "owner__repo__123"

    tool_mode = {"info": {"exit_status": "Submitted", "submission": ""}, "instance_id": "b__c__1", "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "Do it."},
        {"role": "assistant", "content": "", "reasoning_content": "hmm", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "/repo"},
        {"role": "exit", "content": ""}]}
    path = tmp_path / "b__c__1.traj.json"
    path.write_text(json.dumps(tool_mode))
    [t] = import_file(path, "--format", "mini-swe-agent", "--outcome", "failure")
    assert t.messages[2]["reasoning_content"] == "hmm" and t.messages[3]["content"] == "/repo"
    assert validate_line("sft-trl", orjson.loads(export("sft-trl", [t.pk]))) == []


# --- ADP web and image observations ----------------------------------------------------------------

def png_data_url(color: str, size: tuple[int, int] = (8, 6)) -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


BIG_AXTREE = "\n".join(f"[{i}] link 'Van model {i}'" for i in range(2000))  # ~50k characters


def adp_web_record() -> dict[str, Any]:
    """A web-agent trajectory in ADP's own shape, built from its schema (schema/observation/web.py,
    image.py and text.py at 26c9737, trajectory.py at 1513455: every WebObservation field present,
    null where unknown, tool_call_id linking results to actions) — a WebLINX / Mind2Web-style episode."""
    return {"schema_version": "1.2.0", "id": "weblinx-rent-7", "content": [
        {"class_": "text_observation", "content": "Find a mini van in Brooklyn for April 5-8.", "source": "user_msg",
         "name": None, "reward": None},
        {"class_": "web_observation", "html": None, "axtree": "[1] RootWebArea 'Car rental'\n  [2] link 'Vans'",
         "url": "https://rent.example/", "image_observation": None, "viewport_size": [1280, 720], "reward": None},
        {"class_": "api_action", "function": "click", "kwargs": {"bid": "2"}, "description": "Open the vans.",
         "tool_call_id": "call_1", "reasoning_content": None},
        {"class_": "web_observation", "tool_call_id": "call_1", "axtree": None, "url": "https://rent.example/vans",
         "html": "<html><head><title>Vans</title><script>var tracking = 1;</script></head><body><nav><a href='/'>"
                 "Home</a></nav><h1>Vans</h1><ul><li>Mini van <button>Select</button></li><li>Cargo van</li></ul>"
                 "</body></html>",
         "image_observation": {"class_": "image_observation", "content": png_data_url("navy"),
                               "source": "environment", "annotations": None},
         "viewport_size": [1280, 720], "reward": None},
        {"class_": "api_action", "function": "scroll", "kwargs": {"dy": 500}, "tool_call_id": "call_2",
         "description": None},
        {"class_": "web_observation", "tool_call_id": "call_2", "html": None, "axtree": BIG_AXTREE,
         "url": "https://rent.example/vans?page=2", "image_observation": None, "viewport_size": None},
        {"class_": "api_action", "function": "screenshot", "kwargs": {}, "tool_call_id": "call_3"},
        {"class_": "image_observation", "content": png_data_url("teal"), "source": "environment",
         "tool_call_id": "call_3", "annotations": [
             {"text": "Mini van", "element_type": "button",
              "bounding_box": {"x": 1, "y": 2, "width": 3, "height": 4}}]},
        {"class_": "message_action", "content": "The mini van is available.", "description": None}],
        "details": {"dataset": "weblinx-demo", "website": "rent.example"}}


def test_an_adp_web_trajectory_comes_in_as_the_pages_the_agent_saw_with_its_screenshots(
        tmp_path: Path, artifact_root: Path) -> None:  # noqa: F811
    from trajplatform.artifacts import Artifact, ArtifactUse

    path = tmp_path / "web.adp.jsonl"
    path.write_text(json.dumps(adp_web_record()) + "\n")
    [t] = import_file(path, "--format", "adp", "--outcome", "success", "--scene", "gui")
    m = t.messages
    assert [x["role"] for x in m] == ["user", "user", "assistant", "tool", "user", "assistant", "tool", "assistant",
                                      "tool", "user", "assistant"]
    # The page before any action is an environment message, never the task's prompt.
    assert (m[1]["role"], m[1]["content"], m[1]["provenance"]["source"]) == (
        "user", "URL: https://rent.example/\n\n[1] RootWebArea 'Car rental'\n  [2] link 'Vans'", "environment")
    assert Task.objects.get(pk=t.task_id).prompt == "Find a mini van in Brooklyn for April 5-8."
    # HTML without an accessibility tree: its visible text (navigation kept, script and head gone).
    assert {k: m[3][k] for k in ("role", "tool_call_id", "name", "content")} == {
        "role": "tool", "tool_call_id": "call_1", "name": "click",
        "content": "URL: https://rent.example/vans\n\nHome\nVans\nMini van Select\nCargo van"}
    navy, teal = (m[4]["content"][0]["image_url"]["url"], m[9]["content"][0]["image_url"]["url"])
    assert navy.startswith("artifact:") and teal.startswith("artifact:") and navy != teal
    # The page's item is kept whole beside its first message, its screenshot a reference to the
    # stored image (kept once); the screenshot's own message says it belongs to that item.
    kept = m[3]["provenance"]["adp"]
    assert kept["class_"] == "web_observation" and kept["html"].startswith("<html><head><title>Vans")
    assert kept["image_observation"]["content"] == navy and m[4]["provenance"]["rest_of_item"] is True
    # A long tree is cut at the documented limit; the original stays with the message.
    clipped = m[6]
    assert clipped["tool_call_id"] == "call_2" and clipped["provenance"]["adp"]["axtree"] == BIG_AXTREE
    body = clipped["content"].split("\n\n", 1)[1]
    assert body.startswith(BIG_AXTREE[:20_000]) and f"cut at 20000 of {len(BIG_AXTREE)} characters" in body
    # An image result: an empty tool text, then the picture as the gui scene's screenshots come.
    assert {k: m[8][k] for k in ("role", "tool_call_id", "name", "content")} == {
        "role": "tool", "tool_call_id": "call_3", "name": "screenshot", "content": ""}
    assert m[9]["provenance"]["annotations"][0]["text"] == "Mini van"
    assert m[8]["provenance"]["adp"]["content"] == teal  # the item's image, by reference
    assert "data:image" not in json.dumps(m)  # the images are in the store only
    stored = {a.sha256: a for a in Artifact.objects.all()}
    assert set(stored) == {navy.removeprefix("artifact:"), teal.removeprefix("artifact:")}
    assert {(a.mime, a.width, a.height) for a in stored.values()} == {("image/png", 8, 6)}
    assert set(ArtifactUse.objects.filter(trajectory=t).values_list("artifact__sha256", flat=True)) == set(stored)
    assert (artifact_root / stored[navy.removeprefix("artifact:")].name).read_bytes()[:4] == b"\x89PNG"
    assert [tool["function"]["name"] for tool in t.tools] == ["click", "screenshot", "scroll"]
    assert t.config_snapshot["imported_from"]["details"] == {"dataset": "weblinx-demo", "website": "rent.example"}
    # It goes out as text SFT data (image messages left out) and as multimodal data with its pictures.
    assert validate_line("sft-openai", orjson.loads(export("sft-openai", [t.pk]))) == []
    out = io.BytesIO()
    result = export_records("sft-openai-vision", load_records([t.pk]), out, options={"images": "base64"})
    assert result.lines == 1 and validate_line("sft-openai-vision", orjson.loads(out.getvalue())) == []
    # Its ADP export is the file again, web and image observations as they were, apart from ids.
    data = export("adp", [t.pk])
    [line] = [orjson.loads(data)]
    assert validate_line("adp", line) == []
    assert {k: v for k, v in line.items() if k not in ("id", "details", "schema_version")} == {
        k: v for k, v in adp_web_record().items() if k not in ("id", "details", "schema_version")}
    assert {k: v for k, v in line["details"].items() if not k.startswith("trajplatform")} == \
        adp_web_record()["details"]
    assert "trajplatform_messages" not in line["details"]  # the items say it all: no second copy of the messages
    # And through our ADP exporter and back: the same lines apart from ids.
    again = tmp_path / "again.adp.jsonl"
    again.write_bytes(data)
    [back] = import_file(again, "--format", "adp", "--batch", "web-again")
    assert back.messages == t.messages
    assert normalized(export("adp", [back.pk]), "adp") == normalized(data, "adp")
    assert ArtifactUse.objects.filter(trajectory=back).count() == 2 and Artifact.objects.count() == 2


def test_bad_adp_web_and_image_items_are_all_reported_by_line_and_nothing_is_written(
        tmp_path: Path, artifact_root: Path) -> None:  # noqa: F811
    from trajplatform.artifacts import Artifact

    files = set(artifact_root.rglob("*.png"))  # the fixture is module-wide
    good = adp_web_record()
    linked = adp_web_record()
    linked["content"][3]["image_observation"]["content"] = "datasets/weblinx/sample_screenshot.png"
    empty = adp_web_record()
    empty["content"][1].update(axtree=None, url=None)
    broken = adp_web_record()
    broken["content"][7]["content"] = "data:image/png;base64,bm90IGEgcG5n"  # "not a png"
    unsized = adp_web_record()
    del unsized["content"][5]["viewport_size"]
    path = tmp_path / "web.adp.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (good, linked, empty, broken, unsized)) + "\n{oops\n")
    before = (Trajectory.objects.count(), Task.objects.count(), Artifact.objects.count())
    err = StringIO()
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("import_trajectories", str(path), "--format", "adp", "--outcome", "success",
                     stdout=StringIO(), stderr=err)
    reasons = err.getvalue()
    assert "web.adp.jsonl:2: not ADP: line.content[3].image_observation.content: the image " \
           "'datasets/weblinx/sample_screenshot.png' is a path or link" in reasons
    assert "web.adp.jsonl:3: not ADP: line.content[1]: a web observation with no url, axtree, html or image" in reasons
    assert "web.adp.jsonl:4: not ADP: line.content[7].content: the image's data is not a readable image/png" in reasons
    assert "web.adp.jsonl:5: not ADP: line.content[5].viewport_size: missing" in reasons
    assert "web.adp.jsonl:6: not valid JSON" in reasons and "web.adp.jsonl:1:" not in reasons
    assert (Trajectory.objects.count(), Task.objects.count(), Artifact.objects.count()) == before
    assert set(artifact_root.rglob("*.png")) == files
    # A file the raw importer refuses (its batch exists) stores none of its images either.
    path.write_text(json.dumps(good) + "\n")
    import_file(path, "--format", "adp", "--outcome", "success", "--batch", "taken")
    stored = Artifact.objects.count()
    Artifact.objects.all().delete()
    for image in artifact_root.rglob("*.png"):
        image.unlink()
    err = StringIO()
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("import_trajectories", str(path), "--format", "adp", "--outcome", "success", "--batch", "taken",
                     stdout=StringIO(), stderr=err)
    assert "batch 'taken' already exists" in err.getvalue()
    assert stored == 2 and Artifact.objects.count() == 0 and not any(artifact_root.rglob("*.png"))


def test_a_real_gui_vision_episode_goes_out_as_adp_with_its_screenshots_and_comes_back_unchanged(
        episodes: list[int], sandbox_settings: Any, llm_env: Any, tmp_path: Path,  # noqa: F811
        artifact_root: Path) -> None:  # noqa: F811
    from trajplatform import artifacts

    original = Trajectory.objects.get(pk=episodes[0])
    data = export("adp", [original.pk])
    line = orjson.loads(data)
    assert validate_line("adp", line) == []
    shown = [p["image_url"]["url"].removeprefix("artifact:") for m in original.messages
             if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"]
    images = [i for i in line["content"] if i["class_"] == "image_observation"]
    assert len(images) == len(shown) > 1 and {i["source"] for i in images} == {"environment"}
    assert [i["content"] for i in images] == [artifacts.data_url(sha) for sha in shown]
    # The browser's results stay text: their action line and page title have no WebObservation field.
    results = [i["content"] for i in line["content"] if i["class_"] == "text_observation" and i.get("tool_call_id")]
    assert "web_observation" not in {i["class_"] for i in line["content"]}
    assert any("- Page Title:" in r for r in results)
    assert line["details"]["trajplatform_messages"] == original.messages  # the images' text labels
    path = tmp_path / "gui.adp.jsonl"
    path.write_bytes(data)
    # The originals go, and their screenshots with them: the file's own images come back.
    Trajectory.objects.filter(pk__in=episodes).delete()
    assert not artifacts.Artifact.objects.filter(sha256__in=shown).exists()
    [back] = import_file(path, "--format", "adp", "--batch", "gui-back")
    assert back.messages == original.messages and back.steps == original.steps
    assert artifacts.refs_in(back.steps) <= set(shown)  # every step's screenshot was shown to the model
    assert set(back.artifact_uses.values_list("artifact__sha256", flat=True)) == set(shown)
    assert all(artifacts.read(sha)[:4] == b"\x89PNG" for sha in shown)
    assert normalized(export("adp", [back.pk]), "adp") == normalized(data, "adp")
    # Our raw format carries references only: its copy now records its uses too, so it keeps the
    # screenshots when the trajectory it was exported from is deleted.
    raw = tmp_path / "gui.raw.jsonl"
    raw.write_bytes(export("raw", [back.pk]))
    [copy] = import_file(raw, "--format", "raw", "--batch", "gui-raw")
    back.delete()
    assert set(copy.artifact_uses.values_list("artifact__sha256", flat=True)) == set(shown)
    assert all(artifacts.read(sha)[:4] == b"\x89PNG" for sha in shown)


def test_an_adp_file_without_tool_call_ids_links_each_page_to_the_action_before_it(tmp_path: Path) -> None:
    page = {"class_": "web_observation", "html": None, "image_observation": None, "viewport_size": None}
    adp = {"schema_version": "1.0.0", "id": "mind2web-3", "content": [  # Mind2Web's shape before tool_call_id
        {"class_": "text_observation", "content": "Rent a van.", "source": "user_msg"},
        {**page, "url": "https://rent.example/", "axtree": "[1] link 'Vans'"},
        {"class_": "api_action", "function": "click", "kwargs": {"xpath": "//*[@id='vans']"}, "description": None},
        {**page, "url": "https://rent.example/vans", "axtree": "[4] button 'Select'"},
        {"class_": "api_action", "function": "click", "kwargs": {"xpath": "//button"}},
        {"class_": "text_observation", "content": "Selected.", "source": "environment"},
        {"class_": "message_action", "content": "Done."}]}
    path = tmp_path / "m2w.jsonl"
    path.write_text(json.dumps(adp) + "\n")
    [t] = import_file(path, "--format", "adp", "--outcome", "failure", "--scene", "gui")
    calls = [c["id"] for m in t.messages for c in m.get("tool_calls") or []]
    assert calls == ["adp_call_2", "adp_call_4"]
    assert [(m["role"], m.get("tool_call_id")) for m in t.messages] == [
        ("user", None), ("user", None), ("assistant", None), ("tool", "adp_call_2"), ("assistant", None),
        ("tool", "adp_call_4"), ("assistant", None)]
    assert t.messages[3]["content"] == "URL: https://rent.example/vans\n\n[4] button 'Select'"
    assert validate_line("sft-openai", orjson.loads(export("sft-openai", [t.pk]))) == []
    content = orjson.loads(export("adp", [t.pk]))["content"]
    # ADP 1.5.0 (what the export writes) wants each answered action linked to its observation by id
    assert [i.pop("tool_call_id", None) for i in content] == [None, None, "adp_call_2", "adp_call_2", "adp_call_4",
                                                              "adp_call_4", None]
    assert content == adp["content"]  # the pages as the file gave them


def test_an_adp_observation_without_an_id_answers_the_turn_before_it_not_an_older_open_call(tmp_path: Path) -> None:
    adp = {"schema_version": "1.2.0", "id": "open-call", "content": [
        {"class_": "text_observation", "content": "Check the page.", "source": "user_msg"},
        {"class_": "api_action", "function": "goto", "kwargs": {"url": "https://a.example"}, "tool_call_id": "a"},
        {"class_": "message_action", "content": "The page did not load; trying another way."},
        {"class_": "api_action", "function": "reload", "kwargs": {}},
        {"class_": "web_observation", "url": "https://a.example", "axtree": "[1] heading 'A'", "html": None,
         "image_observation": None, "viewport_size": None}]}
    path = tmp_path / "open.jsonl"
    path.write_text(json.dumps(adp) + "\n")
    [t] = import_file(path, "--format", "adp", "--outcome", "failure")
    assert {k: v for k, v in t.messages[-1].items() if k != "provenance"} == {
        "role": "tool", "tool_call_id": "adp_call_3", "name": "reload",
        "content": "URL: https://a.example\n\n[1] heading 'A'"}
    assert not any(m.get("tool_call_id") == "a" for m in t.messages)  # goto's result never came
