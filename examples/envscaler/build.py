"""Build metadata.json, scenarios.json and ../reference_solutions/envscaler.json from envs/*.py.

    python3 examples/envscaler/build.py      # after editing an environment or a task here

metadata.json and scenarios.json are in the EnvScaler reference's input format; the reference
solutions are the offline model's scripts (found by each task's prompt).
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
S, I, N = {"type": "string"}, {"type": "integer", "minimum": 1}, {"type": "number"}


def op(name, description, required=(), **props):
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)}}


def obj(props, required):
    return {"type": "object", "properties": props, "required": list(required)}


ENVS = [
    {"env_name": "ClinicScheduler", "file": "clinic.py",
     "description": "A clinic's appointment book: doctors with bookable slots, patients, appointments.",
     "operations": [
         op("list_doctors", "List doctors, optionally only those of one specialty.",
            specialty={"type": "string", "description": "e.g. cardiology, dermatology"}),
         op("get_available_slots", "Free slots (YYYY-MM-DDTHH:MM) of a doctor, optionally on one date.",
            ["doctor_id"], doctor_id=S, date={"type": "string", "description": "YYYY-MM-DD"}),
         op("book_appointment", "Book a free slot for a patient with a doctor.",
            ["patient_id", "doctor_id", "slot"], patient_id=S, doctor_id=S, slot=S),
         op("cancel_appointment", "Cancel a booked appointment.", ["appointment_id"], appointment_id=S),
         op("reschedule_appointment", "Move a booked appointment to another free slot of the same doctor.",
            ["appointment_id", "new_slot"], appointment_id=S, new_slot=S),
         op("list_appointments", "A patient's appointments.", ["patient_id"], patient_id=S),
     ]},
    {"env_name": "WarehouseInventory", "file": "warehouse.py",
     "description": "A warehouse: stock per SKU with bin locations, customer orders and purchase orders.",
     "operations": [
         op("get_stock", "Quantity, location and reorder level of a SKU.", ["sku"], sku=S),
         op("list_low_stock", "SKUs whose quantity is below their reorder level."),
         op("receive_shipment", "Add received units of a SKU to stock.", ["sku", "quantity"], sku=S, quantity=I),
         op("fulfill_order", "Ship a pending order (needs enough stock for every line).", ["order_id"], order_id=S),
         op("move_item", "Move a SKU to another bin location.", ["sku", "location"], sku=S, location=S),
         op("create_purchase_order", "Order more units of a SKU from the supplier.", ["sku", "quantity"],
            sku=S, quantity=I),
     ]},
    {"env_name": "LibraryLoans", "file": "library.py",
     "description": "A lending library: books with copies, members with fines, loans (14 days, 2 renewals), holds.",
     "operations": [
         op("search_books", "Find books by title or author.", ["query"], query=S),
         op("checkout_book", "Lend a book to a member (no unpaid fines, a copy must be free).",
            ["member_id", "isbn"], member_id=S, isbn=S),
         op("return_book", "Return a loan.", ["loan_id"], loan_id=S),
         op("renew_loan", "Extend an open loan by 14 days.", ["loan_id"], loan_id=S),
         op("place_hold", "Reserve a book for a member.", ["member_id", "isbn"], member_id=S, isbn=S),
         op("list_loans", "A member's loans.", ["member_id"], member_id=S),
         op("pay_fine", "Pay (part of) a member's fines.", ["member_id", "amount"], member_id=S, amount=N),
     ]},
]

CLINIC = {
    "doctors": {"D1": {"name": "Dr. Rivera", "specialty": "cardiology",
                       "slots": ["2026-12-01T09:00", "2026-12-01T11:00", "2026-12-02T14:00"]},
                "D2": {"name": "Dr. Chen", "specialty": "dermatology",
                       "slots": ["2026-12-01T10:00", "2026-12-01T10:30", "2026-12-03T09:00"]}},
    "patients": {"P1": {"name": "Alice Moreau"}, "P2": {"name": "Bob Okafor"}, "P3": {"name": "Carol Singh"}},
}
WAREHOUSE_STOCK = {
    "SKU-100": {"name": "packing tape", "qty": 12, "location": "A1", "reorder_level": 20},
    "SKU-200": {"name": "cardboard box M", "qty": 300, "location": "A2", "reorder_level": 100},
    "SKU-300": {"name": "bubble wrap roll", "qty": 5, "location": "C4", "reorder_level": 10},
    "SKU-400": {"name": "label printer ink", "qty": 40, "location": "D1", "reorder_level": 15},
}
LIBRARY = {
    "books": {"978-0441013593": {"title": "Dune", "author": "Frank Herbert", "copies": 2},
              "978-0141439587": {"title": "Emma", "author": "Jane Austen", "copies": 1},
              "978-0547928227": {"title": "The Hobbit", "author": "J. R. R. Tolkien", "copies": 1}},
    "members": {"M1": {"name": "Dana", "fines": 0.0}, "M2": {"name": "Eli", "fines": 0.0},
                "M3": {"name": "Fay", "fines": 2.5}},
}


def call(name, thought=None, **arguments):
    step = {"tool_calls": [{"name": name, "arguments": arguments}]}
    if thought:
        step["thought"] = thought
    return step


def clinic(**extra):
    return {**json.loads(json.dumps(CLINIC)), **extra}


def library(**extra):
    return {**json.loads(json.dumps(LIBRARY)), **extra}


def warehouse(**extra):
    return {"stock": json.loads(json.dumps(WAREHOUSE_STOCK)), **extra}


TASKS = [
    # -- clinic
    {"task_id": "clinic-book-cardiology", "env_name": "ClinicScheduler", "init_config": clinic(),
     "task_desc": "Book patient P1 (Alice Moreau) with a cardiologist at the earliest free slot on 2026-12-01.",
     "check_func": "def check(env):\n    return any(a['patient_id'] == 'P1' and a['doctor_id'] == 'D1' and "
                   "a['slot'] == '2026-12-01T09:00' and a['status'] == 'booked' for a in env.appointments.values())\n",
     "solution": [call("list_doctors", "Find the cardiologists first.", specialty="cardiology"),
                  call("get_available_slots", doctor_id="D1", date="2026-12-01"),
                  call("book_appointment", "09:00 is the earliest free slot.", patient_id="P1", doctor_id="D1",
                       slot="2026-12-01T09:00"),
                  call("finish", answer="Booked Alice Moreau with Dr. Rivera on 2026-12-01 at 09:00.")]},
    {"task_id": "clinic-cancel", "env_name": "ClinicScheduler",
     "init_config": clinic(appointments={"A1": {"patient_id": "P2", "doctor_id": "D1", "slot": "2026-12-01T11:00",
                                                "status": "booked"}}),
     "task_desc": "Bob Okafor (patient P2) cannot come to his appointment. Cancel it.",
     "check_func": "def check(env):\n    return env.appointments['A1']['status'] == 'cancelled'\n",
     "solution": [call("list_appointments", "Look up Bob's appointments.", patient_id="P2"),
                  call("cancel_appointment", appointment_id="A1"),
                  call("finish", answer="Cancelled appointment A1 of Bob Okafor.")]},
    {"task_id": "clinic-reschedule", "env_name": "ClinicScheduler",
     "init_config": clinic(appointments={"A2": {"patient_id": "P3", "doctor_id": "D1", "slot": "2026-12-01T09:00",
                                                "status": "booked"}}),
     "task_desc": "Move Carol Singh's (P3) cardiology appointment A2 to 2026-12-02 at 14:00.",
     "check_func": "def check(env):\n    a = env.appointments['A2']\n"
                   "    return a['slot'] == '2026-12-02T14:00' and a['status'] == 'booked'\n",
     "solution": [call("get_available_slots", "Is 14:00 on the 2nd free?", doctor_id="D1", date="2026-12-02"),
                  call("reschedule_appointment", appointment_id="A2", new_slot="2026-12-02T14:00"),
                  call("finish", answer="Appointment A2 now is on 2026-12-02 at 14:00.")]},
    {"task_id": "clinic-book-after-conflict", "env_name": "ClinicScheduler",
     "init_config": clinic(appointments={"A3": {"patient_id": "P1", "doctor_id": "D2", "slot": "2026-12-01T10:00",
                                                "status": "booked"}}),
     "task_desc": "Book Carol Singh (P3) with Dr. Chen on 2026-12-01 at 10:00, or the next free slot that day if "
                  "10:00 is taken.",
     "check_func": "def check(env):\n    mine = [a for a in env.appointments.values() if a['patient_id'] == 'P3']\n"
                   "    return len(mine) == 1 and mine[0]['slot'] == '2026-12-01T10:30' and "
                   "env.appointments['A3']['status'] == 'booked'\n",
     "solution": [call("book_appointment", "Try 10:00 first.", patient_id="P3", doctor_id="D2",
                       slot="2026-12-01T10:00"),
                  call("get_available_slots", "10:00 is taken; look for the next one.", doctor_id="D2",
                       date="2026-12-01"),
                  call("book_appointment", patient_id="P3", doctor_id="D2", slot="2026-12-01T10:30"),
                  call("finish", answer="10:00 was taken; booked Carol Singh with Dr. Chen at 10:30.")]},
    {"task_id": "clinic-cancel-all", "env_name": "ClinicScheduler",
     "init_config": clinic(appointments={
         "A4": {"patient_id": "P3", "doctor_id": "D1", "slot": "2026-12-01T11:00", "status": "booked"},
         "A5": {"patient_id": "P3", "doctor_id": "D2", "slot": "2026-12-03T09:00", "status": "booked"},
         "A6": {"patient_id": "P1", "doctor_id": "D2", "slot": "2026-12-01T10:30", "status": "booked"}}),
     "task_desc": "Carol Singh (P3) is moving away: cancel all of her appointments, and nobody else's.",
     "check_func": "def check(env):\n    a = env.appointments\n    return a['A4']['status'] == 'cancelled' and "
                   "a['A5']['status'] == 'cancelled' and a['A6']['status'] == 'booked'\n",
     "solution": [call("list_appointments", patient_id="P3"),
                  call("cancel_appointment", appointment_id="A4"),
                  call("cancel_appointment", appointment_id="A5"),
                  call("finish", answer="Cancelled A4 and A5, Carol Singh's two appointments.")]},
    # -- warehouse
    {"task_id": "warehouse-receive", "env_name": "WarehouseInventory", "init_config": warehouse(),
     "task_desc": "A delivery of 40 rolls of packing tape (SKU-100) has arrived. Book it into stock.",
     "check_func": "def check(env):\n    return env.stock['SKU-100']['qty'] == 52\n",
     "solution": [call("receive_shipment", sku="SKU-100", quantity=40),
                  call("get_stock", sku="SKU-100"),
                  call("finish", answer="SKU-100 now has 52 units.")]},
    {"task_id": "warehouse-fulfill", "env_name": "WarehouseInventory",
     "init_config": warehouse(orders={"O-1": {"lines": {"SKU-200": 25, "SKU-400": 5}, "status": "pending"}}),
     "task_desc": "Ship customer order O-1.",
     "check_func": "def check(env):\n    return env.orders['O-1']['status'] == 'fulfilled' and "
                   "env.stock['SKU-200']['qty'] == 275 and env.stock['SKU-400']['qty'] == 35\n",
     "solution": [call("fulfill_order", order_id="O-1"),
                  call("finish", answer="Order O-1 is fulfilled.")]},
    {"task_id": "warehouse-move", "env_name": "WarehouseInventory", "init_config": warehouse(),
     "task_desc": "Medium cardboard boxes (SKU-200) are being relocated to bin B3. Update the system.",
     "check_func": "def check(env):\n    return env.stock['SKU-200']['location'] == 'B3'\n",
     "solution": [call("move_item", sku="SKU-200", location="B3"),
                  call("finish", answer="SKU-200 is now in bin B3.")]},
    {"task_id": "warehouse-reorder", "env_name": "WarehouseInventory", "init_config": warehouse(),
     "task_desc": "Create a purchase order of 50 units for every SKU that is below its reorder level, and for no "
                  "other SKU.",
     "check_func": "def check(env):\n    pos = sorted((p['sku'], p['quantity']) for p in env.purchase_orders)\n"
                   "    return pos == [('SKU-100', 50), ('SKU-300', 50)]\n",
     "solution": [call("list_low_stock", "Which SKUs are below their reorder level?"),
                  call("create_purchase_order", sku="SKU-100", quantity=50),
                  call("create_purchase_order", sku="SKU-300", quantity=50),
                  call("finish", answer="Purchase orders for SKU-100 and SKU-300, 50 units each.")]},
    {"task_id": "warehouse-receive-then-fulfill", "env_name": "WarehouseInventory",
     "init_config": warehouse(orders={"O-2": {"lines": {"SKU-300": 12}, "status": "pending"}}),
     "task_desc": "Order O-2 needs 12 bubble wrap rolls (SKU-300). A shipment of 10 rolls just arrived at the dock: "
                  "book it in and ship the order.",
     "check_func": "def check(env):\n    return env.orders['O-2']['status'] == 'fulfilled' and "
                   "env.stock['SKU-300']['qty'] == 3\n",
     "solution": [call("fulfill_order", "Try to ship right away.", order_id="O-2"),
                  call("receive_shipment", "Not enough stock; book the shipment in first.", sku="SKU-300",
                       quantity=10),
                  call("fulfill_order", order_id="O-2"),
                  call("finish", answer="Received 10 units of SKU-300 and shipped O-2.")]},
    # -- library
    {"task_id": "library-checkout", "env_name": "LibraryLoans", "init_config": library(),
     "task_desc": "Member M1 wants to borrow Dune. Lend it to them.",
     "check_func": "def check(env):\n    return any(l['member_id'] == 'M1' and l['isbn'] == '978-0441013593' and "
                   "l['returned'] is None for l in env.loans.values())\n",
     "solution": [call("search_books", query="Dune"),
                  call("checkout_book", member_id="M1", isbn="978-0441013593"),
                  call("finish", answer="Dune is lent to M1, due 2026-12-15.")]},
    {"task_id": "library-return", "env_name": "LibraryLoans",
     "init_config": library(loans={"L1": {"member_id": "M2", "isbn": "978-0547928227", "due": "2026-12-05",
                                          "renewals": 0, "returned": None}}),
     "task_desc": "Eli (member M2) has brought back The Hobbit. Record the return.",
     "check_func": "def check(env):\n    return env.loans['L1']['returned'] == '2026-12-01'\n",
     "solution": [call("list_loans", member_id="M2"),
                  call("return_book", loan_id="L1"),
                  call("finish", answer="Loan L1 (The Hobbit) is returned.")]},
    {"task_id": "library-renew", "env_name": "LibraryLoans",
     "init_config": library(loans={"L2": {"member_id": "M1", "isbn": "978-0141439587", "due": "2026-12-03",
                                          "renewals": 0, "returned": None}}),
     "task_desc": "Renew Dana's (M1) loan of Emma once.",
     "check_func": "def check(env):\n    l = env.loans['L2']\n    return l['due'] == '2026-12-17' and l['renewals'] == 1\n",
     "solution": [call("list_loans", member_id="M1"),
                  call("renew_loan", loan_id="L2"),
                  call("finish", answer="Loan L2 renewed; due 2026-12-17.")]},
    {"task_id": "library-hold", "env_name": "LibraryLoans",
     "init_config": library(loans={"L3": {"member_id": "M1", "isbn": "978-0547928227", "due": "2026-12-10",
                                          "renewals": 0, "returned": None}}),
     "task_desc": "Eli (M2) wants The Hobbit. Lend it if a copy is free, otherwise place a hold for him.",
     "check_func": "def check(env):\n    return env.holds == [{'member_id': 'M2', 'isbn': '978-0547928227'}] and "
                   "not any(l['member_id'] == 'M2' for l in env.loans.values())\n",
     "solution": [call("search_books", query="Hobbit"),
                  call("place_hold", "No copy is free: place a hold.", member_id="M2", isbn="978-0547928227"),
                  call("finish", answer="The Hobbit is on loan; Eli has a hold, position 1.")]},
    {"task_id": "library-fine-then-checkout", "env_name": "LibraryLoans", "init_config": library(),
     "task_desc": "Fay (M3) wants to borrow Emma and will pay whatever she owes first.",
     "check_func": "def check(env):\n    return env.members['M3']['fines'] == 0 and any(l['member_id'] == 'M3' and "
                   "l['isbn'] == '978-0141439587' for l in env.loans.values())\n",
     "solution": [call("checkout_book", member_id="M3", isbn="978-0141439587"),
                  call("pay_fine", "She owes 2.50; pay it.", member_id="M3", amount=2.5),
                  call("checkout_book", member_id="M3", isbn="978-0141439587"),
                  call("finish", answer="Fay paid 2.50 and borrowed Emma.")]},
]


def main() -> None:
    metadata = [{"env_name": e["env_name"], "description": e["description"],
                 "code": (HERE / "envs" / e["file"]).read_text(encoding="utf-8"), "operations": e["operations"]}
                for e in ENVS]
    scenarios = [{k: t[k] for k in ("task_id", "task_desc", "env_name", "init_config", "check_func")} for t in TASKS]
    solutions = [{"id": f"envscaler-{t['task_id']}", "prompt": t["task_desc"], "reference_solution": t["solution"]}
                 for t in TASKS]
    (HERE / "metadata.json").write_text(json.dumps(metadata, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (HERE / "scenarios.json").write_text(json.dumps(scenarios, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    out = HERE.parent / "reference_solutions" / "envscaler.json"
    out.write_text(json.dumps(solutions, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(metadata)} environments, {len(scenarios)} tasks, {len(solutions)} reference solutions")


if __name__ == "__main__":
    main()
