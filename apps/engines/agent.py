"""The agent loop every scene shares: model turn -> tool calls -> results, until finish or a limit.

    result = await run_episode(config=task.config_snapshot(), llm=LLMClient(),
                               cache_key_extra=cache_identity(trajectory.uuid),
                               on_event=log_line, should_cancel=cancel_requested, trajectory=row)

Scenes plug in through `apps.engines.runtime` (tools, prompt, sandbox spec, set-up, tool
execution, verification); the loop is the same for all of them:

* Native function calling: the scene's tools are offered; each tool call becomes one step.
  A reply without a tool call is read with `parse_json_action` (apps.engines.textactions: a
  {"tool": ..., "arguments": ...} object, fenced or bare), so models without tool support work
  on the same loop; with config `tool_mode: "json"` no tools are sent and the prompt asks for
  that JSON instead.
  Text-path results go back as a user message, since the model made no tool call to answer.
  A reply with neither gets one corrective turn; a second one in a row ends the episode as an
  error (kind "model_output").
* Invalid calls (malformed JSON arguments, unknown tool, missing or mistyped argument) and
  failed operations that are the agent's doing (missing file, write outside the workspace)
  are answered with an "error: ..." tool result and recorded on the step: agent behaviour.
* Limits: `max_steps` bounds the model's replies (corrective ones included; a reply with
  several tool calls is one reply and several steps); `step_timeout_s` each command;
  `timeout_s` the wall clock of the agent loop (commands are clipped to what is left;
  set-up and the verifier have bounds of their own); `max_tokens` is a token budget for the
  episode: no model call starts once it is spent. Exhausting one without finish is a
  "failure" whose reason names the limit.
* `should_cancel()` is asked before every model call: a cancel ends the episode with outcome
  "error", reason "cancelled" and `cancelled=True`.
* `budget_check` (a context variable the worker sets per episode, apps.tasks.budgets) is asked
  right before every model call with the episode's cost so far (its sub-episodes', which run in
  its context, included): a reason ends the episode as an error "budget: <reason>", kind
  "budget", not retryable.
* LLM errors (after the client's own retries), a lost sandbox or a failed sandbox create end
  the episode with outcome "error" and the reason; nothing of them is put in the messages as
  if the model had said it. `error_kind` and `retryable` tell the worker what happened.
* After finish the scene's verifier runs (if the task has one): reward 1.0 is a success,
  less a failure with the reward kept; no verifier means success with reward None.
* The sandbox is created per episode and destroyed in every case (apps.engines.lease; its
  SandboxRecord is marked by the destroy, or by the caller when it passes
  `on_sandbox_destroyed`, as a worker does to write it with the episode's result). Tool calls
  are awaited through the runtime's `aexecute_tool` (code_exec's run_shell awaits
  `Sandbox.arun`, which runs the command in a worker thread); the other sandbox calls are
  synchronous and run in worker threads (asyncio.to_thread), so one event loop can run many episodes; so do sync `on_event` /
  `should_cancel` callables (async ones are awaited).

* Model answers are cached under `cache_key_extra` (the worker passes the trajectory's UUID):
  a retried episode replays its own. Config key `replay_of` (a trajectory's UUID) makes the
  episode an explicit replay of that trajectory's recorded answers (re-judging it, or
  regenerating after a prompt change: a request that changed is asked anew); it is announced
  in the live log and recorded on every step (`llm.replay_of`) and in the config snapshot.

`on_event(kind, message, data)` gets "system", "thought", "action", "output", "error" and,
last of all, "result" events, live, in order.

* Replies are normalised before they are stored (apps.engines.replies, by the answering
  provider's profile): reasoning, wherever it arrived (`reasoning_content`, `reasoning`,
  `<think>` in the content), is the message's `reasoning_content` and not its content; tool
  calls a server without a parser wrote as text (Hermes `<tool_call>`, Llama JSON, Mistral
  `[TOOL_CALLS]`) become the message's tool calls (step format "hermes_text" etc.) and leave
  the content; a missing, empty or repeated tool-call id is replaced by a unique one (the
  provider's is kept on the step as `provider_tool_call_id`). Reasoning goes back as the
  profile's `reasoning_echo` says (to the provider asked first).
* Context budget (apps.engines.context_budget): before each call the request is counted and,
  when over the model's context window minus its output budget (the profile's model spec),
  its oldest observations are elided with a marker in their text; a request that cannot fit
  ends the episode as a config error, never a provider 400. Otherwise requests only grow by
  appending, so each extends the previous one byte for byte (prompt caching). Each step's
  llm record has `prompt_tokens` and `cached_tokens` from usage and `context` (our count, the
  limit, "tokenizer" or "estimate", the messages elided before that call).

What is recorded: `messages` are the conversation as it happened (OpenAI format; the
assistant's reasoning is kept there as `reasoning_content`), `steps` one record per tool call
(apps.engines.steps.Step) with the real exit code (None when no process ran or it was killed on
its deadline), duration, truncation and the model call that produced it. Tool output is
capped at MAX_TOOL_OUTPUT_CHARS (head and tail, with a marker) before the model sees it,
and the step keeps exactly what the model saw. Configured secrets and key shapes are
redacted from tool output before it is sent or stored.
"""
from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from apps.engines import context_budget, profiles
from apps.engines.llm import LLMClient, LLMError, cache_identity
from apps.engines.replies import api_messages, normalize_reply
from apps.engines.runtime import (
    EpisodeContext,
    InfrastructureError,
    NoEngineError,
    SceneRuntime,
    SetupError,
    ToolError,
    ToolResult,
    enter_episode,
    get_runtime,
    leave_episode,
)
from apps.engines.runtime import in_thread as _in_thread  # sandbox I/O and sync callbacks
from apps.engines.lease import LOST, SandboxLease, lost
from apps.engines.sandboxes import SandboxError
from apps.engines.steps import ERROR, FAILURE, SUCCESS, Step, Stop
from apps.engines.textactions import JsonAction, corrective_message, json_action_instructions, parse_json_action
from apps.engines.toolargs import ToolArguments
from trajplatform import artifacts
from trajplatform.redaction import redact

