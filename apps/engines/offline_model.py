"""The offline scripted model: an OpenAI-compatible HTTP server that replays reference solutions.

A labelled stand-in for demos, CI and tests on machines without internet. It is not a language
model: it answers as model `scripted-reference`, and only with the tool calls of the bundled
reference solution of the task it recognises. For a task it has no script for, it says so in
plain text and calls no tool; it never invents a call.

    python manage.py offline_model [--host 127.0.0.1] [--port 8765] [--solutions PATH ...] [--fault SPEC]

    with running_offline_model(["examples/reference_solutions"]) as server:   # tests
        ... LLMClient([Provider("offline", server.url, "scripted-reference")]) ...

Endpoints: POST /v1/chat/completions (non-streaming), GET /v1/models, GET /healthz; HTTP/1.1 with
keep-alive (aiohttp's server on one event loop) and a listen backlog for a few hundred clients
at once.

Reference solutions (files passed with --solutions; a directory means every *.json and
*.jsonl file in it, recursively, in name order):

* `*.json`: one object, or a list of objects;
* `*.jsonl`: one object per line; lines without `reference_solution` are skipped, so a task
  file (trajplatform or agent-data-platform shape) can carry its own solutions.

Each object has `prompt` (or `description`, the agent-data-platform name) and
`reference_solution`: a list of steps (or {"steps": [...]}), optionally `id`. A step is

    {"thought": "optional text sent as the message content",
     "tool_calls": [{"name": "write_file", "arguments": {"path": "a.py", "content": "..."}}]}

or, as the last step only, a plain final answer: {"content": "The answer is 42."}. `arguments`
may be an object (sent as JSON) or a string (sent verbatim); OpenAI-format calls
({"type": "function", "function": {"name", "arguments"}}) are accepted too. The last step is
the finishing one (typically a `finish`/`submit` call, or the final answer).

Which script, which step: the first user message is normalised (whitespace collapsed) and
matched exactly by sha256; failing that, the longest script prompt contained in it wins (so a
loop may wrap the task prompt in its own text); a marker `[script:ID]` anywhere in it selects a
script by id. The step is the number of assistant messages already in `messages`. Every
scripted tool name must be among the request's `tools`; if not, the reply is HTTP 400 rather
than a call the agent cannot execute.

Routing: the client sends the header `X-Trajplatform-Route` to this stand-in only (its provider
profile has routing_headers; real models' requests carry nothing but the task), set by the
caller with `apps.engines.llm.llm_route(...)`. The prompts themselves carry no markers.

Pipeline stages (apps.engines.pipelines, docs/pipelines.md): an `llm` stage's requests are routed
`pipeline:TEMPLATE key=ITEM`, and the script whose prompt is the key line `[pipeline:TEMPLATE
key=ITEM]` answers them (before any script the prompt happens to contain, such as the agent script
of a question the stage quotes); a search2qa stage's sub-episode is routed the same way, step by
step. A repair turn (the stage's output failed its validator) is routed `pipeline:TEMPLATE key=ITEM
repair=N` and answered by the script of `[pipeline:TEMPLATE key=ITEM repair=N]` from its first
step, whatever came before; with no script for it, the plain "no script" answer fails validation
and the item is dropped. (A key line written into a request's own text is still recognised the
same way, for hand-made requests.)

Judge mode: a request routed `judge` (the review agent's judge, apps.reviews.review_agent) is
not looked up among the scripts.
The stand-in answers it deterministically from the `<evidence>{...}</evidence>` JSON the prompt
carries (facts computed in code: outcome, reward, checks that fired, the rubric's dimensions):
every dimension gets base - 10 per fired check (base = 100 x reward, else 90 for a success, 40
for a failure, 10 for an error), clamped to 0-100, and each rationale and the summary say
plainly that this is the offline stand-in, not a language model. No evidence, no scores: it
then answers in plain text, which the review agent records as a judge failure.

Token usage is approximate: ceil(characters / 4) of the request's messages and tools
(prompt_tokens) and of the reply's content and arguments (completion_tokens). It costs nothing.

Fault injection, for exercising clients and agent loops. A fault spec is a comma-separated list
of items `kind[;key=value...]`, given per server (`--fault`, `faults=`), per request in the
`X-Scripted-Fault` header, or in the model name (`scripted-reference+fault=SPEC`):

    429[;retry_after=S]   HTTP 429 with Retry-After: S (default 1)
    500 | 502 | 503 | 504 that HTTP error
    slow[;seconds=S]      answer after S seconds (default 2)
    malformed             tool-call `arguments` that are not valid JSON (truncated)
    never_finish          never plays the final step: repeats the step before it instead
    text_only             plain text, no tool call, even when tools are offered

Every item takes `times=N`: it applies to the first N requests that carry it (counted per
server, per source and spec), then requests pass through; without `times` it always applies.
So "500;times=2" fails twice and then answers.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

MODEL_NAME = "scripted-reference"
FAULT_HEADER = "X-Scripted-Fault"
MODEL_FAULT_PREFIX = MODEL_NAME + "+fault="
STATUS_FAULTS = {"429", "500", "502", "503", "504"}
KEEPALIVE_IDLE_S = 120.0
FAULT_KINDS = STATUS_FAULTS | {"slow", "malformed", "never_finish", "text_only"}
_MARKER = re.compile(r"\[script:([A-Za-z0-9_.:\-]+)\]")
# The key line a pipeline stage's script is written under (script_key).
PIPELINE_KEY = re.compile(r"\[pipeline:[^\]\s]+ key=[^\]]*\]")
# The request header that routes a request (apps.engines.llm.ROUTE_HEADER; a test checks), and
# its values: the judge, or a pipeline stage's key (apps.engines.generation.stage_route).
ROUTE_HEADER = "X-Trajplatform-Route"
JUDGE_ROUTE = "judge"
PIPELINE_ROUTE_PREFIX = "pipeline:"
# Must equal apps.reviews.review_agent.EVIDENCE_OPEN / EVIDENCE_CLOSE.
_EVIDENCE = re.compile(r"<evidence>(.*?)</evidence>", re.DOTALL)
JUDGE_LABEL = f"{MODEL_NAME} judge (offline stand-in, not a language model)"
JUDGE_BASE = {"success": 90.0, "failure": 40.0, "error": 10.0}
JUDGE_PENALTY_PER_CHECK = 10.0


def script_key(route: str) -> str:
    """The prompt a routed request's script is written under: `[<route>]`, e.g.
    `[pipeline:TEMPLATE key=ITEM]` for a call routed apps.engines.generation.stage_route(...).
    The stand-in's own naming of its scripts; never part of what a model is sent."""
    return f"[{route}]"


