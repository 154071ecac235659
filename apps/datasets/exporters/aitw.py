"""The `aitw` format: mobile_agent episodes as Android in the Wild's rows, one line per step.

AitW (google-research/google-research android_in_the_wild) releases one TFRecord example per
step with flat feature names; as JSON (the form neulab/agent-data-protocol's extract_raw.py
writes from the released records, tests/datasets/anchor_rows/aitw_rows.json) a step is

    {"episode_id": "12172380859428428757", "step_id": 0, "episode_length": 9,
     "goal_info": "Open a new Chrome private window", "device_type": "PIXEL_3", "android_api_level": 31,
     "current_activity": "com.android.chrome/com.google.android.apps.chrome.Main",
     "image/encoded": "images/12172380859428428757-0", "image/height": 1080, "image/width": 540,
     "image/channels": 3,
     "image/ui_annotations_positions": [[y, x, height, width], ...],   # normalised to 0..1
     "image/ui_annotations_text": [...], "image/ui_annotations_ui_types": [...],
     "results/action_type": 4, "results/yx_touch": [0.7761, 0.7089], "results/yx_lift": [0.7761, 0.7089],
     "results/type_action": ""}

and so is each line here: exactly those eighteen keys and types. A step pairs an action with
the screen it was taken on (the screenshot and elements after the previous action; the first
step the episode's initial screen). Action types are AitW's (action_type.py): TYPE=3,
DUAL_POINT=4 (touch and lift as normalised [y, x]; a tap has touch == lift, a scroll or swipe
differs; a long press or double tap is a tap), PRESS_BACK=5, PRESS_HOME=6, PRESS_ENTER=7,
STATUS_TASK_COMPLETE=10, STATUS_TASK_IMPOSSIBLE=11; points that an action does not have are
[-1, -1]. input_text on an element is AitW's two steps, the tap on the field and then TYPE.
AndroidWorld actions AitW has no type for (open_app, wait, answer) are not rows: the next row's
screen is what they led to. Failed tool calls (not executed on the device) are left out.

`image/encoded`: with images="files" (the default) the screenshot is written beside the export
as `<image_dir>/<sha256>.png` and the field is that path without ".png", as the JSON form of the
released rows has it (ADP's loader opens `f"{row['image/encoded']}.png"`); with images="base64"
it is the PNG itself, base64 (the released TFRecords hold raw pixels; a PNG is what we keep).
`device_type` is SIMULATED for the simulator and the device's model (or ANDROID_DEVICE) on a
device; `android_api_level` is the task's or 34 for the simulator, and a device episode that
does not say its level is excluded with the reason.
"""
from __future__ import annotations

import uuid
from typing import Any

from trajplatform import artifacts

from .chat import RenderError
from .vision import ImageSink

Line = dict[str, Any]
TYPE, DUAL_POINT, PRESS_BACK, PRESS_HOME, PRESS_ENTER, COMPLETE, IMPOSSIBLE = 3, 4, 5, 6, 7, 10, 11
ACTION_TYPES = frozenset({TYPE, DUAL_POINT, PRESS_BACK, PRESS_HOME, PRESS_ENTER, COMPLETE, IMPOSSIBLE})
NO_POINT = [-1.0, -1.0]
SIMULATOR_API_LEVEL = 34
FEATURES: dict[str, type | tuple[type, ...]] = {
    "android_api_level": int, "current_activity": str, "device_type": str, "episode_id": str,
    "episode_length": int, "goal_info": str, "image/channels": int, "image/encoded": str, "image/height": int,
    "image/width": int, "image/ui_annotations_positions": list, "image/ui_annotations_text": list,
    "image/ui_annotations_ui_types": list, "results/action_type": int, "results/type_action": str,
    "results/yx_lift": list, "results/yx_touch": list, "step_id": int,
}
UUID_NAMESPACE = uuid.UUID("9f1d3c2e-5b7a-4c1e-8f00-7472616a7077")
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # IHDR colour type -> channels (3: palette, decoded as RGB)


def _yx(x: float, y: float, width: int, height: int) -> list[float]:
    return [round(min(max(y / height, 0.0), 1.0), 4), round(min(max(x / width, 0.0), 1.0), 4)]


