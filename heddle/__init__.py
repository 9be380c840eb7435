"""Heddle: trajectory-level scheduling for the rollout phase of agentic RL."""

__version__ = "0.1.0"
