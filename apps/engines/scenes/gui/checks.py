"""The gui scene's verifier: one check kind per way a web task can be judged, run by the platform after finish.

    reward, details = run_check(check, Probe(...))

A check is an object with a `type` (or a list of them: all must pass, the reward is their
product). Each evaluator reads the final page only through the platform-only browser tools
(`probe.evaluate`), the site's state file (`probe.site_state`) or the final answer:

* `miniwob`: 1.0 when MiniWoB's raw reward (`WOB_RAW_REWARD_GLOBAL`, not time-discounted) is
  1.0, else 0.0: MiniWoB's binary success (a partial credit such as click-checkboxes' 0.33 for
  one box of three wrong is not success); `partial_credit: true` makes the reward the raw value
  clipped to [0, 1] (for RL; still a success only at 1.0). The raw value and the task's reason
  (`WOB_REWARD_REASON`) are kept in the details either way.
* `js`: `{"predicate": "<JS expression>"}` evaluated on the final page; truthy passes.
* `url`: WebArena's URLEvaluator: `reference_url` (alternatives joined by " |OR| "),
  `url_note` "GOLD in PRED" (the default: a reference's host+path is contained in the final
  URL's, and every reference query parameter has one of its values there) or "EXACT".
* `program_html`: WebArena's HTMLContentEvaluator: `program_html: [{url: "last" | URL,
  locator: "" (the page's text) | "document.…" JS | "func:…" (refused: WebArena-specific),
  required_contents: {exact_match: str} | {must_include: [str, …]}}]`, every target must pass;
  a must_include item may hold alternatives joined by " |OR| ".
* `answer`: the final answer against `expected`: `match` exact (WebArena's clean: lower case,
  stripped, quotes dropped), contains, or must_include (`expected` a list).
* `site_state`: `assertions: [{path: "orders.-1.total", op: eq|ne|contains|len|gte|lte|exists|absent,
  value}]` on the bundled site's state file; all must pass.

A check that cannot run (an unknown kind, a bad path, a locator that throws) is a CheckError:
the runtime reports it as the task's configuration error, never as the agent's failure.

Process conditions (verifier_output["process"], the shared shape of docs/reviews.md), from the
browser's `page_facts` before any check runs, and from the checks' details after:

* `task_page` (miniwob): the final page is the task's own start page and still the document the
  platform started (its per-episode token): a reward read from any other page never counts.
* `no_injected_reward` (miniwob, site: the bundled pages, whose policy is ours): the page's
  Content-Security-Policy refused no script the agent put into it (markup typed into a page
  that renders it).
* `completed` (miniwob): MiniWoB's raw reward is 1.0; `relaxed` when the check asks for
  `partial_credit` (the reward is then the raw value, the condition still reported).

A failed task_page or no_injected_reward condition makes the reward 0 without reading the page.
"""
from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

KINDS = ("miniwob", "js", "url", "program_html", "answer", "site_state")
OR = " |OR| "
OPS = ("eq", "ne", "contains", "len", "gte", "lte", "exists", "absent")


class CheckError(ValueError):
    """The check cannot be evaluated (its definition or the page it needs); not the agent's fault."""


@dataclass
class Probe:
    """What a check may read of the finished episode."""

    final_answer: str
    url: str
    evaluate: Callable[[str, str | None], Any]  # (JS expression, URL to open first or None) -> value
    site_state: Callable[[], dict[str, Any]]


def run_check(check: Any, probe: Probe) -> tuple[float, dict[str, Any]]:
    """(reward, details) of a check or a list of checks (all must pass)."""
    if isinstance(check, list):
        if not check:
            raise CheckError("an empty list of checks")
        results = [run_check(c, probe) for c in check]
        reward = 1.0
        for r, _ in results:
            reward *= r
        return reward, {"type": "all", "checks": [d for _, d in results]}
    if not isinstance(check, dict) or check.get("type") not in KINDS:
        raise CheckError(f"a check needs a type among {', '.join(KINDS)}, got {check!r}")
    kind = check["type"]
    result, details = globals()[f"_{kind}"](check, probe)  # passed (bool), or a reward in [0, 1]
    reward = float(result) if not isinstance(result, bool) else (1.0 if result else 0.0)
    return reward, {"type": kind, "passed": reward == 1.0, **details}


