"""What each export format would write of a version, found when the version is made.

Version creation (services.dataset_version_create) runs every applicable format's renderer and
validator over the members, in chunks cut at task boundaries as the export job cuts them, with
the exporters' dry run (nothing is written, a vision format only looks its images up), and puts
the result in the data card under `exportability`:

    {"options": {...the defaults measured with...},
     "formats": {fmt: {"lines": {"all": n, "train": n, "validation": n}, "excluded": n,
                       "reasons": {reason: count},
                       "stale_prompts": n}},   # only when some: lines whose system prompt still names finish
     "not_applicable": {fmt: why},            # a scene's own format, and none of its scenes here
     "roles": {"lead": {fmt: lines}, "all": {fmt: lines}},   # multi_agent versions: the other choices
     "final_answer": {"tool": {fmt: lines}}}   # the chat formats with final_answer tool (answers.py)

A format applies to a version when it is made for every scene (no `scenes` declared) or for one
of the version's scenes (apps/engines/scenes/<id>/scene.py export_formats), and it is offered for
export when it would write at least one line of the split. Publishing warns about members a
version's own scene's format would exclude (`publish_warnings`).
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.conf import settings

from apps.datasets.exporters import FORMATS, check_options, export_records, load_records
from apps.datasets.exporters.roles import SCENE as MULTI_AGENT, flatten
from apps.datasets.models import ExportJob
from apps.engines.registry import SCENES

SPLITS = ("train", "validation")
ROLE_VARIANTS = ExportJob.ROLES[1:]  # "trainable" is the default the formats are measured with
MAX_REASONS = 20
Progress = Callable[[str, int, int], None]


class _Discard:
    """A binary sink that keeps nothing: the dry run's lines are counted, not stored."""

    def write(self, data: bytes) -> int:
        return len(data)


def _declared(fmt: str) -> tuple[str, ...]:
    return FORMATS[fmt].scenes


def not_applicable_reason(fmt: str, scenes: Iterable[str]) -> str:
    """Why a format does not apply to a version of these scenes ("" when it does)."""
    own = _declared(fmt)
    present = sorted(set(scenes))
    if not own or set(own) & set(present):
        return ""
    return (f"{fmt} is made for {', '.join(own)} trajectories; this version has "
            f"{', '.join(present) or 'no members'}")


def _whole_episode(fmt: str) -> bool:
    """Formats that take a multi_agent episode whole (no per-role views): the roles option is moot."""
    e = FORMATS[fmt]
    return e.pairwise or e.one_per_task or fmt in ("raw", "multiagent-agentjet")


_POSITION = re.compile(r"\[\d+\]")
_IDS = re.compile(r"\b(task|trajectory|image) #?[0-9a-f]{1,64}\b")


def reason_kind(reason: str) -> str:
    """An export exclusion reason without the positions and ids that make every one unique
    ("messages[3]" -> "messages[i]", "task 12" -> "task"); its other numbers stay."""
    return _IDS.sub(r"\1", _POSITION.sub("[i]", reason))


def _chunks(members: Sequence[tuple[int, int]], size: int) -> Iterable[list[int]]:
    """Trajectory ids in runs of about `size`, never splitting a task (the export job's cut)."""
    current: list[int] = []
    last_task = None
    for trajectory_id, task_id in members:
        if len(current) >= size and task_id != last_task:
            yield current
            current = []
        current.append(trajectory_id)
        last_task = task_id
    if current:
        yield current


Chunk = tuple[str, list[int]]  # (split, trajectory ids)
Saved = Callable[[int, int, dict[str, Any]], None]  # (chunks done, members done, the tallies so far)


def plan(members: Sequence[tuple[int, int, str]], chunk_size: int | None = None) -> list[Chunk]:
    """The measurement's chunks of these members ((trajectory id, task id, split) in position
    order): each split's in turn, train first, cut as the export job cuts them. The same members
    always give the same chunks, so a resumed run skips exactly the ones it finished."""
    size = max(1, chunk_size or settings.DATASET_EXPORT_CHUNK)
    return [(split, chunk) for split in SPLITS
            for chunk in _chunks([(t, task) for t, task, s in members if s == split], size)]


