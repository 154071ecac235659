"""Multimodal exports (apps/datasets/exporters/vision.py) of trajectories the real gui loop wrote:
a MiniWoB++ vision episode in chromium, stored with its screenshots in the artifact store, then
exported as sft-openai-vision, sharegpt-vision and trl-vision with images as files next to the
JSONL and as base64, each line checked by its consumer's rules and loaded by HF datasets; the
text-only formats still export the same episode; the data card counts its images."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from apps.datasets.exporters import export_records, load_records, validate_line
from apps.datasets.exporters.vision import card_images
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import config_for, llm_env, run, scripted  # noqa: F401 - llm_env is a fixture
from tests.engines.test_gui import BUNDLED, artifact_root  # noqa: F401 - artifact_root is a fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandbox_settings", "llm_env")]

VISION_FORMATS = ("sft-openai-vision", "sharegpt-vision", "trl-vision")


@pytest.fixture
def episodes(make_task: Any, artifact_root: Path) -> Iterator[list[int]]:  # noqa: F811
    """Two stored trajectories of one real vision episode: as run (image messages) and, as an
    episode without vision would be, its text messages only (the steps keep the screenshots)."""
    from apps.tasks.models import Trajectory
    from trajplatform import artifacts

    line = BUNDLED["gui-miniwob-email-inbox-delete-s1"]
    config = config_for(line["prompt"], line["config"], scene="gui", max_steps=line["max_steps"], timeout_s=120)
    with scripted(config["prompt"], *line["reference_solution"]) as (_, llm):
        result = run(config, llm)
    assert result.reward == 1.0, result.outcome_reason
    task = make_task(prompt=line["prompt"], scene="gui", scene_config=line["config"])
    text_only = [m for m in result.messages if not isinstance(m["content"], list)]
    ids = []
    for sample, messages in enumerate((result.messages, text_only)):
        row = Trajectory.objects.create(
            task=task, iteration=1, sample_index=sample, status="finished", messages=messages, tools=result.tools,
            steps=result.steps, final_answer=result.final_answer, outcome=result.outcome, reward=result.reward,
            verifier_output=result.verifier_output, model="scripted-reference", config_snapshot=config)
        ids.append(row.pk)
        artifacts.link_trajectories({row.pk: [row.steps, row.messages]})
    yield ids


def export(fmt: str, ids: list[int], directory: Path, mode: str) -> tuple[Path, Any]:
    path = directory / f"{fmt}-{mode}.jsonl"
    with path.open("wb") as fp:
        result = export_records(fmt, load_records(ids), fp,
                                options={"images": mode, "image_dir": str(directory / f"{path.stem}_images")})
    return path, result


def test_multimodal_and_text_exports_of_a_real_vision_episode(
        episodes: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    import datasets

    datasets.disable_progress_bars()
    for fmt in VISION_FORMATS:
        for mode in ("files", "base64"):
            path, result = export(fmt, episodes, tmp_path, mode)
            assert result.lines == 2 and not result.excluded, (fmt, mode, result.excluded)
            lines = [orjson.loads(raw) for raw in path.read_bytes().splitlines()]
            for line in lines:
                assert validate_line(fmt, line) == []
                urls = _image_urls(fmt, line)
                assert urls, fmt
                for url in urls:
                    if mode == "base64":
                        assert url.startswith("data:image/png;base64,")
                    else:
                        image = path.parent / url
                        assert url.startswith(f"{path.stem}_images/") and image.read_bytes()[:4] == b"\x89PNG"
            vision_line, text_line = lines
            # The vision run shows the start page and the page after each turn; the run without
            # vision gets each step's screenshot after its tool result.
            assert len(_image_urls(fmt, vision_line)) == 2 and len(_image_urls(fmt, text_line)) == 1
            loaded = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))
            assert loaded.num_rows == 2 and set(loaded.column_names) == set(lines[0])
    sharegpt = [orjson.loads(raw) for raw in (tmp_path / "sharegpt-vision-files.jsonl").read_bytes().splitlines()][0]
    assert sharegpt["conversations"][0]["value"].endswith("<image>")  # the start page, with the task
    trl_lines = [orjson.loads(raw) for raw in (tmp_path / "trl-vision-files.jsonl").read_bytes().splitlines()]
    assert trl_lines[0]["messages"][1]["content"][0] == {"type": "image"}
    _trl_fills_every_placeholder(trl_lines, tmp_path)
    _llamafactory_converts_and_validates(tmp_path / "sharegpt-vision-files.jsonl", monkeypatch)
    _text_formats_and_card(episodes, tmp_path)


def _trl_fills_every_placeholder(lines: list[dict[str, Any]], directory: Path) -> None:
    """TRL's own preparation of a multimodal conversation takes our lines with the images loaded."""
    from PIL import Image
    from trl.data_utils import prepare_multimodal_messages

    for line in lines:
        images = [Image.open(directory / path) for path in line["images"]]
        prepared = prepare_multimodal_messages(line["messages"], images)
        filled = [part["image"] for m in prepared for part in m["content"] if part["type"] == "image"]
        assert len(filled) == len(images) and all(isinstance(i, Image.Image) for i in filled)