logger = logging.getLogger(__name__)

# What other modules and the tests import from here (the names below come from its parts).
__all__ = ["ERROR", "FAILURE", "SUCCESS", "EpisodeResult", "JsonAction", "budget_check", "image_parts", "is_vision",
           "json_action_instructions", "parse_json_action", "run_episode", "truncate_text"]

TOOL_MODES = ("native", "json")

DEFAULT_MAX_STEPS = 15
DEFAULT_STEP_TIMEOUT_S = 30.0
DEFAULT_TIMEOUT_S = 600.0
MAX_TOOL_OUTPUT_CHARS = 8000
OBSERVATION_CHARS = 2000
EVENT_TEXT_CHARS = 200
EVENT_DATA_CHARS = 2000
# The worker's cost-budget check for the episode running in this context (None: no budgets):
# called with the episode's cost so far before each model call, returns why it may not go on ("").
budget_check: contextvars.ContextVar[Callable[[Decimal], str] | None] = contextvars.ContextVar(
    "budget_check", default=None)


@dataclass
class EpisodeResult:
    """Everything one episode produced; the worker stores it on the Trajectory row."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    final_answer: str = ""
    outcome: str = ""  # "success" | "failure" | "error"
    outcome_reason: str = ""
    reward: float | None = None
    verifier_output: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    model: str = ""  # the model that answered ("" if no call succeeded)
    provider: str = ""
    cancelled: bool = False
    # "llm" | "infrastructure" | "model_output" | "config" | "cancelled" | "budget" | "internal" (errors only)
    error_kind: str = ""
    retryable: bool = False  # an error that trying again later may not repeat (LLM 5xx/429, sandbox)
    requested_model: str = ""
    llm_calls: int = 0
    cached_calls: int = 0
    duration_ms: int = 0
    sandbox: dict[str, Any] = field(default_factory=dict)  # id, backend, record_id, downgrades, destroyed
    # The sub-episodes it ran (EpisodeContext.run_subepisode with keep=True), stored with it as
    # child trajectories; on a sub-episode's own result: who it was and where it ran from.
    subepisodes: list["EpisodeResult"] = field(default_factory=list)
    label: str = ""  # "coder#0": the parent's name for it
    role: str = ""  # the role that acted (config "role"), else the label's name
    parent_step: int | None = None  # the parent's step that ran it; None from its verifier
    config: dict[str, Any] = field(default_factory=dict)  # a sub-episode's config


# --- helpers ----------------------------------------------------------------------------------


def truncate_text(text: str, limit: int = MAX_TOOL_OUTPUT_CHARS) -> tuple[str, bool]:
    """(text, truncated): at most about `limit` characters, head and tail around a marker."""
    if len(text) <= limit:
        return text, False
    head = limit * 2 // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}", True


def _short(text: Any, limit: int = EVENT_TEXT_CHARS) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_vision(config: dict[str, Any]) -> bool:
    """Whether the episode's model sees images (config or scene_config `vision: true`)."""
    return bool(config.get("vision") or (config.get("scene_config") or {}).get("vision"))