class ReferenceSolutionError(ValueError):
    """A reference-solution file that cannot be loaded; the message says FILE:LINE: why."""


class FaultSpecError(ValueError):
    pass


# -- scripts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: str  # what is sent: JSON text, or a verbatim string from the script


@dataclass(frozen=True)
class Step:
    thought: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    content: str | None = None  # a final plain-text answer (last step only)


@dataclass(frozen=True)
class Script:
    id: str
    prompt: str
    steps: tuple[Step, ...]
    source: str = ""

    @property
    def normalized_prompt(self) -> str:
        return normalize_prompt(self.prompt)


def normalize_prompt(text: str) -> str:
    return " ".join(text.split())


def prompt_sha256(text: str) -> str:
    return hashlib.sha256(normalize_prompt(text).encode("utf-8")).hexdigest()


def _parse_call(raw: Any, where: str) -> ScriptedCall:
    if not isinstance(raw, dict):
        raise ReferenceSolutionError(f"{where}: a tool call must be an object")
    if isinstance(raw.get("function"), dict):
        raw = raw["function"]
    name, arguments = raw.get("name"), raw.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ReferenceSolutionError(f"{where}: a tool call needs a non-empty string `name`")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not isinstance(arguments, str):
        raise ReferenceSolutionError(f"{where}: `arguments` of {name!r} must be an object or a string")
    return ScriptedCall(name, arguments)


