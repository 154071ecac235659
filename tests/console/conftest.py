"""Fixtures of the console tests: trajectories awaiting a human verdict."""
from __future__ import annotations

from typing import Any, Callable

import pytest
from django.utils import timezone

from apps.tasks.models import Batch, Task
from tests.reviews.factories import auto_review, finished_trajectory


@pytest.fixture
def awaiting(make_task: Callable[..., Any]) -> Callable[..., list[Any]]:
    """awaiting(n, score=60, batch=None): n finished trajectories (one task each, current iteration 1)
    whose automatic review scored below the threshold (80): the human queue's items, oldest first."""
    def _make(n: int = 3, score: float | None = 60.0, batch: Batch | None = None, **review: Any) -> list[Any]:
        batch = batch or Batch.objects.create(name=f"queue batch {timezone.now().timestamp()}")
        items = []
        for i in range(n):
            task = make_task(batch=batch, external_id=f"q{i}")
            Task.objects.filter(pk=task.pk).update(status=Task.Status.COMPLETED, current_iteration=1)
            trajectory = finished_trajectory(task)
            auto_review(trajectory, score, **review)
            items.append(trajectory)
        return items

    return _make
