"""Rendered validation: an export's records through a real chat template, as the trainer renders them.

Format rules (exporters/) say a line is well formed; this says whether a model's chat template
trains on what the line meant. Each conversation of a line (sft-trl: its messages; dpo-trl and
dpo-step-trl: prompt + chosen and prompt + rejected; kto-trl and reward-score: prompt + completion)
goes through transformers' own `apply_chat_template` with the line's tools, and is checked for:

* **nothing dropped**: the system and user texts, every tool result, every assistant text, every
  tool call's name and each of its argument values, in order, and every tool's name, appear in
  the rendered text (a template that cannot render a message — DeepSeek-V3's original with
  argument objects, Llama 3's without tool support — fails here or in rendering);
* **the assistant-only loss mask** (templates with `{% generation %}` markers, which is what
  TRL's `assistant_only_loss=True` needs): every assistant piece lies inside the mask, every
  system/user/tool piece outside it, and no masked span holds none of the assistant's pieces;
  without markers the report says the template cannot give that mask;
* **reasoning**: for assistant turns with `reasoning_content`, whether the template kept it in
  the text (the template decides; the report counts kept and stripped);
* **round trip**: text -> token ids -> text gives the same text, the ids equal the ones
  `apply_chat_template` produced, and no message text contains one of the template's control
  tokens (it would be read as that token, not as text).

No model is downloaded. A template is a `.jinja` file (or a name in DATASET_CHAT_TEMPLATE_DIR),
tokenized with a byte-level tokenizer built here (every byte a token, the template's control
tokens added as special tokens); or a tokenizer directory (`tokenizer.json` +
`tokenizer_config.json` with its `chat_template`), whose own tokenizer is used, so the round trip
is the real one.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import orjson
from django.conf import settings

# Formats whose lines hold conversations a chat template renders (tool-call arguments as objects).
CHECKABLE_FORMATS = ("sft-trl", "dpo-trl", "dpo-step-trl", "kto-trl", "reward-score")
_CONTROL = re.compile(r"<\|[^|<>\s]{1,40}\|>|<｜[^｜<>\s]{1,40}｜>")
MAX_PROBLEMS = 8


class TemplateError(ValueError):
    """A template that cannot be found or loaded, or a file that cannot be checked."""


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    text: str
    sha256: str
    source: str  # the file it was read from
    tokenizer_dir: str = ""  # a real tokenizer to use instead of the byte-level one

    @property
    def has_generation_markers(self) -> bool:
        return bool(re.search(r"\{%-?\s*generation\s*-?%\}", self.text))


def load_template(name: str, *, by_name: bool = False) -> ChatTemplate:
    """A `.jinja` path, a tokenizer directory, or NAME(.jinja) in DATASET_CHAT_TEMPLATE_DIR (by_name: only that)."""
    if not name:
        raise TemplateError("no template given")
    if by_name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise TemplateError(f"template {name[:100]!r}: a name in DATASET_CHAT_TEMPLATE_DIR, not a path")
    path = Path(name).expanduser()
    if by_name or (not path.exists() and not any(sep in name for sep in ("/", "\\"))):
        base = Path(getattr(settings, "DATASET_CHAT_TEMPLATE_DIR", "") or ".")
        candidates = [base / name, base / f"{name}.jinja"]
        path = next((p for p in candidates if p.exists()), candidates[-1])
    if path.is_dir():
        config = path / "tokenizer_config.json"
        template_file = path / "chat_template.jinja"
        if template_file.is_file():  # transformers' precedence: chat_template.jinja first
            text = template_file.read_text(encoding="utf-8")
        elif config.is_file():
            text = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(text, list):  # named variants: the default one
                text = {v.get("name"): v.get("template") for v in text}.get("default")
        else:
            raise TemplateError(f"{path}: neither chat_template.jinja nor tokenizer_config.json")
        if not isinstance(text, str) or not text:
            raise TemplateError(f"{path}: no chat_template")
        tokenizer_dir = str(path) if (path / "tokenizer.json").is_file() else ""
        return ChatTemplate(path.name, text, _sha(text), str(path), tokenizer_dir)
    if not path.is_file():
        raise TemplateError(f"chat template {name!r} not found (a .jinja file, a tokenizer directory, or a name "
                            f"in DATASET_CHAT_TEMPLATE_DIR)")
    text = path.read_text(encoding="utf-8")
    return ChatTemplate(path.stem, text, _sha(text), str(path))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@lru_cache(maxsize=16)
def _byte_tokenizer(specials: tuple[str, ...]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # deferred: tokenizers, for the template check only
    from transformers import PreTrainedTokenizerFast  # deferred: transformers (seconds to import)

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                   additional_special_tokens=list(specials))


def tokenizer_for(template: ChatTemplate) -> Any:
    """The tokenizer the check encodes with (the template's own directory, else byte-level)."""
    if template.tokenizer_dir:
        from transformers import AutoTokenizer  # deferred: transformers (seconds to import)

        return AutoTokenizer.from_pretrained(template.tokenizer_dir, local_files_only=True)
    return _byte_tokenizer(tuple(sorted(set(_CONTROL.findall(template.text)))))


# --- one conversation --------------------------------------------------------------------------

@dataclass
class RecordReport:
    line: int
    conversations: int = 0
    problems: list[str] = field(default_factory=list)
    tool_calls: int = 0
    tool_results: int = 0
    assistant_turns: int = 0
    reasoning_kept: int = 0
    reasoning_stripped: int = 0
    mask: str = "checked"  # checked | no generation markers
    tokens: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "ok": self.ok, "problems": self.problems[:MAX_PROBLEMS],
                "conversations": self.conversations, "assistant_turns": self.assistant_turns,
                "tool_calls": self.tool_calls, "tool_results": self.tool_results,
                "reasoning_kept": self.reasoning_kept, "reasoning_stripped": self.reasoning_stripped,
                "mask": self.mask, "tokens": self.tokens}


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _forms(value: Any) -> list[str]:
    """How a value can appear once rendered: as is, or JSON-encoded (tojson escapes differently)."""
    if isinstance(value, str):
        forms = [value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]
    else:
        forms = [json.dumps(value), str(value)]
    return list(dict.fromkeys(f for f in forms if f))


