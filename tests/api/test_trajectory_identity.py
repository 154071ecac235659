"""A trajectory's identity beyond this database (issue 21, item 5): the API shows its UUID, the
key of its LLM-cache entries, and the claims its workers lost."""
from __future__ import annotations

from typing import Any

import pytest

from apps.tasks.models import Trajectory

pytestmark = pytest.mark.django_db


def test_the_trajectory_api_shows_its_uuid_and_worker_losses(client_as: Any, make_task: Any) -> None:
    trajectory = Trajectory.objects.create(task=make_task(), iteration=1, sample_index=0, worker_losses=2)
    client = client_as("viewer")
    [row] = client.get("/api/v1/trajectories").json()["results"]
    detail = client.get(f"/api/v1/trajectories/{trajectory.pk}").json()
    assert row["uuid"] == detail["uuid"] == str(trajectory.uuid)
    assert row["worker_losses"] == detail["worker_losses"] == 2
