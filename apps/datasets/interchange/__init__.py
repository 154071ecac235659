"""Interchange with other agent tools: ATIF (Harbor), the Agent Data Protocol (neulab) and
mini-swe-agent's saved trajectories, out and in. docs/interchange.md is the user's guide and has
the version table (what each reader takes); each module has its format's constants.

* **ATIF** (Agent Trajectory Interchange Format, Harbor's RFC 0001; export "ATIF-v1.7", import
  v1.0-v1.7): one trajectory object `{schema_version, session_id, trajectory_id, agent, steps,
  final_metrics, notes, extra}` per line. A system step, a user step, then one agent step per
  assistant turn: `message`, `reasoning_content`, `tool_calls [{tool_call_id, function_name,
  arguments (object)}]` and the turn's tool results as `observation.results [{source_call_id,
  content}]`. Ids a file repeats (ADP's converter writes "call_1" in every step) get a suffix. An
  agent step that only observes (no message, no call, results answering no call) is an
  environment message (a result's extra.web, ADP's converter's page, read as its page text).
* **ADP** (Agent Data Protocol; export "1.5.0", import every 1.x and files without schema_version):
  `{schema_version, id, content, details, available_*}` with `content` a sequence of
  `text_observation` (source user — 1.0-1.2's user_msg read as user —, agent: an assistant turn,
  environment: a tool result by `tool_call_id`, the system prompt before anything else, else an
  environment message), `api_action` (a tool call: `function`, `kwargs`, `tool_call_id`, the
  turn's text as `description`, `reasoning_content`), `code_action` (an `execute_<language>` call
  with `{"code": ...}`, mapped back to a code_action with its language) and `message_action`
  (assistant text; its `description` is the turn's thought, reasoning_content on our side). On
  import, a `web_observation` (`url`, `axtree`, `html`, `image_observation`, `viewport_size`)
  becomes the text the agent saw: `URL: <url>`, a blank line, then the accessibility tree or,
  failing that, the HTML reduced to its visible text, cut at WEB_TEXT_MAX_CHARS (the whole item
  kept under the message's `provenance.adp`, its images as `artifact:<sha>`, so the export writes
  it back). An observation answers its
  `tool_call_id`, else the oldest unanswered call of the turn before it. An `image_observation`
  (alone or a web observation's screenshot) goes to the artifact store when its content is a
  data: URL and follows as a user message with an `artifact:<sha>` image part, as the gui
  scene's screenshots do; a path or link is refused (nothing is fetched).
* **mini-swe-agent** (`<instance_id>.traj.json`, trajectory_format "mini-swe-agent-1.1"): assistant
  turns become `bash` tool calls (from `extra.actions`, else the fenced command block), the
  `<returncode>` user messages after them their results (the return code the step's exit code);
  tool-call mode (`tool_calls` + role `tool`) is read as is; the `exit` message answers the
  closing submit (its exit status is the call's result) and `info.submission` becomes the final
  answer. The export writes that shape back (an exit message last).

What a standard field cannot say is kept: our exports put the canonical record (task, reviews,
outcome, reward, verifier output, tools, steps, ...) under `extra.trajplatform` (ATIF) /
`details.trajplatform` (ADP), and anything the standard fields cannot say exactly beside the step,
so export -> import -> export gives the same lines. A file from another tool keeps, beside each
message or call (`provenance.<format>`), what of its item the export would not write again
(`name`, a null description, `extra`, timestamps, metrics, fields this reader does not know), and
its document's own fields (details, agent, final_metrics, info, ...) under
`config_snapshot.imported_from.kept`: its export gives the file back, apart from ids and with the
current schema_version. Its tasks get the scene given on import (default code_exec), an external id
from the trajectory / session / instance id, and the outcome given on import — a foreign trajectory
says nothing verifiable about success, so import refuses one without `outcome` rather than guess.
The import builds the platform's steps from the messages (apps.datasets.interchange._common.steps_of:
one per tool call, and one per assistant text turn in the ReAct text protocol, which stays text)
and the content hash.
"""
from __future__ import annotations

import codecs
import io
from pathlib import Path
from typing import Any, Iterator

import orjson

from apps.datasets.record_schema import RenderError

