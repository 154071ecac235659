"""Every export loads with Hugging Face `datasets` (the loader TRL and LLaMA-Factory use), and
the TRL formats run through TRL's own data utilities and trainers.

`datasets` and TRL are slow to import, so this is the one module that does (besides
test_llamafactory.py). The minimum consumer versions these guard are in docs/exports.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from apps.datasets.exporters import FORMATS, export_records, load_records
from tests.datasets.consumer_data import TOOL_CHAT_TEMPLATE, byte_tokenizer
from tests.datasets.exporter_data import failing_episode, make_review, make_trajectory, rich_episode

pytestmark = pytest.mark.django_db


@pytest.fixture
def hf_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import datasets

    datasets.disable_progress_bars()
    return datasets


def test_every_format_loads_with_datasets_without_schema_errors(
    make_task: Any, reviewer: Any, tmp_path: Path, hf_datasets: Any
) -> None:
    verifier = {"command": "python3 -m pytest -q", "files": {"test_p.py": "def test(): pass\n"}}
    ids = []
    for n in range(3):
        task = make_task(prompt=f"Task {n}: print the primes ✓", external_id=f"t{n}",
                         scene_config={"verifier": verifier} if n else {})
        good = make_trajectory(task)
        bad = make_trajectory(task, episode=failing_episode, sample_index=1, outcome="failure", reward=0.0)
        make_review(good, overall=80 + n)
        make_review(bad, kind="human", verdict="reject", reviewer=reviewer)
        ids += [good.pk, bad.pk]
    messages, steps = rich_episode("x_")
    messages[3]["content"] = ""  # another empty observation, in a parallel pair
    ids.append(make_trajectory(make_task(prompt="Task 9"), messages=messages, steps=steps).pk)
    for fmt in FORMATS:
        if FORMATS[fmt].scenes:
            continue  # a scene's own format (qa, multiagent-agentjet): tested on that scene's trajectories
        path = tmp_path / f"{fmt}.jsonl"
        with path.open("wb") as fp:
            result = export_records(fmt, load_records(ids), fp)
        assert result.lines > 0, (fmt, result.excluded)
        loaded = hf_datasets.load_dataset("json", data_files=str(path), split="train",
                                          cache_dir=str(tmp_path / "cache"))
        assert loaded.num_rows == result.lines, fmt
        first = orjson.loads(path.read_bytes().splitlines()[0])
        assert set(loaded.column_names) == set(first), fmt


@pytest.fixture
def trl_exports(make_task: Any, tmp_path: Path) -> dict[str, Path]:
    """sft-trl and dpo-trl files of two tasks: different tools called with different arguments,
    and a DPO pair that diverges right after a tool result (its prompt ends on the tool turn)."""
    ids = []
    for n in range(2):
        task = make_task(prompt=f"Task {n}: print the primes ✓")
        good = make_trajectory(task)
        messages, steps = rich_episode("i1s0_")  # the same first turns, call ids included
        messages[1]["content"] = task.prompt
        if n == 0:
            messages[5] = {"role": "assistant", "content": "I give up."}  # right after the tool results
            del messages[6:]
            steps = steps[:2]
        else:
            messages[7] = {"role": "assistant", "content": "I give up."}
            del messages[8:]
            steps = steps[:3]
        ids += [good.pk, make_trajectory(task, sample_index=1, outcome="failure", reward=0.0, messages=messages,
                                         steps=steps).pk]
        ids.append(make_trajectory(task, episode=failing_episode, sample_index=2, outcome="failure", reward=0.0).pk)
    paths = {}
    for fmt in ("sft-trl", "dpo-trl"):
        paths[fmt] = tmp_path / f"{fmt}.jsonl"
        with paths[fmt].open("wb") as fp:
            export_records(fmt, load_records(ids), fp)
    return paths


def test_trl_formats_load_with_datasets_exactly(trl_exports: dict[str, Path], tmp_path: Path,
                                                hf_datasets: Any) -> None:
    """Rows come back as written: no tool-call argument gains another tool's keys as nulls
    (datasets < 4.7 unified every `arguments` object into one Arrow struct)."""
    for fmt, path in trl_exports.items():
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        loaded = hf_datasets.load_dataset("json", data_files=str(path), split="train",
                                          cache_dir=str(tmp_path / "cache"))
        assert [dict(row) for row in loaded] == lines, fmt
    sft = [orjson.loads(line) for line in trl_exports["sft-trl"].read_bytes().splitlines()]
    arguments = [c["function"]["arguments"] for m in sft[0]["messages"] for c in m.get("tool_calls") or ()]
    assert {"command": "ls"} in arguments and {"path": "primes.py", "content": "print('2 3 5 7 — ✓')\n"} in arguments
    assert sft[0]["messages"][-1] == {"role": "assistant", "content": "2 3 5 7 11 13 17 19 23 29 ✓",
                                      "reasoning_content": "Done. Finishing."}  # finish as the answer


def test_trl_chat_template_renders_our_rows(trl_exports: dict[str, Path], tmp_path: Path, hf_datasets: Any) -> None:
    """TRL's maybe_apply_chat_template with a template that renders tools, on the loaded rows
    (TRL < 0.26 refused a prompt that ends on a tool result: "Invalid role in the last message")."""
    from trl.data_utils import maybe_apply_chat_template

    tokenizer = byte_tokenizer(tmp_path / "tok", TOOL_CHAT_TEMPLATE)
    sft = hf_datasets.load_dataset("json", data_files=str(trl_exports["sft-trl"]), split="train",
                                   cache_dir=str(tmp_path / "cache"))
    text = maybe_apply_chat_template(sft[0], tokenizer, tools=sft[0]["tools"])["text"]
    assert '"name": "run_shell", "arguments": {"command": "ls"}}' in text
    assert '"name": "read_file"' in text.split("</tools>")[0]  # the tools are rendered
    assert text.count("<tool_response>") == 5 and text.endswith("<|im_start|>assistant\n2 3 5 7 11 13 17 19 23 29 ✓"
                                                                  "<|im_end|>\n")
    dpo = hf_datasets.load_dataset("json", data_files=str(trl_exports["dpo-trl"]), split="train",
                                   cache_dir=str(tmp_path / "cache"))
    assert [row["prompt"][-1]["role"] for row in dpo] == ["tool", "tool"]
    for row in dpo:
        rendered = maybe_apply_chat_template(row, tokenizer, tools=row["tools"])
        assert rendered["prompt"].endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
        assert rendered["rejected"] == "I give up.<|im_end|>\n"
        assert "<tool_call>" in rendered["chosen"]


def tiny_model(vocab_size: int) -> Any:
    """A randomly initialised one-layer Llama (a few thousand parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=4096))