def _miniwob(check: dict[str, Any], probe: Probe) -> tuple[bool | float, dict[str, Any]]:
    partial = check.get("partial_credit", False)
    if not isinstance(partial, bool):
        raise CheckError(f"a miniwob check's partial_credit is true or false, got {partial!r}")
    value = probe.evaluate("({raw: WOB_RAW_REWARD_GLOBAL, reward: WOB_REWARD_GLOBAL, reason: WOB_REWARD_REASON,"
                           " done: WOB_DONE_GLOBAL})", None)
    if not isinstance(value, dict):
        raise CheckError(f"the page has no MiniWoB reward globals (got {value!r})")
    raw = float(value.get("raw") or 0)
    details = {"raw_reward": raw, "reward": value.get("reward"), "reason": value.get("reason"),
               "done": bool(value.get("done")), "partial_credit": partial}
    return (min(max(raw, 0.0), 1.0) if partial else raw == 1.0), details


def _js(check: dict[str, Any], probe: Probe) -> tuple[bool, dict[str, Any]]:
    predicate = check.get("predicate")
    if not isinstance(predicate, str) or not predicate.strip():
        raise CheckError("a js check needs a predicate (a JavaScript expression)")
    value = probe.evaluate(predicate, None)
    return bool(value), {"value": value}


def clean_url(url: str) -> str:
    return str(url).rstrip("/")


def _parse_url(url: str) -> tuple[str, dict[str, list[str]]]:
    parts = urlparse(url)
    return parts.netloc + parts.path, parse_qs(parts.query)


def url_match(pred: str, reference: str, note: str = "GOLD in PRED") -> bool:
    """WebArena's URLEvaluator on one final URL."""
    pred = clean_url(pred)
    refs = [clean_url(u) for u in reference.split(OR)]
    if note == "EXACT":
        return pred in refs
    if note != "GOLD in PRED":
        raise CheckError(f"url_note must be 'GOLD in PRED' or 'EXACT', got {note!r}")
    pred_base, pred_query = _parse_url(pred)
    ref_bases: list[str] = []
    ref_queries: dict[str, set[str]] = collections.defaultdict(set)
    for ref in refs:
        base, query = _parse_url(ref)
        ref_bases.append(base)
        for key, values in query.items():
            ref_queries[key].update(values)
    if not any(base in pred_base for base in ref_bases):
        return False
    return all(any(v in pred_query.get(key, []) for v in values) for key, values in ref_queries.items())


def _url(check: dict[str, Any], probe: Probe) -> tuple[bool, dict[str, Any]]:
    reference = check.get("reference_url")
    if not isinstance(reference, str) or not reference:
        raise CheckError("a url check needs reference_url")
    note = check.get("url_note") or "GOLD in PRED"
    return url_match(probe.url, reference, note), {"url": probe.url, "reference_url": reference, "url_note": note}


def clean_answer(text: Any) -> str:
    """WebArena's StringEvaluator.clean_answer: stripped, quotes dropped, lower case."""
    text = str(text).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text.lower()


def must_include(reference: str, pred: str) -> bool:
    return any(clean_answer(alt) in clean_answer(pred) for alt in str(reference).split(OR))


def _program_html(check: dict[str, Any], probe: Probe) -> tuple[bool, dict[str, Any]]:
    targets = check.get("program_html")
    if not isinstance(targets, list) or not targets:
        raise CheckError("a program_html check needs program_html: a list of targets")
    results = []
    for target in targets:
        url = target.get("url") or "last"
        locator = (target.get("locator") or "").strip()
        required = target.get("required_contents") or {}
        if locator.startswith("func:"):
            raise CheckError(f"locator {locator!r}: WebArena's func: helpers need its sites; use a document.… expression")
        expression = locator or "document.body.outerText"
        value = probe.evaluate(expression, None if url == "last" else url)
        selected = "" if value is None else (value if isinstance(value, str) else json.dumps(value))
        if "exact_match" in required:
            ok = clean_answer(selected) == clean_answer(required["exact_match"])
        elif "must_include" in required:
            items = required["must_include"]
            items = [items] if isinstance(items, str) else list(items)
            ok = all(must_include(item, selected) for item in items)
        else:
            raise CheckError(f"required_contents needs exact_match or must_include, got {required!r}")
        results.append({"url": url, "locator": locator, "passed": ok, "selected": selected[:500]})
    return all(r["passed"] for r in results), {"targets": results}


