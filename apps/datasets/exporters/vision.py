"""Multimodal SFT exports: episodes with screenshots (the gui scene's) for vision-language trainers.

    sft-openai-vision   OpenAI chat fine-tuning with images: user messages whose content is a list
                        of parts, {"type": "image_url", "image_url": {"url": ...}} for an image
    sharegpt-vision     LLaMA-Factory ShareGPT + `images`: one "<image>" token per image, in the
                        turn it belongs to, in the order of the `images` list
    trl-vision          TRL's vision SFT: messages with content parts ({"type": "image"} placeholders,
                        {"type": "text", "text"}; a tool result's image in the user message after it,
                        where TRL fills it), tool calls as objects, and an `images` list

Which images: a vision episode's own image messages (what the model saw: the start page, the
page after each turn); for an episode run without vision, each step's screenshot (`images`,
apps/engines/agent.py) after that step's tool result, so any gui trajectory becomes multimodal
data. The images themselves come from the artifact store (trajplatform/artifacts.py):

* option images="files" (the default): written once per content as `<image_dir>/<sha256>.png`
  (the export job puts image_dir next to the JSONL, `<file stem>_images/`) and referenced by
  the path relative to the JSONL's directory;
* images="base64": inlined as data: URLs (`data:image/png;base64,...`), one self-contained file.

The text-only formats (chat.py's render_messages) leave the image messages out: their text is
the snapshot the agent read. `card_images` gives the data card its image counts.
"""
from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

from django.db.models import Count, Sum

from trajplatform import artifacts
from trajplatform.artifacts import URL_PREFIX, Artifact, ArtifactUse
from trajplatform.safefiles import atomic_output, private_directory

from .chat import RenderError, dumps_compact, function_specs, parse_arguments, validate_tools
from .formats import validate_sharegpt, with_thought

IMAGE_MODES = ("files", "base64")
IMAGE_TOKEN = "<image>"
DATA_URL_RE = re.compile(r"^data:image/(png|jpeg|webp|gif);base64,[A-Za-z0-9+/=]+$")
SHA_RE = re.compile(r"^[0-9a-f]{64}$")


# -- the multimodal conversation ----------------------------------------------------------------


def _image_refs(content: Any) -> list[str]:
    return [p["image_url"]["url"][len(URL_PREFIX):] for p in content
            if isinstance(p, dict) and p.get("type") == "image_url"
            and str((p.get("image_url") or {}).get("url", "")).startswith(URL_PREFIX)]


