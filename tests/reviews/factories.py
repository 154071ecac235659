"""Rows for review tests without running rollouts: a reviewed iteration, proposals waiting."""
from __future__ import annotations

from typing import Any

from django.utils import timezone

from apps.reviews.models import Proposal, Review
from apps.tasks.models import Task, Trajectory

STEPS = [
    {"index": 0, "turn": 1, "tool": "run_shell", "arguments": {"command": "ls"}, "output": "a.py", "exit_code": 0},
    {"index": 1, "turn": 2, "tool": "finish", "arguments": {"answer": "done"}, "output": "finish accepted",
     "exit_code": None},
]


def finished_trajectory(task: Task, *, iteration: int = 1, sample: int = 0, **fields: Any) -> Trajectory:
    values = {
        "status": Trajectory.Status.FINISHED, "outcome": "success", "outcome_reason": "finished; verifier passed",
        "reward": 1.0, "final_answer": "done", "steps": STEPS,
        "tools": [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                  for n in ("run_shell", "finish")],
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": task.prompt}],
        "config_snapshot": task.config_snapshot(), "finished_at": timezone.now(), "model": "fake-model",
    }
    values.update(fields)
    return Trajectory.objects.create(task=task, iteration=iteration, sample_index=sample, **values)


def auto_review(trajectory: Trajectory, overall: float | None = 60.0, **fields: Any) -> Review:
    values = {"status": Review.Status.DONE if overall is not None else Review.Status.JUDGE_FAILED,
              "overall": overall, "judge_model": "fake-judge", "attempts": 1,
              "scores": {"tool_usage": {"score": overall or 0, "rationale": "r"}}, "checks": {}}
    values.update(fields)
    return Review.objects.create(trajectory=trajectory, kind=Review.Kind.AUTO, **values)


def waiting_task(make_task: Any, **fields: Any) -> dict[str, Any]:
    """A task whose iteration 1 was reviewed below threshold, with a yellow and a red proposal pending."""
    fields.setdefault("max_iterations", 3)
    task = make_task(**fields)
    trajectory = finished_trajectory(task)
    review = auto_review(trajectory)
    Task.objects.filter(pk=task.pk).update(status=Task.Status.WAITING_APPROVAL, current_iteration=1,
                                           started_at=timezone.now())
    task.refresh_from_db()
    yellow = Proposal.objects.create(
        task=task, review=review, iteration=1, field="model", from_value="", to_value="deepseek-flash",
        options=["deepseek-flash", "gpt-4o-mini"], tier=Proposal.Tier.YELLOW, proposer="review-agent",
        rationale="the judge suggests a stronger model",
    )
    red = Proposal.objects.create(
        task=task, review=review, iteration=1, field="timeout_s", from_value=600.0, to_value=1200.0,
        tier=Proposal.Tier.RED, proposer="rule:timeout", impact_note="longer runs cost more",
        rationale="the wall-clock limit was hit",
    )
    return {"task": task, "trajectory": trajectory, "review": review, "yellow": yellow, "red": red}
