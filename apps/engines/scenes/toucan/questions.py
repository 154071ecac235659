"""Question synthesis for the toucan scene: sampling, prompts, parsing, sanitising, dedup, quality check.

Modelled on Toucan (TheAgentArk/Toucan, step 1 and 2; the prompts here are our own words):

    plans = plan_questions(servers, {"mode": "single_server", "sampling": "uniform", "num_tools": 2,
                                     "total": 6}, rng=random.Random(7))
    QUESTION.user({"plan": plan})                     # the generation prompt
    parsed = parse_question(answer)                   # {"server_analysis", "target_tools", "question"}
    question = sanitise(parsed, plan, settings)       # QuestionRejected with the reason
    kept = dedup_questions(batch, earlier, threshold=0.85)
    QC.user({...}); assessment = parse_qc(answer)     # QcUnparseable: the question is rejected
    qc_verdict(assessment, thresholds)                # (passed, reasons)

A *server record* is what the registry gives for one registered server: {"name", "description",
"labels": {"primary_label", "secondary_labels", "featured"}, "rank" (usage rank, 1 = most used,
optional), "tools": [{"name", "description", "input_schema"}]} — the tool snapshot taken from the
server's own tools/list at registration.

Sampling (Toucan's step 1.1). Single-server mode picks one server per question by `sampling`:
`random` (uniform draws), `uniform` (`samples_per_server` per server, shuffled and cut to `total`,
topped up round-robin), `power_law` (weight 1 / rank^alpha, rank = the record's `rank`, else its
position in the list; alpha `power_law_alpha`, default 0.5) or `featured` (random among servers
labelled featured). Multi-server mode (num_tools >= 2) picks `servers_per_question` servers
(default max(2, min(num_tools, servers))) by `allocation`: `random`, `same_primary_label` (a random
seed server and others sharing its primary label), `different_primary_labels` (one server from
each of that many distinct primary labels) or `random_featured` (among servers labelled featured). Where a label-based allocation cannot be met (too few
servers share a label; too few labels), the plan is refused with the reason: unlike Toucan, which
falls back to a random draw, a batch never silently changes strategy.

Sanitising: target tools must exist on the plan's servers, be distinct and exactly `num_tools`
many, span at least two servers in multi-server mode; the question is between `min_chars` and
`max_chars` long, names no tool (a `<server>__<tool>` name, or a bare tool name that is an
identifier — one with "_" or an inner capital; a one-word name such as "fetch" is ordinary English
and allowed), and is not a refusal ("I cannot", "I'm sorry", …).

Dedup: MiniLM embeddings (the bundled all-MiniLM-L6-v2 of apps.engines.embeddings, which dataset
dedup shares; one copy per process; vectors read from its embedding store, so earlier questions are
embedded once, not on every run), cosine >= threshold (default 0.85) to a question kept before it in the batch, or to
an earlier question for the same set of servers, drops it.

Quality check (Toucan's step 2): six dimensions, each with its reasoning written before its
rating, rated on Toucan's five-label scales and stored as 1-5. An answer that lacks a dimension,
its reasoning or a known rating is unparseable: the question is REJECTED, never passed.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from apps.engines.embeddings import Embedder, embed_stored, sentence_embedder
from apps.engines.generation import Template
from apps.engines.mcp.spec import SEPARATOR

TEMPLATE_VERSION = "1"
MODES = ("single_server", "multi_server")
SAMPLINGS = ("random", "uniform", "power_law", "featured")
ALLOCATIONS = ("random", "same_primary_label", "different_primary_labels", "random_featured")
DEFAULT_DEDUP_THRESHOLD = 0.85
DEDUP_BLOCK = 256
DEFAULT_MIN_CHARS = 20
DEFAULT_MAX_CHARS = 2000
MAX_TOOLS = 8
REFUSALS = ("i cannot", "i can't", "i'm unable", "i am unable", "i apologize", "i'm sorry", "please provide",
            "could you please", "i need more information")
_IDENTIFIER = re.compile(r"_|[a-z][A-Z]")

# Toucan's six dimensions and their scales, worst (1) to best (5).
QC_SCALES: dict[str, tuple[str, ...]] = {
    "tool_selection_difficulty": ("very easy", "easy", "medium", "hard", "very hard"),
    "tool_selection_uniqueness": ("not unique", "somewhat unique", "moderately unique", "quite unique",
                                  "highly unique"),
    "question_quality": ("very poor", "poor", "average", "good", "excellent"),
    "scenario_realism": ("unrealistic", "somewhat unrealistic", "moderately realistic", "realistic",
                         "highly realistic"),
    "verifiable": ("hard to verify", "somewhat hard", "moderately verifiable", "mostly verifiable",
                   "easy to verify"),
    "stability": ("highly unstable", "somewhat unstable", "moderately stable", "mostly stable", "highly stable"),
}
QC_DIMENSIONS = tuple(QC_SCALES)
# Minimum score per dimension (1-5) a question needs; a run's config may change them.
DEFAULT_QC_THRESHOLDS = {"question_quality": 3, "scenario_realism": 3, "verifiable": 2, "stability": 3}


class PlanError(ValueError):
    """Sampling settings that cannot be met by the registered servers (the message says why)."""


class QuestionRejected(ValueError):
    """A generated question that does not pass sanitising (the message says why)."""


class QcUnparseable(ValueError):
    """A quality-check answer that cannot be read: the question is rejected."""


# -- sampling -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplingSettings:
    mode: str = "single_server"
    sampling: str = "random"
    allocation: str = "random"
    num_tools: int = 1
    total: int = 1
    samples_per_server: int = 1
    power_law_alpha: float = 0.5
    servers_per_question: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingSettings":
        known = set(cls.__dataclass_fields__)
        settings = cls(**{k: v for k, v in data.items() if k in known})
        settings.validate()
        return settings

    def validate(self) -> None:
        def whole(name: str, low: int, high: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise PlanError(f"{name} must be a whole number from {low} to {high}, got {value!r}")

        if self.mode not in MODES:
            raise PlanError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.sampling not in SAMPLINGS:
            raise PlanError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}")
        if self.allocation not in ALLOCATIONS:
            raise PlanError(f"allocation must be one of {', '.join(ALLOCATIONS)}, got {self.allocation!r}")
        whole("num_tools", 1, MAX_TOOLS)
        whole("total", 1, 10_000)
        whole("samples_per_server", 1, 1000)
        if self.servers_per_question is not None:
            whole("servers_per_question", 2, 20)
        if self.mode == "multi_server" and self.num_tools < 2:
            raise PlanError("multi_server mode needs num_tools >= 2")
        if self.mode == "single_server" and self.allocation != "random":
            raise PlanError(f"allocation {self.allocation!r} is for multi_server mode")
        if self.mode == "multi_server" and self.sampling != "random":
            raise PlanError(f"sampling {self.sampling!r} is for single_server mode (multi_server uses allocation)")
        alpha = self.power_law_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 10:
            raise PlanError(f"power_law_alpha must be a number from 0 to 10, got {alpha!r}")


def _weights(servers: list[dict[str, Any]], alpha: float) -> list[float]:
    weights = []
    for position, server in enumerate(servers, 1):
        rank = server.get("rank")
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1 else position
        weights.append(1.0 / rank ** alpha)
    return weights


def _single_servers(servers: list[dict[str, Any]], s: SamplingSettings, rng: random.Random) -> list[dict[str, Any]]:
    if s.sampling == "random":
        return [rng.choice(servers) for _ in range(s.total)]
    if s.sampling == "uniform":
        picked = [server for server in servers for _ in range(s.samples_per_server)]
        if len(picked) > s.total:
            rng.shuffle(picked)
            return picked[:s.total]
        return picked + [servers[i % len(servers)] for i in range(s.total - len(picked))]
    if s.sampling == "power_law":
        return rng.choices(servers, weights=_weights(servers, s.power_law_alpha), k=s.total)
    featured = [server for server in servers if (server.get("labels") or {}).get("featured")]
    if not featured:
        raise PlanError("featured sampling: no registered server is labelled featured")
    return [rng.choice(featured) for _ in range(s.total)]


def _primary(server: dict[str, Any]) -> str:
    return str((server.get("labels") or {}).get("primary_label") or "")


def _multi_servers(servers: list[dict[str, Any]], s: SamplingSettings, rng: random.Random) -> list[dict[str, Any]]:
    if len(servers) < 2:
        raise PlanError("multi_server mode needs at least two servers")
    count = min(s.servers_per_question or max(2, min(s.num_tools, len(servers))), len(servers))
    if s.allocation == "random":
        return rng.sample(servers, count)
    if s.allocation == "random_featured":
        featured = [server for server in servers if (server.get("labels") or {}).get("featured")]
        if len(featured) < 2:
            raise PlanError("random_featured: fewer than two servers are labelled featured")
        return rng.sample(featured, min(count, len(featured)))
    if s.allocation == "same_primary_label":
        seed = rng.choice(servers)
        label = _primary(seed)
        same = [server for server in servers if label and _primary(server) == label]
        if len(same) < 2:
            raise PlanError(f"same_primary_label: fewer than two servers share the primary label of "
                            f"{seed['name']!r} ({label or 'none'})")
        return rng.sample(same, min(count, len(same)))
    by_label: dict[str, list[dict[str, Any]]] = {}
    for server in servers:
        if _primary(server):
            by_label.setdefault(_primary(server), []).append(server)
    if len(by_label) < 2:
        raise PlanError("different_primary_labels: the servers have fewer than two primary labels")
    labels = rng.sample(sorted(by_label), min(count, len(by_label)))
    return [rng.choice(by_label[label]) for label in labels]


def plan_questions(servers: list[dict[str, Any]], settings: dict[str, Any] | SamplingSettings, *,
                   rng: random.Random, prefix: str = "q") -> list[dict[str, Any]]:
    """One plan per question to generate: {"id", "mode", "num_tools", "strategy", "servers"} with
    the server records it may use. PlanError when the settings cannot be met."""
    s = settings if isinstance(settings, SamplingSettings) else SamplingSettings.from_dict(settings)
    usable = [server for server in servers if server.get("tools")]
    if not usable:
        raise PlanError("no registered server with tools to generate questions for")
    plans = []
    if s.mode == "single_server":
        for i, server in enumerate(_single_servers(usable, s, rng)):
            if len(server["tools"]) < s.num_tools:
                raise PlanError(f"server {server['name']!r} has {len(server['tools'])} tools, fewer than "
                                f"num_tools={s.num_tools}")
            plans.append({"id": f"{prefix}{i}", "mode": s.mode, "num_tools": s.num_tools,
                          "strategy": s.sampling, "servers": [server]})
    else:
        for i in range(s.total):
            picked = _multi_servers(usable, s, rng)
            if sum(len(server["tools"]) for server in picked) < s.num_tools:
                raise PlanError(f"servers {[p['name'] for p in picked]} have fewer than {s.num_tools} tools in all")
            plans.append({"id": f"{prefix}{i}", "mode": s.mode, "num_tools": s.num_tools,
                          "strategy": s.allocation, "servers": picked})
    return plans


# -- the generation prompt ------------------------------------------------------------------

def _tool_lines(server: dict[str, Any]) -> str:
    return "\n".join(f"{i}. **{tool['name']}**: {(tool.get('description') or 'no description').strip()}"
                     for i, tool in enumerate(server["tools"], 1))


def _server_block(server: dict[str, Any]) -> str:
    return (f"### {server['name']}\n{(server.get('description') or 'No description.').strip()}\n\n"
            f"Tools:\n{_tool_lines(server)}")


def question_prompt(inputs: dict[str, Any]) -> str:
    plan = inputs["plan"]
    n, multi = plan["num_tools"], plan["mode"] == "multi_server"
    need = "one of these tools" if n == 1 else f"exactly {n} tools"
    lines = [
        "## What to write",
        f"Write one question a real user might ask that can only be answered by calling {need} of the MCP "
        + ("servers below, with tools from at least two different servers." if multi else "server below."),
        "",
        "## How",
        "- Think of a real need: a person with a concrete goal, facts and constraints, asking in their own words.",
        "- The question must give every value the tools need (names, times, paths, ids, URLs): the person "
        "asking has them, nobody can look them up for the agent.",
        "- Prefer questions whose answer does not change with the date, the place or the machine.",
        "- Never write a tool's name or a server's name in the question; describe the need instead.",
        (f"- The {n} tools should depend on each other: the output of one feeds the next." if n > 1 else
         "- The question should be specific enough that the tool is clearly needed."),
        "",
        "## Servers" if multi else "## Server",
        "",
        "\n\n".join(_server_block(server) for server in plan["servers"]),
        "",
        "## Answer",
        "Answer with one JSON object and nothing else, its keys in this order: \"server_analysis\" (what the "
        "tools do and how they can work together), \"target_tools\" (the tools in the order they would be "
        "called, each {\"server\": ..., \"tool\": ...}), \"question\" (the user's question).",
        "",
        '{"server_analysis": "...", "target_tools": [{"server": "' + plan["servers"][0]["name"] + '", "tool": "..."}], '
        '"question": "..."}',
    ]
    return "\n".join(lines)


QUESTION = Template(id="toucan/question", version=TEMPLATE_VERSION, user=question_prompt,
                    system="You write realistic tool-use questions for training AI agents. You follow the "
                           "requested output format exactly.")


# -- parsing ------------------------------------------------------------------------------
# The pipeline runner reads a stage's answer as JSON (apps/engines/pipelines/runner.py); the answers
# keep Toucan's XML elements as keys, in its order (analysis first; reasoning before each rating).

def parse_question(value: Any) -> dict[str, Any]:
    """The generation answer as {"server_analysis", "target_tools": [{"server", "tool"}], "question"};
    ValueError naming what is missing or malformed."""
    if not isinstance(value, dict):
        raise ValueError(f"the answer must be a JSON object, got {type(value).__name__}")
    question = value.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the answer has no question (a non-empty string)")
    listed = value.get("target_tools")
    if not isinstance(listed, list) or not listed:
        raise ValueError("target_tools must be a non-empty list of {server, tool}")
    tools = []
    for i, entry in enumerate(listed):
        if isinstance(entry, str):
            entry = {"server": "", "tool": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("tool"), str) or not entry["tool"].strip() \
                or not isinstance(entry.get("server", ""), str):
            raise ValueError(f"target_tools[{i}] must be {{server, tool}} with string values, got {entry!r}")
        tools.append({"server": entry.get("server", "").strip(), "tool": entry["tool"].strip()})
    analysis = value.get("server_analysis", "")
    return {"server_analysis": analysis if isinstance(analysis, str) else "", "target_tools": tools,
            "question": question.strip()}


def _resolve(entry: dict[str, str], servers: list[dict[str, Any]]) -> str:
    """`<server>__<tool>` for one target tool entry; QuestionRejected when no plan server has it."""
    server, tool = entry.get("server") or "", entry.get("tool") or ""
    if SEPARATOR in tool and not server:
        server, tool = tool.split(SEPARATOR, 1)
    candidates = [s for s in servers if (not server or s["name"] == server)
                  and any(t["name"] == tool for t in s["tools"])]
    if not candidates:
        where = f"server {server!r}" if server else f"the servers {', '.join(s['name'] for s in servers)}"
        raise QuestionRejected(f"target tool {tool!r} does not exist on {where}")
    if len(candidates) > 1:
        raise QuestionRejected(f"target tool {tool!r} is on several servers; name its server")
    return f"{candidates[0]['name']}{SEPARATOR}{tool}"


def names_a_tool(question: str, servers: list[dict[str, Any]]) -> str | None:
    """The tool name the question mentions, if any (see the module doc for which names count)."""
    lowered = question.casefold()
    for server in servers:
        for tool in server["tools"]:
            name = tool["name"]
            full = f"{server['name']}{SEPARATOR}{name}".casefold()
            if full in lowered:
                return f"{server['name']}{SEPARATOR}{name}"
            if _IDENTIFIER.search(name) and re.search(rf"(?<![\w]){re.escape(name.casefold())}(?![\w])", lowered):
                return name
    return None


def sanitise(parsed: dict[str, Any], plan: dict[str, Any], *, min_chars: int = DEFAULT_MIN_CHARS,
             max_chars: int = DEFAULT_MAX_CHARS) -> dict[str, Any]:
    """The question and its `<server>__<tool>` target tools, or QuestionRejected with the reason."""
    servers = plan["servers"]
    question = re.sub(r"\s+", " ", parsed.get("question") or "").strip()
    if not min_chars <= len(question) <= max_chars:
        raise QuestionRejected(f"the question has {len(question)} characters, outside {min_chars}..{max_chars}")
    if any(refusal in question.casefold() for refusal in REFUSALS):
        raise QuestionRejected("the question reads as a refusal or a request for more information")
    targets = [_resolve(entry, servers) for entry in parsed.get("target_tools") or []]
    if len(set(targets)) != len(targets):
        raise QuestionRejected(f"target tools repeat: {targets}")
    if len(targets) != plan["num_tools"]:
        raise QuestionRejected(f"{len(targets)} target tools, the plan asks for exactly {plan['num_tools']}")
    used_servers = sorted({t.split(SEPARATOR, 1)[0] for t in targets})
    if plan["mode"] == "multi_server" and len(used_servers) < 2:
        raise QuestionRejected("a multi-server question must use tools of at least two servers")
    named = names_a_tool(question, servers)
    if named:
        raise QuestionRejected(f"the question names the tool {named!r}")
    return {"question": question, "target_tools": targets, "target_servers": [s["name"] for s in servers],
            "server_analysis": parsed.get("server_analysis") or ""}


# -- dedup --------------------------------------------------------------------------------

def dedup_questions(batch: list[tuple[str, str]], earlier: Sequence[str] = (), *,
                    threshold: float = DEFAULT_DEDUP_THRESHOLD,
                    embedder: Embedder | None = None) -> dict[str, str | None]:
    """For each (key, question) of the batch in order: None (kept) or why it is a near duplicate
    (cosine >= threshold to an earlier question or to one kept before it in the batch)."""
    if not 0 < threshold <= 1:
        raise ValueError(f"the dedup threshold must be in (0, 1], got {threshold!r}")
    if not batch:
        return {}
    if embedder is None:
        embedder = sentence_embedder  # the one MiniLM copy per process
    texts = [q for _, q in batch] + list(earlier)
    # Through the embedding store: the earlier questions (asked again on every run) are read, not embedded.
    vectors = np.asarray(embed_stored(texts, embedder=embedder), dtype=np.float32)
    ours, theirs = vectors[:len(batch)], vectors[len(batch):]
    verdicts: dict[str, str | None] = {}
    # Greedy in batch order, a block at a time so the cosines are matrix products: each question
    # against the earlier ones and against those kept before it (earlier blocks, then its own).
    kept_vectors = np.empty_like(ours)
    kept_keys: list[str] = []
    for start in range(0, len(batch), DEDUP_BLOCK):
        block = ours[start:start + DEDUP_BLOCK]
        to_earlier = theirs @ block.T if len(theirs) else None
        to_kept = kept_vectors[:len(kept_keys)] @ block.T if kept_keys else None
        inner = block @ block.T
        kept_here: list[int] = []
        for j in range(len(block)):
            key, reason = batch[start + j][0], None
            if to_earlier is not None:
                best = int(np.argmax(to_earlier[:, j]))
                if to_earlier[best, j] >= threshold:
                    reason = (f"near duplicate of an earlier question for the same servers (cosine "
                              f"{float(to_earlier[best, j]):.3f}, threshold {threshold:g}): {earlier[best][:120]!r}")
            if reason is None:
                candidates = []
                if to_kept is not None:
                    best = int(np.argmax(to_kept[:, j]))
                    candidates.append((float(to_kept[best, j]), kept_keys[best]))
                if kept_here:
                    here = inner[kept_here, j]
                    candidates.append((float(here.max()), batch[start + kept_here[int(np.argmax(here))]][0]))
                cosine, other = max(candidates, default=(-1.0, ""))
                if cosine >= threshold:
                    reason = f"near duplicate of {other} in this batch (cosine {cosine:.3f}, threshold {threshold:g})"
            verdicts[key] = reason
            if reason is None:
                kept_vectors[len(kept_keys)] = block[j]
                kept_keys.append(key)
                kept_here.append(j)
    return verdicts


# -- the quality check --------------------------------------------------------------------

_QC_WHAT = {
    "tool_selection_difficulty": "how hard it is to work out, from all the tools listed, which ones the question "
                                 "needs (very easy: the question all but names them)",
    "tool_selection_uniqueness": "how much the intended tools, in their order, are the only good way to answer "
                                 "(not unique: many other combinations would do as well)",
    "question_quality": "how clear, specific and well written the question is as a real user's request",
    "scenario_realism": "how believable the situation is as something a real person would need",
    "verifiable": "how easily a correct final answer can be checked (easy to verify: an exact value or a clear "
                  "success criterion)",
    "stability": "how little the answer depends on when, where or on which system the question is asked",
}


def qc_prompt(inputs: dict[str, Any]) -> str:
    servers = inputs["servers"]
    lines = [
        "## What to do",
        "Assess the quality of a tool-use question on the six dimensions below. For each, write your reasoning "
        "first and only then the rating, which must be one of the listed labels, verbatim.",
        "",
    ]
    for n, (dim, scale) in enumerate(QC_SCALES.items(), 1):
        lines.append(f"{n}. {dim}: {_QC_WHAT[dim]}. Labels, worst to best: {', '.join(scale)}.")
    lines += [
        "",
        "## All available tools",
        "",
        "\n\n".join(_server_block(server) for server in servers),
        "",
        "## The question",
        inputs["question"],
        "",
        "## The tools it is meant to need, in order",
        ", ".join(inputs["target_tools"]),
        "",
        "## Answer",
        "Answer with one JSON object and nothing else: one key per dimension, in the order above, each "
        "{\"reasoning\": ..., \"rating\": ...} with the reasoning first.",
        "",
        "{" + ", ".join(f'"{dim}": {{"reasoning": "...", "rating": "{scale[2]}"}}' for dim, scale in QC_SCALES.items())
        + "}",
    ]
    return "\n".join(lines)


QC = Template(id="toucan/qc", version=TEMPLATE_VERSION, user=qc_prompt,
              system="You are a strict reviewer of tool-use training questions. You follow the requested output "
                     "format exactly.")


def _rating_score(dim: str, rating: str | int) -> int | None:
    text = re.sub(r"\s+", " ", str(rating)).strip().casefold().rstrip(".")
    if text in QC_SCALES[dim]:
        return QC_SCALES[dim].index(text) + 1
    if re.fullmatch(r"[1-5]", text):
        return int(text)
    return None


def parse_qc(value: Any) -> dict[str, Any]:
    """The quality check as {dimension: {"reasoning", "rating", "score"}, ..., "overall_score"};
    QcUnparseable naming the first dimension that is missing or unreadable."""
    if not isinstance(value, dict):
        raise QcUnparseable(f"the quality check must be a JSON object, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for dim in QC_DIMENSIONS:
        block = value.get(dim)
        if not isinstance(block, dict):
            raise QcUnparseable(f"the quality check has no {dim} object")
        reasoning, rating = block.get("reasoning"), block.get("rating")
        if not isinstance(reasoning, str) or not reasoning.strip():
            raise QcUnparseable(f"{dim} has no reasoning")
        score = _rating_score(dim, rating) if isinstance(rating, (str, int)) and not isinstance(rating, bool) else None
        if score is None:
            raise QcUnparseable(f"{dim} has no rating among: {', '.join(QC_SCALES[dim])} (got {rating!r})")
        keys = [k for k in block if k in ("reasoning", "rating")]
        if keys != ["reasoning", "rating"]:
            raise QcUnparseable(f"{dim}: the rating comes before the reasoning")
        out[dim] = {"reasoning": reasoning.strip(), "rating": str(rating).strip(), "score": score}
    out["overall_score"] = round(sum(out[d]["score"] for d in QC_DIMENSIONS) / len(QC_DIMENSIONS), 3)
    return out


def qc_thresholds(config: dict[str, Any] | None) -> dict[str, int]:
    """The run's thresholds over the defaults; ValueError for an unknown dimension or a bad value."""
    thresholds = dict(DEFAULT_QC_THRESHOLDS)
    for dim, value in (config or {}).items():
        if dim not in QC_SCALES and dim != "overall_score":
            raise ValueError(f"unknown quality dimension {dim!r}; one of: {', '.join(QC_DIMENSIONS)}, overall_score")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 5:
            raise ValueError(f"the threshold of {dim} must be a number from 1 to 5, got {value!r}")
        thresholds[dim] = value
    return thresholds


def qc_verdict(assessment: dict[str, Any], thresholds: dict[str, float]) -> tuple[bool, list[str]]:
    """(passed, reasons): each dimension's score against its minimum."""
    reasons = []
    for dim, minimum in thresholds.items():
        score = assessment["overall_score"] if dim == "overall_score" else assessment[dim]["score"]
        if score < minimum:
            reasons.append(f"{dim} {score} < {minimum}")
    return not reasons, reasons
