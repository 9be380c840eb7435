"""The per-token time a decode sees on each instance, from what the engines last
reported: what the drain moves and the merges for long decodes compare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.interface import InstanceState
from scheduler.placement_dp import InstanceModel

# While the batch drains, a decode moves where it runs this much faster per token: a
# wider instance, or one as wide (less loaded). Measured on 3 seeds x 14B coding, 8B
# math, 14B search: 1.25 / 1.5 / 2 all gain; below 1.5 the moves buy no more.
DRAIN_WIDER_GAIN = 1.5
DRAIN_SAME_GAIN = 1.1


@dataclass
class InstanceSpeeds:
    """Per instance: its width, and the steps in flight and the KV they hold as the
    engines last reported them, changed by the moves decided since; from these, the
    per-token time a decode sees there (the DP's instance model)."""

    models: dict[int, InstanceModel]
    width: dict[str, int] = field(default_factory=dict)
    batch: dict[str, int] = field(default_factory=dict)
    kv: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls, instances: Sequence[InstanceState], models: dict[int, InstanceModel]
    ) -> InstanceSpeeds:
        speeds = cls(models)
        for s in instances:
            if s.tp in models:
                speeds.add(s.instance_id, s.tp, s.num_in_flight,
                           s.kv_usage * models[s.tp].kv_capacity_tokens)  # fmt: skip
        return speeds

    def add(self, instance_id: str, tp: int, batch: int = 0, kv: float = 0.0) -> None:
        self.width[instance_id], self.batch[instance_id], self.kv[instance_id] = tp, batch, kv

    def per_token_s(self, instance_id: str, joining_context: float | None = None) -> float:
        """Its per-token time now, or with a decode of `joining_context` added."""
        joining = 0 if joining_context is None else 1
        return float(
            self.models[self.width[instance_id]].per_token_s(
                max(1, self.batch[instance_id] + joining),
                self.kv[instance_id] + (joining_context or 0),
            )
        )

    def faster(self, src: str, dst: str, context: float) -> float | None:
        """A decode's per-token time on `dst` if it beats its time on `src` by the drain
        gain (`DRAIN_WIDER_GAIN` on a wider instance, `DRAIN_SAME_GAIN` on one as wide),
        else None (a narrower `dst`, or an unknown `src`, never qualifies)."""
        if src not in self.width or src == dst or self.width[dst] < self.width[src]:
            return None
        there = self.per_token_s(dst, context)
        gain = DRAIN_WIDER_GAIN if self.width[dst] > self.width[src] else DRAIN_SAME_GAIN
        return there if there * gain < self.per_token_s(src) else None

    def move(self, src: str, dst: str, context: float) -> None:
        self.batch[src] -= 1
        self.kv[src] -= context
        self.batch[dst] += 1
        self.kv[dst] += context


def draining(instances: Sequence[InstanceState]) -> bool:
    """An instance with nothing in flight: the batch is draining and GPUs are spare."""
    return any(s.num_in_flight == 0 for s in instances)
