"""Loaders for the anchors' released datasets, written the way their users read the rows (each
dataset's card, loader and converter code; see tests/datasets/anchor_rows/SOURCES.md). The same
loader reads the real rows in tests/datasets/anchor_rows/ and our exports: a row it cannot read
fails the test. They share no code with apps/datasets/exporters."""
from __future__ import annotations

import ast
import base64
import enum
import io
import json
import re
from pathlib import Path
from typing import Any

from PIL import Image

ANCHORS = Path(__file__).resolve().parent / "anchor_rows"

# The released Toucan dataset's columns and their dtypes (its card's dataset_info, all configs).
TOUCAN_FEATURES = {name: "string" for name in (
    "uuid", "subset_name", "messages", "question", "available_tools", "target_tools",
    "question_quality_assessment", "response_quality_assessment", "metadata")}
# Android in the Wild's features (its README's "Dataset format") as JSON types of the JSON form.
AITW_FEATURES = {
    "android_api_level": int, "current_activity": str, "device_type": str, "episode_id": str, "episode_length": int,
    "goal_info": str, "image/channels": int, "image/encoded": str, "image/height": int, "image/width": int,
    "image/ui_annotations_positions": list, "image/ui_annotations_text": list, "image/ui_annotations_ui_types": list,
    "results/action_type": int, "results/type_action": str, "results/yx_lift": list, "results/yx_touch": list,
    "step_id": int,
}


def anchor_rows(name: str) -> list[dict[str, Any]]:
    path = ANCHORS / name
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(path.read_text(encoding="utf-8"))


# -- Toucan -----------------------------------------------------------------------------------


def load_toucan(row: dict[str, Any]) -> dict[str, Any]:
    """A Toucan row as its users read it: json.loads of the JSON-text columns, then the turns the way
    Toucan's own ms-swift converter walks them (assistant function_call -> a tool call, role function
    -> a tool response, system skipped), each call's arguments parsed, each name an offered tool."""
    messages = json.loads(row["messages"])
    tools = [t["function"] for t in json.loads(row["available_tools"])]
    names = {t["name"] for t in tools}
    assessments = {k: json.loads(row[k]) if row.get(k) else None
                   for k in ("question_quality_assessment", "response_quality_assessment")}
    turns: list[tuple[str, Any]] = []
    for msg in messages:
        role = msg["role"]
        if role == "system":
            continue
        if role == "assistant" and "function_call" in msg:
            call = msg["function_call"]
            assert call["name"] in names, call["name"]
            turns.append(("tool_call", {"name": call["name"], "arguments": json.loads(call["arguments"])}))
        elif role == "function":
            assert turns and any(k == "tool_call" and v["name"] == msg["name"] for k, v in turns), msg["name"]
            turns.append(("tool_response", msg["content"]))
        elif role in ("user", "assistant"):
            turns.append((role, msg["content"] if msg["content"] != "" else msg.get("reasoning_content", "")))
        else:
            raise ValueError(f"Unknown role: {role}")
    assert turns[0][0] == "user" and turns[-1][0] == "assistant" and turns[-1][1], turns[-1]
    targets = [t.strip() for t in row.get("target_tools", "").split(",") if t.strip()]
    # Toucan's tool-call accuracy: a target tool counts when it is a substring of a called tool's name
    called = [v["name"] for k, v in turns if k == "tool_call"]
    used = sum(1 for t in targets if any(t in c for c in called))
    metadata = json.loads(row["metadata"]) if row.get("metadata") else None
    return {"uuid": row["uuid"], "subset": row["subset_name"], "turns": turns, "tools": tools,
            "desired_tools_used": used / len(targets) if targets else 1.0, "metadata": metadata, **assessments}


# -- ToolACE ----------------------------------------------------------------------------------

TOOLACE_ANCHOR = "Here is a list of functions in JSON format that you can invoke:"
_CALL = re.compile(r"\s*([^\[\](),=\"']+?)\((.*?)\)\s*(?:,|$)", re.S)


