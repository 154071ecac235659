"""The Hugging Face layout of an export: Parquet shards per split and a dataset card the Hub reads.

    DIR/README.md                                  # YAML: license, configs, dataset_info (features, splits)
    DIR/data/train-00000-of-00002.parquet          # DATASET_HF_SHARD_ROWS rows per shard
    DIR/data/train-00001-of-00002.parquet
    DIR/data/validation-00000-of-00001.parquet

`datasets.load_dataset(DIR)` reads it with its splits and features; any Parquet reader (pandas,
pyarrow, verl's RLHFDataset) reads the shards directly. The rows are the format's JSONL lines,
exactly (the export job renders and validates them in its resumable chunks first, then
`write_layout` turns the finished chunks into Parquet with pyarrow). Their features are inferred
over every line of every split, one schema for all:

* a value's type is its JSON type (string, int64, float64, bool; an int where other rows have a
  float is a float); a list's items share one feature;
* an object whose keys are the same in every row is a struct of its fields; an object whose keys
  differ between rows (tool-call arguments, JSON schemas, metadata) or a value whose type differs
  between rows is a `datasets.Json` feature: stored as JSON text (Parquet's JSON logical type;
  pandas and pyarrow see the text) and decoded by `datasets` to exactly the object written, never a
  struct padded with the other rows' keys as null; so is a field that is null in every row;
* the image columns of the formats that carry screenshots are `datasets.Image` features (the bytes
  embedded): aitw's `image/encoded`, sharegpt-vision's and trl-vision's `images`. sft-openai-vision
  keeps OpenAI's shape, images as data: URLs inside the messages.

The card's YAML names the license from the version's data card: the licences of the corpora its
web episodes read (as the Hub's identifiers when they are one, else `other` with their names); the
body lists them, the models that wrote the trajectories (their providers' terms apply), the
splits and what was excluded.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import math
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from apps.datasets.models import ExportJob
from apps.datasets.spec import DatasetError

LAYOUTS = ("jsonl", "hf")
HF_SUFFIX = ExportJob.HF_SUFFIX  # ExportJob.format_version of a Hugging Face layout export: "<exporter version>+hf"
# Formats whose lines carry screenshots; the layout renders them with images="base64" and embeds them.
IMAGE_FORMATS = frozenset({"aitw", "sft-openai-vision", "sharegpt-vision", "trl-vision"})
IMAGE_COLUMNS = {"aitw": ("image/encoded", False), "sharegpt-vision": ("images", True), "trl-vision": ("images", True)}
BATCH_ROWS = 256  # rows converted and written at a time (bounds memory for rows with images)
README = "README.md"
DATA_DIR = "data"
MAX_INT64 = 2 ** 63
_DATA_URL = re.compile(r"^data:image/[a-z+.-]+;base64,")
# The Hub's license identifiers our corpora's licences may name (https://huggingface.co/docs/hub/repositories-licenses).
HUB_LICENSES = frozenset({
    "apache-2.0", "mit", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-2.0", "cc-by-3.0", "cc-by-4.0",
    "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-4.0",
    "odc-by", "odbl", "pddl", "gpl-2.0", "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "gfdl", "unlicense",
})

Shape = tuple[Any, ...]
NULL: Shape = ("null",)
JSON: Shape = ("json",)


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise DatasetError(f"unknown layout {layout!r}; layouts: {', '.join(LAYOUTS)}")
    return layout


def format_version(exporter_version: str, layout: str) -> str:
    """What ExportJob.format_version records: the exporter's version, "+hf" for this layout."""
    return f"{exporter_version}{HF_SUFFIX}" if check_layout(layout) == "hf" else str(exporter_version)



# -- features -------------------------------------------------------------------------------------


def shape_of(value: Any) -> Shape:
    """A JSON value's shape: its type, a list's item shape, an object's fields (see the module doc)."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return ("bool",)
    if isinstance(value, int):
        return ("int",) if -MAX_INT64 <= value < MAX_INT64 else JSON
    if isinstance(value, float):
        return ("float",)
    if isinstance(value, str):
        return ("str",)
    if isinstance(value, list):
        item = NULL
        for v in value:
            item = merge(item, shape_of(v))
        return ("list", item)
    if isinstance(value, dict) and value:
        return ("struct", tuple((k, shape_of(value[k])) for k in sorted(value)))
    return JSON  # {} (Parquet has no struct without fields), or anything else


def merge(a: Shape, b: Shape) -> Shape:
    """The shape that holds values of both shapes."""
    if a == b:
        return a
    if a == NULL:
        return b
    if b == NULL:
        return a
    if {a[0], b[0]} == {"int", "float"}:
        return ("float",)
    if a[0] == b[0] == "list":
        return ("list", merge(a[1], b[1]))
    if a[0] == b[0] == "struct" and [k for k, _ in a[1]] == [k for k, _ in b[1]]:
        return ("struct", tuple((k, merge(sa, sb)) for (k, sa), (_, sb) in zip(a[1], b[1])))
    return JSON


def row_shape(rows: Iterable[dict[str, Any]], skip: Iterable[str] = ()) -> dict[str, Shape]:
    """Each column's shape over the rows (a column missing from a row is null there)."""
    skipped = set(skip)
    columns: dict[str, Shape] = {}
    for row in rows:
        for key in columns.keys() | row.keys():
            if key not in skipped:
                columns[key] = merge(columns.get(key, NULL), shape_of(row.get(key)))
    return columns


