"""The toolace scene runtime: envscaler's executed environment, plus a simulated user and two modes.

A toolace task (made by the toolace pipeline, pipeline.py) carries a synthesized tool suite as an
envscaler environment (`env_name`, `class_name`, `code`, `operations`, `init_config`,
`check_func`) and what the dialogue needs: `user_facts` (what only the user knows),
`missing_params` (facts deliberately left out of the prompt), `expected_calls`, optionally
`expected_answer`, `follow_ups` (user requests sent after each finish until the script ends),
`user_simulator` ({"kind": "deterministic"} by default, or {"kind": "llm", "model", "prompt"})
and `mode`:

* `agent` (default): the shared loop on the environment (served by envscaler's server in the
  sandbox); tools = the suite's operations + `ask_user(question)` (apps/engines/ask_user.py)
  + `finish(answer)`. After each finish the loop asks `next_user_turn`: the next follow-up, if
  any, becomes a user message and the episode goes on.
* `mt` (ToolACE-MT): mt.py — one model call writes the dialogue, the runtime executes it against
  the episode's fresh environment and has stale suffixes re-filled; `transcript` hands the
  loop the dialogue as the trajectory to store.

verify: the check function on the final state (envscaler's), then the hard rules of rules.py on
the stored steps; the reward is the check's when every rule holds, else 0.0 with the rule named
(`note`, `failed_rules`, `decided_by`; every verdict under `rules`, and the process conditions —
`rule_filter`, `asked_before_use`, `target_tools`, `tool_order` — under `process`).
"""
from __future__ import annotations

import copy
import json
from typing import Any

from jsonschema import Draft202012Validator

from apps.engines.agent import truncate_text
from apps.engines.ask_user import ASK_USER, ASK_USER_TOOL, DEFAULT_LLM_PROMPT, FactsError, LLMSimulator, answer
from apps.engines.scenes.envscaler.runtime import FINISH_TOOL, EnvScalerRuntime, scene_config
from apps.engines.llm import LLMError
from apps.engines.runtime import InfrastructureError, ToolError, ToolResult, current_episode
from apps.engines.scenes.toolace import mt
from apps.engines.scenes.toolace.rules import Context, check_rules

MODES = ("agent", "mt")
FINISH_OUTPUT = "finish accepted; the episode ends"


def mode_of(config: dict[str, Any]) -> str:
    return scene_config(config).get("mode") or "agent"


def _tool_lines(scene: dict[str, Any]) -> list[str]:
    lines = []
    for op in scene.get("operations") or []:
        props = (op.get("parameters") or {}).get("properties") or {}
        required = set((op.get("parameters") or {}).get("required") or [])
        args = ", ".join(f"{name}{'' if name in required else '?'}" for name in props)
        lines.append(f"- {op['name']}({args}): {op.get('description') or ''}".rstrip(": "))
    return lines


