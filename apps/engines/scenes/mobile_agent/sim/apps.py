"""The simulated device's state and its declarative apps, rendered to uiautomator XML and a PNG.

State is one JSON-able dict (what `SimDevice.snapshot()` returns and a task's `initial_state`
overrides): `settings` (global/system/secure name -> value strings, as `settings get` reads them),
the content providers' tables (`contacts`, `alarms`, `notes`), the calculator's display, `props`
(getprop) and `ui` (the foreground app, its page, the form being edited, the back stack).

A screen is a function of the state returning widgets (class, text, description, resource id,
bounds, flags, and what a tap does). The same list becomes the uiautomator dump (one flat
hierarchy under the app's FrameLayout) and the screenshot, so what the agent reads and what it
sees cannot disagree. A tap hits the topmost clickable widget under the point; `input text` goes
to the focused field; BACK pops the page stack, HOME returns to the launcher.
"""
from __future__ import annotations

import copy
import io
import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from xml.sax.saxutils import quoteattr

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 720, 1280
STATUS_H, TITLE_BOTTOM, CONTENT_TOP = 48, 160, 176
ROW_H = 120
LAUNCHER = "com.android.launcher3"
SETTINGS, CONTACTS, CLOCK, CALCULATOR, NOTES = (
    "com.android.settings", "com.android.contacts", "com.android.deskclock", "com.android.calculator2",
    "org.trajplatform.notes")
# package -> (label, launcher activity)
APPS: dict[str, tuple[str, str]] = {
    SETTINGS: ("Settings", ".Settings"),
    CONTACTS: ("Contacts", ".activities.PeopleActivity"),
    CLOCK: ("Clock", ".DeskClock"),
    CALCULATOR: ("Calculator", ".Calculator"),
    NOTES: ("Notes", ".MainActivity"),
}
TABLES = {CONTACTS: "contacts", CLOCK: "alarms", NOTES: "notes"}
COLUMNS = {"contacts": ("_id", "display_name", "number"), "alarms": ("_id", "hour", "minutes", "enabled", "label"),
           "notes": ("_id", "title", "body")}
PROPS = {
    "ro.product.model": "trajplatform_sim", "ro.product.name": "trajplatform_sim", "ro.product.device": "sim",
    "ro.product.manufacturer": "trajplatform", "ro.build.version.release": "14", "ro.build.version.sdk": "34",
    "ro.serialno": "sim-0001", "sys.boot_completed": "1", "ro.kernel.qemu": "0",
    "ro.trajplatform.simulated": "1",
}
BRIGHTNESS_MAX = 255
SEEK_X0, SEEK_X1 = 48, 672


