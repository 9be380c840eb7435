"""Policies by name (STYLE.md 8): an unknown name lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.interface import PlacementPolicy
from scheduler.placement import LeastLoaded

POLICIES: dict[str, Callable[[], PlacementPolicy]] = {
    "least_loaded": LeastLoaded,
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def create_policy(name: str) -> PlacementPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid policies: {policy_names()}") from None
    return factory()
