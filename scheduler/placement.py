"""Placements: which engine instance serves a trajectory's next step.

Each baseline's docstring names the source of its rule (REFERENCES.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from heddle.types import Decision, TrajectoryView
from scheduler.interface import InstanceState


def least_loaded(instances: Sequence[InstanceState], prefer: str | None = None) -> InstanceState:
    """Fewest in-flight steps; ties to `prefer` (its prefix cache is there), then order."""
    if not instances:
        raise ValueError("no engine instance to place a step on")
    return min(instances, key=lambda s: (s.num_in_flight, s.instance_id != prefer))


class NoHooks:
    """A placement that keeps no per-trajectory state: nothing to learn from the hooks."""

    def on_step_done(self, event: TrajectoryView, instance_id: str, output_tokens: int) -> None:
        return None

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        return None


@dataclass
class LeastLoaded(NoHooks):
    """Per-step least-loaded routing (the walking skeleton's placeholder); ties go to
    the trajectory's previous instance."""

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        best = least_loaded(instances, event.previous_instance)
        reason = "sticky_tie" if best.instance_id == event.previous_instance else "least_loaded"
        return Decision(best.instance_id, reason=reason)


@dataclass
class StickySessions(NoHooks):
    """verl's agent-loop load balancer: a sticky request-id -> server map (LRU) and,
    for a new session, the server with the fewest in-flight requests
    (verl `AsyncLLMServerManager`, REFERENCES.md "verl")."""

    max_sessions: int = 1 << 20
    sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        known = self.sessions.get(event.trajectory_id)
        if known is not None and any(s.instance_id == known for s in instances):
            self.sessions.move_to_end(event.trajectory_id)
            return Decision(known, reason="sticky")
        best = least_loaded(instances)
        self.sessions[event.trajectory_id] = best.instance_id
        if len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
        return Decision(best.instance_id, reason="new_session_least_loaded")

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        self.sessions.pop(trajectory_id, None)


@dataclass
class SkewSwitch(StickySessions):
    """verl*: least-load when the in-flight skew between the busiest and the idlest
    instance exceeds `threshold` (32, as SGLang's balance_abs_threshold), otherwise
    verl's sticky sessions (Heddle paper's variant of verl, REFERENCES.md)."""

    threshold: int = 32

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        loads = [s.num_in_flight for s in instances]
        if max(loads) - min(loads) > self.threshold:
            best = least_loaded(instances, event.previous_instance)
            self.sessions[event.trajectory_id] = best.instance_id
            return Decision(best.instance_id, reason="skew_least_loaded")
        return super().place(event, instances, now)


@dataclass
class CacheAware(NoHooks):
    """slime through the SGLang router's `cache_aware` policy: shortest queue when
    `max - min > abs_threshold` and `max > rel_threshold * min`; otherwise the longest
    prefix match, i.e. the instance holding the trajectory's context, or for a first step
    the one holding its GRPO group's prompt (sgl-router `cache_aware.rs`)."""

    abs_threshold: int = 32
    rel_threshold: float = 1.0001
    group_home: dict[str, str] = field(default_factory=dict)

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        loads = [s.num_in_flight for s in instances]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.abs_threshold and hi > self.rel_threshold * lo:
            best = least_loaded(instances)
            self.group_home.setdefault(event.group_id, best.instance_id)
            return Decision(best.instance_id, reason="imbalance_shortest_queue")
        ids = {s.instance_id for s in instances}
        match = event.previous_instance or self.group_home.get(event.group_id)
        if match in ids:
            return Decision(match, reason="prefix_match")  # type: ignore[arg-type]
        best = least_loaded(instances)
        self.group_home.setdefault(event.group_id, best.instance_id)
        return Decision(best.instance_id, reason="no_match_shortest_queue")


@dataclass
class StickyLeastSessions(NoHooks):
    """SkyRL / vllm-router session affinity: a new session goes to the instance with the
    fewest active sessions and stays there (REFERENCES.md "sticky_least_loaded")."""

    home: dict[str, str] = field(default_factory=dict)

    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        known = self.home.get(event.trajectory_id)
        if known is not None and any(s.instance_id == known for s in instances):
            return Decision(known, reason="sticky")
        best = min(instances, key=lambda s: (s.num_sessions, s.num_in_flight))
        self.home[event.trajectory_id] = best.instance_id
        return Decision(best.instance_id, reason="fewest_sessions")

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        self.home.pop(trajectory_id, None)
