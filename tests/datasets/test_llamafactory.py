"""The `sharegpt` and `alpaca` exports load in LLaMA-Factory's own data pipeline.

`get_dataset` (dataset_info.json -> converter -> template encoding, tool and function
formatters included) runs on files our exporter wrote, for the templates qwen, llama3, qwen3
and deepseekr1, and every line must come out as a training example.

LLaMA-Factory is installed by `make install-test` from requirements-test-llamafactory.lock
with --no-deps into .venv/llamafactory (its full install pulls a CUDA torch); this module puts
that directory on sys.path and uses the platform's own torch, transformers and datasets. No
model is downloaded: the tokenizer is a byte-level BPE built here (every byte a token), which
encodes any text, so the decoded input is the template's rendering of our rows.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from apps.datasets.exporters import export_records, load_records
from tests.datasets.consumer_data import byte_tokenizer
from tests.datasets.exporter_data import TOOLS, call, failing_episode, make_trajectory, rich_episode, step

pytestmark = pytest.mark.django_db

LLAMAFACTORY_SITE = Path(sys.prefix) / "llamafactory"
TEMPLATES = ("qwen", "llama3", "qwen3", "deepseekr1")


@pytest.fixture(scope="module")
def llamafactory(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not (LLAMAFACTORY_SITE / "llamafactory").is_dir():
        pytest.fail(f"LLaMA-Factory is not installed in {LLAMAFACTORY_SITE}: run `make install-test`")
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as mp:
        # llamafactory checks its own pins (transformers <= 5.6, datasets <= 4.0) unless told not to.
        mp.setenv("DISABLE_VERSION_CHECK", "1")
        for name, value in (("HF_HOME", str(home)), ("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"),
                            ("LLAMAFACTORY_VERBOSITY", "ERROR")):
            mp.setenv(name, value)
        mp.syspath_prepend(str(LLAMAFACTORY_SITE))
        import datasets
        from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
        from llamafactory.extras.constants import IGNORE_INDEX
        from llamafactory.hparams import DataArguments, ModelArguments
        from transformers import Seq2SeqTrainingArguments

        datasets.disable_progress_bars()
        yield {"get_dataset": get_dataset, "get_template": get_template_and_fix_tokenizer,
               "DataArguments": DataArguments, "ModelArguments": ModelArguments,
               "TrainingArguments": Seq2SeqTrainingArguments, "IGNORE_INDEX": IGNORE_INDEX}


def export_file(fmt: str, ids: list[int], directory: Path) -> Any:
    path = directory / f"ours.{fmt}.jsonl"
    with path.open("wb") as fp:
        result = export_records(fmt, load_records(ids), fp)
    columns = ({"messages": "conversations", "system": "system", "tools": "tools"} if fmt == "sharegpt" else
               {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
                "history": "history"})
    (directory / "dataset_info.json").write_text(json.dumps(
        {"ours": {"file_name": path.name, "formatting": fmt, "columns": columns}}))
    return result


def load_with_llamafactory(lf: Any, template_name: str, directory: Path) -> tuple[Any, Any]:
    """LLaMA-Factory's get_dataset on directory/dataset_info.json's "ours": (train dataset, tokenizer)."""
    tokenizer = byte_tokenizer(directory / f"tokenizer-{template_name}")
    data_args = lf["DataArguments"](template=template_name, dataset="ours", dataset_dir=str(directory),
                                    cutoff_len=100_000, overwrite_cache=True)
    model_args = lf["ModelArguments"](model_name_or_path=str(directory / f"tokenizer-{template_name}"),
                                      cache_dir=str(directory / "cache"))
    training_args = lf["TrainingArguments"](output_dir=str(directory / "out"), report_to="none")
    template = lf["get_template"](tokenizer, data_args)
    module = lf["get_dataset"](template, model_args, data_args, training_args, stage="sft", tokenizer=tokenizer)
    return module["train_dataset"], tokenizer


def trained_text(lf: Any, example: dict[str, Any], tokenizer: Any) -> str:
    return tokenizer.decode([t for t in example["labels"] if t != lf["IGNORE_INDEX"]])


def thoughtful_episode(prefix: str = "") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Text beside a call that spans lines and mentions the thought tags; a call without arguments."""
    c1 = call(f"{prefix}t_1", "run_shell", command="cat notes.md")
    c2 = call(f"{prefix}t_2", "list_env")
    messages = [
        {"role": "system", "content": "You read files."},
        {"role": "user", "content": "Summarise notes.md."},
        {"role": "assistant", "content": "First I read the notes.\n\nThen I check the environment;\n"
                                         "a model might write </think> or <think> in its text.\n",
         "tool_calls": [c1]},
        {"role": "tool", "tool_call_id": c1["id"], "name": "run_shell", "content": "# notes\n- one\n- two"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [c2]},
        {"role": "tool", "tool_call_id": c2["id"], "name": "list_env", "content": "PATH=/usr/bin"},
        {"role": "assistant", "content": "The notes list two items."},
    ]
    return messages, [step(0, 1, c1, messages[3]["content"]), step(1, 2, c2, messages[5]["content"])]


