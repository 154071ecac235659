"""What the interchange formats share: the import error, the message helpers the exports use, the
image an import keeps, what an import keeps of a file's objects (keep_rest / restore), the
platform's steps of an imported conversation, and the record a foreign trajectory becomes.
The formats themselves are described in the package's docstring."""
from __future__ import annotations

import json
import re
from typing import Any, Iterator, NamedTuple

import orjson

from apps.datasets.record_schema import RAW_SCHEMA_VERSION, TASK_FIELDS, RenderError
from apps.engines.steps import Step
from apps.tasks.models import Task, content_sha256

OUTCOMES = ("success", "failure")
_KEPT_OUT = ("messages",)  # rebuilt from the steps / content


class InterchangeError(ValueError):
    """A file that cannot be imported; `errors` lists every problem as `FILE:LINE: reason`; `field`
    names the import option the problem is about (outcome), if any."""

    def __init__(self, message: str, errors: list[str] | None = None, *, field: str = ""):
        self.errors = errors or [message]
        self.field = field
        super().__init__(message)


# --- what a reader checks of a file's values before it reads them ------------------------------

MAX_COUNT = 2**31 - 1  # token counts are the trajectory's integer columns
MAX_COST_USD = 10**6  # cost_usd holds 12 digits, 6 of them decimals


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def type_problems(obj: dict[str, Any], at: str, *, strings: tuple[str, ...] = (), objects: tuple[str, ...] = (),
                  lists: tuple[str, ...] = (), counts: tuple[str, ...] = (), costs: tuple[str, ...] = ()) -> list[str]:
    """What of `obj`'s optional fields has the wrong type (each may be absent or null): strings, objects,
    lists, token counts (whole numbers from 0) and costs (numbers from 0)."""
    problems = []
    for keys, ok, what in (
            (strings, lambda v: isinstance(v, str), "a string or null"),
            (objects, lambda v: isinstance(v, dict), "an object or null"),
            (lists, lambda v: isinstance(v, list), "a list or null"),
            (counts, lambda v: _is_int(v) and 0 <= v <= MAX_COUNT, f"a whole number from 0 to {MAX_COUNT} or null"),
            (costs, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < MAX_COST_USD,
             f"a number from 0 to {MAX_COST_USD} or null")):
        problems += [f"{at}.{k}: {what}" for k in keys if obj.get(k) is not None and not ok(obj[k])]
    return problems


def refuse(problems: list[str], label: str, what: str) -> None:
    """Raise the reader's InterchangeError for a document with problems: one `LABEL: not WHAT: problem` each."""
    if problems:
        raise InterchangeError(f"{label}: not {what}", [f"{label}: not {what}: {p}" for p in problems])


def fetched_image(what: str) -> InterchangeError:
    """The refusal of an image a file names by path or link (an import fetches nothing)."""
    return InterchangeError(f"the image {what[:80]!r} is a path or link; only images inlined as data:image/...;base64 "
                            "URLs can be imported (nothing is fetched)")


def reasoning_of(msg: dict[str, Any]) -> str | None:
    """A message's reasoning_content when it has some (a non-empty string)."""
    reasoning = msg.get("reasoning_content")
    return reasoning if isinstance(reasoning, str) and reasoning else None


def record_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a record's export is written from (RenderError when it has none)."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("no messages")
    return messages


def document_rest(obj: dict[str, Any], rebuilt: dict[str, Any], written: tuple[str, ...]) -> dict[str, Any]:
    """What the export must put back of a document's own top-level fields (keep_rest of them against
    the document the export writes, `rebuilt`), less the `written` ones it writes from our record."""
    return keep_rest({k: v for k, v in obj.items() if k not in written},
                     {k: v for k, v in rebuilt.items() if k not in written})


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
    out = {k: v for k, v in record.items() if k not in _KEPT_OUT}
    if isinstance(out.get("task"), dict) and "pass_rate" in out["task"]:
        # the task's pass rate is read from the rollouts stored where the file is exported, not the file's
        out["task"] = {k: v for k, v in out["task"].items() if k != "pass_rate"}
    return out


