"""The `aitw` format: mobile_agent episodes as Android-in-the-Wild-style action records, one line per episode.

    {"episode_id": "<trajectory uuid or id>", "goal_info": "<the task>", "episode_length": 4,
     "device_type": "simulated" | "device", "simulated": true, "android_api_level": 34 | null,
     "reward": 1.0, "outcome": "success", "metadata": {...},
     "steps": [{"step_id": 0, "image": "artifact:<sha256>", "image_width": 720, "image_height": 1280,
                "current_activity": "com.android.settings",
                "results_action_type": 4, "action_name": "DUAL_POINT",
                "results_yx_touch": [0.1844, 0.8694], "results_yx_lift": [0.1844, 0.8694],
                "results_type_action": "",
                "ui_annotations_positions": [[y, x, height, width], ...],   # normalised, as AitW stores them
                "ui_annotations_text": [...], "ui_annotations_ui_types": [...],
                "source_step": 0, "source_tool": "click"}, ...]}

Each step pairs an action with the screen it was taken on (the screenshot and elements after the
previous action; the first step the episode's initial screen). AitW's action types
(google-research/google-research android_in_the_wild/action_type.py): TYPE=3, DUAL_POINT=4
(touch and lift as normalised [y, x]; a tap has touch == lift, a scroll or swipe differs; a long
press or double tap is a tap), PRESS_BACK=5, PRESS_HOME=6, PRESS_ENTER=7,
STATUS_TASK_COMPLETE=10, STATUS_TASK_IMPOSSIBLE=11. input_text on an element is AitW's two
steps: the tap on the field, then TYPE. AndroidWorld actions AitW has no type for (open_app,
wait, answer) keep `results_action_type: null` with `action_name` OPEN_APP / WAIT / ANSWER and
their argument in `results_type_action`, so a trainer can drop or map them. Failed tool calls
(not executed on the device) are left out. Images are artifact references (the artifact store
holds the PNGs), never inlined.
"""
from __future__ import annotations

from typing import Any

from .chat import RenderError

Line = dict[str, Any]
TYPE, DUAL_POINT, PRESS_BACK, PRESS_HOME, PRESS_ENTER, COMPLETE, IMPOSSIBLE = 3, 4, 5, 6, 7, 10, 11
NAMES = {TYPE: "TYPE", DUAL_POINT: "DUAL_POINT", PRESS_BACK: "PRESS_BACK", PRESS_HOME: "PRESS_HOME",
         PRESS_ENTER: "PRESS_ENTER", COMPLETE: "STATUS_TASK_COMPLETE", IMPOSSIBLE: "STATUS_TASK_IMPOSSIBLE"}
EXTENSIONS = ("OPEN_APP", "WAIT", "ANSWER")
KEYS = {"episode_id", "goal_info", "episode_length", "device_type", "simulated", "android_api_level", "reward",
        "outcome", "metadata", "steps"}
STEP_KEYS = {"step_id", "image", "image_width", "image_height", "current_activity", "results_action_type",
             "action_name", "results_yx_touch", "results_yx_lift", "results_type_action", "ui_annotations_positions",
             "ui_annotations_text", "ui_annotations_ui_types", "source_step", "source_tool"}


def _yx(x: float, y: float, width: int, height: int) -> list[float]:
    return [round(min(max(y / height, 0.0), 1.0), 4), round(min(max(x / width, 0.0), 1.0), 4)]


def _screen(shot: dict[str, Any] | None, screen: dict[str, Any]) -> dict[str, Any]:
    width, height = int(screen.get("width") or 0), int(screen.get("height") or 0)
    if not shot or not width or not height:
        raise RenderError("a step has no screenshot or screen size (not a mobile_agent episode of this platform)")
    elements = screen.get("ui_elements") or []
    positions, texts, types = [], [], []
    for e in elements:
        x1, y1, x2, y2 = e["bounds"]
        positions.append([round(y1 / height, 4), round(x1 / width, 4), round((y2 - y1) / height, 4),
                          round((x2 - x1) / width, 4)])
        texts.append(e.get("text") or e.get("desc") or "")
        types.append(str(e.get("class") or "").rsplit(".", 1)[-1].upper())
    return {"image": f"artifact:{shot['artifact']}", "image_width": width, "image_height": height,
            "current_activity": screen.get("package") or "", "ui_annotations_positions": positions,
            "ui_annotations_text": texts, "ui_annotations_ui_types": types}


def _actions(step: dict[str, Any], width: int, height: int) -> list[tuple[int | None, str, dict[str, Any]]]:
    """(AitW action type, name, fields) for one executed tool step."""
    action = step.get("action") or {}
    tool = step.get("tool")
    if tool in ("click", "long_press", "double_tap"):
        point = _yx(action["x"], action["y"], width, height)
        return [(DUAL_POINT, "DUAL_POINT", {"results_yx_touch": point, "results_yx_lift": point})]
    if tool in ("scroll", "swipe"):
        return [(DUAL_POINT, "DUAL_POINT", {"results_yx_touch": _yx(action["x"], action["y"], width, height),
                                            "results_yx_lift": _yx(action["x2"], action["y2"], width, height)})]
    if tool == "input_text":
        out: list[tuple[int | None, str, dict[str, Any]]] = []
        if "x" in action:
            point = _yx(action["x"], action["y"], width, height)
            out.append((DUAL_POINT, "DUAL_POINT", {"results_yx_touch": point, "results_yx_lift": point}))
        return out + [(TYPE, "TYPE", {"results_type_action": str(action.get("text", ""))})]
    simple = {"navigate_back": PRESS_BACK, "navigate_home": PRESS_HOME, "keyboard_enter": PRESS_ENTER}
    if tool in simple:
        return [(simple[tool], NAMES[simple[tool]], {})]
    if tool == "open_app":
        return [(None, "OPEN_APP", {"results_type_action": str(action.get("app_name", ""))})]
    if tool == "wait":
        return [(None, "WAIT", {"results_type_action": str(action.get("seconds", ""))})]
    if tool == "answer":
        return [(None, "ANSWER", {"results_type_action": str(action.get("text", ""))})]
    return []


