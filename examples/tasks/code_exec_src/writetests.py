from common import PYTEST, d, finish, read, shell, step, task, write

CHECKER = d('''
    """Grade the agent's {tests}: they must pass on the real {module} and on rewrites of it that
    behave the same (so they test behaviour, not source text), and fail on each mutant."""
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    HERE = Path(__file__).resolve().parent
    WORKSPACE = HERE.parent
    TESTS = "{tests}"
    MODULE = "{module}"
    EQUIVALENTS = {equivalents!r}
    MUTANTS = {mutants!r}


    def run_tests_against(implementation, directory):
        tests = WORKSPACE / TESTS
        assert tests.is_file(), f"{{TESTS}} was not written"
        shutil.copy(tests, directory / TESTS)
        shutil.copy(implementation, directory / MODULE)
        return subprocess.run(
            [sys.executable, "-I", "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
             "-c", "/dev/null", "--rootdir", str(directory), TESTS],
            cwd=directory, capture_output=True, text=True, timeout=60,
        )


    @pytest.fixture(scope="module")
    def real_run(tmp_path_factory):
        return run_tests_against(HERE / "real" / MODULE, tmp_path_factory.mktemp("real"))


    @pytest.fixture(scope="module")
    def equivalent_runs(tmp_path_factory):
        return {{name: run_tests_against(HERE / "equivalent" / name / MODULE, tmp_path_factory.mktemp(name))
                for name in EQUIVALENTS}}


    def test_they_pass_on_the_real_module(real_run):
        assert real_run.returncode == 0, real_run.stdout + real_run.stderr


    def test_there_are_at_least_{min_tests}_tests(real_run):
        passed = re.search(r"(\\d+) passed", real_run.stdout)
        assert passed and int(passed.group(1)) >= {min_tests}, real_run.stdout


    @pytest.mark.parametrize("name", EQUIVALENTS)
    def test_they_pass_on_an_equivalent_rewrite(name, equivalent_runs):
        assert equivalent_runs[name].returncode == 0, equivalent_runs[name].stdout + equivalent_runs[name].stderr


    @pytest.mark.parametrize("mutant", MUTANTS)
    def test_they_catch_the_mutant(mutant, real_run, equivalent_runs, tmp_path):
        # Tests that fail on a correct module would "catch" every mutant; they earn nothing here.
        assert real_run.returncode == 0, "the tests fail on the real module"
        assert all(run.returncode == 0 for run in equivalent_runs.values()), "the tests fail on an equivalent rewrite"
        result = run_tests_against(HERE / "mutants" / mutant / MODULE, tmp_path)
        # 1: tests ran and some failed. 0: the mutant slipped through; 2-5: the run itself broke.
        assert result.returncode == 1, f"mutant {{mutant}} not caught (exit {{result.returncode}})"
''')


CHECKER_DIR = "_verify"
CHECK_COMMAND = f"{PYTEST} {CHECKER_DIR}/check_tests.py"


def write_tests_task(external_id, prompt, *, module, real, equivalents, mutants, tests_name, solution, min_tests=3):
    for name, source in {**equivalents, **mutants}.items():
        assert source != real, f"{external_id}: variant {name} is identical to the real module"
    files = {f"{CHECKER_DIR}/check_tests.py": CHECKER.format(tests=tests_name, module=module, equivalents=sorted(equivalents),
                                                            mutants=sorted(mutants), min_tests=min_tests),
             f"{CHECKER_DIR}/real/{module}": real}
    for name, source in equivalents.items():
        files[f"{CHECKER_DIR}/equivalent/{name}/{module}"] = source
    for name, source in mutants.items():
        files[f"{CHECKER_DIR}/mutants/{name}/{module}"] = source
    task(
        external_id,
        prompt,
        setup_files={module: real},
        verifier_files=files,
        command=CHECK_COMMAND,
        solution=solution,
        timeout=120,
    )


def mutate(source, old, new):
    assert source.count(old) == 1, (old, source.count(old))
    return source.replace(old, new)