def _feature(shape: Shape) -> Any:
    import datasets  # deferred: the datasets library (~1 s) for the Hugging Face layout only

    kind = shape[0]
    if kind == "struct":
        return {k: _feature(s) for k, s in shape[1]}
    if kind == "list":
        return datasets.List(_feature(shape[1]))
    if kind in ("json", "null"):  # null in every row: no type to name (and Arrow casts no null child)
        return datasets.Json()
    return datasets.Value({"bool": "bool", "int": "int64", "float": "float64", "str": "string"}[kind])


def features_for(fmt: str, columns: dict[str, Shape]) -> Any:
    """The datasets.Features of the format's rows: inferred columns, its image columns as Image."""
    import datasets  # deferred: the datasets library (~1 s) for the Hugging Face layout only

    features = {name: _feature(shape) for name, shape in sorted(columns.items())}
    if fmt in IMAGE_COLUMNS:
        name, many = IMAGE_COLUMNS[fmt]
        features[name] = datasets.List(datasets.Image()) if many else datasets.Image()
    return datasets.Features(dict(sorted(features.items())))


def _storage(arrow_type: Any) -> Any:
    """An Arrow type with its extension types (datasets.Json's arrow.json) as their storage: pyarrow
    builds nested extension arrays only by a cast from their storage."""
    import pyarrow as pa  # deferred: pyarrow for the Hugging Face layout only

    if isinstance(arrow_type, pa.BaseExtensionType):
        return arrow_type.storage_type
    if pa.types.is_list(arrow_type):
        return pa.list_(pa.field(arrow_type.value_field.name, _storage(arrow_type.value_type)))
    if pa.types.is_struct(arrow_type):
        return pa.struct([pa.field(f.name, _storage(f.type), f.nullable) for f in arrow_type])
    return arrow_type


def _image(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DatasetError(f"{where}: an image must be base64 text, got {type(value).__name__}")
    try:
        return {"bytes": base64.b64decode(_DATA_URL.sub("", value), validate=True), "path": None}
    except (binascii.Error, ValueError):
        raise DatasetError(f"{where}: not an embedded image (base64 or a data: URL)") from None


def with_images(fmt: str, row: dict[str, Any], where: str) -> dict[str, Any]:
    """The row with its image column's base64 / data: URLs as {"bytes", "path"} for datasets.Image."""
    if fmt not in IMAGE_COLUMNS:
        return row
    name, many = IMAGE_COLUMNS[fmt]
    value = row.get(name)
    if many:
        value = [_image(v, f"{where}.{name}[{i}]") for i, v in enumerate(value or [])]
    else:
        value = _image(value, f"{where}.{name}")
    return {**row, name: value}


# -- the card ---------------------------------------------------------------------------------------


def hub_license(licences: list[dict[str, Any]]) -> dict[str, Any]:
    """The card YAML's license keys from the data card's licences ({} when none is recorded)."""
    names = sorted({str(e.get("licence") or "").strip() for e in licences} - {""})
    if not names:
        return {}
    ids = [re.sub(r"[\s_]+", "-", n.lower()).replace("cc-0", "cc0") for n in names]
    if all(i in HUB_LICENSES for i in ids):
        return {"license": ids[0] if len(ids) == 1 else ids}
    return {"license": "other", "license_name": "; ".join(names)}


def _card_text(meta: dict[str, Any], info: dict[str, Any]) -> str:
    import yaml  # deferred: PyYAML (datasets' dependency) for the card's front matter only

    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=120)
    lines = [f"---\n{front}---", "", f"# {info['title']}", "", info["description"], ""]
    lines += ["## Splits", "", "| split | rows | shards |", "|---|---|---|"]
    lines += [f"| {name} | {s['rows']} | {s['shards']} |" for name, s in info["splits"].items()]
    lines += ["", "## Loading", "", "```python", "import datasets", "",
              'ds = datasets.load_dataset("path/to/this/directory")  # or the Hub repository you upload it to',
              "```", "", "Parquet readers (pandas, pyarrow, verl) read `data/*.parquet` directly; a `Json`"
              " feature is JSON text there.", ""]
    lines += ["## Licences and terms", ""]
    if info["licences"]:
        lines += ["The documents the web episodes read come from these corpora:", "",
                  "| corpus | source | licence |", "|---|---|---|"]
        lines += [f"| {e.get('corpus', '')} | {e.get('source', '')} | {e.get('licence', '')} |" for e in info["licences"]]
    else:
        lines.append("No corpus licence is recorded on this version's data card; state the licence you release "
                     "the data under before uploading it.")
    models = ", ".join(f"{m} ({n})" for m, n in info["models"].items()) or "none recorded"
    lines += ["", f"Trajectories written by: {models}. The terms of the providers of these models apply to "
              "their outputs.", ""]
    lines += ["## Provenance", "", f"Exported by trajplatform from dataset `{info['dataset']}` version "
              f"{info['version']} (format `{info['format']}`, exporter version {info['format_version']}): "
              f"{info['members']} member(s), {info['rows']} row(s), {info['excluded']} excluded."]
    if info["reasons"]:
        lines += ["", "Why members were excluded:", ""] + [f"* {n} × {r}" for r, n in info["reasons"]]
    return "\n".join(lines) + "\n"


