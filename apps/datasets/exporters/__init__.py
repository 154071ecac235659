"""Exporters: trajectories as JSONL for trainers, streamed, validated line by line.

    records = load_records(trajectory_ids)                 # canonical records, chunked
    result = export_records("sft-trl", records, fp)        # -> ExportResult
    validate_line("sharegpt", obj)                         # the consumer's rules, [] = valid

Formats (FORMATS): sft-openai, sft-trl, dpo-openai, dpo-trl, rl, rl-verl, rl-agentjet,
sharegpt, alpaca, raw, toucan (Toucan's row schema, toucan.py), toolace (ToolACE's row, toolace.py), dpo-step-trl (stepdpo.py), kto-trl and
reward-score (kto.py), atif, adp and mini-swe-agent (../interchange/), sft-openai-vision, sharegpt-vision and trl-vision
(screenshots; vision.py, option images=files|base64), aitw (mobile_agent's Android in the Wild
rows, one line per step, aitw.py). Every line is redacted (configured secrets, API-key shapes, bearer
tokens, private keys; emails and phone numbers with redact_pii) and then validated; a record
that cannot be rendered or whose line fails its validator is not written and is listed in
`ExportResult.excluded` with the reason, so a file is never half-valid. Lines are serialized
with orjson, keys sorted, UTF-8, so exporting the same records again gives the same bytes.
"""
from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, BinaryIO

import orjson
from django.conf import settings

from apps.datasets.interchange.adp import render_adp, validate_adp
from apps.datasets.interchange.atif import render_atif, validate_atif
from apps.datasets.interchange.mini_swe_agent import render_mini_swe_agent, validate_mini_swe_agent
from apps.engines.registry import export_scenes
from trajplatform.redaction import redact, secret_values

from . import aitw, answers, dpo, formats, kto, roles, qa, stepdpo, toolace, toucan, vision
from .chat import RenderError
from .records import RAW_SCHEMA_VERSION, load_records

log = logging.getLogger(__name__)

__all__ = [
    "FORMATS", "RAW_SCHEMA_VERSION", "ExportResult", "Exporter", "FormatSummary", "check_options", "export_records",
    "format_table", "load_records", "validate_line",
]

DUMPS_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE


@dataclass(frozen=True)
class Exporter:
    name: str
    version: str  # bump when the output for the same records changes
    pairwise: bool
    description: str
    render: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None  # record, ctx -> line
    validate: Callable[[Any], list[str]]
    one_per_task: bool = False  # RL task shapes: the first renderable record of each task
    # Pairwise formats: one task's records, ctx -> ([(line, [source records])], excluded).
    render_group: Callable[[list[dict[str, Any]], dict[str, Any]], Any] | None = None
    # A scene's own format (its records only; others are listed as excluded with the reason): the
    # scenes whose declaration names it (apps/engines/scenes/<id>/scene.py export_formats).
    scenes: tuple[str, ...] = ()
    many: bool = False  # render returns a list of lines (one per step: aitw); written all or none
    # Option final_answer (answers.py): the values the format takes, its default first; () for the
    # formats that write the episode as stored (raw, the interchange formats) or no conversation.
    final_answers: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<Exporter {self.name} v{self.version}>"


