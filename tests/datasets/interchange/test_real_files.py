"""The files the projects publish (neulab/agent-data-protocol's ADP and ATIF samples at three schema
versions) and trajectories mini-swe-agent 2.4.6 saved (fixtures/SOURCES.md): each imports, every
action, observation and thought of the file is in the stored trajectory (its messages and the
platform's steps), it exports to sft-trl, and export -> import -> export gives the file back apart
from ids."""
from __future__ import annotations

import copy
import io
import json
from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.utils.html import escape

from apps.datasets.exporters import export_records, load_records, validate_line
from apps.datasets.interchange import ADP_VERSION, ATIF_VERSION
from apps.datasets.interchange.adp import GENERATED_CALL
from apps.tasks.models import Batch, Task, Trajectory
from tests.api.conftest import client_as, make_token  # noqa: F401 (fixtures: the API as an admin)

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parent / "fixtures"
# (import format, file, trajectories, the ones that end on an action (next-action episodes): their sft-trl
# line ends on that call, the sample's target)
REAL_FILES = [
    ("adp", "adp/agenttuning_alfworld-1.5.0.json", 1, ()),
    ("adp", "adp/agenttuning_os-1.3.1.json", 1, ()),
    ("adp", "adp/agenttuning_db-1.2.0.json", 5, ("db_356", "db_493", "db_531")),
    ("adp", "adp/agenttuning-no-version.json", 1, ()),
    ("adp", "adp/agenttuning_kg-no-version.json", 1, ()),  # api actions answered by observations labelled user
    ("adp", "adp/synatra-1.2.0.json", 1, ("1",)),  # a web observation (accessibility tree), then the next action
    ("atif", "atif/agenttuning_alfworld-ATIF-v1.7.json", 1, ("alfworld_0",)),
    ("atif", "atif/agenttuning_os-ATIF-v1.7.json", 1, ()),
    ("atif", "atif/synatra-ATIF-v1.7.json", 1, ("1",)),  # the same synatra episode through neulab's ATIF converter
    ("mini-swe-agent", "mini_swe_agent/calc-textbased.traj.json", 1, ()),
    ("mini-swe-agent", "mini_swe_agent/calc-toolcall.traj.json", 1, ()),
]
IDS = [Path(f).name for _, f, _, _ in REAL_FILES]
# What the import warns of (per trajectory and chat format): synatra's page is an environment message
# right after the user's task, and LLaMA-Factory's sharegpt alternates human and gpt turns.
SHAREGPT_TWO_USER_TURNS = ["1: not exportable as sharegpt: messages[1]: a user message after tool results that no "
                           "finish call ended"]
WARNED = {"adp/synatra-1.2.0.json": SHAREGPT_TWO_USER_TURNS, "atif/synatra-ATIF-v1.7.json": SHAREGPT_TWO_USER_TURNS}


def documents(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]


def import_file(path: Path, fmt: str, *args: str) -> tuple[list[Trajectory], str, str]:
    before = set(Trajectory.objects.values_list("pk", flat=True))
    out, err = StringIO(), StringIO()
    call_command("import_trajectories", str(path), "--format", fmt, *args, stdout=out, stderr=err)
    return list(Trajectory.objects.exclude(pk__in=before).order_by("pk")), out.getvalue(), err.getvalue()