# -- writing ----------------------------------------------------------------------------------------


def _lines(files: Iterable[Path]) -> Iterator[dict[str, Any]]:
    for path in files:
        with open(path, "rb") as fh:
            for line in fh:
                if line.strip():
                    yield orjson.loads(line)


def _tree_digest(root: Path) -> tuple[str, int]:
    """SHA-256 over the layout's files (relative path and content digest each, sorted) and their size."""
    digest = hashlib.sha256()
    size = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        size += len(data)
        digest.update(f"{path.relative_to(root).as_posix()}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return digest.hexdigest(), size


def write_layout(*, target: Path, fmt: str, splits: dict[str, list[Path]], shard_rows: int,
                 info: dict[str, Any]) -> dict[str, Any]:
    """Write the layout of the splits' finished JSONL chunks into the new, empty directory `target`.

    `info`: the card's facts (title, description, dataset, version, format, format_version,
    members, excluded, reasons, licences, models). Returns {"sha256", "bytes", "rows", "splits"}.
    Raises DatasetError when there is no row to write or a row cannot be written."""
    import pyarrow as pa  # deferred: pyarrow for the Hugging Face layout only
    import pyarrow.parquet as pq  # deferred: pyarrow for the Hugging Face layout only

    image_column = IMAGE_COLUMNS.get(fmt, ("", False))[0]
    counts = {name: sum(1 for _ in _lines(files)) for name, files in splits.items()}
    counts = {name: n for name, n in counts.items() if n}
    if not counts:
        raise DatasetError("no row to write: every member was excluded (see the exclusions); "
                           "the Hugging Face layout is not written empty")
    columns: dict[str, Shape] = {}
    for name in counts:
        for key, shape in row_shape(_lines(splits[name]), skip=[image_column]).items():
            columns[key] = merge(columns.get(key, NULL), shape)
    features = features_for(fmt, columns)
    schema = features.arrow_schema
    storage = pa.schema([pa.field(f.name, _storage(f.type), f.nullable) for f in schema], metadata=schema.metadata)
    (target / DATA_DIR).mkdir()
    facts: dict[str, Any] = {}
    for name, rows in counts.items():
        shards = max(1, math.ceil(rows / max(1, shard_rows)))  # then rows spread evenly over them
        source = enumerate(_lines(splits[name]))
        nbytes = 0
        for shard in range(shards):
            path = target / DATA_DIR / f"{name}-{shard:05d}-of-{shards:05d}.parquet"
            with pq.ParquetWriter(path, schema) as writer:
                left = (shard + 1) * rows // shards - shard * rows // shards
                while left > 0:
                    batch = [features.encode_example(with_images(fmt, row, f"{name} row {n}"))
                             for n, row in (next(source) for _ in range(min(BATCH_ROWS, left)))]
                    try:
                        table = pa.Table.from_pylist(batch, schema=storage).cast(schema)
                    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                        raise DatasetError(f"{name}: a row does not fit the rows' features: {exc}") from None
                    nbytes += table.nbytes
                    writer.write_table(table)
                    left -= len(batch)
        facts[name] = {"rows": rows, "shards": shards, "num_bytes": nbytes}
    meta: dict[str, Any] = {
        **hub_license(info["licences"]),
        "pretty_name": info["title"],
        "tags": ["trajplatform", "agent-trajectories", fmt],
        "configs": [{"config_name": "default", "data_files": [
            {"split": name, "path": f"{DATA_DIR}/{name}-*"} for name in facts]}],
    }
    meta["dataset_info"] = _dataset_info(features, facts, target)
    text = _card_text(meta, {**info, "splits": facts, "rows": sum(f["rows"] for f in facts.values())})
    (target / README).write_text(text, encoding="utf-8")
    sha, size = _tree_digest(target)
    return {"sha256": sha, "bytes": size, "rows": sum(f["rows"] for f in facts.values()),
            "splits": {n: {"rows": f["rows"], "shards": f["shards"]} for n, f in facts.items()}}


def _dataset_info(features: Any, facts: dict[str, Any], target: Path) -> dict[str, Any]:
    import datasets  # deferred: the datasets library (~1 s) for the Hugging Face layout only

    download = sum(p.stat().st_size for p in (target / DATA_DIR).glob("*.parquet"))
    info = datasets.DatasetInfo(features=features)._to_yaml_dict()
    info["splits"] = [{"name": n, "num_bytes": f["num_bytes"], "num_examples": f["rows"]} for n, f in facts.items()]
    info["download_size"] = download
    info["dataset_size"] = sum(f["num_bytes"] for f in facts.values())
    return info


def temp_dir_for(path: Path) -> Path:
    """Where a layout is built before it is renamed to `path`: beside it, named for this process."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")