def _toolace_calls(value: str) -> list[dict[str, Any]] | None:
    """An assistant turn's bracket calls, the way converters of ToolACE read them, or None for text."""
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    calls = []
    for name, source in _CALL.findall(text[1:-1]):
        tree = ast.parse(f"f({source})", mode="eval").body
        assert isinstance(tree, ast.Call) and not tree.args
        calls.append({"name": name.strip(), "arguments": {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords}})
    return calls or None


def load_toolace(row: dict[str, Any]) -> dict[str, Any]:
    """A ToolACE row: the function list after the anchor in the system prompt, the bracket calls of
    assistant turns, the JSON list of {name, results} of tool turns; every call names a listed tool."""
    after = row["system"].split(TOOLACE_ANCHOR, 1)[1].lstrip("\n")
    tools, _ = json.JSONDecoder().raw_decode(after)
    names = {t["name"] for t in tools}
    messages: list[dict[str, Any]] = [{"role": "system", "content": row["system"].split(TOOLACE_ANCHOR, 1)[0]}]
    open_calls: list[str] = []
    for turn in row["conversations"]:
        who, value = turn["from"], turn["value"]
        if who == "assistant" and (calls := _toolace_calls(value)):
            assert {c["name"] for c in calls} <= names, calls
            open_calls = [c["name"] for c in calls]
            messages.append({"role": "assistant", "tool_calls": calls})
        elif who == "tool":
            results = json.loads(value)
            assert [r["name"] for r in results] == open_calls, (results, open_calls)
            messages += [{"role": "tool", "name": r["name"], "content": json.dumps(r["results"])} for r in results]
        else:
            assert who in ("user", "assistant"), who
            messages.append({"role": who, "content": value})
    assert messages[-1]["role"] == "assistant" and messages[-1].get("content")
    return {"tools": tools, "messages": messages}


# -- Android in the Wild -----------------------------------------------------------------------


class ActionType(enum.IntEnum):
    """AitW's action types (android_in_the_wild/action_type.py)."""

    TYPE = 3
    DUAL_POINT = 4
    PRESS_BACK = 5
    PRESS_HOME = 6
    PRESS_ENTER = 7
    STATUS_TASK_COMPLETE = 10
    STATUS_TASK_IMPOSSIBLE = 11


def load_aitw(rows: list[dict[str, Any]], *, image_root: Path | None = None,
              inline: bool = False) -> dict[str, list[dict[str, Any]]]:
    """AitW steps grouped into episodes by episode_id (ordered by step_id), as its visualisation and
    action-matching code reads them: boxes (y, x, h, w) scaled by the screen size, the action's type
    by AitW's enum, a dual point a tap when touch and lift are within 0.04; each screenshot opened
    (`<image_root>/<image/encoded>.png`, or base64 when inline) and its size checked."""
    episodes: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        episodes.setdefault(row["episode_id"], []).append(row)
    out: dict[str, list[dict[str, Any]]] = {}
    for episode_id, steps in episodes.items():
        steps.sort(key=lambda r: r["step_id"])
        assert [r["step_id"] for r in steps] == list(range(len(steps)))
        assert len({r["goal_info"] for r in steps}) == 1
        loaded = []
        for r in steps:
            h, w = r["image/height"], r["image/width"]
            boxes = [[int(y * h), int(x * w), int(bh * h), int(bw * w)] for y, x, bh, bw in r["image/ui_annotations_positions"]]
            kind = ActionType(r["results/action_type"])
            touch, lift = r["results/yx_touch"], r["results/yx_lift"]
            step = {"action": kind.name, "boxes": boxes, "text": r["results/type_action"]}
            if kind == ActionType.DUAL_POINT:
                distance = ((touch[0] - lift[0]) ** 2 + (touch[1] - lift[1]) ** 2) ** 0.5
                step["gesture"] = "tap" if distance <= 0.04 else "swipe"
                step["touch_px"] = (touch[1] * w, touch[0] * h)
            if image_root is not None or inline:
                encoded = r["image/encoded"]
                data = (base64.b64decode(encoded, validate=True) if inline
                        else (image_root / f"{encoded}.png").read_bytes())  # type: ignore[operator]
                with Image.open(io.BytesIO(data)) as image:
                    assert image.size == (w, h), (image.size, w, h)
                    assert len(image.getbands()) == r["image/channels"]
            loaded.append(step)
        out[episode_id] = loaded
    return out
