"""Queue disciplines: in what order an instance serves the steps waiting for it."""

from __future__ import annotations

from dataclasses import dataclass

from heddle.types import TrajectoryView


@dataclass(frozen=True)
class FirstComeFirstServed:
    """Arrival order, no preemption by priority (vLLM's default; verl, slime)."""

    queue: str = "fcfs"

    def priority(self, event: TrajectoryView, now: float) -> int:
        return 0


@dataclass(frozen=True)
class LeastAttainedServiceFirst:
    """Program-level least attained service first (Autellix, arXiv 2502.13965): the
    trajectory that has generated the fewest tokens so far runs first, preemptively."""

    queue: str = "priority"

    def priority(self, event: TrajectoryView, now: float) -> int:
        return event.generated_tokens