def conversation(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's messages with `images` (artifact hashes) on the turns they belong to.

    Each item: role, content (text), reasoning (an assistant turn's, when it has one), tool_calls
    (arguments as parsed objects), tool_call_id, images ([sha256, ...]). An image message of a vision episode is folded into the turn before
    it (the tool result it shows, or the task's prompt for the start page)."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("no messages")
    vision = any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages)
    step_images = {s.get("tool_call_id"): [r["artifact"] for r in (s.get("images") or [])[-1:]]
                   for s in record.get("steps") or [] if isinstance(s, dict) and s.get("tool_call_id")}
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RenderError(f"messages[{i}]: not an object")
        role, content = msg.get("role"), msg.get("content")
        if isinstance(content, list):
            refs = _image_refs(content)
            if role != "user" or not out or not refs:
                raise RenderError(f"messages[{i}]: content parts are only understood as image observations")
            out[-1]["images"] = out[-1]["images"] + refs
            continue
        item: dict[str, Any] = {"role": role, "content": content or "", "images": []}
        if role == "assistant" and isinstance(msg.get("reasoning_content"), str) and msg["reasoning_content"]:
            item["reasoning"] = msg["reasoning_content"]
        if role == "assistant" and msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                fn = (call or {}).get("function") or {}
                args = parse_arguments(fn.get("arguments"))
                if args is None:
                    raise RenderError(f"messages[{i}]: tool-call arguments are not a JSON object")
                calls.append({"id": call.get("id") or "", "name": fn.get("name") or "", "arguments": args})
            item["tool_calls"] = calls
        elif role == "tool":
            item["tool_call_id"] = msg.get("tool_call_id") or ""
            if not vision:
                item["images"] = step_images.get(item["tool_call_id"], [])
        elif role not in ("system", "user", "assistant"):
            raise RenderError(f"messages[{i}]: unsupported role {role!r}")
        out.append(item)
    if not any(m["images"] for m in out):
        raise RenderError("the episode has no images (no screenshots were kept)")
    return out


class ImageSink:
    """Where a line's images go: files next to the JSONL, or data: URLs."""

    def __init__(self, ctx: dict[str, Any]):
        self.mode = ctx.get("images") or "files"
        if self.mode not in IMAGE_MODES:
            raise ValueError(f"images: must be one of {', '.join(IMAGE_MODES)}")
        self.directory = Path(ctx["image_dir"]) if ctx.get("image_dir") else None
        # A dry run (apps/datasets/exportability.py) checks each image is stored and writes nothing.
        self.dry_run = bool(ctx.get("dry_run"))
        if self.mode == "files" and self.directory is None and not self.dry_run:
            raise RenderError("images='files' needs an image_dir (the export job sets one next to the JSONL)")

    def __call__(self, sha: str) -> str:
        try:
            artifact = artifacts.get(sha)
        except artifacts.ArtifactError as exc:
            raise RenderError(f"image {sha[:12]}: {exc}") from None
        if self.dry_run:
            return f"{self.directory.name if self.directory else 'images'}/{Path(artifact.name).name}"
        if self.mode == "base64":
            return f"data:{artifact.mime};base64,{base64.b64encode(artifacts.read(sha)).decode('ascii')}"
        assert self.directory is not None
        name = Path(artifact.name).name
        target = self.directory / name
        # The folder sits next to the user's output path: a link planted as the folder or in it is
        # refused (UnsafePathError fails the export) or replaced, never written through.
        private_directory(self.directory, parents=True)
        if not (target.is_file() and not target.is_symlink()):  # content-addressed: a file holds these bytes
            with atomic_output(target, force=True, tmp=target.with_name(f".{name}.{os.getpid()}.tmp")) as fh:
                fh.write(artifacts.read(sha))
        return f"{self.directory.name}/{name}"


def _system(turns: list[dict[str, Any]], ctx: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in turns if t["role"] != "system" or ctx.get("include_system", True)]


# -- sft-openai-vision ------------------------------------------------------------------------


def render_sft_openai_vision(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    sink = ImageSink(ctx)
    messages: list[dict[str, Any]] = []
    for turn in _system(conversation(record), ctx):
        if turn["role"] == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": turn["content"] or ""}
            if turn.get("tool_calls"):
                item["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": dumps_compact(c["arguments"])}} for c in turn["tool_calls"]]
            messages.append(item)
        elif turn["role"] == "tool":
            messages.append({"role": "tool", "tool_call_id": turn["tool_call_id"], "content": turn["content"]})
        else:
            messages.append({"role": turn["role"], "content": turn["content"]})
        if turn["images"]:
            # OpenAI takes images in user (not tool) messages: the page follows as a user turn.
            parts: list[dict[str, Any]] = [] if turn["role"] == "user" else [{"type": "text", "text": "[screenshot]"}]
            if turn["role"] == "user":
                parts.append({"type": "text", "text": messages.pop()["content"]})
            parts += [{"type": "image_url", "image_url": {"url": sink(sha)}} for sha in turn["images"]]
            messages.append({"role": "user", "content": parts})
    return {"messages": messages, "tools": [{"type": "function", "function": fn}
                                            for fn in function_specs(record.get("tools") or [])]}


def _image_url_ok(url: Any) -> bool:
    return isinstance(url, str) and (bool(DATA_URL_RE.match(url)) or url.startswith(("https://", "http://"))
                                     or (not url.startswith("/") and ".." not in url.split("/") and url.endswith(
                                         (".png", ".jpg", ".webp", ".gif"))))


def validate_sft_openai_vision(obj: Any) -> list[str]:
    if not isinstance(obj, dict) or set(obj) != {"messages", "tools"}:
        return ["line: must be {messages, tools}"]
    problems, names = validate_tools(obj["tools"])
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        return problems + ["line.messages: must be a non-empty list"]
    images = 0
    for i, msg in enumerate(messages):
        at = f"line.messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool"):
            problems.append(f"{at}: must be a message with a known role")
            continue
        content = msg.get("content")
        if isinstance(content, list):
            if msg["role"] != "user":
                problems.append(f"{at}: only user messages may carry content parts (images)")
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "image_url":
                    images += 1
                    if not _image_url_ok((part.get("image_url") or {}).get("url")):
                        problems.append(f"{at}.content[{j}]: image_url.url must be a data: URL, an http(s) URL or a "
                                        "relative image path")
                elif kind != "text" or not isinstance(part.get("text"), str):
                    problems.append(f"{at}.content[{j}]: must be a text or image_url part")
        elif not isinstance(content, str):
            problems.append(f"{at}.content: must be a string or a list of parts")
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or fn.get("name") not in names or not isinstance(fn.get("arguments"), str):
                problems.append(f"{at}: a tool call must name an offered tool with arguments as a JSON string")
    if not images:
        problems.append("line.messages: no image (a vision line needs at least one)")
    return problems


