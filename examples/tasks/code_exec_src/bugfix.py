from common import PYTEST, d, finish, read, shell, step, task, write

BUGFIX_PROMPT = """The tests fail, fix the bug. This directory holds a small Python package, {package},
with its tests in tests/ (run them with `python3 -m pytest -q tests`). {what} Fix the package so
that the tests pass; do not modify the tests."""

# -- 018 inventory: zero-padding in the money formatter ---------------------------------------
INV_MODELS = d('''
    from dataclasses import dataclass


    @dataclass
    class Item:
        sku: str
        name: str
        price_cents: int
        quantity: int = 0

        def value_cents(self) -> int:
            return self.price_cents * self.quantity
''')
INV_STORE = d('''
    from .models import Item


    class OutOfStock(Exception):
        pass


    class Store:
        def __init__(self):
            self._items: dict[str, Item] = {}

        def add(self, sku: str, name: str, price_cents: int, quantity: int = 1) -> None:
            item = self._items.get(sku)
            if item is None:
                self._items[sku] = Item(sku, name, price_cents, quantity)
            else:
                item.quantity += quantity

        def remove(self, sku: str, quantity: int = 1) -> None:
            item = self._items.get(sku)
            if item is None or item.quantity < quantity:
                raise OutOfStock(sku)
            item.quantity -= quantity
            if item.quantity == 0:
                del self._items[sku]

        def items(self) -> list[Item]:
            return sorted(self._items.values(), key=lambda item: item.sku)

        def total_value_cents(self) -> int:
            return sum(item.value_cents() for item in self._items.values())
''')
INV_REPORT_BUGGY = d('''
    from .store import Store


    def format_money(cents: int) -> str:
        """1234505 -> '$12,345.05'; negative amounts get a leading minus sign."""
        sign = "-" if cents < 0 else ""
        dollars, rest = divmod(abs(cents), 100)
        return f"{sign}${dollars:,}.{rest}"


    def stock_report(store: Store) -> str:
        lines = [f"{item.sku:<8} {item.quantity:>4} x {format_money(item.price_cents):>10}" for item in store.items()]
        lines.append(f"TOTAL {format_money(store.total_value_cents())}")
        return "\\n".join(lines)
''')
INV_TEST_STORE = d('''
    import pytest

    from inventory import Store
    from inventory.store import OutOfStock


    def test_add_merges_quantities():
        store = Store()
        store.add("A1", "apple", 50, 3)
        store.add("A1", "apple", 50, 2)
        assert [(i.sku, i.quantity) for i in store.items()] == [("A1", 5)]


    def test_remove_and_out_of_stock():
        store = Store()
        store.add("B2", "bread", 250, 2)
        store.remove("B2", 2)
        assert store.items() == []
        with pytest.raises(OutOfStock):
            store.remove("B2")


    def test_total_value():
        store = Store()
        store.add("A1", "apple", 50, 3)
        store.add("C3", "cheese", 1299)
        assert store.total_value_cents() == 1449
''')
INV_TEST_REPORT = d('''
    from inventory import Store
    from inventory.report import format_money, stock_report


    def test_format_money():
        assert format_money(123450) == "$1,234.50"
        assert format_money(1234505) == "$12,345.05"
        assert format_money(7) == "$0.07"
        assert format_money(-250) == "-$2.50"


    def test_stock_report():
        store = Store()
        store.add("A1", "apple", 105, 3)
        store.add("C3", "cheese", 1299)
        assert stock_report(store).splitlines() == [
            "A1          3 x      $1.05",
            "C3          1 x     $12.99",
            "TOTAL $16.14",
        ]
''')
INV_TEST_MORE = d('''
    from inventory.report import format_money


    def test_round_amounts():
        assert format_money(0) == "$0.00"
        assert format_money(100) == "$1.00"
        assert format_money(100000000) == "$1,000,000.00"


    def test_single_cent_digits():
        assert format_money(101) == "$1.01"
        assert format_money(-9) == "-$0.09"
''')
task(
    "code-018-fix-inventory-report",
    BUGFIX_PROMPT.format(package="inventory", what="Amounts in the stock report come out wrong."),
    setup_files={
        "tests/__init__.py": "",
        "inventory/__init__.py": "from .models import Item\nfrom .store import Store\n\n__all__ = [\"Item\", \"Store\"]\n",
        "inventory/models.py": INV_MODELS,
        "inventory/store.py": INV_STORE,
        "inventory/report.py": INV_REPORT_BUGGY,
        "tests/test_store.py": INV_TEST_STORE,
        "tests/test_report.py": INV_TEST_REPORT,
    },
    verifier_files={
        "tests/__init__.py": "",
        "tests/test_store.py": INV_TEST_STORE,
        "tests/test_report.py": INV_TEST_REPORT,
        "tests/test_report_more.py": INV_TEST_MORE,
    },
    command=f"{PYTEST} tests/test_store.py tests/test_report.py tests/test_report_more.py",
    solution=[
        step("Run the tests to see what fails.", shell("ls -R inventory tests && python3 -m pytest -q tests 2>&1 | tail -25")),
        step("The failures are all in format_money; look at it.", read("inventory/report.py")),
        step("The cents are printed without zero-padding, so 5 cents shows as .5; pad them to two digits.",
             write("inventory/report.py", INV_REPORT_BUGGY.replace('{dollars:,}.{rest}"', '{dollars:,}.{rest:02d}"'))),
        step(None, shell("python3 -m pytest -q tests")),
        step("All tests pass.", finish("Fixed inventory/report.py: format_money now zero-pads the cents ($0.07, $12,345.05).")),
    ],
)