# -- 022 tests for a duration parser --------------------------------------------------------
DURATION = d(r'''
    """Durations written like 1d2h30m15s."""
    import re

    UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    ORDER = "dhms"
    PART = re.compile(r"(\d+)([dhms])")


    def parse_duration(text: str) -> int:
        """'1h30m' -> 5400 seconds.

        Parts are a whole number and a unit (d, h, m, s); each unit at most once, in the order
        d, h, m, s. Surrounding whitespace is ignored. Raises ValueError for an empty string,
        unknown units, repeated or out-of-order units, or anything left over.
        """
        text = text.strip()
        if not text:
            raise ValueError("empty duration")
        total, pos, last = 0, 0, -1
        for match in PART.finditer(text):
            if match.start() != pos:
                break
            rank = ORDER.index(match.group(2))
            if rank <= last:
                raise ValueError(f"unit {match.group(2)!r} repeated or out of order in {text!r}")
            last = rank
            total += int(match.group(1)) * UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            raise ValueError(f"not a duration: {text!r}")
        return total


    def format_duration(seconds: int) -> str:
        """5400 -> '1h30m'; zero parts are left out and 0 is '0s'. Raises ValueError if negative."""
        if seconds < 0:
            raise ValueError("negative duration")
        if seconds == 0:
            return "0s"
        parts = []
        for unit in ORDER:
            count, seconds = divmod(seconds, UNITS[unit])
            if count:
                parts.append(f"{count}{unit}")
        return "".join(parts)
''')
DURATION_REWRITE = d(r'''
    import re

    _SECONDS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    _FORM = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


    def parse_duration(text):
        """Same behaviour as the original, written as one full-match regex."""
        text = text.strip()
        match = _FORM.fullmatch(text)
        if not text or match is None:
            raise ValueError("invalid duration " + repr(text))
        return sum(int(group) * size for group, (_, size) in zip(match.groups(), _SECONDS) if group)


    def format_duration(seconds):
        if seconds < 0:
            raise ValueError("negative")
        parts = []
        for unit, size in _SECONDS:
            if seconds >= size:
                parts.append(str(seconds // size) + unit)
                seconds %= size
        return "".join(parts) or "0s"
''')
write_tests_task(
    "code-022-write-tests-duration",
    """duration.py (already here) provides parse_duration(text) and format_duration(seconds);
    their docstrings are the specification. Write pytest tests for it in test_duration.py, importing
    from duration. Your tests are graded by running them against the module as given and against a
    rewrite of it that behaves the same, where they must all pass (so test behaviour, not source
    text), and against several subtly broken variants, each of which they should catch, so cover
    every documented behaviour, error cases included. Write at least 3 tests and
    do not modify duration.py.""",
    module="duration.py",
    real=DURATION,
    tests_name="test_duration.py",
    equivalents={"one_regex": DURATION_REWRITE},
    mutants={
        "hour_length": mutate(DURATION, '"h": 3600', '"h": 360'),
        "repeated_units": mutate(DURATION, "if rank <= last:", "if rank < last:"),
        "leftovers": mutate(DURATION, "    if pos != len(text):\n        raise", "    if pos == 0:\n        raise"),
        "zero": mutate(DURATION, '        return "0s"\n', '        return ""\n'),
    },
    solution=[
        step("Read the module and its documented behaviour.", read("duration.py")),
        step("Test each rule: unit values, combinations, whitespace, every error case of parse_duration, and format_duration including 0, skipped zero parts and negatives.",
             write("test_duration.py", d('''
                import pytest

                from duration import format_duration, parse_duration


                @pytest.mark.parametrize("text, seconds", [
                    ("15s", 15), ("2m", 120), ("1h", 3600), ("1d", 86400),
                    ("1h30m", 5400), ("1d2h3m4s", 93784), ("  45m  ", 2700), ("0s", 0), ("90m", 5400),
                ])
                def test_parse(text, seconds):
                    assert parse_duration(text) == seconds


                @pytest.mark.parametrize("text", [
                    "", "   ", "10", "5x", "1h1h", "30m1h", "1s2m", "1h 30m", "1h30mfoo", "h", "-5s", "abc",
                ])
                def test_parse_rejects(text):
                    with pytest.raises(ValueError):
                        parse_duration(text)


                @pytest.mark.parametrize("seconds, text", [
                    (0, "0s"), (59, "59s"), (60, "1m"), (3600, "1h"), (5400, "1h30m"), (86400, "1d"), (93784, "1d2h3m4s"), (86401, "1d1s"),
                ])
                def test_format(seconds, text):
                    assert format_duration(seconds) == text


                def test_format_rejects_negative():
                    with pytest.raises(ValueError):
                        format_duration(-1)


                @pytest.mark.parametrize("seconds", [0, 1, 61, 3599, 3600, 90061, 172800])
                def test_round_trip(seconds):
                    assert parse_duration(format_duration(seconds)) == seconds
             '''))),
        step("They must all pass on the real module.", shell("python3 -m pytest -q test_duration.py")),
        step("All pass. Now the grading check the task runs after finish.", shell(CHECK_COMMAND)),
        step("They pass on the real module and its rewrite and catch every mutant.", finish("test_duration.py covers parsing of every unit and combination, all documented parse errors, formatting (0s, skipped zero parts, negatives) and the round trip.")),
    ],
)

