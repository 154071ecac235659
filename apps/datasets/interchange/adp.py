"""ADP (Agent Data Protocol, neulab): render and validate our export lines, read a file's
trajectories back, web and image observations included (the package's docstring describes the
mapping)."""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any

import lxml.etree
import lxml.html

from apps.datasets.record_schema import RenderError, key_problems as _keys
from trajplatform import artifacts, images

from ._common import (
    Image, InterchangeError, _args_object, _args_text, _argument_texts, _as_written, _foreign_record, _head, _ours,
    _provenance, _restore_arguments, _turns,
)

ADP_VERSION = "1.2.0"
ADP_VERSIONS = ("1.0.0", "1.1.0", "1.2.0")
WEB_TEXT_MAX_CHARS = 20_000  # a web observation's page text (the gui scene's snapshot cap)


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


_DATA_URL = re.compile(r"^data:(image/[a-z]+);base64,(.*)$", re.S)


def _image_data(content: Any) -> Image:
    """An ADP image the importer can keep: a data: URL of a PNG, JPEG, WebP or GIF (nothing is fetched)."""
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
    try:  # bytes and pixels bounded from the header, before anything decodes it
        size = images.measure(data, match.group(1))
    except images.ImageError as exc:
        raise InterchangeError(str(exc)) from None
    return Image(data, size.mime, size.width, size.height)


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
