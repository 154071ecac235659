"""ATIF (Agent Trajectory Interchange Format, Harbor's RFC 0001): render and validate our export
lines, read a file's trajectories back (the package's docstring describes the mapping)."""
from __future__ import annotations

import hashlib
import re
from typing import Any

from apps.datasets.record_schema import RenderError
from trajplatform import artifacts

from ._common import (
    Image, InterchangeError, _args_object, _args_text, _argument_texts, _as_written, _foreign_record, _ours,
    _provenance, _restore_arguments, _turns, document_rest, fetched_image, imported_from, keep_rest, kept_of,
    parts_text, put_kept, reasoning_of, record_messages, refuse, restore, tool_spec, type_problems,
)
from .adp import _data_url, _image_data, web_text

ATIF_VERSION = "ATIF-v1.7"  # what the export writes (the version neulab's schema/atif.py accepts)
# What the reader takes (docs/interchange.md has the table): v1.0 to v1.7, and a later v1.x the
# same way (a field this reader does not know is kept beside its message and written back).
ATIF_VERSIONS = tuple(f"ATIF-v1.{n}" for n in range(8))
_READABLE_VERSION = re.compile(r"ATIF-v1\.\d+")
AGENT_NAME = "trajplatform"
AGENT_VERSION = "1"
_SOURCES = ("system", "user", "agent")


def _atif_step(msg: dict[str, Any], step_id: int, model: str, images: dict[str, Image] | None = None) -> dict[str, Any]:
    """A message's step without its observation (the standard fields our record gives)."""
    role = msg.get("role")
    step: dict[str, Any] = {"step_id": step_id}
    if role in ("system", "user"):
        step.update(source=role, message=_atif_message(msg.get("content"), images))
        return step
    step.update(source="agent", message=msg.get("content") or "")
    if model:
        step["model_name"] = model
    if reasoning_of(msg):
        step["reasoning_content"] = reasoning_of(msg)
    calls = msg.get("tool_calls") or []
    if calls:
        step["tool_calls"] = [restore(_atif_call(c), kept_of(c, "atif")) for c in calls]
    return step


def _atif_message(content: Any, images: dict[str, Image] | None = None) -> Any:
    """A user or system message as ATIF's message: its text, or (a vision episode's screenshot
    message) content parts, each stored image an image part whose source path is the image inlined
    as a data: URL (ATIF's ImageSource takes a file path or a URL; a data: URL keeps the file whole).
    `images` are the ones an import has not stored yet."""
    if not isinstance(content, list):
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": part.get("text") or ""})
            continue
        url = str(((part.get("image_url") or {}) if kind == "image_url" else {}).get("url", ""))
        if not url.startswith(artifacts.URL_PREFIX):
            raise RenderError(f"a message part {str(part)[:60]!r} is neither text nor a stored image")
        sha = url[len(artifacts.URL_PREFIX):]
        try:
            inline = _data_url(images[sha]) if images and sha in images else artifacts.data_url(sha)
        except artifacts.ArtifactError as exc:
            raise RenderError(f"image {sha[:12]}: {exc}") from None
        parts.append({"type": "image", "source": {"media_type": inline[len("data:"):inline.index(";")],
                                                  "path": inline}})
    return parts


def _message_parts(content: Any, at: str, images: dict[str, Image]) -> Any:
    """A user or system step's message as ours: a string, its text parts' text, or (with an image
    inlined as a data: URL) text and image_url parts, the image kept in `images` and named as
    `artifact:<sha>`; an image by path or link is refused (nothing is fetched)."""
    if not (isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in content)):
        return _text_of(content, at)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
            raise InterchangeError(f"{at}[{j}]: a text or an image part")
        if part["type"] == "text":
            parts.append({"type": "text", "text": part.get("text") if isinstance(part.get("text"), str) else ""})
            continue
        path = _image_part(part)
        if not path.startswith("data:"):
            raise InterchangeError(f"{at}[{j}]: {fetched_image(path)}")
        try:
            image = _image_data(path)
        except InterchangeError as exc:
            raise InterchangeError(f"{at}[{j}]: {exc}") from None
        sha = hashlib.sha256(image.data).hexdigest()
        images[sha] = image
        parts.append({"type": "image_url", "image_url": {"url": f"{artifacts.URL_PREFIX}{sha}"}})
    return parts


def _atif_call(call: dict[str, Any]) -> dict[str, Any]:
    return {"tool_call_id": call.get("id") or "", "function_name": call["function"]["name"],
            "arguments": _args_object(call["function"].get("arguments"))}


def _atif_result(result: dict[str, Any]) -> dict[str, Any]:
    return {"source_call_id": result.get("tool_call_id"), "content": result.get("content") or ""}


