"""Build the toolace examples: pipeline seeds and the offline model's scripts for every stage.

    python3 examples/toolace/build.py      # after editing a suite (suites/*.py), a task or a solution here

Writes
- examples/toolace/seeds.jsonl: seeds for `manage.py synthesize_pipeline toolace`;
- examples/pipelines/toolace/scripts.json: the offline model's answers to every llm stage (matched by
  their key lines `[pipeline:toolace/<template> key=<item>]`: refine, expand, couple — the calendar
  suite's first answer has a bug its smoke call finds, the repair answer fixes it; the weather seed
  stays broken and is dropped — and tasks per usage flow, the calendar and expense suites combined
  for a cross-group task among them), then the agent's solutions of the tasks
  that pass the gates (found by prompt): agent-mode ones, two mt dialogues (one re-filled), and one
  wrong solution per suite that scores 0. Two tasks per suite fail a gate on purpose (a hidden value
  in the prompt, a check that fails on the expected calls, an expected call that raises).

The suites' code is suites/*.py (the classes the couple stage "writes").
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent


def obj(required: list[str] | None = None, **props: dict) -> dict:
    return {"type": "object", "properties": props, "required": required or []}


STR = {"type": "string"}
DATE = {"type": "string", "description": "YYYY-MM-DD", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
TIME = {"type": "string", "description": "HH:MM (24h)", "pattern": r"^\d{2}:\d{2}$"}


def op(name: str, description: str, parameters: dict, returns: dict, errors: list[tuple[str, str]], example: dict,
       depends_on: list[str] | None = None) -> dict:
    return {"name": name, "description": description, "parameters": parameters, "returns": returns,
            "errors": [{"type": t, "when": w} for t, w in errors], "example": example, "depends_on": depends_on or []}


# -- suite 1: calendar + e-mail -------------------------------------------------------------------

CAL_OPS = [
    op("list_events", "The events on a date, by start time.", obj(["date"], date=DATE),
       {"type": "array", "items": {"type": "object"}}, [("ValueError", "the date is not YYYY-MM-DD")],
       {"date": "2026-12-03"}),
    op("create_event", "Create a calendar event; refused when it overlaps another event that day.",
       obj(["title", "date", "start", "end"], title=STR, date=DATE, start=TIME, end=TIME,
           attendees={"type": "array", "items": {"type": "string"}, "default": [],
                      "description": "attendees' mailboxes"}),
       {"type": "object", "properties": {"event_id": STR}},
       [("ValueError", "bad date or time, end before start, a conflict, an attendee that is not a mailbox")],
       {"title": "Planning", "date": "2026-12-05", "start": "10:00", "end": "10:30"}, ["find_contact"]),
    op("cancel_event", "Cancel an event by its id.", obj(["event_id"], event_id=STR),
       {"type": "object"}, [("KeyError", "no such event")], {"event_id": "EV-103"}, ["list_events"]),
    op("find_contact", "Look a colleague up by full name; gives their internal mailbox.", obj(["name"], name=STR),
       {"type": "object", "properties": {"name": STR, "mailbox": STR}}, [("KeyError", "no contact of that name")],
       {"name": "Dana Whitfield"}),
    op("send_email", "Send an internal e-mail to a mailbox.", obj(["to", "subject"], to=STR, subject=STR, body={**STR, "default": ""}),
       {"type": "object", "properties": {"message_id": STR, "status": STR}},
       [("ValueError", "the address is not a mailbox of the directory or the subject is empty")],
       {"to": "dana.whitfield", "subject": "Hello"}, ["find_contact"]),
]
CAL_INIT = {
    "events": {
        "EV-101": {"title": "Team standup", "date": "2026-12-03", "start": "09:00", "end": "09:15", "attendees": []},
        "EV-102": {"title": "1:1 with Omar", "date": "2026-12-03", "start": "15:00", "end": "15:30",
                   "attendees": ["omar.haddad"]},
        "EV-103": {"title": "Vendor call", "date": "2026-12-04", "start": "11:00", "end": "11:30", "attendees": []},
    },
    "contacts": {"Dana Whitfield": "dana.whitfield", "Omar Haddad": "omar.haddad", "Priya Natarajan": "priya.natarajan"},
}
CAL_CODE = (HERE / "suites" / "calendar_mail.py").read_text()
# The couple stage's first answer: find_contact reads an attribute that does not exist. The smoke
# call raises an undeclared AttributeError; the repair turn gets the traceback and fixes it.
CAL_CODE_BUGGY = CAL_CODE.replace("sorted(self.contacts.items())", "sorted(self.contact_book.items())")
assert CAL_CODE_BUGGY != CAL_CODE


def suite(env: str, description: str, ops: list[dict], code: str, init: dict, chains: list[dict],
          flows: list[dict]) -> dict:
    return {"env_name": env, "class_name": env, "description": description, "operations": ops,
            "tool_chains": chains, "code": code, "init_config": init, "flows": flows}


def flow(fid: str, name: str, *tools: str) -> dict:
    return {"id": fid, "name": name, "description": name,
            "steps": [{"tool_name": t, "purpose": f"step {i + 1}"} for i, t in enumerate(tools)]}


CAL_SUITE = suite("CalendarMail", "A work calendar with an address book and an outbox.", CAL_OPS, CAL_CODE, CAL_INIT,
                  [{"name": "invite by name", "description": "find a contact, then invite them",
                    "sequence": ["find_contact", "create_event"]},
                   {"name": "mail by name", "description": "find a contact, then e-mail them",
                    "sequence": ["find_contact", "send_email"]}],
                  [flow("schedule", "schedule events", "create_event", "list_events"),
                   flow("mail", "e-mail a contact", "find_contact", "send_email"),
                   flow("cleanup", "cancel events", "list_events", "cancel_event")])

# -- suite 2: expense reports ---------------------------------------------------------------------

CATEGORY = {"type": "string", "enum": ["meals", "travel", "lodging", "supplies"]}
EXP_OPS = [
    op("create_report", "Open a draft expense report for an employee.", obj(["employee_id", "title"], employee_id=STR,
                                                                              title=STR),
       {"type": "object", "properties": {"report_id": STR}}, [("KeyError", "no such employee"),
                                                              ("ValueError", "empty title")],
       {"employee_id": "E-12", "title": "Test"}),
    op("add_expense", "Add an expense to a draft report; refused over the category's policy limit.",
       obj(["report_id", "category", "amount", "date"], report_id=STR, category=CATEGORY,
           amount={"type": "number", "exclusiveMinimum": 0}, date=DATE, note={**STR, "default": ""}),
       {"type": "object", "properties": {"total": {"type": "number"}}},
       [("KeyError", "no such report"), ("ValueError", "not a draft, unknown category, amount over the limit")],
       {"report_id": "R-7", "category": "supplies", "amount": 10, "date": "2026-11-07"}, ["create_report"]),
    op("get_report", "A report with its items and total.", obj(["report_id"], report_id=STR), {"type": "object"},
       [("KeyError", "no such report")], {"report_id": "R-7"}),
    op("list_reports", "An employee's reports in a status.", obj(["employee_id"], employee_id=STR,
                                                                 status={"type": "string", "default": "draft",
                                                                         "enum": ["draft", "submitted", "approved"]}),
       {"type": "array"}, [("KeyError", "no such employee")], {"employee_id": "E-12"}),
    op("submit_report", "Submit a draft report that has expenses.", obj(["report_id"], report_id=STR),
       {"type": "object"}, [("KeyError", "no such report"), ("ValueError", "empty or already submitted")],
       {"report_id": "R-9"}, ["add_expense"]),
]
EXP_INIT = {
    "employees": {"E-12": {"name": "Lena Ortiz", "manager": "E-3"}, "E-3": {"name": "Sam Okafor", "manager": None}},
    "reports": {
        "R-7": {"employee_id": "E-12", "title": "November supplies", "status": "draft", "items": [
            {"category": "supplies", "amount": 41.5, "date": "2026-11-05", "note": "toner"},
            {"category": "meals", "amount": 45, "date": "2026-11-06", "note": "team lunch"}]},
        "R-9": {"employee_id": "E-12", "title": "Client visit", "status": "draft", "items": [
            {"category": "travel", "amount": 120, "date": "2026-11-10", "note": "train"}]},
    },
}
EXP_SUITE = suite("ExpenseReports", "Employees' expense reports under per-category policy limits.", EXP_OPS,
                  (HERE / "suites" / "expense_reports.py").read_text(), EXP_INIT,
                  [{"name": "file and submit", "description": "open, fill, submit",
                    "sequence": ["create_report", "add_expense", "submit_report"]}],
                  [flow("file", "file a report", "create_report", "add_expense", "submit_report"),
                   flow("review", "review reports", "get_report", "list_reports"),
                   flow("items", "add expenses", "add_expense")])

# -- a third seed whose suite never passes the smoke gate -----------------------------------------

WEATHER_CODE = (
    "class Weather:\n"
    "    def __init__(self, cities=None):\n"
    "        self.cities = dict(cities or {})\n"
    "    def get_forecast(self, city, days=1):\n"
    "        return {'city': city, 'average': sum(self.cities.get(city, [])) / len(self.cities.get(city, []))}\n"
    "    def list_cities(self):\n"
    "        return sorted(self.cities)\n"
)
WEATHER_SUITE = suite("Weather", "Forecasts per city.", [
    op("get_forecast", "A city's forecast.", obj(["city"], city=STR, days={"type": "integer", "default": 1}),
       {"type": "object"}, [("KeyError", "unknown city")], {"city": "Lisbon"})],
    WEATHER_CODE, {"cities": {}}, [], [flow("forecast", "forecast", "get_forecast")])
WEATHER_SUITE["operations"].append(op("list_cities", "The known cities.", obj(), {"type": "array"},
                                      [("ValueError", "never")], {}))


def ops_only(ops: list[dict], *names: str) -> dict:
    keep = [{k: o[k] for k in ("name", "description", "parameters", "returns", "errors")} for o in ops
            if not names or o["name"] in names]
    return {"operations": keep}


SEEDS = [
    {"id": "calendar-email", "domain": "a work calendar with e-mail",
     "tools": [{"name": "create_event", "description": "Create a calendar event"},
               {"name": "send_email", "description": "Send an e-mail"}],
     "cross_with": ["expense-reports"]},
    {"id": "expense-reports", "domain": "employee expense reports",
     "tools": [{"name": "add_expense", "description": "Add an expense to a report"}]},
    {"id": "weather", "domain": "weather forecasts", "tools": [{"name": "get_forecast", "description": "Forecast"}]},
]

# -- tasks per usage flow, and the agent's solutions --------------------------------------------


def call(tool: str, thought: str = "", /, **arguments: object) -> dict:
    step: dict = {"tool_calls": [{"name": tool, "arguments": arguments}]}
    if thought:
        step["thought"] = thought
    return step


def parallel(*calls: tuple[str, dict]) -> dict:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


def finish(answer: str) -> dict:
    return call("finish", answer=answer)


def task(tid: str, kind: str, prompt: str, expected: list[tuple[str, dict]], check: str, solution: list[dict] | None,
         **extra: object) -> dict:
    item = {"id": tid, "type": kind, "prompt": prompt, "mode": extra.pop("mode", "agent"),
            "expected_calls": [{"tool": t, "arguments": a} for t, a in expected],
            "user_facts": extra.pop("user_facts", {}), "missing_params": extra.pop("missing_params", []),
            "check_func": "def check(env):\n" + "".join(f"    {line}\n" for line in check.strip().splitlines()), **extra}
    return {"task": item, "solution": solution}


def turn(*calls: tuple[str, dict, str], content: str = "") -> dict:
    t: dict = {"role": "assistant", "tool_calls": [{"name": n, "arguments": a, "output": o} for n, a, o in calls]}
    if content:
        t["content"] = content
    return t


OMAR = "omar.haddad"
PRIYA = "priya.natarajan"
DANA = "dana.whitfield"
BUDGET = {"title": "Budget review", "date": "2026-12-03", "start": "10:00", "end": "11:00"}
DESIGN = {"title": "Design sync", "date": "2026-12-04", "start": "14:00", "end": "14:30", "attendees": [PRIYA]}
OFFSITE = {"to": DANA, "subject": "Offsite agenda", "body": "The agenda is attached."}
OMAR_MAIL = {"to": OMAR, "subject": "Budget review", "body": "Budget review is on 2026-12-03 at 10:00."}

CAL_TASKS = {
    "schedule": [
        task("budget", "single", "Put 'Budget review' on my calendar for 2026-12-03 from 10:00 to 11:00.",
             [("create_event", BUDGET), ("list_events", {"date": "2026-12-03"})],
             'return any(e["title"] == "Budget review" and e["date"] == "2026-12-03" and e["start"] == "10:00"\n'
             '           and e["end"] == "11:00" for e in env.events.values())',
             [call("create_event", "Create the event as asked.", **BUDGET), finish("Budget review is booked."),
              call("list_events", "The user asks what else is on that day.", date="2026-12-03"),
              finish("On 2026-12-03: Team standup 09:00-09:15, Budget review 10:00-11:00, 1:1 with Omar 15:00-15:30.")],
             follow_ups=["Thanks. What else is on my calendar that day?"], expected_answer="Team standup"),
        task("design-sync", "missing_param", "Schedule a 'Design sync' on 2026-12-04 from 14:00 to 14:30 and invite "
             "my manager.", [("find_contact", {"name": "Priya Natarajan"}), ("create_event", DESIGN)],
             'return any(e["title"] == "Design sync" and e["date"] == "2026-12-04"\n'
             f'           and "{PRIYA}" in e["attendees"] for e in env.events.values())',
             [call("ask_user", "I do not know who the manager is.", question="Who is your manager? What is their name?"),
              call("find_contact", name="Priya Natarajan"),
              call("create_event", **DESIGN), finish("Design sync booked with Priya Natarajan invited.")],
             user_facts={"manager_name": {"value": "Priya Natarajan", "aliases": ["manager"]}},
             missing_params=["manager_name"]),
        # task.leak: the hidden value is in the prompt
        task("debrief", "missing_param", "Schedule 'Hiring debrief' on 2026-12-04 from 16:00 to 16:30 with my "
             "manager Priya Natarajan.", [("find_contact", {"name": "Priya Natarajan"}),
                                          ("create_event", {"title": "Hiring debrief", "date": "2026-12-04",
                                                            "start": "16:00", "end": "16:30", "attendees": [PRIYA]})],
             'return any(e["title"] == "Hiring debrief" for e in env.events.values())', None,
             user_facts={"manager_name": "Priya Natarajan"}, missing_params=["manager_name"]),
    ],
    "mail": [
        task("offsite", "dependent", "Email Dana Whitfield with the subject 'Offsite agenda' and the body "
             "'The agenda is attached.'", [("find_contact", {"name": "Dana Whitfield"}), ("send_email", OFFSITE)],
             f'return any(m["to"] == "{DANA}" and m["subject"] == "Offsite agenda" for m in env.outbox)',
             [call("find_contact", "Find Dana's address first.", name="Dana Whitfield"), call("send_email", **OFFSITE),
              finish("Sent Dana the offsite agenda.")]),
        task("omar-mt", "dependent", "Email Omar Haddad with the subject 'Budget review' and the body 'Budget review "
             "is on 2026-12-03 at 10:00.'", [("find_contact", {"name": "Omar Haddad"}), ("send_email", OMAR_MAIL)],
             f'return any(m["to"] == "{OMAR}" and m["subject"] == "Budget review" for m in env.outbox)',
             # The skeleton guesses Omar's address; the real find_contact says otherwise, so the
             # turns from the e-mail on are re-filled with the real address.
             [call("write_dialogue", turns=[
                 turn(("find_contact", {"name": "Omar Haddad"}, '{"name": "Omar Haddad", "mailbox": "ohaddad"}'),
                      content="Look Omar up first."),
                 turn(("send_email", {**OMAR_MAIL, "to": "ohaddad"},
                       '{"message_id": "MSG-1", "to": "ohaddad", "status": "sent"}')),
                 turn(("finish", {"answer": "Sent Omar the budget review date."}, ""))]),
              call("write_dialogue", from_turn=1, turns=[
                  turn(("send_email", OMAR_MAIL, f'{{"message_id": "MSG-1", "to": "{OMAR}", "status": "sent"}}')),
                  turn(("finish", {"answer": "Sent Omar the budget review date."}, ""))]),
              finish("Sent Omar the budget review date.")], mode="mt"),
        # the suite's wrong solution: the address is guessed, never looked up
        task("parking", "dependent", "Send Dana Whitfield an email with the subject 'Parking' and the body "
             "'The garage is closed on Friday.'",
             [("find_contact", {"name": "Dana Whitfield"}),
              ("send_email", {"to": DANA, "subject": "Parking", "body": "The garage is closed on Friday."})],
             f'return any(m["to"] == "{DANA}" and m["subject"] == "Parking" for m in env.outbox)',
             [call("send_email", "Her mailbox is probably dwhitfield.", to="dwhitfield",
                   subject="Parking", body="The garage is closed on Friday."), finish("Sent.")]),
    ],
    "cleanup": [
        task("cancel-two", "parallel", "Cancel my events EV-101 and EV-102.",
             [("cancel_event", {"event_id": "EV-101"}), ("cancel_event", {"event_id": "EV-102"})],
             'return "EV-101" not in env.events and "EV-102" not in env.events and "EV-103" in env.events',
             [parallel(("cancel_event", {"event_id": "EV-101"}), ("cancel_event", {"event_id": "EV-102"})),
              finish("Cancelled EV-101 and EV-102.")]),
        # task.check: the check does not hold after the expected calls
        task("vendor", "single", "Cancel the vendor call, event EV-103.", [("cancel_event", {"event_id": "EV-103"})],
             'return "EV-101" not in env.events', None),
    ],
}

EXP_TASKS = {
    "file": [
        task("berlin", "dependent", "Create an expense report 'Berlin trip' for employee E-12, add a travel expense "
             "of 240 dated 2026-11-20, then submit it.",
             [("create_report", {"employee_id": "E-12", "title": "Berlin trip"}),
              ("add_expense", {"report_id": "R-20", "category": "travel", "amount": 240, "date": "2026-11-20"}),
              ("submit_report", {"report_id": "R-20"})],
             'return any(r["title"] == "Berlin trip" and r["status"] == "submitted"\n'
             '           and [i["amount"] for i in r["items"]] == [240] for r in env.reports.values())',
             [call("create_report", employee_id="E-12", title="Berlin trip"),
              call("add_expense", "Use the new report's id.", report_id="R-20", category="travel", amount=240,
                   date="2026-11-20"),
              call("submit_report", report_id="R-20"), finish("Berlin trip (R-20) submitted with 240 of travel.")]),
        task("lodging-mt", "missing_param", "Add a lodging expense of 180 to report R-9 and submit it.",
             [("add_expense", {"report_id": "R-9", "category": "lodging", "amount": 180, "date": "2026-11-19"}),
              ("submit_report", {"report_id": "R-9"})],
             'r = env.reports["R-9"]\n'
             'return r["status"] == "submitted" and any(i["category"] == "lodging" and i["amount"] == 180\n'
             '                                          and i["date"] == "2026-11-19" for i in r["items"])',
             [call("write_dialogue", turns=[
                 turn(("ask_user", {"question": "What date was the lodging expense?"}, "2026-11-19"),
                      content="The date is missing."),
                 turn(("add_expense", {"report_id": "R-9", "category": "lodging", "amount": 180, "date": "2026-11-19"},
                       '{"report_id": "R-9", "items": 2, "total": 300}')),
                 turn(("submit_report", {"report_id": "R-9"}, '{"report_id": "R-9", "status": "submitted", "total": 300}')),
                 turn(("finish", {"answer": "R-9 is submitted with the lodging expense; total 300."}, ""))]),
              finish("R-9 is submitted with the lodging expense; total 300.")],
             mode="mt", user_facts={"date": "2026-11-19"}, missing_params=["date"]),
    ],
    "review": [
        task("r7-total", "single", "What is the total of expense report R-7?", [("get_report", {"report_id": "R-7"})],
             'r = env.reports["R-7"]\nreturn r["status"] == "draft" and len(r["items"]) == 2',
             [call("get_report", report_id="R-7"), finish("Report R-7 totals 86.5.")], expected_answer="86.5"),
        task("categories", "non_tool", "Which expense categories can I claim?", [],
             'return ([(rid, r["status"], len(r["items"])) for rid, r in sorted(env.reports.items())]\n'
             '        == [("R-7", "draft", 2), ("R-9", "draft", 1)])',
             [finish("You can claim meals, travel, lodging and supplies.")], expected_answer="lodging"),
    ],
    "items": [
        task("supplies", "parallel", "Add two supplies expenses to report R-7: 12.5 on 2026-11-02 and 8.75 on "
             "2026-11-03.",
             [("add_expense", {"report_id": "R-7", "category": "supplies", "amount": 12.5, "date": "2026-11-02"}),
              ("add_expense", {"report_id": "R-7", "category": "supplies", "amount": 8.75, "date": "2026-11-03"})],
             'amounts = sorted(i["amount"] for i in env.reports["R-7"]["items"] if i["category"] == "supplies")\n'
             'return amounts == [8.75, 12.5, 41.5]',
             [parallel(("add_expense", {"report_id": "R-7", "category": "supplies", "amount": 12.5,
                                        "date": "2026-11-02"}),
                       ("add_expense", {"report_id": "R-7", "category": "supplies", "amount": 8.75,
                                        "date": "2026-11-03"})),
              finish("Added 12.5 and 8.75 of supplies to R-7.")]),
        task("lunch", "missing_param", "Add my lunch on 2026-11-21 to report R-7 as a meals expense.",
             [("add_expense", {"report_id": "R-7", "category": "meals", "amount": 23.4, "date": "2026-11-21"})],
             'return any(i["category"] == "meals" and i["amount"] == 23.4 and i["date"] == "2026-11-21"\n'
             '           for i in env.reports["R-7"]["items"])',
             [call("ask_user", "The amount is missing.", question="What amount should I enter for the lunch?"),
              call("add_expense", report_id="R-7", category="meals", amount=23.4, date="2026-11-21"),
              finish("Added the 23.4 lunch to R-7.")],
             user_facts={"amount": 23.4}, missing_params=["amount"]),
        # the suite's wrong solution: a refused call, then a claim of success
        task("travel-450", "single", "Add a travel expense of 450 dated 2026-11-22 to report R-9.",
             [("add_expense", {"report_id": "R-9", "category": "travel", "amount": 450, "date": "2026-11-22"})],
             'return any(i["category"] == "travel" and i["amount"] == 450 for i in env.reports["R-9"]["items"])',
             [call("add_expense", report_id="R-9", category="travel", amount=540, date="2026-11-22"),
              finish("Added the travel expense.")]),
        # task.replay: the expected call is over the meals limit and raises
        task("dinner", "single", "Add a meals expense of 75 dated 2026-11-23 to report R-7.",
             [("add_expense", {"report_id": "R-7", "category": "meals", "amount": 75, "date": "2026-11-23"})],
             'return any(i["amount"] == 75 for i in env.reports["R-7"]["items"])', None),
    ],
}
# cross-group: tasks on the calendar and expense suites combined in one environment (the pipeline's
# cross stage; the flow "x-expense-reports" of the calendar seed)
CROSS_TASKS = {
    "x-expense-reports": [
        task("review-and-submit", "parallel", "Put 'Expense review' on my calendar for 2026-12-05 from 09:00 to "
             "09:30 and submit expense report R-9.",
             [("create_event", {"title": "Expense review", "date": "2026-12-05", "start": "09:00", "end": "09:30"}),
              ("submit_report", {"report_id": "R-9"})],
             'return (env.reports["R-9"]["status"] == "submitted"\n'
             '        and any(e["title"] == "Expense review" for e in env.events.values()))',
             [parallel(("create_event", {"title": "Expense review", "date": "2026-12-05", "start": "09:00",
                                         "end": "09:30"}), ("submit_report", {"report_id": "R-9"})),
              finish("Booked the expense review and submitted R-9 (total 120).")]),
    ],
}
WRONG = {"calendar-email.mail.parking", "expense-reports.items.travel-450"}
GATE_FAILS = {"calendar-email.schedule.debrief": "task.leak", "calendar-email.cleanup.vendor": "task.check",
              "expense-reports.items.dinner": "task.replay"}


def content(key: str, value: object) -> dict:
    return {"id": key.replace("[pipeline:", "").replace("]", "").replace(" key=", ":"), "prompt": key,
            "reference_solution": [{"content": json.dumps(value, ensure_ascii=False)}]}


def scripts() -> list[dict]:
    out = []
    for seed, full, buggy in (("calendar-email", CAL_SUITE, CAL_CODE_BUGGY), ("expense-reports", EXP_SUITE, None),
                              ("weather", WEATHER_SUITE, None)):
        refined = ops_only(full["operations"], *[t["name"] for t in next(s for s in SEEDS if s["id"] == seed)["tools"]])
        out.append(content(f"[pipeline:toolace/refine key={seed}]", refined))
        out.append(content(f"[pipeline:toolace/expand key={seed}]", ops_only(full["operations"])))
        first = {**full, "code": buggy} if buggy else full
        out.append(content(f"[pipeline:toolace/couple key={seed}]", first))
        out.append(content(f"[pipeline:toolace/couple key={seed} repair=1]", full))
    for seed, flows in (("calendar-email", {**CAL_TASKS, **CROSS_TASKS}), ("expense-reports", EXP_TASKS)):
        for fid, tasks in flows.items():
            out.append(content(f"[pipeline:toolace/tasks key={seed}.{fid}]", {"items": [t["task"] for t in tasks]}))
            for t in tasks:
                if t["solution"] is not None:
                    out.append({"id": f"toolace-{seed}.{fid}.{t['task']['id']}", "prompt": t["task"]["prompt"],
                                "reference_solution": t["solution"]})
    return out


def main() -> None:
    (HERE / "seeds.jsonl").write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in SEEDS))
    target = EXAMPLES / "pipelines" / "toolace"
    target.mkdir(parents=True, exist_ok=True)
    (target / "scripts.json").write_text(json.dumps(scripts(), ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {HERE / 'seeds.jsonl'} and {target / 'scripts.json'}")


if __name__ == "__main__":
    main()