from apps.datasets.record_schema import RAW_SCHEMA_VERSION
from apps.engines.registry import scene_ids
from trajplatform import json_limits
from trajplatform.redaction import unstorable_fields

from ._common import OUTCOMES, Image, InterchangeError
from .adp import ADP_VERSION, ADP_VERSIONS, WEB_TEXT_MAX_CHARS, from_adp, render_adp, validate_adp
from .atif import AGENT_NAME, AGENT_VERSION, ATIF_VERSION, ATIF_VERSIONS, from_atif, render_atif, validate_atif
from .mini_swe_agent import TRAJECTORY_FORMAT, from_mini_swe_agent, render_mini_swe_agent, validate_mini_swe_agent

__all__ = [
    "ADP_VERSION", "ADP_VERSIONS", "AGENT_NAME", "AGENT_VERSION", "ATIF_VERSION", "ATIF_VERSIONS", "IMPORT_FORMATS",
    "MAX_ERRORS", "OUTCOMES", "READERS", "TRAJECTORY_FORMAT", "WEB_TEXT_MAX_CHARS", "Image", "InterchangeError",
    "from_adp", "from_atif", "from_mini_swe_agent", "looks_like", "render_adp", "render_atif", "render_mini_swe_agent",
    "to_raw_lines", "validate_adp", "validate_atif", "validate_mini_swe_agent",
]

IMPORT_FORMATS = ("atif", "adp", "mini-swe-agent")
MAX_ERRORS = 1000


# --- import -----------------------------------------------------------------------------------

def _text(data: bytes, label: str) -> bytes:
    """The file as UTF-8 JSON text: a UTF-8 byte order mark dropped (RFC 8259 lets a reader ignore
    it; Windows tools write it), any other encoding refused with one error saying which."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise InterchangeError(f"{label}: UTF-16 text (its byte order mark says so); save the file as UTF-8")
    if b"\x00" in data[:4]:
        raise InterchangeError(f"{label}: not UTF-8 JSON text (NUL bytes at its start: UTF-16, UTF-32 or binary); "
                               "save the file as UTF-8")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InterchangeError(f"{label}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                               "save the file as UTF-8") from None
    return data


def _parsed(text: bytes, label: str) -> Any:
    """The file as one JSON value (a document or a list of them), None when it is JSONL; a file that
    is one broken document (its lines are no JSON objects of their own) is refused with the one
    parse error, not one per line."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        whole = exc
    for line in text.splitlines():
        try:
            if isinstance(orjson.loads(line), dict):
                return None  # JSONL: each line is read (and reported) on its own
        except orjson.JSONDecodeError:
            continue
    raise InterchangeError(f"{label}: not valid JSON ({whole})")


def _documents(text: bytes, whole: Any, label: str) -> Iterator[tuple[str, Any]]:
    """One JSON document (trajectory.json, .traj.json), a JSON list of them, or JSONL; (where, object) each."""
    if isinstance(whole, list):
        for i, obj in enumerate(whole):
            yield f"{label}[{i}]", obj
        return
    if whole is not None:
        yield f"{label}:1", whole  # one document (trajectory.json), from its first line
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{label}:{number}", orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            yield f"{label}:{number}", InterchangeError(f"{label}:{number}: not valid JSON ({exc})")


READERS = {"atif": from_atif, "adp": from_adp, "mini-swe-agent": from_mini_swe_agent}


def looks_like(whole: Any) -> tuple[str, str | None]:
    """What a parsed file (or its first document) looks like: a description and the import format
    that reads it (None when none does)."""
    if isinstance(whole, list) and whole and all(isinstance(m, dict) and "role" in m and "class_" not in m
                                                 for m in whole):
        return f"a bare list of {len(whole)} chat messages (role/content)", None
    if isinstance(whole, list) and whole:
        whole = whole[0]
    if not isinstance(whole, dict):
        return "not a JSON object", None
    if isinstance(whole.get("steps"), list) and str(whole.get("schema_version") or "").startswith("ATIF"):
        return f"an ATIF trajectory ({whole['schema_version']})", "atif"
    if isinstance(whole.get("content"), list) and any(isinstance(i, dict) and "class_" in i for i in whole["content"]):
        return "an ADP trajectory (content items with class_)", "adp"
    if whole.get("schema_version") == RAW_SCHEMA_VERSION:
        return f"a line of our raw export ({RAW_SCHEMA_VERSION})", "raw"
    if isinstance(whole.get("messages"), list) and ("info" in whole or "trajectory_format" in whole):
        return "a mini-swe-agent saved trajectory (info, messages)", "mini-swe-agent"
    return "an object with none of the formats' fields", None


