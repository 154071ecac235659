from common import PYTEST, d, finish, read, shell, step, task, write

# -- 013 CSV aggregation --------------------------------------------------------------------
SALES = d('''
    order_id,date,region,product,quantity,unit_price,status
    1001,2024-03-01,North,Widget,3,19.99,shipped
    1002,2024-03-01, south ,Gadget,1,249.00,shipped
    1003,2024-03-02,North,Gizmo,10,4.50,cancelled
    1004,2024-03-02,East,Widget,5,19.99,shipped
    1005,2024-03-03,SOUTH,Widget,2,19.99,pending
    1006,2024-03-03,East,Gadget,2,249.00,shipped
    1007,2024-03-04,north,Gizmo,4,4.50,shipped
    1008,2024-03-05,West,Gizmo,1,4.50,returned
''')
task(
    "code-013-csv-sales-summary",
    """sales.csv has one order per row (order_id, date, region, product, quantity, unit_price,
    status). Write aggregate.py so that `python3 aggregate.py`, run in the directory holding
    sales.csv, writes summary.json there (indent 2, sorted keys) with these keys: "orders" (number
    of orders counted), "total_revenue", "by_region" (region -> {"orders", "revenue"}),
    "units_by_product" (product -> total quantity) and "top_product" (the product with the highest
    revenue, ties broken alphabetically). Rules: rows whose status is cancelled or returned are
    not counted at all; a row's revenue is quantity * unit_price; region names are trimmed and
    title-cased (" south " and "SOUTH" are both "South"); every revenue is a number rounded to 2
    decimals.""",
    setup_files={"sales.csv": SALES},
    verifier_files={"test_aggregate.py": d('''
        import json
        import shutil
        import subprocess
        import sys

        import pytest


        def run_in(directory):
            subprocess.run([sys.executable, "aggregate.py"], cwd=directory, check=True, capture_output=True, timeout=30)
            with open(f"{directory}/summary.json", encoding="utf-8") as fh:
                return json.load(fh)


        @pytest.fixture(scope="module")
        def summary():
            return run_in(".")


        def test_orders_and_total(summary):
            assert summary["orders"] == 6
            assert summary["total_revenue"] == 964.9


        def test_by_region(summary):
            assert summary["by_region"] == {
                "East": {"orders": 2, "revenue": 597.95},
                "North": {"orders": 2, "revenue": 77.97},
                "South": {"orders": 2, "revenue": 288.98},
            }


        def test_products(summary):
            assert summary["units_by_product"] == {"Gadget": 3, "Gizmo": 4, "Widget": 10}
            assert summary["top_product"] == "Gadget"


        def test_exact_keys(summary):
            assert sorted(summary) == ["by_region", "orders", "top_product", "total_revenue", "units_by_product"]


        def test_another_file(tmp_path):
            shutil.copy("aggregate.py", tmp_path / "aggregate.py")
            (tmp_path / "sales.csv").write_text(
                "order_id,date,region,product,quantity,unit_price,status\\n"
                "1,2024-04-01,west,Nut,20,0.05,shipped\\n"
                "2,2024-04-01,West ,Bolt,10,0.10,shipped\\n"
                "3,2024-04-02,Central,Bolt,1,5.00,cancelled\\n"
                "4,2024-04-02,central,Washer,3,0.33,pending\\n"
            )
            assert run_in(tmp_path) == {
                "orders": 3,
                "total_revenue": 2.99,
                "by_region": {"Central": {"orders": 1, "revenue": 0.99}, "West": {"orders": 2, "revenue": 2.0}},
                "units_by_product": {"Bolt": 10, "Nut": 20, "Washer": 3},
                "top_product": "Bolt",
            }
    ''')},
    command=f"{PYTEST} test_aggregate.py",
    solution=[
        step("See the data first.", shell("cat sales.csv")),
        step("csv.DictReader, Decimal for exact money sums, then round to 2 decimals only when writing.",
             write("aggregate.py", d('''
                """Summarise sales.csv into summary.json (run in the directory holding sales.csv)."""
                import csv
                import json
                from collections import defaultdict
                from decimal import Decimal

                SKIPPED = {"cancelled", "returned"}


                def money(value):
                    return float(value.quantize(Decimal("0.01")))


                def summarize(rows):
                    orders = 0
                    total = Decimal(0)
                    regions = defaultdict(lambda: {"orders": 0, "revenue": Decimal(0)})
                    units = defaultdict(int)
                    product_revenue = defaultdict(Decimal)
                    for row in rows:
                        if row["status"].strip().lower() in SKIPPED:
                            continue
                        quantity = int(row["quantity"])
                        revenue = quantity * Decimal(row["unit_price"].strip())
                        region = row["region"].strip().title()
                        product = row["product"].strip()
                        orders += 1
                        total += revenue
                        regions[region]["orders"] += 1
                        regions[region]["revenue"] += revenue
                        units[product] += quantity
                        product_revenue[product] += revenue
                    top = min(product_revenue, key=lambda p: (-product_revenue[p], p)) if product_revenue else None
                    return {
                        "orders": orders,
                        "total_revenue": money(total),
                        "by_region": {r: {"orders": v["orders"], "revenue": money(v["revenue"])} for r, v in regions.items()},
                        "units_by_product": dict(units),
                        "top_product": top,
                    }


                if __name__ == "__main__":
                    with open("sales.csv", newline="", encoding="utf-8") as fh:
                        summary = summarize(csv.DictReader(fh))
                    with open("summary.json", "w", encoding="utf-8") as fh:
                        json.dump(summary, fh, indent=2, sort_keys=True)
                        fh.write("\\n")
             '''))),
        step("Run it and look at the result.", shell("python3 aggregate.py && cat summary.json")),
        step("Run the provided tests, which also try a second CSV.", shell("python3 -m pytest -q test_aggregate.py")),
        step("6 orders (cancelled and returned ones skipped), 964.9 in total, regions normalised, Gadget on top; the provided tests pass.",
             finish("aggregate.py writes summary.json: orders, total_revenue, by_region, units_by_product and top_product, with exact Decimal sums rounded to 2 decimals.")),
    ],
)

