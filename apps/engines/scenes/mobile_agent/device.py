"""The device channel: adbutils against an ADB endpoint, the same code for the simulator and a device.

    channel = DeviceChannel(Endpoint("127.0.0.1", 5037, "emulator-5554"), mode="device")
    channel.require_device()                   # InfrastructureError when no device answers
    seen = channel.observe()                   # uiautomator dump -> numbered elements; screencap -> PNG
    channel.tap(x, y); channel.swipe(...); channel.keyevent(4); channel.input_text("hi", ascii_only=True)
    channel.shell("settings get global wifi_on") -> ShellReturn (exit code from `; echo X4EXIT:$?`)

The endpoint is an adb *server* (host, port) and a device serial: the simulator is one itself; in
device mode it is the worker's adb server (ANDROID_ADB_SERVER_HOST / _PORT, adb's own variables)
with a device, an emulator or a Redroid container's adbd attached (`connect(address)`).
Every adbutils or socket failure is an InfrastructureError naming the endpoint: the platform's
trouble, never the agent's, and never answered by falling back to the simulator.
"""
from __future__ import annotations

import re
import shlex
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

import adbutils
from adbutils.errors import AdbError

from apps.engines.runtime import InfrastructureError

DUMP_PATH = "/data/local/tmp/uidump.xml"
MAX_ELEMENTS = 80  # in the tool's text and on the step
SHELL_TIMEOUT_S = 30.0
KEY_BACK, KEY_HOME, KEY_ENTER, KEY_DEL, KEY_MOVE_END = 4, 3, 66, 67, 123
_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    serial: str

    def __str__(self) -> str:
        return f"adb server {self.host}:{self.port}, device {self.serial}"


@dataclass
class Element:
    """One UI element as the agent sees it: its number, and what uiautomator reports of it."""

    index: int
    cls: str
    text: str
    desc: str
    rid: str
    bounds: tuple[int, int, int, int]
    clickable: bool = False
    checkable: bool = False
    checked: bool = False
    focused: bool = False
    scrollable: bool = False
    hint: str = ""
    package: str = ""

    @property
    def center(self) -> tuple[int, int]:
        x1, y1, x2, y2 = self.bounds
        return (x1 + x2) // 2, (y1 + y2) // 2

    @property
    def short_class(self) -> str:
        return self.cls.rsplit(".", 1)[-1]

    @property
    def short_id(self) -> str:
        return self.rid.split(":id/", 1)[-1]

    def line(self) -> str:
        parts = [f"[{self.index}] {self.short_class}"]
        if self.text:
            parts.append(_quote(self.text))
        if self.desc and self.desc != self.text:
            parts.append(f"desc={_quote(self.desc)}")
        if self.hint and not self.text:
            parts.append(f"hint={_quote(self.hint)}")
        if self.rid:
            parts.append(f"id={self.short_id}")
        parts += [flag for flag, on in (("clickable", self.clickable), ("scrollable", self.scrollable),
                                        ("focused", self.focused)) if on]
        if self.checkable:
            parts.append(f"checked={'true' if self.checked else 'false'}")
        x1, y1, x2, y2 = self.bounds
        parts.append(f"bounds=[{x1},{y1}][{x2},{y2}]")
        return " ".join(parts)

    def record(self) -> dict[str, Any]:
        x1, y1, x2, y2 = self.bounds
        out: dict[str, Any] = {"index": self.index, "class": self.cls, "text": self.text, "desc": self.desc,
                               "resource_id": self.rid, "bounds": [x1, y1, x2, y2], "clickable": self.clickable}
        if self.checkable:
            out["checked"] = self.checked
        if self.hint:
            out["hint"] = self.hint
        return out

    def attr(self, name: str) -> Any:
        """An attribute for a `ui` check: text, desc (content-desc), resource_id, class, checked, ..."""
        values = {"text": self.text, "desc": self.desc, "content-desc": self.desc, "resource_id": self.rid,
                  "resource-id": self.rid, "class": self.cls, "checked": self.checked, "checkable": self.checkable,
                  "clickable": self.clickable, "focused": self.focused, "hint": self.hint, "package": self.package}
        if name not in values:
            raise KeyError(name)
        return values[name]


def _quote(text: str) -> str:
    flat = text.replace("\n", "\\n")
    return '"' + (flat if len(flat) <= 80 else flat[:77] + "...") + '"'