def export(fmt: str, trajectories: list[Trajectory]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out = io.BytesIO()
    result = export_records(fmt, load_records([t.pk for t in trajectories]), out)
    return [orjson.loads(line) for line in out.getvalue().splitlines()], result.excluded


# --- what the file says, read from the file itself --------------------------------------------

def file_actions(fmt: str, doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], Any, str]]:
    """(tool, arguments, result text or None, the turn's thought on its first call) per action of the file."""
    out = []
    if fmt == "adp":
        items = doc["content"]
        results = {i["tool_call_id"]: i["content"] for i in items
                   if i["class_"] == "text_observation" and i.get("tool_call_id")}
        for k, item in enumerate(items):
            if item["class_"] == "text_observation" and item["source"] == "agent" and "ACTION:" in item["content"]:
                # the ReAct text protocol of AgentTuning's files: "THOUGHT: ...\n ACTION: <action>", answered by
                # the next (user-labelled) observation
                thought, _, action = item["content"].rpartition("ACTION:")
                after = items[k + 1] if k + 1 < len(items) else {}
                out.append(("action", {"action": action.strip()},
                            after.get("content") if after.get("source") == "user" else None,
                            thought.strip().removeprefix("THOUGHT:").strip()))
            if item["class_"] not in ("api_action", "code_action"):
                continue
            if item.get("tool_call_id"):
                result = results.get(item["tool_call_id"])
            else:  # a file without tool_call_id: the observation right after the action is its result
                after = items[k + 1] if k + 1 < len(items) else {}
                result = after.get("content") if _id_less_result(items, k + 1) else None
            if item["class_"] == "api_action":
                out.append((item["function"], item["kwargs"], result, item.get("description") or ""))
            else:
                out.append((f"execute_{item['language']}", {"code": item["content"]}, result,
                            item.get("description") or ""))
    elif fmt == "atif":
        for step in doc["steps"]:
            observation = step.get("observation") or {}
            results = {r.get("source_call_id"): r["content"] for r in observation.get("results", [])}
            for k, call in enumerate(step.get("tool_calls") or []):
                out.append((call["function_name"], call["arguments"], results.get(call["tool_call_id"]),
                            step["message"] if k == 0 else ""))
    else:
        messages = doc["messages"]
        for i, msg in enumerate(messages):
            for action in (msg.get("extra") or {}).get("actions", []) if msg["role"] == "assistant" else []:
                after = messages[i + 1]
                result = after["extra"]["exit_status"] if after["role"] == "exit" else after["content"]
                out.append(("bash", {"command": action["command"]}, result, msg["content"]))
    return out


def _id_less_result(items: list[dict[str, Any]], k: int) -> bool:
    """Item k is the result of the action without tool_call_id right before it."""
    return 0 < k < len(items) and items[k]["class_"] == "text_observation" and not items[k].get("tool_call_id") \
        and items[k]["source"] in ("user", "environment") and items[k - 1]["class_"] in ("api_action", "code_action") \
        and not items[k - 1].get("tool_call_id")


