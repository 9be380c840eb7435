"""Temporal activities: every side effect of a rollout, as methods of classes that
receive their dependencies (STYLE.md 2)."""