def parse_hierarchy(xml: str) -> list[Element]:
    """The elements worth showing (text, a description, or something to do), numbered in document order."""
    try:
        root = ET.fromstring(xml.encode("utf-8"))
    except ET.ParseError as exc:
        raise InfrastructureError(f"the device's UI dump is not XML: {exc}") from None
    out: list[Element] = []
    for node in root.iter("node"):
        a = node.attrib
        m = _BOUNDS.fullmatch(a.get("bounds", ""))
        if not m:
            continue
        bounds = tuple(int(v) for v in m.groups())
        if bounds[2] <= bounds[0] or bounds[3] <= bounds[1]:
            continue
        flags = {k: a.get(k) == "true" for k in ("clickable", "checkable", "checked", "focused", "scrollable",
                                                  "long-clickable")}
        text, desc = a.get("text", ""), a.get("content-desc", "")
        if not (text or desc or flags["clickable"] or flags["checkable"] or flags["scrollable"]
                or flags["long-clickable"]):
            continue
        out.append(Element(index=len(out), cls=a.get("class", ""), text=text, desc=desc, rid=a.get("resource-id", ""),
                           bounds=bounds, clickable=flags["clickable"], checkable=flags["checkable"],
                           checked=flags["checked"], focused=flags["focused"], scrollable=flags["scrollable"],
                           hint=a.get("hint", ""), package=a.get("package", "")))
    return out


@dataclass
class Observation:
    xml: str
    elements: list[Element]
    png: bytes
    width: int
    height: int
    package: str = ""

    def text(self, limit: int = MAX_ELEMENTS) -> str:
        head = f"Screen {self.width}x{self.height}, app {self.package or 'unknown'}; {len(self.elements)} elements"
        lines = [e.line() for e in self.elements[:limit]]
        if len(self.elements) > limit:
            lines.append(f"... {len(self.elements) - limit} more elements not shown")
        return "\n".join([head + ":", *lines]) if lines else head + " (nothing to act on)"

    def records(self, limit: int = MAX_ELEMENTS) -> list[dict[str, Any]]:
        return [e.record() for e in self.elements[:limit]]


