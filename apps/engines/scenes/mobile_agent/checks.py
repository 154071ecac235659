"""The mobile_agent verifier: AndroidWorld-style checks on the device's state, all of which must pass.

    results = run_checks(scene_config["checks"], channel, answer=..., elements=...)

Every check reads the device through the same adbutils channel, on the simulator and on a device:

* `shell`: `{"type": "shell", "command": "settings get global wifi_on", "expect": {"in": ["1", "2"]}}`;
  `expect` is one of `equals`, `in` (a list), `regex` (a full match), `contains`; the output is
  stripped; `exit_code` (default 0) must match too. An empty or "any output" expectation is refused.
* `content`: `{"type": "content", "uri": "content://com.android.contacts/data/phones",
  "where": "display_name='张三'", "expect_rows": [{"number": "555-0101"}], "exact": false}`: each
  expected row (a subset of columns, compared as text) matches a different row of
  `content query`; `exact` also forbids other rows; `count` checks the number of rows.
* `ui`: `{"type": "ui", "resource_id" | "text" | "desc": "...", "attr": "checked", "expect": {"equals": true}}`
  on a fresh UI dump (the first element that matches); a missing element fails.
* `answer`: `{"type": "answer", "expected": "1332", "match": "exact" | "contains" | "number" | "regex"}`
  against the agent's `answer` (exact: case and surrounding space ignored; number: numeric
  equality within `tolerance`, default 1e-6).

A check that cannot be evaluated as written (unknown kind, no expectation, a bad regex) is a
CheckError: the task's configuration, reported as such, never as the agent's failure.
"""
from __future__ import annotations

import re
from typing import Any

from .device import DeviceChannel, parse_hierarchy

KINDS = ("shell", "content", "ui", "answer")
EXPECT_KEYS = ("equals", "in", "regex", "contains")
_ROW = re.compile(r"^Row: \d+ (.*)$")


class CheckError(ValueError):
    """The check cannot be evaluated as written."""


def _expect(expect: Any, value: Any, where: str) -> bool:
    if not isinstance(expect, dict) or len(set(expect) & set(EXPECT_KEYS)) != 1 or set(expect) - set(EXPECT_KEYS):
        raise CheckError(f"{where}: expect needs exactly one of {', '.join(EXPECT_KEYS)}, got {expect!r}")
    key, want = next((k, expect[k]) for k in EXPECT_KEYS if k in expect)
    text = _text(value)
    if key == "equals":
        return text == _text(want)
    if key == "in":
        if not isinstance(want, list) or not want:
            raise CheckError(f"{where}: expect.in must be a non-empty list")
        return text in [_text(w) for w in want]
    if key == "contains":
        if not str(want):
            raise CheckError(f"{where}: expect.contains must not be empty (that passes on any output)")
        return _text(want) in text
    try:
        return re.fullmatch(str(want), text, re.DOTALL) is not None
    except re.error as exc:
        raise CheckError(f"{where}: bad regex {want!r}: {exc}") from None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


def parse_rows(output: str) -> list[dict[str, str]]:
    """`content query` output as rows ("No result found." -> [])."""
    rows = []
    for line in output.splitlines():
        m = _ROW.match(line.strip())
        if not m:
            continue
        row: dict[str, str] = {}
        # Values may hold ", " themselves: split only before `name=`.
        for part in re.split(r", (?=[A-Za-z_][A-Za-z0-9_]*=)", m.group(1)):
            name, _, value = part.partition("=")
            row[name] = value
        rows.append(row)
    return rows


def _shell(check: dict[str, Any], channel: DeviceChannel, where: str) -> dict[str, Any]:
    command = check.get("command")
    if not isinstance(command, str) or not command.strip():
        raise CheckError(f"{where}: a shell check needs a command")
    if "expect" not in check:
        raise CheckError(f"{where}: a shell check needs expect (an output that passes on anything is no check)")
    result = channel.shell(command)
    want_code = int(check.get("exit_code", 0))
    ok = result.returncode == want_code and _expect(check["expect"], result.output, where)
    return {"passed": ok, "command": command, "output": result.output[:2000], "exit_code": result.returncode,
            "expect": check["expect"]}