def _atif_steps(messages: list[dict[str, Any]], model: str, *, marked: bool) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for msg, results in _turns(messages):
        if msg.get("role") not in ("system", "user", "assistant"):
            raise RenderError(f"unsupported role {msg.get('role')!r}")
        kept = kept_of(msg, "atif")
        step = restore(_atif_step(msg, len(steps) + 1, model), {k: v for k, v in kept.items() if k != "_observation"})
        observation = kept.get("_observation") if isinstance(kept.get("_observation"), dict) else {}
        if results:
            step["observation"] = {**observation, "results": [
                restore(_atif_result(r), kept_of(r, "atif")) for r in results]}
        elif observation:  # results that answer no call (an observation step) are kept whole
            step["observation"] = {"results": [], **observation}
        originals = {} if marked else _argument_texts([msg])
        if originals:
            step["extra"] = {**(step.get("extra") or {}), "trajplatform_arguments": originals}
        if _messages_of_atif_step(_as_written(step), marked=marked, model=model) != [msg, *results]:
            step["extra"] = {**(step.get("extra") or {}), "trajplatform_messages": [msg, *results]}
        steps.append(step)
    return steps


def _atif_doc(record: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The standard document of a record (our agent, its metrics and a note; no trajplatform keys)."""
    agent: dict[str, Any] = {"name": AGENT_NAME, "version": AGENT_VERSION, "extra": {}}
    if record.get("model"):
        agent["model_name"] = record["model"]
    if record.get("tools"):  # ATIF's tool_definitions follow OpenAI's function calling schema, as ours do
        agent["tool_definitions"] = record["tools"]
    final = {"total_prompt_tokens": record.get("prompt_tokens") or 0,
             "total_completion_tokens": record.get("completion_tokens") or 0,
             "total_steps": len(steps), "extra": {"reward": record.get("reward"), "outcome": record.get("outcome")}}
    try:
        final["total_cost_usd"] = float(record.get("cost_usd") or 0)
    except (TypeError, ValueError):
        pass
    task = record.get("task") or {}
    ident = f"trajplatform-{record['trajectory_id']}"
    return {"schema_version": ATIF_VERSION, "session_id": ident, "trajectory_id": ident, "agent": agent,
            "steps": steps, "final_metrics": final,
            "notes": f"trajplatform {task.get('scene') or ''} trajectory {record['trajectory_id']} of task "
                     f"{record['task_id']}; extra.trajplatform holds the platform's record"}


def render_atif(record: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    messages = record_messages(record)
    source = imported_from(record, "atif")
    doc = _atif_doc(record, _atif_steps(messages, record.get("model") or "", marked=source is not None))
    if source is not None:  # the file's agent, metrics, notes and extras, as it had them
        doc = {**restore(doc, source.get("kept")), "schema_version": ATIF_VERSION,
               "session_id": doc["session_id"], "trajectory_id": doc["trajectory_id"]}
    extra = doc.get("extra") if isinstance(doc.get("extra"), dict) else {}
    return {**doc, "extra": {**extra, "trajplatform": _provenance(record)}}


def _image_part(part: dict[str, Any]) -> Any:
    """What an ATIF image (or audio) part names: a file by path, or a link."""
    if part.get("type") not in ("image", "audio"):
        return None
    source = part.get("source")
    return str((source.get("path") if isinstance(source, dict) else None) or "a part without a source path")


def _text_of(content: Any, at: str) -> str:
    return parts_text(content, at, _image_part)


def _messages_of_atif_step(step: dict[str, Any], *, marked: bool = False, model: str = "", at: str = "step",
                           images: dict[str, Image] | None = None) -> list[dict[str, Any]]:
    """A step's messages: a system or user message, or an assistant turn and its tool results. With
    `marked`, each keeps what the export could not say again from it (keep_rest) under `provenance.atif`.
    `images` collects the images a user or system message inlines (sha256 -> Image)."""
    images = {} if images is None else images
    source = step.get("source")
    if source in ("system", "user"):  # its images are kept even when the exact messages ride along
        message: Any = _message_parts(step.get("message"), f"{at}.message", images)
    extra = step.get("extra") or {}
    if isinstance(extra, dict) and isinstance(extra.get("trajplatform_messages"), list):
        return extra["trajplatform_messages"]
    if source in ("system", "user"):
        out = {"role": source, "content": message}
        if marked:
            put_kept(out, "atif", keep_rest(step, _atif_step(out, step.get("step_id"), model, images)))
        return [out]
    message = _text_of(step.get("message"), f"{at}.message")
    calls = step.get("tool_calls") or []
    observation = step.get("observation") if isinstance(step.get("observation"), dict) else {}
    if source == "agent" and not message and _only_observes(step):
        return [_environment_message(step, observation, marked=marked, model=model, at=at)]
    out = {"role": "assistant", "content": message if message or not calls else None}
    if step.get("reasoning_content"):
        out["reasoning_content"] = step["reasoning_content"]
    names: dict[str, str] = {}
    if calls:
        out["tool_calls"] = []
        for call in calls:
            args = call.get("arguments")
            made = {"id": call.get("tool_call_id"), "type": "function", "function": {
                "name": call.get("function_name"), "arguments": _args_text(args if isinstance(args, dict) else {})}}
            if marked:
                put_kept(made, "atif", keep_rest(call, _atif_call(made)))
            out["tool_calls"].append(made)
            names[call.get("tool_call_id")] = call.get("function_name")
    tools = []
    for j, result in enumerate(observation.get("results") or []):
        made = {"role": "tool", "tool_call_id": result.get("source_call_id"),
                "name": names.get(result.get("source_call_id"), ""),
                "content": _text_of(result.get("content"), f"{at}.observation.results[{j}].content")}
        if marked:
            put_kept(made, "atif", keep_rest(result, _atif_result(made)))
        tools.append(made)
    if marked:
        kept = keep_rest({k: v for k, v in step.items() if k != "observation"}, _atif_step(out, step.get("step_id"), model))
        rest = {k: v for k, v in observation.items() if k != "results"}
        if rest:
            kept["_observation"] = rest
        put_kept(out, "atif", kept)
    return _restore_arguments([out, *tools], extra.get("trajplatform_arguments") if isinstance(extra, dict) else None)


def _only_observes(step: dict[str, Any]) -> bool:
    """An agent step with no call and no reasoning whose results answer no call (its message, if any,
    is checked by the caller as text): how neulab's converter writes an observation that answers no action."""
    observation = step.get("observation") if isinstance(step.get("observation"), dict) else {}
    return not step.get("tool_calls") and not step.get("reasoning_content") and bool(observation.get("results")) \
        and all(isinstance(r, dict) and r.get("source_call_id") is None for r in observation["results"])


def _environment_message(step: dict[str, Any], observation: dict[str, Any], *, marked: bool, model: str,
                         at: str) -> dict[str, Any]:
    """An agent step that only observes (no message, no call; results answering no call, as
    neulab's ADP converter writes an ADP observation that answers no action): an environment
    message, its results' text (the page text of an ADP web observation the converter put in a
    result's extra.web). The step is kept whole for the export."""
    texts = []
    for j, result in enumerate(observation["results"]):
        where = f"{at}.observation.results[{j}]"
        text = _text_of(result.get("content"), f"{where}.content")
        web = (result.get("extra") or {}).get("web") if isinstance(result.get("extra"), dict) else None
        if not text and isinstance(web, dict):
            if web.get("image_observation") is not None:
                raise InterchangeError(f"{where}.extra.web.image_observation: a web observation's screenshot in an "
                                       "ATIF extra cannot be imported (only its page text is read)")
            text = web_text(web)
        if text:
            texts.append(text)
    out = {"role": "user", "content": "\n\n".join(texts), "provenance": {"format": "atif", "source": "environment"}}
    if marked:
        kept = keep_rest({k: v for k, v in step.items() if k != "observation"}, _atif_step(out, step.get("step_id"),
                                                                                          model))
        put_kept(out, "atif", {**kept, "_observation": observation})
    return out


def _content_problem(content: Any) -> bool:
    return not (isinstance(content, str) or (isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in ("text", "image") for p in content)))


