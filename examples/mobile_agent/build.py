"""Build the mobile_agent examples: tasks over the simulated Android apps, with the offline model's scripts.

    python3 examples/mobile_agent/build.py      # after editing a task or a solution here (run from the repo root
                                               # with the virtualenv's python: it starts the simulator)

Writes examples/tasks/mobile_agent.jsonl. Each solution is written here as actions on elements
named by a selector (text, resource id or description); the build replays it on a fresh simulated
device (apps/engines/scenes/mobile_agent/sim) through adbutils and records the element *indices* the agent
would see, step by step, as the task's reference_solution (the offline model's script). So the
scripts follow the simulator's layout; rebuild after changing it. Like the reference's ten: toggle
Wi-Fi, Bluetooth, airplane mode, brightness, a contact with a non-ASCII name (simulator-only: a
device needs an IME for it), an alarm, the calculator with an answer, a note, a cross-app task,
a scroll, a delete, an infeasible task finished as infeasible, and one wrong solution (its
external id ends in -wrong) that scores 0. tests/engines/test_mobile_demo.py replays every script
through the shared loop and checks the rewards.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "examples" / "tasks" / "mobile_agent.jsonl"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ADBUTILS_ADB_PATH", "/bin/false")  # never start a real adb server for the simulator

S, C, K, CALC, N = ("com.android.settings", "com.android.contacts", "com.android.deskclock",
                    "com.android.calculator2", "org.trajplatform.notes")


def act(tool: str, thought: str = "", *, on: dict[str, str] | None = None, **arguments: Any) -> dict[str, Any]:
    """A solution step; `on` selects the element whose index the build records as `index`."""
    return {"tool": tool, "thought": thought, "on": on, "arguments": arguments}


def shell(command: str, **expect: Any) -> dict[str, Any]:
    return {"type": "shell", "command": command, "expect": expect}


def task(slug: str, prompt: str, checks: list[dict[str, Any]], solution: list[dict[str, Any]], *,
         initial_state: dict[str, Any] | None = None, start_app: str = "", expect_status: str = "complete",
         max_steps: int = 15, vision: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {"mode": "simulated", "checks": checks, "tags": ["demo", "simulated"]}
    if initial_state:
        config["initial_state"] = initial_state
    if start_app:
        config["start_app"] = start_app
    if expect_status != "complete":
        config["expect_status"] = expect_status
    if vision:
        config["vision"] = True
    return {"external_id": f"mobile-{slug}", "scene": "mobile_agent", "prompt": prompt, "config": config,
            "max_steps": max_steps, "solution": solution}


def rid(package: str, name: str) -> dict[str, str]:
    return {"rid": f"{package}:id/{name}"}


PEOPLE = [{"display_name": name, "number": f"555-01{n:02d}"} for n, name in enumerate(
    ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory", "Zoe"], start=10)]

TASKS = [
    task("wifi-off", "Turn off Wi-Fi.",
         [shell("settings get global wifi_on", equals="0"),
          {"type": "ui", "resource_id": f"{S}:id/wifi_switch", "attr": "checked", "expect": {"equals": False}}],
         [act("click", "The Wi-Fi switch is on; tap it.", on=rid(S, "wifi_switch")),
          act("finish", status="complete", summary="Wi-Fi is off.")], start_app=S),
    task("bluetooth-on", "Turn on Bluetooth.",
         [shell("settings get global bluetooth_on", equals="1")],
         [act("open_app", "Bluetooth is in Settings.", app_name="Settings"),
          act("click", on=rid(S, "bluetooth_switch")),
          act("finish", status="complete", summary="Bluetooth is on.")]),
    task("airplane-on", "Put the phone in airplane mode.",
         [{"type": "content", "uri": "content://settings/global", "where": "name='airplane_mode_on'",
           "expect_rows": [{"value": "1"}]},
          shell("settings get global wifi_on", equals="0")],
         [act("open_app", app_name="Settings"),
          act("click", "Tap the Airplane mode row.", on={"text": "Airplane mode"}),
          act("finish", status="complete", summary="Airplane mode is on.")]),
    task("brightness-max", "Set the screen brightness to the maximum.",
         [shell("settings get system screen_brightness", equals="255")],
         [act("open_app", app_name="Settings"),
          act("swipe", "Drag the brightness slider to the right end.", x1=360, y1=636, x2=700, y2=636),
          act("finish", status="complete", summary="Brightness is at the maximum.")]),
    task("contact-zhang-san", "Add a contact named 张三 with the phone number 138-0013-8000.",
         [{"type": "content", "uri": "content://com.android.contacts/data/phones", "where": "display_name='张三'",
           "expect_rows": [{"number": "138-0013-8000"}], "count": 1}],
         [act("open_app", app_name="Contacts"),
          act("click", on={"desc": "Create contact"}),
          act("input_text", "A non-ASCII name: the simulator types it; a device needs an IME.",
              on=rid(C, "name"), text="张三"),
          act("input_text", on=rid(C, "phone"), text="138-0013-8000"),
          act("click", on={"text": "Save"}),
          act("finish", status="complete", summary="Saved 张三.")]),
    task("alarm-0730", "Set an alarm for 7:30 AM labelled Gym.",
         [{"type": "content", "uri": "content://com.android.deskclock/alarms", "where": "hour=7 AND minutes=30",
           "expect_rows": [{"label": "Gym", "enabled": "1"}]}],
         [act("open_app", app_name="Clock"),
          act("click", on={"desc": "Add alarm"}),
          act("input_text", on=rid(K, "hour"), text="7"),
          act("input_text", on=rid(K, "minute"), text="30"),
          act("input_text", on=rid(K, "label_input"), text="Gym"),
          act("click", on={"text": "Save"}),
          act("finish", status="complete", summary="Alarm set for 07:30.")]),
    task("calc-37x36", "Use the calculator to compute 37 × 36 and tell me the result.",
         [{"type": "answer", "expected": "1332", "match": "number"},
          {"type": "ui", "resource_id": f"{CALC}:id/result", "attr": "text", "expect": {"equals": "1332"}},
          # The calculator computed it: 1332 typed in and "=" shows the same result.
          {"type": "ui", "resource_id": f"{CALC}:id/formula", "attr": "text", "expect": {"in": ["37×36", "36×37"]}}],
         [act("open_app", app_name="Calculator"),
          act("click", on={"text": "3"}), act("click", on={"text": "7"}), act("click", on={"desc": "multiply"}),
          act("click", on={"text": "3"}), act("click", on={"text": "6"}), act("click", on={"desc": "equals"}),
          act("answer", "The display shows 1332.", text="1332"),
          act("finish", status="complete", summary="37 × 36 = 1332")], vision=True),
    task("note-shopping", "Create a note titled Shopping that says: milk, eggs, bread.",
         [{"type": "content", "uri": "content://org.trajplatform.notes/notes", "where": "title='Shopping'",
           "expect_rows": [{"body": "milk, eggs, bread"}], "count": 1}],
         [act("open_app", app_name="Notes"),
          act("click", on={"desc": "New note"}),
          act("input_text", on=rid(N, "title"), text="Shopping"),
          act("input_text", on=rid(N, "body"), text="milk, eggs, bread"),
          act("click", on={"text": "Save"}),
          act("finish", status="complete", summary="Note saved.")]),
    task("cross-app-alice-note", "Find Alice's phone number in Contacts and save it in a new note titled Alice.",
         [{"type": "content", "uri": "content://org.trajplatform.notes/notes", "where": "title='Alice'",
           "expect_rows": [{"body": "555-0110"}]}],
         [act("open_app", app_name="Contacts"),
          act("click", on={"text": "Alice"}),
          act("open_app", "Her number is 555-0110; now the note.", app_name="Notes"),
          act("click", on={"desc": "New note"}),
          act("input_text", on=rid(N, "title"), text="Alice"),
          act("input_text", on=rid(N, "body"), text="555-0110"),
          act("click", on={"text": "Save"}),
          act("finish", status="complete", summary="Saved Alice's number in a note.")],
         initial_state={"contacts": PEOPLE[:3]}),
    task("scroll-zoe-number", "What is Zoe's phone number? Look it up in Contacts.",
         [{"type": "answer", "expected": "555-0121", "match": "exact"}],
         [act("open_app", app_name="Contacts"),
          act("scroll", "Zoe is below the visible names.", direction="down"),
          act("click", on={"text": "Zoe"}),
          act("answer", text="555-0121"),
          act("finish", status="complete", summary="Zoe's number is 555-0121.")],
         initial_state={"contacts": PEOPLE}),
    task("delete-contact-bob", "Delete the contact Bob.",
         [{"type": "content", "uri": "content://com.android.contacts/data/phones", "where": "display_name='Bob'",
           "count": 0},
          {"type": "content", "uri": "content://com.android.contacts/data/phones", "expect_rows": [
              {"display_name": "Alice"}, {"display_name": "Carol"}], "exact": True}],
         [act("open_app", app_name="Contacts"),
          act("click", on={"text": "Bob"}),
          act("click", on={"text": "Delete"}),
          act("finish", status="complete", summary="Bob is deleted.")],
         initial_state={"contacts": PEOPLE[:3]}),
    task("infeasible-nfc", "Turn on NFC.",
         [shell("settings get global wifi_on", equals="1"), shell("settings get global airplane_mode_on", equals="0")],
         [act("open_app", app_name="Settings"),
          act("finish", "Settings has Wi-Fi, Bluetooth, airplane mode and brightness, but no NFC.",
              status="infeasible", summary="This phone has no NFC setting.")], expect_status="infeasible"),
    task("calc-48-div-6-wrong", "Use the calculator to compute 48 ÷ 6 and tell me the result.",
         [{"type": "answer", "expected": "8", "match": "number"}],
         [act("open_app", app_name="Calculator"),
          act("click", on={"text": "4"}), act("click", on={"text": "8"}), act("click", on={"desc": "minus"}),
          act("click", on={"text": "6"}), act("click", on={"desc": "equals"}),
          act("answer", "Pressed minus instead of divide: a wrong answer on purpose.", text="42"),
          act("finish", status="complete", summary="48 ÷ 6 = 42")]),
]


def _matches(element: Any, on: dict[str, str]) -> bool:
    return all({"text": element.text, "rid": element.rid, "desc": element.desc}[k] == v for k, v in on.items())


def record(row: dict[str, Any]) -> dict[str, Any]:
    """Replay the solution on a fresh simulated device; the offline model's script with element indices."""
    from apps.engines.scenes.mobile_agent.device import KEY_BACK, KEY_ENTER, KEY_HOME, DeviceChannel, Endpoint
    from apps.engines.scenes.mobile_agent.runtime import _app
    from apps.engines.scenes.mobile_agent.sim import initial_state, start_simulator

    config = row["config"]
    sim = start_simulator(initial_state(config.get("initial_state")))
    channel = DeviceChannel(Endpoint(sim.host, sim.port, sim.serial), mode="simulated")
    try:
        if config.get("start_app"):
            channel.launch(*_app(config["start_app"]))
        script = []
        for step in row.pop("solution"):
            arguments = dict(step["arguments"])
            screen = channel.observe()
            element = None
            if step["on"]:
                found = [e for e in screen.elements if _matches(e, step["on"])]
                if not found:
                    raise SystemExit(f"{row['external_id']}: no element {step['on']} on the screen:\n{screen.text()}")
                element = found[0]
                arguments = {"index": element.index, **arguments}
            tool = step["tool"]
            if tool in ("click", "input_text"):
                channel.tap(*element.center) if element else channel.tap(arguments["x"], arguments["y"])
                if tool == "input_text":
                    channel.input_text(arguments["text"])
            elif tool == "swipe":
                channel.swipe(arguments["x1"], arguments["y1"], arguments["x2"], arguments["y2"], 300)
            elif tool == "scroll":
                width, height = channel.window_size()
                dy = height * 3 // 10
                channel.swipe(width // 2, height // 2 + dy, width // 2, height // 2 - dy, 300)
            elif tool == "open_app":
                channel.launch(*_app(arguments["app_name"]))
            elif tool in ("navigate_back", "navigate_home", "keyboard_enter"):
                channel.keyevent({"navigate_back": KEY_BACK, "navigate_home": KEY_HOME, "keyboard_enter": KEY_ENTER}[tool])
            entry: dict[str, Any] = {"tool_calls": [{"name": tool, "arguments": arguments}]}
            if step["thought"]:
                entry["thought"] = step["thought"]
            script.append(entry)
    finally:
        sim.stop()
    return {**row, "reference_solution": script}


def main() -> None:
    rows = [record(dict(t)) for t in TASKS]
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} tasks to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
