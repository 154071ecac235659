"""RL sets by difficulty: each task's pass rate over its rollouts on the records, the rl / rl-verl
rows and the card; the filter spec keeps tasks by pass-rate band; dataset_stats shows the
distribution."""
from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command

from apps.datasets.exporters import export_records, load_records
from apps.datasets.exporters.records import task_pass_rates
from apps.datasets.services import FilterSpecError, dataset_version_create
from apps.datasets.spec import validate_filter_spec
from tests.datasets.version_data import export_dir, make_trajectory, no_dedup  # noqa: F401 (export_dir is a fixture)

pytestmark = pytest.mark.django_db

VERIFIER = {"files": {"test_main.py": "def test_ok():\n    assert True\n"}, "command": "python3 -m pytest -q"}


@pytest.fixture
def tasks(make_task: Any) -> dict[str, Any]:
    """always: 2 of 2 pass; half: 1 of 2 (and an error that is no rollout); never: 0 of 3; none:
    only an error."""
    out = {}
    for name, outcomes in {"always": ["success", "success"], "half": ["success", "failure", "error"],
                           "never": ["failure", "failure", "failure"], "none": ["error"]}.items():
        task = make_task(prompt=f"Solve the {name} task", scene_config={"verifier": VERIFIER})
        for i, outcome in enumerate(outcomes):
            make_trajectory(task, code=f"print('{name} {i}')", outcome=outcome, reward=1.0 if outcome == "success"
                            else 0.0, score=80)
        out[name] = task
    return out


def test_the_pass_rate_counts_successes_over_rollouts_that_succeeded_or_failed(tasks: dict[str, Any]) -> None:
    rates = task_pass_rates([t.pk for t in tasks.values()])
    assert rates[tasks["always"].pk] == {"rate": 1.0, "passed": 2, "rollouts": 2}
    assert rates[tasks["half"].pk] == {"rate": 0.5, "passed": 1, "rollouts": 2}
    assert rates[tasks["never"].pk] == {"rate": 0.0, "passed": 0, "rollouts": 3}
    assert tasks["none"].pk not in rates
    half = list(tasks["half"].trajectories.order_by("id").values_list("id", flat=True))
    [record, *_] = load_records(half)
    assert record["task"]["pass_rate"] == {"rate": 0.5, "passed": 1, "rollouts": 2}
    [none_record] = load_records(list(tasks["none"].trajectories.values_list("id", flat=True)))
    assert none_record["task"]["pass_rate"] == {"rate": None, "passed": 0, "rollouts": 0}


def test_rl_and_verl_rows_carry_the_pass_rate(tasks: dict[str, Any]) -> None:
    ids = list(tasks["half"].trajectories.exclude(outcome="error").order_by("id").values_list("id", flat=True))
    out = io.BytesIO()
    result = export_records("rl", load_records(ids), out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert result.excluded == [] and [r["pass_rate"] for r in rows] == [{"rate": 0.5, "passed": 1, "rollouts": 2}] * 2
    out = io.BytesIO()
    export_records("rl-verl", load_records(ids), out)
    [verl] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (verl["extra_info"]["pass_rate"], verl["extra_info"]["pass_count"], verl["extra_info"]["rollouts"]) == (
        0.5, 1, 2)


def test_a_pass_rate_band_keeps_the_tasks_neither_always_nor_never_solved(
        tasks: dict[str, Any], approver: Any) -> None:
    version = dataset_version_create(dataset_name="dapo", actor=approver,
                                     filter_spec=no_dedup(pass_rate={"gt": 0, "lt": 1}))
    members = set(version.members.values_list("trajectory__task_id", flat=True))
    assert members == {tasks["half"].pk}
    assert version.filter_spec["pass_rate"] == {"gt": 0.0, "lt": 1.0}
    reasons = {e["reason"] for e in version.data_card["excluded"]}
    assert "task pass rate 1 outside 0 < p < 1 (2 of 2 rollouts passed)" in reasons
    assert "task pass rate 0 outside 0 < p < 1 (0 of 3 rollouts passed)" in reasons
    assert version.data_card["excluded_reasons"]["task pass rate 0 outside 0 < p < 1"] == 3
    card = version.data_card["pass_rates"]
    assert card["tasks"] == {str(tasks["half"].pk): [1, 2]}
    assert (card["never"], card["always"], card["between"], card["unknown"]) == (0, 0, 1, 0)
    assert [b[2] for b in card["histogram"]["bins"]][5] == 1  # 0.5 in [0.5, 0.6)

    every = dataset_version_create(dataset_name="all-tasks", actor=approver, filter_spec=no_dedup())
    card = every.data_card["pass_rates"]
    assert (card["never"], card["always"], card["between"], card["unknown"]) == (1, 1, 1, 0)
    out = io.StringIO()
    call_command("dataset_stats", "all-tasks", stdout=out)
    text = out.getvalue()
    assert "task pass rates over their rollouts (3 tasks: never solved 1, always solved 1, in between 1" in text
    histogram = text.split("task pass rates over their rollouts")[1].splitlines()[1:11]
    assert [line.split()[-1] for line in histogram] == ["1", "0", "0", "0", "0", "1", "0", "0", "0", "1"]
    assert "rl-verl" in text.split("what each export format would write")[1]


@pytest.mark.parametrize("band, key, message", [
    ({"gt": 0, "gte": 0.1}, "pass_rate", "one lower bound"),
    ({"between": 1}, "pass_rate", "unknown bound(s) between"),
    ({"gt": 1.5}, "pass_rate.gt", "between 0 and 1"),
    ({"gt": 0.5, "lt": 0.5}, "pass_rate", "holds no pass rate"),
    ([0, 1], "pass_rate", "must be an object of bounds"),
])
def test_a_bad_band_is_refused_with_its_key(band: Any, key: str, message: str) -> None:
    with pytest.raises(FilterSpecError) as err:
        validate_filter_spec({"pass_rate": band})
    assert message in err.value.errors[key]
