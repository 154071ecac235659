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

import base64
import binascii
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import orjson
from django.db import transaction

from .exporters.chat import RenderError
from .exporters.formats import _keys
from .exporters.records import RAW_SCHEMA_VERSION

ATIF_VERSION = "ATIF-v1.4"
ATIF_VERSIONS = ("ATIF-v1.0", "ATIF-v1.1", "ATIF-v1.2", "ATIF-v1.3", "ATIF-v1.4", "ATIF-v1.5")
ADP_VERSION = "1.2.0"
ADP_VERSIONS = ("1.0.0", "1.1.0", "1.2.0")
AGENT_NAME = "trajplatform"
AGENT_VERSION = "1"
IMPORT_FORMATS = ("atif", "adp", "mini-swe-agent")
OUTCOMES = ("success", "failure")
_KEPT_OUT = ("messages",)  # rebuilt from the steps / content
WEB_TEXT_MAX_CHARS = 20_000  # a web observation's page text (the gui scene's snapshot cap)
MAX_ERRORS = 1000


class InterchangeError(ValueError):
    """A file that cannot be imported; `errors` lists every problem as `FILE:LINE: reason`."""

    def __init__(self, message: str, errors: list[str] | None = None):
        self.errors = errors or [message]
        super().__init__(message)


def _args_object(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        raise RenderError(f"tool-call arguments are not JSON: {str(raw)[:60]!r}") from None
    if not isinstance(value, dict):
        raise RenderError("tool-call arguments are not a JSON object")
    return value


def _args_text(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


def _turns(messages: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(message, the tool messages right after it) for each non-tool message."""
    i = 0
    while i < len(messages):
        msg = messages[i]
        if not isinstance(msg, dict):
            raise RenderError(f"messages[{i}]: not an object")
        j = i + 1
        while j < len(messages) and isinstance(messages[j], dict) and messages[j].get("role") == "tool":
            j += 1
        if msg.get("role") == "tool":
            raise RenderError(f"messages[{i}]: a tool result that follows no assistant turn")
        yield msg, messages[i + 1:j]
        i = j


def _as_written(value: Any) -> Any:
    """The value as a reader gets it back from the line (exports sort keys, so argument objects too)."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))


def _argument_texts(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Call id -> the arguments as the model wrote them, where that is not how we would write their object
    (key order, spacing): the standard formats carry arguments as objects, and exports sort keys."""
    out = {}
    for msg in messages:
        for call in msg.get("tool_calls") or []:
            raw = call.get("function", {}).get("arguments")
            if isinstance(raw, str) and isinstance(call.get("id"), str):
                try:
                    rewritten = _args_text(_as_written(_args_object(raw)))
                except RenderError:
                    continue
                if rewritten != raw:
                    out[call["id"]] = raw
    return out


def _restore_arguments(messages: list[dict[str, Any]], originals: Any) -> list[dict[str, Any]]:
    if isinstance(originals, dict) and originals:
        for msg in messages:
            for call in msg.get("tool_calls") or []:
                if call.get("id") in originals:
                    call["function"]["arguments"] = originals[call["id"]]
    return messages


def _provenance(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in _KEPT_OUT}


# --- ATIF -------------------------------------------------------------------------------------

def render_atif(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("no messages")
    steps: list[dict[str, Any]] = []
    for msg, results in _turns(messages):
        role = msg.get("role")
        step: dict[str, Any] = {"step_id": len(steps) + 1}
        if role in ("system", "user"):
            step.update(source=role, message=msg.get("content") or "")
        elif role == "assistant":
            step.update(source="agent", message=msg.get("content") or "")
            if record.get("model"):
                step["model_name"] = record["model"]
            if isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
                step["reasoning_content"] = msg["reasoning_content"]
            calls = msg.get("tool_calls") or []
            if calls:
                step["tool_calls"] = [{"tool_call_id": c.get("id") or "", "function_name": c["function"]["name"],
                                       "arguments": _args_object(c["function"].get("arguments"))} for c in calls]
            if results:
                step["observation"] = {"results": [
                    {"source_call_id": r.get("tool_call_id"), "content": r.get("content") or ""} for r in results]}
        else:
            raise RenderError(f"unsupported role {role!r}")
        originals = _argument_texts([msg])
        if originals:
            step["extra"] = {"trajplatform_arguments": originals}
        if _messages_of_atif_step(_as_written(step)) != [msg, *results]:
            step["extra"] = {"trajplatform_messages": [msg, *results]}
        steps.append(step)
    agent = {"name": AGENT_NAME, "version": AGENT_VERSION, "extra": {}}
    if record.get("model"):
        agent["model_name"] = record["model"]
    final = {"total_prompt_tokens": record.get("prompt_tokens") or 0,
             "total_completion_tokens": record.get("completion_tokens") or 0,
             "total_steps": len(steps), "extra": {"reward": record.get("reward"), "outcome": record.get("outcome")}}
    try:
        final["total_cost_usd"] = float(record.get("cost_usd") or 0)
    except (TypeError, ValueError):
        pass
    task = record.get("task") or {}
    return {"schema_version": ATIF_VERSION, "session_id": f"trajplatform-{record['trajectory_id']}",
            "agent": agent, "steps": steps, "final_metrics": final,
            "notes": f"trajplatform {task.get('scene') or ''} trajectory {record['trajectory_id']} of task "
                     f"{record['task_id']}; extra.trajplatform holds the platform's record",
            "extra": {"trajplatform": _provenance(record)}}


def _messages_of_atif_step(step: dict[str, Any]) -> list[dict[str, Any]]:
    extra = step.get("extra") or {}
    if isinstance(extra.get("trajplatform_messages"), list):
        return extra["trajplatform_messages"]
    source = step.get("source")
    message = step.get("message")
    if source in ("system", "user"):
        return [{"role": source, "content": message if isinstance(message, str) else ""}]
    calls = step.get("tool_calls") or []
    out: dict[str, Any] = {"role": "assistant", "content": message if message or not calls else None}
    if step.get("reasoning_content"):
        out["reasoning_content"] = step["reasoning_content"]
    names: dict[str, str] = {}
    if calls:
        out["tool_calls"] = []
        for call in calls:
            args = call.get("arguments")
            out["tool_calls"].append({"id": call.get("tool_call_id"), "type": "function", "function": {
                "name": call.get("function_name"), "arguments": _args_text(args if isinstance(args, dict) else {})}})
            names[call.get("tool_call_id")] = call.get("function_name")
    results = ((step.get("observation") or {}).get("results")) or []
    tools = [{"role": "tool", "tool_call_id": r.get("source_call_id"), "name": names.get(r.get("source_call_id"), ""),
              "content": r.get("content") if isinstance(r.get("content"), str) else ""} for r in results]
    return _restore_arguments([out, *tools], extra.get("trajplatform_arguments"))


def _head(obj: Any, required: set[str], optional: set[str], versions: tuple[str, ...], id_key: str) -> list[str]:
    """A document's keys, its schema_version among versions, and a non-empty id."""
    problems = _keys(obj, required, optional)
    if not isinstance(obj, dict):
        return problems
    if obj.get("schema_version") not in versions:
        problems.append(f"line.schema_version: one of {', '.join(versions)}")
    if not isinstance(obj.get(id_key), str) or not obj[id_key]:
        problems.append(f"line.{id_key}: a non-empty string")
    return problems


def validate_atif(obj: Any) -> list[str]:
    problems = _head(obj, {"schema_version", "session_id", "agent", "steps"}, {"notes", "final_metrics", "extra"},
                     ATIF_VERSIONS, "session_id")
    if problems and not isinstance(obj, dict):
        return problems
    agent = obj.get("agent")
    if not isinstance(agent, dict) or not all(isinstance(agent.get(k), str) for k in ("name", "version")):
        problems.append("line.agent: needs name and version strings")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        return problems + ["line.steps: a non-empty list"]
    for i, step in enumerate(steps):
        at = f"line.steps[{i}]"
        if not isinstance(step, dict):
            problems.append(f"{at}: must be an object")
            continue
        if step.get("step_id") != i + 1:
            problems.append(f"{at}.step_id: must be {i + 1} (ordinal from 1)")
        if step.get("source") not in ("system", "user", "agent"):
            problems.append(f"{at}.source: one of system, user, agent")
        if not isinstance(step.get("message"), str):
            problems.append(f"{at}.message: a string (may be empty)")
        ids = set()
        for j, call in enumerate(step.get("tool_calls") or []):
            if step.get("source") != "agent":
                problems.append(f"{at}.tool_calls: only agent steps call tools")
            if not isinstance(call, dict) or not isinstance(call.get("tool_call_id"), str) \
                    or not isinstance(call.get("function_name"), str) or not isinstance(call.get("arguments"), dict):
                problems.append(f"{at}.tool_calls[{j}]: needs tool_call_id, function_name and an arguments object")
            else:
                ids.add(call["tool_call_id"])
        observation = step.get("observation")
        if observation is not None:
            results = observation.get("results") if isinstance(observation, dict) else None
            if not isinstance(results, list):
                problems.append(f"{at}.observation.results: a list")
            else:
                for j, result in enumerate(results):
                    source = result.get("source_call_id") if isinstance(result, dict) else 0
                    if source is not None and source not in ids:
                        problems.append(f"{at}.observation.results[{j}].source_call_id: {source!r} is no call of "
                                        "this step")
    return problems


# --- ADP --------------------------------------------------------------------------------------

def render_adp(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("no messages")
    content: list[dict[str, Any]] = []
    system: list[str] = []
    for msg, results in _turns(messages):
        role = msg.get("role")
        if role == "system":
            system.append(msg.get("content") or "")
        elif role == "user" and isinstance(msg.get("content"), list):
            content += _adp_images(msg["content"])
        elif role == "user":
            content.append({"class_": "text_observation", "content": msg.get("content") or "", "source": "user_msg"})
        elif role == "assistant":
            content += _adp_items(msg, results)
        else:
            raise RenderError(f"unsupported role {role!r}")
    details: dict[str, Any] = {"trajplatform": _provenance(record), "system": "\n\n".join(system) or None}
    originals = _argument_texts(messages)
    if originals:
        details["trajplatform_arguments"] = originals
    if _adp_messages(_as_written(content), details) != messages:
        details["trajplatform_messages"] = messages  # what the standard items cannot say exactly
    return {"schema_version": ADP_VERSION, "id": f"trajplatform-{record['trajectory_id']}", "content": content,
            "details": details}


def _adp_images(parts: list[Any]) -> list[dict[str, Any]]:
    """A vision episode's image message (the page after a turn) as ADP image observations, the
    image inlined as a data: URL (ADP takes a path, a link or a data: URL; ours are in the store).
    The message's text label has no ADP field: `trajplatform_messages` keeps it."""
    from trajplatform import artifacts

    items = []
    for part in parts:
        url = str(((part or {}).get("image_url") or {}).get("url", "")) if isinstance(part, dict) else ""
        if url.startswith(artifacts.URL_PREFIX):
            try:
                data = artifacts.data_url(url[len(artifacts.URL_PREFIX):])
            except artifacts.ArtifactError as exc:
                raise RenderError(f"image {url[len(artifacts.URL_PREFIX):][:12]}: {exc}") from None
            items.append({"class_": "image_observation", "content": data, "source": "environment"})
        elif not (isinstance(part, dict) and part.get("type") == "text"):
            raise RenderError(f"a user message part {str(part)[:60]!r} is neither text nor a stored image")
    return items


def _adp_items(msg: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = msg.get("content") or ""
    calls = msg.get("tool_calls") or []
    reasoning = msg.get("reasoning_content") if isinstance(msg.get("reasoning_content"), str) else None
    items: list[dict[str, Any]] = []
    if not calls:
        item = {"class_": "message_action", "content": text}
        if reasoning:
            item["reasoning_content"] = reasoning
        items.append(item)
    for k, call in enumerate(calls):
        item = {"class_": "api_action", "function": call["function"]["name"],
                "kwargs": _args_object(call["function"].get("arguments")), "tool_call_id": call.get("id")}
        if k == 0 and text:
            item["description"] = text
        if k == 0 and reasoning:
            item["reasoning_content"] = reasoning
        items.append(item)
    for result in results:
        items.append({"class_": "text_observation", "content": result.get("content") or "",
                      "source": "environment", "tool_call_id": result.get("tool_call_id")})
    return items


def _adp_messages(items: list[dict[str, Any]], details: dict[str, Any],
                  images: dict[str, Image] | None = None) -> list[dict[str, Any]]:
    exact = details.get("trajplatform_messages")
    if isinstance(exact, list):
        if images is not None:  # the file's own images are stored (another deployment's store lacks them)
            _messages_of_adp(items, images)
        return exact
    system = details.get("system")
    head = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
    return _restore_arguments(head + _messages_of_adp(items, images), details.get("trajplatform_arguments"))


def _messages_of_adp(items: list[dict[str, Any]], images: dict[str, Image] | None = None
                     ) -> list[dict[str, Any]]:
    """Our messages from ADP content items (api_actions in a row are one assistant turn).

    An observation answers its tool_call_id, else the oldest unanswered call of the assistant turn
    before it, else it is an environment message. `images` collects the decoded images (sha256 ->
    Image) that the messages' `artifact:<sha>` parts name, for the importer to store."""
    out: list[dict[str, Any]] = []
    names: dict[Any, str] = {}
    pending: list[Any] = []  # calls not answered yet, oldest first
    for i, item in enumerate(items):
        kind = item.get("class_")
        if kind in _ADP_OBSERVATIONS:
            out += _observation_messages(item, pending, names, images)
        elif kind == "message_action":
            pending.clear()  # a new turn: an earlier call left unanswered stays so
            msg = {"role": "assistant", "content": item.get("content") or ""}
            if item.get("reasoning_content"):
                msg["reasoning_content"] = item["reasoning_content"]
            out.append(msg)
        elif kind == "api_action":
            kwargs = item.get("kwargs") if isinstance(item.get("kwargs"), dict) else {}
            # files before ADP's tool_call_id (1.0.0) link a result to the action before it
            call_id = item["tool_call_id"] if item.get("tool_call_id") is not None else f"adp_call_{i}"
            call = {"id": call_id, "type": "function",
                    "function": {"name": item.get("function"), "arguments": _args_text(kwargs)}}
            names[call_id] = item.get("function") or ""
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") \
                    and not item.get("description") and not item.get("reasoning_content"):
                last["tool_calls"].append(call)
                pending.append(call_id)
            else:
                pending[:] = [call_id]
                msg = {"role": "assistant", "content": item.get("description") or None}
                if item.get("reasoning_content"):
                    msg["reasoning_content"] = item["reasoning_content"]
                msg["tool_calls"] = [call]
                out.append(msg)
        elif kind == "code_action":
            call_id = item.get("tool_call_id") or f"adp_code_{len(out)}"
            names[call_id] = "run_shell"
            pending[:] = [call_id]
            out.append({"role": "assistant", "content": item.get("description") or None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {
                    "name": "run_shell", "arguments": _args_text({"command": item.get("content") or ""})}}]})
        else:
            raise InterchangeError(f"ADP content item {kind!r} is not supported")
    return out


def _observation_messages(item: dict[str, Any], pending: list[Any], names: dict[Any, str],
                          images: dict[str, Image] | None) -> list[dict[str, Any]]:
    """The message(s) an observation becomes: the user's, a tool result or an environment message,
    then, for an image, a user message with its `artifact:<sha>` part."""
    kind = item["class_"]
    kept: dict[str, Any] = {}
    if kind == "web_observation":
        text, kept = _web_text(item)
        shot = item.get("image_observation")
    elif kind == "image_observation":
        text, shot = "", item
    else:
        text, shot = item.get("content") or "", None
    out: list[dict[str, Any]] = []
    if item.get("source") == "user_msg":
        if kind == "text_observation":
            out.append({"role": "user", "content": text})
    else:
        call_id = item.get("tool_call_id")
        if call_id is None and pending:
            call_id = pending[0]
        if call_id is not None:
            if call_id in pending:
                pending.remove(call_id)
            out.append({"role": "tool", "tool_call_id": call_id, "name": names.get(call_id, ""), "content": text})
        elif text or kind == "text_observation":
            out.append({"role": "user", "content": text, "provenance": {"format": "adp", "source": "environment"}})
        if kept and out:
            out[-1].setdefault("provenance", {"format": "adp"})["original"] = kept
    if shot is not None:
        image = _image_data(shot.get("content"))
        sha = hashlib.sha256(image.data).hexdigest()
        if images is not None:
            images[sha] = image
        message: dict[str, Any] = {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"artifact:{sha}"}}]}
        if shot.get("annotations"):
            message["provenance"] = {"format": "adp", "annotations": shot["annotations"]}
        out.append(message)
    return out


def _web_text(item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A web observation as the agent read it: `URL: <url>`, then its accessibility tree or, failing
    that, its HTML's visible text, cut at WEB_TEXT_MAX_CHARS; and {field: original} when cut."""
    body, field = "", None
    for name in ("axtree", "html"):
        value = item.get(name)
        if isinstance(value, str) and value.strip():
            body, field = (value if name == "axtree" else _html_text(value)), name
            break
    kept: dict[str, Any] = {}
    if len(body) > WEB_TEXT_MAX_CHARS:
        kept = {field: item[field]}
        body = (f"{body[:WEB_TEXT_MAX_CHARS]}\n[... cut at {WEB_TEXT_MAX_CHARS} of {len(body)} characters; "
                f"the original {field} is kept with the record ...]")
    url = item.get("url")
    return "\n\n".join(p for p in (f"URL: {url}" if url else "", body) if p), kept


_HIDDEN_TAGS = ("head", "script", "style", "noscript", "template")
_BLOCK_TAGS = ("br", "p", "div", "li", "tr", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "pre",
               "option", "button", "label", "section", "article", "form", "table", "ul", "ol", "nav", "header",
               "footer", "a", "input", "select", "textarea")


def _html_text(html: str) -> str:
    """The visible text of a page (navigation included: a web agent acts on it), one block a line."""
    import lxml.etree
    import lxml.html

    try:
        root = lxml.html.fromstring(html)
    except (ValueError, lxml.etree.ParserError) as exc:
        raise InterchangeError(f"web_observation.html cannot be parsed as HTML ({exc})") from None
    for hidden in root.xpath("|".join(f"//{t}" for t in _HIDDEN_TAGS)):
        if hidden.getparent() is not None:
            hidden.drop_tree()
    for block in root.iter(*_BLOCK_TAGS):
        block.tail = "\n" + (block.tail or "")
    lines = (" ".join(line.split()) for line in root.text_content().split("\n"))
    return "\n".join(line for line in lines if line)


class Image(NamedTuple):
    data: bytes
    mime: str
    width: int
    height: int


_DATA_URL = re.compile(r"^data:(image/[a-z]+);base64,(.*)$", re.S)


def _image_data(content: Any) -> Image:
    """An ADP image the importer can keep: a data: URL of a PNG, JPEG, WebP or GIF (nothing is fetched)."""
    from PIL import Image as PilImage, UnidentifiedImageError

    from trajplatform import artifacts

    match = _DATA_URL.match(content) if isinstance(content, str) else None
    if match is None:
        raise InterchangeError(f"the image {str(content)[:80]!r} is a path or link; only images inlined as "
                               "data:image/...;base64 URLs can be imported (nothing is fetched)")
    if match.group(1) not in artifacts.EXTENSIONS:
        raise InterchangeError(f"the image type {match.group(1)} is not one of {', '.join(artifacts.EXTENSIONS)}")
    try:
        data = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise InterchangeError("the image's data: URL is not valid base64") from None
    if not data or len(data) > artifacts.MAX_BYTES:
        raise InterchangeError(f"the image has {len(data)} bytes; 1 to {artifacts.MAX_BYTES} can be stored")
    try:
        with PilImage.open(io.BytesIO(data)) as opened:
            width, height = opened.size
    except (UnidentifiedImageError, OSError):
        raise InterchangeError(f"the image's data is not a readable {match.group(1)}") from None
    return Image(data, match.group(1), width, height)


_ADP_SOURCES = ("user_msg", "agent", "environment")
_ADP_OBSERVATIONS = ("text_observation", "web_observation", "image_observation")
_ADP_IMAGE_KEYS = ({"class_", "content", "source"}, {"annotations", "tool_call_id", "reward"})
_ADP_ITEM_KEYS = {
    "text_observation": ({"class_", "content", "source"}, {"tool_call_id", "reward", "name"}),
    # ADP's WebObservation: html, url, image_observation and viewport_size required (may be null)
    "web_observation": ({"class_", "html", "url", "image_observation", "viewport_size"},
                        {"axtree", "tool_call_id", "reward"}),
    "image_observation": _ADP_IMAGE_KEYS,
    "message_action": ({"class_", "content"}, {"description", "reasoning_content"}),
    "api_action": ({"class_", "function", "kwargs"}, {"description", "reasoning_content", "tool_call_id",
                                                       "function_call"}),
    "code_action": ({"class_", "language", "content"}, {"description", "reasoning_content", "tool_call_id"}),
}


def _image_problems(image: Any, at: str) -> list[str]:
    problems = _keys(image, *_ADP_IMAGE_KEYS, where=at)
    if not isinstance(image, dict):
        return problems
    if image.get("source") not in _ADP_SOURCES:
        problems.append(f"{at}.source: one of {', '.join(_ADP_SOURCES)}")
    try:
        _image_data(image.get("content"))
    except InterchangeError as exc:
        problems.append(f"{at}.content: {exc}")
    return problems


def _web_problems(item: dict[str, Any], at: str) -> list[str]:
    problems = [f"{at}.{k}: a string or null" for k in ("html", "axtree", "url")
                if item.get(k) is not None and not isinstance(item[k], str)]
    size = item.get("viewport_size")
    if size is not None and not (isinstance(size, list) and len(size) == 2
                                 and all(isinstance(v, int) and not isinstance(v, bool) for v in size)):
        problems.append(f"{at}.viewport_size: [width, height] or null")
    if item.get("image_observation") is not None:
        problems += _image_problems(item["image_observation"], f"{at}.image_observation")
    elif not any(isinstance(item.get(k), str) and item[k].strip() for k in ("url", "axtree", "html")):
        problems.append(f"{at}: a web observation with no url, axtree, html or image")
    return problems


def validate_adp(obj: Any) -> list[str]:
    problems = _head(obj, {"schema_version", "id", "content"}, {"details", "available_apis"}, ADP_VERSIONS, "id")
    if problems and not isinstance(obj, dict):
        return problems
    items = obj.get("content")
    if not isinstance(items, list) or not items:
        return problems + ["line.content: a non-empty list"]
    call_ids: set[Any] = set()
    for i, item in enumerate(items):
        at = f"line.content[{i}]"
        kind = item.get("class_") if isinstance(item, dict) else None
        if kind not in _ADP_ITEM_KEYS:
            problems.append(f"{at}.class_: one of {', '.join(_ADP_ITEM_KEYS)}")
            continue
        if kind == "image_observation":
            problems += _image_problems(item, at)
        else:
            problems += _keys(item, *_ADP_ITEM_KEYS[kind], where=at)
        if kind == "text_observation" and item.get("source") not in _ADP_SOURCES:
            problems.append(f"{at}.source: one of {', '.join(_ADP_SOURCES)}")
        if kind in ("text_observation", "message_action") and not isinstance(item.get("content"), str):
            problems.append(f"{at}.content: a string")
        if kind == "web_observation":
            problems += _web_problems(item, at)
        if kind == "api_action" and not isinstance(item.get("kwargs"), dict):
            problems.append(f"{at}.kwargs: an object")
        if kind in ("api_action", "code_action") and item.get("tool_call_id") is not None:
            call_ids.add(item["tool_call_id"])
        if kind in _ADP_OBSERVATIONS and item.get("tool_call_id") is not None \
                and item["tool_call_id"] not in call_ids:
            problems.append(f"{at}.tool_call_id: matches no earlier action")
    return problems


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


def _tools_for(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = sorted({c["function"]["name"] for m in messages for c in m.get("tool_calls") or []})
    return [{"type": "function", "function": {"name": n, "description": "", "parameters": {
        "type": "object", "properties": {}}}} for n in names]


def _foreign_record(messages: list[dict[str, Any]], *, n: int, external_id: str, source: dict[str, Any],
                    options: dict[str, Any], model: str = "", final_answer: str = "",
                    tokens: tuple[int, int] = (0, 0), cost: float = 0.0, reward: Any = None) -> dict[str, Any]:
    outcome = options.get("outcome")
    if outcome not in OUTCOMES:
        raise InterchangeError(f"{external_id}: a trajectory from another tool has no outcome we can verify; say "
                               "which it is (outcome success or failure, --outcome)")
    users = [m for m in messages if m["role"] == "user" and isinstance(m.get("content"), str)
             and (m.get("provenance") or {}).get("source") != "environment"]
    if not users:
        raise InterchangeError(f"{external_id}: no user message (the task)")
    from apps.datasets.exporters.records import TASK_FIELDS
    from apps.tasks.models import Task

    task = {f: Task._meta.get_field(f).get_default() for f in TASK_FIELDS}  # the defaults a new task gets
    task.update(scene=options.get("scene") or "code_exec", prompt=users[0]["content"], external_id=external_id[:200],
                model=model[:200], batch="")
    return {
        "schema_version": RAW_SCHEMA_VERSION, "trajectory_id": n, "task_id": n, "task": task,
        "reviews": {"auto": None, "human": None}, "iteration": 1, "sample_index": 0, "status": "finished",
        "messages": messages, "tools": _tools_for(messages), "steps": [], "final_answer": final_answer,
        "outcome": outcome, "outcome_reason": f"imported from {source['format']}: outcome given on import",
        "reward": reward if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        "verifier_output": {}, "model": model[:200], "config_snapshot": {"imported_from": source},
        "prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": tokens[0] + tokens[1],
        "cost_usd": str(cost), "content_sha256": "", "error": "", "started_at": None, "finished_at": None,
    }


def _ours(extra: Any, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    record = (extra or {}).get("trajplatform") if isinstance(extra, dict) else None
    if isinstance(record, dict) and record.get("schema_version") == RAW_SCHEMA_VERSION:
        return {**record, "messages": messages}
    return None


def from_atif(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    problems = validate_atif(obj)
    if problems:
        raise InterchangeError(f"{label}: not ATIF", [f"{label}: not ATIF: {p}" for p in problems])
    messages = [m for step in obj["steps"] for m in _messages_of_atif_step(step)]
    ours = _ours(obj.get("extra"), messages)
    if ours is not None:
        return ours
    final = obj.get("final_metrics") or {}
    agent = obj["agent"]
    source = {"format": "atif", "schema_version": obj["schema_version"], "session_id": obj["session_id"],
              "agent": {k: agent.get(k) for k in ("name", "version", "model_name")}, "file": options.get("file", ""),
              "notes": obj.get("notes") or ""}
    return _foreign_record(
        messages, n=n, external_id=obj["session_id"], source=source, options=options,
        model=agent.get("model_name") or "",
        tokens=(int(final.get("total_prompt_tokens") or 0), int(final.get("total_completion_tokens") or 0)),
        cost=float(final.get("total_cost_usd") or 0.0), reward=(final.get("extra") or {}).get("reward"))


def from_adp(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    problems = validate_adp(obj)
    if problems:
        raise InterchangeError(f"{label}: not ADP", [f"{label}: not ADP: {p}" for p in problems])
    details = obj.get("details") if isinstance(obj.get("details"), dict) else {}
    messages = _adp_messages(obj["content"], details, options.get("images"))
    ours = _ours(details, messages)
    if ours is not None:
        return ours
    source = {"format": "adp", "schema_version": obj["schema_version"], "id": obj["id"],
              "file": options.get("file", ""),
              "details": {k: v for k, v in details.items() if isinstance(v, (str, int, float, bool))}}
    return _foreign_record(messages, n=n, external_id=obj["id"], source=source, options=options)


_MSWEA_BLOCK = re.compile(r"```(?:mswea_bash_command|bash)\s*\n(.*?)\n```", re.S)
_RETURNCODE = re.compile(r"^\s*<returncode>")


def from_mini_swe_agent(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise InterchangeError(f"{label}: not a mini-swe-agent trajectory (no messages list)")
    info = obj.get("info") if isinstance(obj.get("info"), dict) else {}
    messages: list[dict[str, Any]] = []
    pending: list[str] = []  # call ids of the last assistant turn still waiting for output
    for i, msg in enumerate(obj["messages"]):
        if not isinstance(msg, dict):
            raise InterchangeError(f"{label}: messages[{i}] is not an object")
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        content = content if isinstance(content, str) else ""
        if role == "exit":
            break
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": content or None}
            if isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
                out["reasoning_content"] = msg["reasoning_content"]
            if msg.get("tool_calls"):
                out["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
                    for c in msg["tool_calls"]]
                pending = []
            else:
                actions = ((msg.get("extra") or {}).get("actions")) or [
                    {"command": m} for m in _MSWEA_BLOCK.findall(content)]
                if actions:
                    out["tool_calls"] = [{"id": f"mswea_{i}_{k}", "type": "function", "function": {
                        "name": "bash", "arguments": _args_text({"command": a.get("command", "")})}}
                        for k, a in enumerate(actions)]
                    pending = [c["id"] for c in out["tool_calls"]]
                elif out["content"] is None:
                    out["content"] = ""
            messages.append(out)
        elif role == "tool":
            messages.append({"role": "tool", "tool_call_id": msg.get("tool_call_id"), "name": "bash",
                             "content": content})
        elif role == "user" and pending and _RETURNCODE.match(content):
            messages.append({"role": "tool", "tool_call_id": pending.pop(0), "name": "bash", "content": content})
        elif role in ("system", "user"):
            if pending:  # a format error message or the like answers the turn's calls
                for call_id in pending:
                    messages.append({"role": "tool", "tool_call_id": call_id, "name": "bash", "content": content})
                pending = []
                continue
            messages.append({"role": role, "content": content})
        else:
            raise InterchangeError(f"{label}: messages[{i}]: unsupported role {role!r}")
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    model = (((info.get("config") or {}).get("model") or {}).get("model_name")) or ""
    instance = str(obj.get("instance_id") or Path(options.get("file", "")).name.removesuffix(".traj.json") or n)
    source = {"format": "mini-swe-agent", "trajectory_format": obj.get("trajectory_format") or "",
              "mini_version": info.get("mini_version") or "", "instance_id": instance,
              "exit_status": info.get("exit_status") or "", "file": options.get("file", ""),
              "agent_type": ((info.get("config") or {}).get("agent_type")) or ""}
    return _foreign_record(messages, n=n, external_id=instance, source=source, options=options, model=model,
                           final_answer=info.get("submission") or "", cost=float(stats.get("instance_cost") or 0.0))


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


def interchange_import(*, path_or_file: Any, fmt: str, actor: Any, batch_name: str | None = None,
                       outcome: str | None = None, scene: str | None = None) -> Any:
    """Import a file of trajectories — ours (`raw`) or another tool's (ATIF / ADP / mini-swe-agent,
    converted to raw lines first) — through the raw importer: all or nothing, one audit row; then
    store the images the file carried and record which stored artifacts the new trajectories use.
    `path_or_file` is a path or a binary file object (an upload); RawImportError lists the problems."""
    from apps.datasets.raw_import import RawImportError, trajectories_import

    images: dict[str, Image] = {}
    if fmt != "raw":
        if isinstance(path_or_file, (str, Path)):
            path = Path(path_or_file)
            if not path.is_file():
                raise RawImportError([f"{path}: no such file"])
            data, label = path.read_bytes(), str(path)
        else:
            data, label = path_or_file.read(), str(getattr(path_or_file, "name", "") or "upload")
        try:
            raw = to_raw_lines(data, fmt, label=label, outcome=outcome, scene=scene, images=images)
        except InterchangeError as exc:
            raise RawImportError(exc.errors) from None
        except RenderError as exc:
            raise RawImportError([str(exc)]) from None
        path_or_file = io.BytesIO(raw)
        path_or_file.name = f"{Path(label).stem}.{fmt}"
    # Images are stored only once the raw importer has accepted the file, inside its transaction:
    # a refused file leaves nothing behind, a storage failure undoes the import.
    with transaction.atomic():
        result = trajectories_import(path_or_file=path_or_file, actor=actor, batch_name=batch_name)
        _keep_images(images, result.batches)
    return result


def _keep_images(images: dict[str, Image], batches: list[Any]) -> None:
    """Store the imported images and record the stored artifacts the new trajectories' messages and
    steps name (screenshots of our own exports come back with their uses, so deleting the original
    episode keeps them); on failure, remove the files this call wrote (their rows roll back)."""
    from django.db.models import Q, TextField
    from django.db.models.functions import Cast

    from apps.tasks.models import Trajectory
    from trajplatform import artifacts

    files = artifacts.storage()
    written: list[str] = []
    try:
        for sha, image in images.items():
            name = artifacts.file_name(sha, image.mime)
            if not files.exists(name):
                written.append(name)
            artifacts.store(image.data, image.mime, width=image.width, height=image.height)
        # only rows whose JSON names an artifact are read back (the database does the scan)
        rows = (Trajectory.objects.filter(task__batch__in=batches)
                .annotate(messages_text=Cast("messages", TextField()), steps_text=Cast("steps", TextField()))
                .filter(Q(messages_text__contains="artifact") | Q(steps_text__contains="artifact"))
                .only("pk", "messages", "steps"))
        artifacts.link_trajectories({t.pk: [t.messages, t.steps] for t in rows.iterator(chunk_size=500)})
    except Exception:
        for name in written:
            files.delete(name)
        raise