# 2 (raw, rl, rl-verl): the task's pass rate over its rollouts (records.task_pass_rates)
# final_answer text by default (answers.py): sft-openai, sft-trl, dpo-*, rl-agentjet, alpaca, qa-verl,
# multiagent-agentjet, kto-trl, reward-score and the vision formats 2, rl and rl-verl 3, sharegpt 3 (also a
# gpt turn's reasoning in its thought words), toucan 3 (the answer's thought: the turn's reasoning and text)
_ALL = [
    Exporter("sft-openai", "3", False, "OpenAI chat fine-tuning: messages with tool_calls (arguments as JSON "
             "strings), role tool with tool_call_id, tools, parallel_tool_calls",
             formats.render_sft_openai, formats.validate_sft_openai),
    Exporter("sft-trl", "3", False, "TRL conversational SFT: messages + tools, tool-call arguments as objects, "
             "reasoning_content kept", formats.render_sft_trl, formats.validate_sft_trl),
    Exporter("dpo-openai", "3", True, "OpenAI preference fine-tuning: input (shared prompt, tools), one preferred "
             "and one non-preferred assistant message; pairs within a task only", None, dpo.validate_dpo_openai,
             render_group=partial(dpo.pair_group, style="openai")),
    Exporter("dpo-trl", "3", True, "TRL DPO, conversational with explicit prompt: prompt (shared prefix), "
             "chosen/rejected continuations, tools; pairs within a task only", None, dpo.validate_dpo_trl,
             render_group=partial(dpo.pair_group, style="trl")),
    Exporter("rl", "4", False, "platform RL record per trajectory: prompt, tools, full messages, final reward, "
             "per-step tool success, verifier output, judge scores", formats.render_rl, formats.validate_rl),
    Exporter("rl-verl", "4", False, "verl RL task per task: data_source, prompt, ability, "
             "reward_model{style, ground_truth}, extra_info", formats.render_verl, formats.validate_verl,
             one_per_task=True),
    Exporter("rl-agentjet", "3", False, "AgentJet task per task: main_query, init_messages, task_id, env_type, "
             "metadata{answer}", formats.render_agentjet, formats.validate_agentjet, one_per_task=True),
    # 2: thoughts in LLaMA-Factory's thought words ("<think>\n", "\n</think>\n\n"), tools with parameters.properties
    Exporter("sharegpt", "4", False, "LLaMA-Factory ShareGPT: conversations with human/gpt/function_call/"
             "observation turns, system, tools as a JSON string", formats.render_sharegpt, formats.validate_sharegpt),
    Exporter("alpaca", "3", False, "LLaMA-Factory Alpaca: instruction/input/output/system/history; tool calls "
             "and results flattened into tagged text", formats.render_alpaca, formats.validate_alpaca),
    Exporter("raw", "2", False, f"our canonical lossless record ({RAW_SCHEMA_VERSION}), read back by "
             "import_trajectories", formats.render_raw, formats.validate_raw),
    # 2: the released dataset's nine string columns (uuid, subset_name, JSON text), function_call messages
    Exporter("toucan", "4", False, "Toucan's released row (Agent-Ark/Toucan-1.5M): uuid, subset_name, messages "
             "(JSON text: function_call / function turns), question, available_tools, target_tools, the question and "
             "response quality assessments, metadata - every column a string", toucan.render_toucan,
             toucan.validate_toucan),
    # 2: ToolACE's system prompt and function shape (dict types, required: null), any tool name
    Exporter("toolace", "3", False, "ToolACE's released row: system (ToolACE's instructions + the tools as JSON), "
             "conversations user/assistant/tool with calls in bracket syntax [Get Data(a=1, b=\"x\")] (validated by "
             "parsing them back), clarifications as plain turns", toolace.render_toolace, toolace.validate_toolace),
    Exporter("qa", "1", False, "QA pairs (search2qa / deep_search): question, answer, aliases, sources, gates, "
             "metadata; one per task", qa.render_qa, qa.validate_qa, one_per_task=True,
             scenes=export_scenes("qa")),
    Exporter("qa-verl", "3", False, "verl RL task per QA pair: rl-verl's row with reward_model.ground_truth = the "
             "answer and extra_info {aliases, sources, gates}", qa.render_qa_verl, qa.validate_qa_verl,
             one_per_task=True, scenes=export_scenes("qa-verl")),
    Exporter("multiagent-agentjet", "3", False, "multi_agent episodes in AgentJet's shape: per-agent timelines "
             "(messages with author llm|env and loss_mask) tagged by role, the shared reward (roles.py)",
             roles.render_agentjet_multiagent, roles.validate_agentjet_multiagent,
             scenes=export_scenes("multiagent-agentjet")),
    Exporter("dpo-step-trl", "3", True, "TRL DPO, step level: prompt = two rollouts' shared prefix, chosen/rejected "
             "= the single assistant turns where they first diverge, tools, metadata (both ids, prefix length, "
             "step, margin)", None, stepdpo.validate_dpo_step, render_group=stepdpo.pair_steps),
    Exporter("kto-trl", "3", False, "TRL KTO, unpaired: prompt, completion, label (human verdict, else verifier "
             "outcome), tools", kto.render_kto, kto.validate_kto),
    # 2: ATIF-v1.7 with trajectory_id; an imported file's agent, metrics and extras written back
    Exporter("atif", "2", False, "Harbor's Agent Trajectory Interchange Format (ATIF-v1.7), one trajectory per "
             "line: steps with tool_calls and observation results, final_metrics, our record in extra.trajplatform",
             render_atif, validate_atif),
    # 2: ADP 1.5.0 (source user), code actions with their language, an imported file's fields written back
    Exporter("adp", "2", False, "neulab's Agent Data Protocol (1.5.0): text_observation / api_action / "
             "code_action / message_action content, our record in details.trajplatform", render_adp, validate_adp),
    Exporter("mini-swe-agent", "1", False, "mini-swe-agent's saved trajectory (mini-swe-agent-1.1), one per line: "
             "info (exit status, submission, cost), messages with tool calls or fenced commands, the exit message",
             render_mini_swe_agent, validate_mini_swe_agent),
    # 2: one line per step with AitW's feature names (image/encoded, results/action_type, ...)
    Exporter("aitw", "2", False, "Android in the Wild's rows of mobile_agent episodes (aitw.py): one line per step "
             "with AitW's features (image/encoded beside the export or base64, image/ui_annotations_*, "
             "results/action_type, normalised results/yx_touch and yx_lift, results/type_action)",
             aitw.render_aitw, aitw.validate_aitw, scenes=export_scenes("aitw"), many=True),
    Exporter("reward-score", "3", False, "pointwise reward-model data: prompt, completion, score 0-1 (human review "
             "overall, else judge overall, / 100), tools", kto.render_reward, kto.validate_reward),
    Exporter("sft-openai-vision", "3", False, "OpenAI chat fine-tuning with images: screenshots as image_url "
             "parts of user messages (files next to the JSONL or data: URLs, option images)",
             vision.render_sft_openai_vision, vision.validate_sft_openai_vision,
             scenes=export_scenes("sft-openai-vision")),
    Exporter("sharegpt-vision", "3", False, "LLaMA-Factory ShareGPT with an images column and one <image> token "
             "per image in its turn", vision.render_sharegpt_vision, vision.validate_sharegpt_vision,
             scenes=export_scenes("sharegpt-vision")),
    Exporter("trl-vision", "3", False, "TRL vision SFT: messages of content parts ({type: image} placeholders), "
             "images list, tools", vision.render_trl_vision, vision.validate_trl_vision,
             scenes=export_scenes("trl-vision")),
]
# What option final_answer takes per format (answers.py; docs/exports.md, "Final answers"): the chat
# formats "text" (default) or "tool"; the anchors' rows (toucan, toolace) end on the answer as text,
# as the released datasets do; the others write no conversation or the episode as stored.
_FINAL_ANSWERS = {
    **{name: answers.MODES for name in (
        "sft-openai", "sft-trl", "dpo-openai", "dpo-trl", "rl", "rl-verl", "rl-agentjet", "sharegpt", "alpaca",
        "qa-verl", "multiagent-agentjet", "dpo-step-trl", "kto-trl", "reward-score", "sft-openai-vision",
        "sharegpt-vision", "trl-vision")},
    "toucan": ("text",), "toolace": ("text",),
}
FORMATS: dict[str, Exporter] = {e.name: replace(e, final_answers=_FINAL_ANSWERS.get(e.name, ())) for e in _ALL}