def file_texts(fmt: str, doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of what the user, the environment outside tool results and the agent outside its
    calls said, as the file says it."""
    if fmt == "adp":
        out = []
        for k, item in enumerate(doc["content"]):
            if item["class_"] == "text_observation" and not item.get("tool_call_id") \
                    and not _id_less_result(doc["content"], k):
                role = {"user": "user", "agent": "assistant"}.get(item["source"], "system/user")
                out.append((role, item["content"]))
            elif item["class_"] == "web_observation" and not item.get("tool_call_id"):  # the page the agent saw
                out.append(("system/user", "\n\n".join(p for p in (f"URL: {item['url']}" if item["url"] else "",
                                                                   item["axtree"]) if p)))
            elif item["class_"] == "message_action":
                out.append(("assistant", item["content"]))
        return out
    if fmt == "atif":
        out = []
        for s in doc["steps"]:
            results = (s.get("observation") or {}).get("results") or []
            if s["source"] == "agent" and not s["message"] and not s.get("tool_calls") and results:
                # a step that only observes (neulab's converter: the ADP page in the result's extra.web)
                out.append(("system/user", "\n\n".join(r["content"] or r["extra"]["web"]["axtree"] for r in results)))
            elif s["source"] != "agent" or not s.get("tool_calls"):
                out.append(("user" if s["source"] == "user" else "assistant", s["message"]))
        return out
    return [(m["role"], m["content"]) for m in doc["messages"] if m["role"] in ("system", "user")
            and not m["content"].startswith("<returncode>")]


def stored_texts(t: Trajectory) -> list[tuple[str, str]]:
    out = []
    for m in t.messages:
        if m["role"] in ("system", "user") or (m["role"] == "assistant" and not m.get("tool_calls")):
            role = m["role"] if m["role"] == "assistant" else (
                "system/user" if (m.get("provenance") or {}).get("source") == "environment" else m["role"])
            out.append((role, m["content"]))
    return out


def thoughts_of_messages(fmt: str, doc: dict[str, Any]) -> list[str]:
    """The thoughts the file gives assistant turns without a call (ADP message_action.description)."""
    if fmt != "adp":
        return []
    return [i["description"] for i in doc["content"] if i["class_"] == "message_action" and i.get("description")]


def normalized(fmt: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A document with what a round trip may change taken out: ids (ours, and tool-call ids a file
    repeats), the schema version (the export writes the current one) and the block that carries our
    own record, and the ids the import gave actions a file left without (`adp_call_<n>`: ADP 1.5.0
    wants an answered action and its observation linked)."""
    obj = copy.deepcopy(obj)
    if fmt == "adp":
        obj.pop("id")
        obj["schema_version"] = ADP_VERSION
        obj["details"] = {k: v for k, v in obj.get("details", {}).items() if not k.startswith("trajplatform")}
        for item in obj["content"]:
            if str(item.get("tool_call_id")).startswith(GENERATED_CALL):
                del item["tool_call_id"]
    elif fmt == "atif":
        for key in ("session_id", "trajectory_id"):
            obj.pop(key, None)
        obj["schema_version"] = ATIF_VERSION
        obj["extra"] = {k: v for k, v in (obj.get("extra") or {}).items() if k != "trajplatform"}
        for step in obj["steps"]:
            for call in step.get("tool_calls") or []:
                call["tool_call_id"] = "id"
            for result in (step.get("observation") or {}).get("results", []):
                result["source_call_id"] = "id"
    return obj


# --- the files -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("fmt", "name", "count", "open_ended"), REAL_FILES, ids=IDS)
def test_a_real_file_imports_with_what_it_says_as_steps_and_exports_for_training(
        fmt: str, name: str, count: int, open_ended: tuple[str, ...]) -> None:
    path = FIXTURES / name
    trajectories, out, err = import_file(path, fmt, "--outcome", "success")
    assert len(trajectories) == count
    assert "hashed again" not in out  # the import writes the content hash of what it stored
    assert [line.removeprefix(f"warning: {path.name}: ") for line in err.splitlines()
            if line.startswith("warning:")] == WARNED.get(name, [])
    for t, doc in zip(trajectories, documents(path)):
        assert t.content_sha256 == t.compute_content_sha256()
        steps = [(s["tool"], s["arguments"], s["output"] if "error" not in s else None, s["thought"]) for s in t.steps]
        assert steps == file_actions(fmt, doc)
        assert [s["index"] for s in t.steps] == list(range(len(t.steps)))
        assert stored_texts(t) == file_texts(fmt, doc)
        reasoning = [m["reasoning_content"] for m in t.messages
                     if m["role"] == "assistant" and not m.get("tool_calls") and m.get("reasoning_content")]
        assert reasoning == thoughts_of_messages(fmt, doc)
    lines, excluded = export("sft-trl", trajectories)
    assert not excluded and len(lines) == count and all(validate_line("sft-trl", line) == [] for line in lines)
    # a next-action episode's line ends on its last call, unanswered as in the file; the others do not
    names = [Task.objects.get(pk=t.task_id).external_id for t in trajectories]
    ends_on_call = [n for n, line in zip(names, lines) if line["messages"][-1].get("tool_calls")]
    assert ends_on_call == list(open_ended)


@pytest.mark.parametrize(("fmt", "name", "count", "open_ended"), REAL_FILES, ids=IDS)
def test_a_real_file_goes_out_again_as_it_came_apart_from_ids(fmt: str, name: str, count: int,
                                                              open_ended: tuple[str, ...], tmp_path: Path) -> None:
    path = FIXTURES / name
    trajectories, _, _ = import_file(path, fmt, "--outcome", "success")
    lines, excluded = export(fmt, trajectories)
    assert not excluded and all(validate_line(fmt, line) == [] for line in lines)
    assert [normalized(fmt, line) for line in lines] == [normalized(fmt, doc) for doc in documents(path)]
    if fmt == "adp":  # the standard items say the messages exactly: no copy of them rides along
        assert not any("trajplatform_messages" in line["details"] for line in lines)
    # and our export comes back as the same trajectory (its record rides along)
    again = tmp_path / "again.jsonl"
    again.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    back, _, _ = import_file(again, fmt, "--outcome", "success", "--batch", "again")
    assert [b.messages for b in back] == [t.messages for t in trajectories]
    assert [b.steps for b in back] == [t.steps for t in trajectories]


def test_a_code_action_stays_a_code_action_with_its_language() -> None:
    [t], _, _ = import_file(FIXTURES / "adp/agenttuning_os-1.3.1.json", "adp", "--outcome", "success")
    call = t.messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "execute_bash", "arguments": '{"code": "ls /etc"}'}
    assert t.tools == [{"type": "function", "function": {"name": "execute_bash", "description": "", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}}}}]
    [line], _ = export("adp", [t])
    assert line["content"][1] == {"class_": "code_action", "language": "bash", "content": "ls /etc",
                                  "tool_call_id": "call_000001",
                                  "description": "To count the files in /etc, I need to print all the files in it."}


