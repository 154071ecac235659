"""Discoverable formats: one table (exporters.format_table) says what each export format is for and
which consumer loads it, and `dataset_export --help`, the API schema's format enum and the console's
export form (tests/datasets/test_exportability.py) all show it."""
from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from apps.datasets.exporters import FORMATS, format_table
from apps.datasets.management.commands.dataset_export import Command


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_every_format_has_one_line_saying_what_it_is_for_and_who_loads_it() -> None:
    rows = format_table()
    assert [r.name for r in rows] == list(FORMATS)
    for row in rows:
        assert row.purpose and row.consumer and "\n" not in row.line, row
        assert row.line == f"{row.purpose} — for {row.consumer}"
    consumers = {r.name: r.consumer for r in rows}
    assert "TRL SFTTrainer" in consumers["sft-trl"] and "LLaMA-Factory" in consumers["sharegpt"]
    assert "verl" in consumers["rl-verl"] and "import_trajectories" in consumers["raw"]


def test_dataset_export_help_lists_every_format_with_its_line() -> None:
    text = Command().create_parser("manage.py", "dataset_export").format_help()
    listed = flat(text.split("Formats (--format F)")[1].split("positional arguments")[0])
    for row in format_table():
        assert f" {row.name} {row.line} " in f" {listed} ", row.name
    assert len(re.findall(r"^  \S", text.split("Formats (--format F)")[1].split("positional arguments")[0],
                          flags=re.M)) == len(FORMATS)  # one entry per format, its line wrapped under it
    assert "e.g. sft-openai" not in text


@pytest.mark.django_db
def test_the_api_schema_gives_the_format_as_an_enum_of_every_format_with_its_line(client: Any) -> None:
    schema = yaml.safe_load(client.get("/api/schema/").content)
    schemas = schema["components"]["schemas"]
    field = schemas["ExportStartRequest"]["properties"]["format"]
    [ref] = [part["$ref"] for part in field["allOf"]]
    enum = schemas[ref.rsplit("/", 1)[1]]
    assert enum["enum"] == list(FORMATS)
    for row in format_table():
        assert f"`{row.name}`: {row.line}" in flat(field["description"]), row.name