def render_aitw(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    task = record.get("task") or {}
    verifier = record.get("verifier_output") or {}
    device = verifier.get("device") or {}
    if not device.get("mode"):
        raise RenderError("the trajectory does not say which device ran it (no verifier_output.device)")
    shot, screen = verifier.get("initial_screenshot"), verifier.get("initial_screen") or {}
    steps: list[dict[str, Any]] = []
    status = ""
    for step in record.get("steps") or []:
        if step.get("error"):
            continue  # refused before it reached the device
        if step.get("tool") == "finish":
            args = step.get("arguments") or {}
            status = str(args.get("status") or "") if isinstance(args, dict) else ""
            continue
        before = _screen(shot, screen)
        for action_type, name, fields in _actions(step, before["image_width"], before["image_height"]):
            steps.append({"step_id": len(steps), **before, "results_action_type": action_type, "action_name": name,
                          "results_yx_touch": [-1.0, -1.0], "results_yx_lift": [-1.0, -1.0],
                          "results_type_action": "", **fields, "source_step": step.get("index"),
                          "source_tool": step.get("tool")})
        if step.get("images"):
            shot = step["images"][-1]
            screen = {**(step.get("screen") or {}), "ui_elements": step.get("ui_elements") or []}
    if status in ("complete", "infeasible"):
        final = COMPLETE if status == "complete" else IMPOSSIBLE
        steps.append({"step_id": len(steps), **_screen(shot, screen), "results_action_type": final,
                      "action_name": NAMES[final], "results_yx_touch": [-1.0, -1.0], "results_yx_lift": [-1.0, -1.0],
                      "results_type_action": "", "source_step": None, "source_tool": "finish"})
    if not steps:
        raise RenderError("the episode has no executed action")
    api = (task.get("scene_config") or {}).get("android_api_level")
    return {
        "episode_id": str(record.get("uuid") or record["trajectory_id"]), "goal_info": task.get("prompt") or "",
        "episode_length": len(steps), "device_type": device["mode"], "simulated": bool(device.get("simulated")),
        "android_api_level": api if isinstance(api, int) else (34 if device.get("simulated") else None),
        "reward": record.get("reward"), "outcome": record.get("outcome") or "",
        "metadata": {"trajectory_id": record["trajectory_id"], "task_id": record["task_id"],
                     "external_id": task.get("external_id") or "", "model": record.get("model") or "",
                     "device": device, "status": status},
        "steps": steps,
    }


def _point(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            and (value == [-1.0, -1.0] or all(0.0 <= v <= 1.0 for v in value)))


def validate_aitw(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in sorted(KEYS - obj.keys())]
    problems += [f"line.{k}: unexpected field" for k in sorted(obj.keys() - KEYS)]
    if not isinstance(obj.get("goal_info"), str) or not obj["goal_info"].strip():
        problems.append("line.goal_info: must be a non-empty string")
    if obj.get("device_type") not in ("simulated", "device"):
        problems.append("line.device_type: must be simulated or device")
    if obj.get("device_type") == "simulated" and obj.get("simulated") is not True:
        problems.append("line.simulated: a simulated episode must say so")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        return problems + ["line.steps: must be a non-empty list"]
    if obj.get("episode_length") != len(steps):
        problems.append("line.episode_length: must be the number of steps")
    for n, step in enumerate(steps):
        where = f"line.steps[{n}]"
        if not isinstance(step, dict):
            problems.append(f"{where}: must be an object")
            continue
        problems += [f"{where}.{k}: missing" for k in sorted(STEP_KEYS - step.keys())]
        if step.get("step_id") != n:
            problems.append(f"{where}.step_id: must be {n}")
        kind, name = step.get("results_action_type"), step.get("action_name")
        if kind is None:
            if name not in EXTENSIONS:
                problems.append(f"{where}.action_name: a step without an AitW action type must be one of "
                                f"{', '.join(EXTENSIONS)}")
        elif NAMES.get(kind) != name:
            problems.append(f"{where}.results_action_type: {kind!r} is not AitW's {name!r}")
        for key in ("results_yx_touch", "results_yx_lift"):
            if not _point(step.get(key)):
                problems.append(f"{where}.{key}: must be a normalised [y, x] in 0..1 (or [-1, -1])")
        if kind == DUAL_POINT and step.get("results_yx_touch") == [-1.0, -1.0]:
            problems.append(f"{where}: a DUAL_POINT needs its touch point")
        if kind == TYPE and not step.get("results_type_action"):
            problems.append(f"{where}.results_type_action: a TYPE needs its text")
        if not str(step.get("image", "")).startswith("artifact:"):
            problems.append(f"{where}.image: must be an artifact reference")
        if not (len(step.get("ui_annotations_positions") or []) == len(step.get("ui_annotations_text") or [])
                == len(step.get("ui_annotations_ui_types") or [])):
            problems.append(f"{where}: the ui_annotations lists must have one entry per element")
    return problems
