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
    Image, InterchangeError, _args_object, _args_text, _argument_texts, _as_written, _foreign_record, _ours,
    ABSENT, _provenance, _restore_arguments, _turns, document_rest, fetched_image, imported_from, keep_rest, kept_of,
    put_kept, reasoning_of, record_messages, refuse, restore,
)

ADP_VERSION = "1.5.0"  # what the export writes (ADP's schema/version.py SCHEMA_VERSION)
# What the reader takes, by schema_version (docs/interchange.md has the table): ADP's
# SUPPORTED_SCHEMA_VERSIONS as of 1.5.0, files without the field (the December 2025 release's
# samples), and any later 1.x (SemVer minor: additions only; a field this reader does not know is
# kept under the record's provenance and written back, not refused).
ADP_VERSIONS = ("1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.3.1", "1.4.0", "1.5.0")
GENERATED_CALL = "adp_call_"  # the id of an action the file gives none (before ADP's tool_call_id)
_READABLE_VERSION = re.compile(r"1\.\d+\.\d+")
_ADP_NAME_LISTS = ("available_apis", "available_custom_tools", "available_code_languages")
WEB_TEXT_MAX_CHARS = 20_000  # a web observation's page text (the gui scene's snapshot cap)


def _adp_doc(record: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The standard document of a record (no trajplatform keys)."""
    content: list[dict[str, Any]] = []
    answered = _answered(messages)
    for msg, results in _turns(messages):
        role = msg.get("role")
        if (role == "system" and not _from_item(msg)) or _rest_of_item(msg):
            continue  # in details.system; the screenshot of a web observation another message writes back
        if role == "user" and isinstance(msg.get("content"), list):
            items = _adp_images(msg["content"])
            kept = kept_of(msg, "adp")
            content += [_inlined(restore(items[0], kept))] if kept and len(items) == 1 else items
        elif role == "assistant":
            content += _adp_items(msg, results, answered)
        elif role in ("system", "user"):
            content.append(_inlined(restore(_message_item(msg), kept_of(msg, "adp"))))
        else:
            raise RenderError(f"unsupported role {role!r}")
    return {"schema_version": ADP_VERSION, "id": f"trajplatform-{record['trajectory_id']}", "content": content,
            "details": _adp_details(messages)}


def _rest_of_item(msg: dict[str, Any]) -> bool:
    """A message an ADP web or image observation made after its first (the screenshot after the page
    text): the first one keeps the whole item."""
    return bool((msg.get("provenance") or {}).get("rest_of_item"))


def _image_ref(url: Any, images: dict[str, Image]) -> Any:
    """A data: URL as `artifact:<sha>` when the export writes the stored image back as exactly that
    URL (the import keeps the image once, in the artifact store), else the URL itself."""
    try:
        image = _image_data(url)
    except InterchangeError:
        return url
    sha = hashlib.sha256(image.data).hexdigest()
    if sha in images and url == _data_url(image):
        return f"{artifacts.URL_PREFIX}{sha}"
    return url


def _data_url(image: Image) -> str:
    return f"data:{image.mime};base64,{base64.b64encode(image.data).decode('ascii')}"


def _kept_images(kept: dict[str, Any], images: dict[str, Image]) -> dict[str, Any]:
    """What an import keeps of a web or image observation, its images as references to the store."""
    if isinstance(kept.get("content"), str):
        kept["content"] = _image_ref(kept["content"], images)
    shot = kept.get("image_observation")
    if isinstance(shot, dict) and isinstance(shot.get("content"), str):
        kept["image_observation"] = {**shot, "content": _image_ref(shot["content"], images)}
    return kept


def _inlined(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the file had it: a kept `artifact:<sha>` image back as its data: URL (a new
    object: the record's own stays as stored)."""
    content = item.get("content")
    if isinstance(content, str) and content.startswith(artifacts.URL_PREFIX):
        try:
            item = {**item, "content": artifacts.data_url(content[len(artifacts.URL_PREFIX):])}
        except artifacts.ArtifactError as exc:
            raise RenderError(f"image {content[len(artifacts.URL_PREFIX):][:12]}: {exc}") from None
    if isinstance(item.get("image_observation"), dict):
        item = {**item, "image_observation": _inlined(item["image_observation"])}
    return item


def _from_item(msg: dict[str, Any]) -> bool:
    """A system message an ADP item (environment text before anything else) became."""
    return (msg.get("provenance") or {}).get("source") == "environment"


def _adp_details(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """ADP has no system role: the system messages that came from no ADP item (ours) go in details.system."""
    system = [m.get("content") or "" for m in messages if m.get("role") == "system" and not _from_item(m)]
    return {"system": "\n\n".join(system)} if system else {}


def render_adp(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    messages = record_messages(record)
    doc = _adp_doc(record, messages)
    source = imported_from(record, "adp")
    if source is not None:  # the file's own top-level fields and details, as it had them
        doc = {**restore(doc, source.get("kept")), "schema_version": ADP_VERSION, "id": doc["id"]}
    details: dict[str, Any] = {**(doc.get("details") or {}), "trajplatform": _provenance(record)}
    originals = _argument_texts(messages)
    if originals:
        details["trajplatform_arguments"] = originals
    if _adp_messages(_as_written(doc["content"]), details, marked=source is not None) != messages:
        details["trajplatform_messages"] = messages  # what the standard items cannot say exactly
    return {**doc, "details": details}


def _message_item(msg: dict[str, Any]) -> dict[str, Any]:
    """The text_observation a user, environment or tool message is (before what its import kept)."""
    environment = msg.get("role") in ("system", "tool") or (msg.get("provenance") or {}).get("source") == "environment"
    item = {"class_": "text_observation", "content": msg.get("content") or "",
            "source": "environment" if environment else "user"}
    if msg.get("role") == "tool":
        item["tool_call_id"] = msg.get("tool_call_id")
    return item


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


def _assistant_item(msg: dict[str, Any]) -> dict[str, Any]:
    """The message_action of an assistant turn without calls; its thought goes where it came from
    (description, ADP's thought field, or reasoning_content)."""
    item = {"class_": "message_action", "content": msg.get("content") or ""}
    reasoning = reasoning_of(msg)
    if reasoning:
        item["description" if (msg.get("provenance") or {}).get("thought") == "description"
             else "reasoning_content"] = reasoning
    return item


def _answered(messages: list[dict[str, Any]]) -> set[Any]:
    return {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}


def _call_item(msg: dict[str, Any], k: int, answered: set[Any]) -> dict[str, Any]:
    """The action of a turn's k-th call: a code_action for a call an ADP code action became
    (`execute_<language>` with its code), else an api_action; the turn's text and reasoning on its
    first (unless a message_action said them: a joined turn). Its tool_call_id only when an
    observation answers it: ADP (1.5.0's Trajectory) refuses an action id no observation names,
    and the last action of a next-action episode has none."""
    call = msg["tool_calls"][k]
    args = _args_object(call["function"].get("arguments"))
    code = (call.get("provenance") or {}).get("code_action")
    if isinstance(code, dict):  # ADP's CodeAction requires its description (null allowed)
        item = {"class_": "code_action", "language": code.get("language"), "content": args.get("code", ""),
                "description": None}
    else:
        item = {"class_": "api_action", "function": call["function"]["name"], "kwargs": args}
    if call.get("id") in answered:
        item["tool_call_id"] = call["id"]
    reasoning = reasoning_of(msg)
    if k == 0 and not _joined(msg):
        if msg.get("content"):
            item["description"] = msg["content"]
        if reasoning:
            item["reasoning_content"] = reasoning
    return item


def _joined(msg: dict[str, Any]) -> bool:
    return bool((msg.get("provenance") or {}).get("joined"))


def _adp_items(msg: dict[str, Any], results: list[dict[str, Any]], answered: set[Any]) -> list[dict[str, Any]]:
    calls = msg.get("tool_calls") or []
    items = [restore(_assistant_item(msg), kept_of(msg, "adp"))] if not calls or _joined(msg) else []
    items += [restore(_call_item(msg, k, answered), kept_of(call, "adp")) for k, call in enumerate(calls)]
    return items + [_inlined(restore(_message_item(result), kept_of(result, "adp"))) for result in results]


def _adp_messages(items: list[dict[str, Any]], details: dict[str, Any],
                  images: dict[str, Image] | None = None, *, marked: bool = False) -> list[dict[str, Any]]:
    exact = details.get("trajplatform_messages")
    if isinstance(exact, list):
        if images is not None:  # the file's own images are stored (another deployment's store lacks them)
            _messages_of_adp(items, images)
        return exact
    system = details.get("system")
    head = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
    messages = head + _messages_of_adp(items, images, marked=marked)
    return _restore_arguments(messages, details.get("trajplatform_arguments"))


def _messages_of_adp(items: list[dict[str, Any]], images: dict[str, Image] | None = None, *,
                     marked: bool = True) -> list[dict[str, Any]]:
    """Our messages from ADP content items (api_actions in a row are one assistant turn).

    An observation answers its tool_call_id, else the oldest unanswered call of the assistant turn
    before it, else it is an environment message (the system prompt when nothing but environment
    text came before it). A code_action becomes an `execute_<language>` call with its code; an
    agent text_observation an assistant turn; a message_action's description its thought.
    `images` collects the decoded images (sha256 -> Image) that the messages' `artifact:<sha>`
    parts name, for the importer to store. With `marked`, every message and call keeps what the
    export could not say again from it (keep_rest) under `provenance.adp`."""
    out: list[dict[str, Any]] = []
    images = {} if images is None else images
    names: dict[Any, str] = {}
    pending: list[Any] = []  # calls not answered yet, oldest first
    made: list[tuple[dict[str, Any], int | None, dict[str, Any]]] = []  # (message, call index, item)
    said: set[int] = set()  # the assistant messages message_actions became
    for i, item in enumerate(items):
        kind = item.get("class_")
        if kind in _ADP_OBSERVATIONS:
            start = len(out)
            out += _observation_messages(item, pending, names, images, opening=not any(
                m["role"] != "system" for m in out))
            if (kind == "text_observation" and len(out) == start + 1) or (kind != "text_observation" and out[start:]):
                made.append((out[start], None, item))  # a web or image observation: its first message keeps it
                for rest in out[start + 1:] if marked else []:
                    rest.setdefault("provenance", {"format": "adp"})["rest_of_item"] = True
        elif kind == "message_action":
            pending.clear()  # a new turn: an earlier call left unanswered stays so
            msg = {"role": "assistant", "content": item.get("content") or ""}
            thought = item.get("reasoning_content") or item.get("description")
            if thought:
                msg["reasoning_content"] = thought
                if not item.get("reasoning_content"):
                    msg["provenance"] = {"format": "adp", "thought": "description"}
            out.append(msg)
            made.append((msg, None, item))
            said.add(id(msg))
        elif kind in ("api_action", "code_action"):
            call_id = item["tool_call_id"] if item.get("tool_call_id") is not None else f"{GENERATED_CALL}{i}"
            if kind == "code_action":
                language = str(item.get("language") or "")
                name = "execute_" + (re.sub(r"[^A-Za-z0-9_-]", "_", language) or "code")
                args = {"code": item.get("content") or ""}
            else:
                name = item.get("function") or ""
                args = item.get("kwargs") if isinstance(item.get("kwargs"), dict) else {}
            call: dict[str, Any] = {"id": call_id, "type": "function",
                                    "function": {"name": name, "arguments": _args_text(args)}}
            if kind == "code_action":
                call["provenance"] = {"format": "adp", "code_action": {"language": item.get("language")}}
            names[call_id] = name
            last = out[-1] if out else None
            bare = not item.get("description") and not item.get("reasoning_content")
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and bare:
                last["tool_calls"].append(call)
                pending.append(call_id)
            elif last is not None and last["role"] == "assistant" and bare and id(last) in said:
                # the agent said something, then acted: one turn (two assistant messages in a row is no chat)
                last["tool_calls"] = [call]
                last.setdefault("provenance", {"format": "adp"})["joined"] = True
                pending[:] = [call_id]
            else:
                pending[:] = [call_id]
                msg = {"role": "assistant", "content": item.get("description") or None}
                if item.get("reasoning_content"):
                    msg["reasoning_content"] = item["reasoning_content"]
                msg["tool_calls"] = [call]
                out.append(msg)
            made.append((out[-1], len(out[-1]["tool_calls"]) - 1, item))
        else:
            raise InterchangeError(f"ADP content item {kind!r} is not supported")
    if marked:
        answered = _answered(out)
        for msg, k, item in made:
            if k is None:
                put_kept(msg, "adp", _kept_images(_linked(keep_rest(item, _rebuilt_text(msg, images))), images))
            else:
                put_kept(msg["tool_calls"][k], "adp", _linked(keep_rest(item, _call_item(msg, k, answered))))
    else:  # our own export read back: its messages as they were (no marks of a foreign file)
        for msg in out:
            for call in msg.get("tool_calls") or []:
                call.pop("provenance", None)
            provenance = msg.get("provenance")
            if isinstance(provenance, dict):
                provenance.pop("thought", None), provenance.pop("joined", None)
                if provenance == {"format": "adp"}:
                    del msg["provenance"]
    return out


def _linked(kept: dict[str, Any]) -> dict[str, Any]:
    """What an import keeps, less the absence of a tool_call_id: an action and the observation that
    answers it are written with the call's id (one the import made, `adp_call_<n>`, for a file
    without ids): ADP 1.5.0, the version the export writes, refuses an answered action without one."""
    absent = [k for k in kept.get(ABSENT) or [] if k != "tool_call_id"]
    kept = {k: v for k, v in kept.items() if k != ABSENT}
    return {**kept, ABSENT: absent} if absent else kept


def _rebuilt_text(msg: dict[str, Any], images: dict[str, Image]) -> dict[str, Any]:
    """What the export writes for a message an observation became (an agent text one: a
    message_action; an image message: its image_observation)."""
    if msg["role"] == "assistant":
        return _assistant_item(msg)
    if isinstance(msg.get("content"), list):
        [part] = msg["content"]
        image = images[part["image_url"]["url"][len(artifacts.URL_PREFIX):]]
        return {"class_": "image_observation", "content": _data_url(image), "source": "environment"}
    return _message_item(msg)


def _observation_messages(item: dict[str, Any], pending: list[Any], names: dict[Any, str],
                          images: dict[str, Image] | None, *, opening: bool = False) -> list[dict[str, Any]]:
    """The message(s) an observation becomes: the user's, an agent's turn, a tool result, the
    system prompt (environment text `opening` the conversation) or an environment message, then,
    for an image, a user message with its `artifact:<sha>` part."""
    kind = item["class_"]
    if kind == "web_observation":
        text = web_text(item)
        shot = item.get("image_observation")
    elif kind == "image_observation":
        text, shot = "", item
    else:
        text, shot = item.get("content") or "", None
    out: list[dict[str, Any]] = []
    source = _SOURCE_ALIASES.get(item.get("source"), item.get("source"))
    # files without tool_call_id (1.0.0) label some results user: the answer of the action before it
    answers = kind == "text_observation" and bool(pending) and (item.get("tool_call_id") in pending or (
        item.get("tool_call_id") is None and str(pending[0]).startswith(GENERATED_CALL)))
    if source == "user" and not answers:
        if kind == "text_observation":
            out.append({"role": "user", "content": text})
    elif source == "agent" and kind == "text_observation":
        pending.clear()
        out.append({"role": "assistant", "content": text})
    elif opening and kind == "text_observation" and item.get("tool_call_id") is None and not pending:
        out.append({"role": "system", "content": text, "provenance": {"format": "adp", "source": "environment"}})
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


def web_text(item: dict[str, Any]) -> str:
    """A web observation as the agent read it: `URL: <url>`, then its accessibility tree or, failing
    that, its HTML's visible text, cut at WEB_TEXT_MAX_CHARS (the import keeps the whole item)."""
    body, field = "", None
    for name in ("axtree", "html"):
        value = item.get(name)
        if isinstance(value, str) and value.strip():
            body, field = (value if name == "axtree" else _html_text(value)), name
            break
    if len(body) > WEB_TEXT_MAX_CHARS:
        body = (f"{body[:WEB_TEXT_MAX_CHARS]}\n[... cut at {WEB_TEXT_MAX_CHARS} of {len(body)} characters; "
                f"the original {field} is kept with the record ...]")
    url = item.get("url")
    return "\n\n".join(p for p in (f"URL: {url}" if url else "", body) if p)


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
        raise fetched_image(str(content))
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


# text_observation.source: today's user | agent | environment; user_msg (1.0-1.2's user) and the
# system | assistant of one earlier schema are read as what they mean.
_ADP_SOURCES = ("user", "agent", "environment", "user_msg", "system", "assistant")
_SOURCE_ALIASES = {"user_msg": "user", "assistant": "agent", "system": "environment"}
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


def _version_problem(version: Any) -> str | None:
    if version is None or (isinstance(version, str) and _READABLE_VERSION.fullmatch(version)):
        return None
    return (f"line.schema_version: {version!r} is not a version this reader takes (absent, or 1.x.y: "
            f"{', '.join(ADP_VERSIONS)} and later 1.x)")


def validate_adp(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [f"line.{k}: missing" for k in ("id", "content") if k not in obj]
    version = _version_problem(obj.get("schema_version"))
    if version:
        problems.append(version)
    if "id" in obj and (not isinstance(obj["id"], str) or not obj["id"]):
        problems.append("line.id: a non-empty string")
    if obj.get("details") is not None and not isinstance(obj["details"], dict):
        problems.append("line.details: an object")
    for key in _ADP_NAME_LISTS:
        value = obj.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"line.{key}: a list of names or null")
    items = obj.get("content")
    if not isinstance(items, list) or not items:
        return problems + ["line.content: a non-empty list"]
    call_ids: set[Any] = set()
    answered: set[Any] = set()
    for i, item in enumerate(items):
        at = f"line.content[{i}]"
        kind = item.get("class_") if isinstance(item, dict) else None
        if not isinstance(kind, str) or kind not in _ADP_ITEM_KEYS:
            problems.append(f"{at}.class_: one of {', '.join(_ADP_ITEM_KEYS)}")
            continue
        if kind == "image_observation":
            problems += _image_problems(item, at)
        elif kind == "web_observation":
            problems += _keys(item, *_ADP_ITEM_KEYS[kind], where=at)
        else:  # a field a later 1.x adds is kept beside the message, not refused
            problems += [f"{at}.{k}: missing" for k in sorted(_ADP_ITEM_KEYS[kind][0] - item.keys())]
        if kind == "text_observation" and item.get("source") not in _ADP_SOURCES:
            problems.append(f"{at}.source: one of {', '.join(_ADP_SOURCES)}")
        if kind in ("text_observation", "message_action", "code_action") and not isinstance(item.get("content"), str):
            problems.append(f"{at}.content: a string")
        if kind == "code_action" and not (isinstance(item.get("language"), str) and item["language"]):
            problems.append(f"{at}.language: a language name")
        for key in ("description", "reasoning_content", "name"):
            if item.get(key) is not None and not isinstance(item[key], str):
                problems.append(f"{at}.{key}: a string or null")
        if kind == "web_observation":
            problems += _web_problems(item, at)
        if kind == "api_action" and not isinstance(item.get("kwargs"), dict):
            problems.append(f"{at}.kwargs: an object")
        if kind == "api_action" and not (isinstance(item.get("function"), str) and item["function"]):
            problems.append(f"{at}.function: a function name")
        call_id = item.get("tool_call_id")
        following = items[i + 1].get("class_") if i + 1 < len(items) and isinstance(items[i + 1], dict) else None
        if kind in ("api_action", "code_action") and call_id is None and following in _ADP_OBSERVATIONS \
                and obj.get("schema_version") == ADP_VERSION:
            problems.append(f"{at}.tool_call_id: missing; an observation follows the action (ADP {ADP_VERSION} links "
                            "them by id)")
        if call_id is not None and not isinstance(call_id, str):
            problems.append(f"{at}.tool_call_id: a string or null")
        elif kind in ("api_action", "code_action") and call_id is not None:
            if call_id in call_ids:
                problems.append(f"{at}.tool_call_id: {call_id!r} is an earlier action's too")
            call_ids.add(call_id)
        elif kind in _ADP_OBSERVATIONS and call_id is not None and call_id not in call_ids:
            problems.append(f"{at}.tool_call_id: matches no earlier action")
        elif kind in _ADP_OBSERVATIONS and call_id is not None:
            if call_id in answered and obj.get("schema_version") == ADP_VERSION:
                problems.append(f"{at}.tool_call_id: {call_id!r} is answered by an earlier observation too")
            answered.add(call_id)
    if obj.get("schema_version") == ADP_VERSION:  # the version we write: its Trajectory's tool-call links
        problems += [f"line.content: the action with tool_call_id {call_id!r} has no observation naming it (ADP "
                     f"{ADP_VERSION} refuses it: an unanswered action carries no id)"
                     for call_id in sorted(call_ids - answered, key=str)]
    return problems


def from_adp(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    refuse(validate_adp(obj), label, "ADP")
    details = obj.get("details") if isinstance(obj.get("details"), dict) else {}
    ours = _ours(details, [])
    marked = ours is None or bool(imported_from(ours, "adp"))
    messages = _adp_messages(obj["content"], details, options.get("images"), marked=marked)
    if ours is not None:
        return {**ours, "messages": messages}
    source = {"format": "adp", "schema_version": obj.get("schema_version"), "id": obj["id"],
              "file": options.get("file", ""),  # details' plain values, for the console
              "details": {k: v for k, v in details.items() if isinstance(v, (str, int, float, bool))}}
    record = _foreign_record(messages, n=n, external_id=obj["id"], source=source, options=options)
    # the document's own fields (details, available_*, fields this reader does not know) for the export
    source["kept"] = document_rest(obj, {"details": _adp_details(messages)}, ("content", "id", "schema_version"))
    return record
