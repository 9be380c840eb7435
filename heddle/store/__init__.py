"""The trajectory store: batches, trajectories, steps and texts (SQLAlchemy)."""

from heddle.store.db import TrajectoryStore, default_url, upgrade

__all__ = ["TrajectoryStore", "default_url", "upgrade"]