def _pieces(messages: list[dict[str, Any]]) -> list[tuple[int, str, str, list[str], bool]]:
    """(message index, role, what, forms, ordered) for every text that must survive rendering."""
    out: list[tuple[int, str, str, list[str], bool]] = []
    for i, msg in enumerate(messages):
        role = msg.get("role")
        content = msg.get("content")
        if isinstance(content, str) and content.strip():
            out.append((i, role, f"messages[{i}] ({role}) content", _forms(content.strip()), True))
        if role == "assistant":
            for j, call in enumerate(msg.get("tool_calls") or []):
                fn = call.get("function") or {}
                out.append((i, role, f"messages[{i}] tool call {j} name", _forms(fn.get("name") or ""), True))
                args = fn.get("arguments")
                for leaf in _leaves(args if isinstance(args, (dict, list)) else {}):
                    if leaf not in (None, "") and not isinstance(leaf, bool):
                        out.append((i, role, f"messages[{i}] tool call {j} ({fn.get('name')}) argument "
                                    f"{str(leaf)[:40]!r}", _forms(leaf), False))
    return out


def _find(text: str, forms: list[str], start: int) -> tuple[int, int] | None:
    best: tuple[int, int] | None = None
    for form in forms:
        at = text.find(form, start)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, at + len(form))
    return best


def _char_mask(tokenizer: Any, ids: list[int], mask: list[int]) -> tuple[str, list[bool]]:
    """The decoded text and, per character, whether it is under the assistant mask."""
    text_parts: list[str] = []
    flags: list[bool] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or bool(mask[i]) != bool(mask[start]):
            part = tokenizer.decode(ids[start:i])
            text_parts.append(part)
            flags += [bool(mask[start])] * len(part)
            start = i
    return "".join(text_parts), flags


