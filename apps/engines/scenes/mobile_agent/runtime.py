"""The mobile_agent scene runtime: AndroidWorld's action space over the adbutils device channel.

Two modes, explicit in the task (`scene_config.mode`) and recorded on every step and in the
verifier output; one never stands in for the other:

* `simulated`: the platform starts a simulated device (sim/, an ADB host-protocol server on
  127.0.0.1) for the episode, with the task's `initial_state`; no sandbox. Every trajectory says
  so (`device.simulated: true`, `device.label`).
* `device`: a real device, an emulator or a Redroid container, behind an adb server
  (`device.adb_server` "host:port", else adb's ANDROID_ADB_SERVER_HOST / _PORT, else
  127.0.0.1:5037) with `device.serial`; or `device.provider: opensandbox`: a Redroid sandbox
  (`device.image`, default redroid/redroid:14.0.0-latest) whose adbd port the OpenSandbox
  lifecycle API resolves; the worker's adb server connects to it and waits for boot. No device
  answering is an infrastructure error. Per-episode reset: `reset` shell commands (e.g.
  `pm clear com.android.contacts`), then `start_app`.

Tools (one per AndroidWorld action, so each schema validates): click, long_press, double_tap
(index from the latest element list, or x,y), input_text(text, index?, clear?), scroll(direction,
index?), swipe, navigate_back, navigate_home, keyboard_enter, open_app(app_name), wait(seconds),
answer(text), finish(status complete|infeasible, summary). After each action the runtime dumps
the UI tree (the numbered element list is the tool's text) and takes a screenshot (artifact
store; the model sees it with `vision: true`); the step keeps the action with its resolved
coordinates, the element acted on, the capped element list and, on the simulator, the apps'
state after the step. The first screen is the initial observation.

verify: checks.py (shell, content, ui, answer; all must pass) through the same channel, and the
finish status must be the task's `expect_status` (default complete; an infeasible task passes
only when the agent finishes it as infeasible). A process condition decides too (`provenance`,
default on; a task sets `"provenance": false` when the agent is meant to compute numbers of its
own): every number the agent typed (input_text) or answered must appear in the task's prompt or
in the text of a screen it was shown before that action; a phone number typed into a note before
Contacts was ever opened, or an answer given without the screen that shows it, scores 0
(`verifier_output.process.provenance` lists the values and why; `decided_by` says whether the
checks or this condition set the reward).
"""
from __future__ import annotations

import copy
import os
import re
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from apps.engines.agent import image_parts, is_vision
from apps.engines.runtime import (
    InfrastructureError,
    SceneRuntime,
    SetupError,
    ToolError,
    ToolResult,
    current_episode,
)
from apps.engines.sandboxes import SandboxError, SandboxSpec
from trajplatform import artifacts

from . import checks as C
from .device import KEY_BACK, KEY_DEL, KEY_ENTER, KEY_HOME, KEY_MOVE_END, DeviceChannel, Element, Endpoint, Observation
from .sim import SIM_LABEL, Simulator, initial_state, start_simulator
from .sim.apps import APPS

SCENE = "mobile_agent"
MODES = ("simulated", "device")
REDROID_IMAGE = "redroid/redroid:14.0.0-latest"
# Redroid boots Android with its own init (the image's entrypoint, which OpenSandbox would otherwise
# replace); it also needs privileged containers, which is the OpenSandbox server's Docker setting.
REDROID_ENTRYPOINT = ("/init", "qemu=1", "androidboot.hardware=redroid")
ADBD_PORT = 5555
DEFAULT_TIMEOUT_S = 600.0
TTL_MARGIN_S = 600.0
DEVICE_SETTLE_S = 1.0
BOOT_TIMEOUT_S = 120.0
MAX_WAIT_S = 5.0
# Apps open_app knows by name: label -> (package, activity); AOSP's on a device, the simulator's own.
APP_NAMES = {label.lower(): (package, activity) for package, (label, activity) in APPS.items()}
APP_NAMES.update({"alarm": APP_NAMES["clock"], "phone book": APP_NAMES["contacts"]})

_POINT = {"index": {"type": "integer", "minimum": 0, "description": "the element's number in the latest list"},
          "x": {"type": "integer", "minimum": 0, "description": "screen x in pixels (when no index)"},
          "y": {"type": "integer", "minimum": 0, "description": "screen y in pixels (when no index)"}}


def _tool(name: str, description: str, properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required), "additionalProperties": False}}}


