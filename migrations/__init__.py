"""Alembic migrations of the trajectory store (applied by `heddle.store.upgrade`)."""
