"""The multi_agent scene: several roles act in one base scene's environment.

Composition, not a new environment: a multi_agent task names a base scene and its config;
the sandbox, set-up, tools and verifier are that scene's runtime's. `scene_config`:

    {"base_scene": "code_exec", "base_config": {...the base scene's scene_config...},
     "protocol": "delegate" | "round_robin",
     "roles": [{"name": "planner", "system_prompt": "...", "tools": ["run_shell", ...] | absent = all,
                "model": "...", "provider": "deepseek", "max_steps": 8, "trainable": true,
                "description": "..."}, ...],
     "lead": "planner", "max_rounds": 3, "consensus": "all_agree" | "none"}

Protocols, both on the shared loop (apps/engines/agent.py) and its sub-episodes:

* `delegate` (orchestrator-workers): the lead runs the loop with its tools plus
  `delegate(role, instruction)` and the base scene's finish. Each delegation is a sub-episode
  for that role (its system prompt, its tools, its limits, model and provider — one of the
  configured LLM providers, asked first, the others its fallbacks — the same sandbox), which
  ends with its own `finish(answer)`, a report for the lead: that is the tool's result. A role that does not finish is reported to the lead as
  the tool's result; an infrastructure error in it ends the whole episode.
* `round_robin` (a group chat, like AgentScope's message hub): the lead speaks with
  `post(message)`; then every other role, in order, takes a turn — a sub-episode whose prompt
  is the conversation so far, each message named `[role]` — that may use its tools and ends
  with `say(message, agree)`. The replies are the tool's result. The discussion ends with the
  lead's finish; `post` is refused after `max_rounds`, and with `consensus: all_agree` the
  result says when every other role agreed.

The base scene's verifier runs after the lead finishes; its reward is the episode's, shared
by every role (AgentJet's data model: the exports give each trainable role's view that reward).
`verifier_output.multi_agent` records the delegations or turns, each sub-episode's outcome and
the roles that never acted. Each sub-episode is stored as a child trajectory of the lead's
(apps.tasks.models.Trajectory.parent, role, label), linked from the step that ran it
(`steps[i].subagent`).
"""
from __future__ import annotations

from typing import Any

from apps.engines.runtime import (
    InfrastructureError,
    SceneConfigError,
    SceneRuntime,
    SetupError,
    ToolError,
    ToolResult,
    current_episode,
    get_runtime,
    scene_directory,
)

SCENE = "multi_agent"
PROTOCOLS = ("delegate", "round_robin")
CONSENSUS = ("none", "all_agree")
DEFAULT_MAX_ROUNDS = 3
REPORT = "finish"  # a delegated role's own finish(answer): its report to the lead