TOOLS = [
    _tool("click", "Tap an element (its index in the latest element list) or a point (x, y).", dict(_POINT)),
    _tool("long_press", "Press and hold an element or a point.",
          {**_POINT, "duration_ms": {"type": "integer", "minimum": 500, "maximum": 5000}}),
    _tool("double_tap", "Tap an element or a point twice quickly.", dict(_POINT)),
    _tool("input_text", "Type text into a text field: the element `index` is tapped first (else the focused "
          "field); `clear` deletes its current text first.",
          {"text": {"type": "string"}, "index": _POINT["index"], "clear": {"type": "boolean"}}, ("text",)),
    _tool("scroll", "Scroll the screen (or the element `index`) to show more content in `direction`.",
          {"direction": {"enum": ["up", "down", "left", "right"]}, "index": _POINT["index"]}, ("direction",)),
    _tool("swipe", "Swipe from (x1, y1) to (x2, y2).",
          {"x1": {"type": "integer", "minimum": 0}, "y1": {"type": "integer", "minimum": 0},
           "x2": {"type": "integer", "minimum": 0}, "y2": {"type": "integer", "minimum": 0},
           "duration_ms": {"type": "integer", "minimum": 50, "maximum": 5000}}, ("x1", "y1", "x2", "y2")),
    _tool("navigate_back", "Press the Back button.", {}),
    _tool("navigate_home", "Press the Home button.", {}),
    _tool("keyboard_enter", "Press Enter on the keyboard.", {}),
    _tool("open_app", "Open an app by its name (e.g. Settings, Contacts, Clock, Calculator, Notes).",
          {"app_name": {"type": "string", "minLength": 1}}, ("app_name",)),
    _tool("wait", "Wait for the screen to change (at most 5 seconds).",
          {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S}}, ("seconds",)),
    _tool("answer", "Give the answer to a question the task asks (before finishing).",
          {"text": {"type": "string", "minLength": 1}}, ("text",)),
    _tool("finish", "End the task: status complete when it is done, infeasible when it cannot be done.",
          {"status": {"enum": ["complete", "infeasible"]}, "summary": {"type": "string"}}, ("status",)),
]


def scene_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("scene_config") or {}


def device_config(config: dict[str, Any]) -> dict[str, Any]:
    return dict(scene_config(config).get("device") or {})


def check_config(config: dict[str, Any]) -> list[tuple[str, str]]:
    """What the schema cannot say about a mobile_agent scene_config."""
    problems = []
    mode, device = config.get("mode"), config.get("device") or {}
    if mode == "device":
        if config.get("initial_state"):
            problems.append(("initial_state", "only the simulator takes an initial_state; a device is reset with "
                                              "`reset` shell commands"))
        if device.get("provider", "endpoint") == "endpoint" and not device.get("serial"):
            problems.append(("device.serial", "device mode needs the device's serial (or provider: opensandbox)"))
    elif device:
        problems.append(("device", "device settings are for mode: device (this task is simulated)"))
    if mode == "simulated" and config.get("initial_state"):
        try:
            initial_state(config["initial_state"])
        except ValueError as exc:
            problems.append(("initial_state", str(exc)))
    return problems


def _adb_server(device: dict[str, Any]) -> tuple[str, int]:
    spec = str(device.get("adb_server") or "")
    if spec:
        host, _, port = spec.rpartition(":")
        return host or "127.0.0.1", int(port)
    return os.environ.get("ANDROID_ADB_SERVER_HOST", "127.0.0.1"), int(os.environ.get("ANDROID_ADB_SERVER_PORT", 5037))


@dataclass
class _Live:
    """One episode's device: its channel, the simulator when simulated, the latest screen."""

    mode: str
    channel: DeviceChannel
    sim: Simulator | None = None
    address: str = ""  # a Redroid's adbd endpoint the adb server connected to
    screen: Observation | None = None
    answer: str | None = None
    status: str = ""
    initial_shot: dict[str, Any] | None = None
    initial_screen: dict[str, Any] = field(default_factory=dict)  # the first screen's elements and size
    settle_s: float = 0.0
    ime: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    # The provenance condition's record: the text of every screen shown to the agent, in order, and
    # each value it typed or answered with the number of screens it had seen by then.
    seen: list[str] = field(default_factory=list)
    produced: list[dict[str, Any]] = field(default_factory=list)

    def produce(self, tool: str, text: str) -> None:
        self.produced.append({"tool": tool, "text": text, "screens_seen": len(self.seen)})

    def label(self) -> dict[str, Any]:
        out = {"mode": self.mode, "simulated": self.mode == "simulated", **self.info}
        if self.sim is not None:
            out["label"] = SIM_LABEL
        return out

    def stop(self) -> None:
        if self.sim is not None:
            self.sim.stop()


