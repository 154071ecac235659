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

# What a template leaves out on purpose, reported once per template (TemplateReport.properties),
# not as a failure of each record: training on such a line teaches what the template shows.
TEXT_ON_CALL_TURNS = "drops the assistant's text on turns that call tools"
NO_REASONING = "drops reasoning_content"
EARLIER_REASONING = "drops reasoning_content of turns before the last user message"

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
    properties: dict[str, int] = field(default_factory=dict)  # what the template drops by design -> turns
    render_error: str = ""  # the template's own error, when it cannot render a conversation of the line

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "ok": self.ok, "problems": self.problems[:MAX_PROBLEMS],
                "conversations": self.conversations, "assistant_turns": self.assistant_turns,
                "tool_calls": self.tool_calls, "tool_results": self.tool_results,
                "reasoning_kept": self.reasoning_kept, "reasoning_stripped": self.reasoning_stripped,
                "mask": self.mask, "tokens": self.tokens, "properties": dict(self.properties)}


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


_HTML_SAFE = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027"))


def _html_safe(encoded: str) -> str:
    for char, escape in _HTML_SAFE:
        encoded = encoded.replace(char, escape)
    return encoded


def _forms(value: Any) -> list[str]:
    """Every way a template may write a value: as is, JSON-encoded with and without ensure_ascii,
    html-safe JSON (Jinja's own tojson: < > & ' as \\u003c \\u003e \\u0026 \\u0027), Python's repr
    (`|string` of a dict, `%r`)."""
    if isinstance(value, str):
        encoded = [json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]
        forms = [value, *encoded, *(_html_safe(e) for e in encoded), repr(value)[1:-1]]
    else:
        forms = [json.dumps(value), str(value), repr(value)]
    return list(dict.fromkeys(f for f in forms if f))


@dataclass(frozen=True)
class _Piece:
    message: int
    role: str
    what: str
    forms: list[str]
    kind: str  # content | call name | argument


def _pieces(messages: list[dict[str, Any]]) -> list[_Piece]:
    """Every text of a conversation that must survive rendering, with the message that holds it."""
    out: list[_Piece] = []
    for i, msg in enumerate(messages):
        role = msg.get("role")
        content = msg.get("content")
        if isinstance(content, str) and content.strip():
            out.append(_Piece(i, role, f"messages[{i}] ({role}) content", _forms(content.strip()), "content"))
        if role == "assistant":
            for j, call in enumerate(msg.get("tool_calls") or []):
                fn = call.get("function") or {}
                out.append(_Piece(i, role, f"messages[{i}] tool call {j} name", _forms(fn.get("name") or ""),
                                  "call name"))
                args = fn.get("arguments")
                for leaf in _leaves(args if isinstance(args, (dict, list)) else {}):
                    if leaf not in (None, "") and not isinstance(leaf, bool):
                        out.append(_Piece(i, role, f"messages[{i}] tool call {j} ({fn.get('name')}) argument "
                                          f"{str(leaf)[:40]!r}", _forms(leaf), "argument"))
    return out


def _find(text: str, forms: list[str], start: int = 0, end: int | None = None) -> tuple[int, int] | None:
    """The earliest occurrence of any form inside text[start:end]."""
    best: tuple[int, int] | None = None
    for form in forms:
        at = text.find(form, start, len(text) if end is None else end)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, at + len(form))
    return best


def _occurrences(text: str, forms: list[str], start: int, end: int, limit: int = 50) -> list[tuple[int, int]]:
    """Every occurrence of any form inside text[start:end] (up to limit), in order."""
    found: set[tuple[int, int]] = set()
    for form in forms:
        at = text.find(form, start, end)
        while at >= 0 and len(found) < limit:
            found.add((at, at + len(form)))
            at = text.find(form, at + 1, end)
    return sorted(found)


def _common_prefix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # slices compare in C: log2(n) comparisons instead of a loop over characters
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(texts: list[str]) -> int:
    shortest = min(len(t) for t in texts)
    n = 0
    while n < shortest and all(t[-n - 1] == texts[0][-n - 1] for t in texts):
        n += 1
    return n


def turns(render: Any, messages: list[dict[str, Any]], text: str) -> list[tuple[int, int]]:
    """Per message, the span of the rendered text that holds its turn.

    The template itself says where a turn starts: rendering messages[:k] gives the text up to
    message k, and where it stops agreeing with the whole conversation's text is message k's edge.
    A template that renders a message differently once more messages follow (Qwen 3 drops the
    reasoning of turns before the last user message), or refuses a prefix (tools in the first user
    message with no user message yet), leaves that edge unknown: its turn joins its neighbour's.
    Text a template appends after every conversation (ToolACE's assistant header) is allowed for.
    """
    n = len(messages)
    renders: dict[int, str] = {}
    for k in range(1, n):
        try:
            renders[k] = render(messages[:k])
        except Exception:  # noqa: BLE001 - a template's refusal of a prefix only leaves that edge unknown
            continue
    trailer = _common_suffix([*renders.values(), text]) if renders else 0
    edges: list[int | None] = [0] + [None] * (n - 1) + [len(text)]
    last = 0
    for k in sorted(renders):
        prefix = renders[k]
        at = _common_prefix(prefix, text)
        if at >= len(prefix) - trailer and at >= last:
            edges[k] = last = at
    spans = []
    for k in range(n):
        start = next(e for e in reversed(edges[:k + 1]) if e is not None)
        end = next(e for e in edges[k + 1:] if e is not None)
        spans.append((start, end))
    return spans


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


