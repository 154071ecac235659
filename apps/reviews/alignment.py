"""Rollouts of one task with their steps aligned, for the comparison page.

    rows, first = align([a, b, c])      # a is the pivot; each row holds one step (or None) per rollout

Each rollout's steps are reduced to a signature (tool + canonical arguments); every other rollout
is aligned to the first with difflib's SequenceMatcher, so a step one rollout inserted or dropped
leaves a gap instead of shifting everything after it; within a block where they differ, steps are
paired by similarity (same tool, alike arguments) keeping their order. Steps of different rollouts that land in the
same gap share rows in their order. A row differs when its actions or its observations (the step's
result) are not the same in every rollout; `first` is the index of the first such row (the first
divergence), None when the rollouts agree throughout. Each cell against the pivot's carries the
diffs of its arguments and of its result.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from apps.tasks.episode import arguments_text, diff_html, plain_text
from trajplatform import json_limits

MAX_STEPS = 300  # per rollout: a longer one is cut (and says so), the page stays small
MAX_PAIRING_CELLS = 2500  # a replaced block up to 50 x 50 steps is paired by similarity, a bigger one by position
MIN_SIMILARITY = 0.3
# How much of each signature the similarity reads: SequenceMatcher is quadratic in the text, and
# two 8 KB write_file calls took 1.25 s a pair; the tool and the head of its arguments decide.
SIMILAR_CHARS = 1024


@dataclass
class Cell:
    index: int  # the step's position in its rollout
    tool: str
    arguments: str
    result: str
    error: bool
    signature: str
    arguments_diff: str = ""  # against the pivot's cell in the same row
    result_diff: str = ""


@dataclass
class Row:
    cells: list[Cell | None]
    same_action: bool
    same_result: bool
    first: bool = False

    @property
    def differs(self) -> bool:
        return not (self.same_action and self.same_result)


@dataclass
class Alignment:
    rows: list[Row]
    first: int | None
    cut: list[int] = field(default_factory=list)  # ids of rollouts longer than MAX_STEPS


def letter(column: int) -> str:
    """A, B, C, ... : the columns' names on the page (A and B are the pair a preference decides)."""
    return chr(ord("A") + column) if column < 26 else str(column + 1)


def _cell(index: int, record: Any) -> Cell:
    if not isinstance(record, dict):
        text = plain_text(record)
        return Cell(index=index, tool="?", arguments="", result=text, error=False, signature=f"?:{text}")
    args = record.get("arguments")
    if isinstance(args, str):
        try:
            args = json_limits.loads(args)
        except ValueError:  # not JSON, or nested too deep to parse safely
            pass
    canonical = json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)
    tool = str(record.get("tool") or "?")
    return Cell(index=index, tool=tool, arguments=arguments_text(args),
                result=plain_text(record.get("output")), error=bool(record.get("error") or record.get("env_error")),
                signature=f"{tool}:{canonical}")


def _similar(x: str, y: str) -> float:
    """How alike two signatures are, 0..1; a different tool never matches."""
    if x.split(":", 1)[0] != y.split(":", 1)[0]:
        return 0.0
    return SequenceMatcher(None, x[:SIMILAR_CHARS], y[:SIMILAR_CHARS], autojunk=False).ratio()


def _pair_block(pivot: list[str], other: list[str], i1: int, i2: int, j1: int, j2: int) -> list[tuple[int, int]]:
    """The best order-keeping pairs of a replaced block: each pair's similarity summed (dynamic
    programming), so a step one rollout inserted does not push the others out of line; a big
    block pairs by position."""
    n, m = i2 - i1, j2 - j1
    if n * m > MAX_PAIRING_CELLS:
        return [(i1 + k, j1 + k) for k in range(min(n, m))]
    sim = [[_similar(pivot[i1 + i], other[j1 + j]) for j in range(m)] for i in range(n)]
    best = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            take = best[i - 1][j - 1] + sim[i - 1][j - 1] if sim[i - 1][j - 1] >= MIN_SIMILARITY else -1.0
            best[i][j] = max(best[i - 1][j], best[i][j - 1], take)
    pairs, i, j = [], n, m
    while i and j:
        if sim[i - 1][j - 1] >= MIN_SIMILARITY and best[i][j] == best[i - 1][j - 1] + sim[i - 1][j - 1]:
            pairs.append((i1 + i - 1, j1 + j - 1))
            i, j = i - 1, j - 1
        elif best[i][j] == best[i - 1][j]:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def _gaps_and_matches(pivot: list[str], other: list[str]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """pivot index -> other's matched index, and pivot index -> other's steps inserted before it."""
    matched: dict[int, int] = {}
    inserted: dict[int, list[int]] = {}
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, pivot, other, autojunk=False).get_opcodes():
        pairs = [(i1 + k, j1 + k) for k in range(i2 - i1)] if tag == "equal" else \
            _pair_block(pivot, other, i1, i2, j1, j2) if tag == "replace" else []
        matched.update(pairs)
        # the other's unpaired steps go before the pivot step paired after them (or the block's end)
        paired_j = {j: i for i, j in pairs}
        for j in range(j1, j2):
            if j in paired_j:
                continue
            following = next((paired_j[k] for k in range(j + 1, j2) if k in paired_j), i2)
            inserted.setdefault(following, []).append(j)
    return matched, inserted


def align(rollouts: list[Any]) -> Alignment:
    """The rollouts' steps in aligned rows (see the module docstring); rollouts are Trajectory rows."""
    columns: list[list[Cell]] = []
    cut = []
    for t in rollouts:
        records = t.steps if isinstance(t.steps, list) else []
        if len(records) > MAX_STEPS:
            cut.append(t.pk)
        columns.append([_cell(i, r) for i, r in enumerate(records[:MAX_STEPS])])
    if not columns:
        return Alignment(rows=[], first=None)
    pivot = [c.signature for c in columns[0]]
    maps = [_gaps_and_matches(pivot, [c.signature for c in col]) for col in columns[1:]]
    rows: list[Row] = []
    for i in range(len(pivot) + 1):
        depth = max((len(inserted.get(i, [])) for _m, inserted in maps), default=0)
        for r in range(depth):
            cells: list[Cell | None] = [None]
            for k, (_m, inserted) in enumerate(maps, start=1):
                gap = inserted.get(i, [])
                cells.append(columns[k][gap[r]] if r < len(gap) else None)
            rows.append(_row(cells))
        if i < len(pivot):
            cells = [columns[0][i]] + [columns[k][m[i]] if i in m else None for k, (m, _g) in enumerate(maps, start=1)]
            rows.append(_row(cells))
    first = next((n for n, row in enumerate(rows) if row.differs), None)
    if first is not None:
        rows[first].first = True
    return Alignment(rows=rows, first=first, cut=cut)


def _row(cells: list[Cell | None]) -> Row:
    present = [c for c in cells if c is not None]
    whole = len(present) == len(cells)
    row = Row(cells=cells, same_action=whole and len({c.signature for c in present}) == 1,
              same_result=whole and len({c.result for c in present}) == 1)
    if not present:
        return row
    base_column = next(k for k, c in enumerate(cells) if c is not None)
    base, label = cells[base_column], letter(base_column)
    for cell in present[1:]:
        if cell.signature != base.signature:
            cell.arguments_diff = diff_html(base.arguments, cell.arguments, before_label=label, after_label="this")
        if cell.result != base.result:
            cell.result_diff = diff_html(base.result, cell.result, before_label=label, after_label="this")
    return row
