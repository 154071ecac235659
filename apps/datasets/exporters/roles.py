"""Multi-agent exports: each trainable role's own view, and AgentJet's per-agent timelines.

A multi_agent trajectory (apps/engines/scenes/multi_agent/runtime.py) is the lead's episode; every other
role's work is a sub-episode stored as a child trajectory, which the canonical record carries
under `subtrajectories` (records.py; nested ones under theirs). Exports:

* Every per-trajectory chat format (sft-*, sharegpt, alpaca, rl, kto-trl, reward-score, ...)
  writes one line per selected role view: the lead's own conversation and each sub-episode's
  (its system prompt, the instruction it got, what it said and called). A view shares the
  episode's reward and outcome (AgentJet's data model: the episode's reward is every role's).
  Which roles: export option `roles` — "trainable" (default: every role whose config does not
  say `trainable: false`), "lead", "all", or a list of role names. Pairwise and one-per-task
  formats (DPO, verl, AgentJet tasks) use the lead's view only; `raw` keeps the whole record,
  sub-trajectories included (the multi-speaker transcript).
  Each view's line in sft-trl, sharegpt, alpaca, kto-trl, reward-score and rl has a `metadata`
  column {role, trajectory_id, parent_trajectory_id} (`tag_view`; null parent for the lead).
* `multiagent-agentjet`: one line per episode, the roles' timelines tagged by agent name with
  per-message author (llm | env) and loss mask (1 on the trainable agents' own turns), and the
  shared reward — AgentJet's MultiAgentContextTracker shape (ajet/context_tracker).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .chat import RenderError, render_messages

ROLE_CHOICES = ("trainable", "lead", "all")
SCENE = "multi_agent"


def check_roles_option(value: Any) -> Any:
    if isinstance(value, str) and value in ROLE_CHOICES:
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return value
    raise ValueError(f"roles: one of {', '.join(ROLE_CHOICES)}, or a non-empty list of role names")


def _role_specs(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    scene_config = (record.get("task") or {}).get("scene_config") or {}
    return {str(r.get("name")): r for r in scene_config.get("roles") or [] if isinstance(r, dict)}


def _lead(record: dict[str, Any]) -> str:
    return str(((record.get("task") or {}).get("scene_config") or {}).get("lead") or "")


def _selected(role: str, specs: dict[str, dict[str, Any]], lead: str, choice: Any) -> bool:
    if choice == "all":
        return True
    if choice == "lead":
        return role == lead
    if choice == "trainable":
        return (specs.get(role) or {}).get("trainable", True) is not False
    return role in choice


def flatten(subtrajectories: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for child in subtrajectories or []:
        yield child
        yield from flatten(child.get("subtrajectories") or [])


def views(record: dict[str, Any], choice: Any = "trainable") -> Iterator[dict[str, Any]]:
    """The record itself for any other scene; for multi_agent, the selected roles' views, each a
    record of the same shape (the role's messages, tools, steps and final answer; the episode's
    reward, outcome and reviews; `role` and `parent_trajectory_id` added)."""
    if (record.get("task") or {}).get("scene") != SCENE:
        yield record
        return
    specs, lead = _role_specs(record), _lead(record)
    if _selected(lead, specs, lead, choice):
        yield {**record, "role": lead, "parent_trajectory_id": None}
    for child in flatten(record.get("subtrajectories") or []):
        if _selected(child["role"], specs, lead, choice):
            yield {**record, **{k: child[k] for k in ("trajectory_id", "messages", "tools", "steps", "final_answer",
                                                      "content_sha256")},
                   "role": child["role"], "parent_trajectory_id": record["trajectory_id"], "subtrajectories": []}


# Per-role views' lines in these formats carry a `metadata` column {role, trajectory_id,
# parent_trajectory_id} so a trainer can tell the roles apart (their consumers keep extra columns;
# OpenAI's fine-tuning format has no place for one, and the formats with a metadata of their own
# keep theirs).
METADATA_FORMATS = frozenset({"sft-trl", "sharegpt", "alpaca", "kto-trl", "reward-score", "rl"})
METADATA_KEYS = ("role", "trajectory_id", "parent_trajectory_id")


def tag_view(fmt: str, line: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """The line with its role view's metadata column (a multi_agent view in METADATA_FORMATS)."""
    if fmt not in METADATA_FORMATS or "role" not in record:
        return line
    return {**line, "metadata": {k: record.get(k) for k in METADATA_KEYS}}