# -- sharegpt-vision (LLaMA-Factory) -----------------------------------------------------------


def render_sharegpt_vision(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    sink = ImageSink(ctx)
    turns: list[tuple[dict[str, str], list[str]]] = []  # (turn, its images in order)
    system = ""
    pending: list[tuple[str, list[str]]] = []  # tool results of one assistant turn

    def flush() -> None:
        if pending:
            texts = [t + IMAGE_TOKEN * len(imgs) for t, imgs in pending]
            value = texts[0] if len(texts) == 1 else dumps_compact(texts)
            turns.append(({"from": "observation", "value": value}, [sha for _, imgs in pending for sha in imgs]))
            pending.clear()

    for i, turn in enumerate(conversation(record)):
        if turn["role"] == "system":
            system = turn["content"]
            continue
        if turn["role"] == "tool":
            pending.append((turn["content"], turn["images"]))
            continue
        flush()
        if turn["role"] == "user":
            turns.append(({"from": "human", "value": turn["content"] + IMAGE_TOKEN * len(turn["images"])},
                          turn["images"]))
        elif turn.get("tool_calls"):
            calls = [{"name": c["name"], "arguments": c["arguments"]} for c in turn["tool_calls"]]
            value = dumps_compact(calls[0] if len(calls) == 1 else calls)
            # as the text format keeps them: in LLaMA-Factory's thought words
            turns.append(({"from": "function_call", "value": with_thought(i, turn["content"], value)}, []))
        else:
            turns.append(({"from": "gpt", "value": with_thought(i, turn.get("reasoning") or "", turn["content"])}, []))
    flush()
    while turns and turns[-1][0]["from"] in ("human", "observation"):
        turns.pop()  # end on the model's turn (final_answer tool: finish's acknowledgement goes), as sharegpt does
    images = [sink(sha) for _, shas in turns for sha in shas]
    line = {"conversations": [t for t, _ in turns], "images": images,
            "tools": dumps_compact(function_specs(record.get("tools") or []))}
    if system and ctx.get("include_system", True):
        line["system"] = system
    return line


def validate_sharegpt_vision(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = validate_sharegpt({k: v for k, v in obj.items() if k != "images"})
    images = obj.get("images")
    if not isinstance(images, list) or not images or not all(_image_url_ok(i) for i in images):
        problems.append("line.images: must be a non-empty list of relative image paths, URLs or data: URLs")
        return problems
    tokens = sum(t.get("value", "").count(IMAGE_TOKEN) for t in obj.get("conversations") or [] if isinstance(t, dict))
    if tokens != len(images):  # LLaMA-Factory's mm_plugin refuses a line whose counts differ
        problems.append(f"line: {tokens} {IMAGE_TOKEN} tokens for {len(images)} images")
    return problems


# -- trl-vision ----------------------------------------------------------------------------------


def render_trl_vision(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    sink = ImageSink(ctx)
    messages: list[dict[str, Any]] = []
    images: list[str] = []
    called: dict[str, str] = {}  # tool_call_id -> the tool's name, for the tool messages
    for turn in _system(conversation(record), ctx):
        # TRL fills image placeholders of system, user and assistant messages only
        # (trl.data_utils.prepare_multimodal_messages): a tool result's screenshot follows it
        # as a user message, as the OpenAI format has it.
        inline = turn["role"] != "tool"
        parts: list[dict[str, Any]] = [{"type": "image"} for _ in turn["images"]] if inline else []
        if turn["content"] or not parts:
            parts.append({"type": "text", "text": turn["content"]})
        item: dict[str, Any] = {"role": turn["role"], "content": parts}
        if turn.get("reasoning"):  # as sft-trl keeps it
            item["reasoning_content"] = turn["reasoning"]
        if turn.get("tool_calls"):
            item["tool_calls"] = [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                                  for c in turn["tool_calls"]]
            called.update({c["id"]: c["name"] for c in turn["tool_calls"]})
        if turn["role"] == "tool":
            item["name"] = called.get(turn["tool_call_id"], "")
        messages.append(item)
        if turn["images"] and not inline:
            messages.append({"role": "user", "content": [{"type": "text", "text": "[screenshot]"},
                                                         *({"type": "image"} for _ in turn["images"])]})
        images.extend(sink(sha) for sha in turn["images"])
    return {"messages": messages, "images": images,
            "tools": [{"type": "function", "function": fn} for fn in function_specs(record.get("tools") or [])]}


def validate_trl_vision(obj: Any) -> list[str]:
    if not isinstance(obj, dict) or set(obj) != {"messages", "images", "tools"}:
        return ["line: must be {messages, images, tools}"]
    problems, names = validate_tools(obj["tools"])
    images = obj["images"]
    if not isinstance(images, list) or not images or not all(_image_url_ok(i) for i in images):
        problems.append("line.images: must be a non-empty list of relative image paths, URLs or data: URLs")
    placeholders = 0
    for i, msg in enumerate(obj["messages"] if isinstance(obj["messages"], list) else []):
        at = f"line.messages[{i}]"
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), list):
            problems.append(f"{at}: content must be a list of parts")
            continue
        for j, part in enumerate(msg["content"]):
            if part == {"type": "image"} and msg.get("role") == "tool":
                problems.append(f"{at}.content[{j}]: TRL fills no image placeholder in a tool message")
            elif part == {"type": "image"}:
                placeholders += 1
            elif not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                problems.append(f"{at}.content[{j}]: must be {{type: image}} or {{type: text, text}}")
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or fn.get("name") not in names or not isinstance(fn.get("arguments"), dict):
                problems.append(f"{at}: a tool call must name an offered tool with arguments as an object")
    if isinstance(images, list) and placeholders != len(images):  # TRL's processor pairs them in order
        problems.append(f"line: {placeholders} image placeholders for {len(images)} images")
    return problems


# -- the data card -------------------------------------------------------------------------------


def card_images(trajectory_ids: list[int]) -> dict[str, int]:
    """The images a dataset's trajectories keep: trajectories with any, distinct images, their bytes."""
    uses = ArtifactUse.objects.filter(trajectory_id__in=trajectory_ids)
    per = uses.aggregate(trajectories=Count("trajectory_id", distinct=True), uses=Count("id"))
    distinct = Artifact.objects.filter(uses__trajectory_id__in=trajectory_ids).distinct()
    return {"trajectories_with_images": per["trajectories"] or 0, "images": per["uses"] or 0,
            "distinct_images": distinct.count(), "bytes": distinct.aggregate(total=Sum("size"))["total"] or 0}