def test_a_no_version_file_reads_its_opening_environment_text_as_the_system_prompt_and_agent_text_as_turns() -> None:
    [t], _, _ = import_file(FIXTURES / "adp/agenttuning-no-version.json", "adp", "--outcome", "success")
    assert [m["role"] for m in t.messages[:5]] == ["system", "user", "assistant", "user", "assistant"]
    assert t.messages[0]["content"].startswith("Interact with a household")
    assert Task.objects.get(pk=t.task_id).prompt == "Ok? Understood?"
    assert t.messages[4]["content"].startswith("THOUGHT: In order to achieve the task")
    assert t.config_snapshot["imported_from"]["schema_version"] is None
    # its ReAct text turns stay text (the prompt asks for "THOUGHT: ...\n ACTION: ..."; no tool is
    # declared anywhere) and are the platform's steps, the next user message each one's result
    assert not any(m.get("tool_calls") for m in t.messages) and t.tools == []
    first = t.steps[0]
    assert (first["tool"], first["arguments"], first["format"], first["output"]) == (
        "action", {"action": "inventory"}, "react_text", "You are not carrying anything.")
    assert first["thought"].startswith("In order to achieve the task") and first["observation"].startswith(
        "Here is your task.")
    assert [s["arguments"]["action"] for s in t.steps][-2:] == ["go to bed 1", "put cellphone 1 in/on bed 1"]


