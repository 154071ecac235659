"""Interchange with other agent tools: ATIF (Harbor) and the Agent Data Protocol (neulab) out and in,
mini-swe-agent's trajectory JSON in.

* **ATIF** (Agent Trajectory Interchange Format, Harbor's RFC 0001, schema "ATIF-v1.4"): one
  trajectory object `{schema_version, session_id, agent{name, version, model_name}, steps,
  final_metrics, extra}` per line. A system step, a user step, then one agent step per assistant
  turn: `message`, `reasoning_content`, `tool_calls [{tool_call_id, function_name, arguments
  (object)}]` and the turn's tool results as `observation.results [{source_call_id, content}]`.
* **ADP** (Agent Data Protocol, schema "1.2.0"): `{schema_version, id, content, details}` with
  `content` a sequence of `text_observation` (the user's prompt: source "user_msg"; tool results:
  source "environment" with `tool_call_id`), `api_action` (a tool call: `function`, `kwargs`,
  `tool_call_id`, the turn's text as `description`, `reasoning_content`) and `message_action`
  (assistant text without calls). ADP has no system role: the system prompt is in `details`.
  On import, a `web_observation` (`url`, `axtree`, `html`, `image_observation`, `viewport_size`)
  becomes the text the agent saw: `URL: <url>`, a blank line, then the accessibility tree or,
  failing that, the HTML reduced to its visible text, cut at WEB_TEXT_MAX_CHARS (the original
  field kept under the message's `provenance` when cut). An observation answers its
  `tool_call_id`, else the oldest unanswered call of the turn before it; with none, an environment
  message (role user, `provenance.source` "environment", never the task's prompt). An
  `image_observation` (alone or a web observation's screenshot) goes to the artifact store when
  its content is a data: URL and follows as a user message with an `artifact:<sha>` image part,
  as the gui scene's screenshots do; a path or link is refused (nothing is fetched).
* **mini-swe-agent** (`<instance_id>.traj.json`, trajectory_format "mini-swe-agent-1.1"), import
  only: assistant turns become `bash` tool calls (from `extra.actions`, else the fenced command
  block), the `<returncode>` user messages after them their results; tool-call mode
  (`tool_calls` + role `tool`) is read as is; the `exit` message is dropped and `info.submission`
  becomes the final answer.

Our exports put the canonical record's other fields (task, reviews, outcome, reward, verifier
output, tools, steps, ...) under `extra.trajplatform` (ATIF) / `details.trajplatform` (ADP), and
anything the standard fields cannot say exactly (a null content, tool-call arguments that are
not the canonical JSON of their object) beside the step; so export -> import -> export gives the
same lines. Files from other tools carry none of that: their tasks get the scene given on import
(default code_exec), an external id from the session / instance / trajectory id, the source file,
format and agent under `config_snapshot.imported_from`, and the outcome given on import — a
foreign trajectory says nothing verifiable about success, so import refuses one without
`outcome` rather than guess.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterator

import orjson

from apps.datasets.record_schema import RenderError

from ._common import OUTCOMES, Image, InterchangeError
from .adp import ADP_VERSION, ADP_VERSIONS, WEB_TEXT_MAX_CHARS, from_adp, render_adp, validate_adp
from .atif import AGENT_NAME, AGENT_VERSION, ATIF_VERSION, ATIF_VERSIONS, from_atif, render_atif, validate_atif
from .mini_swe_agent import from_mini_swe_agent

__all__ = [
    "ADP_VERSION", "ADP_VERSIONS", "AGENT_NAME", "AGENT_VERSION", "ATIF_VERSION", "ATIF_VERSIONS", "IMPORT_FORMATS",
    "MAX_ERRORS", "OUTCOMES", "READERS", "WEB_TEXT_MAX_CHARS", "Image", "InterchangeError", "from_adp", "from_atif",
    "from_mini_swe_agent", "render_adp", "render_atif", "to_raw_lines", "validate_adp",
    "validate_atif",
]

IMPORT_FORMATS = ("atif", "adp", "mini-swe-agent")
MAX_ERRORS = 1000


# --- import -----------------------------------------------------------------------------------

def _documents(data: bytes, label: str) -> Iterator[tuple[str, Any]]:
    """One JSON document (trajectory.json, .traj.json) or JSONL; (where, object) each."""
    text = data.strip()
    if not text:
        raise InterchangeError(f"{label}: empty file")
    try:
        whole = orjson.loads(text)
    except orjson.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        yield f"{label}:1", whole  # one document (trajectory.json), from its first line
        return
    if isinstance(whole, list):
        for i, obj in enumerate(whole):
            yield f"{label}[{i}]", obj
        return
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{label}:{number}", orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            yield f"{label}:{number}", InterchangeError(f"{label}:{number}: not valid JSON ({exc})")


READERS = {"atif": from_atif, "adp": from_adp, "mini-swe-agent": from_mini_swe_agent}


def to_raw_lines(data: bytes, fmt: str, *, label: str, outcome: str | None = None, scene: str | None = None,
                 images: dict[str, Image] | None = None) -> bytes:
    """The canonical raw JSONL for an ATIF / ADP / mini-swe-agent file; InterchangeError lists every
    bad document as `FILE:LINE: reason`. `images` collects the images the lines name (sha256 ->
    Image) for the caller to store."""
    if fmt not in READERS:
        raise InterchangeError(f"unknown import format {fmt!r}; one of: raw, {', '.join(IMPORT_FORMATS)}")
    options = {"outcome": outcome, "scene": scene, "file": Path(label).name, "images": images}
    out = io.BytesIO()
    errors: list[str] = []
    for n, (where, obj) in enumerate(_documents(data, label), start=1):
        try:
            if isinstance(obj, InterchangeError):
                raise obj
            record = READERS[fmt](obj, n, options, where)
        except (InterchangeError, RenderError) as exc:
            found = exc.errors if isinstance(exc, InterchangeError) else [str(exc)]
            errors += [e if e.startswith(where) else f"{where}: {e}" for e in found]
            if len(errors) >= MAX_ERRORS:
                errors.append(f"{label}: stopped after {MAX_ERRORS} errors")
                break
            continue
        out.write(orjson.dumps(record, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE))
    if errors:
        raise InterchangeError(errors[0], errors)
    return out.getvalue()
