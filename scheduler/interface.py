"""The questions a policy answers, as small interfaces (DESIGN.md, "Policies").

Policies are pure: they take the state and the time as arguments and return a
`Decision` with a reason; the scheduler service and the simulator apply it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from heddle.types import Decision


@dataclass(frozen=True)
class InstanceState:
    instance_id: str
    # Steps decided for this instance and not yet reported back (waiting or running).
    num_in_flight: int = 0


@dataclass(frozen=True)
class StepEvent:
    """A trajectory about to run its next LLM step."""

    trajectory_id: str
    group_id: str
    step_index: int
    context_tokens: int
    generated_tokens: int
    previous_instance: str | None = None


class PlacementPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(self, event: StepEvent, instances: Sequence[InstanceState], now: float) -> Decision:
        """Pick the instance and priority for the step."""
        ...
