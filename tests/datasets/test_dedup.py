"""Exact and near-duplicate dedup. The near-duplicate test uses the real bundled MiniLM model
(loading it takes seconds, so there is one such test, covering thresholds and earlier versions)."""
from __future__ import annotations

from typing import Any

import pytest

from apps.datasets import dedup
from apps.datasets.services import dataset_version_create, dataset_version_publish
from tests.datasets.version_data import episode, make_trajectory, no_dedup

pytestmark = pytest.mark.django_db

PRIMES = "Write a Python script that prints the first ten prime numbers."
PRIMES_REWORDED = "Write a python script which prints the first 10 prime numbers."
CSV = "Parse the CSV file sales.csv and print the sum of the second column."
LOOP = "primes=[];n=2\nwhile len(primes)<10:\n    if all(n%p for p in primes): primes.append(n)\n    n+=1\nprint(*primes)\n"
SYMPY = "import sympy\nprint(list(sympy.primerange(2, 30)))\n"


def _ids(version: Any) -> list[int]:
    return list(version.members.order_by("position").values_list("trajectory_id", flat=True))


def _reasons(version: Any) -> dict[int, str]:
    return {e["trajectory_id"]: e["reason"] for e in version.data_card["excluded"]}


def test_the_normalized_hash_ignores_call_ids_and_whitespace_but_not_content() -> None:
    a = episode(PRIMES, LOOP, id_prefix="call_")
    b = episode(PRIMES, LOOP.replace("\n", "  \n"), id_prefix="zz")
    b[2]["content"] = "  Writing   it. "
    c = episode(PRIMES, SYMPY)
    assert dedup.normalized_hash(a) == dedup.normalized_hash(b)
    assert dedup.normalized_hash(a) != dedup.normalized_hash(c)
    assert dedup.action_sequence(a).splitlines()[1] == "run_shell(command=python3 main.py)"


def test_exact_duplicates_keep_the_best_scored_member(make_task: Any, approver: Any) -> None:
    task = make_task(prompt=PRIMES)
    worse = make_trajectory(task, code=LOOP, score=60, id_prefix="a")
    better = make_trajectory(task, code=LOOP + " ", score=90, id_prefix="b")  # same after normalization
    other = make_trajectory(task, code=SYMPY, score=10)
    v = dataset_version_create(dataset_name="d", actor=approver, filter_spec=no_dedup())
    assert _ids(v) == [better.pk, other.pk]
    assert _reasons(v) == {worse.pk: f"exact duplicate of trajectory #{better.pk}"}
    assert v.data_card["dedup"]["exact_removed"] == 1 and v.counts["excluded_as_duplicates"] == 1
    off = dataset_version_create(dataset_name="d2", actor=approver,
                                 filter_spec={"dedup": {"exact": False, "near": False}})
    assert _ids(off) == [worse.pk, better.pk, other.pk]


def test_exact_duplicates_of_an_earlier_published_version_are_dropped(make_task: Any, approver: Any) -> None:
    task = make_task(prompt=PRIMES)
    first = make_trajectory(task, code=LOOP, score=60)
    v1 = dataset_version_publish(version=dataset_version_create(dataset_name="d", actor=approver,
                                                                filter_spec=no_dedup()), actor=approver)
    copy = make_trajectory(task, code=LOOP, score=99, id_prefix="again")
    v2 = dataset_version_create(dataset_name="d", actor=approver, filter_spec=no_dedup())
    # The published member stays even though the copy scores higher: versions stay stable.
    assert _ids(v1) == _ids(v2) == [first.pk]
    assert _reasons(v2)[copy.pk] == f"exact duplicate of trajectory #{first.pk} published in v1"
    # Another dataset has no earlier versions: the copy competes on score there.
    fresh = dataset_version_create(dataset_name="elsewhere", actor=approver, filter_spec=no_dedup())
    assert _ids(fresh) == [copy.pk]


def test_near_duplicates_with_the_bundled_model(make_task: Any, approver: Any) -> None:
    primes, reworded, csv = make_task(prompt=PRIMES), make_task(prompt=PRIMES_REWORDED), make_task(prompt=CSV)
    best = make_trajectory(primes, code=LOOP, score=90)
    near = make_trajectory(reworded, code=LOOP.replace("print(*primes)", "print(*primes) "), score=70, id_prefix="x")
    other_way = make_trajectory(primes, code=SYMPY, score=50, answer="2 3 5 7 11 13 17 19 23 29")
    other_task = make_trajectory(csv, code=LOOP, score=40)
    # The same actions (the code differs only past the skeleton's cut) with another outcome: a DPO partner.
    failed_twin = make_trajectory(primes, code=LOOP + "# " + "x" * 80, outcome="failure", reward=0.0, score=20,
                                  id_prefix="f")

    v = dataset_version_create(dataset_name="near", actor=approver, filter_spec={})  # default threshold 0.92
    assert set(_ids(v)) == {best.pk, other_way.pk, other_task.pk, failed_twin.pk}
    reason = _reasons(v)[near.pk]
    assert reason.startswith(f"near duplicate of trajectory #{best.pk} (prompt cosine 0.9")
    assert "threshold 0.92" in reason
    assert v.data_card["dedup"]["near_removed"] == 1
    assert v.data_card["dedup"]["model"] == "all-MiniLM-L6-v2"

    strict = dataset_version_create(dataset_name="strict", actor=approver, filter_spec={"dedup": {"threshold": 0.999}})
    assert set(_ids(strict)) == {best.pk, near.pk, other_way.pk, other_task.pk, failed_twin.pk}

    # Against an earlier published version: a near copy of a published member is dropped.
    dataset_version_publish(version=v, actor=approver)
    late = make_trajectory(reworded, code=LOOP, score=100, id_prefix="late")
    v2 = dataset_version_create(dataset_name="near", actor=approver, filter_spec={})
    assert late.pk not in _ids(v2) and best.pk in _ids(v2)
    assert "published in v1" in _reasons(v2)[late.pk]
