"""WAR's routing, as REFERENCES.md states it.

Below a load threshold: least-request with sticky sessions. Above it: a score per
replica from cache locality (the trajectory's context is there) and in-flight count, and
per request an order by estimated turns left (an EMA of finished siblings' turns).
Not modelled: suffix speculative decoding and the AIMD concurrency window (no published
parameters); see docs/policies.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from heddle.types import Decision, TrajectoryView
from scheduler.interface import InstanceState
from scheduler.placement import StickySessions, least_loaded

EMA_WEIGHT = 0.3


@dataclass
class TurnsLeft:
    """EMA of total turns over a group's finished trajectories."""

    ema: dict[str, float] = field(default_factory=dict)
    global_ema: float = 4.0

    def observe(self, group_id: str, turns: int) -> None:
        old = self.ema.get(group_id, self.global_ema)
        self.ema[group_id] = (1 - EMA_WEIGHT) * old + EMA_WEIGHT * turns
        self.global_ema = (1 - EMA_WEIGHT) * self.global_ema + EMA_WEIGHT * turns

    def left(self, event: TrajectoryView) -> float:
        return max(0.0, self.ema.get(event.group_id, self.global_ema) - event.step_index)


@dataclass
class WarPlacement(StickySessions):
    seats_per_instance: int = 256
    load_threshold: float = 0.5
    cache_weight: float = 1.0
    load_weight: float = 2.0
    turns: TurnsLeft = field(default_factory=TurnsLeft)

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        load = sum(s.num_in_flight for s in instances) / (len(instances) * self.seats_per_instance)
        if load < self.load_threshold:
            return super().place(event, instances, now)

        def score(s: InstanceState) -> float:
            hit = 1.0 if s.instance_id == event.previous_instance else 0.0
            return (
                self.cache_weight * hit
                - self.load_weight * s.num_in_flight / self.seats_per_instance
            )

        best = max(instances, key=lambda s: (score(s), -s.num_in_flight))
        if best.num_in_flight > least_loaded(instances).num_in_flight + self.seats_per_instance:
            best = least_loaded(instances)
        self.sessions[event.trajectory_id] = best.instance_id
        return Decision(best.instance_id, reason="score")

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        super().on_trajectory_done(trajectory_id, group_id, generated_tokens, num_turns)
        self.turns.observe(group_id, num_turns)


@dataclass(frozen=True)
class FewestTurnsLeft:
    """WAR's request order: fewest estimated turns left first (tenths of a turn)."""

    turns: TurnsLeft
    queue: str = "priority"

    def priority(self, event: TrajectoryView, now: float) -> int:
        return int(10 * self.turns.left(event))