# -- 019 ledger: fractional cents parsed without right-padding --------------------------------
LEDGER_MONEY_BUGGY = d('''
    """Amounts are integers of cents everywhere; text is parsed only here."""


    def parse_amount(text: str) -> int:
        """'12.30' -> 1230, '12.3' -> 1230, '-4.05' -> -405, '7' -> 700; ValueError otherwise."""
        text = text.strip()
        negative = text.startswith("-")
        if negative:
            text = text[1:]
        whole, _, fraction = text.partition(".")
        if not whole.isdigit() or (fraction and not fraction.isdigit()) or len(fraction) > 2:
            raise ValueError(f"not an amount: {text!r}")
        cents = int(whole) * 100 + (int(fraction) if fraction else 0)
        return -cents if negative else cents
''')
LEDGER_ACCOUNTS = d('''
    from dataclasses import dataclass, field


    @dataclass
    class Account:
        name: str
        balance: int = 0
        history: list = field(default_factory=list)

        def apply(self, cents: int, memo: str = "") -> None:
            self.balance += cents
            self.history.append((cents, memo))
''')
LEDGER_IMPORTER = d('''
    import csv
    import io

    from .accounts import Account
    from .money import parse_amount


    def load(csv_text: str) -> dict[str, Account]:
        """Rows of account,amount,memo -> accounts with every row applied in order."""
        accounts: dict[str, Account] = {}
        for row in csv.DictReader(io.StringIO(csv_text)):
            account = accounts.setdefault(row["account"], Account(row["account"]))
            account.apply(parse_amount(row["amount"]), row.get("memo", ""))
        return accounts


    def balances(csv_text: str) -> dict[str, int]:
        return {name: account.balance for name, account in sorted(load(csv_text).items())}
''')
LEDGER_TEST_MONEY = d('''
    import pytest

    from ledger.money import parse_amount


    @pytest.mark.parametrize("text, cents", [("12.34", 1234), ("7", 700), ("-4.05", -405), (" 0.99 ", 99)])
    def test_parse_amount(text, cents):
        assert parse_amount(text) == cents


    @pytest.mark.parametrize("text", ["", "abc", "1.234", "1,5", "--1"])
    def test_parse_amount_rejects(text):
        with pytest.raises(ValueError):
            parse_amount(text)
''')
LEDGER_TEST_IMPORTER = d('''
    from ledger.importer import balances, load

    CSV = """account,amount,memo
    rent,-950.00,march
    salary,2500.5,march
    rent,-950,april
    groceries,-63.4,week 1
    groceries,-20.15,week 2
    """


    def test_balances():
        assert balances(CSV) == {"groceries": -8355, "rent": -190000, "salary": 250050}


    def test_history_keeps_memos_in_order():
        assert load(CSV)["groceries"].history == [(-6340, "week 1"), (-2015, "week 2")]
''')
LEDGER_TEST_MORE = d('''
    import pytest

    from ledger.money import parse_amount


    @pytest.mark.parametrize("text, cents", [("0.5", 50), ("-0.1", -10), ("10.", 1000), ("3.07", 307)])
    def test_one_digit_and_empty_fractions(text, cents):
        assert parse_amount(text) == cents
''')
task(
    "code-019-fix-ledger-amounts",
    BUGFIX_PROMPT.format(package="ledger", what="Some account balances come out wrong."),
    setup_files={
        "tests/__init__.py": "",
        "ledger/__init__.py": "",
        "ledger/money.py": LEDGER_MONEY_BUGGY,
        "ledger/accounts.py": LEDGER_ACCOUNTS,
        "ledger/importer.py": LEDGER_IMPORTER,
        "tests/test_money.py": LEDGER_TEST_MONEY,
        "tests/test_importer.py": LEDGER_TEST_IMPORTER,
    },
    verifier_files={
        "tests/__init__.py": "",
        "tests/test_money.py": LEDGER_TEST_MONEY,
        "tests/test_importer.py": LEDGER_TEST_IMPORTER,
        "tests/test_money_more.py": LEDGER_TEST_MORE,
    },
    command=f"{PYTEST} tests/test_money.py tests/test_importer.py tests/test_money_more.py",
    solution=[
        step("Start from the failing tests.", shell("python3 -m pytest -q tests 2>&1 | tail -30")),
        step("Only the importer tests fail, on amounts like 2500.5 and -63.4, so the parsing in money.py is the suspect.",
             read("ledger/money.py")),
        step("'2500.5' gives 250005: a one-digit fraction is read as cents instead of tenths. Pad the fraction to two digits before converting.",
             write("ledger/money.py", LEDGER_MONEY_BUGGY.replace(
                 "(int(fraction) if fraction else 0)", "int(fraction.ljust(2, \"0\"))"))),
        step(None, shell("python3 -m pytest -q tests && python3 -c \"from ledger.money import parse_amount as p; print(p('2500.5'), p('-63.4'), p('10.'))\"")),
        step("Tests pass and 2500.5 -> 250050.", finish("Fixed ledger/money.py: parse_amount right-pads a one-digit fraction, so '2500.5' is 250050 cents, not 250005.")),
    ],
)