def parse_script(obj: Any, *, where: str, default_id: str) -> Script:
    """One {prompt|description, reference_solution, id?} object -> Script."""
    if not isinstance(obj, dict):
        raise ReferenceSolutionError(f"{where}: expected an object")
    prompt = obj.get("prompt", obj.get("description"))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ReferenceSolutionError(f"{where}: needs a non-empty `prompt` (or `description`)")
    raw_steps = obj.get("reference_solution")
    if isinstance(raw_steps, dict):
        raw_steps = raw_steps.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ReferenceSolutionError(f"{where}: `reference_solution` must be a non-empty list of steps (or {{'steps': [...]}})")
    steps = []
    for n, raw in enumerate(raw_steps):
        at = f"{where}: step {n}"
        if not isinstance(raw, dict):
            raise ReferenceSolutionError(f"{at}: must be an object")
        unknown = set(raw) - {"thought", "tool_calls", "content"}
        if unknown:
            raise ReferenceSolutionError(f"{at}: unknown key(s) {', '.join(sorted(unknown))}")
        thought, calls, content = raw.get("thought"), raw.get("tool_calls"), raw.get("content")
        if thought is not None and not isinstance(thought, str):
            raise ReferenceSolutionError(f"{at}: `thought` must be a string")
        if content is not None:
            if calls is not None or thought is not None or not isinstance(content, str):
                raise ReferenceSolutionError(f"{at}: a `content` step is a string answer alone (no thought, no tool_calls)")
            if n != len(raw_steps) - 1:
                raise ReferenceSolutionError(f"{at}: a plain `content` answer can only be the last step")
            steps.append(Step(content=content))
            continue
        if not isinstance(calls, list) or not calls:
            raise ReferenceSolutionError(f"{at}: needs a non-empty `tool_calls` list (or a final `content`)")
        steps.append(Step(thought=thought, tool_calls=tuple(_parse_call(c, at) for c in calls)))
    script_id = obj.get("id") or obj.get("external_id") or obj.get("task_id") or default_id
    return Script(str(script_id), prompt, tuple(steps), where)


def _iter_files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
    elif path.is_file():
        yield path
    else:
        raise ReferenceSolutionError(f"{path}: no such file or directory")


