"""A test policy that reshapes during rollout: four TP-1 instances, the idle pair c+d
merged into a TP-2 "m" that then takes every step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from heddle.types import Decision, TrajectoryView
from scheduler.interface import InstanceSpec, InstanceState, Reshape
from scheduler.placement import LeastLoaded


@dataclass
class MergeIdlePair:
    merged: bool = False
    ready: list[str] = field(default_factory=list)

    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        return [InstanceSpec(i, 1) for i in "abcd"]

    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]:
        idle = {s.instance_id for s in instances if not s.num_in_flight and not s.num_sessions}
        if self.merged or not {"c", "d"} <= idle:
            return []
        self.merged = True
        return [Reshape(("c", "d"), InstanceSpec("m", 2), 20.0, "test")]

    def on_instance_ready(self, spec: InstanceSpec) -> None:
        self.ready.append(spec.instance_id)


class OnMergedWhenUp(LeastLoaded):
    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        up = {s.instance_id for s in instances}
        return Decision("m" if "m" in up else "a", reason="test")