def _channels(sha: str) -> int:
    data = artifacts.read(sha)
    if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 26:
        raise RenderError(f"screenshot {sha[:12]} is not a PNG")
    return _PNG_CHANNELS.get(data[25], 3)


class _Screens:
    """A screen's image and annotation features, each screenshot stored once per export line set."""

    def __init__(self, ctx: dict[str, Any]):
        self.sink = ImageSink(ctx)
        self.cache: dict[str, tuple[str, int]] = {}

    def features(self, shot: dict[str, Any] | None, screen: dict[str, Any]) -> dict[str, Any]:
        width, height = int(screen.get("width") or 0), int(screen.get("height") or 0)
        if not shot or not width or not height:
            raise RenderError("a step has no screenshot or screen size (not a mobile_agent episode of this platform)")
        sha = shot["artifact"]
        if sha not in self.cache:
            ref = self.sink(sha)
            encoded = ref.split(",", 1)[1] if ref.startswith("data:") else ref.removesuffix(".png")
            self.cache[sha] = (encoded, _channels(sha))
        encoded, channels = self.cache[sha]
        positions, texts, types = [], [], []
        for e in screen.get("ui_elements") or []:
            x1, y1, x2, y2 = e["bounds"]
            positions.append([round(y1 / height, 4), round(x1 / width, 4), round((y2 - y1) / height, 4),
                              round((x2 - x1) / width, 4)])
            texts.append(e.get("text") or e.get("desc") or "")
            types.append(str(e.get("class") or "").rsplit(".", 1)[-1].upper())
        package, activity = screen.get("package") or "", screen.get("activity") or ""
        return {"current_activity": f"{package}/{activity}" if activity else package, "image/encoded": encoded,
                "image/height": height, "image/width": width, "image/channels": channels,
                "image/ui_annotations_positions": positions, "image/ui_annotations_text": texts,
                "image/ui_annotations_ui_types": types}


def _actions(step: dict[str, Any], width: int, height: int) -> list[tuple[int, dict[str, Any]]]:
    """(AitW action type, fields) for one executed tool step ([] for actions AitW has no type for)."""
    action = step.get("action") or {}
    tool = step.get("tool")
    if tool in ("click", "long_press", "double_tap"):
        point = _yx(action["x"], action["y"], width, height)
        return [(DUAL_POINT, {"results/yx_touch": point, "results/yx_lift": point})]
    if tool in ("scroll", "swipe"):
        return [(DUAL_POINT, {"results/yx_touch": _yx(action["x"], action["y"], width, height),
                              "results/yx_lift": _yx(action["x2"], action["y2"], width, height)})]
    if tool == "input_text":
        out: list[tuple[int, dict[str, Any]]] = []
        if "x" in action:
            point = _yx(action["x"], action["y"], width, height)
            out.append((DUAL_POINT, {"results/yx_touch": point, "results/yx_lift": point}))
        return out + [(TYPE, {"results/type_action": str(action.get("text", ""))})]
    simple = {"navigate_back": PRESS_BACK, "navigate_home": PRESS_HOME, "keyboard_enter": PRESS_ENTER}
    if tool in simple:
        return [(simple[tool], {})]
    return []  # open_app, wait, answer: AitW has no action type for them


