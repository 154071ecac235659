"""A trajectory as a trace: its steps as spans on one timeline, with the sub-episodes they ran
nested in place (a multi_agent delegate step holds the role's run it started, a round-robin post
the turns of that round), as Langfuse shows spans.

    trace = trace_of(trajectory)     # Trace(root=Run, runs, conversations, ...)

Each span's timeline is the model call that produced it (its turn's first call: the reply's
latency) then the tool's execution; a step that ran sub-episodes lasts at least as long as they
did. Positions are percentages of the whole trace, so nested runs line up with their parent's
step. Tokens are the turn's model call; cost is recorded per run (Trajectory.cost_usd) and shown
per step as its share of the run's by tokens (marked ≈). A sub-episode shows the episode's
reward (multi_agent: one verifier, its reward shared by every role).

Reads only; the pages (apps.tasks.views, apps.reviews.views) render it with tasks/_trace.html.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from apps.tasks.episode import Episode, Step, episode_from
from apps.tasks.models import Trajectory

MAX_DEPTH = 4  # roles of roles of roles: deeper runs are linked, not drawn
MAX_RUNS = 200  # sub-episodes drawn in place on one page; the rest are linked from their step
CHILD_FIELDS = ("id", "parent_id", "role", "label", "parent_step", "status", "outcome", "outcome_reason", "reward",
                "total_tokens", "cost_usd", "messages", "steps", "final_answer", "started_at", "finished_at")


@dataclass
class Span:
    """One step of a run on the trace's timeline (ms from the trace's start)."""

    step: Step
    index: int  # the step's position in its run's records (Trajectory.parent_step of what it ran)
    start_ms: int
    model_ms: int
    tool_ms: int
    tokens: int | None
    cost: Decimal | None
    record: dict[str, Any] = field(default_factory=dict)  # the step as the loop stored it
    children: list[Run] = field(default_factory=list)
    bars: dict[str, float] = field(default_factory=dict)  # left/width percentages of the model call and the tool


@dataclass
class Run:
    """An episode or a sub-episode: its trajectory, its steps as spans, where it sits on the timeline."""

    trajectory: Trajectory
    episode: Episode
    depth: int
    reward: float | None  # the episode's (a sub-episode shares its root's)
    spans: list[Span] = field(default_factory=list)
    after: list[Run] = field(default_factory=list)  # sub-episodes its verifier ran (no parent step)
    start_ms: int = 0
    total_ms: int = 0
    bar: dict[str, float] = field(default_factory=dict)
    truncated: bool = False  # deeper sub-episodes exist, linked rather than drawn


@dataclass
class Trace:
    root: Run
    total_ms: int
    runs: int  # sub-episodes drawn
    protocol: str  # multi_agent's "delegate" / "round_robin", else ""
    conversations: list[dict[str, Any]]  # round_robin: per role, its messages across the rounds


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def _descendants(root: Trajectory) -> dict[int, list[Trajectory]]:
    """parent id -> its sub-episodes (oldest first), level by level: one query per depth."""
    by_parent: dict[int, list[Trajectory]] = {}
    level, drawn = [root.pk], 0
    for _depth in range(MAX_DEPTH):
        if not level or drawn >= MAX_RUNS:
            break
        rows = list(Trajectory.all_objects.filter(parent_id__in=level).only(*CHILD_FIELDS).order_by("id")
                    [: MAX_RUNS - drawn])
        drawn += len(rows)
        for row in rows:
            by_parent.setdefault(row.parent_id, []).append(row)
        level = [row.pk for row in rows]
    return by_parent


def _shared_reward(trajectory: Trajectory) -> float | None:
    """The reward of the episode a run belongs to: its own, or its topmost parent's."""
    reward, parent_id, hops = trajectory.reward, trajectory.parent_id, 0
    while parent_id and hops < MAX_DEPTH + 2:
        row = Trajectory.all_objects.filter(pk=parent_id).values("reward", "parent_id").first()
        if row is None:
            break
        reward, parent_id, hops = row["reward"], row["parent_id"], hops + 1
    return reward