# -- 023 tests for a bank account -----------------------------------------------------------
ACCOUNT = d('''
    """A bank account that keeps integer cents and a history of what happened."""


    class InsufficientFunds(Exception):
        pass


    class Account:
        def __init__(self, owner: str, balance: int = 0):
            if balance < 0:
                raise ValueError("opening balance must not be negative")
            self.owner = owner
            self.balance = balance
            self.history: list[tuple[str, int]] = []

        def deposit(self, cents: int) -> None:
            """Add a positive amount; ValueError if cents <= 0. Records ("deposit", cents)."""
            if cents <= 0:
                raise ValueError("deposit must be positive")
            self.balance += cents
            self.history.append(("deposit", cents))

        def withdraw(self, cents: int) -> None:
            """Take a positive amount out; ValueError if cents <= 0, InsufficientFunds (and no
            change at all) if it exceeds the balance. Withdrawing the whole balance is allowed.
            Records ("withdraw", cents)."""
            if cents <= 0:
                raise ValueError("withdrawal must be positive")
            if cents > self.balance:
                raise InsufficientFunds(f"{self.owner}: balance {self.balance}, asked {cents}")
            self.balance -= cents
            self.history.append(("withdraw", cents))

        def transfer(self, other: "Account", cents: int) -> None:
            """Move cents to other, all or nothing: withdraw here (which may raise, changing
            neither account), then deposit there. Records ("transfer_out", cents) here and
            ("transfer_in", cents) on other, instead of withdraw/deposit entries."""
            if cents <= 0:
                raise ValueError("transfer must be positive")
            if cents > self.balance:
                raise InsufficientFunds(f"{self.owner}: balance {self.balance}, asked {cents}")
            self.balance -= cents
            other.balance += cents
            self.history.append(("transfer_out", cents))
            other.history.append(("transfer_in", cents))
''')
ACCOUNT_REWRITE = d('''
    class InsufficientFunds(Exception):
        pass


    class Account:
        """Same behaviour as the original, with the checks in helpers."""

        def __init__(self, owner, balance=0):
            if balance < 0:
                raise ValueError("negative opening balance")
            self.owner, self.balance, self.history = owner, balance, []

        @staticmethod
        def _positive(cents):
            if not cents > 0:
                raise ValueError("amount must be positive: %r" % (cents,))

        def _covered(self, cents):
            self._positive(cents)
            if self.balance - cents < 0:
                raise InsufficientFunds("not enough money")

        def _book(self, kind, cents):
            self.balance += -cents if kind in ("withdraw", "transfer_out") else cents
            self.history.append((kind, cents))

        def deposit(self, cents):
            self._positive(cents)
            self._book("deposit", cents)

        def withdraw(self, cents):
            self._covered(cents)
            self._book("withdraw", cents)

        def transfer(self, other, cents):
            self._covered(cents)
            self._book("transfer_out", cents)
            other._book("transfer_in", cents)
''')
write_tests_task(
    "code-023-write-tests-account",
    """account.py (already here) implements a bank Account with deposit, withdraw and transfer
    and an InsufficientFunds exception; the docstrings are the specification. Write pytest tests
    for it in test_account.py, importing from account. They are graded by running them against
    the module as given and against a rewrite of it that behaves the same, where they must all
    pass (so test behaviour, not source text), and against several subtly broken variants, each
    of which they should catch, so test every documented rule, including balances after
    failed operations and the exact history entries. Write at least 3 tests and do not modify
    account.py.""",
    module="account.py",
    real=ACCOUNT,
    tests_name="test_account.py",
    equivalents={"helpers": ACCOUNT_REWRITE},
    mutants={
        "exact_balance": mutate(ACCOUNT, "        if cents > self.balance:\n            raise InsufficientFunds(f\"{self.owner}: balance {self.balance}, asked {cents}\")\n        self.balance -= cents\n        self.history.append((\"withdraw\"",
                                "        if cents >= self.balance:\n            raise InsufficientFunds(f\"{self.owner}: balance {self.balance}, asked {cents}\")\n        self.balance -= cents\n        self.history.append((\"withdraw\""),
        "zero_deposit": mutate(ACCOUNT, "if cents <= 0:\n            raise ValueError(\"deposit", "if cents < 0:\n            raise ValueError(\"deposit"),
        "not_atomic": mutate(ACCOUNT, "        if cents > self.balance:\n            raise InsufficientFunds(f\"{self.owner}: balance {self.balance}, asked {cents}\")\n        self.balance -= cents\n        other.balance += cents",
                             "        other.balance += cents\n        if cents > self.balance:\n            raise InsufficientFunds(f\"{self.owner}: balance {self.balance}, asked {cents}\")\n        self.balance -= cents"),
        "history": mutate(ACCOUNT, 'other.history.append(("transfer_in", cents))', 'other.history.append(("deposit", cents))'),
    },
    solution=[
        step("Read the specification in the docstrings.", read("account.py")),
        step("One test per rule: opening balance, deposits, withdrawals up to and beyond the balance, atomic transfers and the exact history.",
             write("test_account.py", d('''
                import pytest

                from account import Account, InsufficientFunds


                def test_opening_balance():
                    assert Account("ana").balance == 0
                    assert Account("ana", 500).balance == 500
                    with pytest.raises(ValueError):
                        Account("ana", -1)


                def test_deposit():
                    account = Account("ana")
                    account.deposit(250)
                    account.deposit(1)
                    assert account.balance == 251
                    assert account.history == [("deposit", 250), ("deposit", 1)]


                @pytest.mark.parametrize("cents", [0, -5])
                def test_non_positive_amounts_are_rejected(cents):
                    account = Account("ana", 100)
                    for operation in (account.deposit, account.withdraw, lambda c: account.transfer(Account("ben"), c)):
                        with pytest.raises(ValueError):
                            operation(cents)
                    assert account.balance == 100 and account.history == []


                def test_withdraw():
                    account = Account("ana", 1000)
                    account.withdraw(300)
                    assert account.balance == 700
                    assert account.history == [("withdraw", 300)]


                def test_withdraw_whole_balance():
                    account = Account("ana", 700)
                    account.withdraw(700)
                    assert account.balance == 0


                def test_overdraft_changes_nothing():
                    account = Account("ana", 100)
                    with pytest.raises(InsufficientFunds):
                        account.withdraw(101)
                    assert account.balance == 100 and account.history == []


                def test_transfer():
                    ana, ben = Account("ana", 1000), Account("ben", 50)
                    ana.transfer(ben, 400)
                    assert (ana.balance, ben.balance) == (600, 450)
                    assert ana.history == [("transfer_out", 400)]
                    assert ben.history == [("transfer_in", 400)]


                def test_transfer_whole_balance():
                    ana, ben = Account("ana", 80), Account("ben")
                    ana.transfer(ben, 80)
                    assert (ana.balance, ben.balance) == (0, 80)


                def test_failed_transfer_changes_neither_account():
                    ana, ben = Account("ana", 100), Account("ben", 5)
                    with pytest.raises(InsufficientFunds):
                        ana.transfer(ben, 500)
                    assert (ana.balance, ben.balance) == (100, 5)
                    assert ana.history == [] and ben.history == []
             '''))),
        step(None, shell("python3 -m pytest -q test_account.py")),
        step("All pass against the given module; run the grading check as well.", shell(CHECK_COMMAND)),
        step("Every check passes, mutants included.", finish("test_account.py tests opening balances, deposits, withdrawals (exact balance allowed, overdraft refused without changes), atomic transfers and the history entries.")),
    ],
)

