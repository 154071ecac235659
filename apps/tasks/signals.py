"""Signals of apps.tasks. The apps above it listen (connected in their AppConfig.ready), so tasks
imports none of them."""
from __future__ import annotations

from django.dispatch import Signal

# A task's iteration finished (its last trajectory reached a final state) and the task moved to
# "reviewing": sent after that transaction commits, once, with `task_id` and `iteration`.
# apps.reviews queues the iteration's review on it.
iteration_finished = Signal()