# Every format in one line: what it is for, and which consumer loads it. `dataset_export --help`,
# the API schema's format enum and the console's export form all read it (format_table()).
_SUMMARIES: dict[str, tuple[str, str]] = {
    "sft-openai": ("supervised fine-tuning on tool-calling chats", "OpenAI chat fine-tuning (also Together, Fireworks)"),
    "sft-trl": ("supervised fine-tuning, tool-call arguments as objects, reasoning kept",
                "TRL SFTTrainer (conversational, with tools)"),
    "dpo-openai": ("preference pairs of two rollouts of a task", "OpenAI preference fine-tuning"),
    "dpo-trl": ("preference pairs: shared prompt, chosen and rejected continuations", "TRL DPOTrainer"),
    "rl": ("one record per trajectory: messages, reward, verifier output, judge scores",
           "your own RL pipeline (the platform's schema)"),
    "rl-verl": ("RL tasks, one per task, with the ground truth for a rule reward",
                "verl (RLHFDataset; Parquet with --layout hf)"),
    "rl-agentjet": ("RL tasks, one per task, for agent environments", "AgentJet"),
    "sharegpt": ("supervised fine-tuning with function calls and observations", "LLaMA-Factory (formatting: sharegpt)"),
    "alpaca": ("instruction tuning, tool use flattened to text", "LLaMA-Factory (formatting: alpaca)"),
    "raw": ("the lossless record: archives, moving data between installations",
            "import_trajectories (this platform)"),
    "toucan": ("rows exactly as the released Toucan dataset", "code that reads Agent-Ark/Toucan-1.5M"),
    "toolace": ("rows exactly as the released ToolACE dataset", "code that reads Team-ACE/ToolACE"),
    "qa": ("question-answer pairs with sources and gates, one per task (search2qa, deep_search)",
           "QA training and evaluation (JSONL)"),
    "qa-verl": ("RL tasks from QA pairs, the answer as ground truth", "verl"),
    "multiagent-agentjet": ("multi_agent episodes as per-agent timelines tagged by role", "AgentJet (multi-agent)"),
    "dpo-step-trl": ("step-level preference pairs at the first divergence of two rollouts",
                     "TRL DPOTrainer (step level)"),
    "kto-trl": ("unpaired preference data with a good/bad label", "TRL KTOTrainer"),
    "atif": ("trajectory interchange (ATIF-v1.7)", "Harbor and other ATIF readers"),
    "adp": ("trajectory interchange (Agent Data Protocol 1.5.0)", "neulab's ADP tools and datasets"),
    "mini-swe-agent": ("saved trajectories of mini-swe-agent (mini-swe-agent-1.1)", "mini-swe-agent's own tools"),
    "aitw": ("Android in the Wild rows, one per step, of mobile_agent episodes", "code that reads Android in the Wild"),
    "reward-score": ("pointwise reward-model data: prompt, completion, score 0-1", "pointwise reward-model trainers"),
    "sft-openai-vision": ("supervised fine-tuning with screenshots as image parts", "OpenAI vision fine-tuning"),
    "sharegpt-vision": ("supervised fine-tuning with screenshots and <image> tokens",
                        "LLaMA-Factory (sharegpt with images)"),
    "trl-vision": ("supervised fine-tuning with screenshots as image placeholders", "TRL SFTTrainer (vision)"),
}
if set(_SUMMARIES) != set(FORMATS):  # a new format needs its line; said at import, not found in --help later
    raise RuntimeError(f"exporters: formats without a summary line: {sorted(set(FORMATS) - set(_SUMMARIES))}, "
                       f"summaries without a format: {sorted(set(_SUMMARIES) - set(FORMATS))}")