def _answer(check: dict[str, Any], probe: Probe) -> tuple[bool, dict[str, Any]]:
    expected = check.get("expected")
    match = check.get("match") or "exact"
    answer = probe.final_answer
    if match == "exact":
        ok = clean_answer(answer) == clean_answer(expected)
    elif match == "contains":
        ok = clean_answer(expected) in clean_answer(answer)
    elif match == "must_include":
        items = [expected] if isinstance(expected, str) else list(expected or [])
        ok = bool(items) and all(must_include(item, answer) for item in items)
    else:
        raise CheckError(f"an answer check's match is exact, contains or must_include, got {match!r}")
    return ok, {"expected": expected, "match": match, "answer": answer[:500]}


_MISSING = object()


def resolve(state: Any, path: str) -> Any:
    """The value at a dotted path ("orders.-1.items.0.sku"), or _MISSING."""
    value = state
    for part in [p for p in str(path).split(".") if p != ""]:
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and re.fullmatch(r"-?\d+", part):
            index = int(part)
            value = value[index] if -len(value) <= index < len(value) else _MISSING
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def assertion(state: Any, item: dict[str, Any]) -> tuple[bool, Any]:
    op = item.get("op") or "eq"
    if op not in OPS:
        raise CheckError(f"assertion op must be one of {', '.join(OPS)}, got {op!r}")
    value = resolve(state, item.get("path", ""))
    if op == "absent":
        return value is _MISSING, None
    if value is _MISSING:
        return False, None
    expected = item.get("value")
    if op == "exists":
        ok = True
    elif op == "eq":
        ok = value == expected
    elif op == "ne":
        ok = value != expected
    elif op == "contains":
        ok = (expected in value) if isinstance(value, (list, str)) else False
    elif op == "len":
        ok = isinstance(value, (list, dict, str)) and len(value) == expected
    else:
        try:
            ok = value >= expected if op == "gte" else value <= expected
        except TypeError:
            ok = False
    return ok, value


def _site_state(check: dict[str, Any], probe: Probe) -> tuple[bool, dict[str, Any]]:
    items = check.get("assertions")
    if not isinstance(items, list) or not items:
        raise CheckError("a site_state check needs assertions: a list of {path, op, value}")
    state = probe.site_state()
    results = []
    for item in items:
        ok, actual = assertion(state, item)
        results.append({**item, "passed": ok, "actual": actual})
    return all(r["passed"] for r in results), {"assertions": results}


def _condition(ok: bool, detail: str, relaxed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": bool(ok), "detail": "" if ok else detail[:290]}
    if relaxed:
        out["relaxed"] = True
    return out


def process_conditions(source: str, facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The conditions read off the browser's page facts, before a check runs."""
    out: dict[str, dict[str, Any]] = {}
    if source == "miniwob":
        own = bool(facts.get("task_page")) and facts.get("started_page") is True
        out["task_page"] = _condition(own, f"the final page {facts.get('url')!r} is not the task's page the "
                                           "platform started (another page, or the page reloaded)")
    if source not in ("miniwob", "site"):  # an external site's own policy says nothing about the agent
        return out
    blocked = list(facts.get("blocked_scripts") or [])
    out["no_injected_reward"] = _condition(not blocked, f"the page refused {len(blocked)} script(s) put into it: "
                                                        f"{blocked[0] if blocked else ''}")
    return out


def completion_conditions(details: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`completed` for each miniwob check in the details (a list's parts too)."""
    parts = [d for d in (details.get("checks") or [details]) if d.get("type") == "miniwob"]
    if not parts:
        return {}
    incomplete = [d for d in parts if d.get("raw_reward") != 1.0]
    detail = (f"MiniWoB's raw reward is {incomplete[0].get('raw_reward')} (success is 1.0)" if incomplete else "")
    return {"completed": _condition(not incomplete, detail, relaxed=any(d.get("partial_credit") for d in incomplete))}