def test_mini_swe_agent_s_closing_submit_is_answered_by_its_exit_status_and_return_codes_are_exit_codes() -> None:
    for name in ("calc-textbased.traj.json", "calc-toolcall.traj.json"):
        [t], _, _ = import_file(FIXTURES / "mini_swe_agent" / name, "mini-swe-agent", "--outcome", "success")
        assert [s["exit_code"] for s in t.steps] == [0, 0, 0]
        assert t.steps[-1]["output"] == "Submitted"
        assert t.steps[-1]["arguments"]["command"].startswith("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
        assert t.final_answer.startswith("diff --git a/calc.py b/calc.py")
        assert t.config_snapshot["imported_from"]["mini_version"] == "2.4.6"
        assert t.steps[1]["output"].count("5") >= 1 and t.steps[1]["observation"].startswith("<returncode>0") \
            == (name == "calc-textbased.traj.json")


def test_mini_swe_agent_s_test_fixture_a_bare_message_list_is_refused_with_one_error_saying_what_it_is() -> None:
    err = StringIO()
    before = Trajectory.objects.count()
    with pytest.raises(CommandError, match="1 problem"):
        call_command("import_trajectories", str(FIXTURES / "mini_swe_agent/local.traj.json"), "--format",
                     "mini-swe-agent", "--outcome", "success", stdout=StringIO(), stderr=err)
    [line] = err.getvalue().splitlines()
    assert "local.traj.json: a bare list of 6 chat messages (role/content), not a mini-swe-agent file" in line
    assert "{info, messages, trajectory_format}" in line
    assert Trajectory.objects.count() == before


def test_a_file_in_another_format_is_refused_with_one_error_naming_the_format_it_is() -> None:
    err = StringIO()
    with pytest.raises(CommandError, match="1 problem"):
        call_command("import_trajectories", str(FIXTURES / "atif/agenttuning_os-ATIF-v1.7.json"), "--format", "adp",
                     "--outcome", "success", stdout=StringIO(), stderr=err)
    assert err.getvalue().strip().endswith("an ATIF trajectory (ATIF-v1.7), not an adp file; import it with format atif")


def test_every_atif_extra_and_unknown_field_comes_back_on_export(tmp_path: Path) -> None:
    [doc] = documents(FIXTURES / "atif/agenttuning_os-ATIF-v1.7.json")
    # the real file, with an extra at every level ATIF has one and fields of a later 1.x
    doc["agent"]["extra"] = {"harness": "agentbench"}
    step = doc["steps"][1]
    step.update(timestamp="2025-12-01T10:00:00Z", metrics={"prompt_tokens": 812, "completion_tokens": 40},
                extra={"latency_ms": 920}, future_step_field=[1, 2])
    step["tool_calls"][0]["extra"] = {"language": "bash"}
    step["observation"]["extra"] = {"sandbox": "docker"}
    step["observation"]["results"][0]["extra"] = {"exit_code": 0}
    doc["final_metrics"] = {"total_steps": 8, "extra": {"solved": True}}
    doc["continued_trajectory_ref"] = "os_1-part2"
    path = tmp_path / "os_1.atif.json"
    path.write_text(json.dumps(doc))
    [t], _, _ = import_file(path, "atif", "--outcome", "failure")
    assert t.model == "" and t.config_snapshot["imported_from"]["agent"]["name"] == "agenttuning_os"
    [line], _ = export("atif", [t])
    assert line["agent"] == {"name": "agenttuning_os", "version": "raw", "extra": {"harness": "agentbench"}}
    assert normalized("atif", line) == normalized("atif", doc)


def test_adp_s_current_top_level_fields_and_a_later_1x_field_are_kept_not_refused(tmp_path: Path) -> None:
    [doc] = documents(FIXTURES / "adp/agenttuning_os-1.3.1.json")
    doc.update(schema_version="1.7.0", available_code_languages=["bash"], available_custom_tools=[],
               available_apis=None, future_field={"x": 1})
    doc["content"][1]["future_item_field"] = "kept"
    path = tmp_path / "os_42.adp.json"
    path.write_text(json.dumps(doc))
    [t], _, _ = import_file(path, "adp", "--outcome", "success")
    assert t.config_snapshot["imported_from"]["kept"]["future_field"] == {"x": 1}
    [line], _ = export("adp", [t])
    assert line["schema_version"] == ADP_VERSION and line["available_code_languages"] == ["bash"]
    assert line["content"][1]["future_item_field"] == "kept"
    assert normalized("adp", line) == normalized("adp", doc)
    doc["schema_version"] = "2.0.0"
    path.write_text(json.dumps(doc))
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("import_trajectories", str(path), "--format", "adp", "--outcome", "success",
                     stdout=StringIO(), stderr=err)
    assert "line.schema_version: '2.0.0' is not a version this reader takes" in err.getvalue()


def test_our_own_trajectory_exports_to_mini_swe_agent_and_reads_back(make_task: Any, tmp_path: Path) -> None:
    from tests.datasets.exporter_data import make_trajectory

    original = make_trajectory(make_task(prompt="Write primes.py"))
    [line], excluded = export("mini-swe-agent", [original])
    assert not excluded and validate_line("mini-swe-agent", line) == []
    assert line["trajectory_format"] == "mini-swe-agent-1.1" and line["messages"][-1]["role"] == "exit"
    assert line["info"]["submission"] == original.final_answer
    path = tmp_path / "ours.traj.jsonl"
    path.write_bytes(orjson.dumps(line) + b"\n")
    [back], _, _ = import_file(path, "mini-swe-agent", "--outcome", "success", "--batch", "mini")
    calls = [c["function"]["name"] for m in back.messages for c in m.get("tool_calls") or []]
    assert calls == [c["function"]["name"] for m in original.messages for c in m.get("tool_calls") or []]
    assert back.final_answer == original.final_answer


# --- the API speaks API ---------------------------------------------------------------------------

URL = "/api/v1/imports/trajectories"


def test_the_api_names_its_fields_not_the_command_s_flags(client_as: Any) -> None:
    data = (FIXTURES / "adp/agenttuning_os-1.3.1.json").read_bytes()
    missing = client_as("admin").post(URL, {"file": SimpleUploadedFile("os.json", data), "format": "adp"},
                                      format="multipart")
    assert missing.status_code == 400, missing.content
    error = missing.json()["error"]
    assert list(error["details"]["fields"]) == ["outcome"] and "--" not in json.dumps(error)
    Batch.objects.create(name="taken")
    taken = client_as("admin").post(URL, {"file": SimpleUploadedFile("os.json", data), "format": "adp",
                                          "outcome": "success", "batch": "taken"}, format="multipart")
    assert taken.status_code == 400, taken.content
    error = taken.json()["error"]
    assert error["details"]["fields"] == {"batch": ["batch 'taken' already exists; give the import a new batch name"]}
    assert "--batch" not in json.dumps(error)
    ok = client_as("admin").post(URL, {"file": SimpleUploadedFile("alfworld.json", (
        FIXTURES / "atif/agenttuning_alfworld-ATIF-v1.7.json").read_bytes()), "format": "atif", "outcome": "failure"},
        format="multipart")
    assert ok.status_code == 201, ok.content
    assert ok.json()["rehashed"] == 0 and ok.json()["warnings"] == []
    # a call the file leaves unanswered in mid-episode: no chat format takes it, and the answer says so
    [doc] = documents(FIXTURES / "atif/agenttuning_alfworld-ATIF-v1.7.json")
    del doc["steps"][4]["observation"]
    gap = client_as("admin").post(URL, {"file": SimpleUploadedFile("gap.json", json.dumps(doc).encode()),
                                        "format": "atif", "outcome": "failure", "batch": "gap"}, format="multipart")
    assert gap.status_code == 201, gap.content
    assert [w.split(": ")[2] for w in gap.json()["warnings"]] == ["not exportable as sft-trl",
                                                                 "not exportable as sft-openai",
                                                                 "not exportable as sharegpt"]
    assert all(w.startswith("gap.json: alfworld_0: ") for w in gap.json()["warnings"])


def test_the_command_names_its_flags() -> None:
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("import_trajectories", str(FIXTURES / "adp/agenttuning_os-1.3.1.json"), "--format", "adp",
                     stdout=StringIO(), stderr=err)
    assert "say which it is: outcome success or failure (--outcome success|failure)" in err.getvalue()


def test_a_version_of_imported_next_action_episodes_counts_them_in_its_chat_formats(approver: Any) -> None:
    from apps.datasets.services import dataset_version_create
    from tests.datasets.version_data import no_dedup

    trajectories, _, _ = import_file(FIXTURES / "adp/agenttuning_db-1.2.0.json", "adp", "--outcome", "success",
                                     "--batch", "agenttuning-db")
    version = dataset_version_create(dataset_name="imported-db", actor=approver,
                                     filter_spec=no_dedup(batches=["agenttuning-db"]))
    assert version.counts["train"] + version.counts["validation"] == len(trajectories) == 5
    formats = version.data_card["exportability"]["formats"]
    for fmt in ("sft-trl", "sft-openai", "sharegpt"):  # 3 of the 5 end on their code action, as the file does
        assert (formats[fmt]["lines"]["all"], formats[fmt]["excluded"], formats[fmt]["reasons"]) == (5, 0, {}), fmt


def test_next_action_lines_render_through_real_chat_templates_with_the_last_call_trained_on(tmp_path: Path) -> None:
    """TRL's training templates (tests/datasets/chat_templates) render a line that ends on the
    assistant's call, and the call lies inside the assistant mask: the sample's target is learnt."""
    from apps.datasets import templates

    trajectories = import_file(FIXTURES / "adp/agenttuning_db-1.2.0.json", "adp", "--outcome", "success")[0] + \
        import_file(FIXTURES / "atif/agenttuning_alfworld-ATIF-v1.7.json", "atif", "--outcome", "success",
                    "--batch", "alfworld")[0]
    lines, _ = export("sft-trl", trajectories)
    path = tmp_path / "next-action.sft-trl.jsonl"
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines if line["messages"][-1].get("tool_calls")))
    chat_templates = Path(__file__).parents[1] / "chat_templates"
    for name in ("qwen2_5_training", "qwen3_training"):
        report = templates.check_file(path, "sft-trl", templates.load_template(str(chat_templates / f"{name}.jinja")))
        assert len(report.records) == 4 and all(r.ok for r in report.records), (name, report.summary())
        assert all(r.mask == "checked" and r.tool_calls == r.tool_results + 1 for r in report.records), name