def _content(check: dict[str, Any], channel: DeviceChannel, where: str) -> dict[str, Any]:
    uri = check.get("uri")
    if not isinstance(uri, str) or not uri.startswith("content://"):
        raise CheckError(f"{where}: a content check needs uri content://...")
    if "expect_rows" not in check and "count" not in check:
        raise CheckError(f"{where}: a content check needs expect_rows or count")
    argv = ["content", "query", "--uri", uri]
    if check.get("where"):
        argv += ["--where", str(check["where"])]
    result = channel.shell(argv)
    if result.returncode != 0 or "Error while accessing provider" in result.output:
        return {"passed": False, "uri": uri, "where": check.get("where", ""), "output": result.output[:2000],
                "exit_code": result.returncode, "reason": "the query failed"}
    rows = parse_rows(result.output)
    passed, reason = True, ""
    if "count" in check and len(rows) != int(check["count"]):
        passed, reason = False, f"{len(rows)} rows, expected {int(check['count'])}"
    expected = check.get("expect_rows")
    if passed and expected is not None:
        if not isinstance(expected, list) or not all(isinstance(r, dict) and r for r in expected):
            raise CheckError(f"{where}: expect_rows must be a list of non-empty objects")
        free = list(rows)
        for want in expected:
            hit = next((r for r in free if all(_text(r.get(k, "\0")) == _text(v) for k, v in want.items())), None)
            if hit is None:
                passed, reason = False, f"no row matches {want}"
                break
            free.remove(hit)
        if passed and check.get("exact") and free:
            passed, reason = False, f"{len(free)} other rows (exact)"
    out = {"passed": passed, "uri": uri, "where": check.get("where", ""), "rows": rows[:50]}
    if reason:
        out["reason"] = reason
    return out


def _ui(check: dict[str, Any], channel: DeviceChannel, where: str) -> dict[str, Any]:
    keys = [k for k in ("resource_id", "text", "desc") if check.get(k)]
    if len(keys) != 1:
        raise CheckError(f"{where}: a ui check names its element by exactly one of resource_id, text, desc")
    if not check.get("attr") or "expect" not in check:
        raise CheckError(f"{where}: a ui check needs attr and expect")
    key, wanted = keys[0], str(check[keys[0]])
    elements = parse_hierarchy(channel.dump())
    element = next((e for e in elements if (e.rid if key == "resource_id" else e.text if key == "text" else e.desc)
                    == wanted or (key == "resource_id" and e.short_id == wanted)), None)
    if element is None:
        return {"passed": False, key: wanted, "attr": check["attr"], "reason": "no such element on the screen"}
    try:
        value = element.attr(str(check["attr"]))
    except KeyError:
        raise CheckError(f"{where}: unknown attr {check['attr']!r}") from None
    return {"passed": _expect(check["expect"], value, where), key: wanted, "attr": check["attr"],
            "value": value, "element": element.record()}


def _answer(check: dict[str, Any], answer: str | None, where: str) -> dict[str, Any]:
    if "expected" not in check:
        raise CheckError(f"{where}: an answer check needs expected")
    expected, match = check["expected"], check.get("match") or "exact"
    given = (answer or "").strip()
    if answer is None:
        return {"passed": False, "expected": expected, "answer": None, "reason": "the agent gave no answer"}
    if match == "exact":
        ok = " ".join(given.lower().split()) == " ".join(str(expected).strip().lower().split())
    elif match == "contains":
        ok = str(expected).strip().lower() in given.lower()
    elif match == "number":
        numbers = re.findall(r"-?\d+(?:\.\d+)?", given.replace(",", ""))
        try:
            ok = len(numbers) == 1 and abs(float(numbers[0]) - float(expected)) <= float(check.get("tolerance", 1e-6))
        except (TypeError, ValueError):
            raise CheckError(f"{where}: expected {expected!r} is not a number") from None
    elif match == "regex":
        try:
            ok = re.fullmatch(str(expected), given, re.IGNORECASE | re.DOTALL) is not None
        except re.error as exc:
            raise CheckError(f"{where}: bad regex {expected!r}: {exc}") from None
    else:
        raise CheckError(f"{where}: match must be exact, contains, number or regex, got {match!r}")
    return {"passed": ok, "expected": expected, "match": match, "answer": given}


def run_checks(checks: Any, channel: DeviceChannel, *, answer: str | None) -> list[dict[str, Any]]:
    """Each check's result (`type`, `passed`, what it read); all run, in order."""
    if not isinstance(checks, list) or not checks:
        raise CheckError("scene_config.checks must be a non-empty list")
    results = []
    for n, check in enumerate(checks):
        where = f"checks[{n}]"
        if not isinstance(check, dict) or check.get("type") not in KINDS:
            raise CheckError(f"{where}: type must be one of {', '.join(KINDS)}")
        kind = check["type"]
        if kind == "shell":
            result = _shell(check, channel, where)
        elif kind == "content":
            result = _content(check, channel, where)
        elif kind == "ui":
            result = _ui(check, channel, where)
        else:
            result = _answer(check, answer, where)
        results.append({"type": kind, **result})
    return results