class Image(NamedTuple):
    data: bytes
    mime: str
    width: int
    height: int


def _tools_for(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A spec per tool the file's calls name (their files describe none): the argument names seen,
    as strings where every value seen is one."""
    seen: dict[str, dict[str, set[str]]] = {}
    for msg in messages:
        for call in msg.get("tool_calls") or []:
            fn = call["function"]
            props = seen.setdefault(fn["name"], {})
            try:
                args = _args_object(fn.get("arguments"))
            except RenderError:
                args = {}
            for key, value in args.items():
                props.setdefault(key, set()).add("string" if isinstance(value, str) else "")
    return [{"type": "function", "function": {"name": name, "description": "", "parameters": {
        "type": "object", "properties": {k: ({"type": "string"} if kinds == {"string"} else {})
                                         for k, kinds in sorted(props.items())}}}}
            for name, props in sorted(seen.items())]


# --- what a standard field cannot say, kept beside the message it belongs to ---------------------

ABSENT = "_absent"  # the keys the original did not have, where the rebuilt one has them


def keep_rest(original: dict[str, Any], rebuilt: dict[str, Any]) -> dict[str, Any]:
    """What of `original` (a file's object) `rebuilt` (the same object as the export writes it from
    our record) does not say: its other keys, the values that differ, the keys it lacked; {} when
    the export alone gives the original back. `restore(rebuilt, kept)` undoes it."""
    kept = {k: v for k, v in original.items() if k not in rebuilt or _as_written(rebuilt[k]) != _as_written(v)}
    absent = sorted(k for k in rebuilt if k not in original)
    if absent:
        kept[ABSENT] = absent
    return kept


def restore(rebuilt: dict[str, Any], kept: Any) -> dict[str, Any]:
    """The object as the file had it: `rebuilt` with what keep_rest kept put back."""
    if not isinstance(kept, dict) or not kept:
        return rebuilt
    out = {**rebuilt, **{k: v for k, v in kept.items() if k != ABSENT}}
    for key in kept.get(ABSENT) or []:
        out.pop(key, None)
    return out


def kept_of(obj: dict[str, Any], fmt: str) -> dict[str, Any]:
    """What an import kept of the file's object under a message's or call's `provenance`."""
    provenance = obj.get("provenance")
    kept = provenance.get(fmt) if isinstance(provenance, dict) else None
    return kept if isinstance(kept, dict) else {}


def put_kept(obj: dict[str, Any], fmt: str, kept: dict[str, Any]) -> None:
    if kept:
        obj.setdefault("provenance", {"format": fmt})[fmt] = kept


def unique_call_ids(messages: list[dict[str, Any]]) -> None:
    """Make tool-call ids unique in the conversation (chat formats require it; some files reuse
    "call_1" in every turn, or for two calls of one turn): a repeated id gets a suffix in its call
    and its result. Results answer the calls of the turn before them, in order: the first result
    naming a repeated id answers the first call of the turn with it, the next the next."""
    seen: set[Any] = set()
    waiting: dict[Any, list[str]] = {}  # the turn's calls not answered yet, by the id the file gave them
    latest: dict[Any, str] = {}  # the id the file gave -> its latest call's id now
    for msg in messages:
        if msg.get("role") == "tool":
            call_id = msg.get("tool_call_id")
            if waiting.get(call_id):
                msg["tool_call_id"] = waiting[call_id].pop(0)
            elif call_id in latest:  # a second result for an answered call stays with that call
                msg["tool_call_id"] = latest[call_id]
            continue
        if msg.get("tool_calls"):
            waiting = {}
        for call in msg.get("tool_calls") or []:
            call_id = given = call.get("id")
            if call_id in seen:
                n = 2
                while f"{given}~{n}" in seen:
                    n += 1
                call_id = call["id"] = f"{given}~{n}"
            seen.add(call_id)
            waiting.setdefault(given, []).append(call_id)
            latest[given] = call_id


# --- the platform's steps from a conversation ----------------------------------------------------

OBSERVATION_CHARS = 2000  # as the agent loop records a step's observation


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def parts_text(content: Any, at: str, image: Any = None) -> str:
    """A file's message content as text: a string, or content parts whose texts are joined by a line;
    a part `image` recognises (it returns the path or link the part names) is refused, not dropped
    (nothing is fetched, and a silent drop would train on a turn without what the agent saw)."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else []:
        named = image(part) if image is not None and isinstance(part, dict) else None
        if named is not None:
            raise InterchangeError(f"{at}: {fetched_image(str(named))}")
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts)


TEXT_ACTION_TOOL, TEXT_ACTION_FORMAT = "action", "react_text"
# The ReAct text protocol of AgentTuning's files (ADP's agenttuning samples without schema_version):
# the agent's turn is text, "THOUGHT: ...\n ACTION: <action>" or "ACTION: <action>", and the
# environment answers in the next user message.
_ACTION_LINE = re.compile(r"(?:\A|\n)[ \t]*ACTION:[ \t]*(?P<action>[^\n]*\S)[ \t]*\Z", re.I)
_THOUGHT_LABEL = re.compile(r"\A\s*THOUGHT:\s*", re.I)


def text_action(content: Any) -> tuple[str, str] | None:
    """(thought, action) of an assistant text written in the ReAct text protocol (its last line
    `ACTION: <action>`), None for any other text."""
    match = _ACTION_LINE.search(content) if isinstance(content, str) else None
    if match is None:
        return None
    return _THOUGHT_LABEL.sub("", content[:match.start()]).strip(), match.group("action")


def steps_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The platform's step records (apps.engines.steps.Step) of an imported conversation: one per
    tool call, with the turn's thought (its text, else its reasoning) on the turn's first call, the
    observation the agent had before the turn, the call's result as output and the exit code where
    the file gives one (a result message's provenance `exit_code`); a call the file never answers
    says so in `error`. A text turn in the ReAct text protocol (text_action) is a step too: tool
    `action` {"action": ...}, format `react_text`, the next user message its result (the message
    stays text, as the file's prompt asks the model to write it)."""
    results = {m.get("tool_call_id"): m for m in messages if m.get("role") == "tool"}
    steps: list[dict[str, Any]] = []
    turn, observation = 0, ""
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            if msg.get("role") != "system":
                observation = _text(msg.get("content"))
            continue
        turn += 1
        reasoning = reasoning_of(msg)
        said = text_action(msg.get("content")) if not msg.get("tool_calls") else None
        if said is not None:
            after = messages[i + 1] if i + 1 < len(messages) else {}
            step = Step(index=len(steps), turn=turn, tool_call_id=None, tool=TEXT_ACTION_TOOL,
                        arguments={"action": said[1]}, format=TEXT_ACTION_FORMAT, thought=said[0] or reasoning or "",
                        observation=observation[:OBSERVATION_CHARS], llm={}, reasoning_content=reasoning or None)
            if after.get("role") == "user":
                step.update(output=_text(after.get("content")))
            else:
                step.update(error="the file has no result for this action")
            steps.append(step.to_record())
            continue
        thought = _text(msg.get("content")) or reasoning or ""
        for k, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") or {}
            try:
                arguments: Any = _args_object(fn.get("arguments"))
            except RenderError:
                arguments = fn.get("arguments")
            result = results.get(call.get("id"))
            step = Step(index=len(steps), turn=turn, tool_call_id=call.get("id"), tool=fn.get("name") or "",
                        arguments=arguments, format="native", thought=thought if k == 0 else "",
                        observation=observation[:OBSERVATION_CHARS], llm={},
                        reasoning_content=(reasoning or None) if k == 0 else None)
            if result is None:
                step.update(error="the file has no result for this call")
            else:
                exit_code = (result.get("provenance") or {}).get("exit_code")
                step.update(output=_text(result.get("content")),
                            exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool)
                            else None)
            steps.append(step.to_record())
    return steps


