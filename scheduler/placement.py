"""Placement policies: which engine instance serves a trajectory's next step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heddle.types import Decision
from scheduler.interface import InstanceState, StepEvent


@dataclass(frozen=True)
class LeastLoaded:
    """Per-step least-loaded routing: the instance with the fewest in-flight steps.

    The walking skeleton's placeholder; ties go to the trajectory's previous instance
    (its prefix cache is there), then to the first instance in cluster order.
    """

    name: str = "least_loaded"

    def decide(self, event: StepEvent, instances: Sequence[InstanceState], now: float) -> Decision:
        if not instances:
            raise ValueError("no engine instance to place a step on")
        best = min(
            instances,
            key=lambda s: (s.num_in_flight, s.instance_id != event.previous_instance),
        )
        reason = "sticky_tie" if best.instance_id == event.previous_instance else "least_loaded"
        return Decision(instance_id=best.instance_id, priority=0, reason=reason)
