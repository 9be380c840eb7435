"""A custom verifier that crashes (the agent-rollout tests import it by path)."""

from typing import Any


def verify(text: str, params: dict[str, Any]) -> float:
    raise RuntimeError("this verifier always crashes")
