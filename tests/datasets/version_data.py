"""Trajectories and reviews for the dataset version tests, built with the ORM (no agent run)."""
from __future__ import annotations

import json
from datetime import datetime, timezone as dt_timezone
from pathlib import Path
from typing import Any, Callable

import pytest

TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in params}, "required": list(params)}}}
    for name, desc, params in [
        ("run_shell", "Run a shell command in the workspace.", ["command"]),
        ("write_file", "Write a file.", ["path", "content"]),
        ("finish", "End the episode with an answer.", ["answer"]),
    ]
]


def episode(prompt: str, code: str, *, answer: str = "done", id_prefix: str = "c", text: str = "Writing it.") \
        -> list[dict[str, Any]]:
    """system, user prompt, write_file(code), run_shell, finish(answer), with their results."""
    calls = [
        (f"{id_prefix}1", "write_file", {"path": "main.py", "content": code}, "wrote main.py"),
        (f"{id_prefix}2", "run_shell", {"command": "python3 main.py"}, "ok"),
        (f"{id_prefix}3", "finish", {"answer": answer}, "finish accepted"),
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": prompt},
    ]
    for i, (call_id, name, args, result) in enumerate(calls):
        messages.append({"role": "assistant", "content": text if i == 0 else None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result})
    return messages


def make_trajectory(
    task: Any, *, code: str = "print(1)", outcome: str = "success", reward: float | None = 1.0,
    model: str = "model-a", score: float | None = None, verdict: str | None = None, reviewer: Any = None,
    finished_at: datetime | None = None, iteration: int = 1, sample_index: int | None = None,
    id_prefix: str = "c", answer: str = "done", messages: list[dict[str, Any]] | None = None,
) -> Any:
    """A finished trajectory of `task`, with an automatic review (score) and a human review (verdict)."""
    from apps.reviews.models import Review
    from apps.tasks.models import Trajectory

    if sample_index is None:
        sample_index = Trajectory.objects.filter(task=task, iteration=iteration).count()
    t = Trajectory.objects.create(
        task=task, iteration=iteration, sample_index=sample_index, status="finished", outcome=outcome,
        reward=reward, model=model, tools=TOOLS, total_tokens=100 + 10 * sample_index,
        messages=messages if messages is not None else episode(task.prompt, code, answer=answer, id_prefix=id_prefix),
        finished_at=finished_at or datetime(2026, 11, 10, 12, 0, tzinfo=dt_timezone.utc),
    )
    if score is not None:
        Review.objects.create(trajectory=t, kind="auto", status="done", overall=score)
    if verdict is not None:
        Review.objects.create(trajectory=t, kind="human", status="done", verdict=verdict, reviewer=reviewer)
    return t


def no_dedup(spec: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """A filter spec with near-duplicate dedup off (no embedding model needed)."""
    out = dict(spec or {})
    out.update(more)
    out.setdefault("dedup", {"near": False})
    return out


@pytest.fixture(autouse=True)
def export_dir(settings: Any, tmp_path: Path) -> Path:
    """Server-side exports go to a per-test directory (import this fixture into a test module)."""
    settings.DATASET_EXPORT_DIR = tmp_path / "exports"
    return settings.DATASET_EXPORT_DIR


def loader_failing_on_call(n: int, exc: BaseException) -> Callable[..., Any]:
    """A stand-in for exporters.load_records that raises `exc` on its n-th call (a crash mid-export)."""
    from apps.datasets import exporters

    real_load = exporters.load_records
    calls = {"n": 0}

    def load(ids: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return real_load(ids, **kw)

    return load


def run_build(build_id: int) -> Any:
    """Run a queued version build here (as a worker would) and return its version."""
    from apps.datasets.jobs import run_version_build
    from apps.datasets.models import VersionBuild

    run_version_build(build_id)
    build = VersionBuild.objects.select_related("version").get(pk=build_id)
    assert build.status == "done", build.error
    return build.version


def measure_exportability(version: Any) -> Any:
    """Run the exportability measurement a written version queued (as a worker would) and return the
    version as it now is (its card holds the per-format counts)."""
    from apps.datasets.jobs import run_exportability
    from apps.datasets.models import ExportabilityRun

    run = ExportabilityRun.objects.get(version=version)
    run_exportability(run.pk)
    run.refresh_from_db()
    assert run.status == "done", run.error
    version.refresh_from_db()
    return version


VERIFIER = {"files": {"test_main.py": "def test_ok():\n    assert True\n"}, "command": "python3 -m pytest -q"}


def mixed_code_spec(make_task: Callable[..., Any]) -> dict[str, Any]:
    """Code tasks with a verifier (a good and a failed rollout each: 10 members) and tasks without one
    whose only rollout failed (3): rl-verl has no ground truth for those, so it writes fewer lines and
    counts exclusions with reasons. Returns the filter spec of a version of them all, with a split
    seed under which both splits hold a verified and an unverified task (the split hashes task ids,
    which differ between databases: PostgreSQL's test database is shared)."""
    from apps.datasets.services import split_of

    tasks = []
    for i in range(5):
        task = make_task(prompt=f"Write program number {i}", scene_config={"verifier": VERIFIER})
        make_trajectory(task, code=f"print({i})", score=90, reward=1.0)
        make_trajectory(task, code=f"print({i}) # wrong", outcome="failure", reward=0.0, score=30)
        tasks.append(task)
    for i in range(3):
        task = make_task(prompt=f"Explain topic number {i}")
        make_trajectory(task, code=f"print('topic {i}')", outcome="failure", reward=0.0, score=40)
        tasks.append(task)
    seed = next(s for s in range(100) if all(
        {split_of(t.pk, s, 0.4) for t in group} == {"train", "validation"} for group in (tasks[:5], tasks[5:])))
    return no_dedup(validation_fraction=0.4, split_seed=seed)