def render_aitw(record: dict[str, Any], ctx: dict[str, Any]) -> list[Line]:
    task = record.get("task") or {}
    verifier = record.get("verifier_output") or {}
    device = verifier.get("device") or {}
    if not device.get("mode"):
        raise RenderError("the trajectory does not say which device ran it (no verifier_output.device)")
    simulated = bool(device.get("simulated"))
    api = (task.get("scene_config") or {}).get("android_api_level")
    if not isinstance(api, int) or isinstance(api, bool):
        if not simulated:
            raise RenderError("the device episode does not say its Android API level (scene_config.android_api_level)")
        api = SIMULATOR_API_LEVEL
    screens = _Screens(ctx)
    shot, screen = verifier.get("initial_screenshot"), verifier.get("initial_screen") or {}
    steps: list[Line] = []
    status = ""
    for step in record.get("steps") or []:
        if step.get("error"):
            continue  # refused before it reached the device
        if step.get("tool") == "finish":
            args = step.get("arguments") or {}
            status = str(args.get("status") or "") if isinstance(args, dict) else ""
            continue
        actions = _actions(step, int(screen.get("width") or 0) or 1, int(screen.get("height") or 0) or 1)
        if actions:
            before = screens.features(shot, screen)
            for action_type, fields in actions:
                steps.append({**before, "results/action_type": action_type, "results/yx_touch": NO_POINT,
                              "results/yx_lift": NO_POINT, "results/type_action": "", **fields})
        if step.get("images"):
            shot = step["images"][-1]
            screen = {**(step.get("screen") or {}), "ui_elements": step.get("ui_elements") or []}
    if status in ("complete", "infeasible"):
        steps.append({**screens.features(shot, screen), "results/action_type": COMPLETE if status == "complete"
                      else IMPOSSIBLE, "results/yx_touch": NO_POINT, "results/yx_lift": NO_POINT,
                      "results/type_action": ""})
    if not steps:
        raise RenderError("the episode has no action Android in the Wild has a type for")
    episode_id = str(uuid.uuid5(UUID_NAMESPACE, f"{record.get('content_sha256') or ''}:{record['trajectory_id']}"))
    common = {"episode_id": episode_id, "episode_length": len(steps), "goal_info": task.get("prompt") or "",
              "device_type": "SIMULATED" if simulated else str(device.get("model") or "ANDROID_DEVICE").upper(),
              "android_api_level": api}
    return [{**common, "step_id": n, **row} for n, row in enumerate(steps)]


def _point(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            and (value == NO_POINT or all(0.0 <= v <= 1.0 for v in value)))


def validate_aitw(obj: Any) -> list[str]:
    """One AitW step: the eighteen features with their types, AitW's action types, normalised points."""
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in FEATURES if k not in obj]
    problems += [f"line.{k}: unexpected field (not an Android in the Wild feature)" for k in sorted(set(obj) - set(FEATURES))]
    for key, kind in FEATURES.items():
        if key in obj and (not isinstance(obj[key], kind) or (kind is int and isinstance(obj[key], bool))):
            problems.append(f"line.{key}: must be {kind.__name__ if isinstance(kind, type) else kind}")
    if problems:
        return problems
    if not obj["goal_info"].strip():
        problems.append("line.goal_info: must be a non-empty string")
    if not 0 <= obj["step_id"] < obj["episode_length"]:
        problems.append("line.step_id: must be in 0..episode_length-1")
    kind = obj["results/action_type"]
    if kind not in ACTION_TYPES:
        problems.append(f"line.results/action_type: {kind} is not one of AitW's action types "
                        f"{', '.join(map(str, sorted(ACTION_TYPES)))}")
    for key in ("results/yx_touch", "results/yx_lift"):
        if not _point(obj[key]):
            problems.append(f"line.{key}: must be a normalised [y, x] in 0..1 (or [-1, -1])")
    if kind == DUAL_POINT and (obj["results/yx_touch"] == NO_POINT or obj["results/yx_lift"] == NO_POINT):
        problems.append("line: a DUAL_POINT needs its touch and lift points")
    if kind != DUAL_POINT and (obj["results/yx_touch"] != NO_POINT or obj["results/yx_lift"] != NO_POINT):
        problems.append("line: only a DUAL_POINT has touch and lift points ([-1, -1] otherwise)")
    if (kind == TYPE) != bool(obj["results/type_action"]):
        problems.append("line.results/type_action: the typed text, on a TYPE and only there")
    if obj["image/height"] <= 0 or obj["image/width"] <= 0 or obj["image/channels"] not in (1, 2, 3, 4):
        problems.append("line.image/height, image/width, image/channels: must describe the screenshot")
    if not obj["image/encoded"]:
        problems.append("line.image/encoded: must be the screenshot (a path beside the export, or base64)")
    positions = obj["image/ui_annotations_positions"]
    if not all(isinstance(p, list) and len(p) == 4 and all(isinstance(v, (int, float)) for v in p) for p in positions):
        problems.append("line.image/ui_annotations_positions: must be [y, x, height, width] per element")
    if not len(positions) == len(obj["image/ui_annotations_text"]) == len(obj["image/ui_annotations_ui_types"]):
        problems.append("line: the ui_annotations lists must have one entry per element")
    return problems