def load_scripts(paths: Iterable[str | Path]) -> list[Script]:
    """Every script in the given files and directories (see the module docstring for formats)."""
    scripts: list[Script] = []
    for root in paths:
        for path in _iter_files(Path(root)):
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".jsonl":
                for lineno, line in enumerate(text.splitlines(), 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ReferenceSolutionError(f"{where}: malformed JSON: {exc.msg}") from None
                    if isinstance(obj, dict) and "reference_solution" in obj:
                        scripts.append(parse_script(obj, where=where, default_id=f"{path.stem}:{lineno}"))
                continue
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ReferenceSolutionError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
            items = data if isinstance(data, list) else [data]
            for i, obj in enumerate(items):
                where = f"{path}" if len(items) == 1 else f"{path}: item {i}"
                default_id = path.stem if len(items) == 1 else f"{path.stem}:{i}"
                scripts.append(parse_script(obj, where=where, default_id=default_id))
    return scripts


class ScriptRegistry:
    """Scripts by normalised-prompt hash and by id."""

    def __init__(self, scripts: Iterable[Script] = ()):
        self.by_hash: dict[str, Script] = {}
        self.by_id: dict[str, Script] = {}
        for script in scripts:
            self.add(script)

    def __len__(self) -> int:
        return len(self.by_hash)

    def add(self, script: Script) -> None:
        digest = prompt_sha256(script.prompt)
        old = self.by_hash.get(digest)
        if old is not None and old.steps != script.steps:
            raise ReferenceSolutionError(f"{script.source}: same prompt as {old.source} but a different solution")
        self.by_hash[digest] = script
        self.by_id.setdefault(script.id, script)

    def keyed(self, key: str) -> Script | None:
        """The script whose prompt is exactly this key line (a routed pipeline stage's)."""
        return self.by_hash.get(prompt_sha256(key))

    def match(self, text: str) -> Script | None:
        marker = _MARKER.search(text)
        if marker and marker.group(1) in self.by_id:
            return self.by_id[marker.group(1)]
        normalized = normalize_prompt(text)
        exact = self.by_hash.get(hashlib.sha256(normalized.encode("utf-8")).hexdigest())
        if exact is not None:
            return exact
        key = PIPELINE_KEY.search(normalized)
        if key is not None:
            # A stage prompt may quote a longer script's prompt (a quality check quotes the
            # question an agent script answers): its key line names the stage's own script.
            keyed = self.by_hash.get(hashlib.sha256(key.group(0).encode("utf-8")).hexdigest())
            if keyed is not None:
                return keyed
        inside = [s for s in self.by_hash.values() if s.normalized_prompt and s.normalized_prompt in normalized]
        return max(inside, key=lambda s: len(s.normalized_prompt)) if inside else None


# -- faults ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict[str, str]
    spec: str  # the item as written: with its source, the key its `times` counter uses

    @property
    def times(self) -> int | None:
        return int(self.params["times"]) if "times" in self.params else None


def parse_faults(spec: str) -> list[Fault]:
    """'429;retry_after=2;times=1,slow;seconds=0.5' -> [Fault, Fault]; raises FaultSpecError."""
    faults = []
    for item in (part.strip() for part in (spec or "").split(",")):
        if not item:
            continue
        kind, *pairs = [p.strip() for p in item.split(";")]
        if kind not in FAULT_KINDS:
            raise FaultSpecError(f"unknown fault {kind!r}; known: {', '.join(sorted(FAULT_KINDS))}")
        params = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise FaultSpecError(f"fault {item!r}: expected key=value, got {pair!r}")
            params[key.strip()] = value.strip()
        try:
            for key in ("times",):
                if key in params and int(params[key]) < 0:
                    raise ValueError
            for key in ("retry_after", "seconds"):
                if key in params and not (float(params[key]) >= 0):
                    raise ValueError
        except ValueError:
            raise FaultSpecError(f"fault {item!r}: times must be an integer, retry_after/seconds a number >= 0") from None
        faults.append(Fault(kind, params, item))
    return faults


# -- the model ------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def _error(status: int, message: str, *, type_: str = "invalid_request_error", code: str | None = None) -> Reply:
    return Reply(status, {"error": {"message": f"{MODEL_NAME}: {message}", "type": type_, "code": code, "param": None}})


def _approx_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4)) if text else 0


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _offered_tools(tools: Any) -> list[str]:
    names = []
    for tool in tools if isinstance(tools, list) else []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


