"""The questions a policy answers, as small interfaces (DESIGN.md, "Policies").

- order: the priority of a step in its instance's queue (`Order`);
- placement: the instance a step runs on (`Placement`);
- split: how the GPUs are cut into instances (`Split`).

Policies are pure: they take the state and the time as arguments and return a `Decision`
with a reason; the scheduler service (live) and the simulator apply it. Placements may
keep their own bookkeeping (sticky maps, learned trees), fed by the `on_*` hooks; never
a clock, randomness or I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from heddle.hardware import ClusterShape
from heddle.types import Decision, TrajectorySpec, TrajectoryView


@dataclass(frozen=True)
class InstanceSpec:
    """One engine instance of a split: its id, TP degree and role (e.g. a Libra bucket)."""

    instance_id: str
    tp: int
    role: str = ""


@dataclass(frozen=True)
class InstanceState:
    instance_id: str
    num_in_flight: int = 0  # steps placed here and not finished (waiting or running)
    num_sessions: int = 0  # unfinished trajectories whose last step ran here
    tp: int = 1
    role: str = ""
    kv_usage: float = 0.0  # fraction of its KV cache in use, as the engine last reported


class Order(Protocol):
    """Engine queue discipline and a step's priority in it (lower runs first)."""

    @property
    def queue(self) -> str:
        """The engine's queue policy: "fcfs" or "priority"."""
        ...

    def priority(self, event: TrajectoryView, now: float) -> int: ...


class Placement(Protocol):
    def place(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision: ...

    def on_step_done(self, event: TrajectoryView, instance_id: str, output_tokens: int) -> None: ...

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None: ...


# How often running decodes are shown to a reviewing placement (simulated seconds; live:
# scaled like the engines), and the fewest tokens a step must have made in its turn.
REVIEW_EVERY_S = 5.0
REVIEW_MIN_TOKENS = 2048


@runtime_checkable
class Forecasting(Protocol):
    """An order that ranks by a forecast of remaining work: the decision carries it, so
    the UI can list the trajectories predicted to run longest, and where."""

    def predicted_remaining(self, trajectory_id: str) -> float | None: ...


@runtime_checkable
class Reserving(Protocol):
    """An order that asks the engines to hold a trajectory's KV from its first step to
    its last: the decision carries the KV to reserve for it."""

    def reserve_kv_tokens(self, event: TrajectoryView) -> int: ...


@runtime_checkable
class Reviewer(Protocol):
    """A placement that re-examines steps in the middle of long decodes and may move one
    to another instance (its KV transferred, generation resumed from the tokens made)."""

    def review(
        self, events: Sequence[TrajectoryView], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]: ...


@runtime_checkable
class BatchAware(Protocol):
    """A placement that plans from the whole batch before its first step."""

    def on_batch_start(self, events: Sequence[TrajectoryView]) -> None: ...


class Split(Protocol):
    def instances(self, num_gpus: int) -> list[InstanceSpec]: ...


@dataclass(frozen=True)
class Reshape:
    """Retire idle instances and start one in their GPUs at another TP degree; the new
    instance takes requests after `cost_s` (weight reload and engine restart)."""

    retire: tuple[str, ...]
    create: InstanceSpec
    cost_s: float
    reason: str = ""


@runtime_checkable
class Reshaper(Protocol):
    """A split that changes during rollout. `reshape` may only retire instances that are
    idle (nothing in flight, no unfinished trajectory's KV); the caller starts the new
    instance and reports it ready."""

    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]: ...

    def on_instance_ready(self, spec: InstanceSpec) -> None: ...


@dataclass(frozen=True)
class PolicyContext:
    """What a policy is built from: the cluster's shape and, for policies that learn, an
    earlier iteration's trajectories."""

    cluster: ClusterShape = field(default_factory=ClusterShape)
    history: tuple[TrajectorySpec, ...] = ()
    # The batch itself, for the oracle ablation only (true lengths: the predictor's headroom).
    truth: tuple[TrajectorySpec, ...] = ()
    # The predictor's training seed (LightGBM's feature sampling): measuring how much a
    # makespan moves with it tells a policy's effect from noise (benchmarks/noise.py).
    predictor_seed: int = 0