# -- 020 textkit: last token dropped ----------------------------------------------------------
TEXTKIT_TOKENS_BUGGY = d('''
    def tokens(text: str) -> list[str]:
        """Lower-cased words: maximal runs of letters and digits."""
        out: list[str] = []
        current: list[str] = []
        for ch in text:
            if ch.isalnum():
                current.append(ch.lower())
            elif current:
                out.append("".join(current))
                current = []
        return out
''')
TEXTKIT_STATS = d('''
    from collections import Counter

    from .tokens import tokens


    def word_counts(text: str) -> Counter:
        return Counter(tokens(text))


    def top(text: str, n: int) -> list[tuple[str, int]]:
        """The n most common words, by count and then alphabetically."""
        return sorted(word_counts(text).items(), key=lambda kv: (-kv[1], kv[0]))[:n]
''')
TEXTKIT_CLI = d('''
    import sys

    from .stats import top


    def main(argv: list[str]) -> int:
        n = int(argv[0]) if argv else 3
        for word, count in top(sys.stdin.read(), n):
            print(f"{count:>5} {word}")
        return 0


    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
''')
TEXTKIT_TEST_STATS = d('''
    from textkit.stats import top, word_counts


    def test_counts_ignore_case_and_punctuation():
        assert word_counts("Hello, hello! World.") == {"hello": 2, "world": 1}


    def test_top_words():
        assert top("to be or not to be", 2) == [("be", 2), ("to", 2)]


    def test_numbers_are_words():
        assert top("route 66, route 66", 1) == [("66", 2)]
''')
TEXTKIT_TEST_CLI = d('''
    import subprocess
    import sys


    def test_cli_reads_stdin():
        out = subprocess.run([sys.executable, "-m", "textkit.cli", "2"], input="b a b a c b", capture_output=True, text=True, check=True)
        assert out.stdout == "    3 b\\n    2 a\\n"
''')
TEXTKIT_TEST_MORE = d('''
    from textkit.tokens import tokens


    def test_tokens():
        assert tokens("One two") == ["one", "two"]
        assert tokens("x") == ["x"]
        assert tokens("") == []
        assert tokens("  trailing space  ") == ["trailing", "space"]
        assert tokens("Mixed-CASE text42") == ["mixed", "case", "text42"]
''')
task(
    "code-020-fix-textkit-tokens",
    BUGFIX_PROMPT.format(package="textkit", what="Word counts are off by one now and then."),
    setup_files={
        "tests/__init__.py": "",
        "textkit/__init__.py": "",
        "textkit/tokens.py": TEXTKIT_TOKENS_BUGGY,
        "textkit/stats.py": TEXTKIT_STATS,
        "textkit/cli.py": TEXTKIT_CLI,
        "tests/test_stats.py": TEXTKIT_TEST_STATS,
        "tests/test_cli.py": TEXTKIT_TEST_CLI,
    },
    verifier_files={
        "tests/__init__.py": "",
        "tests/test_stats.py": TEXTKIT_TEST_STATS,
        "tests/test_cli.py": TEXTKIT_TEST_CLI,
        "tests/test_tokens_more.py": TEXTKIT_TEST_MORE,
    },
    command=f"{PYTEST} tests/test_stats.py tests/test_cli.py tests/test_tokens_more.py",
    solution=[
        step("Run the tests and see which fail.", shell("python3 -m pytest -q tests 2>&1 | tail -30")),
        step("The counts miss one occurrence of the last word in each text; the tokenizer is the place to look.",
             read("textkit/tokens.py")),
        step("A word still being collected when the text ends is never appended. Flush it after the loop.",
             write("textkit/tokens.py", TEXTKIT_TOKENS_BUGGY.replace(
                 "            current = []\n    return out\n",
                 "            current = []\n    if current:\n        out.append(\"\".join(current))\n    return out\n"))),
        step(None, shell("python3 -m pytest -q tests && echo 'to be or not to be' | python3 -m textkit.cli 2")),
        step("Tests pass and the CLI counts both 'be's.", finish("Fixed textkit/tokens.py: the last word of the text was dropped when the text did not end with a separator; it is now flushed after the loop.")),
    ],
)

