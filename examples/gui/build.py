"""Build the gui examples: MiniWoB++ tasks with fixed seeds and bundled-site tasks, each with the
offline model's script, recorded by running a reference solver in the pinned browser.

    .venv/bin/python examples/gui/build.py        # after a pin changes (playwright, chromium, miniwob)

Writes examples/tasks/gui.jsonl. For every task it opens the page exactly as the platform does
(apps/engines/scenes/gui/server.py's Browser: same seed, same start, same viewport), lets a solver
pick its actions from the accessibility snapshot (refs) or, for vision tasks, from the element
boxes (a point of the screenshot), replays them through the same tool code, and keeps the
task only when the page's own reward (MiniWoB's raw reward, the site's state check) says it is
solved; the wrong solution must score 0. Refs are deterministic for a fixed seed and pinned
browser, so the scripts replay in the sandbox; run this again when a pin changes.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "apps" / "engines" / "scenes" / "gui"))
sys.path.insert(0, str(REPO))

import server  # noqa: E402  (apps/engines/scenes/gui/server.py, run here as in the sandbox)
import sites  # noqa: E402

from apps.engines.scenes.gui import checks  # noqa: E402

OUT = REPO / "examples" / "tasks" / "gui.jsonl"


class Recorder:
    """One page opened as the platform opens it; `act` runs a tool and records the call."""

    def __init__(self, browser: server.Browser):
        self.browser = browser
        self.calls: list[dict[str, Any]] = []
        self.snapshot = ""

    @property
    def page(self) -> Any:
        return self.browser.page

    async def act(self, name: str, thought: str = "", **args: Any) -> str:
        text = await self.browser.act(name, args)
        self.snapshot = text
        step: dict[str, Any] = {"tool_calls": [{"name": name, "arguments": args}]}
        if thought:
            step["thought"] = thought
        self.calls.append(step)
        return text

    def ref(self, needle: str, nth: int = 0, *, role: str = "") -> str:
        """The ref of the nth snapshot line holding `needle` (and `role`): what a model reads off the snapshot."""
        found = [line.split("[ref=")[1].split("]")[0] for line in self.snapshot.splitlines()
                 if needle in line and "[ref=" in line and line.strip().startswith(f"- {role}")]
        if len(found) <= nth:
            raise LookupError(f"{needle!r} is not in the snapshot:\n{self.snapshot}")
        return found[nth]

    async def center(self, selector: str) -> tuple[float, float]:
        """The middle of an element, as a model that sees the screenshot would point at it."""
        box = await self.page.locator(selector).first.bounding_box()
        return round(box["x"] + box["width"] / 2), round(box["y"] + box["height"] / 2)


Solver = Callable[[Recorder, str], Awaitable[str]]  # -> the finish answer


def quoted(utterance: str, n: int = 0) -> str:
    return utterance.split('"')[1 + 2 * n]


async def click_button(r: Recorder, u: str) -> str:
    await r.act("browser_click", f"The {quoted(u)} button is the one to click.", element=f"{quoted(u)} button",
                ref=r.ref(f'button "{quoted(u)}"'))
    return "clicked"


async def click_button_wrong(r: Recorder, u: str) -> str:
    # The wrong solution: a button with another label than the one asked for.
    other = next(line.split('"')[1] for line in r.snapshot.splitlines()
                 if line.strip().startswith('- button "') and f'"{quoted(u)}"' not in line)
    await r.act("browser_click", f"Clicking {other}.", element=f"{other} button", ref=r.ref(f'button "{other}"'))
    return "clicked"


async def enter_text(r: Recorder, u: str) -> str:
    await r.act("browser_type", element="text field", ref=r.ref("textbox"), text=quoted(u))
    await r.act("browser_click", element="Submit", ref=r.ref('button "Submit"'))
    return "submitted"


async def login_user(r: Recorder, u: str) -> str:
    await r.act("browser_fill_form", "Fill in both fields, then log in.", fields=[
        {"name": "Username", "type": "textbox", "ref": r.ref("textbox", 0), "value": quoted(u, 0)},
        {"name": "Password", "type": "textbox", "ref": r.ref("textbox", 1), "value": quoted(u, 1)}])
    await r.act("browser_click", element="Login", ref=r.ref('button "Login"'))
    return "logged in"


async def enter_password(r: Recorder, u: str) -> str:
    await r.act("browser_type", element="Password", ref=r.ref("textbox", 0), text=quoted(u))
    await r.act("browser_type", element="Verify password", ref=r.ref("textbox", 1), text=quoted(u))
    await r.act("browser_click", element="Submit", ref=r.ref('button "Submit"'))
    return "submitted"


async def click_checkboxes(r: Recorder, u: str) -> str:
    wanted = u.removeprefix("Select ").removesuffix(" and click Submit.")
    names = [] if wanted == "nothing" else [w.strip() for w in wanted.replace(" and ", ", ").split(",") if w.strip()]
    for name in names:
        await r.act("browser_click", element=f"checkbox {name}", ref=r.ref(f'checkbox "{name}"'))
    await r.act("browser_click", element="Submit", ref=r.ref('button "Submit"'))
    return "submitted"


async def choose_list(r: Recorder, u: str) -> str:
    option = u.removeprefix("Select ").removesuffix(" from the list and click Submit.")
    await r.act("browser_select_option", element="the list", ref=r.ref("combobox"), values=[option])
    await r.act("browser_click", element="Submit", ref=r.ref('button "Submit"'))
    return "submitted"


async def click_dialog(r: Recorder, u: str) -> str:
    await r.act("browser_click", element="the dialog's close button", ref=r.ref('button "Close"'))
    return "closed"


async def click_test_2(r: Recorder, u: str) -> str:
    label = u.removeprefix("Click button ").rstrip(".")
    await r.act("browser_click", element=f"button {label}", ref=r.ref(f'button "{label}"'))
    return "clicked"


async def email_inbox_delete(r: Recorder, u: str) -> str:
    sender = u.removeprefix("Find the email by ").removesuffix(" and click the trash icon to delete it.")
    index = await r.page.evaluate("(name) => [...document.querySelectorAll('#main .email-sender')]"
                                  ".findIndex(e => e.textContent === name)", sender)
    x, y = await r.center(f"#main .email-thread >> nth={index} >> .trash")
    await r.act("browser_mouse_click_xy", f"The trash icon is at the right of {sender}'s email.",
                element=f"trash icon of {sender}'s email", x=x, y=y)
    return "deleted"


async def social_media(r: Recorder, u: str) -> str:
    user = u.split("For the user ")[1].split(",")[0]
    action = quoted(u)
    index = await r.page.evaluate("(user) => [...document.querySelectorAll('.media .username')]"
                                  ".findIndex(e => e.textContent === user)", user)
    if action in ("Reply", "Retweet", "Like"):
        x, y = await r.center(f".media >> nth={index} >> .{action.lower()}")
        await r.act("browser_mouse_click_xy", element=f"{action} icon of {user}", x=x, y=y)
        return "done"
    x, y = await r.center(f".media >> nth={index} >> .more")
    await r.act("browser_mouse_click_xy", f"{action} is in the menu behind {user}'s more icon.",
                element=f"more icon of {user}", x=x, y=y)
    await r.act("browser_click", element=action, ref=r.ref(action, role="listitem"))
    return "done"


async def book_flight(r: Recorder, u: str) -> str:
    origin = u.split("from: ")[1].split(" to: ")[0]
    destination = u.split(" to: ")[1].split(" on ")[0]
    date = u.split(" on ")[1].rstrip(".")
    # The airport names as the autocomplete offers them.
    names = await r.page.evaluate("([a, b]) => [DOMESTIC_FLIGHTS.find(f => f.includes(a)),"
                                  " DOMESTIC_FLIGHTS.find(f => f.includes(b))]", [origin, destination])
    await r.act("browser_type", element="From", ref=r.ref('textbox "From:"'), text=names[0])
    await r.act("browser_type", element="To", ref=r.ref('textbox "To:"'), text=names[1])
    # The date field is read-only: pick the day in its calendar, paging to the month.
    month, day, year = date.split("/")
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
              "November", "December"]
    await r.act("browser_click", element="Departure Date", ref=r.ref("textbox", 2))
    for _ in range(24):
        shown = re.search(r": (" + "|".join(months) + r") (\d{4})$", r.snapshot, re.M)
        if shown is None:
            raise LookupError(f"no month in the calendar:\n{r.snapshot}")
        delta = (int(year) - int(shown.group(2))) * 12 + int(month) - 1 - months.index(shown.group(1))
        if delta == 0:
            break
        way = "Next" if delta > 0 else "Prev"
        await r.act("browser_click", element=f"{way} month", ref=r.ref(f'generic "{way}"'))
    await r.act("browser_click", element=f"day {int(day)}", ref=r.ref(f'link "{int(day)}"'))
    await r.act("browser_click", element="Search", ref=r.ref('button "Search"'))
    shortest = await r.page.evaluate(
        "() => { const rows = [...document.querySelectorAll('.flight')];"
        " const mins = rows.map(f => f.querySelector('.flight-duration').textContent.trim());"
        " const m = mins.map(t => { const h = /(\\d+)h/.exec(t), n = /(\\d+)m/.exec(t);"
        " return (h ? +h[1] * 60 : 0) + (n ? +n[1] : 0); });"
        " return m.indexOf(Math.min(...m)); }")
    await r.act("browser_click", "The shortest flight of the list.", element="Book the shortest flight",
                ref=r.ref('button "Book flight for', shortest))
    return "booked"


MINIWOB: list[tuple[str, int, Solver, dict[str, Any]]] = [
    ("click-button", 1, click_button, {}),
    ("enter-text", 1, enter_text, {}),
    ("login-user", 1, login_user, {}),
    ("enter-password", 1, enter_password, {}),
    ("click-checkboxes", 1, click_checkboxes, {}),
    ("choose-list", 1, choose_list, {}),
    ("click-dialog", 1, click_dialog, {}),
    ("click-test-2", 1, click_test_2, {}),
    ("email-inbox-delete", 1, email_inbox_delete, {"vision": True}),
    ("social-media", 1, social_media, {"vision": True}),
    ("book-flight-nodelay", 1, book_flight, {}),
]
WRONG = ("click-button", 3, click_button_wrong, {})  # scores 0: the first button, not the asked one


async def shop_order(r: Recorder, u: str) -> str:
    await r.act("browser_click", element="Add Blue mug to cart", ref=r.ref('button "Add Blue mug to cart"'))
    await r.act("browser_navigate_back", "Back to the products for the lamp.")
    await r.act("browser_click", element="Add Desk lamp to cart", ref=r.ref('button "Add Desk lamp to cart"'))
    await r.act("browser_click", element="Checkout", ref=r.ref('link "Checkout"'))
    await r.act("browser_click", "Try to order at once.", element="Place order", ref=r.ref('button "Place order"'))
    await r.act("browser_fill_form", "The form wants a name, an address and a shipping method.", fields=[
        {"name": "Name", "type": "textbox", "ref": r.ref('textbox "Name"'), "value": "Ana Lima"},
        {"name": "Address", "type": "textbox", "ref": r.ref('textbox "Address"'), "value": "12 Rua Augusta, Lisbon"},
        {"name": "Shipping", "type": "combobox", "ref": r.ref('combobox "Shipping"'), "value": "express"}])
    await r.act("browser_click", element="Place order", ref=r.ref('button "Place order"'))
    return "Order A1001 placed: a blue mug and a desk lamp, express."


async def mail_tidy(r: Recorder, u: str) -> str:
    await r.act("browser_click", element="Weekly deals", ref=r.ref('link "Weekly deals"'))
    await r.act("browser_click", element="Delete", ref=r.ref('button "Delete"'))
    await r.act("browser_click", element="Project kickoff", ref=r.ref('link "Project kickoff"'))
    await r.act("browser_click", element="Compose", ref=r.ref('link "Compose"'))
    await r.act("browser_fill_form", fields=[
        {"name": "To", "type": "textbox", "ref": r.ref('textbox "To"'), "value": "ana@example.org"},
        {"name": "Subject", "type": "textbox", "ref": r.ref('textbox "Subject"'), "value": "Friday lunch"},
        {"name": "Body", "type": "textbox", "ref": r.ref('textbox "Body"'), "value": "Yes, noon works."}])
    await r.act("browser_click", element="Send", ref=r.ref('button "Send"'))
    return "Tuesday 10:00"


async def admin_user(r: Recorder, u: str) -> str:
    await r.act("browser_click", element="New user", ref=r.ref('link "New user"'))
    await r.act("browser_fill_form", fields=[
        {"name": "Username", "type": "textbox", "ref": r.ref('textbox "Username"'), "value": "Dana K"},
        {"name": "Email", "type": "textbox", "ref": r.ref('textbox "Email"'), "value": "dana@example.org"},
        {"name": "Role", "type": "combobox", "ref": r.ref('combobox "Role"'), "value": "editor"},
        {"name": "Age", "type": "textbox", "ref": r.ref('textbox "Age"'), "value": "29"}])
    await r.act("browser_click", element="Create user", ref=r.ref('button "Create user"'))
    await r.act("browser_type", "The username must be lowercase without spaces.", element="Username",
                ref=r.ref('textbox "Username"'), text="dana_k")
    await r.act("browser_select_option", element="Role", ref=r.ref('combobox "Role"'), values=["editor"])
    await r.act("browser_click", element="Create user", ref=r.ref('button "Create user"'))
    return "Created dana_k (editor)."


SITES: list[tuple[str, str, str, Solver, Any]] = [
    ("shop-order", "shop",
     "In the shop, buy one Blue mug and one Desk lamp, shipped express to Ana Lima, 12 Rua Augusta, Lisbon.",
     shop_order, {"type": "site_state", "assertions": [
         {"path": "orders", "op": "len", "value": 1}, {"path": "orders.0.shipping", "op": "eq", "value": "express"},
         {"path": "orders.0.items", "op": "eq", "value": [{"qty": 1, "sku": "mug"}, {"qty": 1, "sku": "lamp"}]},
         {"path": "orders.0.name", "op": "eq", "value": "Ana Lima"},
         {"path": "orders.0.address", "op": "eq", "value": "12 Rua Augusta, Lisbon"},
         {"path": "cart", "op": "len", "value": 0}]}),
    ("mail-tidy", "mail",
     "In the web mail: delete the 'Weekly deals' email, reply to nobody, but send ana@example.org a message with the "
     "subject 'Friday lunch' saying 'Yes, noon works.'. Then answer: to when was the project kickoff moved?",
     mail_tidy, [{"type": "site_state", "assertions": [
         {"path": "trash.0.id", "op": "eq", "value": "m3"}, {"path": "inbox", "op": "len", "value": 3},
         {"path": "sent", "op": "len", "value": 1},
         {"path": "sent.0", "op": "eq", "value": {"to": "ana@example.org", "subject": "Friday lunch",
                                                  "body": "Yes, noon works."}}]},
         {"type": "answer", "expected": ["Tuesday", "10:00 |OR| 10 am"], "match": "must_include"}]),
    ("admin-user", "admin",
     "In the admin console, create the user Dana K: email dana@example.org, role editor, age 29 (the form tells you "
     "what it accepts).",
     admin_user, {"type": "site_state", "assertions": [
         {"path": "users", "op": "len", "value": 2},
         {"path": "users.-1", "op": "eq", "value": {"username": "dana_k", "email": "dana@example.org", "role": "editor",
                                                    "age": 29}}]}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def record_miniwob(root: str, task: str, seed: int, solver: Solver) -> tuple[str, list[dict[str, Any]], float]:
    browser = server.Browser({**server.miniwob_config(root, task, seed, free_port()), "viewport": [500, 360]})
    try:
        start = await browser.start()
        recorder = Recorder(browser)
        recorder.snapshot = start["snapshot"]
        answer = await solver(recorder, start["utterance"])
        raw = await browser.page.evaluate("WOB_RAW_REWARD_GLOBAL")
        recorder.calls.append({"tool_calls": [{"name": "finish", "arguments": {"answer": answer}}]})
        return start["utterance"], recorder.calls, float(raw)
    finally:
        await browser.close()


async def record_site(site: str, solver: Solver, prompt: str, check: Any) -> tuple[list[dict[str, Any]], float]:
    with tempfile.TemporaryDirectory() as directory:
        port = free_port()
        state = f"{directory}/state.json"
        httpd = sites.serve_in_thread({"name": site, "port": port, "state_path": state})
        origin = f"http://127.0.0.1:{port}"
        browser = server.Browser({"source": "site", "start_url": origin + "/", "allowed_origins": [origin],
                                  "viewport": [500, 360]})
        try:
            start = await browser.start()
            recorder = Recorder(browser)
            recorder.snapshot = start["snapshot"]
            answer = await solver(recorder, prompt)
            recorder.calls.append({"tool_calls": [{"name": "finish", "arguments": {"answer": answer}}]})
            probe = checks.Probe(final_answer=answer, url=browser.page.url, evaluate=lambda e, u: None,
                                 site_state=lambda: json.loads(Path(state).read_text()))
            reward, _ = checks.run_check(check, probe)
            return recorder.calls, reward
        finally:
            await browser.close()
            httpd.shutdown()


def task_line(external_id: str, prompt: str, scene_config: dict[str, Any], solution: list[dict[str, Any]],
              **extra: Any) -> dict[str, Any]:
    return {"external_id": external_id, "scene": "gui", "prompt": prompt, "config": scene_config,
            "max_steps": max(6, len(solution) + 3), "step_timeout_s": 30, "timeout_s": 240, **extra,
            "reference_solution": solution}


async def build() -> list[dict[str, Any]]:
    import miniwob

    root = os.path.join(os.path.dirname(miniwob.__file__), "html")
    lines = []
    for task, seed, solver, extra in MINIWOB + [WRONG]:
        utterance, calls, raw = await record_miniwob(root, task, seed, solver)
        wrong = solver is click_button_wrong
        if (raw == 1.0) == wrong:  # MiniWoB's binary success
            raise SystemExit(f"{task} seed {seed}: raw reward {raw}: the {'wrong' if wrong else 'reference'} "
                             "solution does not do what it should")
        name = f"gui-miniwob-{task}-s{seed}" + ("-wrong" if wrong else "")
        lines.append(task_line(name, utterance, {"source": "miniwob", "task": task, "seed": seed, "utterance": utterance,
                                                 "check": {"type": "miniwob"}, **extra}, calls))
        print(f"{name}: {len(calls)} steps, raw reward {raw}")
    for name, site, prompt, solver, check in SITES:
        calls, reward = await record_site(site, solver, prompt, check)
        if reward != 1.0:
            raise SystemExit(f"{name}: the reference solution scores {reward}")
        lines.append(task_line(f"gui-site-{name}", prompt, {"source": "site", "site": site, "check": check}, calls))
        print(f"gui-site-{name}: {len(calls)} steps, reward {reward}")
    return lines


def main() -> None:
    lines = asyncio.run(build())
    OUT.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    print(f"wrote {len(lines)} tasks to {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