def initial_state(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fresh device, with a task's `initial_state` (settings, tables, calculator, foreground app) on top."""
    state: dict[str, Any] = {
        "settings": {"global": {"wifi_on": "1", "bluetooth_on": "0", "airplane_mode_on": "0"},
                     "system": {"screen_brightness": "128", "screen_brightness_mode": "0"},
                     "secure": {"default_input_method": "com.android.inputmethod.latin/.LatinIME"}},
        "contacts": [], "alarms": [], "notes": [],
        "calculator": {"formula": "", "result": ""},
        "props": dict(PROPS),
        "ui": {"app": LAUNCHER, "page": "home", "form": {}, "focus": "", "stack": [], "scroll": 0, "message": ""},
    }
    extra = copy.deepcopy(overrides or {})
    unknown = set(extra) - {"settings", "contacts", "alarms", "notes", "calculator", "props", "app"}
    if unknown:
        raise ValueError(f"initial_state: unknown keys {', '.join(sorted(unknown))}; known: settings, contacts, "
                         "alarms, notes, calculator, props, app")
    for namespace, values in (extra.get("settings") or {}).items():
        if namespace not in state["settings"]:
            raise ValueError(f"initial_state.settings: namespace must be global, system or secure, got {namespace!r}")
        state["settings"][namespace].update({str(k): str(v) for k, v in values.items()})
    for table in ("contacts", "alarms", "notes"):
        for i, row in enumerate(extra.get(table) or []):
            unknown_cols = set(row) - set(COLUMNS[table])
            if unknown_cols:
                raise ValueError(f"initial_state.{table}[{i}]: unknown columns {', '.join(sorted(unknown_cols))}")
            full = {"_id": i + 1, **{c: ("" if c in ("display_name", "number", "label", "title", "body") else 0)
                                     for c in COLUMNS[table][1:]}, **row}
            if table == "alarms":
                full.setdefault("enabled", 1)
            state[table].append(full)
    state["calculator"].update(extra.get("calculator") or {})
    state["props"].update({str(k): str(v) for k, v in (extra.get("props") or {}).items()})
    app = extra.get("app")
    if app:
        if app not in APPS:
            raise ValueError(f"initial_state.app: one of {', '.join(APPS)}, got {app!r}")
        state["ui"].update(app=app, page=_first_page(app))
    return state


def _first_page(app: str) -> str:
    return {SETTINGS: "main", CONTACTS: "list", CLOCK: "alarms", CALCULATOR: "main", NOTES: "list"}.get(app, "home")


@dataclass
class Widget:
    cls: str
    bounds: tuple[int, int, int, int]
    text: str = ""
    desc: str = ""
    rid: str = ""
    hint: str = ""
    clickable: bool = False
    checkable: bool = False
    checked: bool = False
    focused: bool = False
    scrollable: bool = False
    style: str = "text"  # how it is drawn: text, title, button, icon, switch, field, seek, row, display, key, error
    tap: Callable[[], None] | None = field(default=None, repr=False)
    seek: Callable[[int], None] | None = field(default=None, repr=False)  # brightness bar: x -> value


def _font_path() -> str | None:
    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",):
        if Path(path).exists():
            return path
    return None


_FONTS: dict[int, Any] = {}


def font(size: int) -> Any:
    if size not in _FONTS:
        path = _font_path()
        _FONTS[size] = ImageFont.truetype(path, size) if path else ImageFont.load_default(size)
    return _FONTS[size]


class SimDevice:
    """One simulated phone: its state, its screens, and the input it accepts (thread-safe)."""

    def __init__(self, state: dict[str, Any] | None = None, *, serial: str = "emulator-5554"):
        self.state = state if state is not None else initial_state()
        self.serial = serial
        self.lock = threading.RLock()
        self.files: dict[str, bytes] = {}
        self.actions = 0  # input events applied

    # -- state -----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The apps' state (JSON), without the UI bookkeeping's back stack."""
        with self.lock:
            out = copy.deepcopy({k: v for k, v in self.state.items() if k != "props"})
            out["ui"] = {k: v for k, v in out["ui"].items() if k != "stack"}
            return out

    @property
    def ui(self) -> dict[str, Any]:
        return self.state["ui"]

    def setting(self, namespace: str, name: str) -> str | None:
        return self.state["settings"].get(namespace, {}).get(name)

    def put_setting(self, namespace: str, name: str, value: str) -> None:
        self.state["settings"].setdefault(namespace, {})[name] = value
        if namespace == "global" and name == "airplane_mode_on" and value == "1":
            # Airplane mode turns the radios off, as Android's default airplane_mode_radios does.
            self.state["settings"]["global"].update(wifi_on="0", bluetooth_on="0")

    def _next_id(self, table: str) -> int:
        return max((int(r["_id"]) for r in self.state[table]), default=0) + 1

    def clear_app(self, package: str) -> bool:
        """`pm clear`: the app's data back to empty (AndroidWorld resets apps this way)."""
        if package in TABLES:
            self.state[TABLES[package]] = []
        elif package == CALCULATOR:
            self.state["calculator"] = {"formula": "", "result": ""}
        elif package not in APPS and package != LAUNCHER:
            return False
        if self.ui["app"] == package:
            self.go_home()
        return True

    # -- navigation ------------------------------------------------------------------

    def _go(self, app: str, page: str, form: dict[str, Any] | None = None, *, push: bool = True) -> None:
        ui = self.ui
        if push:
            ui["stack"].append({"app": ui["app"], "page": ui["page"], "form": ui["form"], "scroll": ui["scroll"]})
        ui.update(app=app, page=page, form=dict(form or {}), focus="", scroll=0, message="")

    def go_home(self) -> None:
        self.ui.update(app=LAUNCHER, page="home", form={}, focus="", stack=[], scroll=0, message="")

    def launch(self, package: str) -> bool:
        if package == LAUNCHER:
            self.go_home()
            return True
        if package not in APPS:
            return False
        self.go_home()
        self._go(package, _first_page(package))
        return True

    def back(self) -> None:
        ui = self.ui
        if ui["focus"]:
            ui["focus"] = ""  # the keyboard goes first
            return
        if ui["stack"]:
            prev = ui["stack"].pop()
            ui.update(app=prev["app"], page=prev["page"], form=prev["form"], focus="", scroll=prev["scroll"], message="")
        else:
            self.go_home()

    def current_activity(self) -> str:
        app = self.ui["app"]
        if app == LAUNCHER:
            return f"{LAUNCHER}/{LAUNCHER}.Launcher"
        return f"{app}/{app}{APPS[app][1]}"

    # -- screens ---------------------------------------------------------------------

    def widgets(self) -> list[Widget]:
        with self.lock:
            ui = self.ui
            builder = SCREENS.get((ui["app"], ui["page"]))
            if builder is None:
                self.go_home()
                builder = SCREENS[(LAUNCHER, "home")]
            return builder(self)

    def title(self, text: str, rid: str) -> list[Widget]:
        return [Widget("android.widget.TextView", (32, STATUS_H, WIDTH - 32, TITLE_BOTTOM), text=text,
                       rid=rid, style="title")]

    def field_widget(self, key: str, hint: str, rid: str, y: int, *, height: int = 96) -> Widget:
        ui = self.ui
        value = str(ui["form"].get(key, ""))

        def focus() -> None:
            ui["focus"] = key

        return Widget("android.widget.EditText", (48, y, WIDTH - 48, y + height), text=value, hint=hint, rid=rid,
                      clickable=True, focused=ui["focus"] == key, style="field", tap=focus)

    def button(self, text: str, rid: str, bounds: tuple[int, int, int, int], tap: Callable[[], None], *,
               desc: str = "", cls: str = "android.widget.Button", style: str = "button") -> Widget:
        return Widget(cls, bounds, text=text, desc=desc, rid=rid, clickable=True, style=style, tap=tap)

    def list_rows(self, items: list[Any], top: int, render: Callable[[Any, int], list[Widget]],
                  rid: str, bottom: int = HEIGHT - 200) -> list[Widget]:
        """Rows of a list page from `top`; the part that does not fit scrolls (ui.scroll rows)."""
        fits = max(1, (bottom - top) // ROW_H)
        scroll = max(0, min(int(self.ui.get("scroll") or 0), max(0, len(items) - fits)))
        self.ui["scroll"] = scroll
        out = [Widget("androidx.recyclerview.widget.RecyclerView", (0, top, WIDTH, bottom), rid=rid,
                      scrollable=len(items) > fits, style="none")]
        for n, item in enumerate(items[scroll:scroll + fits]):
            out += render(item, top + n * ROW_H)
        return out

    def scroll(self, rows: int) -> None:
        self.ui["scroll"] = max(0, int(self.ui.get("scroll") or 0) + rows)

    # -- input -----------------------------------------------------------------------

    def hit(self, x: int, y: int) -> Widget | None:
        for widget in reversed(self.widgets()):
            x1, y1, x2, y2 = widget.bounds
            if (widget.tap or widget.seek) and x1 <= x < x2 and y1 <= y < y2:
                return widget
        return None

    def tap(self, x: int, y: int) -> None:
        with self.lock:
            self.actions += 1
            widget = self.hit(x, y)
            if widget is None:
                return
            if widget.seek is not None:
                widget.seek(x)
            elif widget.tap is not None:
                widget.tap()

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> None:
        with self.lock:
            self.actions += 1
            if abs(x2 - x1) < 10 and abs(y2 - y1) < 10:
                if duration_ms >= 500:
                    return  # a long press: no simulated app gives it a meaning
                widget = self.hit(x1, y1)
                if widget and widget.tap:
                    widget.tap()
                return
            widget = self.hit(x1, y1)
            if widget is not None and widget.seek is not None:
                widget.seek(x2)
                return
            if abs(y2 - y1) >= abs(x2 - x1):
                self.scroll(int(round((y1 - y2) / ROW_H)) or (1 if y1 > y2 else -1))

    def text(self, text: str) -> None:
        with self.lock:
            self.actions += 1
            ui = self.ui
            if ui["app"] == CALCULATOR:
                for ch in text:
                    key = {"*": "×", "/": "÷", "-": "−", "x": "×"}.get(ch, ch)
                    if key in CALC_KEYS:
                        calc_press(self, key)
                return
            if ui["focus"]:
                ui["form"][ui["focus"]] = str(ui["form"].get(ui["focus"], "")) + text

    def key(self, code: int) -> None:
        with self.lock:
            self.actions += 1
            ui = self.ui
            if code == 3:
                self.go_home()
            elif code == 4:
                self.back()
            elif code == 66:
                if ui["app"] == CALCULATOR:
                    calc_press(self, "=")
                elif ui["focus"] == "body":
                    ui["form"]["body"] = str(ui["form"].get("body", "")) + "\n"
                else:
                    ui["focus"] = ""
            elif code == 67:
                if ui["app"] == CALCULATOR:
                    calc_press(self, "DEL")
                elif ui["focus"]:
                    ui["form"][ui["focus"]] = str(ui["form"].get(ui["focus"], ""))[:-1]
            # 122/123 (MOVE_HOME/END) and others: the cursor is always at the end here

    # -- output ----------------------------------------------------------------------

    def hierarchy_xml(self) -> str:
        """The screen as `uiautomator dump` writes it."""
        widgets = self.widgets()
        package = self.ui["app"]
        nodes = []
        for n, w in enumerate(widgets):
            x1, y1, x2, y2 = w.bounds
            attrs = [("index", str(n)), ("text", w.text), ("resource-id", w.rid), ("class", w.cls),
                     ("package", package), ("content-desc", w.desc), ("checkable", _b(w.checkable)),
                     ("checked", _b(w.checked)), ("clickable", _b(w.clickable)), ("enabled", "true"),
                     ("focusable", _b(w.clickable)), ("focused", _b(w.focused)), ("scrollable", _b(w.scrollable)),
                     ("long-clickable", "false"), ("password", "false"), ("selected", "false"),
                     ("bounds", f"[{x1},{y1}][{x2},{y2}]")]
            if w.hint:
                attrs.insert(2, ("hint", w.hint))
            nodes.append("<node " + " ".join(f"{k}={quoteattr(v)}" for k, v in attrs) + " />")
        root = (f'<node index="0" text="" resource-id="" class="android.widget.FrameLayout" package="{package}" '
                'content-desc="" checkable="false" checked="false" clickable="false" enabled="true" focusable="false" '
                'focused="false" scrollable="false" long-clickable="false" password="false" selected="false" '
                f'bounds="[0,0][{WIDTH},{HEIGHT}]">')
        return ("<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
                f'<hierarchy rotation="0">{root}{"".join(nodes)}</node></hierarchy>')

    def screenshot_png(self) -> bytes:
        """The screen as `screencap -p` gives it (deterministic for a state)."""
        with self.lock:
            widgets = self.widgets()
            settings = self.state["settings"]["global"]
            app = self.ui["app"]
        image = Image.new("RGB", (WIDTH, HEIGHT), (250, 250, 250))
        draw = ImageDraw.Draw(image)
        accent = ACCENTS.get(app, (60, 64, 67))
        draw.rectangle((0, 0, WIDTH, STATUS_H), fill=(32, 33, 36))
        draw.text((24, 8), "12:00", font=font(26), fill=(255, 255, 255))
        icons = [name for name, on in (("Wi-Fi", settings.get("wifi_on") in ("1", "2")),
                                       ("BT", settings.get("bluetooth_on") == "1"),
                                       ("Airplane", settings.get("airplane_mode_on") == "1")) if on]
        draw.text((WIDTH - 24, 8), "  ".join(icons + ["100%"]), font=font(26), fill=(255, 255, 255), anchor="ra")
        if app != LAUNCHER:
            draw.rectangle((0, STATUS_H, WIDTH, TITLE_BOTTOM), fill=accent)
        for w in widgets:
            _draw(draw, w, accent)
        buf = io.BytesIO()
        image.save(buf, "PNG", compress_level=1)
        return buf.getvalue()


def _b(value: bool) -> str:
    return "true" if value else "false"


ACCENTS = {SETTINGS: (26, 115, 232), CONTACTS: (11, 128, 67), CLOCK: (161, 66, 244), CALCULATOR: (95, 99, 104),
           NOTES: (227, 116, 0)}


def _draw(draw: Any, w: Widget, accent: tuple[int, int, int]) -> None:
    x1, y1, x2, y2 = w.bounds
    mid = (y1 + y2) // 2
    if w.style == "title":
        draw.text((x1, mid), w.text, font=font(40), fill=(255, 255, 255), anchor="lm")
    elif w.style == "row":
        draw.line((x1, y2 - 1, x2, y2 - 1), fill=(220, 220, 220), width=2)
    elif w.style == "text":
        draw.text((x1, mid), w.text or w.desc, font=font(32), fill=(32, 33, 36), anchor="lm")
    elif w.style == "small":
        draw.text((x1, mid), w.text, font=font(26), fill=(95, 99, 104), anchor="lm")
    elif w.style == "error":
        draw.text((x1, mid), w.text, font=font(28), fill=(197, 34, 31), anchor="lm")
    elif w.style in ("button", "key", "icon"):
        fill = accent if w.style != "key" else (232, 234, 237)
        if w.style == "key" and w.text in ("=",):
            fill = accent
        draw.rounded_rectangle((x1 + 4, y1 + 4, x2 - 4, y2 - 4), radius=18, fill=fill)
        color = (255, 255, 255) if fill == accent else (32, 33, 36)
        label = w.text or ("+" if "Add" in w.desc or "Create" in w.desc or "New" in w.desc else w.desc)
        size = 44 if w.style == "key" else 30
        if w.style == "icon":
            draw.text(((x1 + x2) // 2, y2 - 8), w.text, font=font(26), fill=(32, 33, 36), anchor="md")
            draw.rounded_rectangle((x1 + 40, y1 + 8, x2 - 40, y2 - 56), radius=28, fill=ACCENTS.get(w.rid, accent))
            draw.text(((x1 + x2) // 2, (y1 + y2 - 48) // 2), w.text[:1], font=font(48), fill=(255, 255, 255), anchor="mm")
        else:
            draw.text(((x1 + x2) // 2, mid), label, font=font(size), fill=color, anchor="mm")
    elif w.style == "switch":
        on = w.checked
        draw.rounded_rectangle((x1, mid - 18, x2, mid + 18), radius=18, fill=accent if on else (189, 193, 198))
        cx = x2 - 20 if on else x1 + 20
        draw.ellipse((cx - 22, mid - 22, cx + 22, mid + 22), fill=(255, 255, 255), outline=(150, 150, 150))
    elif w.style == "field":
        draw.rectangle((x1, y1, x2, y2), outline=accent if w.focused else (150, 150, 150), width=3 if w.focused else 2)
        if w.text:
            draw.text((x1 + 16, mid), w.text.split("\n")[-1][-40:], font=font(32), fill=(32, 33, 36), anchor="lm")
        else:
            draw.text((x1 + 16, mid), w.hint, font=font(32), fill=(150, 150, 150), anchor="lm")
    elif w.style == "seek":
        draw.line((SEEK_X0, mid, SEEK_X1, mid), fill=(189, 193, 198), width=8)
        value = int(w.text or 0)
        cx = SEEK_X0 + (SEEK_X1 - SEEK_X0) * value // BRIGHTNESS_MAX
        draw.line((SEEK_X0, mid, cx, mid), fill=accent, width=8)
        draw.ellipse((cx - 20, mid - 20, cx + 20, mid + 20), fill=accent)
    elif w.style == "display":
        draw.text((x2 - 24, mid), w.text, font=font(64 if "result" not in w.rid else 48),
                  fill=(32, 33, 36) if "result" not in w.rid else (95, 99, 104), anchor="rm")


# -- the apps ------------------------------------------------------------------------

def launcher_home(dev: SimDevice) -> list[Widget]:
    out = []
    for n, (package, (label, _)) in enumerate(APPS.items()):
        col, row = n % 3, n // 3
        x, y = 24 + col * 224, 200 + row * 260
        # The resource id names the app (the icon is drawn in its colour).
        out.append(Widget("android.widget.TextView", (x, y, x + 224, y + 240), text=label, desc=label,
                          rid=package, clickable=True, style="icon", tap=lambda p=package: dev.launch(p)))
    return out


def _switch_row(dev: SimDevice, y: int, title: str, summary: str, namespace: str, name: str, rid: str) -> list[Widget]:
    on = dev.setting(namespace, name) in ("1", "2")

    def toggle() -> None:
        dev.put_setting(namespace, name, "0" if on else "1")

    return [
        Widget("android.widget.LinearLayout", (0, y, WIDTH, y + ROW_H), clickable=True, style="row", tap=toggle),
        Widget("android.widget.TextView", (48, y + 10, 540, y + 70), text=title, rid="android:id/title"),
        Widget("android.widget.TextView", (48, y + 70, 540, y + 110), text=summary, rid="android:id/summary",
               style="small"),
        Widget("android.widget.Switch", (580, y + 30, 672, y + 90), rid=f"{SETTINGS}:id/{rid}", clickable=True,
               checkable=True, checked=on, style="switch", tap=toggle, desc=title),
    ]


def settings_main(dev: SimDevice) -> list[Widget]:
    out = dev.title("Settings", f"{SETTINGS}:id/action_bar_title")
    y = CONTENT_TOP
    wifi = dev.setting("global", "wifi_on") in ("1", "2")
    bt = dev.setting("global", "bluetooth_on") == "1"
    airplane = dev.setting("global", "airplane_mode_on") == "1"
    out += _switch_row(dev, y, "Wi-Fi", "Connected to TrajNet" if wifi else "Off", "global", "wifi_on", "wifi_switch")
    out += _switch_row(dev, y + ROW_H, "Bluetooth", "On" if bt else "Off", "global", "bluetooth_on", "bluetooth_switch")
    out += _switch_row(dev, y + 2 * ROW_H, "Airplane mode", "On" if airplane else "Off", "global", "airplane_mode_on",
                       "airplane_switch")
    value = int(dev.setting("system", "screen_brightness") or 0)
    percent = round(100 * value / BRIGHTNESS_MAX)
    by = y + 3 * ROW_H

    def seek(x: int) -> None:
        ratio = min(1.0, max(0.0, (x - SEEK_X0) / (SEEK_X1 - SEEK_X0)))
        dev.put_setting("system", "screen_brightness", str(round(ratio * BRIGHTNESS_MAX)))

    out += [
        Widget("android.widget.TextView", (48, by + 10, 672, by + 60), text=f"Brightness level {percent}%",
               rid="android:id/title"),
        Widget("android.widget.SeekBar", (SEEK_X0 - 24, by + 70, SEEK_X1 + 24, by + 130), text=str(value),
               desc="Brightness level", rid=f"{SETTINGS}:id/brightness_seekbar", clickable=True, style="seek",
               seek=seek),
    ]
    ay = by + ROW_H + 40
    out += [
        Widget("android.widget.LinearLayout", (0, ay, WIDTH, ay + ROW_H), clickable=True, style="row",
               tap=lambda: dev._go(SETTINGS, "about")),
        Widget("android.widget.TextView", (48, ay + 10, 540, ay + 70), text="About phone", rid="android:id/title"),
        Widget("android.widget.TextView", (48, ay + 70, 540, ay + 110), text=dev.state["props"]["ro.product.model"],
               rid="android:id/summary", style="small"),
    ]
    return out


def settings_about(dev: SimDevice) -> list[Widget]:
    props = dev.state["props"]
    out = dev.title("About phone", f"{SETTINGS}:id/action_bar_title")
    rows = [("Device name", props["ro.product.model"]), ("Android version", props["ro.build.version.release"]),
            ("Serial number", props["ro.serialno"])]
    for n, (title, value) in enumerate(rows):
        y = CONTENT_TOP + n * ROW_H
        out += [Widget("android.widget.TextView", (48, y + 10, 672, y + 70), text=title, rid="android:id/title"),
                Widget("android.widget.TextView", (48, y + 70, 672, y + 110), text=value, rid="android:id/summary",
                       style="small")]
    return out


def _fab(dev: SimDevice, desc: str, rid: str, tap: Callable[[], None]) -> Widget:
    return dev.button("", rid, (WIDTH - 184, HEIGHT - 184, WIDTH - 40, HEIGHT - 40), tap, desc=desc,
                      cls="android.widget.ImageButton")


def contacts_list(dev: SimDevice) -> list[Widget]:
    out = dev.title("Contacts", f"{CONTACTS}:id/toolbar_title")
    people = sorted(dev.state["contacts"], key=lambda r: (str(r["display_name"]).lower(), r["_id"]))
    if not people:
        out.append(Widget("android.widget.TextView", (48, CONTENT_TOP, 672, CONTENT_TOP + 80), text="No contacts",
                          rid=f"{CONTACTS}:id/empty"))

    def row(person: dict[str, Any], y: int) -> list[Widget]:
        return [Widget("android.widget.TextView", (48, y, 672, y + ROW_H - 8), text=str(person["display_name"]),
                       rid=f"{CONTACTS}:id/cliv_name_textview", clickable=True, style="text",
                       tap=lambda i=person["_id"]: dev._go(CONTACTS, "detail", {"id": i}))]

    out += dev.list_rows(people, CONTENT_TOP, row, f"{CONTACTS}:id/list")
    out.append(_fab(dev, "Create contact", f"{CONTACTS}:id/floating_action_button",
                    lambda: dev._go(CONTACTS, "edit", {"name": "", "phone": ""})))
    return out


def _find(dev: SimDevice, table: str, row_id: Any) -> dict[str, Any] | None:
    return next((r for r in dev.state[table] if r["_id"] == row_id), None)


def contacts_detail(dev: SimDevice) -> list[Widget]:
    person = _find(dev, "contacts", dev.ui["form"].get("id"))
    if person is None:
        dev.back()
        return dev.widgets()
    out = dev.title(str(person["display_name"]), f"{CONTACTS}:id/large_title")

    def delete() -> None:
        dev.state["contacts"] = [r for r in dev.state["contacts"] if r["_id"] != person["_id"]]
        dev.back()

    out += [Widget("android.widget.TextView", (48, CONTENT_TOP, 672, CONTENT_TOP + 60), text="Phone",
                   rid=f"{CONTACTS}:id/header", style="small"),
            Widget("android.widget.TextView", (48, CONTENT_TOP + 60, 672, CONTENT_TOP + 130),
                   text=str(person["number"]), rid=f"{CONTACTS}:id/phone_number"),
            dev.button("Delete", f"{CONTACTS}:id/menu_delete", (48, CONTENT_TOP + 180, 320, CONTENT_TOP + 280), delete)]
    return out


def contacts_edit(dev: SimDevice) -> list[Widget]:
    out = dev.title("Create contact", f"{CONTACTS}:id/toolbar_title")
    form = dev.ui["form"]

    def save() -> None:
        name = str(form.get("name", "")).strip()
        if not name:
            dev.ui["message"] = "Enter a name"
            return
        new = {"_id": dev._next_id("contacts"), "display_name": name, "number": str(form.get("phone", "")).strip()}
        dev.state["contacts"].append(new)
        dev.ui.update(page="detail", form={"id": new["_id"]}, focus="", message="")

    out += [dev.field_widget("name", "Name", f"{CONTACTS}:id/name", CONTENT_TOP + 20),
            dev.field_widget("phone", "Phone", f"{CONTACTS}:id/phone", CONTENT_TOP + 140),
            dev.button("Save", f"{CONTACTS}:id/editor_menu_save_button", (400, CONTENT_TOP + 280, 672, CONTENT_TOP + 380),
                       save),
            dev.button("Cancel", f"{CONTACTS}:id/cancel", (48, CONTENT_TOP + 280, 320, CONTENT_TOP + 380), dev.back)]
    return out + _message(dev)


def _message(dev: SimDevice) -> list[Widget]:
    if not dev.ui.get("message"):
        return []
    return [Widget("android.widget.TextView", (48, HEIGHT - 300, 672, HEIGHT - 240), text=dev.ui["message"],
                   rid="android:id/message", style="error")]


def clock_alarms(dev: SimDevice) -> list[Widget]:
    out = dev.title("Alarm", f"{CLOCK}:id/action_bar_title")
    alarms = sorted(dev.state["alarms"], key=lambda r: (int(r["hour"]), int(r["minutes"]), r["_id"]))
    if not alarms:
        out.append(Widget("android.widget.TextView", (48, CONTENT_TOP, 672, CONTENT_TOP + 80), text="No alarms",
                          rid=f"{CLOCK}:id/alarms_empty_view"))

    def row(alarm: dict[str, Any], y: int) -> list[Widget]:
        on = bool(int(alarm["enabled"]))

        def toggle() -> None:
            alarm["enabled"] = 0 if on else 1

        label = f"{int(alarm['hour']):02d}:{int(alarm['minutes']):02d}"
        edit = {"id": alarm["_id"], "hour": str(alarm["hour"]), "minute": f"{int(alarm['minutes']):02d}",
                "label": str(alarm["label"])}
        widgets = [Widget("android.widget.TextView", (48, y, 400, y + 80), text=label, rid=f"{CLOCK}:id/digital_clock",
                          clickable=True, style="text", tap=lambda: dev._go(CLOCK, "edit", edit))]
        if alarm["label"]:
            widgets.append(Widget("android.widget.TextView", (48, y + 72, 540, y + 112), text=str(alarm["label"]),
                                  rid=f"{CLOCK}:id/label", style="small"))
        widgets.append(Widget("android.widget.Switch", (580, y + 10, 672, y + 70), rid=f"{CLOCK}:id/onoff",
                              clickable=True, checkable=True, checked=on, style="switch", tap=toggle,
                              desc=f"Alarm {label}"))
        return widgets

    out += dev.list_rows(alarms, CONTENT_TOP, row, f"{CLOCK}:id/alarm_recycler_view")
    out.append(_fab(dev, "Add alarm", f"{CLOCK}:id/fab",
                    lambda: dev._go(CLOCK, "edit", {"hour": "", "minute": "", "label": ""})))
    return out


def clock_edit(dev: SimDevice) -> list[Widget]:
    form = dev.ui["form"]
    out = dev.title("Edit alarm" if form.get("id") else "Add alarm", f"{CLOCK}:id/action_bar_title")

    def save() -> None:
        hour, minute = str(form.get("hour", "")).strip(), str(form.get("minute", "")).strip()
        if not (hour.isdigit() and 0 <= int(hour) <= 23):
            dev.ui["message"] = "Enter an hour from 0 to 23"
            return
        if not (minute.isdigit() and 0 <= int(minute) <= 59):
            dev.ui["message"] = "Enter a minute from 0 to 59"
            return
        existing = _find(dev, "alarms", form.get("id"))
        values = {"hour": int(hour), "minutes": int(minute), "label": str(form.get("label", "")).strip()}
        if existing is not None:
            existing.update(values)
        else:
            dev.state["alarms"].append({"_id": dev._next_id("alarms"), **values, "enabled": 1})
        dev.back()

    def delete() -> None:
        dev.state["alarms"] = [r for r in dev.state["alarms"] if r["_id"] != form.get("id")]
        dev.back()

    out += [dev.field_widget("hour", "Hour (0-23)", f"{CLOCK}:id/hour", CONTENT_TOP + 20),
            dev.field_widget("minute", "Minute (0-59)", f"{CLOCK}:id/minute", CONTENT_TOP + 140),
            dev.field_widget("label", "Label", f"{CLOCK}:id/label_input", CONTENT_TOP + 260),
            dev.button("Save", f"{CLOCK}:id/save", (400, CONTENT_TOP + 400, 672, CONTENT_TOP + 500), save),
            dev.button("Cancel", f"{CLOCK}:id/cancel", (48, CONTENT_TOP + 400, 320, CONTENT_TOP + 500), dev.back)]
    if form.get("id"):
        out.append(dev.button("Delete", f"{CLOCK}:id/delete", (48, CONTENT_TOP + 530, 320, CONTENT_TOP + 630), delete))
    return out + _message(dev)


# The calculator: keys as the AOSP Calculator labels them (text, resource id, description).
CALC_LAYOUT = [
    [("C", "clr", "clear"), ("(", "lparen", "left parenthesis"), (")", "rparen", "right parenthesis"),
     ("÷", "op_div", "divide")],
    [("7", "digit_7", ""), ("8", "digit_8", ""), ("9", "digit_9", ""), ("×", "op_mul", "multiply")],
    [("4", "digit_4", ""), ("5", "digit_5", ""), ("6", "digit_6", ""), ("−", "op_sub", "minus")],
    [("1", "digit_1", ""), ("2", "digit_2", ""), ("3", "digit_3", ""), ("+", "op_add", "plus")],
    [("0", "digit_0", ""), (".", "dec_point", "point"), ("DEL", "del", "delete"), ("=", "eq", "equals")],
]
CALC_KEYS = {k for row in CALC_LAYOUT for k, _, _ in row}
_OPS = "+−×÷"


def calc_press(dev: SimDevice, key: str) -> None:
    calc = dev.state["calculator"]
    formula, result = str(calc.get("formula", "")), str(calc.get("result", ""))
    if key == "C":
        calc.update(formula="", result="")
    elif key == "DEL":
        calc.update(formula=formula[:-1], result="")
    elif key == "=":
        if formula:
            calc["result"] = evaluate(formula)
            calc["done"] = True
    else:
        if calc.pop("done", False):
            # After "=": a digit starts over, an operator goes on from the result.
            formula = result if key in _OPS and _is_number(result) else ""
        calc.update(formula=formula + key, result="")


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d+)?", text))


def evaluate(formula: str) -> str:
    """The calculator's arithmetic (+ − × ÷, parentheses, decimals); its error texts as AOSP shows them."""
    tokens = re.findall(r"\d+\.?\d*|\.\d+|[+−×÷()-]", formula.replace("-", "−"))
    if "".join(tokens) != formula.replace("-", "−"):
        return "Error"
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def atom() -> float:
        tok = peek()
        if tok == "−":
            take()
            return -atom()
        if tok == "(":
            take()
            value = expr()
            if peek() == ")":
                take()
            return value
        if tok is None or tok in _OPS or tok == ")":
            raise ValueError("syntax")
        return float(take())

    def term() -> float:
        value = atom()
        while peek() in ("×", "÷"):
            op, rhs = take(), atom()
            if op == "÷" and rhs == 0:
                raise ZeroDivisionError
            value = value * rhs if op == "×" else value / rhs
        return value

    def expr() -> float:
        value = term()
        while peek() in ("+", "−"):
            op, rhs = take(), term()
            value = value + rhs if op == "+" else value - rhs
        return value

    try:
        value = expr()
        if pos != len(tokens):
            return "Error"
    except ZeroDivisionError:
        return "Can't divide by 0"
    except (ValueError, IndexError):
        return "Error"
    if math.isinf(value) or math.isnan(value):
        return "Error"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


def calculator_main(dev: SimDevice) -> list[Widget]:
    calc = dev.state["calculator"]
    out = [Widget("android.widget.TextView", (0, STATUS_H, WIDTH, 260), text=str(calc.get("formula", "")),
                  rid=f"{CALCULATOR}:id/formula", style="display"),
           Widget("android.widget.TextView", (0, 260, WIDTH, 360), text=str(calc.get("result", "")),
                  rid=f"{CALCULATOR}:id/result", style="display")]
    top, size = 400, 176
    for r, row in enumerate(CALC_LAYOUT):
        for c, (label, rid, desc) in enumerate(row):
            x, y = c * (WIDTH // 4), top + r * size
            out.append(dev.button(label, f"{CALCULATOR}:id/{rid}", (x, y, x + WIDTH // 4, y + size),
                                  lambda k=label: calc_press(dev, k), desc=desc, style="key"))
    return out


def notes_list(dev: SimDevice) -> list[Widget]:
    out = dev.title("Notes", f"{NOTES}:id/toolbar_title")
    notes = sorted(dev.state["notes"], key=lambda r: r["_id"])
    if not notes:
        out.append(Widget("android.widget.TextView", (48, CONTENT_TOP, 672, CONTENT_TOP + 80), text="No notes",
                          rid=f"{NOTES}:id/empty"))

    def row(note: dict[str, Any], y: int) -> list[Widget]:
        edit = {"id": note["_id"], "title": str(note["title"]), "body": str(note["body"])}
        return [Widget("android.widget.TextView", (48, y, 672, y + 70), text=str(note["title"]) or "(untitled)",
                       rid=f"{NOTES}:id/note_title", clickable=True, style="text",
                       tap=lambda: dev._go(NOTES, "edit", edit)),
                Widget("android.widget.TextView", (48, y + 66, 672, y + 108), text=str(note["body"]).split("\n")[0][:60],
                       rid=f"{NOTES}:id/note_preview", style="small")]

    out += dev.list_rows(notes, CONTENT_TOP, row, f"{NOTES}:id/notes_list")
    out.append(_fab(dev, "New note", f"{NOTES}:id/new_note", lambda: dev._go(NOTES, "edit", {"title": "", "body": ""})))
    return out


def notes_edit(dev: SimDevice) -> list[Widget]:
    form = dev.ui["form"]
    out = dev.title("Edit note" if form.get("id") else "New note", f"{NOTES}:id/toolbar_title")

    def save() -> None:
        title, body = str(form.get("title", "")).strip(), str(form.get("body", ""))
        if not title and not body.strip():
            dev.ui["message"] = "The note is empty"
            return
        existing = _find(dev, "notes", form.get("id"))
        if existing is not None:
            existing.update(title=title, body=body)
        else:
            dev.state["notes"].append({"_id": dev._next_id("notes"), "title": title, "body": body})
        dev.back()

    def delete() -> None:
        dev.state["notes"] = [r for r in dev.state["notes"] if r["_id"] != form.get("id")]
        dev.back()

    out += [dev.field_widget("title", "Title", f"{NOTES}:id/title", CONTENT_TOP + 20),
            dev.field_widget("body", "Note", f"{NOTES}:id/body", CONTENT_TOP + 140, height=300),
            dev.button("Save", f"{NOTES}:id/save", (400, CONTENT_TOP + 480, 672, CONTENT_TOP + 580), save),
            dev.button("Cancel", f"{NOTES}:id/cancel", (48, CONTENT_TOP + 480, 320, CONTENT_TOP + 580), dev.back)]
    if form.get("id"):
        out.append(dev.button("Delete", f"{NOTES}:id/delete", (48, CONTENT_TOP + 610, 320, CONTENT_TOP + 710), delete))
    return out + _message(dev)


SCREENS: dict[tuple[str, str], Callable[[SimDevice], list[Widget]]] = {
    (LAUNCHER, "home"): launcher_home,
    (SETTINGS, "main"): settings_main,
    (SETTINGS, "about"): settings_about,
    (CONTACTS, "list"): contacts_list,
    (CONTACTS, "detail"): contacts_detail,
    (CONTACTS, "edit"): contacts_edit,
    (CLOCK, "alarms"): clock_alarms,
    (CLOCK, "edit"): clock_edit,
    (CALCULATOR, "main"): calculator_main,
    (NOTES, "list"): notes_list,
    (NOTES, "edit"): notes_edit,
}
