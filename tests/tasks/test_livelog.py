"""Live-log lines: per-trajectory sequence numbers, redaction, broadcast after commit."""
from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import override_settings

from apps.tasks.models import Trajectory, TrajectoryLog
from apps.tasks.services import trajectory_group_name, trajectory_log_append

pytestmark = pytest.mark.django_db


def test_lines_get_consecutive_sequence_numbers_per_trajectory(make_task):
    task = make_task()
    a = Trajectory.objects.create(task=task, iteration=1, sample_index=0)
    b = Trajectory.objects.create(task=task, iteration=1, sample_index=1)
    trajectory_log_append(trajectory_id=a.pk, lines=[("system", "start", {}), ("action", "ls", {"step": 1})])
    trajectory_log_append(trajectory_id=b.pk, lines=[("system", "start", {})])
    trajectory_log_append(trajectory_id=a.pk, lines=[("output", "file.txt", {})])
    assert list(TrajectoryLog.objects.filter(trajectory=a).values_list("seq", "kind")) == [
        (1, "system"), (2, "action"), (3, "output")]
    assert list(TrajectoryLog.objects.filter(trajectory=b).values_list("seq", flat=True)) == [1]


@override_settings(LLM_API_KEY="sk-live-secret-value-1234567890")
def test_secrets_are_redacted_before_they_are_stored(make_task):
    trajectory = Trajectory.objects.create(task=make_task(), iteration=1)
    trajectory_log_append(
        trajectory_id=trajectory.pk,
        lines=[("output", "key is sk-live-secret-value-1234567890", {"env": "sk-live-secret-value-1234567890"})],
    )
    line = TrajectoryLog.objects.get(trajectory=trajectory)
    assert "sk-live-secret-value-1234567890" not in line.message + str(line.data)
    assert "[REDACTED]" in line.message


@pytest.mark.django_db(transaction=True)
def test_lines_are_broadcast_to_the_trajectory_group_after_commit(make_task):
    trajectory = Trajectory.objects.create(task=make_task(), iteration=1)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(trajectory_group_name(trajectory.pk), channel)
    trajectory_log_append(trajectory_id=trajectory.pk, lines=[("thought", "plan", {})])
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "log.lines"
    assert message["trajectory"] == trajectory.pk
    assert [(line["seq"], line["kind"], line["message"]) for line in message["lines"]] == [(1, "thought", "plan")]


def test_appending_to_an_unknown_trajectory_raises_and_writes_nothing():
    with pytest.raises(Trajectory.DoesNotExist):
        trajectory_log_append(trajectory_id=987654, lines=[("system", "start", {})])
    assert not TrajectoryLog.objects.exists()