@dataclass(frozen=True)
class FormatSummary:
    name: str
    purpose: str  # what the format is for
    consumer: str  # who loads it

    @property
    def line(self) -> str:
        return f"{self.purpose} — for {self.consumer}"


def format_table() -> list[FormatSummary]:
    """Every export format in the registry's order, with what it is for and which consumer loads it."""
    return [FormatSummary(name, *_SUMMARIES[name]) for name in FORMATS]


@dataclass
class ExportResult:
    format: str
    version: str
    lines: int = 0
    excluded: list[dict[str, Any]] = field(default_factory=list)
    sha256: str = ""
    bytes: int = 0
    # final_answer text: the records whose system prompt still names a finish tool, no text-form rewrite
    # matching it (answers.py; an episode recorded by an older prompt): exported, counted and warned about.
    stale_prompts: list[dict[str, Any]] = field(default_factory=list)


def validate_line(fmt: str, obj: Any) -> list[str]:
    """What is wrong with one line by the format's consumer's rules ([] = valid)."""
    rest, problems = roles.untag_view(fmt, obj)
    return _exporter(fmt).validate(rest) + problems


def _exporter(fmt: str) -> Exporter:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown export format {fmt!r}; one of: {', '.join(FORMATS)}") from None


def check_options(fmt: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The options an export of `fmt` runs with, or ValueError naming the first that is wrong:
    an unknown key, a bad value, or an option the format does not take (callers check before
    they write anything)."""
    return _options(_exporter(fmt), options)


def _options(exporter: Exporter, options: dict[str, Any] | None) -> dict[str, Any]:
    resolved = {
        "dpo_min_margin": 0.2,
        "final_answer": None,  # the format's default (Exporter.final_answers)
        "image_dir": "",  # vision formats: where images="files" writes them (the export job: next to the file)
        "images": "files",  # vision formats: "files" or "base64" (data: URLs in the line)
        "include_system": True,
        "redact_pii": bool(getattr(settings, "EXPORT_REDACT_PII", False)),
        "roles": "trainable",
        "split": "train",
        "start_index": 0,
    }
    unknown = set(options or {}) - set(resolved)
    if unknown:
        raise ValueError(f"unknown export option(s): {', '.join(sorted(unknown))}; known: {', '.join(resolved)}")
    resolved.update(options or {})
    m = resolved["dpo_min_margin"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m <= 1:
        raise ValueError("dpo_min_margin: must be a number from 0 to 1")
    for key in ("include_system", "redact_pii"):
        if not isinstance(resolved[key], bool):
            raise ValueError(f"{key}: must be true or false")
    if not isinstance(resolved["split"], str) or not resolved["split"]:
        raise ValueError("split: must be a non-empty string")
    start = resolved["start_index"]
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError("start_index: must be a whole number >= 0")
    if resolved["images"] not in vision.IMAGE_MODES:
        raise ValueError(f"images: must be one of {', '.join(vision.IMAGE_MODES)}")
    resolved["roles"] = roles.check_roles_option(resolved["roles"])
    resolved["final_answer"] = _final_answer(exporter, resolved["final_answer"])
    return resolved


def _final_answer(exporter: Exporter, value: Any) -> str | None:
    if value is None:
        return exporter.final_answers[0] if exporter.final_answers else None
    answers.check_mode(value)
    if not exporter.final_answers:
        takes = ", ".join(e.name for e in _ALL if _FINAL_ANSWERS.get(e.name))
        raise ValueError(f"final_answer: {exporter.name} does not take this option (it writes no conversation or "
                         f"the episode as stored); formats that take it: {takes}")
    if value not in exporter.final_answers:
        raise ValueError(f"final_answer: {exporter.name} writes the final answer as "
                         f"{' or '.join(exporter.final_answers)} only, as its anchor's released rows do, not {value!r}")
    return value


# -- redaction ------------------------------------------------------------------------------

REDACTED_EMAIL = "[REDACTED_EMAIL]"
REDACTED_PHONE = "[REDACTED_PHONE]"
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]\d{3,4}(?![\w])")
# A superset of what redact() and the patterns above can change, looked for in the serialized
# line with plain substring tests (much cheaper than one regex with alternatives): when none
# occurs, redaction is a no-op and the line is written as serialized.
_CASE_SENSITIVE_HINTS = (b"sk-", b"AIza", b"hf_", b"-----BEGIN ")
_GITHUB_HINT = re.compile(rb"gh[pousr]_")


class _Redactor:
    def __init__(self, *, pii: bool) -> None:
        self.pii = pii
        self.secrets = secret_values()
        # A secret appears in the line JSON-escaped, exactly as orjson escapes it alone.
        self.hints = _CASE_SENSITIVE_HINTS + tuple(orjson.dumps(s)[1:-1] for s in self.secrets)

    def _hinted(self, data: bytes) -> bool:
        return (any(hint in data for hint in self.hints) or b"bearer" in data.lower()
                or _GITHUB_HINT.search(data) is not None)

    def _text(self, text: str) -> str:
        return _PHONE.sub(REDACTED_PHONE, _EMAIL.sub(REDACTED_EMAIL, text))

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        return value

    def apply(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """(redacted line, its serialized bytes)."""
        data = orjson.dumps(obj, option=DUMPS_OPTIONS)
        if self.pii or self._hinted(data):
            # Model output becomes training data: labels=False keeps `password = "..."` that
            # an agent legitimately wrote, while configured secrets and key shapes still go.
            obj = redact(obj, labels=False, _secrets=self.secrets)
            if self.pii:
                obj = self._walk(obj)
            data = orjson.dumps(obj, option=DUMPS_OPTIONS)
        return obj, data


# -- export --------------------------------------------------------------------------------


def _role_views(records: Iterable[dict[str, Any]], choice: Any) -> Iterator[dict[str, Any]]:
    for record in records:
        yield from roles.views(record, choice)


def _answers_as_text(records: Iterable[dict[str, Any]], exporter: Exporter,
                     result: ExportResult) -> Iterator[dict[str, Any]]:
    """The records with final answers as text (answers.py); one that cannot be is excluded, saying why."""
    for record in records:
        stale: list[str] = []
        try:
            yield answers.as_text(record, stale)
            if stale:
                result.stale_prompts.append({"trajectory_id": record.get("trajectory_id"),
                                             "task_id": record.get("task_id"), "reason": stale[0]})
        except RenderError as exc:
            result.excluded.append({"trajectory_id": record.get("trajectory_id"), "task_id": record.get("task_id"),
                                    "reason": f"{exporter.name}: {exc}"})


def _groups(records: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Consecutive records of one task; a task id seen again after its group is an error."""
    done: set[int] = set()
    group: list[dict[str, Any]] = []
    for record in records:
        task_id = record["task_id"]
        if group and group[0]["task_id"] != task_id:
            done.add(group[0]["task_id"])
            yield group
            group = []
        if task_id in done:
            raise ValueError(
                f"records of task {task_id} are not consecutive: pairwise formats need them grouped by task")
        group.append(record)
    if group:
        yield group


def export_records(
    fmt: str, records: Iterable[dict[str, Any]], out: BinaryIO, *, options: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> ExportResult:
    """Write one JSONL line per rendered record (per pair, for DPO) to `out`; see the module doc.

    Options: dpo_min_margin (0.2), final_answer (the chat formats: "text", the default, ends each episode
    on the answer as an assistant message; "tool" keeps the finish call; answers.py), include_system
    (True), redact_pii (settings.EXPORT_REDACT_PII),
    split (verl's extra_info.split, "train"), start_index (verl's extra_info.index of the first
    line, 0: a file written in chunks continues the count), roles (multi_agent: whose views the
    per-trajectory formats write, "trainable" / "lead" / "all" / a list of names; roles.py).
    dry_run: render and validate as for the file, but write no side files (the vision formats'
    images are only looked up); the card's exportability counts (apps/datasets/exportability.py).
    """
    exporter = _exporter(fmt)
    ctx = _options(exporter, options)
    ctx["dry_run"] = dry_run
    ctx["index"] = ctx["start_index"]
    redactor = _Redactor(pii=ctx["redact_pii"])
    result = ExportResult(format=exporter.name, version=exporter.version)
    digest = hashlib.sha256()
    written_tasks: set[int] = set()

    def write(objs: list[dict[str, Any]], sources: list[dict[str, Any]]) -> bool:
        """Write a record's lines (one, or a per-step format's several): all of them valid, or none."""
        prepared = []
        for n, obj in enumerate(objs):
            obj, data = redactor.apply(obj)
            problems = validate_line(exporter.name, obj)
            if problems:
                shown = "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
                where = f" {n + 1} of {len(objs)}" if exporter.many else ""
                for rec in sources:
                    result.excluded.append({"trajectory_id": rec["trajectory_id"], "task_id": rec["task_id"],
                                            "reason": f"invalid {exporter.name} line{where}: {shown}"})
                return False
            prepared.append(data)
        for data in prepared:
            out.write(data)
            digest.update(data)
            result.lines += 1
            result.bytes += len(data)
            ctx["index"] += 1
        return True

    if ctx["final_answer"] == "text":
        records = _answers_as_text(records, exporter, result)
    if exporter.pairwise:
        assert exporter.render_group is not None
        for group in _groups(records):
            pairs, excluded = exporter.render_group(group, ctx)
            result.excluded += excluded
            for obj, sources in pairs:
                write([obj], sources)
    else:
        assert exporter.render is not None
        # multi_agent: one line per selected role's view (roles.py); the task-level, raw and
        # multi-agent formats take the whole episode.
        whole = exporter.one_per_task or exporter.name in ("raw", "multiagent-agentjet")
        for record in (records if whole else _role_views(records, ctx["roles"])):
            scene = (record.get("task") or {}).get("scene")
            if exporter.scenes and scene not in exporter.scenes:
                result.excluded.append({"trajectory_id": record["trajectory_id"], "task_id": record["task_id"],
                                        "reason": f"{exporter.name}: for {', '.join(exporter.scenes)} trajectories, "
                                        f"not {scene}"})
                continue
            if exporter.one_per_task and record["task_id"] in written_tasks:
                result.excluded.append({"trajectory_id": record["trajectory_id"], "task_id": record["task_id"],
                                        "reason": f"{exporter.name}: one line per task, task {record['task_id']} "
                                        "is already written"})
                continue
            try:
                obj = roles.tag_view(exporter.name, exporter.render(record, ctx), record)
            except (RenderError, KeyError, TypeError, AttributeError) as exc:
                reason = str(exc) if isinstance(exc, RenderError) else f"malformed record: {type(exc).__name__}: {exc}"
                result.excluded.append({"trajectory_id": record.get("trajectory_id"), "task_id": record.get("task_id"),
                                        "reason": f"{exporter.name}: {reason}"})
                continue
            if write(obj if exporter.many else [obj], [record]) and exporter.one_per_task:
                written_tasks.add(record["task_id"])
    result.sha256 = digest.hexdigest()
    if result.stale_prompts and not dry_run:  # the card counts a dry run's (exportability.py)
        first = result.stale_prompts[0]
        log.warning("%s export: %d record(s) end on a text answer but their system prompt still names the finish "
                    "tool (no text-form rewrite matches it: recorded by an older prompt?), e.g. %s",
                    exporter.name, len(result.stale_prompts), first["reason"])
    return result