def _scene(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("scene_config") or {}


def base_config(config: dict[str, Any]) -> dict[str, Any]:
    """The episode's config as the base scene sees it (its scene and its own scene_config)."""
    scene = _scene(config)
    return {**config, "scene": scene.get("base_scene") or "", "scene_config": dict(scene.get("base_config") or {})}


def roles(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(r.get("name")): r for r in _scene(config).get("roles") or [] if isinstance(r, dict)}


def acting_role(config: dict[str, Any]) -> str:
    """The role this (sub-)episode is played by: `acting_role`, set on sub-episodes, else the lead."""
    scene = _scene(config)
    return str(scene.get("acting_role") or scene.get("lead") or "")


def check_config(scene_config: dict[str, Any]) -> list[tuple[str, str]]:
    """Cross-field rules the JSON schema cannot say (the registry runs it on import): the base
    scene exists, has an engine and is not multi_agent; role names are unique; the lead is a
    role; the base config is valid for the base scene."""
    scenes = scene_directory()
    errors: list[tuple[str, str]] = []
    base = scene_config.get("base_scene")
    if base == SCENE:
        errors.append(("config.base_scene", "a multi_agent task cannot compose multi_agent"))
    elif base not in scenes.scene_ids():
        errors.append(("config.base_scene",
                       f"unknown scene {base!r}; one of: {', '.join(s for s in scenes.scene_ids() if s != SCENE)}"))
    elif not scenes.has_runtime(base):
        errors.append(("config.base_scene", f"scene {base} has no engine yet"))
    else:
        try:
            scenes.validate_scene_config(base, scene_config.get("base_config") or {})
        except SceneConfigError as exc:
            errors += [(f"config.base_config{field[len('config'):]}", reason) for field, reason in exc.errors]
    names = [r.get("name") for r in scene_config.get("roles") or []]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        errors.append(("config.roles", f"role names must be unique: {', '.join(duplicates)}"))
    if scene_config.get("lead") not in names:
        errors.append(("config.lead", f"must be one of the roles ({', '.join(map(str, names))})"))
    if scene_config.get("protocol", "delegate") == "delegate" and len(names) < 2:
        errors.append(("config.roles", "delegate needs the lead and at least one other role"))
    return errors


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


class MultiAgentRuntime(SceneRuntime):
    scene_id = SCENE

    # -- the base scene

    def _base(self, config: dict[str, Any]) -> SceneRuntime:
        base = _scene(config).get("base_scene") or ""
        if base == SCENE:
            raise SetupError("a multi_agent task cannot compose multi_agent")
        try:
            return get_runtime(base)
        except LookupError as exc:
            raise SetupError(f"base_scene: {exc}") from None

    def _role(self, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        name = acting_role(config)
        role = roles(config).get(name)
        if role is None:
            raise SetupError(f"role {name!r} is not one of the task's roles ({', '.join(roles(config))})")
        return name, role

    def _protocol(self, config: dict[str, Any]) -> str:
        protocol = _scene(config).get("protocol") or "delegate"
        if protocol not in PROTOCOLS:
            raise SetupError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        return protocol

    def _is_lead(self, config: dict[str, Any]) -> bool:
        return acting_role(config) == _scene(config).get("lead")

    # -- the hooks

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        base = self._base(config)
        bconf = base_config(config)
        name, role = self._role(config)
        protocol = self._protocol(config)
        offered = base.tools(bconf)
        by_name = {t["function"]["name"]: t for t in offered}
        # Every role's tools are checked when the lead starts: a bad one is the task's config error.
        for other, spec in (roles(config).items() if self._is_lead(config) else [(name, role)]):
            unknown = sorted(set(spec.get("tools") or ()) - set(by_name))
            if unknown:
                raise SetupError(f"role {other} names tools the {bconf['scene']} scene does not have: "
                                 f"{', '.join(unknown)} (it has {', '.join(by_name)})")
            _check_provider(other, spec.get("provider"))
        allowed = role.get("tools")
        keep = [t for n, t in by_name.items()
                if (allowed is None or n in allowed) and not base.is_finish(n)]
        finish = [t for n, t in by_name.items() if base.is_finish(n)]
        others = [r for r in roles(config) if r != name]
        if self._is_lead(config):
            if protocol == "delegate":
                keep.append(_fn("delegate", "Hand an instruction to one of your team's roles; it works in the same "
                                "environment with its own tools and returns its answer.",
                                {"role": {"type": "string", "enum": others},
                                 "instruction": {"type": "string", "minLength": 1}}, ["role", "instruction"]))
            else:
                keep.append(_fn("post", "Post a message to the group; every other role replies in turn.",
                                {"message": {"type": "string", "minLength": 1}}, ["message"]))
            return keep + finish
        if protocol == "round_robin":
            return keep + [_fn("say", "End your turn with your message to the group.",
                               {"message": {"type": "string", "minLength": 1},
                                "agree": {"type": "boolean", "description": "you agree with the current proposal"}},
                               ["message"])]
        # A delegated role reports to the lead; the base scene's finish (with its own arguments,
        # e.g. deep_search's sources) is the lead's, whose answer the verifier grades.
        return keep + [_fn(REPORT, "End your work: your answer or a short report for the lead.",
                           {"answer": {"type": "string"}}, ["answer"])]

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    # The base scene's own rewrites apply too (registry.text_form_rewrites); delegate stays a tool.
    text_form_rewrites: dict[str, str | None] = {
        "comes back as the result. Call finish when the task is done.":
            "comes back as the result. When the task is done, reply in text, without a tool call, with the answer.",
        "replies in turn. Call finish with the group's answer when you are done.":
            "replies in turn. When you are done, reply in text, without a tool call, with the group's answer.",
        "then end your turn with say(message, agree).":
            "then end your turn with your message in text, without a tool call, saying whether you agree.",
        "Do it with your tools, then call finish with a short answer for the lead.":
            "Do it with your tools, then reply in text, without a tool call, with a short answer for the lead.",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        base = self._base(config)
        name, role = self._role(config)
        team = "\n".join(f"- {n}: {_describe(r)}" for n, r in roles(config).items() if n != name)
        parts = [f"You are the {name} of a team." + (f" {role['system_prompt'].strip()}" if role.get("system_prompt") else "")]
        protocol = self._protocol(config)
        if self._is_lead(config) and protocol == "delegate":
            parts.append(f"Your team:\n{team}\nHand work to a role with delegate(role, instruction); its answer "
                         "comes back as the result. Call finish when the task is done.")
        elif self._is_lead(config):
            parts.append(f"You lead a discussion with:\n{team}\nPost a message with post(message); every other role "
                         "replies in turn. Call finish with the group's answer when you are done.")
        elif protocol == "round_robin":
            parts.append("You take part in a group discussion. Messages are named [role]. Use your tools if you "
                         "need them, then end your turn with say(message, agree).")
        else:
            parts.append("The lead of your team hands you an instruction. Do it with your tools, then call "
                         "finish with a short answer for the lead.")
        parts.append("## The environment\n" + base.system_prompt(base_config(config)).strip())
        return "\n\n".join(parts)

    def sandbox_spec(self, config: dict[str, Any]) -> Any:
        return self._base(config).sandbox_spec(base_config(config))

    def setup(self, sandbox: Any, config: dict[str, Any]) -> None:
        self._base(config).setup(sandbox, base_config(config))

    def initial_observation(self, sandbox: Any, config: dict[str, Any]) -> Any:
        """The base scene's look at the environment (gui's page, mobile's screen), for every role:
        a role delegated to later sees the environment as the others left it."""
        base = self._base(config)
        if type(base).initial_observation is SceneRuntime.initial_observation:
            return None
        return base.initial_observation(sandbox, base_config(config))

    def is_finish(self, name: str) -> bool:
        config = current_episode().config
        if not self._is_lead(config):
            return name == ("say" if self._protocol(config) == "round_robin" else REPORT)
        return self._base(config).is_finish(name)

    def finish_answer(self, args: dict[str, Any]) -> str:
        config = current_episode().config
        if not self._is_lead(config):
            return str(args.get("message" if self._protocol(config) == "round_robin" else "answer") or "")
        return self._base(config).finish_answer(args)

    async def aexecute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                            timeout: float | None = None) -> ToolResult:
        if name == "delegate" and self._is_lead(config):
            return await self._delegate(args, config)
        if name == "post" and self._is_lead(config):
            return await self._post(args, config)
        return await self._base(config).aexecute_tool(name, args, sandbox, base_config(config), timeout=timeout)

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        return self._base(config).execute_tool(name, args, sandbox, base_config(config), timeout=timeout)

    # -- protocols

    def _child_config(self, config: dict[str, Any], role: str, prompt: str) -> dict[str, Any]:
        spec = roles(config)[role]
        child = {**config, "prompt": prompt, "role": role,
                 "scene_config": {**_scene(config), "acting_role": role}, "system_prompt_extra": ""}
        if spec.get("max_steps"):
            child["max_steps"] = int(spec["max_steps"])
        if spec.get("model"):
            child["model"] = spec["model"]
        if spec.get("provider"):
            child["provider"] = spec["provider"]
        return child

    async def _run_role(self, config: dict[str, Any], role: str, prompt: str) -> Any:
        ctx = current_episode()
        child = await ctx.arun_subepisode(self._child_config(config, role, prompt), label=role)
        # The platform's failure ends the whole episode; the role's own (limits, a wrong answer,
        # the model's output) is the lead's to handle. A cancel reaches the lead at its next turn.
        if child.outcome == "error" and child.error_kind in ("infrastructure", "internal", "llm"):
            raise InfrastructureError(f"the {role} sub-episode failed: {child.outcome_reason}")
        return child

    @staticmethod
    def _ref(child: Any) -> dict[str, Any]:
        return {"role": child.role, "label": child.label, "outcome": child.outcome, "reason": child.outcome_reason,
                "steps": len(child.steps), "total_tokens": child.total_tokens}

    async def _delegate(self, args: dict[str, Any], config: dict[str, Any]) -> ToolResult:
        role, instruction = args["role"], args["instruction"]
        if role not in roles(config) or role == acting_role(config):
            raise ToolError(f"no role {role!r} to delegate to; roles: {', '.join(r for r in roles(config) if r != acting_role(config))}")
        ctx = current_episode()
        child = await self._run_role(config, role, instruction)
        ctx.state.setdefault("delegations", []).append({"role": role, "instruction": instruction,
                                                         "label": child.label, "outcome": child.outcome})
        if child.outcome == "success":
            output = child.final_answer or f"({role} finished without an answer)"
        else:
            output = f"{role} did not finish ({child.outcome}: {child.outcome_reason})"
            if child.final_answer:
                output += f"; its answer: {child.final_answer}"
        return ToolResult(output=output, extra={"subagent": self._ref(child)})

    async def _post(self, args: dict[str, Any], config: dict[str, Any]) -> ToolResult:
        ctx = current_episode()
        scene = _scene(config)
        max_rounds = int(scene.get("max_rounds") or DEFAULT_MAX_ROUNDS)
        rounds = ctx.state.setdefault("rounds", [])
        if len(rounds) >= max_rounds:
            raise ToolError(f"the discussion has had its {max_rounds} rounds (max_rounds): call finish now")
        lead = acting_role(config)
        transcript: list[dict[str, str]] = ctx.state.setdefault("transcript", [])
        transcript.append({"role": lead, "message": args["message"]})
        turns, agreed = [], []
        for role in roles(config):
            if role == lead:
                continue
            shown = "\n\n".join(f"[{m['role']}] {m['message']}" for m in transcript)
            prompt = f"Task: {config.get('prompt', '')}\n\nThe discussion so far:\n\n{shown}\n\nIt is your turn, {role}."
            child = await self._run_role(config, role, prompt)
            said = child.final_answer if child.outcome == "success" else f"(no reply: {child.outcome_reason})"
            agree = bool(child.outcome == "success" and _said_agree(child))
            transcript.append({"role": role, "message": said})
            turns.append({**self._ref(child), "agree": agree})
            agreed.append(agree)
        rounds.append({"message": args["message"], "turns": turns})
        lines = [f"[{m['role']}] {m['message']}" for m in transcript[-len(turns):]] if turns else []
        if scene.get("consensus") == "all_agree" and turns and all(agreed):
            lines.append("Every role agrees: finish with the group's answer.")
        elif len(rounds) >= max_rounds:
            lines.append(f"That was the last of {max_rounds} rounds: finish now.")
        return ToolResult(output="\n\n".join(lines), extra={"subagents": turns, "round": len(rounds)})

    # -- after the lead's finish

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        if not self._is_lead(config):
            return None, {"role": acting_role(config)}  # the base scene judges the lead's finish only
        reward, output = self._base(config).verify(sandbox, base_config(config), final_answer)
        ctx = current_episode()
        acted = {c.role for c in _subepisodes(ctx)} | {acting_role(config)}
        output = dict(output or {})
        output["multi_agent"] = {
            "protocol": self._protocol(config),
            "lead": acting_role(config),
            "delegations": ctx.state.get("delegations", []),
            "rounds": ctx.state.get("rounds", []),
            "subepisodes": [self._ref(c) for c in _subepisodes(ctx)],
            "roles_never_acted": [r for r in roles(config) if r not in acted],
            "shared_reward": reward,
        }
        return reward, output


def _check_provider(role: str, name: str | None) -> None:
    """A role's `provider` must be one the episode's LLM client has (LLM_PROVIDERS); checked when
    the lead starts, so a typo is the task's config error, not a failure in the middle."""
    if not name:
        return
    try:
        providers = [p.name for p in getattr(current_episode().llm, "providers", None) or []]
    except LookupError:
        return  # outside an episode (a tool listing): the lead's start checks it
    if providers and name not in providers:
        raise SetupError(f"role {role} names provider {name!r}, which is not configured "
                         f"(configured: {', '.join(providers)}; see LLM_PROVIDERS)")


def _subepisodes(ctx: Any) -> list[Any]:
    return list(ctx.subepisodes)


def _describe(role: dict[str, Any]) -> str:
    text = (role.get("description") or role.get("system_prompt") or "").strip()
    return text.splitlines()[0] if text else "(no description)"


def _said_agree(child: Any) -> bool:
    for step in reversed(child.steps):
        if step.get("tool") == "say":
            return bool((step.get("arguments") or {}).get("agree"))
    return False
