"""The search2qa scene runtime: a QA factory whose stages are episodes of the shared loop.

The task's own episode is the **explore** stage: the agent gets the web toolset (search, open,
find: apps/engines/web) and ends with `propose_qa(question, answer, aliases, evidence[{url,
quote}], reasoning)`. `verify` then runs the rest, each model-driven stage a sub-episode of the
same loop (`current_episode().run_subepisode`, apps/engines/runtime.py), in this order:

1. evolve x max_evolutions: a sub-episode (web tools + `evolve_qa`) per round, long-to-short;
   a round that ends without `evolve_qa` or changes the answer fails the `evolution` gate;
2. the code gates on the last pair (apps/engines/scenes/search2qa/gates.py): answer not in the
   question, a short answer, every evidence url opened during the run (explore and evolve
   rounds), every quote in its page (fuzzy >= quote_match, its numbers and names exactly),
   >= min_sources distinct pages, the answer in an opened evidence page;
3. optional `uniqueness`: a no-tool sub-episode that judges whether the answer is unique;
4. difficulty (`difficulty_check`): `no_tool`: a sub-episode with only `answer` must miss the
   answer (normalised exact match); `full`: also a deep_search sub-episode (the deep_search
   scene's own runtime and verifier, same web config) must pass;
5. emit: when every gate passed, a `deep_search` task (apps/engines/scenes/search2qa/emit.py) with the
   expected answer, aliases, sources and web config, in the output batch, the passing solver's
   run stored as its first trajectory.

The expensive stages run only while the gates before them pass; a gate not run is listed as
failed with the reason "not run". Reward 1.0 exactly when every gate passed, else 0.0;
`verifier_output` holds the final pair, each round's pair, every gate with its reason, a summary
of every sub-episode (steps, outcome, tokens) and what was emitted.

Sub-episodes run the search2qa scene with an internal config key `search2qa_stage` (evolve,
no_tool, uniqueness) that selects the tools and the system prompt; their own verify is empty.
"""
from __future__ import annotations

import copy
import json
from typing import Any

from apps.engines.llm import llm_route
from apps.engines.runtime import SceneRuntime, SetupError, ToolResult, current_episode
from apps.engines.scenes.search2qa import emit as E
from apps.engines.scenes.search2qa import gates as G
from apps.engines.scenes.search2qa import prompts as P
from apps.engines.scenes.search2qa.config import settings_of
from apps.engines.web.toolset import episode_toolset, opened_urls, web_tools, web_toolset

SCENE = "search2qa"
DEFAULT_STAGE_TIMEOUT_S = 600.0  # the agent loop's default timeout_s
MIN_STAGE_TIMEOUT_S = 1.0  # a stage started with no time left fails at once, with the loop's reason
STAGE_KEY = "search2qa_stage"
WEB_TOOLS = ("search", "open", "find")


def stage_of(config: dict[str, Any]) -> str:
    return config.get(STAGE_KEY) or "explore"


def finish_args(steps: list[dict[str, Any]], tool: str) -> dict[str, Any] | None:
    """The arguments of the episode's accepted finish call `tool`, or None."""
    for step in reversed(steps or []):
        if step.get("tool") == tool and not step.get("error") and isinstance(step.get("arguments"), dict):
            return step["arguments"]
    return None


def summarize(label: str, result: Any) -> dict[str, Any]:
    """What the factory's verifier output keeps of a sub-episode (the whole run is stored as a
    child trajectory of the factory's, apps.tasks.models.Trajectory.parent)."""
    return {
        "label": label, "outcome": result.outcome, "outcome_reason": result.outcome_reason,
        "reward": result.reward, "final_answer": result.final_answer, "total_tokens": result.total_tokens,
        "llm_calls": result.llm_calls, "duration_ms": result.duration_ms,
        "tools": [s.get("tool") for s in result.steps], "opened": sorted(opened_urls(result.steps)),
    }