def _refuse_other_shapes(text: bytes, whole: Any, fmt: str, label: str) -> None:
    """One error for a file that is not what `fmt` reads, naming what it looks like."""
    if whole is None:  # JSONL: its first line
        first = next((line for line in text.splitlines() if line.strip()), b"")
        try:
            whole = orjson.loads(first)
        except orjson.JSONDecodeError:
            return  # the per-line errors say where it is not JSON
    what, reader = looks_like(whole)
    if reader == fmt or (reader is None and not what.startswith("a bare list")):
        return
    hint = f"; import it with format {reader}" if reader else ""
    if fmt == "mini-swe-agent" and reader is None:
        hint = ("; mini-swe-agent saves a run as an object {info, messages, trajectory_format} "
                "(<instance_id>.traj.json): a list of messages alone (as its tests/test_data ship) has no run to import")
    raise InterchangeError(f"{label}: {what}, not {'an' if fmt[0] in 'aeiou' else 'a'} {fmt} file{hint}")


def to_raw_lines(data: bytes, fmt: str, *, label: str, outcome: str | None = None, scene: str | None = None,
                 images: dict[str, Image] | None = None, warnings: list[str] | None = None) -> bytes:
    """The canonical raw JSONL for an ATIF / ADP / mini-swe-agent file; InterchangeError lists every
    bad document as `FILE:LINE: reason`. `images` collects the images the lines name (sha256 ->
    Image) for the caller to store; `warnings` what a reader saw that the import does not act on."""
    if fmt not in READERS:
        raise InterchangeError(f"unknown import format {fmt!r}; one of: raw, {', '.join(IMPORT_FORMATS)}")
    if scene is not None and scene not in scene_ids():  # an option of the import, refused as one
        raise InterchangeError(f"unknown scene {scene!r}; valid scenes: {', '.join(scene_ids())}", field="scene")
    options = {"outcome": outcome, "scene": scene, "file": Path(label).name, "images": images, "warnings": warnings}
    text = _text(data, label).strip()
    if not text:
        raise InterchangeError(f"{label}: empty file")
    try:  # before any parse: the readers, the record's JSON and the database's each recurse per level
        json_limits.check_depth(text)
    except json_limits.JSONTooDeep as exc:
        raise InterchangeError(f"{label}: {exc} (API_MAX_JSON_DEPTH); no trajectory nests that deep") from None
    whole = _parsed(text, label)
    nul = b"\\u0000" in text  # escaped NUL: PostgreSQL's jsonb cannot store it
    _refuse_other_shapes(text, whole, fmt, label)
    out = io.BytesIO()
    errors: list[str] = []
    field_errors: list[InterchangeError] = []
    for n, (where, obj) in enumerate(_documents(text, whole, label), start=1):
        try:
            if isinstance(obj, InterchangeError):
                raise obj
            unstorable = unstorable_fields(obj) if nul else []
            if unstorable:  # refused, not altered, as a task import refuses it: it is the file's text
                raise InterchangeError(where, [f"{where}: {path}: {reason}" for path, reason in unstorable])
            record = READERS[fmt](obj, n, options, where)
        except (InterchangeError, RenderError) as exc:
            found = exc.errors if isinstance(exc, InterchangeError) else [str(exc)]
            if isinstance(exc, InterchangeError):
                field_errors.append(exc)
            errors += [e if e.startswith(where) else f"{where}: {e}" for e in found[:MAX_ERRORS - len(errors)]]
            if len(errors) >= MAX_ERRORS:
                errors.append(f"{label}: stopped after {MAX_ERRORS} errors")
                break
            continue
        out.write(orjson.dumps(record, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE))
    if errors:
        fields = {e.field for e in field_errors}
        raise InterchangeError(errors[0], errors, field=fields.pop() if len(fields) == 1 else "")
    return out.getvalue()