# -- 014 flatten nested JSON ----------------------------------------------------------------
SETTINGS = d('''
    {
      "app": {"name": "shop", "debug": false, "ports": [8080, 8443]},
      "db": {"primary": {"host": "db1", "port": 5432}, "replicas": [{"host": "db2"}, {"host": "db3", "lag": null}]},
      "features": {},
      "tags": [],
      "version": 3.1
    }
''')
task(
    "code-014-flatten-json",
    """Write flatjson.py with flatten(obj, sep=".") and unflatten(flat, sep="."). flatten takes a
    dict that may contain nested dicts and lists and returns a one-level dict whose keys are the
    paths to the leaves joined by sep; list items use their index as the path part, so
    {"a": [{"b": 1}]} becomes {"a.0.b": 1}. Leaves are strings, numbers, booleans, None, and also
    empty dicts and empty lists, which are kept as {} and []. unflatten is the inverse: it rebuilds
    the nested structure, turning a level into a list when its keys are exactly "0", "1", ...,
    "n-1" (n >= 1) and into a dict otherwise. Also make it a command: `python3 flatjson.py IN OUT`
    writes the flattened JSON of file IN to file OUT (indent 2). settings.json is an example.""",
    setup_files={"settings.json": SETTINGS},
    verifier_files={"test_flatjson.py": d('''
        import json
        import subprocess
        import sys

        from flatjson import flatten, unflatten

        FLAT_SETTINGS = {
            "app.name": "shop", "app.debug": False, "app.ports.0": 8080, "app.ports.1": 8443,
            "db.primary.host": "db1", "db.primary.port": 5432, "db.replicas.0.host": "db2",
            "db.replicas.1.host": "db3", "db.replicas.1.lag": None, "features": {}, "tags": [], "version": 3.1,
        }


        def test_nested_dicts():
            assert flatten({"a": {"b": {"c": 1}, "d": "x"}, "e": True}) == {"a.b.c": 1, "a.d": "x", "e": True}


        def test_lists_use_indices():
            assert flatten({"a": [{"b": 1}, [2, 3]]}) == {"a.0.b": 1, "a.1.0": 2, "a.1.1": 3}


        def test_empty_containers_are_leaves():
            assert flatten({"a": {}, "b": [], "c": {"d": []}}) == {"a": {}, "b": [], "c.d": []}


        def test_custom_separator():
            assert flatten({"a": {"b": [None]}}, sep="/") == {"a/b/0": None}
            assert unflatten({"a/b/0": None}, sep="/") == {"a": {"b": [None]}}


        def test_unflatten_builds_lists_only_from_full_index_runs():
            assert unflatten({"a.0": "x", "a.1": "y", "b.1": "z", "c.0.d": 1}) == {"a": ["x", "y"], "b": {"1": "z"}, "c": [{"d": 1}]}


        def test_round_trip():
            with open("settings.json", encoding="utf-8") as fh:
                settings = json.load(fh)
            assert flatten(settings) == FLAT_SETTINGS
            assert unflatten(flatten(settings)) == settings


        def test_command(tmp_path):
            out = tmp_path / "flat.json"
            subprocess.run([sys.executable, "flatjson.py", "settings.json", str(out)], check=True, capture_output=True)
            assert json.loads(out.read_text()) == FLAT_SETTINGS
    ''')},
    command=f"{PYTEST} test_flatjson.py",
    solution=[
        step(None, read("settings.json")),
        step("Recursive flatten with a path prefix; unflatten builds nested dicts first, then converts any dict whose keys are exactly 0..n-1 into a list, bottom-up.",
             write("flatjson.py", d('''
                """Flatten nested JSON into path keys and back; `python3 flatjson.py IN OUT`."""
                import json
                import sys


                def flatten(obj, sep="."):
                    """{"a": [{"b": 1}]} -> {"a.0.b": 1}; empty dicts and lists are leaves."""
                    flat = {}

                    def walk(value, path):
                        if isinstance(value, dict) and value:
                            items = value.items()
                        elif isinstance(value, list) and value:
                            items = enumerate(value)
                        else:
                            flat[path] = value
                            return
                        for key, child in items:
                            walk(child, f"{path}{sep}{key}" if path else str(key))

                    for key, value in obj.items():
                        walk(value, str(key))
                    return flat


                def _listify(value):
                    if not isinstance(value, dict) or not value:
                        return value
                    converted = {key: _listify(child) for key, child in value.items()}
                    if set(converted) == {str(i) for i in range(len(converted))}:
                        return [converted[str(i)] for i in range(len(converted))]
                    return converted


                def unflatten(flat, sep="."):
                    """The inverse of flatten; a level keyed exactly "0".."n-1" becomes a list."""
                    root = {}
                    for path, value in flat.items():
                        node = root
                        *parents, last = path.split(sep)
                        for part in parents:
                            node = node.setdefault(part, {})
                        node[last] = value
                    return {key: _listify(value) for key, value in root.items()}


                if __name__ == "__main__":
                    if len(sys.argv) != 3:
                        sys.exit("usage: python3 flatjson.py IN OUT")
                    with open(sys.argv[1], encoding="utf-8") as fh:
                        data = json.load(fh)
                    with open(sys.argv[2], "w", encoding="utf-8") as fh:
                        json.dump(flatten(data), fh, indent=2)
                        fh.write("\\n")
             '''))),
        step("Flatten the example, then check the round trip.",
             shell("python3 flatjson.py settings.json /tmp/flat.json && cat /tmp/flat.json && "
                   "python3 -c \"import json; from flatjson import flatten, unflatten; s = json.load(open('settings.json')); "
                   "assert unflatten(flatten(s)) == s; print('round trip ok')\"")),
        step("Run the provided tests.", shell("python3 -m pytest -q test_flatjson.py")),
        step("Flat keys look right (features {} and tags [] kept) and the round trip holds; the provided tests pass.",
             finish("flatjson.py: flatten/unflatten with index path parts and empty containers as leaves, plus the `python3 flatjson.py IN OUT` command.")),
    ],
)