# -- 024 tests for an ISBN module -----------------------------------------------------------
ISBN = d('''
    """ISBN-10 validation and conversion to ISBN-13."""


    def _digits(isbn: str) -> str:
        return isbn.replace("-", "").replace(" ", "")


    def is_valid_isbn10(isbn: str) -> bool:
        """True for a valid ISBN-10. Hyphens and spaces are ignored. After removing them there must
        be 10 characters: nine digits and a last character that is a digit or X (value 10,
        uppercase only); the weighted sum 10*d1 + 9*d2 + ... + 1*d10 must be divisible by 11."""
        chars = _digits(isbn)
        if len(chars) != 10 or not chars[:9].isdigit() or not (chars[9].isdigit() or chars[9] == "X"):
            return False
        values = [int(c) for c in chars[:9]] + [10 if chars[9] == "X" else int(chars[9])]
        return sum(weight * value for weight, value in zip(range(10, 0, -1), values)) % 11 == 0


    def isbn10_to_13(isbn: str) -> str:
        """The ISBN-13 (13 digits, no hyphens) of a valid ISBN-10: "978" + its first nine digits +
        a check digit making the sum of the digits weighted 1, 3, 1, 3, ... divisible by 10.
        Raises ValueError for an invalid ISBN-10."""
        if not is_valid_isbn10(isbn):
            raise ValueError(f"invalid ISBN-10: {isbn!r}")
        body = "978" + _digits(isbn)[:9]
        total = sum((3 if i % 2 else 1) * int(c) for i, c in enumerate(body))
        return body + str((10 - total % 10) % 10)
''')
ISBN_REWRITE = d('''
    def _clean(isbn):
        return "".join(ch for ch in isbn if ch not in "- ")


    def is_valid_isbn10(isbn):
        """Same behaviour as the original, written with unpacking and an explicit loop."""
        chars = _clean(isbn)
        if len(chars) != 10:
            return False
        *body, check = chars
        if not all(ch.isdigit() for ch in body) or not (check.isdigit() or check == "X"):
            return False
        total = 0
        for position, ch in enumerate(chars):
            total += (10 - position) * (10 if ch == "X" else int(ch))
        return total % 11 == 0


    def isbn10_to_13(isbn):
        if not is_valid_isbn10(isbn):
            raise ValueError("invalid ISBN-10")
        body = "978" + _clean(isbn)[:9]
        weighted = sum(int(ch) * (1, 3)[i % 2] for i, ch in enumerate(body))
        return body + str(-weighted % 10)
''')
write_tests_task(
    "code-024-write-tests-isbn",
    """isbn.py (already here) provides is_valid_isbn10(isbn) and isbn10_to_13(isbn); the
    docstrings are the specification. Write pytest tests for it in test_isbn.py, importing from
    isbn. They are graded by running them against the module as given and against a rewrite of it
    that behaves the same, where they must all pass (so test behaviour, not source text), and
    against several subtly broken variants, each of which they should catch, so cover every
    documented rule with valid and invalid examples. Write at least 3 tests and do not
    modify isbn.py.""",
    module="isbn.py",
    real=ISBN,
    tests_name="test_isbn.py",
    equivalents={"unpacked": ISBN_REWRITE},
    mutants={
        "modulus": mutate(ISBN, "% 11 == 0", "% 10 == 0"),
        "x_anywhere": mutate(ISBN, 'not chars[:9].isdigit()', 'not chars[:9].replace("X", "0").isdigit()'),
        "hyphens": mutate(ISBN, 'return isbn.replace("-", "").replace(" ", "")', 'return isbn.replace(" ", "")'),
        "prefix": mutate(ISBN, 'body = "978" +', 'body = "979" +'),
    },
    solution=[
        step("Read the module's rules.", read("isbn.py")),
        step("Use well-known ISBNs (with hyphens, spaces and an X check digit), near misses, a lowercase x, X in the wrong place, and conversions to ISBN-13.",
             write("test_isbn.py", d('''
                import pytest

                from isbn import is_valid_isbn10, isbn10_to_13


                @pytest.mark.parametrize("isbn", ["0306406152", "0-306-40615-2", "0 306 40615 2", "080442957X", "0-8044-2957-X", "1843560283"])
                def test_valid(isbn):
                    assert is_valid_isbn10(isbn)


                @pytest.mark.parametrize("isbn", [
                    "0306406153",   # wrong check digit
                    "0306406150",   # divisible by 10 but not by 11
                    "080442957x",   # lowercase x
                    "08044X9575",   # X before the last position
                    "030640615",    # too short
                    "03064061522",  # too long
                    "03064O6152",   # a letter O
                    "",
                ])
                def test_invalid(isbn):
                    assert not is_valid_isbn10(isbn)


                @pytest.mark.parametrize("isbn10, isbn13", [
                    ("0306406152", "9780306406157"),
                    ("0-306-40615-2", "9780306406157"),
                    ("080442957X", "9780804429573"),
                    ("1843560283", "9781843560289"),
                ])
                def test_to_13(isbn10, isbn13):
                    assert isbn10_to_13(isbn10) == isbn13


                def test_to_13_rejects_invalid():
                    with pytest.raises(ValueError):
                        isbn10_to_13("0306406153")
             '''))),
        step(None, shell("python3 -m pytest -q test_isbn.py")),
        step("Green. Also run the check the task is graded with.", shell(CHECK_COMMAND)),
        step("All checks pass.", finish("test_isbn.py covers valid ISBN-10s (hyphens, spaces, X), invalid ones (check digit, modulus, lowercase/misplaced X, length, letters) and conversion to ISBN-13.")),
    ],
)