# -- 021 orders: mutable default argument shared between carts --------------------------------
ORDERS_LINES = d('''
    from dataclasses import dataclass


    @dataclass(frozen=True)
    class Line:
        sku: str
        quantity: int
        unit_cents: int

        @property
        def cents(self) -> int:
            return self.quantity * self.unit_cents
''')
ORDERS_CART_BUGGY = d('''
    from .lines import Line


    class Cart:
        def __init__(self, customer: str, lines: list[Line] = []):
            self.customer = customer
            self.lines = lines

        def add(self, sku: str, quantity: int, unit_cents: int) -> None:
            if quantity <= 0:
                raise ValueError("quantity must be positive")
            self.lines.append(Line(sku, quantity, unit_cents))

        def subtotal_cents(self) -> int:
            return sum(line.cents for line in self.lines)
''')
ORDERS_PRICING = d('''
    from .cart import Cart

    CODES = {"SAVE10": 10, "HALF": 50}
    FREE_SHIPPING_FROM = 5000
    SHIPPING_CENTS = 495


    def total_cents(cart: Cart, code: str | None = None) -> int:
        """Subtotal minus the code's percentage (rounded down to a cent), plus shipping below 50.00."""
        subtotal = cart.subtotal_cents()
        if code is not None:
            if code not in CODES:
                raise KeyError(f"unknown discount code {code!r}")
            subtotal -= subtotal * CODES[code] // 100
        shipping = 0 if subtotal >= FREE_SHIPPING_FROM or subtotal == 0 else SHIPPING_CENTS
        return subtotal + shipping
''')
ORDERS_TEST_CART = d('''
    import pytest

    from orders.cart import Cart


    def test_subtotal():
        cart = Cart("ana")
        cart.add("pen", 3, 150)
        cart.add("pad", 1, 400)
        assert cart.subtotal_cents() == 850


    def test_new_cart_is_empty():
        assert Cart("ben").lines == []


    def test_carts_are_independent():
        first, second = Cart("a"), Cart("b")
        first.add("pen", 1, 150)
        assert second.subtotal_cents() == 0


    def test_quantity_must_be_positive():
        with pytest.raises(ValueError):
            Cart("c").add("pen", 0, 150)
''')
ORDERS_TEST_PRICING = d('''
    import pytest

    from orders.cart import Cart
    from orders.pricing import total_cents


    def cart_with(*lines):
        cart = Cart("x")
        for sku, quantity, unit in lines:
            cart.add(sku, quantity, unit)
        return cart


    def test_shipping_below_threshold():
        assert total_cents(cart_with(("pen", 2, 150))) == 300 + 495


    def test_free_shipping_from_threshold():
        assert total_cents(cart_with(("lamp", 1, 5000))) == 5000


    def test_discount_code():
        assert total_cents(cart_with(("lamp", 1, 6001)), "SAVE10") == 6001 - 600


    def test_unknown_code():
        with pytest.raises(KeyError):
            total_cents(cart_with(("pen", 1, 150)), "BOGUS")


    def test_empty_cart_costs_nothing():
        assert total_cents(Cart("y")) == 0
''')
ORDERS_TEST_MORE = d('''
    from orders.cart import Cart
    from orders.lines import Line


    def test_lines_can_be_passed_in_and_are_not_shared():
        given = [Line("pen", 1, 150)]
        cart = Cart("a", given)
        cart.add("pad", 1, 400)
        assert cart.subtotal_cents() == 550
        assert Cart("b").lines == [] and Cart("c").lines == []


    def test_many_carts():
        carts = [Cart(str(i)) for i in range(3)]
        for i, cart in enumerate(carts):
            cart.add("pen", i + 1, 100)
        assert [c.subtotal_cents() for c in carts] == [100, 200, 300]
''')
task(
    "code-021-fix-orders-cart",
    BUGFIX_PROMPT.format(package="orders", what="Totals are right for the first cart but not always for the next ones."),
    setup_files={
        "tests/__init__.py": "",
        "orders/__init__.py": "",
        "orders/lines.py": ORDERS_LINES,
        "orders/cart.py": ORDERS_CART_BUGGY,
        "orders/pricing.py": ORDERS_PRICING,
        "tests/test_cart.py": ORDERS_TEST_CART,
        "tests/test_pricing.py": ORDERS_TEST_PRICING,
    },
    verifier_files={
        "tests/__init__.py": "",
        "tests/test_cart.py": ORDERS_TEST_CART,
        "tests/test_pricing.py": ORDERS_TEST_PRICING,
        "tests/test_cart_more.py": ORDERS_TEST_MORE,
    },
    command=f"{PYTEST} tests/test_cart.py tests/test_pricing.py tests/test_cart_more.py",
    solution=[
        step("Run the suite first.", shell("python3 -m pytest -q tests 2>&1 | tail -30")),
        step("Fresh carts already contain lines from earlier tests, so state leaks between Cart instances; check the constructor.",
             read("orders/cart.py")),
        step("The default `lines=[]` is one list shared by every Cart created without lines. Default to None and copy what is passed in.",
             write("orders/cart.py", ORDERS_CART_BUGGY.replace(
                 "    def __init__(self, customer: str, lines: list[Line] = []):\n        self.customer = customer\n        self.lines = lines\n",
                 "    def __init__(self, customer: str, lines: list[Line] | None = None):\n        self.customer = customer\n        self.lines = list(lines) if lines is not None else []\n"))),
        step(None, shell("python3 -m pytest -q tests")),
        step("All green.", finish("Fixed orders/cart.py: the mutable default `lines=[]` was shared by all carts; it now defaults to None and each cart gets its own list.")),
    ],
)
