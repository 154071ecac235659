"""dpo-step-trl: step-level preference pairs at the first divergence of two rollouts of one task."""
from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from apps.datasets import templates
from apps.datasets.exporters import export_records, load_records, validate_line
from tests.datasets.exporter_data import failing_episode, make_review, make_trajectory, rich_episode

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).parent / "chat_templates"


def run(ids: list[int], **options: Any) -> tuple[list[dict[str, Any]], Any]:
    out = io.BytesIO()
    result = export_records("dpo-step-trl", load_records(ids), out, options=options or None)
    return [orjson.loads(line) for line in out.getvalue().splitlines()], result


def diverging_late(prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rich episode up to the failed command, then a different fix (same call ids as sample 0)."""
    messages, steps = rich_episode("i1s0_")
    messages[7] = {"role": "assistant", "content": "I give up."}
    del messages[8:]
    return messages, steps[:3]


def test_pairs_start_where_two_rollouts_of_a_task_diverge(make_task: Any) -> None:
    task = make_task(prompt="Écris primes.py ✓")
    good = make_trajectory(task)
    bad = make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, episode=diverging_late)
    make_review(good, overall=90)
    other = make_trajectory(task, sample_index=2, outcome="failure", reward=0.2, episode=failing_episode)
    lines, result = run([good.pk, bad.pk, other.pk])

    assert len(lines) == 2, result.excluded
    late, early = sorted(lines, key=lambda line: -line["metadata"]["shared_prefix_messages"])
    # The shared prefix runs through two assistant turns and their tool results.
    assert late["metadata"] == {"task_id": task.pk, "chosen_trajectory_id": good.pk, "rejected_trajectory_id": bad.pk,
                                "shared_prefix_messages": 7, "step": 2, "margin": 1.0, "by_human_verdict": False}
    assert [m["role"] for m in late["prompt"]] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool"]
    assert late["prompt"][-1]["content"].startswith("exit code 1")
    assert late["chosen"] == [{"role": "assistant", "content": "修正します。", "reasoning_content": "The dash broke it.",
                               "tool_calls": [{"id": "i1s0_call_4", "type": "function", "function": {
                                   "name": "write_file", "arguments": {
                                       "path": "primes.py", "content": "print(*[2,3,5,7,11,13,17,19,23,29])\n"}}}]}]
    assert late["rejected"] == [{"role": "assistant", "content": "I give up."}]
    # The other failure parts from the first assistant turn: the prompt is the task itself.
    assert early["metadata"]["shared_prefix_messages"] == 2 and early["metadata"]["step"] == 0
    assert early["metadata"]["rejected_trajectory_id"] == other.pk and early["metadata"]["margin"] == 0.8
    assert [validate_line("dpo-step-trl", line) for line in lines] == [[], []]
    assert result.excluded == []


def test_rollouts_without_a_step_to_prefer_are_excluded_with_the_reason(make_task: Any) -> None:
    task = make_task(prompt="Task: primes")
    good = make_trajectory(task)

    def other_output(prefix: str) -> Any:  # the same calls, one tool result differs
        messages, steps = rich_episode("i1s0_")
        messages[6] = {**messages[6], "content": "exit code 2"}
        return messages, steps

    same_turns = make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, episode=other_output)
    close = make_trajectory(task, sample_index=2, outcome="success", reward=0.95, episode=failing_episode)
    errored = make_trajectory(task, sample_index=3, outcome="error", reward=None)
    lines, result = run([good.pk, same_turns.pk, close.pk, errored.pk])
    assert lines == []
    reasons = {e["trajectory_id"]: e["reason"] for e in result.excluded}
    assert reasons[same_turns.pk] == (f"dpo-step: the rollouts part in a tool message at 6, not in an assistant turn "
                                      f"(chosen #{good.pk}, rejected #{same_turns.pk})")
    assert reasons[close.pk].startswith("dpo-step: margin 0.050 below the minimum 0.2")
    assert reasons[errored.pk] == "dpo-step: outcome 'error' is not a preference signal"
    assert reasons[good.pk] == "dpo-step: no other rollout of this task gave a step pair"


def test_a_human_verdict_settles_a_pair_and_identical_pairs_are_written_once(make_task: Any, reviewer: Any) -> None:
    task = make_task(prompt="Task: primes")
    good = make_trajectory(task, reward=None)
    make_review(good, kind="human", verdict="accept", reviewer=reviewer)
    twins = [make_trajectory(task, sample_index=i, outcome="failure", reward=None, episode=diverging_late)
             for i in (1, 2)]
    lines, result = run([good.pk, *(t.pk for t in twins)])
    assert len(lines) == 1 and lines[0]["metadata"]["by_human_verdict"] is True
    assert lines[0]["metadata"]["margin"] == 1.0  # success against failure
    assert [e["reason"] for e in result.excluded] == [
        f"dpo-step: the same step pair as one already written (chosen #{good.pk}, rejected #{twins[1].pk})"]


def test_step_pairs_load_with_datasets_render_in_trl_and_through_a_chat_template(
    make_task: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets
    from trl.data_utils import maybe_apply_chat_template

    from tests.datasets.consumer_data import TOOL_CHAT_TEMPLATE, byte_tokenizer

    ids = []
    for n in range(2):
        task = make_task(prompt=f"Task {n}: primes")
        ids += [make_trajectory(task).pk,
                make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, episode=diverging_late).pk]
    path = tmp_path / "steps.jsonl"
    with path.open("wb") as fp:
        result = export_records("dpo-step-trl", load_records(ids), fp)
    assert result.lines == 2
    loaded = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
    first = orjson.loads(path.read_bytes().splitlines()[0])
    assert loaded[0]["chosen"] == first["chosen"] and loaded[0]["metadata"] == first["metadata"]
    tokenizer = byte_tokenizer(tmp_path / "tok", TOOL_CHAT_TEMPLATE)
    rendered = maybe_apply_chat_template(copy.deepcopy(first), tokenizer, tools=first["tools"])
    assert rendered["prompt"].endswith("<|im_start|>assistant\n")  # prompt ends on a tool result
    assert '"name": "write_file"' in rendered["chosen"] and rendered["rejected"].startswith("I give up.")
    report = templates.check_file(path, "dpo-step-trl", templates.load_template(str(TEMPLATES / "qwen3_training.jinja")))
    assert report.failed == 0 and {r.conversations for r in report.records} == {2}