def validate_atif(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return ["line: must be an object"]
    problems = [] if "steps" in obj else ["line.steps: missing"]
    version = obj.get("schema_version")
    if not (isinstance(version, str) and _READABLE_VERSION.fullmatch(version)):
        problems.append(f"line.schema_version: {version!r} is not one of {ATIF_VERSIONS[0]}...{ATIF_VERSIONS[-1]} "
                        "(or a later ATIF-v1.x)")
    problems += type_problems(obj, "line", strings=("session_id", "trajectory_id", "notes"),
                              objects=("agent", "extra", "final_metrics"))
    if not any(isinstance(obj.get(k), str) and obj[k] for k in ("trajectory_id", "session_id")):
        problems.append("line.session_id: a non-empty string (or trajectory_id)")
    agent = obj.get("agent")
    if isinstance(agent, dict):
        if not all(isinstance(agent.get(k), str) for k in ("name", "version") if k in agent):
            problems.append("line.agent: an object with name and version strings")
        problems += type_problems(agent, "line.agent", strings=("model_name",), lists=("tool_definitions",))
        definitions = agent.get("tool_definitions") if isinstance(agent.get("tool_definitions"), list) else []
        problems += [f"line.agent.tool_definitions[{j}]: a function definition with a name (OpenAI's function "
                     "calling schema)" for j, d in enumerate(definitions) if tool_spec(d) is None]
    final = obj.get("final_metrics")
    if isinstance(final, dict):
        problems += type_problems(final, "line.final_metrics", objects=("extra",), costs=("total_cost_usd",),
                                  counts=("total_prompt_tokens", "total_completion_tokens", "total_cached_tokens",
                                          "total_steps"))
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
        if step.get("source") not in _SOURCES:
            problems.append(f"{at}.source: one of system, user, agent")
        if _content_problem(step.get("message", "")):
            problems.append(f"{at}.message: a string (may be empty) or content parts")
        problems += type_problems(step, at, strings=("reasoning_content", "model_name"), objects=("extra",),
                                  lists=("tool_calls",))
        ids = set()
        calls = step.get("tool_calls") if isinstance(step.get("tool_calls"), list) else []
        for j, call in enumerate(calls):
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
                    if not isinstance(result, dict):
                        problems.append(f"{at}.observation.results[{j}]: must be an object")
                    elif source is not None and not isinstance(source, str):
                        problems.append(f"{at}.observation.results[{j}].source_call_id: a string or null")
                    elif source is not None and source not in ids:
                        problems.append(f"{at}.observation.results[{j}].source_call_id: {source!r} is no call of "
                                        "this step")
                    elif _content_problem(result.get("content")):
                        problems.append(f"{at}.observation.results[{j}].content: a string or content parts")
    return problems


def _training_notes(obj: dict[str, Any], where: str) -> list[str]:
    """What a file says about training on its steps that our exports do not act on, as import warnings."""
    notes = []
    copied = [s["step_id"] for s in obj["steps"] if s.get("is_copied_context") is True]
    if copied:
        notes.append(f"{where}: steps {', '.join(map(str, copied))} are copied context (is_copied_context: ATIF "
                     "says not to train on them); the chat exports train on every assistant turn")
    scripted = [s["step_id"] for s in obj["steps"] if s.get("source") == "agent" and s.get("llm_call_count") == 0
                and not (not s.get("message") and _only_observes(s))]  # an observing step is no assistant turn
    if scripted:
        notes.append(f"{where}: agent steps {', '.join(map(str, scripted))} ran no model (llm_call_count 0); the "
                     "chat exports train on them as assistant turns")
    subagents = obj.get("subagent_trajectories")
    if isinstance(subagents, list) and subagents:
        notes.append(f"{where}: {len(subagents)} embedded subagent trajectories (subagent_trajectories) are kept "
                     "with the record for the export, not imported as trajectories of their own")
    return notes


def from_atif(obj: Any, n: int, options: dict[str, Any], label: str) -> dict[str, Any]:
    refuse(validate_atif(obj), label, "ATIF")
    ours = _ours(obj.get("extra"), [])
    marked = ours is None or bool(imported_from(ours, "atif"))
    agent = obj.get("agent") or {}
    model = (agent.get("model_name") or "") if ours is None else (ours.get("model") or "")
    messages = [m for i, step in enumerate(obj["steps"])
                for m in _messages_of_atif_step(step, marked=marked, model=model, at=f"{label}: steps[{i}]",
                                                images=options.get("images"))]
    if ours is not None:
        return {**ours, "messages": messages}
    final = obj.get("final_metrics") or {}
    external_id = obj.get("trajectory_id") or obj.get("session_id")
    source = {"format": "atif", "schema_version": obj["schema_version"], "session_id": obj.get("session_id"),
              "trajectory_id": obj.get("trajectory_id"), "agent": {k: agent.get(k) for k in ("name", "version",
                                                                                           "model_name")},
              "file": options.get("file", "")}
    record = _foreign_record(
        messages, n=n, external_id=external_id, source=source, options=options, model=model,
        tokens=(int(final.get("total_prompt_tokens") or 0), int(final.get("total_completion_tokens") or 0)),
        cost=float(final.get("total_cost_usd") or 0.0), reward=(final.get("extra") or {}).get("reward"),
        declared=[tool_spec(d) for d in agent.get("tool_definitions") or []])
    warnings = options.get("warnings")
    if warnings is not None:
        warnings += _training_notes(obj, f"{options.get('file') or label}: {external_id}")
    # the document's own fields (agent, final_metrics, notes, extra, fields this reader does not know)
    source["kept"] = document_rest(obj, _atif_doc(record, []), ("steps", "schema_version", "session_id",
                                                                "trajectory_id"))
    return record