def new_tallies(scenes: Iterable[str]) -> dict[str, Any]:
    """The counts of a measurement that has read no chunk yet: JSON, so a run can keep them
    between chunks (ExportabilityRun.tallies) and resume."""
    scenes = sorted(set(scenes))
    applicable = [f for f in sorted(FORMATS) if not not_applicable_reason(f, scenes)]
    variants = ROLE_VARIANTS if MULTI_AGENT in scenes else ()
    return {
        "scenes": scenes,
        "formats": {f: {"lines": {"all": 0, **{s: 0 for s in SPLITS}}, "excluded": 0, "reasons": {}, "by_scene": {}}
                    for f in applicable},
        "roles": {v: {f: 0 for f in applicable if not _whole_episode(f)} for v in variants},
        # the formats' default is final_answer text (or no such option); the tool form is counted beside it
        "tool": {f: 0 for f in applicable if "tool" in FORMATS[f].final_answers},
    }


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1  # a dict keeps the order first met: most_common breaks ties by it


def _add_chunk(tallies: dict[str, Any], split: str, records: list[dict[str, Any]]) -> None:
    """Every applicable format's dry run over one chunk's records, added to `tallies`."""
    scene_of = {}
    for r in records:
        scene = (r.get("task") or {}).get("scene") or ""
        scene_of[r["trajectory_id"]] = scene
        scene_of.update((child["trajectory_id"], scene) for child in flatten(r.get("subtrajectories") or []))
    roles, tool = tallies["roles"], tallies["tool"]
    for fmt, tally in tallies["formats"].items():
        result = export_records(fmt, iter(records), _Discard(), dry_run=True,  # type: ignore[arg-type]
                                options={"split": split})
        tally["lines"][split] += result.lines
        tally["lines"]["all"] += result.lines
        tally["excluded"] += len(result.excluded)
        if result.stale_prompts:  # text-form lines whose system prompt still names finish (answers.py)
            tally["stale_prompts"] = tally.get("stale_prompts", 0) + len(result.stale_prompts)
        for e in result.excluded:
            kind = reason_kind(e["reason"])
            _count(tally["reasons"], kind)
            _count(tally["by_scene"].setdefault(scene_of.get(e["trajectory_id"], ""), {}), kind)
        if fmt in tool:
            tool[fmt] += export_records(fmt, iter(records), _Discard(), dry_run=True,  # type: ignore[arg-type]
                                        options={"split": split, "final_answer": "tool"}).lines
        for variant, lines in roles.items():
            if fmt in lines:
                lines[fmt] += export_records(fmt, iter(records), _Discard(), dry_run=True,  # type: ignore[arg-type]
                                             options={"split": split, "roles": variant}).lines


def section(tallies: dict[str, Any]) -> dict[str, Any]:
    """The card's `exportability` section from a finished measurement's tallies."""
    scenes = tallies["scenes"]
    formats = {}
    for fmt, tally in tallies["formats"].items():
        formats[fmt] = {**tally, "reasons": dict(Counter(tally["reasons"]).most_common(MAX_REASONS)),
                        "by_scene": {scene: {"excluded": sum(c.values()), "reasons": dict(Counter(c).most_common(MAX_REASONS))}
                                     for scene, c in sorted(tally["by_scene"].items())}}
    out: dict[str, Any] = {
        "options": {"roles": "trainable", "images": "files", "final_answer": "text"},
        "formats": formats,
        "not_applicable": {f: not_applicable_reason(f, scenes) for f in sorted(FORMATS) if f not in formats},
        "final_answer": {"tool": tallies["tool"]},
    }
    if tallies["roles"]:
        out["roles"] = tallies["roles"]
    return out