def _reasoning(messages: list[dict[str, Any]], text: str, spans: list[tuple[int, int]],
               report: RecordReport) -> None:
    """Count kept and stripped reasoning_content, and name what the template does with it."""
    kept: list[bool] = []
    turns_with: list[int] = []
    for i, msg in enumerate(messages):
        reasoning = msg.get("reasoning_content") if msg.get("role") == "assistant" else None
        if isinstance(reasoning, str) and reasoning.strip():
            turns_with.append(i)
            kept.append(_find(text, _forms(reasoning.strip()), *spans[i]) is not None)
    report.reasoning_kept += sum(kept)
    report.reasoning_stripped += len(kept) - sum(kept)
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    for i, was_kept in zip(turns_with, kept):
        if not was_kept:
            what = EARLIER_REASONING if i < last_user else NO_REASONING
            report.properties[what] = report.properties.get(what, 0) + 1


def check_conversation(template: ChatTemplate, tokenizer: Any, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None, report: RecordReport, where: str) -> None:
    """Render one conversation and add what is wrong with it to report.problems (what the template
    drops by design to report.properties)."""
    report.conversations += 1
    report.mask = "checked" if template.has_generation_markers else "no generation markers"
    problems = report.problems

    def render(conversation: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(conversation, tools=tools or None, chat_template=template.text,
                                             tokenize=False)

    encoded: Any = None
    for _ in range(3):
        try:
            text = render(messages)
        except Exception as exc:  # noqa: BLE001 - a template's own error is the finding
            report.render_error = f"{type(exc).__name__}: {exc}"
            problems.append(f"{where}: the template cannot render it: {report.render_error}")
            return
        try:
            encoded = tokenizer.apply_chat_template(
                messages, tools=tools or None, chat_template=template.text, tokenize=True, return_dict=True,
                return_assistant_tokens_mask=template.has_generation_markers)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{where}: tokenizing the rendered conversation failed: {type(exc).__name__}: {exc}")
            encoded = None
            break
        # A template that prints the time (Hunyuan's strftime_now) may render another text a second later:
        # the ids are compared with a text rendered in the same second.
        if render(messages) == text:
            break
    else:
        problems.append(f"{where}: the template renders this conversation differently each time it is rendered")
        return
    for msg in messages:
        if msg.get("role") == "assistant":
            report.assistant_turns += 1
            report.tool_calls += len(msg.get("tool_calls") or [])
        elif msg.get("role") == "tool":
            report.tool_results += 1
    for tool in tools or []:
        name = (tool.get("function") or {}).get("name") or ""
        if name and name not in text:
            problems.append(f"{where}: tool {name!r} is not in the rendered text (the template drops the tools)")
    spans_of_turns = turns(render, messages, text)
    _reasoning(messages, text, spans_of_turns, report)
    # Per piece found, every place it occurs in its turn (a value may also occur in a result the turn shares).
    found_pieces: list[tuple[_Piece, list[tuple[int, int]]]] = []
    for piece in _pieces(messages):
        occurrences = _occurrences(text, piece.forms, *spans_of_turns[piece.message])
        if occurrences:
            found_pieces.append((piece, occurrences))
        elif piece.kind == "content" and piece.role == "assistant" and messages[piece.message].get("tool_calls"):
            report.properties[TEXT_ON_CALL_TURNS] = report.properties.get(TEXT_ON_CALL_TURNS, 0) + 1
        elif _find(text, piece.forms) is not None:
            problems.append(f"{where}: {piece.what} is not in its turn of the rendered text (only elsewhere)")
        else:
            problems.append(f"{where}: {piece.what} is missing from the rendered text")
    specials = set(_CONTROL.findall(template.text))
    for i, msg in enumerate(messages):
        content = msg.get("content")
        hit = sorted(s for s in specials if isinstance(content, str) and s in content)
        if hit:
            problems.append(f"{where}: messages[{i}] contains the control token(s) {', '.join(hit)}, "
                            "which tokenize as control tokens, not text")
    if encoded is None:
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
    # A piece is under (or outside) the mask where any of its occurrences in its turn is: a report says
    # that no occurrence is where it should be.
    assistant_spans: list[tuple[int, int]] = []
    for piece, occurrences in found_pieces:
        if piece.role == "assistant":
            trained = [(a, b) for a, b in occurrences if all(flags[a:b])]
            assistant_spans += trained
            if not trained:
                problems.append(f"{where}: {piece.what} is outside the assistant mask (not trained on)")
        elif not any(not any(flags[a:b]) for a, b in occurrences):
            problems.append(f"{where}: {piece.what} is inside the assistant mask (trained on)")
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
            "properties": self.properties(),
            "render_errors": self.render_errors(),
            "failures": [r.as_dict() for r in self.records if not r.ok][:200],
        }

    def properties(self) -> list[dict[str, Any]]:
        """What the template drops by design, once each: the turns and records it happened in."""
        out: dict[str, dict[str, Any]] = {}
        for record in self.records:
            for what, turns_dropped in record.properties.items():
                entry = out.setdefault(what, {"property": what, "turns": 0, "records": 0})
                entry["turns"] += turns_dropped
                entry["records"] += 1
        return sorted(out.values(), key=lambda e: (-e["records"], e["property"]))

    def render_errors(self) -> list[dict[str, Any]]:
        """The template's own errors (it cannot render those lines), once each with the lines it refused."""
        out: dict[str, dict[str, Any]] = {}
        for record in self.records:
            if record.render_error:
                entry = out.setdefault(record.render_error, {"error": record.render_error, "records": 0, "lines": []})
                entry["records"] += 1
                if len(entry["lines"]) < 20:
                    entry["lines"].append(record.line)
        return sorted(out.values(), key=lambda e: -e["records"])


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