def _llamafactory_converts_and_validates(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LLaMA-Factory's own ShareGPT converter (images resolved against the file's directory) and
    its multimodal plugin's check that <image> tokens and images agree take our lines."""
    from tests.datasets.test_llamafactory import LLAMAFACTORY_SITE

    monkeypatch.setenv("DISABLE_VERSION_CHECK", "1")
    monkeypatch.syspath_prepend(str(LLAMAFACTORY_SITE))
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.mm_plugin import get_mm_plugin
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.hparams import DataArguments

    attr = DatasetAttr("file", dataset_name="ours", formatting="sharegpt")
    attr.messages, attr.system, attr.tools, attr.images = "conversations", "system", "tools", "images"
    convert = get_dataset_converter("sharegpt", attr, DataArguments(dataset_dir=str(path.parent),
                                                                    media_dir=str(path.parent)))
    plugin = get_mm_plugin("base", image_token="<image>")
    for raw in path.read_bytes().splitlines():
        example = convert(orjson.loads(raw))
        assert example["_images"] and all(Path(p).is_file() for p in example["_images"])
        plugin._validate_messages(example["_prompt"] + example["_response"], example["_images"], [], [])


def _image_urls(fmt: str, line: dict[str, Any]) -> list[str]:
    if fmt == "sft-openai-vision":
        return [p["image_url"]["url"] for m in line["messages"] if isinstance(m["content"], list)
                for p in m["content"] if p["type"] == "image_url"]
    return list(line["images"])


def test_the_consumers_rules_catch_image_count_mismatches() -> None:
    line = {"conversations": [{"from": "human", "value": "do it<image>"}, {"from": "gpt", "value": "ok"}],
            "images": ["a_images/x.png", "a_images/y.png"], "tools": "[]"}
    assert any("1 <image> tokens for 2 images" in p for p in validate_line("sharegpt-vision", line))
    trl = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
           "images": [], "tools": []}
    assert validate_line("trl-vision", trl)
    openai = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]},
                           {"role": "assistant", "content": "ok"}], "tools": []}
    assert any("image_url.url" in p for p in validate_line("sft-openai-vision", openai))


def _text_formats_and_card(episodes: list[int], tmp_path: Path) -> None:
    """The text-only formats export the same episodes without their images; the card counts them."""
    for fmt in ("sft-openai", "sft-trl", "sharegpt"):
        path = tmp_path / f"{fmt}.jsonl"
        with path.open("wb") as fp:
            result = export_records(fmt, load_records(episodes), fp)
        assert result.lines == 2 and not result.excluded, (fmt, result.excluded)
        assert "artifact:" not in path.read_text() and "base64" not in path.read_text()
    counts = card_images(episodes)
    assert counts["trajectories_with_images"] == 2 and counts["distinct_images"] >= 2 and counts["bytes"] > 0
    with pytest.raises(ValueError, match="images"), open(tmp_path / "x", "wb") as fp:
        export_records("trl-vision", load_records(episodes), fp, options={"images": "gif"})
    assert json.dumps(counts)
