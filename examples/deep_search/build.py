"""Build the deep_search examples: multi-hop questions over the Debian corpus, with gold answers and scripts.

    python3 examples/deep_search/build.py      # after editing a question or a scripted research path here

Writes examples/tasks/deep_search.jsonl: tasks of the deep_search scene over the corpus
`debian-docs` (`manage.py corpus_build debian-docs --from debian`; `make demo` builds it), each
with its expected answer, aliases, the gold source pages, and a reference solution — the offline
model's script, found by the task's prompt: the searches and opens a researcher would make, hop
by hop along the pages' links, then finish(answer, sources). Every question needs two pages or
more. The last task's script answers wrongly (the second FOLDOC sense of Pascal's date), so the
demo shows a reward of 0 beside the 1s. tests/engines/test_deep_search_demo.py replays every
script over the real corpus and checks the rewards.
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent
CORPUS = "debian-docs"
FOLDOC = "https://foldoc.example/"
JARGON = "https://jargon.example/"


def call(name: str, thought: str = "", **arguments: object) -> dict:
    step: dict = {"tool_calls": [{"name": name, "arguments": arguments}]}
    if thought:
        step["thought"] = thought
    return step


def task(slug: str, prompt: str, answer: str, sources: list[str], solution: list[dict], *,
         aliases: tuple[str, ...] = ()) -> dict:
    config = {"expected_answer": answer, "aliases": list(aliases), "sources": sources, "require_sources": True,
              "web": {"backend": "corpus", "corpus": CORPUS}}
    row = {"external_id": f"deep-search-{slug}", "scene": "deep_search", "prompt": prompt, "config": config,
           "expected_tools": ["search", "open"], "max_steps": 10, "reference_solution": solution}
    return row


LOVELACE, ADA, BABBAGE = FOLDOC + "ada_lovelace", FOLDOC + "ada", FOLDOC + "charles_babbage"

TASKS = [
    task("ada-designed", "In what year was the programming language named after Lord Byron's daughter designed?",
         "1979", [LOVELACE, ADA], [
             call("search", "First find who Lord Byron's daughter was.", query="daughter of Lord Byron", k=3),
             call("open", "Ada Lovelace; her entry links the language named after her.", url=LOVELACE),
             call("open", url=ADA),
             call("finish", "Ichbiah's team designed Ada in 1979.", answer="1979", sources=[LOVELACE, ADA]),
         ]),
    task("babbage-birthplace",
         "In which town was the inventor born who worked with Lord Byron's daughter on mechanical computing engines?",
         "Teignmouth", [LOVELACE, BABBAGE], [
             call("search", query="Lord Byron daughter mechanical computing engines", k=3),
             call("open", url=LOVELACE),
             call("open", "She cooperated with Charles Babbage; his entry gives his birthplace.", url=BABBAGE),
             call("find", url=BABBAGE, pattern=r"born"),
             call("finish", answer="Teignmouth", sources=[LOVELACE, BABBAGE]),
         ], aliases=("Teignmouth, Devonshire",)),
    task("difference-engine-engineer",
         "Which engineer built part of the special-purpose calculating machine designed by the man Ada Lovelace "
         "worked with?", "Joseph Clement", [BABBAGE, FOLDOC + "difference_engine"], [
             call("search", query="Ada Lovelace", k=3),
             call("open", url=LOVELACE),
             call("open", url=BABBAGE),
             call("open", "His special-purpose machine was the Difference Engine.", url=FOLDOC + "difference_engine"),
             call("finish", answer="Joseph Clement", sources=[BABBAGE, FOLDOC + "difference_engine"]),
         ], aliases=("Clement",)),
    task("lucasian-chair",
         "Which chair at Cambridge was the designer of the steam-powered, punched-card Analytical Engine appointed to?",
         "Lucasian Chair of Mathematics", [FOLDOC + "analytical_engine", BABBAGE], [
             call("search", query="Analytical Engine steam punched cards", k=3),
             call("open", url=FOLDOC + "analytical_engine"),
             call("open", "Proposed by Charles Babbage: his entry has his career.", url=BABBAGE),
             call("find", url=BABBAGE, pattern="Chair"),
             call("finish", answer="Lucasian Chair of Mathematics", sources=[FOLDOC + "analytical_engine", BABBAGE]),
         ], aliases=("Lucasian Chair", "Lucasian Professor of Mathematics")),
    task("scram-backronym",
         "The MIT model railroad club the Jargon File calls a wellspring of hacker culture had emergency switches "
         "that stopped its clock. Who coined the backronym behind those switches' name?", "Enrico Fermi",
         [JARGON + "tmrc", JARGON + "scram_switch"], [
             call("search", query="model railroad club MIT hacker culture", k=3),
             call("open", url=JARGON + "tmrc"),
             call("find", "The switches are scram switches; their entry explains the name.", url=JARGON + "tmrc",
                  pattern="scram"),
             call("open", url=JARGON + "scram_switch"),
             call("finish", answer="Enrico Fermi", sources=[JARGON + "tmrc", JARGON + "scram_switch"]),
         ], aliases=("Fermi",)),
    task("ada-ancestor-designer", "Who designed the language from which the language named after Ada Lovelace descends?",
         "Niklaus Wirth", [ADA, FOLDOC + "pascal"], [
             call("search", query="language named after Ada Lovelace", k=3),
             call("open", url=ADA),
             call("open", "Ada is Pascal-descended.", url=FOLDOC + "pascal"),
             call("finish", answer="Niklaus Wirth", sources=[ADA, FOLDOC + "pascal"]),
         ], aliases=("Wirth",)),
    task("bdfl-language-year",
         "In what year was the language invented whose author the Jargon File calls its Benevolent Dictator For Life?",
         "1991", [JARGON + "bdfl", FOLDOC + "python"], [
             call("search", query="Benevolent Dictator For Life", k=3),
             call("open", url=JARGON + "bdfl"),
             call("search", "Guido van Rossum, Python's project leader.", query="Python language Guido van Rossum", k=3),
             call("open", url=FOLDOC + "python"),
             call("finish", answer="1991", sources=[JARGON + "bdfl", FOLDOC + "python"]),
         ]),
    task("jargon-maintainer-java",
         "The maintainer of the on-line hacker Jargon File was involved in a Java project. What is its short name?",
         "JOLT", [FOLDOC + "jargon_file", FOLDOC + "eric_s._raymond"], [
             call("search", query="on-line hacker Jargon File maintained", k=3),
             call("open", url=FOLDOC + "jargon_file"),
             call("open", "Maintained by Eric S. Raymond.", url=FOLDOC + "eric_s._raymond"),
             call("finish", answer="JOLT", sources=[FOLDOC + "jargon_file", FOLDOC + "eric_s._raymond"]),
         ], aliases=("Java Open Language Toolkit",)),
    task("taskgroup-version",
         "In the Python 3.11 documentation, the API called a more modern alternative to asyncio.create_task() "
         "was new in which Python version?", "3.11",
         ["https://docs.python.org/3.11/library/asyncio-task.html"], [
             call("search", query="asyncio TaskGroup create_task modern alternative", k=3),
             call("open", url="https://docs.python.org/3.11/library/asyncio-task.html"),
             call("find", url="https://docs.python.org/3.11/library/asyncio-task.html",
                  pattern=r"New in version .*TaskGroup"),
             call("finish", answer="3.11", sources=["https://docs.python.org/3.11/library/asyncio-task.html"]),
         ], aliases=("Python 3.11",)),
    task("pascal-year-wrong",
         "Around what year was the language designed that the language named after Ada Lovelace descends from, "
         "according to its FOLDOC entry's first sense?", "1970", [ADA, FOLDOC + "pascal"], [
             call("search", query="language named after Ada Lovelace", k=3),
             call("open", url=ADA),
             call("open", url=FOLDOC + "pascal"),
             call("finish", "Reads the second sense's date instead of the first's.", answer="1968",
                  sources=[ADA, FOLDOC + "pascal"]),
         ]),  # wrong on purpose: the demo's reward-0 trajectory
]


def main() -> None:
    out = EXAMPLES / "tasks" / "deep_search.jsonl"
    out.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in TASKS), encoding="utf-8")
    print(f"{len(TASKS)} deep_search tasks -> {out.relative_to(EXAMPLES.parent)}")


if __name__ == "__main__":
    main()
