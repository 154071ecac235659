"""The deep_search scene: research with the web toolset, then a sourced answer graded in code.

Tools: search / open / find (apps.engines.web, over scene_config.web: the offline corpus by
default, or the live web), `finish(answer, sources)`; with `browse: true` also `browse(url, question)`
(a reader model reads the page and answers; apps.engines.web.toolset); with `explore: true` also
`explore(question)` — WebThinker's deep explorer: a sub-episode of the shared loop (this scene,
web tools only) that searches and reads, then finishes with a summary and its sources, returned
to the agent as the tool's result. No sandbox: the corpus backend queries SQLite in the worker
and the live one fetches from it (no agent code runs).

Answer mode (default): reward = EM (Search-R1 normalisation) of the answer against
`expected_answer` + `aliases`, gated by two process conditions (verifier_output["process"]):
`sources_opened` — at least one URL cited, and every cited URL exists and was read in this
episode (its own open / browse steps and its explore sub-episodes'); gates the reward unless
`require_sources: false` — and `answer_in_sources` — the answer (or an alias) occurs in the text
of a cited page that was opened (verify.contains_answer); gates the reward unless
`require_sources: false` or `require_answer_in_sources: false` (an answer computed from the
pages, e.g. a difference of two years). A relaxed condition is still reported, `relaxed: true`.
`sources_ok` is `sources_opened`'s verdict. F1 stays in verifier_output as partial credit. No
expected answer: no reward. `decided_by` names what set the reward: `exact_match` or the first
failed condition.

Report mode (`output: report`): `finish(report, sources)`; deterministic checks — at least
`report.min_sources` sources cited (default 1), every cited page opened, `min_words` <= length
<= `max_words` — and reward 1.0 when all pass, else 0.0 (the review agent's rubric judges the
rest). verifier_output lists each check.
"""
from __future__ import annotations

from typing import Any

from apps.engines.scenes.deep_search.verify import check_sources, exact_match, normalize_answer, token_f1, word_count
from apps.engines.runtime import SceneRuntime, ToolError, ToolResult, current_episode
from apps.engines.web import episode_toolset, opened_urls, web_tools, web_toolset
from apps.engines.web.toolset import WebToolset, check_web_config, web_settings

SCENE = "deep_search"
EXPLORE_PROMPT = "[deep_search/explore] Research this and report what you found, with the pages you read:\n"
DEFAULT_EXPLORE_STEPS = 8
REPORT_DEFAULTS = {"min_words": 50, "max_words": 2000, "min_sources": 1}


def scene_config(config: dict[str, Any]) -> dict[str, Any]:
    return dict(config.get("scene_config") or {})


def _report_mode(config: dict[str, Any]) -> bool:
    return scene_config(config).get("output") == "report"


def _finish_schema(report: bool) -> dict[str, Any]:
    field, what = ("report", "the report (plain text or Markdown)") if report else (
        "answer", "the answer itself: a short name, number, date or phrase")
    return {"type": "function", "function": {
        "name": "finish",
        "description": "End the research with your " + ("report" if report else "answer") + " and the URLs of the "
                       "pages you read that support it.",
        "parameters": {"type": "object", "properties": {
            field: {"type": "string", "description": what},
            "sources": {"type": "array", "items": {"type": "string"},
                        "description": "URLs of pages you opened that support it"},
        }, "required": [field, "sources"], "additionalProperties": False},
    }}


EXPLORE_SCHEMA = {"type": "function", "function": {
    "name": "explore",
    "description": "Hand a sub-question to a helper that searches and reads pages on its own, then returns a short "
                   "summary of what it found with the URLs it read (those count as opened by you).",
    "parameters": {"type": "object", "properties": {"question": {"type": "string", "minLength": 1}},
                   "required": ["question"], "additionalProperties": False},
}}