@runtime_checkable
class Emptying(Protocol):
    """A placement that empties instances (to merge them): the review shows every step
    there, queued ones and short decodes included, so all can leave at once."""

    @property
    def emptying(self) -> Sequence[str]: ...


@runtime_checkable
class Migrating(Protocol):
    """A placement that may move trajectories between instances (with their KV)."""

    migrate: bool


@runtime_checkable
class FinishAware(Protocol):
    """A split that keeps per-trajectory state and forgets a trajectory that ends."""

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None: ...


@dataclass
class Policy:
    """A named combination of the answers; the simulator and the live system run it.
    The optional abilities (`Reviewer`, `BatchAware`, `Reshaper`, ...) are checked once,
    here, so a call on a policy without one costs nothing."""

    name: str
    order: Order
    placement: Placement
    split: Split
    description: str = ""
    extras: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = [self.placement] + ([self.split] if self.split is not self.placement else [])
        self._batch_aware = [p for p in parts if isinstance(p, BatchAware)]
        self._finish_aware = self.split if isinstance(self.split, FinishAware) else None
        self._reviewer = self.placement if isinstance(self.placement, Reviewer) else None
        self._emptier = self.placement if isinstance(self.placement, Emptying) else None
        self._reshaper = self.split if isinstance(self.split, Reshaper) else None
        # Whether the placement moves trajectories between instances (with their KV),
        # and whether it reviews decodes in progress.
        self.migrates: bool = isinstance(self.placement, Migrating) and self.placement.migrate
        self.reviews: bool = self._reviewer is not None
        self._forecaster = self.order if isinstance(self.order, Forecasting) else None
        self._reserver = self.order if isinstance(self.order, Reserving) else None

    def decide(
        self, event: TrajectoryView, instances: Sequence[InstanceState], now: float
    ) -> Decision:
        placed = self.placement.place(event, instances, now)
        priority = self.order.priority(event, now)
        forecast = (
            self._forecaster.predicted_remaining(event.trajectory_id) if self._forecaster else None
        )
        return Decision(
            instance_id=placed.instance_id,
            priority=priority,
            reason=placed.reason,
            migrate=placed.migrate,
            predicted_remaining=-1 if forecast is None else max(0, round(forecast)),
            reserve_kv_tokens=self._reserve(event),
        )

    def _reserve(self, event: TrajectoryView) -> int:
        return self._reserver.reserve_kv_tokens(event) if self._reserver is not None else 0

    def on_step_done(self, event: TrajectoryView, instance_id: str, output_tokens: int) -> None:
        self.placement.on_step_done(event, instance_id, output_tokens)

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        self.placement.on_trajectory_done(trajectory_id, group_id, generated_tokens, num_turns)
        if self._finish_aware is not None:
            self._finish_aware.on_trajectory_done(
                trajectory_id, group_id, generated_tokens, num_turns
            )

    def on_batch_start(self, events: Sequence[TrajectoryView]) -> None:
        """Called with every trajectory's first step before any runs (and before the
        split is read: a planner may choose it from the batch)."""
        for part in self._batch_aware:
            part.on_batch_start(events)

    @property
    def emptying(self) -> frozenset[str]:
        """Instances the placement is emptying (`Emptying`)."""
        return frozenset(self._emptier.emptying) if self._emptier is not None else frozenset()

    def review(
        self, events: Sequence[TrajectoryView], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]:
        """Moves of steps in progress (`events` carry the tokens made so far), by
        trajectory id; none unless the placement is a `Reviewer`."""
        if self._reviewer is None:
            return {}
        moves = self._reviewer.review(events, instances, now)
        by_id = {e.trajectory_id: e for e in events}
        return {
            tid: Decision(
                d.instance_id, self.order.priority(by_id[tid], now), d.reason, migrate=True,
                reserve_kv_tokens=self._reserve(by_id[tid]),
            )
            for tid, d in moves.items()
        }  # fmt: skip

    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]:
        """Changes to the split during rollout; none unless the split is a `Reshaper`."""
        return self._reshaper.reshape(instances, now) if self._reshaper is not None else []

    def on_instance_ready(self, spec: InstanceSpec) -> None:
        if self._reshaper is not None:
            self._reshaper.on_instance_ready(spec)
