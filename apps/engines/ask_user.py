"""The shared `ask_user` toolset: the agent asks the user a question; a simulated user answers.

    ASK_USER_TOOL                               # the OpenAI function spec (question: string)
    reply = answer(question, facts)             # the deterministic simulator (default)
    reply = answer(question, facts, simulator=LLMSimulator(llm, model="...", prompt="..."))

A scene offers `ASK_USER_TOOL` beside its own tools and, when the agent calls it, answers with
`answer(...)`. `facts` are what only the user knows: `{name: value}` or `{name: {"value": v,
"aliases": ["..."]}}` (a task's `user_facts`). The step records `simulated_user: true`, the
reply and which facts it revealed (`Reply.as_extra()`), so the verifier can tell that a hidden
value reached the agent only through the user, and the exporters turn the exchange into an
ordinary assistant question and user answer (apps/datasets/exporters/chat.py).

* Deterministic (default): a fact is given when the question names it — its name's words
  (`attendee_email` -> "attendee" and "email", each matched at a word's start, so "attendee's
  e-mail" does not count but "attendees' emails" does), or one of its aliases as a phrase.
  The reply states every named fact ("The attendee email is bob@example.com."); a question
  that names none gets "I don't know that." Same question, same facts: same reply, so offline
  scripts replay exactly.
* LLM (`LLMSimulator`): its own model and system prompt; the facts are given to it and the
  question is the user message; its reply is recorded with the model, usage and cost. Which
  facts it revealed is decided in code (the value's text appears in the reply), never by it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

ASK_USER = "ask_user"
ASK_USER_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": ASK_USER,
    "description": ("Ask the user a question when the task lacks something only they know (a value, a choice, "
                    "a confirmation). Ask for what is missing, naming it; their reply comes back as the result."),
    "parameters": {"type": "object", "properties": {
        "question": {"type": "string", "minLength": 1, "description": "the question for the user"}},
        "required": ["question"], "additionalProperties": False},
}}
DONT_KNOW = "I don't know that."
DEFAULT_LLM_PROMPT = (
    "You play the user of an assistant. You know only these facts:\n{facts}\n"
    "Answer the assistant's question briefly, in plain words, giving only the facts it asks for. "
    "If it asks for something not in the list, say you don't know. Never make up a value."
)
_WORD = re.compile(r"[a-z0-9]+")


class FactsError(ValueError):
    """`user_facts` that are not {name: value} or {name: {"value", "aliases"}}."""


@dataclass(frozen=True)
class Fact:
    name: str
    value: Any
    aliases: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The value as the user says it (strings bare, anything else as JSON)."""
        return self.value if isinstance(self.value, str) else json.dumps(self.value, ensure_ascii=False)

    def named_in(self, question: str) -> bool:
        words = _WORD.findall(question.lower())
        wanted = [w for w in _WORD.findall(self.name.lower().replace("_", " ")) if w]
        if wanted and all(any(word.startswith(w) for word in words) for w in wanted):
            return True
        lowered = " ".join(words)
        return any(" ".join(_WORD.findall(alias.lower())) in lowered for alias in self.aliases
                   if _WORD.findall(alias.lower()))


def parse_facts(raw: Any) -> list[Fact]:
    """The facts of a task's `user_facts`; FactsError for any other shape."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise FactsError(f"user_facts must be an object {{name: value}}, got {type(raw).__name__}")
    facts = []
    for name, spec in raw.items():
        if not isinstance(name, str) or not _WORD.search(name.lower()):
            raise FactsError(f"user_facts: {name!r} is not a fact name")
        if isinstance(spec, dict) and "value" in spec:
            aliases = spec.get("aliases") or []
            if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
                raise FactsError(f"user_facts.{name}.aliases must be a list of non-empty strings")
            facts.append(Fact(name, spec["value"], tuple(aliases)))
        else:
            facts.append(Fact(name, spec))
    return facts


@dataclass
class Reply:
    """The simulated user's answer to one question."""

    text: str
    revealed: list[str]
    simulator: str  # "deterministic" | "llm"
    llm: dict[str, Any] = field(default_factory=dict)  # system prompt, model, usage, cost_usd, latency_ms (llm only)

    def as_extra(self) -> dict[str, Any]:
        """What the step records (merged into it through ToolResult.extra)."""
        extra: dict[str, Any] = {"simulated_user": True, "user_simulator": self.simulator,
                                 "revealed_facts": list(self.revealed)}
        if self.llm:
            extra["user_simulator_llm"] = dict(self.llm)
        return extra


def _phrase(fact: Fact) -> str:
    return f"The {fact.name.replace('_', ' ')} is {fact.text}."


def deterministic_answer(question: str, facts: list[Fact]) -> Reply:
    named = [f for f in facts if f.named_in(question)]
    if not named:
        return Reply(DONT_KNOW, [], "deterministic")
    return Reply(" ".join(_phrase(f) for f in named), [f.name for f in named], "deterministic")


def revealed_in(text: str, facts: list[Fact]) -> list[str]:
    """The facts whose value's text appears in `text` (case-insensitive)."""
    lowered = text.lower()
    return [f.name for f in facts if f.text.strip() and f.text.lower() in lowered]


class LLMSimulator:
    """A simulated user answered by a model (its own model name and prompt); `llm` is an LLMClient."""

    def __init__(self, llm: Any, *, model: str = "", prompt: str = "", temperature: float | None = 0.0,
                 cache_key_extra: Any = None, on_chat: Callable[[Any], None] | None = None):
        self.llm, self.model, self.prompt = llm, model, prompt or DEFAULT_LLM_PROMPT
        self.temperature, self.cache_key_extra = temperature, cache_key_extra
        self.on_chat = on_chat  # e.g. EpisodeContext.count_model_call: the episode pays for its user

    def messages(self, question: str, facts: list[Fact]) -> list[dict[str, Any]]:
        listed = "\n".join(f"- {f.name}: {f.text}" for f in facts) or "- (none)"
        system = self.prompt.replace("{facts}", listed) if "{facts}" in self.prompt else f"{self.prompt}\n{listed}"
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    def answer(self, question: str, facts: list[Fact]) -> Reply:
        messages = self.messages(question, facts)
        chat = self.llm.chat(messages, model=self.model or None,
                             temperature=self.temperature, cache_key_extra=self.cache_key_extra)
        if self.on_chat is not None:
            self.on_chat(chat)
        text = (chat.content or "").strip() or DONT_KNOW
        return Reply(text, revealed_in(text, facts), "llm", {
            "system": messages[0]["content"], "model": chat.model, "provider": chat.provider, "usage": dict(chat.usage),
            "cost_usd": str(chat.cost_usd), "latency_ms": chat.latency_ms, "cached": chat.cached})


def answer(question: str, facts: Any, *, simulator: LLMSimulator | None = None) -> Reply:
    """The simulated user's reply to `question` given the task's facts (raw `user_facts` or parsed)."""
    parsed = facts if isinstance(facts, list) else parse_facts(facts)
    if not isinstance(question, str) or not question.strip():
        return Reply(DONT_KNOW, [], simulator and "llm" or "deterministic")
    if simulator is not None:
        return simulator.answer(question, parsed)
    return deterministic_answer(question, parsed)