def image_parts(refs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI image content parts for artifact refs; the URL stays `artifact:<sha>` in the record."""
    return [{"type": "image_url", "image_url": {"url": f"artifact:{ref['artifact']}"}} for ref in refs]


def _inline_artifacts(messages: list[dict[str, Any]], cache: dict[str, str]) -> list[dict[str, Any]]:
    """The API's copy of the messages with each `artifact:<sha>` image URL as a data: URL."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(p.get("type") == "image_url" for p in content if isinstance(p, dict)):
            parts = []
            for part in content:
                url = (part.get("image_url") or {}).get("url", "") if isinstance(part, dict) else ""
                if url.startswith(artifacts.URL_PREFIX):
                    sha = url[len(artifacts.URL_PREFIX):]
                    if sha not in cache:
                        cache[sha] = artifacts.data_url(sha)
                    part = {**part, "image_url": {**part["image_url"], "url": cache[sha]}}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# --- the episode ------------------------------------------------------------------------------


class _Episode:
    def __init__(
        self,
        *,
        config: dict[str, Any],
        llm: LLMClient,
        sandbox_backend: Any,
        cache_key_extra: dict[str, Any] | None,
        on_event: Callable[..., Any] | None,
        should_cancel: Callable[[], Any] | None,
        trajectory: Any,
        on_sandbox_destroyed: Callable[[Any], None] | None = None,
        parent: "_Episode | None" = None,
        label: str = "",
        shared_sandbox: Any = None,
    ):
        self.config = config
        self.parent = parent
        self.context = EpisodeContext(self, depth=parent.context.depth + 1 if parent else 0, label=label)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.in_agent_loop = False  # the agent loop runs (a sub-episode's wall clock is bounded by it)
        self.subepisodes: dict[str, int] = {}  # label -> how many ran (their cache identities)
        self.ended = False  # run() is over, however it ended: its sub-episodes stop at their next turn
        self.llm = llm
        self.sandbox_backend = sandbox_backend
        self.cache_key_extra = cache_key_extra
        self.replay_of = config.get("replay_of") or ""  # checked and applied when the episode starts
        self.left_cache = False  # a model call of this episode missed the LLM cache
        self.on_event = on_event
        self.on_event_is_async = on_event is not None and (
            inspect.iscoroutinefunction(on_event) or inspect.iscoroutinefunction(getattr(on_event, "__call__", None))
        )
        self.should_cancel = should_cancel
        self.trajectory = trajectory
        self.result = EpisodeResult()
        self.runtime: SceneRuntime | None = None
        # A sub-episode in its parent's sandbox (shared_sandbox) neither makes nor destroys one.
        self.lease = SandboxLease(backend=sandbox_backend, trajectory=trajectory, emit=self.emit,
                                  shared=shared_sandbox, on_destroyed=on_sandbox_destroyed)
        self.result.sandbox = self.lease.info
        self.tool_mode = "native"
        self.arguments = ToolArguments()
        self.max_steps = int(config.get("max_steps") or DEFAULT_MAX_STEPS)
        self.vision = is_vision(config)
        self.turn_images: list[dict[str, Any]] = []  # this turn's image observations (artifact refs)
        self.inlined: dict[str, str] = {}  # artifact sha -> data: URL, for the model calls
        self.step_timeout = float(config.get("step_timeout_s") or DEFAULT_STEP_TIMEOUT_S)
        self.timeout = float(config.get("timeout_s") or DEFAULT_TIMEOUT_S)
        self.budget = int(config.get("max_tokens") or 0)
        self.deadline = 0.0
        self.turns = 0
        self.finished = False
        self.call_ids: set[str] = set()  # every tool-call id of the episode (apps.engines.replies)
        self.observations: list[int] = []  # indices of the messages the context budget may elide
        self.counter: context_budget.TokenCounter | None = None
        self.sent_tokens = (0, 0.0)  # the last request: (our count, the correction it was counted with)
        self.budget_note: dict[str, Any] = {}  # the context budget's record for the next steps

    # -- events and callbacks

    async def emit(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        if self.on_event is None:
            return
        message = redact(_short(message), labels=False)
        data = redact(data or {}, labels=False)
        try:
            if self.on_event_is_async:
                await self.on_event(kind, message, data)
            else:
                await _maybe_await(await _in_thread(self.on_event, kind, message, data))
        except asyncio.CancelledError:
            raise
        except Exception:
            # The live log is a view; the episode record is the truth. Never lose the run over it.
            logger.exception("on_event(%r) failed; the episode goes on", kind)

    async def cancel_requested(self) -> bool:
        if self.should_cancel is None:
            return False
        if inspect.iscoroutinefunction(self.should_cancel):
            return bool(await self.should_cancel())
        return bool(await _maybe_await(await _in_thread(self.should_cancel)))

    # -- the run

    async def run(self) -> EpisodeResult:
        started = time.monotonic()
        self.loop = asyncio.get_running_loop()
        entered = enter_episode(self.context)
        try:
            await self._run()
        except Stop as stop:
            self._end(stop.outcome, stop.reason, kind=stop.kind, retryable=stop.retryable)
        except Exception as exc:
            logger.exception("episode failed inside the platform")
            self._end(ERROR, f"internal error: {type(exc).__name__}: {exc}", kind="internal")
        finally:
            self.ended = True
            await self.lease.settled()
            await self.lease.destroy()
            leave_episode(entered)
        result = self.result
        result.duration_ms = int((time.monotonic() - started) * 1000)
        result.outcome_reason = redact(result.outcome_reason)
        result.messages = redact(result.messages, labels=False)
        result.steps = redact(result.steps, labels=False)
        result.final_answer = redact(result.final_answer, labels=False)
        result.verifier_output = redact(result.verifier_output, labels=False)
        await self.emit("result", f"{result.outcome}: {result.outcome_reason}", {
            "outcome": result.outcome, "reason": result.outcome_reason, "reward": result.reward,
            "cancelled": result.cancelled, "error_kind": result.error_kind, "steps": len(result.steps),
            "total_tokens": result.total_tokens, "cost_usd": str(result.cost_usd), "model": result.model,
        })
        return result

    def _end(self, outcome: str, reason: str, *, kind: str = "", retryable: bool = False) -> None:
        self.result.outcome = outcome
        self.result.outcome_reason = reason
        self.result.error_kind = kind if outcome == ERROR else ""
        self.result.retryable = retryable if outcome == ERROR else False
        self.result.cancelled = kind == "cancelled"

    async def _run(self) -> None:
        config = self.config
        self.result.requested_model = config.get("model") or self.llm.primary.model
        scene = config.get("scene") or ""
        try:
            self.runtime = runtime = get_runtime(scene)
        except NoEngineError as exc:
            raise Stop(ERROR, str(exc), kind="config") from None
        self.tool_mode = config.get("tool_mode") or "native"
        if self.tool_mode not in TOOL_MODES:
            raise Stop(ERROR, f"tool_mode must be one of {', '.join(TOOL_MODES)}, got {self.tool_mode!r}", kind="config")
        if not isinstance(config.get("prompt"), str) or not config["prompt"].strip():
            raise Stop(ERROR, "the task has no prompt", kind="config")
        if self.replay_of and self.parent is None:  # a sub-episode gets its parent's identity
            try:
                self.cache_key_extra = cache_identity(self.replay_of)
            except ValueError:
                raise Stop(ERROR, f"replay_of must be a trajectory's UUID, got {self.replay_of!r}",
                            kind="config") from None
            self.replay_of = self.cache_key_extra["trajectory"]
            await self.emit("system", f"explicit replay of trajectory {self.replay_of}'s recorded model answers",
                            {"replay_of": self.replay_of})

        try:
            tools = runtime.tools(config)
        except SetupError as exc:  # e.g. the task names an MCP server that is not registered
            raise Stop(ERROR, f"the scene's tools could not be listed: {exc}", kind="config") from None
        self.result.tools = tools
        self.arguments = ToolArguments(tools)
        self.result.messages = [
            {"role": "system", "content": self._system_prompt(runtime, tools)},
            {"role": "user", "content": config["prompt"]},
        ]
        await self.emit("system", f"{scene} episode starting (model {self.result.requested_model})", {
            "scene": scene, "model": self.result.requested_model, "tool_mode": self.tool_mode,
            "max_steps": self.max_steps, "step_timeout_s": self.step_timeout, "timeout_s": self.timeout,
            "token_budget": self.budget or None,
        })
        if await self.cancel_requested():
            raise Stop(ERROR, "cancelled", kind="cancelled")
        # The sandbox is made and set up while the model answers the first turn (neither needs
        # the other); the first tool call waits for it. If it fails first, that model call is
        # cancelled (see _call_model).
        self.lease.start(runtime, config)
        if type(runtime).initial_observation is not SceneRuntime.initial_observation:
            await self._initial_observation(runtime)
        self.deadline = time.monotonic() + self.timeout
        self.in_agent_loop = True
        try:
            await self._loop(runtime)
        finally:
            self.in_agent_loop = False
        await self._verify(runtime)
        # A runtime that generates its dialogue (toolace's mt mode) hands over the record to store.
        record = await _in_thread(runtime.transcript, self.config)
        if record is not None:
            self.result.messages, self.result.steps = record["messages"], record["steps"]
            self.result.tools = record.get("tools", self.result.tools)

    async def _initial_observation(self, runtime: SceneRuntime) -> None:
        """The runtime's look at the environment before the first model turn (gui's start page):
        its text appended to the task's prompt, its images (vision only) a user message after it."""
        await self.lease.ready()
        try:
            observed = await _in_thread(runtime.initial_observation, self.sandbox, self.config)
        except LOST as exc:
            raise lost(exc, "taking the initial observation") from None
        except SetupError as exc:
            raise Stop(ERROR, f"sandbox set-up failed: {exc}", kind="config") from None
        if not observed:
            return
        parts = [{"type": "text", "text": observed}] if isinstance(observed, str) else list(observed)
        text = "\n".join(p["text"] for p in parts if p.get("type") == "text" and p.get("text"))
        first = self.result.messages[1]
        if text:
            first["content"] = f"{first['content']}\n\n{text}"
        images = [p for p in parts if p.get("type") == "image_url"]
        if images and self.vision:
            self.result.messages.append({"role": "user", "content": [
                {"type": "text", "text": "[the start page]"}, *images]})
            self.observations.append(len(self.result.messages) - 1)

    @property
    def sandbox(self) -> Any:
        """The episode's sandbox (None before it is made, or for a scene without one)."""
        return self.lease.sandbox

    def _system_prompt(self, runtime: SceneRuntime, tools: list[dict[str, Any]]) -> str:
        parts = [runtime.system_prompt(self.config).strip()]
        if self.tool_mode == "json":
            parts.append(json_action_instructions(tools))
        extra = (self.config.get("system_prompt_extra") or "").strip()
        if extra:
            parts.append(f"## Hints\n{extra}")
        return "\n\n".join(parts)

    # -- the loop

    async def _loop(self, runtime: SceneRuntime) -> None:
        messages = self.result.messages
        corrected = False
        while True:
            if await self.cancel_requested():
                await self.emit("system", "cancel requested; stopping", {})
                raise Stop(ERROR, "cancelled", kind="cancelled")
            if self.turns >= self.max_steps:
                raise Stop(FAILURE, f"max_steps ({self.max_steps}) reached without finish")
            if self.budget and self.result.total_tokens >= self.budget:
                raise Stop(FAILURE, f"token budget ({self.budget}) exhausted without finish: "
                                     f"{self.result.total_tokens} tokens used")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise self._wall_clock()

            chat = await self._call_model(remaining)
            self.turns += 1
            # One stored shape whatever the provider (apps.engines.replies): reasoning out of the
            # content, text tool calls read by the profile's format, unique tool-call ids.
            reply = normalize_reply(chat.message, self._profile(chat.provider), turn=self.turns,
                                    used_ids=self.call_ids)
            message = reply.message
            observation = truncate_text(_text_of(messages[-1].get("content")), OBSERVATION_CHARS)[0]
            messages.append(message)
            content = message.get("content") or ""
            reasoning = reply.reasoning
            llm_info = {
                "latency_ms": chat.latency_ms, "attempts": chat.attempts, "cached": chat.cached,
                "provider": chat.provider, "model": chat.model, "usage": dict(chat.usage),
                "prompt_tokens": int(chat.usage.get("prompt_tokens", 0)),
                "cached_tokens": int(getattr(chat, "cached_tokens", 0) or 0),
                "finish_reason": chat.finish_reason,
                **({"rate_limited": chat.rate_limited} if chat.rate_limited else {}),
                **({"replay_of": self.replay_of} if self.replay_of else {}),
                **self.budget_note,
            }
            if reasoning:
                await self.emit("thought", reasoning, {"turn": self.turns, "reasoning": True,
                                                       "text": reasoning[:EVENT_DATA_CHARS]})
            calls = message.get("tool_calls") or []
            action = None if calls else parse_json_action(content)
            thought = content
            if action is not None:
                thought = (content[: action.span[0]] + content[action.span[1]:]).strip()
            if thought:
                await self.emit("thought", thought, {"turn": self.turns, "text": thought[:EVENT_DATA_CHARS]})

            if not calls and action is None:
                if corrected:
                    raise Stop(ERROR, "model output: the reply had no tool call, again after a corrective turn",
                                kind="model_output")
                corrected = True
                tool_names = [t["function"]["name"] for t in self.result.tools]
                messages.append({"role": "user", "content": corrective_message(tool_names, self.tool_mode)})
                await self.emit("system", "the reply had no tool call; corrective turn", {"turn": self.turns, "text": content})
                continue
            corrected = False

            common = {"thought": thought or reasoning, "observation": observation, "llm": llm_info}
            if reasoning:
                common["reasoning_content"] = reasoning
            if calls:
                fmt = f"{reply.text_tool_format}_text" if reply.text_tool_format else "native"
                for n, call in enumerate(calls):
                    fn = call.get("function") or {}
                    given = reply.provider_ids[n]
                    step_common = common if given == call["id"] else {**common, "provider_tool_call_id": given}
                    if self.finished:
                        output = "not executed: the episode already ended with finish"
                        self._record_skipped(call, fn, step_common, output)
                        messages.append({"role": "tool", "tool_call_id": call.get("id"), "name": fn.get("name"),
                                         "content": output})
                        continue
                    output = await self._step(runtime, call.get("id"), fn.get("name") or "", fn.get("arguments"),
                                              step_common, fmt)
                    messages.append({"role": "tool", "tool_call_id": call.get("id"), "name": fn.get("name"),
                                     "content": output})
                    self.observations.append(len(messages) - 1)
                    common = {**common, "thought": ""}  # the thought belongs to the turn's first step
            else:
                output = await self._step(runtime, None, action.name, action.arguments, common, "json_text")
                messages.append({"role": "user", "content": f"[{action.name} result]\n{output}"})
                self.observations.append(len(messages) - 1)
            if self.turn_images and self.vision and not self.finished:
                # Tool messages carry text only: the page as it is now goes in a user message.
                messages.append({"role": "user", "content": [
                    {"type": "text", "text": f"[screenshot after step {len(self.result.steps) - 1}]"},
                    *image_parts(self.turn_images[-1:])]})
                self.observations.append(len(messages) - 1)
            self.turn_images = []
            if self.finished:
                # Multi-turn: the runtime may answer a finish with the user's next request.
                follow_up = await _in_thread(runtime.next_user_turn, self.config, self.result.final_answer)
                if not follow_up:
                    return
                messages.append({"role": "user", "content": str(follow_up)})
                self.finished = False
                await self.emit("system", f"the user follows up: {follow_up}", {"turn": self.turns, "text": follow_up})

    def _wall_clock(self) -> Stop:
        return Stop(FAILURE, f"wall-clock timeout ({self.timeout:g}s) reached without finish")

    def _provider(self, name: str | None = None) -> Any:
        """The configured provider of that name, else the one asked first (the task's or role's
        `provider`, else the primary)."""
        name = name or self.config.get("provider") or ""
        # LLMClient's providers; a client that has only a primary (the loop's whole contract
        # before profiles) is that one provider.
        providers = getattr(self.llm, "providers", None) or [self.llm.primary]
        return next((p for p in providers if getattr(p, "name", None) == name), self.llm.primary)

    def _profile(self, provider_name: str | None = None) -> profiles.Profile:
        """The profile of a provider (default: the one asked first); the rules its replies and
        requests follow (apps.engines.profiles)."""
        provider = self._provider(provider_name)
        profile_id = getattr(provider, "profile", "")
        if not profile_id:  # a provider without one: named after its profile, else "custom"
            name = getattr(provider, "name", "")
            profile_id = name if name in profiles.all_profiles() else "custom"
        return profiles.get(profile_id)

    def _fit_context(self, profile: profiles.Profile, tools: list[dict[str, Any]] | None) -> int:
        """Fit the request under the model's window minus its output budget (apps.engines.
        context_budget): elides the oldest observations, recorded; a request that cannot fit is a
        config error before it is sent."""
        model = self.config.get("model") or self._provider().model
        spec = profile.model(model)
        if self.counter is None:
            self.counter = context_budget.TokenCounter.for_model(model)
        limit = spec.context_window - spec.max_output
        last_assistant = max((i for i, m in enumerate(self.result.messages) if m.get("role") == "assistant"), default=0)
        elidable = [i for i in self.observations if i < last_assistant]
        try:
            tokens, elided = context_budget.fit(
                self.result.messages, tools, counter=self.counter, limit=limit, elidable=elidable,
                sent=lambda messages: api_messages(messages, profile))
        except context_budget.ContextOverflow as exc:
            raise Stop(ERROR, f"config: the episode does not fit the context of {spec.name} "
                               f"({spec.context_window} tokens, {spec.max_output} kept for the answer): {exc}",
                        kind="config") from None
        self.sent_tokens = (tokens, self.counter.correction)
        self.budget_note = {"context": {"tokens": tokens, "limit": limit, "method": self.counter.method}}
        if elided:
            self.budget_note["context"]["elided"] = elided
        return len(elided)

    def cost_so_far(self) -> Decimal:
        """What the whole episode has cost until now: a running sub-episode's cost is added to
        its parent's only when it ends, so walk up the parents."""
        episode: _Episode | None = self
        cost = Decimal(0)
        while episode is not None:
            cost += episode.result.cost_usd
            episode = episode.parent
        return cost

    async def _call_model(self, remaining: float) -> Any:
        check = budget_check.get()
        if check is not None and (reason := check(self.cost_so_far())):
            await self.emit("error", f"budget: {reason}", {"error_kind": "budget"})
            raise Stop(ERROR, f"budget: {reason}", kind="budget")
        config = self.config
        profile = self._profile()
        tools = self.result.tools if self.tool_mode == "native" else None
        elided = self._fit_context(profile, tools)
        if elided:
            note = self.budget_note["context"]
            await self.emit("system", f"context budget: {elided} oldest observation(s) elided to fit "
                                      f"{note['limit']} tokens", dict(note))
        sent = api_messages(self.result.messages, profile)
        if self.vision:
            sent = await _in_thread(_inline_artifacts, sent, self.inlined)
        call = asyncio.ensure_future(asyncio.wait_for(
            self.llm.achat(
                sent,
                tools=tools,
                temperature=config.get("temperature"),
                top_p=config.get("top_p"),
                model=config.get("model") or None,
                cache_key_extra=self.cache_key_extra,
                # After a miss every request carries a reply that was never cached: no lookups.
                cache_lookup=not self.left_cache,
                # A role's (multi_agent) provider, asked first; passed only when set.
                **({"provider": config["provider"]} if config.get("provider") else {}),
            ),
            remaining,
        ))
        starting = self.lease.task
        if starting is not None and not starting.done():
            try:
                await asyncio.wait([call, starting], return_when=asyncio.FIRST_COMPLETED)
                if self.lease.failed():
                    await starting  # raises its Stop
            except BaseException:
                call.cancel()  # no sandbox (or the episode is stopping): no use for the answer
                await asyncio.wait([call])
                raise
        try:
            chat = await call
        except TimeoutError:
            raise self._wall_clock() from None
        except LLMError as err:
            await self.emit("error", f"LLM error: {err}", {
                "error_kind": "llm", "type": type(err).__name__, "retryable": err.retryable,
                "status_code": err.status_code, "attempts": err.attempts,
            })
            raise Stop(ERROR, f"LLM error: {type(err).__name__}: {err}", kind="llm", retryable=err.retryable) from None
        self.count_model_call(chat)
        counted, correction = self.sent_tokens
        if self.counter is not None and correction:
            self.counter.observe(counted / correction, int(chat.usage.get("prompt_tokens", 0)))
        self.left_cache = self.left_cache or not chat.cached
        self.result.model, self.result.provider = chat.model, chat.provider
        return chat

    def count_model_call(self, chat: Any) -> None:
        """Add one model call's tokens and cost to the episode's totals."""
        result = self.result
        result.llm_calls += 1
        result.cached_calls += int(chat.cached)
        result.prompt_tokens += int(chat.usage.get("prompt_tokens", 0))
        result.completion_tokens += int(chat.usage.get("completion_tokens", 0))
        result.total_tokens += int(chat.usage.get("total_tokens", 0))
        result.cost_usd += chat.cost_usd

    # -- sub-episodes (EpisodeContext.arun_subepisode; runtime.py says what passes down)

    async def subepisode(self, config: dict[str, Any], *, label: str, share_sandbox: bool = True,
                         keep: bool = True) -> EpisodeResult:
        label = str(label or "sub")
        n = self.subepisodes.get(label, 0)
        self.subepisodes[label] = n + 1
        name = f"{label}#{n}"
        # A replay's sub-episodes replay too: the parent's identity is their cache key (below), and
        # `replay_of` stays in their config for runtimes that replay records of their own (the live web).
        config = dict(config)
        if self.replay_of:
            config["replay_of"] = self.replay_of
        else:
            config.pop("replay_of", None)
        if self.in_agent_loop:  # bounded by what is left of the parent's wall clock
            left = max(0.0, self.deadline - time.monotonic())
            config["timeout_s"] = min(float(config.get("timeout_s") or DEFAULT_TIMEOUT_S), left)
        if self.budget:
            left_tokens = max(1, self.budget - self.result.total_tokens)
            config["max_tokens"] = min(int(config.get("max_tokens") or left_tokens), left_tokens)
        shared = None
        if share_sandbox and config.get("scene") == self.config.get("scene"):
            await self.lease.ready()
            shared = self.sandbox
        parent_emit = self.emit

        async def on_event(kind: str, message: str, data: dict[str, Any]) -> None:
            # The child's end is not the parent's: its "result" is a system line here.
            await parent_emit("system" if kind == "result" else kind, f"[{name}] {message}", {**data, "sub": name})

        parent = self

        async def should_cancel() -> bool:
            # The parent's cancel, or the parent itself gone (stopped on its time limit by the worker
            # while this ran from one of its tool calls): a sub-episode never outlives its episode.
            return parent.ended or await parent.cancel_requested()

        extra = dict(self.cache_key_extra or {})
        extra["sub"] = "/".join(filter(None, [extra.get("sub", ""), name]))
        child = _Episode(
            config=config, llm=self.llm, sandbox_backend=self.sandbox_backend, cache_key_extra=extra,
            on_event=on_event, should_cancel=should_cancel, trajectory=self.trajectory,
            parent=self, label=name, shared_sandbox=shared,
        )
        child.replay_of = self.replay_of
        if share_sandbox and config.get("scene") == self.config.get("scene"):
            # The same environment, so the same per-episode state of it (a device, a browser, a toolset).
            child.context.state = self.context.state
        await self.emit("system", f"sub-episode {name} starting ({config.get('scene')})", {"sub": name})
        parent_step = len(self.result.steps) if self.in_agent_loop else None  # the step running it
        result = await child.run()
        result.label, result.role, result.parent_step = name, str(config.get("role") or label), parent_step
        result.config = config
        if keep:
            self.result.subepisodes.append(result)
        for key in ("llm_calls", "cached_calls", "prompt_tokens", "completion_tokens", "total_tokens", "cost_usd"):
            setattr(self.result, key, getattr(self.result, key) + getattr(result, key))
        self.left_cache = self.left_cache or child.left_cache
        if result.error_kind == "budget":  # the whole episode is over budget, not only the role
            raise Stop(ERROR, result.outcome_reason, kind="budget")
        return result

    def _record_skipped(self, call: dict[str, Any], fn: dict[str, Any], common: dict[str, Any], output: str) -> None:
        step = Step(index=len(self.result.steps), turn=self.turns, tool_call_id=call.get("id"),
                    tool=fn.get("name") or "", arguments=fn.get("arguments"), format="native",
                    **{**common, "thought": ""}, output=output)
        step.update(error="skipped: finish was called earlier in the turn")
        self.result.steps.append(step.to_record())

    async def _step(
        self, runtime: SceneRuntime, call_id: str | None, name: str, raw_args: Any, common: dict[str, Any], fmt: str
    ) -> str:
        """Execute one tool call, record its step, and return the text the model gets back."""
        index = len(self.result.steps)
        args, error, error_kind = self.arguments.parse(name, raw_args)
        # The arguments as parsed whenever they are JSON (a schema violation keeps its object),
        # the raw text only when they are not; `error_kind` says which check the step is for.
        step = Step(index=index, turn=self.turns, tool_call_id=call_id, tool=name, arguments=args, format=fmt,
                    **common)
        if error_kind:
            step.update(error_kind=error_kind)
        await self.emit("action", f"{name}({_short(json.dumps(args, ensure_ascii=False), 160)})",
                        {"index": index, "tool": name, "arguments": args})
        result: ToolResult | None = None
        if error is None and runtime.is_finish(name):
            self.finished = True
            self.result.final_answer = runtime.finish_answer(args or {})
            result = ToolResult(output="finish accepted; the episode ends")
        elif error is None:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                # Answered (so the turn stays well-formed); the loop stops before the next call.
                error = "not executed: the episode's wall-clock limit was reached"
        if error is None and result is None:
            await self.lease.ready()
            try:
                result = await runtime.aexecute_tool(
                    name, args, self.sandbox, self.config, timeout=min(self.step_timeout, remaining),
                )
            except ToolError as exc:
                error = str(exc)
                step.update(**{k: v for k, v in exc.extra.items() if k not in step})  # ToolError(extra=...)
            except LOST as exc:
                raise await self._step_lost(step, exc) from None
            except SandboxError as exc:
                if not await self.lease.alive():
                    raise await self._step_lost(step, exc) from None
                error = str(exc)  # the sandbox is fine: it refused what the agent asked
        if error is not None:
            step.update(error=error)
            output = f"error: {error}"
        else:
            assert result is not None
            output = result.output
            step.update(exit_code=result.exit_code, duration_ms=result.duration_ms,
                        truncated=result.truncated, timed_out=result.timed_out, **result.extra)
            if result.images:
                step.update(images=list(result.images))
                self.turn_images.extend(result.images)
        output, cut = truncate_text(redact(output, labels=False))
        step.output = output
        step.truncated = bool(step.truncated or cut)
        self.result.steps.append(step.to_record())
        await self.emit("output", output.split("\n", 1)[0] if error is None else output, {
            "index": index, "tool": name, "exit_code": step.exit_code, "duration_ms": step.duration_ms,
            "truncated": step.truncated, "timed_out": step.timed_out, "error": step.get("error"),
            "output": output[:EVENT_DATA_CHARS],
        })
        return output

    async def _step_lost(self, step: Step, exc: BaseException) -> Stop:
        """Record the step the sandbox died in (its tool call stays unanswered) and end."""
        step.update(error=f"infrastructure: {exc}", error_kind="infrastructure")
        self.result.steps.append(step.to_record())
        what = "infrastructure failure" if isinstance(exc, InfrastructureError) else "sandbox lost"
        await self.emit("error", f"{what}: {exc}", {"error_kind": "infrastructure", "index": step.index})
        return lost(exc, f"in step {step.index} ({step.tool})")

    # -- after finish

    async def _verify(self, runtime: SceneRuntime) -> None:
        await self.lease.ready()
        await self.emit("system", f"finish: {self.result.final_answer}", {
            "final_answer": self.result.final_answer[:EVENT_DATA_CHARS]})
        try:
            reward, output = await _in_thread(runtime.verify, self.sandbox, self.config, self.result.final_answer)
        except LOST as exc:
            raise lost(exc, "during verification") from None
        except (SetupError, SandboxError) as exc:
            await self.emit("error", f"verifier could not run: {exc}", {"error_kind": "config"})
            raise Stop(ERROR, f"verifier could not run: {exc}", kind="config") from None
        output = dict(output or {})
        for key in ("stdout", "stderr"):
            if isinstance(output.get(key), str):
                output[key] = truncate_text(output[key], 20000)[0]
        self.result.reward = reward
        self.result.verifier_output = output
        if reward is None:
            self._end(SUCCESS, "finished (no verifier)")
            return
        await self.emit("system", f"verifier reward {reward:.2f}", {
            k: output.get(k) for k in ("command", "exit_code", "passed", "failed", "total", "reward", "timed_out")})
        counted = (f"{output.get('passed')}/{output.get('total')} tests passed"
                   if output.get("total") else f"exit code {output.get('exit_code')}")
        if output.get("timed_out"):
            counted = "the check timed out"
        if reward == 1.0:
            self._end(SUCCESS, f"finished; verifier passed ({counted})")
        else:
            note = f"; {output['note']}" if output.get("note") else ""
            self._end(FAILURE, f"finished; verifier reward {reward:.2f} ({counted}){note}")


async def run_episode(
    *,
    config: dict[str, Any],
    llm: LLMClient,
    sandbox_backend: Any = None,
    cache_key_extra: dict[str, Any] | None = None,
    on_event: Callable[..., Any] | None = None,
    should_cancel: Callable[[], Any] | None = None,
    trajectory: Any = None,
    on_sandbox_destroyed: Callable[[Any], None] | None = None,
) -> EpisodeResult:
    """Run one agent episode for a task config (Task.config_snapshot()); never raises for
    LLM, sandbox or agent trouble: those are outcomes. `sandbox_backend` is a backend, a
    backend name, or None for SANDBOX_BACKEND; `trajectory` owns the sandbox's record.
    With `on_sandbox_destroyed`, destroying the sandbox leaves its SandboxRecord to the caller:
    the callback gets the destroyed sandbox (called on the loop, so it must not block) and the
    caller marks the record (sandbox_records.records_destroyed), as a worker does together with storing
    results, in its one ORM thread, instead of from many threads waiting on SQLite's lock."""
    episode = _Episode(
        config=config, llm=llm, sandbox_backend=sandbox_backend, cache_key_extra=cache_key_extra,
        on_event=on_event, should_cancel=should_cancel, trajectory=trajectory,
        on_sandbox_destroyed=on_sandbox_destroyed,
    )
    return await episode.run()