class ScriptedModel:
    """The request -> reply logic of the offline model, without HTTP (thread-safe)."""

    def __init__(self, scripts: Iterable[Script] = (), *, faults: str = ""):
        self.registry = scripts if isinstance(scripts, ScriptRegistry) else ScriptRegistry(scripts)
        self.server_faults = parse_faults(faults)
        self._lock = threading.Lock()
        self._fault_uses: Counter[str] = Counter()
        self.chat_requests = 0
        self.stats: Counter[str] = Counter()
        self.requests: deque[dict[str, Any]] = deque(maxlen=1000)

    def reset(self) -> None:
        with self._lock:
            self._fault_uses.clear()
            self.stats.clear()
            self.requests.clear()
            self.chat_requests = 0

    def _active(self, faults: list[Fault], source: str) -> dict[str, Fault]:
        """The faults this request gets, consuming one use of each limited one."""
        active: dict[str, Fault] = {}
        with self._lock:
            for fault in faults:
                key = f"{source}:{fault.spec}"
                if fault.times is not None:
                    if self._fault_uses[key] >= fault.times:
                        continue
                    self._fault_uses[key] += 1
                active.setdefault(fault.kind, fault)
                self.stats[f"fault:{fault.kind}"] += 1
        return active

    def models(self) -> Reply:
        return Reply(200, {"object": "list", "data": [
            {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "trajplatform (offline stand-in)"}
        ]})

    def chat(self, body: Any, headers: dict[str, str]) -> Reply:
        with self._lock:
            self.chat_requests += 1
            self.requests.append({"body": body, "fault_header": headers.get(FAULT_HEADER.lower(), ""),
                                  "route": headers.get(ROUTE_HEADER.lower(), "")})
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "the body must be a JSON object with a `messages` list")
        if body.get("stream"):
            return _error(400, "streaming is not supported; send stream=false")
        model = body.get("model")
        if not isinstance(model, str) or not (model == MODEL_NAME or model.startswith(MODEL_FAULT_PREFIX)):
            return _error(
                404, f"the model {model!r} does not exist here; this offline stand-in serves only {MODEL_NAME!r}",
                code="model_not_found",
            )
        try:
            faults: dict[str, Fault] = {}
            for source, spec in (
                ("server", None),
                ("model", model[len(MODEL_FAULT_PREFIX):] if model.startswith(MODEL_FAULT_PREFIX) else ""),
                ("header", headers.get(FAULT_HEADER.lower(), "")),
            ):
                parsed = self.server_faults if spec is None else parse_faults(spec)
                for kind, fault in self._active(parsed, source).items():
                    faults.setdefault(kind, fault)
        except FaultSpecError as exc:
            return _error(400, str(exc), code="bad_fault_spec")
        reply = self._answer(body, faults, headers.get(ROUTE_HEADER.lower(), "").strip())
        if "slow" in faults:
            reply.delay_s = float(faults["slow"].params.get("seconds", "2"))
        return reply

    def _answer(self, body: dict[str, Any], faults: dict[str, Fault], route: str = "") -> Reply:
        for kind in sorted(STATUS_FAULTS & set(faults)):
            if kind == "429":
                retry_after = faults[kind].params.get("retry_after", "1")
                reply = _error(429, "injected rate limit", type_="rate_limit_error", code="rate_limit_exceeded")
                reply.headers["Retry-After"] = retry_after
                return reply
            return _error(int(kind), f"injected HTTP {kind}", type_="server_error")

        messages = body["messages"]
        if route == JUDGE_ROUTE:
            return self._judge(body, messages)
        first_user = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
        first_text = _text_of(first_user.get("content")) if first_user else ""
        step_index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        if route.startswith(PIPELINE_ROUTE_PREFIX):
            key = script_key(route)
            if " repair=" in route:  # a pipeline stage's repair turn: its own script, from the start
                script, step_index = self.registry.keyed(key), 0
            else:
                script = self.registry.keyed(key) or (self.registry.match(first_text) if first_user else None)
        else:
            script = self.registry.match(first_text) if first_user else None
            last_user = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
            if last_user is not None and last_user is not first_user:
                repair = _text_of(last_user.get("content"))
                if PIPELINE_KEY.search(repair):  # a hand-made repair turn carrying its key line
                    script, step_index = self.registry.match(repair), 0
        offered = _offered_tools(body.get("tools"))

        if script is None:
            self.stats["unknown_prompt"] += 1
            return self._completion(body, (
                f"I am {MODEL_NAME}, an offline stand-in that only replays bundled reference solutions, "
                "and I have no script for this task, so I cannot work on it."
            ), [], "stop", "none")
        final = len(script.steps) - 1
        if "never_finish" in faults and step_index >= final:
            step = self._never_finish_step(script, offered)
        elif step_index > final:
            self.stats["script_exhausted"] += 1
            return self._completion(body, (
                f"The reference solution of {script.id!r} has no further steps ({len(script.steps)} in all); "
                "it has already been played."
            ), [], "stop", script.id)
        else:
            step = script.steps[step_index]

        if "text_only" in faults:
            text = step.thought or step.content or "I believe the task is done."
            return self._completion(body, text, [], "stop", script.id)
        if step.content is not None:
            return self._completion(body, step.content, [], "stop", script.id)
        missing = [c.name for c in step.tool_calls if c.name not in offered]
        if missing:
            return _error(
                400,
                f"step {step_index} of script {script.id!r} calls {', '.join(missing)}, which the request does not "
                f"offer in `tools` (offered: {', '.join(offered) or 'none'})",
                code="scripted_tool_not_offered",
            )
        calls = []
        for i, call in enumerate(step.tool_calls):
            arguments = call.arguments
            if "malformed" in faults:
                arguments = arguments[:-1] if len(arguments) > 1 else "{"
            digest = hashlib.sha256(script.id.encode()).hexdigest()[:8]
            calls.append({"id": f"call_{digest}_{step_index}_{i}", "type": "function",
                          "function": {"name": call.name, "arguments": arguments}})
        self.stats["scripted_step"] += 1
        return self._completion(body, step.thought, calls, "tool_calls", script.id)

    def _judge(self, body: dict[str, Any], messages: list[Any]) -> Reply:
        """A judge verdict derived only from the evidence the prompt carries (see the docstring)."""
        self.stats["judge"] += 1
        text = "\n".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        match = _EVIDENCE.search(text)
        try:
            evidence = json.loads(match.group(1)) if match else None
        except json.JSONDecodeError:
            evidence = None
        if not isinstance(evidence, dict) or not isinstance(evidence.get("dimensions"), list):
            return self._completion(body, (
                f"I am {JUDGE_LABEL}: I can only score from an <evidence> block with `dimensions`, and this "
                "request has none, so I give no scores."
            ), [], "stop", "judge")
        reward = evidence.get("reward")
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            base = 100.0 * float(reward)
            basis = f"reward {float(reward):.2f}"
        else:
            base = JUDGE_BASE.get(str(evidence.get("outcome")), 10.0)
            basis = f"outcome {evidence.get('outcome')!r} without a reward"
        checks = evidence.get("checks") if isinstance(evidence.get("checks"), dict) else {}
        fired = sorted(name for name, check in checks.items()
                       if name != "verifier" and isinstance(check, dict) and check.get("fired"))
        score = max(0.0, min(100.0, base - JUDGE_PENALTY_PER_CHECK * len(fired)))
        why = f"{JUDGE_LABEL}: {basis}; checks fired: {', '.join(fired) or 'none'}"
        verdict = {
            "scores": {str(d): {"score": score, "rationale": why} for d in evidence["dimensions"]},
            "suggestions": [],
            "summary": f"{why}. Scores derived from the deterministic evidence only.",
        }
        return self._completion(body, json.dumps(verdict, sort_keys=True), [], "stop", "judge")

    @staticmethod
    def _never_finish_step(script: Script, offered: list[str]) -> Step:
        final = len(script.steps) - 1
        if final >= 1:
            previous = script.steps[final - 1]
            return Step(thought="Let me check that once more before finishing.", tool_calls=previous.tool_calls)
        harmless = next((name for name in offered if name not in {"finish", "submit", "final_answer"}), None)
        if harmless is None:
            return Step(content="Still working on it.")
        return Step(thought="Let me look around first.", tool_calls=(ScriptedCall(harmless, "{}"),))

    def _completion(
        self, body: dict[str, Any], content: str | None, tool_calls: list[dict[str, Any]], finish: str, script_id: str
    ) -> Reply:
        prompt_text = json.dumps(body.get("messages"), ensure_ascii=False) + json.dumps(body.get("tools") or [])
        completion_text = (content or "") + "".join(c["function"]["name"] + c["function"]["arguments"] for c in tool_calls)
        prompt_tokens, completion_tokens = _approx_tokens(prompt_text), _approx_tokens(completion_text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        request_hash = hashlib.sha256(prompt_text.encode("utf-8")).hexdigest()[:24]
        return Reply(200, {
            "id": f"chatcmpl-scripted-{request_hash}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "system_fingerprint": f"{MODEL_NAME}:{script_id}",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })


# -- HTTP -----------------------------------------------------------------------------------


# Request bodies grow with the conversation; a long episode's messages exceed aiohttp's 1 MiB default.
MAX_REQUEST_BYTES = 64 * 1024 * 1024


class OfflineModelServer:
    """The ScriptedModel over HTTP: aiohttp's server on an event loop of its own (in the calling
    thread with `serve_forever`, in a background thread with `start`); `url` is the base URL a
    client needs. HTTP/1.1 keep-alive as hosted APIs have it, Nagle off, and no thread per
    connection: a slow reply is a timer, so hundreds of clients waiting on the "slow" fault cost
    nothing. The socket is bound in the constructor (OSError when the port is taken)."""

    # The listen backlog: a worker opening a connection per rollout at once (128 and more)
    # must not find it full; the kernel caps it at net.core.somaxconn.
    request_queue_size = 1024

    def __init__(self, model: ScriptedModel, host: str = "127.0.0.1", port: int = 0):
        self.model = model
        self.socket = socket.create_server((host, port), backlog=self.request_queue_size)
        self.server_address = self.socket.getsockname()
        self.stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        """Serve in this thread until stop() (from another thread) or KeyboardInterrupt."""
        # asyncio.Runner: Ctrl-C in the main thread cancels the server task, which closes its
        # connections before the loop closes, and then raises KeyboardInterrupt here.
        with asyncio.Runner() as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{path:.*}", self._handle)
        # shutdown_timeout 0: stop() drops replies still waiting on a "slow" fault at once.
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=KEEPALIVE_IDLE_S, shutdown_timeout=0)
        await runner.setup()
        self._stop = asyncio.Event()
        try:
            await web.SockSite(runner, self.socket, backlog=self.request_queue_size).start()
            self._loop = loop
            self._ready.set()
            if not self.stopping.is_set():
                await self._stop.wait()
        finally:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/")
        if request.method == "GET" and path in ("/v1/models", "/models"):
            reply = self.model.models()
        elif request.method == "GET" and path == "/healthz":
            reply = Reply(200, {"status": "ok", "model": MODEL_NAME, "scripts": len(self.model.registry)})
        elif request.method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            try:
                body = json.loads(await request.read() or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError):
                reply = _error(400, "the body is not valid JSON")
            else:
                headers = {k.lower(): v for k, v in request.headers.items() if k.lower() != "authorization"}
                reply = self.model.chat(body, headers)
        else:
            reply = _error(404, f"no route {request.method} {path}", code="not_found")
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)  # stop() cancels it: no reply, the connection closes
        return web.Response(
            body=json.dumps(reply.body).encode("utf-8"), status=reply.status, headers=reply.headers,
            content_type="application/json",
        )

    def start(self) -> OfflineModelServer:
        """Serve in a daemon thread; returns once the server accepts requests."""
        self._thread = threading.Thread(target=self.serve_forever, name="offline-model", daemon=True)
        self._thread.start()
        while not self._ready.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError("the offline model server did not start")
        return self

    def stop(self) -> None:
        self.stopping.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop has already closed
                pass
        if self._thread is not None:
            self._thread.join()
        self.server_close()

    def server_close(self) -> None:
        self.socket.close()


@contextmanager
def running_offline_model(
    solutions: Iterable[str | Path] = (),
    *,
    scripts: Iterable[dict[str, Any] | Script] = (),
    faults: str = "",
    host: str = "127.0.0.1",
    port: int = 0,
) -> Iterator[OfflineModelServer]:
    """Serve the scripted model in a background thread (a free loopback port by default)."""
    loaded = load_scripts(solutions)
    for i, item in enumerate(scripts):
        loaded.append(item if isinstance(item, Script) else parse_script(item, where=f"scripts[{i}]", default_id=f"inline-{i}"))
    server = OfflineModelServer(ScriptedModel(loaded, faults=faults), host, port).start()
    try:
        yield server
    finally:
        server.stop()
