"""kto-trl (TRL's unpaired preference format) and reward-score (prompt, completion, score)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from apps.datasets.exporters import export_records, load_records, validate_line
from tests.datasets.exporter_data import failing_episode, make_review, make_trajectory

pytestmark = pytest.mark.django_db


def run(fmt: str, ids: list[int]) -> tuple[list[dict[str, Any]], Any]:
    out = io.BytesIO()
    result = export_records(fmt, load_records(ids), out)
    return [orjson.loads(line) for line in out.getvalue().splitlines()], result


def test_kto_labels_come_from_human_verdicts_first_then_verifier_outcomes(make_task: Any, reviewer: Any) -> None:
    task = make_task(prompt="Task: primes ✓")
    success = make_trajectory(task)
    failure = make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, episode=failing_episode)
    rejected_success = make_trajectory(task, sample_index=2)
    make_review(rejected_success, kind="human", verdict="reject", reviewer=reviewer)
    accepted_failure = make_trajectory(task, sample_index=3, outcome="failure", reward=0.0)
    make_review(accepted_failure, kind="human", verdict="accept", reviewer=reviewer)
    needs_fix = make_trajectory(task, sample_index=4)
    make_review(needs_fix, kind="human", verdict="needs_fix", reviewer=reviewer)
    errored = make_trajectory(task, sample_index=5, outcome="error", reward=None)
    ids = [success.pk, failure.pk, rejected_success.pk, accepted_failure.pk, needs_fix.pk, errored.pk]
    lines, result = run("kto-trl", ids)

    assert [line["label"] for line in lines] == [True, False, False, True, False]
    first = lines[0]
    assert set(first) == {"prompt", "completion", "label", "tools"}
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["completion"][0]["role"] == "assistant"
    assert first["completion"][-1] == {"role": "assistant", "content": "2 3 5 7 11 13 17 19 23 29 ✓",
                                       "reasoning_content": "Done. Finishing."}  # finish as the answer
    assert first["completion"][0]["tool_calls"][0]["function"]["arguments"] == {
        "path": "primes.py", "content": "print('2 3 5 7 — ✓')\n"}
    assert result.excluded == [{"trajectory_id": errored.pk, "task_id": task.pk,
                                "reason": "kto-trl: no human verdict and outcome 'error': no desirability signal"}]
    assert validate_line("kto-trl", {**first, "label": 1}) == ["line.label: must be true or false"]


def test_reward_scores_come_from_the_human_review_else_the_judge(make_task: Any, reviewer: Any) -> None:
    task = make_task(prompt="Task: primes")
    judged = make_trajectory(task)
    make_review(judged, overall=85)
    both = make_trajectory(task, sample_index=1)
    make_review(both, overall=90)
    human = make_review(both, kind="human", verdict="accept", reviewer=reviewer)
    human.overall = 40.0
    human.save(update_fields=["overall"])
    unscored = make_trajectory(task, sample_index=2)
    lines, result = run("reward-score", [judged.pk, both.pk, unscored.pk])
    assert [line["score"] for line in lines] == [0.85, 0.4]
    assert set(lines[0]) == {"prompt", "completion", "score", "tools"}
    assert [e["reason"] for e in result.excluded] == [
        "reward-score: no review score (neither a human nor an automatic review has an overall score)"]
    assert validate_line("reward-score", {**lines[0], "score": 85}) == ["line.score: must be a number from 0 to 1"]


def test_kto_and_reward_lines_load_with_datasets_and_render_with_trl(make_task: Any, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets
    from trl.data_utils import apply_chat_template

    from tests.datasets.consumer_data import TOOL_CHAT_TEMPLATE, byte_tokenizer

    task = make_task(prompt="Task: primes")
    ids = [make_trajectory(task).pk,
           make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, episode=failing_episode).pk]
    for pk in ids:
        from apps.tasks.models import Trajectory

        make_review(Trajectory.objects.get(pk=pk), overall=70)
    tokenizer = byte_tokenizer(tmp_path / "tok", TOOL_CHAT_TEMPLATE)
    for fmt in ("kto-trl", "reward-score"):
        path = tmp_path / f"{fmt}.jsonl"
        with path.open("wb") as fp:
            assert export_records(fmt, load_records(ids), fp).lines == 2
        loaded = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        assert [dict(r) for r in loaded] == rows  # no keys unified into nulls
    kto = [orjson.loads(line) for line in (tmp_path / "kto-trl.jsonl").read_bytes().splitlines()]
    rendered = apply_chat_template({k: kto[1][k] for k in ("prompt", "completion", "label")}, tokenizer,
                                   tools=kto[1]["tools"])
    assert rendered["label"] is False and rendered["prompt"].endswith("<|im_start|>assistant\n")
    assert '"name": "run_shell"' in rendered["completion"]


def test_trl_trains_two_steps_on_kto_lines_and_step_pairs(make_task: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """KTOTrainer on kto-trl and DPOTrainer on dpo-step-trl (its metadata column included) tokenize
    our lines with a tool-rendering template and train two steps on CPU."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

    from tests.datasets.consumer_data import TOOL_CHAT_TEMPLATE, byte_tokenizer
    from tests.datasets.test_exporters_load import tiny_model
    from tests.datasets.test_stepdpo import diverging_late

    ids = []
    for n in range(2):
        task = make_task(prompt=f"Task {n}: primes")
        ids += [make_trajectory(task).pk,
                make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, episode=diverging_late).pk]
    files = {}
    for fmt in ("kto-trl", "dpo-step-trl"):
        files[fmt] = tmp_path / f"{fmt}.jsonl"
        with files[fmt].open("wb") as fp:
            assert export_records(fmt, load_records(ids), fp).lines
    tokenizer = byte_tokenizer(tmp_path / "tok", TOOL_CHAT_TEMPLATE)
    common = dict(max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3, report_to="none",
                  save_strategy="no", use_cpu=True, logging_steps=1, dataset_num_proc=None, max_length=2048)

    def load(fmt: str) -> Any:
        return datasets.load_dataset("json", data_files=str(files[fmt]), split="train", cache_dir=str(tmp_path / "c"))

    trainers = [
        KTOTrainer(model=tiny_model(len(tokenizer)), ref_model=tiny_model(len(tokenizer)), processing_class=tokenizer,
                   args=KTOConfig(output_dir=str(tmp_path / "kto"), **common), train_dataset=load("kto-trl")),
        DPOTrainer(model=tiny_model(len(tokenizer)), ref_model=tiny_model(len(tokenizer)), processing_class=tokenizer,
                   args=DPOConfig(output_dir=str(tmp_path / "dpo"), **common), train_dataset=load("dpo-step-trl")),
    ]
    for trainer in trainers:
        output = trainer.train()
        assert output.global_step == 2 and output.training_loss > 0, type(trainer).__name__