def measure(members: Sequence[tuple[int, int, str]], scenes: Iterable[str], *,
            progress: Progress | None = None, chunk_size: int | None = None,
            tallies: dict[str, Any] | None = None, start: int = 0, saved: Saved | None = None) -> dict[str, Any]:
    """The card's `exportability` section for these members ((trajectory id, task id, split) in
    position order) of a version whose members' scenes are `scenes`. The one loop of the worker's
    job and the command (jobs.exportability_run): `tallies` and `start` resume a run after its
    first `start` chunks; `saved(chunks done, members done, tallies)` is called after each chunk."""
    chunks = plan(members, chunk_size)
    tallies = tallies if tallies is not None else new_tallies(scenes)
    done = sum(len(ids) for _, ids in chunks[:start])
    for i, (split, ids) in enumerate(chunks[start:], start + 1):
        _add_chunk(tallies, split, list(load_records(ids)))
        done += len(ids)
        if saved:
            saved(i, done, tallies)
        if progress:
            progress("exportability", done, len(members))
    return section(tallies)


# --- reading a version's card ----------------------------------------------------------------------

def _scenes_of(card: dict[str, Any]) -> list[str]:
    return sorted(s for s in (card.get("by_scene") or {}) if s)


def offered(card: dict[str, Any], split: str = "all") -> list[dict[str, Any]]:
    """The formats a version's export form offers, by name: those that apply to its scenes and
    would write a line of the split, each {"format", "description", "lines", "excluded"}; a card
    made before the counts existed offers every applicable format, with lines None."""
    section = card.get("exportability")
    out = []
    for fmt in sorted(FORMATS):
        if section is None:
            if not not_applicable_reason(fmt, _scenes_of(card)):
                out.append({"format": fmt, "description": FORMATS[fmt].description, "lines": None,
                            "excluded": None})
            continue
        tally = (section.get("formats") or {}).get(fmt)
        if tally is not None and tally["lines"].get(split, 0) > 0:
            out.append({"format": fmt, "description": FORMATS[fmt].description, "lines": tally["lines"][split],
                        "excluded": tally["excluded"]})
    return out


def empty_split(card: dict[str, Any], split: str) -> str:
    """Why a split of a version with this card cannot be exported ("" when it can): it has no member."""
    if split != "all" and (card.get("counts") or {}).get(split) == 0:
        return f"the {split} split of this version has no member (see its filter spec's validation_fraction)"
    return ""


def rows(card: dict[str, Any]) -> list[tuple[str, dict[str, Any], int | None]]:
    """The card's per-format counts as the version page lists them: (format, its tally, its lines with
    final_answer tool, None for a format without the option or a card made before they were counted)."""
    section = card.get("exportability") or {}
    tool = (section.get("final_answer") or {}).get("tool") or {}
    return [(fmt, tally, tool.get(fmt)) for fmt, tally in (section.get("formats") or {}).items()]


def refusal(card: dict[str, Any], fmt: str, split: str = "all") -> str:
    """Why `fmt` cannot be exported for a version with this card ("" when it can): the format is
    not made for its scenes, or it would write no line of the split (with the counted reasons)."""
    section = card.get("exportability")
    if section is None:
        reason = not_applicable_reason(fmt, _scenes_of(card))
        return f"format {fmt} does not apply to this version: {reason}" if reason else ""
    if fmt in (section.get("not_applicable") or {}):
        return f"format {fmt} does not apply to this version: {section['not_applicable'][fmt]}"
    tally = (section.get("formats") or {}).get(fmt)
    if tally is None:
        return f"format {fmt} was not measured for this version; create a new version to export with it"
    if tally["lines"].get(split, 0) == 0:
        if empty := empty_split(card, split):
            return empty
        reasons = "; ".join(f"{n} × {r}" for r, n in list(tally["reasons"].items())[:3])
        where = "" if split == "all" else f" of the {split} split"
        return f"format {fmt} would write no line{where} of this version" + (f" ({reasons})" if reasons else "")
    return ""