@dataclass
class DeviceChannel:
    """adbutils calls for one device, errors turned into InfrastructureError."""

    endpoint: Endpoint
    mode: str  # "simulated" | "device"
    timeout_s: float = SHELL_TIMEOUT_S
    size: tuple[int, int] | None = None
    calls: int = field(default=0)

    def __post_init__(self) -> None:
        self.client = adbutils.AdbClient(host=self.endpoint.host, port=self.endpoint.port,
                                         socket_timeout=self.timeout_s)
        self.device = self.client.device(serial=self.endpoint.serial)

    def _fail(self, exc: BaseException, what: str) -> InfrastructureError:
        label = "the simulated device" if self.mode == "simulated" else "the Android device"
        return InfrastructureError(f"{label} did not answer {what} ({self.endpoint}): {type(exc).__name__}: {exc}")

    def require_device(self) -> None:
        """InfrastructureError unless the adb server answers and lists the serial as a ready device."""
        try:
            state = self.device.get_state()
        except (AdbError, OSError) as exc:
            raise InfrastructureError(
                f"no Android device reachable in {self.mode} mode ({self.endpoint}): {exc}. Start the adb server "
                "and attach the device (or an emulator / Redroid); the simulator is never used instead.") from None
        if state != "device":
            raise InfrastructureError(f"the Android device {self.endpoint.serial} is {state!r}, not ready ({self.endpoint})")

    def shell(self, command: str | list[str], *, timeout: float | None = None) -> Any:
        """`adb shell` with the command's exit code (adbutils shell2, v1 protocol: works on every adbd)."""
        self.calls += 1
        try:
            return self.device.shell2(command, timeout=timeout or self.timeout_s, rstrip=True)
        except (AdbError, OSError, ValueError) as exc:
            raise self._fail(exc, f"`{command if isinstance(command, str) else shlex.join(command)}`") from None

    def run(self, command: list[str]) -> str:
        """A command whose failure is the platform's (input events, dumps): its output, or InfrastructureError."""
        result = self.shell(command)
        if result.returncode != 0:
            raise InfrastructureError(f"`{shlex.join(command)}` failed on the device (exit {result.returncode}): "
                                      f"{result.output.strip()[:300]}")
        return result.output

    def window_size(self) -> tuple[int, int]:
        if self.size is None:
            try:
                size = self.device.window_size()
            except (AdbError, OSError, ValueError) as exc:
                raise self._fail(exc, "`wm size`") from None
            self.size = (int(size.width), int(size.height))
        return self.size

    def dump(self) -> str:
        """The UI hierarchy XML (adbutils: uiautomator dump, then the file over sync RECV)."""
        self.calls += 1
        try:
            return self.device.dump_hierarchy()
        except (AdbError, OSError, ValueError) as exc:
            raise self._fail(exc, "`uiautomator dump`") from None

    def observe(self) -> Observation:
        width, height = self.window_size()
        xml = self.dump()
        self.calls += 1
        try:
            png = self.device.shell(["screencap", "-p"], encoding=None, timeout=self.timeout_s)
        except (AdbError, OSError, ValueError) as exc:
            raise self._fail(exc, "`screencap -p`") from None
        if not png.startswith(b"\x89PNG\r\n\x1a\n"):
            raise InfrastructureError(f"`screencap -p` did not return a PNG ({self.endpoint}): {png[:80]!r}")
        elements = parse_hierarchy(xml)
        m = re.search(r'package="([^"]*)"', xml)
        return Observation(xml=xml, elements=elements, png=png, width=width, height=height,
                           package=m.group(1) if m else "")

    # -- input (adb `input`, as AndroidWorld's adb_utils sends it) ------------------------

    def tap(self, x: int, y: int) -> None:
        self.run(["input", "tap", str(x), str(y)])

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> None:
        self.run(["input", "swipe", str(x1), str(y1), str(x2), str(y2), str(duration_ms)])

    def keyevent(self, *codes: int) -> None:
        self.run(["input", "keyevent", *(str(c) for c in codes)])

    def input_text(self, text: str, *, ime: str = "") -> str:
        """Type `text` into the focused field; returns how ("input text" or the IME broadcast).

        `input text` takes ASCII only on a device (spaces as %s); other text needs an IME that
        accepts broadcasts: ADBKeyBoard (`ime: adbkeyboard`, installed and selected on the device).
        The simulator takes any text through `input text`."""
        if ime == "adbkeyboard":
            self.run(["am", "broadcast", "-a", "ADB_INPUT_TEXT", "--es", "msg", text])
            return "adbkeyboard"
        if self.mode == "device" and not text.isascii():
            raise ValueError("non-ASCII text cannot be typed with `input text` on a device; the task's device "
                             "needs an IME (scene_config.device.ime: adbkeyboard)")
        for chunk in re.split(r"(\n)", text):
            if chunk == "\n":
                self.keyevent(KEY_ENTER)
            elif chunk:
                self.run(["input", "text", chunk.replace(" ", "%s")])
        return "input text"

    def launch(self, package: str, activity: str = "") -> str | None:
        """Start an app (`am start -n`, or monkey's launcher intent without an activity); None when
        it started, else what the device said."""
        if activity:
            result = self.shell(["am", "start", "-n", f"{package}/{activity}"])
        else:
            result = self.shell(["monkey", "-p", package, "-c", "android.intent.category.LAUNCHER", "1"])
        if result.returncode != 0 or "Error" in result.output or "aborted" in result.output:
            return result.output.strip()[:300] or f"exit {result.returncode}"
        return None

    def connect(self, address: str) -> str:
        """`adb connect address` through this channel's adb server (a Redroid or networked device)."""
        try:
            answer = self.client.connect(address, timeout=self.timeout_s)
        except (AdbError, OSError) as exc:
            raise InfrastructureError(f"adb connect {address} through {self.endpoint.host}:{self.endpoint.port} "
                                      f"failed: {exc}") from None
        if "connected" not in answer or "failed" in answer or "unable" in answer:
            raise InfrastructureError(f"adb connect {address}: {answer}")
        return answer

    def disconnect(self, address: str) -> None:
        try:
            self.client.disconnect(address)
        except (AdbError, OSError):
            pass  # the device is going away with its sandbox anyway

    def wait_for_boot(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            try:
                last = self.device.shell(["getprop", "sys.boot_completed"], timeout=5).strip()
                if last == "1":
                    return
            except (AdbError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(1.0)
        raise InfrastructureError(f"the device {self.endpoint.serial} did not finish booting in {timeout_s:g}s "
                                  f"(sys.boot_completed: {last or 'empty'})")