def tool_spec(definition: Any) -> dict[str, Any] | None:
    """A tool definition a file declares as the trajectory's tool spec (OpenAI's function calling
    schema: {type: function, function: {name, ...}}, or its inner {name, ...}); None when it names none."""
    if isinstance(definition, dict) and isinstance(definition.get("function"), dict):
        definition = definition["function"]
    if not (isinstance(definition, dict) and isinstance(definition.get("name"), str) and definition["name"]):
        return None
    return {"type": "function", "function": definition}


def _foreign_record(messages: list[dict[str, Any]], *, n: int, external_id: str, source: dict[str, Any],
                    options: dict[str, Any], model: str = "", final_answer: str = "",
                    tokens: tuple[int, int] = (0, 0), cost: float = 0.0, reward: Any = None,
                    declared: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Our record of another tool's trajectory; its tools are the ones the file `declared` (tool
    specs), then one guessed from the calls for each tool it calls without declaring."""
    outcome = options.get("outcome")
    if outcome not in OUTCOMES:
        raise InterchangeError(f"{external_id}: a trajectory from another tool has no outcome we can verify; say "
                               "which it is: outcome success or failure", field="outcome")
    users = [m for m in messages if m["role"] == "user" and isinstance(m.get("content"), (str, list))
             and (m.get("provenance") or {}).get("source") != "environment"]
    if not users:
        raise InterchangeError(f"{external_id}: no user message (the task)")
    prompt = _text(users[0]["content"])  # with an image: its text parts
    if not prompt.strip():
        raise InterchangeError(f"{external_id}: the first user message (the task's prompt) has no text")
    task = {f: Task._meta.get_field(f).get_default() for f in TASK_FIELDS}  # the defaults a new task gets
    task.update(scene=options.get("scene") or "code_exec", prompt=prompt, external_id=external_id[:200],
                model=model[:200], batch="")
    unique_call_ids(messages)
    tools: list[dict[str, Any]] = []
    for tool in [*declared, *_tools_for(messages)]:  # a name declared twice, or declared and called: its first
        if all(t["function"]["name"] != tool["function"]["name"] for t in tools):
            tools.append(tool)
    final_answer = final_answer if isinstance(final_answer, str) else ""
    reward = reward if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
    return {
        "schema_version": RAW_SCHEMA_VERSION, "trajectory_id": n, "task_id": n, "task": task,
        "reviews": {"auto": None, "human": None}, "iteration": 1, "sample_index": 0, "status": "finished",
        "messages": messages, "tools": tools, "steps": steps_of(messages), "final_answer": final_answer,
        "outcome": outcome, "outcome_reason": f"imported from {source['format']}: outcome given on import",
        "reward": reward, "verifier_output": {}, "model": model[:200], "config_snapshot": {"imported_from": source},
        "prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": tokens[0] + tokens[1],
        "cost_usd": str(cost), "error": "", "started_at": None, "finished_at": None,
        "content_sha256": content_sha256({"messages": messages, "tools": tools, "final_answer": final_answer,
                                          "outcome": outcome, "reward": reward}),
    }


def imported_from(record: dict[str, Any], fmt: str) -> dict[str, Any] | None:
    """The import's note of the file a record came from, when it came from a file of `fmt`."""
    source = (record.get("config_snapshot") or {}).get("imported_from")
    return source if isinstance(source, dict) and source.get("format") == fmt else None


def _ours(extra: Any, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    record = (extra or {}).get("trajplatform") if isinstance(extra, dict) else None
    if isinstance(record, dict) and record.get("schema_version") == RAW_SCHEMA_VERSION:
        return {**record, "messages": messages}
    return None