def check_conversation(template: ChatTemplate, tokenizer: Any, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None, report: RecordReport, where: str) -> None:
    """Render one conversation and add what is wrong with it to report.problems."""
    report.conversations += 1
    report.mask = "checked" if template.has_generation_markers else "no generation markers"
    problems = report.problems
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=template.text,
                                             tokenize=False)
    except Exception as exc:  # noqa: BLE001 - a template's own error is the finding
        problems.append(f"{where}: the template cannot render it: {type(exc).__name__}: {exc}")
        return
    for msg in messages:
        if msg.get("role") == "assistant":
            report.assistant_turns += 1
            report.tool_calls += len(msg.get("tool_calls") or [])
            reasoning = msg.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning.strip():
                if reasoning.strip() in text:
                    report.reasoning_kept += 1
                else:
                    report.reasoning_stripped += 1
        elif msg.get("role") == "tool":
            report.tool_results += 1
    for tool in tools or []:
        name = (tool.get("function") or {}).get("name") or ""
        if name and name not in text:
            problems.append(f"{where}: tool {name!r} is not in the rendered text (the template drops the tools)")
    pieces = _pieces(messages)
    spans: list[tuple[int, int, str, str]] = []
    position = reach = 0
    for _, role, what, forms, ordered in pieces:
        # Argument values are searched from their call's name on, in any order (tojson may sort keys).
        if ordered:
            position = max(position, reach)
        found = _find(text, forms, position)
        if found is None:
            problems.append(f"{where}: {what} is missing from the rendered text")
            continue
        spans.append((found[0], found[1], role, what))
        if ordered:
            position = reach = found[1]
        else:
            reach = max(reach, found[1])
    specials = set(_CONTROL.findall(template.text))
    for i, msg in enumerate(messages):
        content = msg.get("content")
        hit = sorted(s for s in specials if isinstance(content, str) and s in content)
        if hit:
            problems.append(f"{where}: messages[{i}] contains the control token(s) {', '.join(hit)}, "
                            "which tokenize as control tokens, not text")
    try:
        encoded = tokenizer.apply_chat_template(
            messages, tools=tools or None, chat_template=template.text, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=template.has_generation_markers)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"{where}: tokenizing the rendered conversation failed: {type(exc).__name__}: {exc}")
        return
    ids = list(encoded["input_ids"])
    report.tokens += len(ids)
    again = tokenizer(text, add_special_tokens=False)["input_ids"]
    if list(again) != ids:
        problems.append(f"{where}: encoding the rendered text again gives other token ids than apply_chat_template")
    decoded = tokenizer.decode(ids)
    if decoded != text:
        at = next((k for k, (a, b) in enumerate(zip(decoded, text)) if a != b), min(len(decoded), len(text)))
        problems.append(f"{where}: text -> tokens -> text drifts at character {at}: "
                        f"{text[at:at + 30]!r} came back as {decoded[at:at + 30]!r}")
        return
    if not template.has_generation_markers:
        return
    mask = list(encoded.get("assistant_masks") or [])
    if len(mask) != len(ids):
        problems.append(f"{where}: the template's assistant mask does not cover the tokens")
        return
    masked_text, flags = _char_mask(tokenizer, ids, mask)
    if masked_text != text:
        problems.append(f"{where}: the masked runs do not decode to the rendered text")
        return
    for start, end, role, what in spans:
        inside = flags[start:end]
        if role == "assistant" and not all(inside):
            problems.append(f"{where}: {what} is outside the assistant mask (not trained on)")
        elif role != "assistant" and any(inside):
            problems.append(f"{where}: {what} is inside the assistant mask (trained on)")
    assistant_spans = [(s, e) for s, e, role, _ in spans if role == "assistant"]
    k = 0
    while k < len(flags):
        if not flags[k]:
            k += 1
            continue
        end = k
        while end < len(flags) and flags[end]:
            end += 1
        if not any(s >= k and e <= end for s, e in assistant_spans) and text[k:end].strip():
            problems.append(f"{where}: a masked span holds none of the assistant's text: {text[k:end][:40]!r}")
        k = end


# --- lines and files ---------------------------------------------------------------------------

def conversations_of(fmt: str, line: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The conversations of one line a trainer renders, named for the report."""
    if fmt == "sft-trl":
        return [("messages", line["messages"])]
    if fmt in ("dpo-trl", "dpo-step-trl"):
        return [("prompt+chosen", line["prompt"] + line["chosen"]),
                ("prompt+rejected", line["prompt"] + line["rejected"])]
    if fmt in ("kto-trl", "reward-score"):
        return [("prompt+completion", line["prompt"] + line["completion"])]
    raise TemplateError(f"format {fmt!r} cannot be checked against a chat template; "
                        f"one of: {', '.join(CHECKABLE_FORMATS)}")


def check_line(template: ChatTemplate, tokenizer: Any, fmt: str, line: dict[str, Any], number: int) -> RecordReport:
    report = RecordReport(line=number)
    try:
        conversations = conversations_of(fmt, line)
    except (KeyError, TypeError) as exc:
        report.problems.append(f"not a {fmt} line: {exc}")
        return report
    for where, messages in conversations:
        check_conversation(template, tokenizer, messages, line.get("tools"), report, where)
    return report


@dataclass
class TemplateReport:
    template: str
    template_sha256: str
    format: str
    tokenizer: str
    records: list[RecordReport] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.records if not r.ok)

    def summary(self) -> dict[str, Any]:
        """The data card's entry: totals and the failing records (first problems of each)."""
        return {
            "template": self.template, "template_sha256": self.template_sha256, "format": self.format,
            "tokenizer": self.tokenizer, "records": len(self.records), "passed": len(self.records) - self.failed,
            "failed": self.failed,
            "mask": "checked" if any(r.mask == "checked" for r in self.records) else "no generation markers",
            "reasoning_kept": sum(r.reasoning_kept for r in self.records),
            "reasoning_stripped": sum(r.reasoning_stripped for r in self.records),
            "failures": [r.as_dict() for r in self.records if not r.ok][:200],
        }


def check_file(path: str | Path, fmt: str, template: ChatTemplate) -> TemplateReport:
    """Every line of an export file through the template; one RecordReport per line."""
    if fmt not in CHECKABLE_FORMATS:
        conversations_of(fmt, {})  # raises the error naming the checkable formats
    tokenizer = tokenizer_for(template)
    report = TemplateReport(template=template.name, template_sha256=template.sha256, format=fmt,
                            tokenizer=template.tokenizer_dir or "byte-level (built here; control tokens special)")
    with open(path, "rb") as fp:
        for number, raw in enumerate(fp, start=1):
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                report.records.append(RecordReport(line=number, problems=[f"not JSON: {exc}"]))
                continue
            report.records.append(check_line(template, tokenizer, fmt, line, number))
    return report