class DeepSearchRuntime(SceneRuntime):
    scene_id = SCENE

    def tools(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        check_web_config(config)  # a corpus that is not built is the task's set-up, found before the first turn
        names = ("search", "open", "find", "browse") if scene_config(config).get("browse") else ("search", "open", "find")
        tools = web_tools(names) + [_finish_schema(_report_mode(config))]
        if scene_config(config).get("explore"):
            tools.append(EXPLORE_SCHEMA)
        return tools

    # The system prompt in an export's text form (final_answer text, apps/datasets/exporters/answers.py):
    # each sentence of it that names the finish tool -> what it says instead (None drops the line).
    text_form_rewrites: dict[str, str | None] = {
        "Finish with a report of ": "When you are done, reply in text, without a tool call, with a report of ",
        " words and the URLs of at least ": " words, based on at least ",
        "When you know the answer, call finish with the answer alone (a name, number, date or short "
        "phrase, not a sentence) and the URLs of the pages you opened that support it. Cite only "
        "pages you opened.":
            "When you know the answer, reply in text, without a tool call, with the answer alone (a name, number, "
            "date or short phrase, not a sentence), found on pages you opened.",
    }

    def system_prompt(self, config: dict[str, Any]) -> str:
        web = web_settings(config)
        where = ("an offline copy of part of the web (a fixed document collection)" if web["backend"] == "corpus"
                 else "the web")
        lines = [
            f"You are a research assistant. You answer by searching {where} and reading pages.",
            "Use search to find candidate pages, open to read them (long pages come in windows: open again with the "
            "offset it tells you), and find to locate a word or pattern in a page. Follow the links pages give you: "
            "questions often need facts from two or more pages.",
        ]
        if scene_config(config).get("browse"):
            lines.append("browse has a reader read a whole page and answer a question about it; check what matters.")
        if scene_config(config).get("explore"):
            lines.append("explore hands a sub-question to a helper that researches it and returns a summary.")
        if _report_mode(config):
            report = {**REPORT_DEFAULTS, **(scene_config(config).get("report") or {})}
            lines.append(f"Finish with a report of {report['min_words']}-{report['max_words']} words and the URLs of "
                         f"at least {report['min_sources']} page(s) you opened that support it.")
        else:
            lines.append("When you know the answer, call finish with the answer alone (a name, number, date or short "
                         "phrase, not a sentence) and the URLs of the pages you opened that support it. Cite only "
                         "pages you opened.")
        if config.get("max_steps"):
            lines.append(f"You have at most {int(config['max_steps'])} replies.")
        return "\n".join(lines)

    def finish_answer(self, args: dict[str, Any]) -> str:
        value = args.get("report" if "report" in args else "answer", "")
        return value if isinstance(value, str) else str(value)

    # -- tools

    def _web(self, config: dict[str, Any]) -> WebToolset:
        return episode_toolset(config)

    def execute_tool(self, name: str, args: dict[str, Any], sandbox: Any, config: dict[str, Any], *,
                     timeout: float | None = None) -> ToolResult:
        if name == "explore":
            if not scene_config(config).get("explore"):
                raise ToolError("explore is not offered in this task")
            return self._explore(str(args.get("question") or ""), config)
        return self._web(config).execute(name, args, timeout=timeout)

    def _explore(self, question: str, config: dict[str, Any]) -> ToolResult:
        if not question.strip():
            raise ToolError("question is empty")
        ctx = current_episode()
        child_scene = {k: v for k, v in scene_config(config).items() if k in ("web", "browse")}
        child_config = {
            **{k: v for k, v in config.items() if k not in ("scene_config", "prompt", "system_prompt_extra")},
            "scene": SCENE, "prompt": EXPLORE_PROMPT + question, "scene_config": child_scene,
            "max_steps": int(scene_config(config).get("explore_max_steps") or DEFAULT_EXPLORE_STEPS),
        }
        child = ctx.run_subepisode(child_config, label="explore")
        finish = _finish_args(child.steps)
        opened = sorted(opened_urls(child.steps))
        summary = child.final_answer if child.outcome == "success" else ""
        record = {"label": getattr(child, "label", "") or "explore", "outcome": child.outcome,
                  "steps": len(child.steps), "opened": opened, "sources": finish.get("sources") or [],
                  "tokens": child.total_tokens}
        if not summary:
            raise ToolError(f"the explorer ended without a summary ({child.outcome}: {child.outcome_reason})")
        lines = [summary, "", "Pages the explorer read:", *[f"- {u}" for u in opened]]
        return ToolResult(output="\n".join(lines), extra={"explore": record})

    # -- grading

    def verify(self, sandbox: Any, config: dict[str, Any], final_answer: str) -> tuple[float | None, dict[str, Any]]:
        ctx = current_episode()
        steps = ctx.all_steps
        own_finish = _finish_args(ctx.steps)
        cited = [str(u) for u in (own_finish.get("sources") or []) if isinstance(u, str) and u.strip()]
        opened = opened_urls(steps)
        sc = scene_config(config)
        web = web_toolset(config, steps=steps)  # knows the live pages its explore sub-episodes fetched too
        golds = [g for g in [sc.get("expected_answer") or "", *(sc.get("aliases") or [])] if g.strip()]
        sources = check_sources(cited, opened, web.page_text, golds)
        unread = [s["url"] for s in sources if not (s["opened"] and s["exists"])]
        cited_ok = not unread
        process: dict[str, dict[str, Any]] = {"sources_opened": _condition(
            bool(sources) and cited_ok, "no source cited" if not sources else
            f"cited but never opened in this episode (or no such page): {', '.join(unread[:3])}")}
        output: dict[str, Any] = {"opened": sorted(opened), "sources": sources, "process": process}
        if _report_mode(config):
            report = {**REPORT_DEFAULTS, **(sc.get("report") or {})}
            words = word_count(final_answer)
            checks = {
                "cited_pages_opened": cited_ok,
                "enough_sources": len(sources) >= int(report["min_sources"]),
                "length_ok": int(report["min_words"]) <= words <= int(report["max_words"]),
            }
            passed = all(checks.values())
            if not sources and int(report["min_sources"]) == 0:
                process.pop("sources_opened")  # nothing to cite, nothing to have opened
            output.update(mode="report", words=words, bounds=report, checks=checks,
                          passed=sum(checks.values()), total=len(checks), reward=1.0 if passed else 0.0,
                          decided_by=next((k for k, v in checks.items() if not v), "checks"))
            if not passed:
                output["note"] = "failed: " + ", ".join(k for k, v in checks.items() if not v)
            return output["reward"], output
        if not golds:
            output.update(mode="answer", note="no expected_answer: not graded")
            return None, output
        require = bool(sc.get("require_sources", True))
        em = exact_match(final_answer, golds)
        process["sources_opened"]["relaxed"] = not require
        supporting = [s["url"] for s in sources if s["opened"] and s["exists"] and s["contains_answer"]]
        process["answer_in_sources"] = _condition(
            bool(supporting), f"no opened page cited holds {golds[0]!r} (or an alias)",
            relaxed=not (require and sc.get("require_answer_in_sources", True)))
        failed = [name for name, c in process.items() if not c["ok"] and not c["relaxed"]]
        reward = 1.0 if em and not failed else 0.0
        output.update(
            mode="answer", em=float(em), f1=token_f1(final_answer, golds),
            normalized_answer=normalize_answer(final_answer), normalized_expected=[normalize_answer(g) for g in golds],
            sources_ok=process["sources_opened"]["ok"], require_sources=require,
            decided_by="exact_match" if not em or not failed else failed[0], reward=reward,
            passed=int(reward == 1.0), total=1,
        )
        if reward != 1.0:
            why = [] if em else [f"the answer does not match {golds[0]!r} (or an alias)"]
            why += [process[name]["detail"] for name in failed]
            output["note"] = "; ".join(why)
        return reward, output


def _condition(ok: bool, detail: str, *, relaxed: bool = False) -> dict[str, Any]:
    """One process condition, in the shape every scene's verifier_output["process"] uses."""
    return {"ok": bool(ok), "detail": "" if ok else detail[:300], "relaxed": bool(relaxed)}


def _finish_args(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The arguments of the episode's finish call (its last successful one)."""
    for step in reversed(steps or []):
        if step.get("tool") == "finish" and not step.get("error") and isinstance(step.get("arguments"), dict):
            return step["arguments"]
    return {}