class ToolAceRuntime(EnvScalerRuntime):
    scene_id = "toolace"

    # -- what the agent sees

    def agent_tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        """The operations, ask_user and finish: what an agent-mode episode (and an mt transcript) offers."""
        ops = [t for t in super().tools(config) if t["function"]["name"] not in ("get_current_time", "finish")]
        return ops + [copy.deepcopy(ASK_USER_TOOL), copy.deepcopy(FINISH_TOOL)]

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        if mode_of(config) == "mt":
            return [copy.deepcopy(mt.WRITE_DIALOGUE_TOOL), copy.deepcopy(FINISH_TOOL)]
        return self.agent_tools(config)

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    # (mt mode's generation prompt is not the stored one: its dialogue is stored under the agent-mode prompt.)
    text_form_rewrites: dict[str, str | None] = {
        "- finish(answer): end your turn with a short answer for the user.\n": None,
        "Use a tool in every reply. Call finish when the request is done.":
            "Use a tool in every reply until the request is done; then end your turn with a short answer for the "
            "user in text, without a tool call.",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        scene = scene_config(config)
        lines = [f"You are an assistant with the tools of {scene.get('env_name', '')!r}."]
        if scene.get("env_description"):
            lines.append(f"About them: {scene['env_description']}")
        lines += ["Each call really runs and its result (or error) comes back to you.", "", "Tools:",
                  *_tool_lines(scene),
                  "- ask_user(question): ask the user for something only they know; never guess a value.",
                  "- finish(answer): end your turn with a short answer for the user."]
        if mode_of(config) == "mt":
            lines += ["", "Do not call these tools yourself. Write the whole dialogue that serves the user's request "
                      "in ONE call of write_dialogue: the assistant's turns with their tool calls and the output you "
                      "expect from each, the user's replies, ending with a finish call. The platform runs the calls "
                      "and may ask you to re-write a part whose real outputs differ; then call finish."]
        else:
            lines += ["", "Use a tool in every reply. Call finish when the request is done."]
        if config.get("max_steps"):
            lines.append(f"You have at most {int(config['max_steps'])} replies.")
        return "\n".join(lines)

    # -- tools

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        if name == ASK_USER:
            return self.ask_user(args.get("question", ""), config)
        if name == mt.WRITE_DIALOGUE:
            return self._write_dialogue(args, sandbox, config, timeout)
        return super().execute_tool(name, args, sandbox, config, timeout=timeout)

    def ask_user(self, question: str, config: dict[str, Any]) -> ToolResult:
        scene = scene_config(config)
        sim = scene.get("user_simulator") or {}
        simulator = None
        if sim.get("kind") == "llm":
            ctx = current_episode()
            prompt = sim.get("prompt") or DEFAULT_LLM_PROMPT
            if scene.get("persona"):  # ToolACE's role background: who the simulated user is
                prompt = f"You are {scene['persona'].rstrip('.')}.\n{prompt}"
            simulator = LLMSimulator(ctx.llm, model=sim.get("model") or "", prompt=prompt,
                                     on_chat=ctx.count_model_call,
                                     # one answer per trajectory and question: a retry replays it
                                     cache_key_extra={"toolace_user": str(getattr(ctx.trajectory, "uuid", "") or ""),
                                                      "task": scene.get("task_id") or "", "n": len(ctx.steps)})
        try:
            reply = answer(question, scene.get("user_facts") or {}, simulator=simulator)
        except FactsError as exc:
            raise ToolError(f"the task's user facts are unusable: {exc}") from None
        except LLMError as exc:  # the platform's trouble, not the agent's: the episode ends, retryable
            raise InfrastructureError(f"the simulated user's model failed: {type(exc).__name__}: {exc}") from None
        return ToolResult(output=reply.text, extra=reply.as_extra())

    def next_user_turn(self, config: dict[str, Any], final_answer: str) -> str | None:
        """The next scripted follow-up request after a finish (agent mode), or None: the episode ends."""
        if mode_of(config) != "agent":
            return None
        follow_ups = scene_config(config).get("follow_ups") or []
        state = current_episode().state
        sent = state.get("follow_ups_sent", 0)
        if sent >= len(follow_ups):
            return None
        state["follow_ups_sent"] = sent + 1
        return str(follow_ups[sent])

    # -- mt

    def _write_dialogue(self, args: dict[str, Any], sandbox: Any, config: dict[str, Any],
                        timeout: float | None) -> ToolResult:
        ctx = current_episode()
        dialogue: mt.Dialogue = ctx.state.setdefault("mt", mt.Dialogue())
        rounds = int(scene_config(config).get("refine_rounds", mt.DEFAULT_REFINE_ROUNDS))
        from_turn = args.get("from_turn")
        turns = [dict(t) for t in args.get("turns") or []]
        if from_turn is None:
            if dialogue.turns:
                raise ToolError("the dialogue is written already; re-write a masked part with from_turn")
            dialogue.turns = turns
        else:
            if not dialogue.turns:
                raise ToolError("write the whole dialogue first (without from_turn)")
            if dialogue.consistent:
                raise ToolError("the dialogue agrees with the real outputs; call finish")
            if from_turn != dialogue.executed:
                raise ToolError(f"the turns from {dialogue.executed} on are masked: re-write from_turn={dialogue.executed}")
            if dialogue.rounds >= rounds:
                raise ToolError(f"no re-fill rounds left (refine_rounds={rounds}); call finish")
            dialogue.rounds += 1
            dialogue.turns = dialogue.turns[:from_turn] + [{**t, "refilled": True} for t in turns]
        dialogue.history.append({"from_turn": from_turn, "turns": len(turns)})
        return ToolResult(output=self._execute_dialogue(dialogue, sandbox, config, timeout),
                          extra={"mt_round": dialogue.rounds, "mt_executed": dialogue.executed,
                                 "mt_consistent": dialogue.consistent})

    def _execute_dialogue(self, dialogue: mt.Dialogue, sandbox: Any, config: dict[str, Any],
                          timeout: float | None) -> str:
        """Run the turns not run yet; the text for the model (consistent, or what to re-write)."""
        validators = {t["function"]["name"]: Draft202012Validator(t["function"].get("parameters") or {"type": "object"})
                      for t in self.agent_tools(config)}
        seen = Context()
        seen.add(config.get("prompt") or "")
        for turn in dialogue.turns[:dialogue.executed]:
            seen.add(str(turn.get("content") or ""))
            for call in turn.get("tool_calls") or []:
                seen.add(str(call.get("real_output") or ""))
        turns = dialogue.turns
        k = dialogue.executed
        while k < len(turns):
            turn = turns[k]
            calls = turn.get("tool_calls") or []
            if turn.get("role") == "user" or not calls:
                if turn.get("role") == "assistant" and not (turn.get("content") or "").strip():
                    return self._mask(dialogue, k, f"turn {k} is an assistant turn with neither text nor calls")
                seen.add(str(turn.get("content") or ""))
                k += 1
                dialogue.executed = k
                continue
            problems = [f"call {i} ({c.get('name')}): {p}" for i, c in enumerate(calls)
                        if (p := mt.invalid_call(c, validators))]
            if problems:
                return self._mask(dialogue, k, f"turn {k}: {'; '.join(problems)}")
            stale: set[str] = set()
            real: list[str] = []
            for call in calls:
                name, arguments = call["name"], call.get("arguments") or {}
                call["skeleton_output"] = call.pop("output", call.get("skeleton_output", ""))
                if name == "finish":
                    result = ToolResult(output=FINISH_OUTPUT)
                    dialogue.finished_answer = self.finish_answer(arguments)
                elif name == ASK_USER:
                    result = self.ask_user(arguments.get("question", ""), config)
                else:
                    result = super().execute_tool(name, arguments, sandbox, config, timeout=timeout)
                call["real_output"], call["extra"], call["duration_ms"] = result.output, result.extra, result.duration_ms
                if name != "finish":
                    stale |= mt.stale_values(call["skeleton_output"], result.output, seen)
                real.append(f"{name}: {result.output}")
            for call in calls:
                seen.add(str(call.get("real_output") or ""))
            seen.add(str(turn.get("content") or ""))
            k += 1
            dialogue.executed = k
            if stale and mt.depends_on(turns[k:], stale):
                shown = "\n".join(real)
                return self._mask(dialogue, k, f"the real outputs of turn {k - 1} differ from what the later turns "
                                               f"assumed (no longer true: {', '.join(sorted(stale))}):\n{shown}")
        if dialogue.finished_answer is None or "finish" not in [c["name"] for c in turns[-1].get("tool_calls") or []]:
            return self._mask(dialogue, len(turns), "the dialogue must end with a finish call")
        dialogue.consistent = True
        return (f"The dialogue's {sum(len(t.get('tool_calls') or []) for t in turns)} calls were executed and their "
                f"real outputs agree with it. Call finish with the dialogue's final answer.")

    @staticmethod
    def _mask(dialogue: mt.Dialogue, k: int, why: str) -> str:
        dialogue.executed = min(dialogue.executed, k)
        dialogue.turns = dialogue.turns[:k]
        dialogue.finished_answer = None
        return (f"{why}\nTurns from {k} on are masked. Re-write them, continuing from the real outputs above: "
                f"call write_dialogue(from_turn={k}, turns=[...]).")

    def transcript(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """An mt episode's dialogue as the trajectory to store (messages, steps, tools); None in agent mode."""
        if mode_of(config) != "mt":
            return None
        dialogue = current_episode().state.get("mt")
        if dialogue is None or not dialogue.turns:
            return None
        return self.render_dialogue(dialogue, config)

    def render_dialogue(self, dialogue: mt.Dialogue, config: dict[str, Any]) -> dict[str, Any]:
        agent_config = {**config, "scene_config": {**scene_config(config), "mode": "agent"}}
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt(agent_config)},
                                          {"role": "user", "content": config.get("prompt") or ""}]
        steps: list[dict[str, Any]] = []
        assistant_turn = 0
        for k, turn in enumerate(dialogue.turns[:dialogue.executed]):
            if turn.get("role") == "user":
                messages.append({"role": "user", "content": str(turn.get("content") or "")})
                continue
            assistant_turn += 1
            calls = turn.get("tool_calls") or []
            message: dict[str, Any] = {"role": "assistant", "content": turn.get("content") or None}
            if calls:
                message["tool_calls"] = [
                    {"id": f"mt_{k}_{i}", "type": "function",
                     "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments") or {}, ensure_ascii=False)}}
                    for i, c in enumerate(calls)]
            messages.append(message)
            for i, call in enumerate(calls):
                output, cut = truncate_text(str(call.get("real_output") or ""))
                messages.append({"role": "tool", "tool_call_id": f"mt_{k}_{i}", "name": call["name"], "content": output})
                steps.append({
                    "index": len(steps), "turn": assistant_turn, "tool_call_id": f"mt_{k}_{i}", "tool": call["name"],
                    "arguments": call.get("arguments") or {}, "format": "native",
                    "thought": (turn.get("content") or "") if i == 0 else "", "observation": "",
                    "output": output, "exit_code": None, "duration_ms": int(call.get("duration_ms") or 0),
                    "truncated": cut, "timed_out": False, **(call.get("extra") or {}),
                    "source": "mt", "mt_turn": k, "skeleton_output": call.get("skeleton_output", ""),
                    "refilled": bool(turn.get("refilled")),
                })
        return {"messages": messages, "steps": steps, "tools": self.agent_tools(agent_config)}

    # -- after finish

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        reward, output = super().verify(sandbox, config, final_answer)
        ctx = current_episode()
        scene = scene_config(config)
        if mode_of(config) == "mt":
            dialogue: mt.Dialogue | None = ctx.state.get("mt")
            record = self.render_dialogue(dialogue, config) if dialogue and dialogue.turns else \
                {"messages": ctx.messages, "steps": [], "tools": self.agent_tools(config)}
            steps, messages, tools = record["steps"], record["messages"], record["tools"]
            final = dialogue.finished_answer if dialogue and dialogue.finished_answer is not None else final_answer
            output["mt"] = {"rounds": dialogue.rounds if dialogue else 0,
                            "consistent": bool(dialogue and dialogue.consistent),
                            "refilled_turns": sorted({s["mt_turn"] for s in steps if s.get("refilled")}),
                            "history": dialogue.history if dialogue else [],
                            "generation_messages": copy.deepcopy(ctx.messages)}
        else:
            steps, messages, tools, final = ctx.steps, ctx.messages, self.agent_tools(config), final_answer
        report = check_rules(config, steps, messages, tools)
        rules, failed = report["rules"], report["failed"]
        if mode_of(config) == "mt":
            consistent = output["mt"]["consistent"]
            rules["mt_consistent"] = {"passed": consistent, "detail": "" if consistent else
                                      "the dialogue never agreed with the real outputs within refine_rounds"}
            failed = failed + ([] if consistent else ["mt_consistent"])
        if scene.get("expected_answer"):
            ok = str(scene["expected_answer"]).strip().lower() in (final or "").lower()
            rules["expected_answer"] = {"passed": ok, "detail": "" if ok else
                                        f"the final answer does not contain {scene['expected_answer']!r}"}
            failed = failed + ([] if ok else ["expected_answer"])
        check_reward = reward
        if failed:
            reward = 0.0
            first = rules[failed[0]]
            output["note"] = f"hard rule {failed[0]} failed: {first['detail']}"[:2000]
        elif reward is None:
            reward = 1.0  # no check function: the rules alone decide
        output.update(rules=rules, failed_rules=failed, check_reward=check_reward, reward=reward,
                      passed=1 if reward == 1.0 else 0, total=1, method="check_func+rules",
                      process=process_conditions(scene, rules),
                      decided_by=failed[0] if failed else "check" if check_reward is not None else "rules")
        return reward, output


def process_conditions(scene: dict[str, Any], rules: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The hard rules as the process conditions every scene reports (verifier_output["process"]);
    a condition the task does not call for (no hidden values, no expected calls) is absent."""
    def condition(*names: str) -> dict[str, Any]:
        bad = [n for n in names if not rules[n]["passed"]]
        return {"ok": not bad, "relaxed": False,
                "detail": "; ".join(f"{n}: {rules[n]['detail']}" for n in bad)[:300]}

    process = {"rule_filter": condition("schema_valid", "known_tools", "grounding")}
    if scene.get("missing_params"):
        process["asked_before_use"] = condition("hidden_params")
    expected = scene.get("expected_calls") or []
    if expected:
        calls = rules["expected_calls"]
        process["target_tools"] = {"ok": calls["coverage"] == 1.0, "relaxed": False,
                                   "detail": "" if calls["coverage"] == 1.0 else calls["detail"][:300]}
        if len(expected) > 1 and scene.get("task_type") != "parallel":
            process["tool_order"] = {"ok": calls["order_correct"], "relaxed": False, "detail": "" if
                                     calls["order_correct"] else "the expected calls were made out of order"}
    return process