@pytest.fixture
def ids(make_task: Any) -> list[int]:
    """Three trajectories; the third task's tools include one with enum and array parameters and
    one without parameters (what LLaMA-Factory's default tool format reads)."""
    task = make_task(prompt="Écris primes.py ✓")
    tools = TOOLS + [{"type": "function", "function": {"name": "list_env", "description": "List variables.",
                                                        "parameters": {"type": "object", "properties": {
                                                            "scope": {"type": "string", "enum": ["user", "all"]},
                                                            "names": {"type": "array", "items": {"type": "string"}}}}}},
                     {"type": "function", "function": {"name": "ping"}}]
    return [make_trajectory(task).pk,
            make_trajectory(task, episode=failing_episode, sample_index=1, outcome="failure", reward=0.0).pk,
            make_trajectory(make_task(prompt="Summarise notes.md."), episode=thoughtful_episode, tools=tools).pk]


def test_sharegpt_loads_in_llamafactory_get_dataset(llamafactory: Any, ids: list[int], tmp_path: Path) -> None:
    result = export_file("sharegpt", ids, tmp_path)
    assert result.lines == 3 and result.excluded == []
    for name in TEMPLATES:
        train, tokenizer = load_with_llamafactory(llamafactory, name, tmp_path)
        assert train.num_rows == result.lines, name  # no line skipped as abnormal or dropped
        rich, failing, thoughtful = (trained_text(llamafactory, train[i], tokenizer) for i in range(3))
        # Text beside tool calls is trained on, in front of the calls it explains.
        said = rich.index("Je vais écrire le fichier puis lister le dossier.")
        assert said < rich.index('"primes.py"') < rich.index('"ls"'), name
        # final_answer text: the episode ends on the answer, its thought before it; no finish call is trained
        assert rich.index("修正します。") < rich.index("Done. Finishing.") < rich.index("2 3 5 7 11 13 17 19 23 29 ✓")
        assert '"finish"' not in rich and "finish accepted" not in rich, name
        assert failing.index("Let me read the file.") < failing.index("I could not do it. Désolé."), name
        assert "a model might write </think> or <think> in its text." in thoughtful, name
        assert thoughtful.index("Checking.") < thoughtful.index("list_env"), name


def test_alpaca_loads_in_llamafactory_get_dataset(llamafactory: Any, ids: list[int], tmp_path: Path) -> None:
    result = export_file("alpaca", ids, tmp_path)
    assert result.lines == 3 and result.excluded == []
    for name in TEMPLATES:
        train, tokenizer = load_with_llamafactory(llamafactory, name, tmp_path)
        assert train.num_rows == result.lines, name
        failing = trained_text(llamafactory, train[1], tokenizer)
        assert "<tool_call>" in failing and "I could not do it. Désolé." in failing, name
