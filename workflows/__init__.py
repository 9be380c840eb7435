"""Temporal workflows: orchestration only, deterministic, no I/O and no heavy imports."""