def untag_view(fmt: str, line: Any) -> tuple[Any, list[str]]:
    """(the line without a view's metadata column, what is wrong with that column): the format's
    own validator judges the rest."""
    if fmt not in METADATA_FORMATS or not isinstance(line, dict) or "metadata" not in line:
        return line, []
    meta = line["metadata"]
    rest = {k: v for k, v in line.items() if k != "metadata"}
    if not isinstance(meta, dict) or set(meta) != set(METADATA_KEYS) or not isinstance(meta["role"], str) \
            or not isinstance(meta["trajectory_id"], int) \
            or not (meta["parent_trajectory_id"] is None or isinstance(meta["parent_trajectory_id"], int)):
        return rest, ["line.metadata: must be {role: string, trajectory_id: int, parent_trajectory_id: int or null}"]
    return rest, []


def _timeline(agent: str, label: str, messages: list[dict[str, Any]], trainable: bool) -> dict[str, Any]:
    out = []
    for msg in messages:
        llm = msg["role"] == "assistant"
        out.append({**msg, "author": "llm" if llm else "env", "loss_mask": int(llm and trainable)})
    return {"agent": agent, "label": label, "trainable": trainable, "messages": out}


def render_agentjet_multiagent(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    specs, lead = _role_specs(record), _lead(record)
    if (record.get("task") or {}).get("scene") != SCENE or not lead:
        raise RenderError("not a multi_agent trajectory")

    def trainable(role: str) -> bool:
        return _selected(role, specs, lead, ctx.get("roles", "trainable"))

    lead_messages = render_messages(record, arguments="string", include_system=True)
    timelines = [_timeline(lead, lead, lead_messages, trainable(lead))]
    for child in flatten(record.get("subtrajectories") or []):
        messages = render_messages({"messages": child["messages"]}, arguments="string", include_system=True)
        timelines.append(_timeline(child["role"], child["label"], messages, trainable(child["role"])))
    task = record.get("task") or {}
    reward = record.get("reward")
    return {
        "task_id": str(task.get("external_id") or record["task_id"]),
        "main_query": task.get("prompt") or "",
        "reward": reward,
        "is_success": record.get("outcome") == "success",
        "timelines": timelines,
        "metadata": {"trajectory_id": record["trajectory_id"], "lead": lead,
                     "base_scene": (task.get("scene_config") or {}).get("base_scene") or "",
                     "agents": sorted({t["agent"] for t in timelines})},
    }


def validate_agentjet_multiagent(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in ("task_id", "main_query", "reward", "is_success", "timelines",
                                                 "metadata") if k not in obj]
    reward = obj.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        problems.append("line.reward: must be a number or null")
    timelines = obj.get("timelines")
    if not isinstance(timelines, list) or not timelines:
        return problems + ["line.timelines: must be a non-empty list"]
    for i, timeline in enumerate(timelines):
        if not isinstance(timeline, dict) or not isinstance(timeline.get("agent"), str) or not timeline["agent"]:
            problems.append(f"line.timelines[{i}]: needs an agent name")
            continue
        for j, msg in enumerate(timeline.get("messages") or []):
            if msg.get("author") not in ("llm", "env") or msg.get("loss_mask") not in (0, 1):
                problems.append(f"line.timelines[{i}].messages[{j}]: needs author llm|env and loss_mask 0|1")
            elif msg["loss_mask"] and msg["author"] != "llm":
                problems.append(f"line.timelines[{i}].messages[{j}]: loss on a message the model did not write")
    return problems