# -- 015 joining two CSVs -------------------------------------------------------------------
CUSTOMERS = d('''
    customer_id,name,country
    C01,Ada Lovelace,UK
    C02,Alan Turing,UK
    C03,"Hopper, Grace",US
    C04,Edsger Dijkstra,NL
''')
ORDERS = d('''
    order_id,customer_id,amount
    O1,C01,120.50
    O2,C03,99.99
    O3,C01,30.00
    O4,C05,10.00
    O5,C03,0.01
    O6,C02,150.50
    O7,C09,5.00
    O8,C05,1.25
''')
task(
    "code-015-join-csv-report",
    """customers.csv (customer_id, name, country) and orders.csv (order_id, customer_id, amount)
    are given. Write report.py so that `python3 report.py`, run in their directory, writes
    report.csv with the header customer_id,name,country,orders,total and one row per customer,
    including customers without orders: orders is their number of orders and total the sum of
    their amounts with exactly 2 decimals (0.00 when none). Sort rows by total, highest first,
    then by customer_id. Write it with Python's csv module defaults (values containing commas
    are quoted) but with Unix line endings. Orders whose customer_id is not in customers.csv are
    left out of the report; if there are any, the script prints exactly one line to stdout:
    `skipped N orders with unknown customer_id: ID1, ID2` (distinct ids, sorted), and otherwise
    prints nothing.""",
    setup_files={"customers.csv": CUSTOMERS, "orders.csv": ORDERS},
    verifier_files={"test_report.py": d('''
        import csv
        import shutil
        import subprocess
        import sys

        import pytest


        def run_in(directory):
            result = subprocess.run([sys.executable, "report.py"], cwd=directory, check=True, capture_output=True, text=True, timeout=30)
            with open(f"{directory}/report.csv", newline="", encoding="utf-8") as fh:
                return result.stdout, fh.read()


        @pytest.fixture(scope="module")
        def report():
            return run_in(".")


        def test_rows(report):
            _, text = report
            assert list(csv.reader(text.splitlines())) == [
                ["customer_id", "name", "country", "orders", "total"],
                ["C01", "Ada Lovelace", "UK", "2", "150.50"],
                ["C02", "Alan Turing", "UK", "1", "150.50"],
                ["C03", "Hopper, Grace", "US", "2", "100.00"],
                ["C04", "Edsger Dijkstra", "NL", "0", "0.00"],
            ]


        def test_unix_line_endings_and_quoting(report):
            _, text = report
            assert "\\r" not in text
            assert 'C03,"Hopper, Grace",US,2,100.00\\n' in text


        def test_unknown_customers_message(report):
            stdout, _ = report
            assert stdout == "skipped 3 orders with unknown customer_id: C05, C09\\n"


        def test_other_data_prints_nothing(tmp_path):
            shutil.copy("report.py", tmp_path / "report.py")
            (tmp_path / "customers.csv").write_text("customer_id,name,country\\nB2,Bo,SE\\nA1,Al,DK\\nC3,Cy,FI\\n")
            (tmp_path / "orders.csv").write_text("order_id,customer_id,amount\\n1,B2,0.10\\n2,B2,0.20\\n3,A1,0.3\\n")
            stdout, text = run_in(tmp_path)
            assert stdout == ""
            assert text == "customer_id,name,country,orders,total\\nA1,Al,DK,1,0.30\\nB2,Bo,SE,2,0.30\\nC3,Cy,FI,0,0.00\\n"
    ''')},
    command=f"{PYTEST} test_report.py",
    solution=[
        step("Look at both inputs.", shell("head -n 20 customers.csv orders.csv")),
        step("Left join in a dict keyed by customer_id; Decimal keeps 0.10 + 0.20 exact; csv.writer with lineterminator='\\n'.",
             write("report.py", d('''
                """Join customers.csv and orders.csv into report.csv (run in their directory)."""
                import csv
                from decimal import Decimal


                def main():
                    with open("customers.csv", newline="", encoding="utf-8") as fh:
                        customers = list(csv.DictReader(fh))
                    stats = {c["customer_id"]: {"orders": 0, "total": Decimal(0)} for c in customers}
                    unknown = []
                    with open("orders.csv", newline="", encoding="utf-8") as fh:
                        for order in csv.DictReader(fh):
                            entry = stats.get(order["customer_id"])
                            if entry is None:
                                unknown.append(order["customer_id"])
                                continue
                            entry["orders"] += 1
                            entry["total"] += Decimal(order["amount"])
                    customers.sort(key=lambda c: (-stats[c["customer_id"]]["total"], c["customer_id"]))
                    with open("report.csv", "w", newline="", encoding="utf-8") as fh:
                        writer = csv.writer(fh, lineterminator="\\n")
                        writer.writerow(["customer_id", "name", "country", "orders", "total"])
                        for c in customers:
                            entry = stats[c["customer_id"]]
                            total = entry["total"].quantize(Decimal("0.01"))
                            writer.writerow([c["customer_id"], c["name"], c["country"], entry["orders"], f"{total:.2f}"])
                    if unknown:
                        ids = ", ".join(sorted(set(unknown)))
                        print(f"skipped {len(unknown)} orders with unknown customer_id: {ids}")


                if __name__ == "__main__":
                    main()
             '''))),
        step("Run it and inspect the report, line endings included.", shell("python3 report.py && cat -A report.csv")),
        step("Run the provided tests.", shell("python3 -m pytest -q test_report.py")),
        step("Ties on 150.50 are ordered by id, C04 shows 0.00, the quoted name survives and the 3 orphan orders are reported; the provided tests pass.",
             finish("report.py writes report.csv (left join, sorted by total then id, 2-decimal totals) and reports orders with unknown customer ids.")),
    ],
)

