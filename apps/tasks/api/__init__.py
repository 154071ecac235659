"""The tasks REST API: tasks, batches, trajectories (see trajplatform/api.py for the shared parts)."""