def _build(trajectory: Trajectory, episode: Episode, *, depth: int, origin: int, reward: float | None,
           by_parent: dict[int, list[Trajectory]]) -> Run:
    run = Run(trajectory=trajectory, episode=episode, depth=depth, reward=reward, start_ms=origin)
    records = trajectory.steps if isinstance(trajectory.steps, list) and episode.source == "steps" else []
    children: dict[int | None, list[Trajectory]] = {}
    for child in by_parent.get(trajectory.pk, []):
        children.setdefault(child.parent_step, []).append(child)
    run.truncated = depth + 1 >= MAX_DEPTH and any(children.values())
    total_tokens = trajectory.total_tokens or 0
    cost = trajectory.cost_usd if isinstance(trajectory.cost_usd, Decimal) else None
    clock, previous_turn = origin, object()
    for position, step in enumerate(episode.steps):
        record = records[position] if position < len(records) and isinstance(records[position], dict) else {}
        turn = record.get("turn")
        model_ms = 0
        if record and (turn != previous_turn or turn is None):
            llm = record.get("llm") if isinstance(record.get("llm"), dict) else {}
            model_ms = _int(llm.get("latency_ms"))
        previous_turn = turn
        clock += model_ms
        start = clock
        kids = []
        if not run.truncated:
            for child in children.get(position, []):
                kid = _build(child, episode_from(child.messages, child.steps), depth=depth + 1, origin=clock,
                             reward=reward, by_parent=by_parent)
                clock += kid.total_ms
                kids.append(kid)
        tool_ms = max(_int(record.get("duration_ms")), clock - start)
        clock = start + tool_ms
        tokens = step.actions[0].tokens if step.actions else None
        share = (cost * tokens / total_tokens).quantize(Decimal("0.000001")) \
            if cost and tokens and total_tokens else None
        run.spans.append(Span(step=step, index=position, start_ms=start - model_ms, model_ms=model_ms,
                              tool_ms=tool_ms, tokens=tokens, cost=share, record=record, children=kids))
    if not run.truncated:
        for child in children.get(None, []):  # run by the verifier, after the last step
            kid = _build(child, episode_from(child.messages, child.steps), depth=depth + 1, origin=clock,
                         reward=reward, by_parent=by_parent)
            clock += kid.total_ms
            run.after.append(kid)
    run.total_ms = clock - origin
    return run


def _place(run: Run, total: int) -> int:
    """Fill the bars as percentages of the trace's length; the number of sub-episodes drawn."""
    scale = 100 / total if total else 0
    run.bar = {"left": run.start_ms * scale, "width": max(run.total_ms * scale, 0.5)}
    drawn = 0
    for span in run.spans:
        span.bars = {"model_left": span.start_ms * scale, "model_width": span.model_ms * scale,
                     "tool_left": (span.start_ms + span.model_ms) * scale,
                     "tool_width": max(span.tool_ms * scale, 0.5 if span.tool_ms or not span.model_ms else 0)}
        for kid in span.children:
            drawn += 1 + _place(kid, total)
    for kid in run.after:
        drawn += 1 + _place(kid, total)
    return drawn


def _conversations(run: Run, lead: str) -> list[dict[str, Any]]:
    """A round-robin discussion as one conversation per role: the lead's posts and each role's turns."""
    roles: dict[str, list[dict[str, Any]]] = {}
    rounds = 0
    for span in run.spans:
        action = span.step.actions[0] if span.step.actions else None
        if action is None or action.name != "post" or not span.children:
            continue
        rounds += 1
        args = span.record.get("arguments")
        posted = args.get("message") if isinstance(args, dict) and isinstance(args.get("message"), str) else action.summary
        roles.setdefault(lead, []).append({"round": rounds, "text": posted, "step": span.step.number})
        for kid in span.children:
            said = kid.trajectory.final_answer or f"(no reply: {kid.trajectory.outcome_reason or kid.trajectory.status})"
            roles.setdefault(kid.trajectory.role or kid.trajectory.label, []).append(
                {"round": rounds, "text": said, "trajectory": kid.trajectory, "step": span.step.number})
    return [{"role": name, "messages": entries} for name, entries in roles.items()]


def trace_of(trajectory: Trajectory, episode: Episode | None = None) -> Trace:
    """The trajectory's trace: its run and, nested under the steps that ran them, its sub-episodes'."""
    episode = episode or episode_from(trajectory.messages, trajectory.steps)
    root = _build(trajectory, episode, depth=0, origin=0, reward=_shared_reward(trajectory),
                  by_parent=_descendants(trajectory))
    drawn = _place(root, root.total_ms)
    snapshot = trajectory.config_snapshot if isinstance(trajectory.config_snapshot, dict) else {}
    scene_config = snapshot.get("scene_config") if isinstance(snapshot.get("scene_config"), dict) else {}
    protocol = str(scene_config.get("protocol") or ("delegate" if snapshot.get("scene") == "multi_agent" else ""))
    return Trace(root=root, total_ms=root.total_ms, runs=drawn, protocol=protocol,
                 conversations=_conversations(root, str(trajectory.role or scene_config.get("lead") or "lead"))
                 if protocol == "round_robin" else [])