def _live() -> _Live | None:
    return current_episode().state.get(SCENE)


def _require_live() -> _Live:
    live = _live()
    if live is None:
        raise InfrastructureError("the episode's device was not started")
    return live


class MobileRuntime(SceneRuntime):
    scene_id = SCENE

    # -- what the agent sees

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        mode = scene_config(config).get("mode")
        if mode not in MODES:
            raise SetupError(f"scene_config.mode must be simulated or device, got {mode!r} (it is never guessed)")
        return copy.deepcopy(TOOLS)

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    text_form_rewrites: dict[str, str | None] = {
        "When the task is done, call finish with status complete; if it cannot be done on this phone, "
        "call finish with status infeasible.":
            "When the task is done, reply in text without a tool call: the answer if the task asked a question, "
            "else [complete] and a short summary; if it cannot be done on this phone, reply [infeasible] and why.",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        lines = [
            "You operate an Android phone with tools to complete the user's task.",
            "After every action you get the screen's UI elements as a numbered list (class, text, description, "
            "resource id, flags, bounds in pixels). Act on an element by its index from the latest list; "
            "use x, y only for a point that no element covers. Indices change when the screen changes.",
            "To type, use input_text with the field's index (clear: true replaces its text). Open apps with "
            "open_app. If the task asks a question, give the answer with answer before finishing.",
            "When the task is done, call finish with status complete; if it cannot be done on this phone, "
            "call finish with status infeasible.",
        ]
        if is_vision(config):
            lines.append("You also see a screenshot of the screen after every action.")
        if config.get("max_steps"):
            lines.append(f"You have at most {int(config['max_steps'])} replies.")
        return "\n".join(lines)

    # -- the device

    def sandbox_spec(self, config: dict[str, Any]) -> SandboxSpec | None:
        scene, device = scene_config(config), device_config(config)
        if scene.get("mode") != "device" or device.get("provider") != "opensandbox":
            return None  # the simulator runs in the worker; a fixed endpoint needs no sandbox
        lifetime = float(config.get("timeout_s") or DEFAULT_TIMEOUT_S) + TTL_MARGIN_S
        return SandboxSpec(image=device.get("image") or REDROID_IMAGE, labels={"scene": "mobile-agent"}, ttl=lifetime,
                           cpu=float(device.get("cpu") or 2), memory_mb=int(device.get("memory_mb") or 4096),
                           pids=4096, open_files=65536, address_space_mb=None,
                           entrypoint=tuple(device.get("entrypoint") or REDROID_ENTRYPOINT))

    def setup(self, sandbox: Any, config: dict[str, Any]) -> None:
        """A Redroid sandbox (device mode, provider opensandbox): resolve adbd's endpoint, connect, boot."""
        if sandbox.backend_name != "opensandbox":
            raise SetupError(f"a Redroid device needs the opensandbox sandbox backend, not {sandbox.backend_name!r}")
        device = device_config(config)
        try:
            resolved = sandbox.endpoint(ADBD_PORT)  # the lifecycle API's endpoint for the port
        except SandboxError as exc:
            raise InfrastructureError(f"OpenSandbox could not resolve port {ADBD_PORT} of sandbox {sandbox.id}: {exc}") from None
        address = resolved.split("://", 1)[-1].rstrip("/")
        if "/" in address:
            raise SetupError(
                f"OpenSandbox resolved adbd's port {ADBD_PORT} to {resolved!r}, an HTTP proxy path: adb needs "
                "a plain TCP host:port (the Docker runtime's host network mode, or a published port)")
        host, port = _adb_server(device)
        channel = DeviceChannel(Endpoint(host, port, address), mode="device")
        channel.connect(address)
        sandbox.add_cleanup(lambda: channel.disconnect(address))
        channel.wait_for_boot(float(device.get("boot_timeout_s") or BOOT_TIMEOUT_S))
        current_episode().state[SCENE] = _Live(
            "device", channel, address=address, settle_s=float(device.get("settle_s", DEVICE_SETTLE_S)),
            ime=str(device.get("ime") or ""),
            info={"provider": "opensandbox", "sandbox": sandbox.id, "image": sandbox.spec.image, "serial": address})

    def _start(self, config: dict[str, Any]) -> _Live:
        scene, device = scene_config(config), device_config(config)
        ctx = current_episode()
        if scene.get("mode") == "simulated":
            try:
                state = initial_state(scene.get("initial_state"))
            except ValueError as exc:
                raise SetupError(str(exc)) from None
            lifetime = float(config.get("timeout_s") or DEFAULT_TIMEOUT_S) + TTL_MARGIN_S
            sim = start_simulator(state, lifetime_s=lifetime)
            weakref.finalize(ctx, sim.stop)  # an episode that ends before verify still frees the port
            live = _Live("simulated", DeviceChannel(Endpoint(sim.host, sim.port, sim.serial), mode="simulated"),
                         sim=sim, info={"serial": sim.serial, "endpoint": f"{sim.host}:{sim.port}"})
        elif scene.get("mode") == "device":
            host, port = _adb_server(device)
            serial = str(device.get("serial") or "")
            if not serial:
                raise SetupError("device mode needs scene_config.device.serial (or provider: opensandbox)")
            channel = DeviceChannel(Endpoint(host, port, serial), mode="device")
            channel.require_device()
            live = _Live("device", channel, settle_s=float(device.get("settle_s", DEVICE_SETTLE_S)),
                         ime=str(device.get("ime") or ""),
                         info={"provider": "endpoint", "serial": serial, "adb_server": f"{host}:{port}"})
        else:
            raise SetupError(f"scene_config.mode must be simulated or device, got {scene.get('mode')!r}")
        ctx.state[SCENE] = live
        return live

    def _reset(self, live: _Live, config: dict[str, Any]) -> None:
        scene = scene_config(config)
        for command in scene.get("reset") or []:
            result = live.channel.shell(command)
            if result.returncode != 0:
                raise SetupError(f"reset command `{command}` failed (exit {result.returncode}): {result.output[:300]}")
        if scene.get("start_app"):
            try:
                package, activity = _app(str(scene["start_app"]))
            except ToolError as exc:
                raise SetupError(f"start_app: {exc}") from None
            problem = live.channel.launch(package, activity)
            if problem:
                raise SetupError(f"start_app {scene['start_app']!r} did not start: {problem}")

    def initial_observation(self, sandbox: Any, config: dict[str, Any]) -> str | list[dict[str, Any]]:
        """Start (or reach) the episode's device, reset it, and show the first screen."""
        live = _live() or self._start(config)
        live.channel.require_device()
        self._reset(live, config)
        screen = self._look(live)
        live.initial_shot = self._store(screen)
        live.initial_screen = {"width": screen.width, "height": screen.height, "package": screen.package,
                               "ui_elements": screen.records()}
        text = "The phone shows this screen.\n" + screen.text()
        if not is_vision(config):
            return text
        return [{"type": "text", "text": text}, *image_parts([live.initial_shot])]

    def _look(self, live: _Live) -> Observation:
        if live.settle_s:
            time.sleep(live.settle_s)
        live.screen = live.channel.observe()
        live.seen.append("\n".join(f"{e.text}\n{e.desc}" for e in live.screen.elements))
        return live.screen

    @staticmethod
    def _store(screen: Observation) -> dict[str, Any]:
        return artifacts.store(screen.png, "image/png", width=screen.width, height=screen.height)

    # -- tools

    def _element(self, live: _Live, index: Any) -> Element:
        elements = live.screen.elements if live.screen else []
        if not isinstance(index, int) or not 0 <= index < len(elements):
            raise ToolError(f"no element [{index}] on the screen: the latest list has "
                            f"{f'[0]..[{len(elements) - 1}]' if elements else 'no elements'}")
        return elements[index]

    def _point(self, live: _Live, args: dict[str, Any]) -> tuple[int, int, Element | None]:
        if args.get("index") is not None:
            element = self._element(live, args["index"])
            return (*element.center, element)
        if args.get("x") is None or args.get("y") is None:
            raise ToolError("give the element's index, or both x and y")
        width, height = live.channel.window_size()
        x, y = int(args["x"]), int(args["y"])
        if not (0 <= x < width and 0 <= y < height):
            raise ToolError(f"({x}, {y}) is off the screen ({width}x{height})")
        return x, y, None

    def execute_tool(
        self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *, timeout: float | None = None
    ) -> ToolResult:
        live = _require_live()
        started = time.monotonic()
        channel = live.channel
        element: Element | None = None
        action: dict[str, Any] = {"type": name}
        if name in ("click", "double_tap", "long_press"):
            x, y, element = self._point(live, args)
            action.update(x=x, y=y)
            if name == "click":
                channel.tap(x, y)
                done = f"Tapped ({x}, {y})"
            elif name == "double_tap":
                channel.tap(x, y)
                channel.tap(x, y)
                done = f"Double-tapped ({x}, {y})"
            else:
                duration = int(args.get("duration_ms") or 1000)
                channel.swipe(x, y, x, y, duration)
                action["duration_ms"] = duration
                done = f"Long-pressed ({x}, {y}) for {duration} ms"
        elif name == "input_text":
            text = str(args["text"])
            if args.get("index") is not None:
                element = self._element(live, args["index"])
                channel.tap(*element.center)
                action.update(x=element.center[0], y=element.center[1])
            if args.get("clear"):
                current = element.text if element is not None else next(
                    (e.text for e in (live.screen.elements if live.screen else []) if e.focused), "")
                if current:
                    channel.keyevent(KEY_MOVE_END, *([KEY_DEL] * len(current)))
            try:
                how = channel.input_text(text, ime=live.ime)
            except ValueError as exc:
                raise ToolError(str(exc)) from None
            action.update(text=text, clear=bool(args.get("clear")), method=how)
            live.produce("input_text", text)
            done = f"Typed {text!r}"
        elif name == "scroll":
            direction = args["direction"]
            if args.get("index") is not None:
                element = self._element(live, args["index"])
                x1, y1, x2, y2 = element.bounds
            else:
                width, height = channel.window_size()
                x1, y1, x2, y2 = 0, 0, width, height
            cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
            dx, dy = (x2 - x1) * 3 // 10, (y2 - y1) * 3 // 10
            # AndroidWorld: scrolling down shows what is below, so the finger moves up.
            start, end = {"down": ((cx, cy + dy), (cx, cy - dy)), "up": ((cx, cy - dy), (cx, cy + dy)),
                          "right": ((cx + dx, cy), (cx - dx, cy)), "left": ((cx - dx, cy), (cx + dx, cy))}[direction]
            channel.swipe(*start, *end, 300)
            action.update(direction=direction, x=start[0], y=start[1], x2=end[0], y2=end[1])
            done = f"Scrolled {direction}"
        elif name == "swipe":
            width, height = channel.window_size()
            points = [int(args[k]) for k in ("x1", "y1", "x2", "y2")]
            if not all(0 <= p < (width if i % 2 == 0 else height) for i, p in enumerate(points)):
                raise ToolError(f"the swipe leaves the screen ({width}x{height})")
            duration = int(args.get("duration_ms") or 300)
            channel.swipe(*points, duration)
            action.update(x=points[0], y=points[1], x2=points[2], y2=points[3], duration_ms=duration)
            done = f"Swiped ({points[0]}, {points[1]}) -> ({points[2]}, {points[3]})"
        elif name in ("navigate_back", "navigate_home", "keyboard_enter"):
            code = {"navigate_back": KEY_BACK, "navigate_home": KEY_HOME, "keyboard_enter": KEY_ENTER}[name]
            channel.keyevent(code)
            action["keycode"] = code
            done = {"navigate_back": "Pressed Back", "navigate_home": "Pressed Home",
                    "keyboard_enter": "Pressed Enter"}[name]
        elif name == "open_app":
            package, activity = _app(str(args["app_name"]))
            problem = channel.launch(package, activity)
            if problem:
                raise ToolError(f"the app {args['app_name']!r} did not open: {problem}")
            action.update(app_name=args["app_name"], package=package)
            done = f"Opened {args['app_name']}"
        elif name == "wait":
            seconds = min(float(args["seconds"]), MAX_WAIT_S)
            if live.mode == "device":
                time.sleep(seconds)  # the simulator has no animations or loading to wait for
            action["seconds"] = seconds
            done = f"Waited {seconds:g} s"
        elif name == "answer":
            live.answer = str(args["text"])
            live.produce("answer", live.answer)
            return ToolResult(output=f"Answer recorded: {live.answer}", duration_ms=_ms(started),
                              extra={"action": {"type": "answer", "text": live.answer}, "device_mode": live.mode})
        else:
            raise ToolError(f"unknown tool {name!r}")
        size = (live.screen.width, live.screen.height) if live.screen else channel.window_size()
        screen = self._look(live)
        shot = self._store(screen)
        if "x" in action:
            action["point"] = {"x": action["x"], "y": action["y"]}  # what the console draws (a swipe: its start)
        if element is not None:
            action["element"] = element.index
            x1, y1, x2, y2 = element.bounds
            action["box"] = {"x": x1, "y": y1, "width": x2 - x1, "height": y2 - y1}
        extra: dict[str, Any] = {
            "action": action, "element": element.record() if element else None,
            "screen": {"width": size[0], "height": size[1], "package": screen.package},
            "ui_elements": screen.records(), "device_mode": live.mode,
        }
        if live.sim is not None:
            extra["device_state_after"] = live.sim.device.snapshot()
        return ToolResult(output=f"{done}.\n\n{screen.text()}", exit_code=None, duration_ms=_ms(started),
                          extra=extra, images=[shot])

    def finish_answer(self, args: dict[str, Any]) -> str:
        live = _live()
        status = str(args.get("status") or "")
        if live is not None:
            live.status = status
            if live.answer is not None:
                return live.answer
        summary = str(args.get("summary") or "")
        return f"[{status}] {summary}".strip() if status else summary

    # -- after finish

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        live = _require_live()
        scene = scene_config(config)
        try:
            output: dict[str, Any] = {"device": live.label(), "status": live.status, "answer": live.answer}
            if live.initial_shot:
                # The first screen, which no step records: exporters pair it with the first action.
                output.update(initial_screenshot=live.initial_shot, initial_screen=live.initial_screen)
            expected_status = scene.get("expect_status") or "complete"
            checks = scene.get("checks")
            if not checks:
                output["note"] = "the task has no checks"
                return None, output
            try:
                results = C.run_checks(checks, live.channel, answer=live.answer)
            except C.CheckError as exc:
                raise SetupError(f"the task's check cannot run: {exc}") from None
            status_ok = live.status == expected_status
            output.update(checks=results, expect_status=expected_status, status_ok=status_ok,
                          passed=sum(1 for r in results if r["passed"]) + int(status_ok), total=len(results) + 1)
            if live.sim is not None:
                output["final_state"] = live.sim.device.snapshot()
            reward = 1.0 if status_ok and all(r["passed"] for r in results) else 0.0
            if not status_ok:
                output["note"] = f"finished as {live.status or 'nothing'!r}, the task expects {expected_status!r}"
            condition = provenance(str(config.get("prompt") or ""), live.seen, live.produced)
            output["process"] = {"provenance": condition}
            output["decided_by"] = "checks"
            if scene.get("provenance", True) is False:
                condition["relaxed"] = True
            elif not condition["ok"]:
                reward, output["decided_by"] = 0.0, "provenance"
                output.setdefault("note", condition["detail"])
            return reward, output
        finally:
            live.stop()


_NUMBER = re.compile(r"\d+")


def provenance(prompt: str, seen: list[str], produced: list[dict[str, Any]]) -> dict[str, Any]:
    """The provenance condition (see the module docstring), in the shared process shape: each
    produced value's numbers (digit runs) must be digit runs of the prompt or of a screen seen
    before it was produced."""
    known = set(_NUMBER.findall(prompt))
    unseen = []
    for item in produced:
        shown = known.union(*(_NUMBER.findall(text) for text in seen[:item["screens_seen"]]))
        missing = [n for n in _NUMBER.findall(item["text"]) if n not in shown]
        if missing:
            unseen.append({"tool": item["tool"], "text": item["text"][:200], "numbers": missing})
    if unseen:
        first = unseen[0]
        detail = (f"{first['tool']} {first['text']!r} uses {', '.join(first['numbers'])}, which neither the task "
                  "nor any screen shown before it gave")
    else:
        detail = f"every number in {len(produced)} typed or answered values was shown first"
    return {"ok": not unseen, "detail": detail, "unseen": unseen}


def _app(name: str) -> tuple[str, str]:
    key = name.strip().lower()
    if key in APP_NAMES:
        return APP_NAMES[key]
    if "." in key and " " not in key:  # a package name, optionally package/activity
        package, _, activity = name.strip().partition("/")
        return package, activity
    raise ToolError(f"unknown app {name!r}; apps: {', '.join(label for label, _ in APPS.values())}")


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
