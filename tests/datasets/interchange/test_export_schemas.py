"""Our ADP and ATIF exports against the formats' own published models, restated here as rules (their
code is not copied):

* ADP 1.5.0 — neulab/agent-data-protocol, commit 0dc087521a121c096a27a010f4007c9b855a1474,
  `schema/trajectory.py` (Trajectory: extra fields forbidden; validate_tool_call_links: an action
  followed by an observation has a tool_call_id, an observation's id names an earlier action and is
  answered once, every action id is answered) and `schema/action/code.py` (CodeAction.description
  required, may be null); `schema/version.py` 1.5.0.
* ATIF-v1.7 — Harbor's pydantic models, `harbor/models/trajectories/*.py` of the `harbor` 0.26.0
  wheel on PyPI (every model `extra: forbid`; Step.step_id sequential from 1; model_name,
  reasoning_effort, reasoning_content, tool_calls and metrics only on agent steps; a result's
  source_call_id one of its step's calls; message a string or text/image/audio parts).

Every real file (fixtures/SOURCES.md) imported, and the rich episode, exported to each."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.datasets.interchange import ADP_VERSION, ATIF_VERSION
from tests.datasets.exporter_data import make_trajectory
from tests.datasets.interchange.test_real_files import FIXTURES, IDS, REAL_FILES, export, import_file

pytestmark = pytest.mark.django_db

ADP_TRAJECTORY = {"schema_version", "id", "content", "available_custom_tools", "available_code_languages",
                  "details"}
ADP_ACTIONS, ADP_OBSERVATIONS = ("api_action", "code_action"), ("text_observation", "web_observation",
                                                                  "image_observation")


def adp_problems(doc: dict[str, Any]) -> list[str]:
    problems = [f"unexpected field {k}" for k in sorted(doc.keys() - ADP_TRAJECTORY)]
    if doc.get("schema_version") != ADP_VERSION or ADP_VERSION != "1.5.0":
        problems.append(f"schema_version {doc.get('schema_version')!r}")
    actions: dict[str, int] = {}
    answered: dict[str, int] = {}
    items = doc["content"]
    for i, item in enumerate(items):
        kind, call_id = item["class_"], item.get("tool_call_id")
        following = items[i + 1]["class_"] if i + 1 < len(items) else None
        if kind in ADP_ACTIONS and following in ADP_OBSERVATIONS and call_id is None:
            problems.append(f"content[{i}]: an action followed by an observation without tool_call_id")
        if kind == "code_action" and "description" not in item:
            problems.append(f"content[{i}]: a code_action without description")
        if kind == "message_action" and call_id is not None:
            problems.append(f"content[{i}]: a message_action with a tool_call_id")
        if call_id is None:
            continue
        if kind in ADP_ACTIONS:
            if call_id in actions:
                problems.append(f"content[{i}]: tool_call_id {call_id!r} of two actions")
            actions[call_id] = i
        elif kind in ADP_OBSERVATIONS:
            if call_id not in actions:
                problems.append(f"content[{i}]: tool_call_id {call_id!r} names no earlier action")
            if call_id in answered:
                problems.append(f"content[{i}]: tool_call_id {call_id!r} answered twice")
            answered[call_id] = i
    problems += [f"content[{i}]: the action's tool_call_id {c!r} is never answered"
                 for c, i in actions.items() if c not in answered]
    return problems


ATIF_KEYS = {
    "trajectory": {"schema_version", "session_id", "trajectory_id", "agent", "steps", "notes", "final_metrics",
                   "continued_trajectory_ref", "extra", "subagent_trajectories"},
    "agent": {"name", "version", "model_name", "tool_definitions", "extra"},
    "final_metrics": {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_cost_usd",
                      "total_steps", "extra"},
    "step": {"step_id", "timestamp", "source", "model_name", "reasoning_effort", "message", "reasoning_content",
             "tool_calls", "observation", "metrics", "is_copied_context", "llm_call_count", "extra"},
    "metrics": {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "prompt_token_ids",
                "completion_token_ids", "logprobs", "extra"},
    "tool_call": {"tool_call_id", "function_name", "arguments", "extra"},
    "observation": {"results"},
    "result": {"source_call_id", "content", "subagent_trajectory_ref", "extra"},
}
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


def _keys(obj: Any, model: str, at: str) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{at}: not an object"]
    return [f"{at}.{k}: not a field of {model}" for k in sorted(obj.keys() - ATIF_KEYS[model])]


def _parts(content: Any, at: str) -> list[str]:
    if isinstance(content, str) or content is None:
        return []
    if not isinstance(content, list):
        return [f"{at}: neither a string nor content parts"]
    return [f"{at}[{j}]: not a text, image or audio part" for j, part in enumerate(content)
            if not (isinstance(part, dict) and part.get("type") in ("text", "image", "audio"))
            or (part["type"] == "text" and not isinstance(part.get("text"), str))
            or (part["type"] != "text" and not isinstance((part.get("source") or {}).get("path"), str))]


def atif_problems(doc: dict[str, Any]) -> list[str]:
    problems = _keys(doc, "trajectory", "line")
    if doc.get("schema_version") != ATIF_VERSION or ATIF_VERSION != "ATIF-v1.7":
        problems.append(f"schema_version {doc.get('schema_version')!r}")
    problems += _keys(doc["agent"], "agent", "agent")
    problems += [f"agent.{k}: not a string" for k in ("name", "version") if not isinstance(doc["agent"].get(k), str)]
    if doc.get("final_metrics") is not None:
        problems += _keys(doc["final_metrics"], "final_metrics", "final_metrics")
    for i, step in enumerate(doc["steps"]):
        at = f"steps[{i}]"
        problems += _keys(step, "step", at)
        if step.get("step_id") != i + 1:
            problems.append(f"{at}.step_id: {step.get('step_id')!r}, not {i + 1}")
        if step.get("source") not in ("system", "user", "agent"):
            problems.append(f"{at}.source: {step.get('source')!r}")
        if step.get("source") != "agent":
            problems += [f"{at}.{k}: only on agent steps" for k in AGENT_ONLY if step.get(k) is not None]
        if "message" not in step:
            problems.append(f"{at}.message: missing")
        problems += _parts(step.get("message"), f"{at}.message")
        if step.get("metrics") is not None:
            problems += _keys(step["metrics"], "metrics", f"{at}.metrics")
        calls = set()
        for j, call in enumerate(step.get("tool_calls") or []):
            problems += _keys(call, "tool_call", f"{at}.tool_calls[{j}]")
            if not (isinstance(call.get("tool_call_id"), str) and isinstance(call.get("function_name"), str)
                    and isinstance(call.get("arguments"), dict)):
                problems.append(f"{at}.tool_calls[{j}]: tool_call_id, function_name, arguments")
            calls.add(call.get("tool_call_id"))
        if step.get("observation") is not None:
            problems += _keys(step["observation"], "observation", f"{at}.observation")
            for j, result in enumerate(step["observation"].get("results", [])):
                problems += _keys(result, "result", f"{at}.observation.results[{j}]")
                if result.get("source_call_id") is not None and result["source_call_id"] not in calls:
                    problems.append(f"{at}.observation.results[{j}].source_call_id: not a call of its step")
                problems += _parts(result.get("content"), f"{at}.observation.results[{j}].content")
    return problems


CHECKS = {"adp": adp_problems, "atif": atif_problems}


@pytest.mark.parametrize("out", ["adp", "atif"])
@pytest.mark.parametrize("fmt,name,count,next_action", REAL_FILES, ids=IDS)
def test_a_real_file_exports_as_the_format_s_own_model_validates_it(fmt: str, name: str, count: int,
                                                                   next_action: tuple[str, ...], out: str) -> None:
    trajectories, _, _ = import_file(FIXTURES / name, fmt, "--outcome", "success", "--batch", f"{name}-{out}")
    lines, excluded = export(out, trajectories)
    assert excluded == [] and len(lines) == count
    assert [CHECKS[out](line) for line in lines] == [[]] * count


@pytest.mark.parametrize("out", ["adp", "atif"])
def test_our_rich_episode_exports_as_the_format_s_own_model_validates_it(make_task: Any, out: str) -> None:
    lines, excluded = export(out, [make_trajectory(make_task(prompt="Write primes.py"))])
    assert excluded == [] and [CHECKS[out](line) for line in lines] == [[]]


def test_an_adp_export_names_no_call_that_nothing_answers(tmp_path: Path) -> None:
    """ATIF alfworld_0 ends on an action without result (a next-action sample): its ADP action carries
    no tool_call_id (before: 'call_1~14', an id ADP 1.5.0 refuses as never answered)."""
    [trajectory], _, _ = import_file(FIXTURES / "atif/agenttuning_alfworld-ATIF-v1.7.json", "atif", "--outcome",
                                     "success")
    [line], _ = export("adp", [trajectory])
    last = line["content"][-1]
    assert last["class_"] == "api_action" and "tool_call_id" not in last
    path = tmp_path / "back.adp.jsonl"
    path.write_text(__import__("json").dumps(line))
    [back], _, _ = import_file(path, "adp", "--batch", "back")
    assert back.messages == trajectory.messages  # the id is still ours on the way back