# -- 016 JSONL events -----------------------------------------------------------------------
EVENTS = "\n".join([
    '{"user": "ana", "ts": "2024-06-01T10:00:00Z", "action": "login"}',
    '{"user": "ben", "ts": "2024-06-01T09:30:00Z", "action": "login"}',
    '{"user": "ana", "ts": "2024-06-01T10:05:00Z", "action": "view", "item": "p1"}',
    'not json at all',
    '{"user": "ana", "ts": "2024-06-01T09:59:00Z", "action": "view", "item": "p2"}',
    '{"user": "ben", "ts": "2024-06-01T11:00:00Z", "action": "purchase", "item": "p1", "amount": 25.5}',
    '{"ts": "2024-06-01T11:01:00Z", "action": "view"}',
    '',
    '{"user": "cy", "ts": "2024-06-02T08:00:00Z", "action": "login"}',
    '{"user": "ana", "ts": "2024-06-02T12:00:00Z", "action": "purchase", "item": "p2", "amount": 10}',
    '[1, 2]',
    '{"user": "ben", "ts": "2024-06-01T11:30:00Z", "action": "purchase", "item": "p3", "amount": 4.25}',
]) + "\n"
task(
    "code-016-jsonl-user-activity",
    """events.jsonl holds one JSON event per line. A valid event is a JSON object with string
    fields user, ts (UTC, formatted like 2024-06-01T10:00:00Z) and action; purchase events also
    have a numeric amount. Lines are not in time order. Write events.py so that
    `python3 events.py IN OUT` reads IN and writes OUT as JSON (indent 2, sorted keys) of the form
    {"users": {USER: {"first_seen": TS, "last_seen": TS, "actions": {ACTION: COUNT}, "spent": X}},
    "invalid_lines": [...]}, where first_seen/last_seen are the earliest and latest ts of the
    user's events, spent is the sum of the user's purchase amounts rounded to 2 decimals (0 if
    none), and invalid_lines lists the 1-based numbers of non-blank lines that are not valid
    events (malformed JSON, not an object, or user, ts or action missing or not a string). Blank
    lines are skipped.""",
    setup_files={"events.jsonl": EVENTS},
    verifier_files={"test_events.py": d('''
        import json
        import subprocess
        import sys

        import pytest


        def run(source, target):
            subprocess.run([sys.executable, "events.py", str(source), str(target)], check=True, capture_output=True, timeout=30)
            with open(target, encoding="utf-8") as fh:
                return json.load(fh)


        @pytest.fixture(scope="module")
        def report(tmp_path_factory):
            return run("events.jsonl", tmp_path_factory.mktemp("out") / "users.json")


        def test_users(report):
            assert sorted(report["users"]) == ["ana", "ben", "cy"]


        def test_first_and_last_seen_ignore_file_order(report):
            ana = report["users"]["ana"]
            assert (ana["first_seen"], ana["last_seen"]) == ("2024-06-01T09:59:00Z", "2024-06-02T12:00:00Z")
            cy = report["users"]["cy"]
            assert cy["first_seen"] == cy["last_seen"] == "2024-06-02T08:00:00Z"


        def test_actions_and_spent(report):
            assert report["users"]["ana"]["actions"] == {"login": 1, "view": 2, "purchase": 1}
            assert report["users"]["ben"] == {"first_seen": "2024-06-01T09:30:00Z", "last_seen": "2024-06-01T11:30:00Z",
                                              "actions": {"login": 1, "purchase": 2}, "spent": 29.75}
            assert report["users"]["ana"]["spent"] == 10
            assert report["users"]["cy"]["spent"] == 0


        def test_invalid_lines(report):
            assert report["invalid_lines"] == [4, 7, 11]


        def test_other_input(tmp_path):
            source = tmp_path / "in.jsonl"
            source.write_text(
                '{"user": "z", "ts": "2024-01-01T00:00:02Z", "action": "purchase", "amount": 0.1}\\n'
                '{"user": "z", "ts": "2024-01-01T00:00:01Z", "action": "purchase", "amount": 0.2}\\n'
                '{"user": 5, "ts": "2024-01-01T00:00:03Z", "action": "login"}\\n'
                '{"user": "z", "ts": "2024-01-01T00:00:04Z", "action": "logout", "extra": [1]}\\n'
            )
            assert run(source, tmp_path / "out.json") == {
                "users": {"z": {"first_seen": "2024-01-01T00:00:01Z", "last_seen": "2024-01-01T00:00:04Z",
                                "actions": {"purchase": 2, "logout": 1}, "spent": 0.3}},
                "invalid_lines": [3],
            }
    ''')},
    command=f"{PYTEST} test_events.py",
    solution=[
        step("Check the input, including the bad lines.", shell("cat -n events.jsonl")),
        step("Validate each line into an event or record its number; ISO timestamps in one format compare correctly as strings.",
             write("events.py", d('''
                """Per-user activity from a JSONL event log: `python3 events.py IN OUT`."""
                import json
                import sys
                from collections import Counter


                def parse(line):
                    """The event dict of a line, or None if it is not a valid event."""
                    try:
                        event = json.loads(line)
                    except ValueError:
                        return None
                    if not isinstance(event, dict):
                        return None
                    if not all(isinstance(event.get(key), str) for key in ("user", "ts", "action")):
                        return None
                    return event


                def summarize(lines):
                    users, invalid = {}, []
                    for number, line in enumerate(lines, 1):
                        if not line.strip():
                            continue
                        event = parse(line)
                        if event is None:
                            invalid.append(number)
                            continue
                        user = users.setdefault(event["user"], {"first_seen": event["ts"], "last_seen": event["ts"],
                                                                "actions": Counter(), "spent": 0.0})
                        user["first_seen"] = min(user["first_seen"], event["ts"])
                        user["last_seen"] = max(user["last_seen"], event["ts"])
                        user["actions"][event["action"]] += 1
                        if event["action"] == "purchase":
                            user["spent"] += float(event.get("amount", 0))
                    for user in users.values():
                        user["actions"] = dict(user["actions"])
                        user["spent"] = round(user["spent"], 2)
                    return {"users": users, "invalid_lines": invalid}


                if __name__ == "__main__":
                    if len(sys.argv) != 3:
                        sys.exit("usage: python3 events.py IN OUT")
                    with open(sys.argv[1], encoding="utf-8") as fh:
                        report = summarize(fh)
                    with open(sys.argv[2], "w", encoding="utf-8") as fh:
                        json.dump(report, fh, indent=2, sort_keys=True)
                        fh.write("\\n")
             '''))),
        step("Run it on the example.", shell("python3 events.py events.jsonl users.json && cat users.json")),
        step("Run the provided tests.", shell("python3 -m pytest -q test_events.py")),
        step("Lines 4, 7 and 11 are flagged, ana's first_seen is 09:59 despite the file order, ben spent 29.75; the provided tests pass.",
             finish("events.py: per-user first/last seen, action counts and purchase totals from events.jsonl, with the numbers of invalid lines.")),
    ],
)