@pytest.mark.parametrize(("fmt", "name"), [("atif", "atif/agenttuning_alfworld-ATIF-v1.7.json"),
                                           ("mini-swe-agent", "mini_swe_agent/calc-textbased.traj.json"),
                                           ("adp", "adp/agenttuning-no-version.json")])
def test_the_console_and_the_review_checks_see_an_imported_trajectory_s_steps(fmt: str, name: str, client: Any,
                                                                               viewer: Any) -> None:
    from apps.reviews.review_agent import run_checks

    [t], _, _ = import_file(FIXTURES / name, fmt, "--outcome", "success")
    checks = run_checks(t)
    assert checks["unknown_tools"]["count"] == 0 and checks["invalid_arguments"]["count"] == 0
    if fmt == "atif":  # alfworld_0's last call has no result: its step says so, and the check counts it
        assert t.steps[-1]["error"] == "the file has no result for this call"
        assert checks["unhandled_errors"]["count"] == 1
    client.force_login(viewer)
    page = client.get(f"/trajectories/{t.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert all(s["tool"] in html for s in t.steps)
    if fmt == "adp":  # the text protocol's actions, as steps
        assert checks["unhandled_errors"]["count"] == 0 and checks["repeated_actions"]["count"] == 0
        assert all(escape(s["arguments"]["action"]) in html for s in t.steps)


def test_adp_shapes_that_were_no_chat_become_one_turn_and_a_result_and_still_go_back_exactly(tmp_path: Path) -> None:
    """Two shapes of ADP files without tool_call_id (1.0.0's), built on ADP's schema: the agent says
    something and then acts (a message_action, then an action without description), and the
    environment's answer labelled user. Read as one assistant turn and the call's result, they
    export to sft-trl; the ADP export writes the items as they were."""
    doc = {"schema_version": "1.0.0", "id": "said-then-acted", "content": [
        {"class_": "text_observation", "content": "Count the files in /etc.", "source": "user"},
        {"class_": "message_action", "content": "I will list them first.", "description": None},
        {"class_": "code_action", "language": "bash", "content": "ls /etc | wc -l", "description": ""},
        {"class_": "text_observation", "content": "220", "source": "user"},
        {"class_": "message_action", "content": "<solution> 220 </solution>"}], "details": {}}
    path = tmp_path / "said.adp.json"
    path.write_text(json.dumps([doc]))
    [t], _, err = import_file(path, "adp", "--outcome", "success")
    assert "warning:" not in err
    roles = [(m["role"], bool(m.get("tool_calls"))) for m in t.messages]
    assert roles == [("user", False), ("assistant", True), ("tool", False), ("assistant", False)]
    assert t.messages[1]["content"] == "I will list them first." and t.messages[2]["content"] == "220"
    assert [(s["tool"], s["output"], s["thought"]) for s in t.steps] == [
        ("execute_bash", "220", "I will list them first.")]
    [line], excluded = export("sft-trl", [t])
    assert not excluded and validate_line("sft-trl", line) == []
    [back], _ = export("adp", [t])
    assert normalized("adp", back) == normalized("adp", doc)