ROLE_CHOICES = ExportJob.ROLES
# Formats that take a multi_agent episode whole but read the roles option: AgentJet's timelines
# mark the selected roles trainable (their turns carry the loss).
ROLES_READ_WHOLE = ("multiagent-agentjet",)


def roles_refusal(card: dict[str, Any], fmt: str, roles: str) -> str:
    """Why the roles option cannot be `roles` for this export ("" when it can): a choice other than
    the default needs a multi_agent version and a format that reads it, and must write a line."""
    if roles == "trainable":
        return ""
    if roles not in ROLE_CHOICES:
        return f"roles: one of {', '.join(ROLE_CHOICES)}"
    if MULTI_AGENT not in _scenes_of(card):
        return (f"roles: only multi_agent versions have per-role views; this version has "
                f"{', '.join(_scenes_of(card)) or 'no members'}")
    if fmt in FORMATS and _whole_episode(fmt) and fmt not in ROLES_READ_WHOLE:
        return f"roles: {fmt} takes each multi_agent episode whole (the lead's view or the whole record)"
    measured = ((card.get("exportability") or {}).get("roles") or {}).get(roles) or {}
    if fmt in measured and measured[fmt] == 0:
        return f"roles: {fmt} would write no line of this version with roles {roles}"
    return ""


def final_answer_refusal(card: dict[str, Any], fmt: str, final_answer: str | None) -> str:
    """Why the final_answer option cannot be `final_answer` for this export ("" when it can): the format
    does not take that value (exporters.check_options), or it would write no line of this version so."""
    if final_answer is None:
        return ""
    if fmt in FORMATS:
        try:
            check_options(fmt, {"final_answer": final_answer})
        except ValueError as exc:
            return str(exc)
    measured = ((card.get("exportability") or {}).get("final_answer") or {}).get(final_answer) or {}
    if measured.get(fmt) == 0:
        return f"final_answer: {fmt} would write no line of this version with final_answer {final_answer}"
    return ""


def role_options(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The export form's roles choices for a multi_agent version ([] for others): each
    {"roles", "label", "lines": {fmt: lines}} (the default's lines are the formats' own)."""
    if MULTI_AGENT not in _scenes_of(card):
        return []
    section = card.get("exportability") or {}
    default = {f: t["lines"]["all"] for f, t in (section.get("formats") or {}).items()
               if not _whole_episode(f)}
    labels = {"trainable": "trainable roles (every role not marked trainable: false)", "lead": "the lead only",
              "all": "all roles"}
    return [{"roles": r, "label": labels[r], "lines": default if r == "trainable" else (section.get("roles") or {}).get(r, {})}
            for r in ROLE_CHOICES]


def publish_warnings(card: dict[str, Any]) -> list[str]:
    """Members of a version's own scenes that their scene's format would exclude, one line per
    format: what publishing warns about (the version publishes all the same)."""
    section = card.get("exportability")
    if section is None:
        return []
    warnings = []
    for scene in _scenes_of(card):
        for fmt in scene_formats(scene):
            tally = (section.get("formats") or {}).get(fmt) or {}
            own = (tally.get("by_scene") or {}).get(scene)
            if own and own["excluded"]:
                reasons = "; ".join(f"{n} × {r}" for r, n in own["reasons"].items())
                warnings.append(f"{fmt}, {scene}'s format, would exclude {own['excluded']} of this version's "
                                f"{scene} rows ({tally['lines']['all']} lines written): {reasons}")
    return warnings


def scene_formats(scene: str) -> list[str]:
    """A scene's own formats: those its declaration names, and the format named after it (toucan,
    toolace: the anchors' datasets it reproduces)."""
    spec = SCENES.get(scene)
    own = list(spec.export_formats) if spec is not None else []
    return own + ([scene] if scene in FORMATS and scene not in own else [])