# -- 017 CSV to typed, grouped JSON ---------------------------------------------------------
INVENTORY = d('''
    sku,name,category,qty,price,in_stock,tags
    B-200,Blue mug,Kitchen,12,7.50,yes,ceramic; blue
    A-100,Chef knife,kitchen,3,49.90,Yes,steel;;sharp
    ,Mystery box,Misc,1,1.00,no,
    C-300,Desk lamp, Office ,,23.00,NO,
    A-050,Notebook,office,40,2.25,yes, paper ;  lined
    D-400,Tea towel,KITCHEN,0,4.00,no,cotton
''')
task(
    "code-017-csv-to-grouped-json",
    """inventory.csv has the columns sku, name, category, qty, price, in_stock, tags. Write
    convert.py so that `python3 convert.py IN OUT` converts such a CSV into a JSON object (indent
    2) that maps each category, trimmed and lower-cased, to the list of its items sorted by sku.
    Each item is {"sku": str, "name": str, "qty": int (an empty qty is 0), "price": float,
    "in_stock": bool (yes/no in any case), "tags": list of str} where tags are split on ";",
    trimmed, with empty parts dropped. Rows with an empty sku are skipped. Categories appear in
    alphabetical order.""",
    setup_files={"inventory.csv": INVENTORY},
    verifier_files={"test_convert.py": d('''
        import json
        import subprocess
        import sys


        def convert(source, target):
            subprocess.run([sys.executable, "convert.py", str(source), str(target)], check=True, capture_output=True, timeout=30)
            with open(target, encoding="utf-8") as fh:
                return fh.read()


        def test_grouping_and_order(tmp_path):
            data = json.loads(convert("inventory.csv", tmp_path / "out.json"))
            assert list(data) == ["kitchen", "office"]
            assert [item["sku"] for item in data["kitchen"]] == ["A-100", "B-200", "D-400"]
            assert [item["sku"] for item in data["office"]] == ["A-050", "C-300"]


        def test_typed_values(tmp_path):
            data = json.loads(convert("inventory.csv", tmp_path / "out.json"))
            assert data["kitchen"][0] == {"sku": "A-100", "name": "Chef knife", "qty": 3, "price": 49.9,
                                          "in_stock": True, "tags": ["steel", "sharp"]}
            assert data["office"][1] == {"sku": "C-300", "name": "Desk lamp", "qty": 0, "price": 23.0,
                                         "in_stock": False, "tags": []}
            assert data["office"][0]["tags"] == ["paper", "lined"]


        def test_rows_without_sku_are_skipped(tmp_path):
            text = convert("inventory.csv", tmp_path / "out.json")
            assert "Mystery box" not in text and "misc" not in json.loads(text)


        def test_types_in_json(tmp_path):
            data = json.loads(convert("inventory.csv", tmp_path / "out.json"))
            for items in data.values():
                for item in items:
                    assert type(item["qty"]) is int and type(item["price"]) is float and type(item["in_stock"]) is bool


        def test_other_file(tmp_path):
            source = tmp_path / "in.csv"
            source.write_text("sku,name,category,qty,price,in_stock,tags\\nz1,Zed,Zoo,5,1,YES,a;b\\n")
            assert json.loads(convert(source, tmp_path / "o.json")) == {
                "zoo": [{"sku": "z1", "name": "Zed", "qty": 5, "price": 1.0, "in_stock": True, "tags": ["a", "b"]}]}
    ''')},
    command=f"{PYTEST} test_convert.py",
    solution=[
        step(None, read("inventory.csv")),
        step("DictReader, per-field conversion, group in a dict, then sort categories and skus when building the output.",
             write("convert.py", d('''
                """inventory CSV -> JSON grouped by category: `python3 convert.py IN OUT`."""
                import csv
                import json
                import sys


                def item(row):
                    return {
                        "sku": row["sku"].strip(),
                        "name": row["name"].strip(),
                        "qty": int(row["qty"]) if row["qty"].strip() else 0,
                        "price": float(row["price"]),
                        "in_stock": row["in_stock"].strip().lower() == "yes",
                        "tags": [tag.strip() for tag in (row["tags"] or "").split(";") if tag.strip()],
                    }


                def convert(rows):
                    groups = {}
                    for row in rows:
                        if not row["sku"].strip():
                            continue
                        groups.setdefault(row["category"].strip().lower(), []).append(item(row))
                    return {category: sorted(groups[category], key=lambda i: i["sku"]) for category in sorted(groups)}


                if __name__ == "__main__":
                    if len(sys.argv) != 3:
                        sys.exit("usage: python3 convert.py IN OUT")
                    with open(sys.argv[1], newline="", encoding="utf-8") as fh:
                        data = convert(csv.DictReader(fh))
                    with open(sys.argv[2], "w", encoding="utf-8") as fh:
                        json.dump(data, fh, indent=2)
                        fh.write("\\n")
             '''))),
        step("Convert the example and read the output.", shell("python3 convert.py inventory.csv inventory.json && cat inventory.json")),
        step("Run the provided tests.", shell("python3 -m pytest -q test_convert.py")),
        step("Two categories, items sorted by sku, typed values, the sku-less row dropped; the provided tests pass.",
             finish("convert.py turns inventory.csv into category-grouped JSON with typed qty/price/in_stock and split tags.")),
    ],
)
