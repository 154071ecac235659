"""Build the search2qa examples: seeds over the Debian corpus and the offline model's script for every stage.

    python3 examples/search2qa/build.py            # after editing a seed, a pair or a script here
    .venv/bin/python examples/search2qa/build.py --check   # also: every quote and url against the corpus

Writes
- examples/search2qa/tasks.jsonl: one search2qa task per seed (a person, a hacker-culture term, a
  Python stdlib feature, and one whose question a model knows without searching), each with its
  explore script as `reference_solution` (the offline model finds it by the task's prompt);
- examples/search2qa/scripts.json: the other stages' scripts: each evolve round and the no-tool
  solver by their key line `[pipeline:search2qa/<stage> key=seed=<slug> round=<n>]`, the deep_search
  solver by the final question (the emitted task's prompt, so the same script answers a re-run).

The corpus is `debian-docs` (manage.py corpus_build debian-docs --from debian; `make demo`), whose
URLs are stable across builds. `--check` needs it built (WEB_CORPUS_DIR) and Django set up.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

FOLDOC, JARGON, PYDOC = "https://foldoc.example/", "https://jargon.example/", "https://docs.python.org/3.11/"
LOVELACE, BABBAGE, ADA = FOLDOC + "ada_lovelace", FOLDOC + "charles_babbage", FOLDOC + "ada"
TMRC, SCRAM, FOO, METAVAR = JARGON + "tmrc", JARGON + "scram_switch", JARGON + "foo", JARGON + "metasyntactic_variable"
TASKS_PAGE, WHATSNEW = PYDOC + "library/asyncio-task.html", PYDOC + "whatsnew/3.11.html"


def call(name: str, thought: str = "", **arguments: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"tool_calls": [{"name": name, "arguments": arguments}]}
    if thought:
        step["thought"] = thought
    return step


def ev(url: str, quote: str) -> dict[str, str]:
    return {"url": url, "quote": quote}


def slug(seed: str) -> str:  # apps.engines.scenes.search2qa.prompts.seed_slug, without importing Django
    return re.sub(r"[^a-z0-9]+", "-", seed.lower()).strip("-")[:60] or "seed"


def key(stage: str, seed: str, round_: int) -> str:  # apps.engines.offline_model.script_key(search2qa.prompts.stage_route(...))
    return f"[pipeline:search2qa/{stage} key=seed={slug(seed)} round={round_}]"


# Each seed: the explore steps and its pair, the evolve rounds (pages opened, the evolved pair, what
# changed), the no-tool solver's answer, and the deep_search solver's steps for the final question.
ADA_Q0 = ("Lord Byron's daughter, called the world's first programmer, cooperated with an inventor on the design "
          "of his mechanical computing engines. In which town was that inventor born?")
ADA_Q1 = ("A Romantic poet's daughter, often called the first programmer, cooperated with an inventor on mechanical "
          "computing engines in the mid-1800s. In which town was that inventor born?")
ADA_Q2 = ("A Pascal-descended programming language made mandatory for defence software is named after a woman who "
          "worked with an inventor on his mechanical computing engines. In which town was that inventor born?")
ADA_EVIDENCE = [ev(LOVELACE, "The daughter of Lord Byron, who became the world's first programmer while cooperating "
                             "with Charles Babbage on the design of his mechanical computing engines"),
                ev(BABBAGE, "Babbage was born on December 26, 1791 in Teignmouth, Devonshire UK.")]
ADA_EVIDENCE_2 = [ev(ADA, "(After Ada Lovelace) A Pascal-descended language"),
                  ev(ADA, "made mandatory for Department of Defense software projects by the Pentagon"),
                  *ADA_EVIDENCE]

TMRC_Q0 = ("Emergency-power-off switches are named with a backronym credited to Enrico Fermi. At which club at MIT "
           "were such switches called foo switches?")
TMRC_Q1 = ("Emergency-power-off switches are named with a backronym credited to a famous nuclear physicist. At which "
           "club of a Cambridge, Massachusetts university were they named after the first word on the standard list "
           "of metasyntactic variables?")
TMRC_EVIDENCE = [ev(SCRAM, "“Scram” was in origin a backronym for “Safety Cut Rope Axe Man” coined by Enrico Fermi "
                           "himself."),
                 ev(TMRC, "at TMRC the scram switches are therefore called foo switches.")]
TMRC_EVIDENCE_1 = [*TMRC_EVIDENCE, ev(FOO, "First on the standard list of metasyntactic variables used in syntax "
                                          "examples.")]

TG_Q0 = ("When tasks in asyncio's TaskGroup fail, their exceptions are combined into an exception group. Which PEP "
         "introduced exception groups in the Python release that added TaskGroup?")
TG_Q1 = ("An asyncio context manager new in Python 3.11 waits for a group of tasks and combines their failures into a "
         "single grouped exception. Which proposal introduced that kind of exception?")
TG_EVIDENCE = [ev(TASKS_PAGE, "those exceptions are combined in an ExceptionGroup or BaseExceptionGroup"),
               ev(WHATSNEW, "Added the TaskGroup class, an asynchronous context manager holding a group of tasks"),
               ev(WHATSNEW, "PEP 654: Exception Groups and except*")]

FOO_Q0 = "Which word is first on the standard list of metasyntactic variables used in syntax examples?"
FOO_EVIDENCE = [ev(FOO, "First on the standard list of metasyntactic variables used in syntax examples."),
                ev(METAVAR, "The word foo is the canonical example.")]

SEEDS: list[dict[str, Any]] = [
    {"seed": "Ada Lovelace", "kind": "a person", "config": {"qa_mode": "question", "max_evolutions": 2},
     "explore": [call("search", "Start from the seed.", query="Ada Lovelace"),
                 call("open", url=LOVELACE),
                 call("open", "She worked with Charles Babbage: follow the link.", url=BABBAGE)],
     "qa": {"question": ADA_Q0, "answer": "Teignmouth", "evidence": ADA_EVIDENCE,
            "reasoning": "Lovelace (Byron's daughter) worked with Babbage on his engines; Babbage was born in "
                         "Teignmouth."},
     "evolve": [([], {"question": ADA_Q1, "answer": "Teignmouth", "evidence": ADA_EVIDENCE,
                      "changed": ["Lord Byron -> a Romantic poet", "added a period (the mid-1800s)"]}),
                ([ADA], {"question": ADA_Q2, "answer": "Teignmouth", "evidence": ADA_EVIDENCE_2,
                         "changed": ["the woman is now reached through the language named after her",
                                     "dropped 'first programmer', a direct search cue"]})],
     "no_tool": "London",
     "solve": [call("search", query="Pascal-descended language mandatory defence software named after a woman"),
               call("open", "The Ada language is named after Ada Lovelace.", url=ADA),
               call("open", url=LOVELACE),
               call("open", "Lovelace worked with Charles Babbage; where was he born?", url=BABBAGE),
               call("finish", answer="Teignmouth", sources=[ADA, LOVELACE, BABBAGE])]},
    {"seed": "TMRC", "kind": "a hacker-culture term", "config": {"qa_mode": "answer", "max_evolutions": 1},
     "explore": [call("search", "The seed is the answer: find facts that point to it.", query="TMRC"),
                 call("open", url=TMRC),
                 call("open", "The scram switches link to their own entry.", url=SCRAM)],
     "qa": {"question": TMRC_Q0, "answer": "TMRC", "aliases": ["Tech Model Railroad Club"], "evidence": TMRC_EVIDENCE,
            "reasoning": "Scram is Fermi's backronym; at TMRC scram switches were called foo switches."},
     "evolve": [([FOO], {"question": TMRC_Q1, "answer": "TMRC", "aliases": ["Tech Model Railroad Club"],
                         "evidence": TMRC_EVIDENCE_1,
                         "changed": ["Enrico Fermi -> a famous nuclear physicist", "MIT -> a Cambridge, Massachusetts "
                                     "university", "foo -> the first word on the list of metasyntactic variables"]})],
     "no_tool": "The Homebrew Computer Club",
     "solve": [call("search", query="emergency power off switch backronym nuclear physicist"),
               call("open", url=SCRAM),
               call("open", "The entry points to TMRC.", url=TMRC),
               call("open", "Check that foo is first among metasyntactic variables.", url=FOO),
               call("finish", answer="TMRC", sources=[SCRAM, TMRC, FOO])]},
    {"seed": "asyncio TaskGroup", "kind": "a Python stdlib feature",
     "config": {"qa_mode": "question", "max_evolutions": 1},
     "explore": [call("search", "Start from the seed.", query="asyncio TaskGroup"),
                 call("open", url=TASKS_PAGE),
                 call("find", "How are failures reported?", url=TASKS_PAGE, pattern="ExceptionGroup"),
                 call("search", "Which release added it, and what came with it?",
                      query="Python 3.11 new features exception groups PEP"),
                 call("open", url=WHATSNEW)],
     "qa": {"question": TG_Q0, "answer": "PEP 654", "evidence": TG_EVIDENCE,
            "reasoning": "TaskGroup raises an ExceptionGroup; What's New in 3.11 lists TaskGroup and PEP 654."},
     "evolve": [([], {"question": TG_Q1, "answer": "PEP 654", "evidence": TG_EVIDENCE,
                      "changed": ["TaskGroup -> an asyncio context manager that waits for a group of tasks",
                                  "exception groups -> a single grouped exception"]})],
     "no_tool": "PEP 3156",
     "solve": [call("search", query="asyncio context manager group of tasks combines failures"),
               call("open", url=TASKS_PAGE),
               call("find", url=TASKS_PAGE, pattern="ExceptionGroup"),
               call("search", query="Python 3.11 new features exception groups PEP"),
               call("open", url=WHATSNEW),
               call("finish", answer="PEP 654", sources=[TASKS_PAGE, WHATSNEW])]},
    # The reward-0 example: a model answers this one from memory, so the difficulty gate drops it.
    {"seed": "foo", "kind": "a question too easy to keep", "config": {"qa_mode": "question", "max_evolutions": 0,
                                                                      "difficulty_check": "no_tool"},
     "task": {"max_iterations": 1},
     "explore": [call("search", "Start from the seed.", query="foo"),
                 call("open", url=FOO),
                 call("open", url=METAVAR)],
     "qa": {"question": FOO_Q0, "answer": "foo", "evidence": FOO_EVIDENCE,
            "reasoning": "The Jargon File lists foo first among metasyntactic variables."},
     "evolve": [],
     "no_tool": "foo",
     "solve": []},
]


def prompt_of(entry: dict[str, Any]) -> str:
    mode = entry["config"]["qa_mode"]
    role = "the answer" if mode == "answer" else "the topic"
    return (f"Build one hard, multi-hop question with a short, unique answer from the offline web, with the seed "
            f"«{entry['seed']}» as {role}.")


def tasks() -> list[dict[str, Any]]:
    out = []
    for entry in SEEDS:
        out.append({"external_id": f"search2qa-{slug(entry['seed'])}", "scene": "search2qa", "prompt": prompt_of(entry),
                    "config": {"seed": entry["seed"], **entry["config"]}, "max_steps": 12, "timeout_s": 600,
                    **entry.get("task", {}),
                    "reference_solution": [*entry["explore"], call("propose_qa", **entry["qa"])]})
    return out


def stage_scripts() -> list[dict[str, Any]]:
    scripts = []
    for entry in SEEDS:
        seed, qa = entry["seed"], entry["qa"]
        for n, (opens, evolved) in enumerate(entry["evolve"], 1):
            scripts.append({"id": f"search2qa-evolve-{slug(seed)}-{n}", "prompt": key("evolve", seed, n),
                            "reference_solution": [*[call("open", url=u) for u in opens], call("evolve_qa", **evolved)]})
            qa = evolved
        scripts.append({"id": f"search2qa-no-tool-{slug(seed)}", "prompt": key("no_tool", seed, 0),
                        "reference_solution": [call("answer", answer=entry["no_tool"])]})
        if entry["solve"]:
            scripts.append({"id": f"search2qa-solve-{slug(seed)}", "prompt": qa["question"],
                            "reference_solution": entry["solve"]})
    return scripts


def check() -> list[str]:
    """Every opened url exists and every quote occurs (>= 0.9) in its page of the built corpus."""
    import os

    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
    import django

    django.setup()
    from apps.engines.scenes.search2qa.gates import quote_score
    from apps.engines.web.corpus import Corpus

    corpus = Corpus.named("debian-docs")
    problems = []
    for entry in SEEDS:
        pairs = [entry["qa"], *[e for _, e in entry["evolve"]]]
        urls = {s["tool_calls"][0]["arguments"]["url"] for s in entry["explore"] + entry["solve"]
                if "url" in s["tool_calls"][0]["arguments"]}
        for url in sorted(urls | {e["url"] for p in pairs for e in p["evidence"]}):
            if corpus.page(url) is None:
                problems.append(f"{entry['seed']}: no page {url}")
        for pair in pairs:
            for e in pair["evidence"]:
                page = corpus.page(e["url"])
                if page is not None and quote_score(e["quote"], page.text) < 0.9:
                    problems.append(f"{entry['seed']}: quote not in {e['url']}: {e['quote'][:60]}")
    return problems


def main() -> None:
    (HERE / "tasks.jsonl").write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks()),
                                      encoding="utf-8")
    (HERE / "scripts.json").write_text(json.dumps(stage_scripts(), indent=1, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    print(f"{len(SEEDS)} seeds, {len(stage_scripts())} stage scripts")
    if "--check" in sys.argv[1:]:
        problems = check()
        print("\n".join(problems) or "every url and quote found in the corpus debian-docs")
        sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