def test_trl_trainers_take_two_steps_on_our_exports(trl_exports: dict[str, Path], tmp_path: Path,
                                                    hf_datasets: Any) -> None:
    """SFTTrainer and DPOTrainer tokenize our rows with the template and train two steps on CPU."""
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    tokenizer = byte_tokenizer(tmp_path / "tok", TOOL_CHAT_TEMPLATE)
    common = dict(max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3, report_to="none",
                  save_strategy="no", use_cpu=True, logging_steps=1, dataset_num_proc=None, max_length=2048)
    trainers = [
        SFTTrainer(model=tiny_model(len(tokenizer)), processing_class=tokenizer,
                   args=SFTConfig(output_dir=str(tmp_path / "sft"), **common),
                   train_dataset=hf_datasets.load_dataset("json", data_files=str(trl_exports["sft-trl"]),
                                                          split="train", cache_dir=str(tmp_path / "cache"))),
        DPOTrainer(model=tiny_model(len(tokenizer)), ref_model=tiny_model(len(tokenizer)), processing_class=tokenizer,
                   args=DPOConfig(output_dir=str(tmp_path / "dpo"), **common),
                   train_dataset=hf_datasets.load_dataset("json", data_files=str(trl_exports["dpo-trl"]),
                                                          split="train", cache_dir=str(tmp_path / "cache"))),
    ]
    for trainer in trainers:
        output = trainer.train()
        assert output.global_step == 2 and output.training_loss > 0, type(trainer).__name__