class Search2QARuntime(SceneRuntime):
    scene_id = SCENE
    finish_tool = "propose_qa"

    # -- what the agent sees

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        stage = stage_of(config)
        finish = copy.deepcopy(P.FINISH_TOOLS[stage])
        if stage in ("no_tool", "uniqueness"):
            return [finish]
        return [*web_tools(WEB_TOOLS), finish]

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    # Every stage's prompt (prompts.py); the answers are finish_answer's texts.
    text_form_rewrites: dict[str, str | None] = {
        "When you have it, call propose_qa(question, answer, aliases, evidence, reasoning).":
            'When you have it, reply in text, without a tool call, with the pair as the JSON object '
            '{"question": ..., "answer": ...}.',
        "- evidence: for each fact, the page's url and a passage copied exactly from the page text (its "
        "numbers, dates and names as the page has them);\n": None,
        "Then call evolve_qa(question, answer, aliases, changed, evidence) with the same answer; evidence lists every "
        "page the evolved question relies on, with passages copied exactly from them.":
            'Then reply in text, without a tool call, with the evolved pair as the JSON object '
            '{"question": ..., "answer": ...} with the same answer.',
        "Reply by calling answer(answer) with a short answer:": "Reply in text with a short answer:",
        "Call judge_uniqueness(unique, reason).":
            'Reply in text with the JSON object {"unique": true or false, "reason": "..."}.',
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        stage = stage_of(config)
        s = settings_of(config)
        if stage == "evolve":
            return P.EVOLVE_SYSTEM
        if stage == "no_tool":
            return P.NO_TOOL_SYSTEM
        if stage == "uniqueness":
            return P.UNIQUENESS_SYSTEM
        return P.explore_system(str(s.get("seed") or ""), s["qa_mode"], max_words=s["max_answer_words"],
                                min_sources=s["min_sources"])

    def is_finish(self, name: str) -> bool:
        return name in ("propose_qa", "evolve_qa", "answer", "judge_uniqueness")

    def finish_answer(self, args: dict[str, Any]) -> str:
        if "question" in args:
            return P.final_answer_text(args)
        if "unique" in args:
            return json.dumps({"unique": args.get("unique"), "reason": args.get("reason", "")}, ensure_ascii=False)
        return super().finish_answer(args)

    # -- tools

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        return episode_toolset(config).execute(name, args, timeout=timeout)

    # -- after finish: the factory's remaining stages

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        if stage_of(config) != "explore":
            return None, {}  # a stage's sub-episode: the factory reads its finish call
        return Factory(config).run()


class Factory:
    """One run of the stages after explore, inside the explore episode's verify."""

    def __init__(self, config: dict[str, Any]):
        self.ctx = current_episode()
        self.config = config
        self.s = settings_of(config)
        self.seed = str(self.s.get("seed") or "")
        if not self.seed.strip():
            raise SetupError("a search2qa task needs scene_config.seed")
        self.gates: list[dict[str, Any]] = []
        self.stages: list[dict[str, Any]] = []
        self.rounds: list[dict[str, Any]] = []
        self.opened: set[str] = set()
        self.item: dict[str, Any] | None = None

    # -- sub-episodes

    def _stage_config(self, stage: str, prompt: str) -> dict[str, Any]:
        return {**self.config, STAGE_KEY: stage, "prompt": prompt, "max_steps": int(self.s["stage_max_steps"])}

    def _run(self, label: str, config: dict[str, Any], route: str = "") -> Any:
        # The task's timeout_s covers the whole factory (the worker stops the episode, verifier
        # included, a grace period after it): a stage gets at most what is left of it.
        left = self.ctx.time_left()
        if left < float(config.get("timeout_s") or DEFAULT_STAGE_TIMEOUT_S):
            config = {**config, "timeout_s": max(left, MIN_STAGE_TIMEOUT_S)}
        with llm_route(route):  # the offline stand-in's script key; never in the prompt
            result = self.ctx.run_subepisode(config, label=label)
        self.stages.append(summarize(label, result))
        return result

    # -- the stages

    def run(self) -> tuple[float, dict[str, Any]]:
        qa = finish_args(self.ctx.steps, "propose_qa")
        if qa is None:
            raise SetupError("the explore episode ended without an accepted propose_qa call")
        qa = dict(qa)
        self.opened |= opened_urls(self.ctx.steps)
        self.rounds.append({"round": 0, "stage": "explore", "qa": qa, "opened": sorted(opened_urls(self.ctx.steps))})
        qa = self._evolve(qa)
        code_ok = self._code_gates(qa)
        solver = None
        if self.s["uniqueness_check"]:
            self._uniqueness(qa, run=code_ok)
        mode = self.s["difficulty_check"]
        if mode in ("no_tool", "full"):
            self._no_tool(qa, run=self._all_passed())
        if mode == "full":
            solver = self._solve(qa, run=self._all_passed())
        reward = 1.0 if self._all_passed() else 0.0
        output: dict[str, Any] = {
            "seed": self.seed, "qa_mode": self.s["qa_mode"], "qa": qa, "rounds": self.rounds,
            "gates": self.gates, "passed": sum(g["passed"] for g in self.gates), "total": len(self.gates),
            "failed": [g["name"] for g in self.gates if not g["passed"]], "stages": self.stages,
            "opened": sorted(self.opened), "difficulty_check": mode, "process": self._process(),
        }
        output["decided_by"] = output["failed"][0] if output["failed"] else "gates"
        if reward == 1.0 and self.s["emit"]:
            output["emitted"] = E.emit_task(self.config, self._item(qa), solver, self.gates)
        elif reward < 1.0:
            output["note"] = "gates failed: " + ", ".join(output["failed"])
        return reward, output

    def _process(self) -> dict[str, dict[str, Any]]:
        """The evidence gates as the process conditions every scene reports."""
        by_name = {g["name"]: g for g in self.gates}
        return {condition: {"ok": by_name[name]["passed"], "relaxed": False,
                            "detail": "" if by_name[name]["passed"] else by_name[name]["reason"][:300]}
                for condition, name in (("sources_opened", "evidence_opened"),
                                        ("answer_in_sources", "answer_in_evidence")) if name in by_name}

    def _all_passed(self) -> bool:
        return all(g["passed"] for g in self.gates)

    def _skip(self, name: str, why: str = "an earlier gate failed") -> None:
        self.gates.append(G.gate(name, False, f"not run: {why}", skipped=True))

    def _evolve(self, qa: dict[str, Any]) -> dict[str, Any]:
        rounds = int(self.s["max_evolutions"]) if self.s["enable_evolution"] else 0
        if rounds == 0:
            return qa
        for n in range(1, rounds + 1):
            result = self._run(f"evolve-{n}", self._stage_config("evolve", P.evolve_prompt(self.seed, n, rounds, qa)),
                               route=P.stage_route("evolve", self.seed, n))
            round_opened = opened_urls(result.steps)
            self.opened |= round_opened
            evolved = finish_args(result.steps, "evolve_qa") if result.outcome == "success" else None
            if evolved is None:
                self.gates.append(G.gate("evolution", False, f"round {n} of {rounds} ended without evolve_qa: "
                                         f"{result.outcome}: {result.outcome_reason}", rounds_done=n - 1))
                return qa
            if not G.exact_match(evolved.get("answer") or "", G.answers_of(qa)):
                self.gates.append(G.gate("evolution", False, f"round {n} changed the answer from {qa['answer']!r} "
                                         f"to {evolved.get('answer')!r}", rounds_done=n - 1))
                return qa
            evolved = dict(evolved)
            if not evolved.get("aliases") and qa.get("aliases"):
                evolved["aliases"] = list(qa["aliases"])
            evolved.setdefault("reasoning", qa.get("reasoning", ""))
            qa = evolved
            self.rounds.append({"round": n, "stage": "evolve", "qa": qa, "opened": sorted(round_opened)})
        self.gates.append(G.gate("evolution", True, f"{rounds} round(s) evolved the question, the answer kept",
                                 rounds_done=rounds))
        return qa

    def _code_gates(self, qa: dict[str, Any]) -> bool:
        threshold = float(self.s["quote_match"])
        # With the steps so far (explore's and the evolve rounds'), a live backend reads the pages
        # those runs fetched from their records, not from the web again.
        web = web_toolset(self.config, steps=self.ctx.all_steps)
        pages: dict[str, str | None] = {}

        def page_text(url: str) -> str | None:
            if url not in pages:
                pages[url] = web.page_text(url)
            return pages[url]

        scored = G.score_quotes(qa, self.opened, page_text)
        self.gates += [
            G.answer_not_in_question(qa),
            G.short_answer(qa, int(self.s["max_answer_words"])),
            G.evidence_opened(qa, self.opened),
            G.evidence_quotes(scored, threshold),
            G.distinct_pages(scored, threshold, int(self.s["min_sources"])),
            G.answer_in_evidence(qa, self.opened, page_text),
        ]
        return self._all_passed()

    def _uniqueness(self, qa: dict[str, Any], *, run: bool) -> None:
        if not run:
            return self._skip("uniqueness")
        result = self._run("uniqueness", self._stage_config("uniqueness", P.uniqueness_prompt(self.seed, 0, qa)),
                           route=P.stage_route("uniqueness", self.seed, 0))
        verdict = finish_args(result.steps, "judge_uniqueness")
        if verdict is None:
            self.gates.append(G.gate("uniqueness", False, f"the judge gave no verdict: {result.outcome}: "
                                     f"{result.outcome_reason}"))
        else:
            self.gates.append(G.gate("uniqueness", bool(verdict.get("unique")), str(verdict.get("reason") or "")))

    def _no_tool(self, qa: dict[str, Any], *, run: bool) -> None:
        if not run:
            return self._skip("no_tool_fails")
        result = self._run("no-tool", self._stage_config("no_tool", P.no_tool_prompt(self.seed, 0, qa["question"])),
                           route=P.stage_route("no_tool", self.seed, 0))
        answered = finish_args(result.steps, "answer")
        if answered is None:
            if result.outcome == "error":
                # An error is not an answer the solver failed to find: the gate cannot be decided.
                self.gates.append(G.gate("no_tool_fails", False, f"the no-tool solver could not run: "
                                         f"{result.outcome_reason}"))
            else:
                self.gates.append(G.gate("no_tool_fails", True, "the no-tool solver gave no answer "
                                         f"({result.outcome_reason})", answer=None))
            return
        given = str(answered.get("answer") or "")
        if G.covers(given, G.answers_of(qa)):
            self.gates.append(G.gate("no_tool_fails", False, f"a solver without tools answered it: {given!r}",
                                     answer=given))
        else:
            self.gates.append(G.gate("no_tool_fails", True, f"a solver without tools missed it ({given!r})",
                                     answer=given))

    def _item(self, qa: dict[str, Any]) -> dict[str, Any]:
        """The deep_search task this pair becomes; made once, so the solver runs the emitted config."""
        if self.item is None:
            self.item = E.task_item(self.config, qa, E.generation(self.config, len(self.rounds) - 1, self.gates))
        return self.item

    def _solve(self, qa: dict[str, Any], *, run: bool) -> Any:
        if not run:
            self._skip("tool_solver_passes")
            return None
        result = self._run("solve", E.solver_config(self._item(qa)))
        passed = result.outcome == "success" and result.reward == 1.0
        reason = (f"a deep_search solver with tools answered it ({result.final_answer!r})" if passed else
                  f"the deep_search solver did not pass: {result.outcome}: {result.outcome_reason}")
        self.gates.append(G.gate("tool_solver_passes", passed, reason, answer=result.final_answer,
                                 reward=result.reward))
        return result if passed else None
