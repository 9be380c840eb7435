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
from typing import TYPE_CHECKING, Protocol

from heddle.types import Decision, TrajectorySpec

if TYPE_CHECKING:
    from heddle.config import ClusterConfig


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


@dataclass(frozen=True)
class StepEvent:
    """A trajectory about to run its next LLM step: everything the system has seen of it."""

    trajectory_id: str
    group_id: str
    step_index: int
    context_tokens: int
    generated_tokens: int
    previous_instance: str | None = None
    prompt_tokens: int = 0
    num_tool_calls: int = 0
    last_tool: str | None = None
    last_tool_status: str | None = None
    last_tool_output_tokens: int = 0
    # The tool-return path so far: "tool:size-bin:status" per call (Libra's tree key).
    tool_path: tuple[str, ...] = ()
    recent_output_tokens: tuple[int, ...] = ()
    # Tokens of the current turn made so far: a step in progress shown to a review (its
    # `generated_tokens` and `context_tokens` include them); 0 at a step boundary.
    step_tokens: int = 0


class Order(Protocol):
    """Engine queue discipline and a step's priority in it (lower runs first)."""

    @property
    def queue(self) -> str:
        """The engine's queue policy: "fcfs" or "priority"."""
        ...

    def priority(self, event: StepEvent, now: float) -> int: ...


class Placement(Protocol):
    def place(
        self, event: StepEvent, instances: Sequence[InstanceState], now: float
    ) -> Decision: ...

    def on_step_done(self, event: StepEvent, instance_id: str, output_tokens: int) -> None: ...

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None: ...


# How often running decodes are shown to a reviewing placement (simulated seconds; live:
# scaled like the engines), and the fewest tokens a step must have made in its turn.
REVIEW_EVERY_S = 5.0
REVIEW_MIN_TOKENS = 2048


class Reviewer(Protocol):
    """A placement that re-examines steps in the middle of long decodes and may move one
    to another instance (its KV transferred, generation resumed from the tokens made)."""

    def review(
        self, events: Sequence[StepEvent], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]: ...


class BatchAware(Protocol):
    """A placement that plans from the whole batch before its first step."""

    def on_batch_start(self, events: Sequence[StepEvent]) -> None: ...


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

    default_tp: int = 1
    tp_choices: tuple[int, ...] = (1, 2, 4, 8)
    max_num_seqs: int = 256
    history: tuple[TrajectorySpec, ...] = ()
    model: str = "qwen3-8b"
    gpu: str = "h100"
    num_gpus: int = 8
    gpu_memory_utilization: float = 0.9
    # The batch itself, for the oracle ablation only (true lengths: the predictor's headroom).
    truth: tuple[TrajectorySpec, ...] = ()
    # The predictor's training seed (LightGBM's feature sampling): measuring how much a
    # makespan moves with it tells a policy's effect from noise (benchmarks/noise.py).
    predictor_seed: int = 0

    @classmethod
    def for_cluster(
        cls,
        cluster: ClusterConfig,
        history: Sequence[TrajectorySpec] = (),
        truth: Sequence[TrajectorySpec] = (),
        predictor_seed: int = 0,
    ) -> PolicyContext:
        return cls(
            default_tp=cluster.default_tp,
            tp_choices=cluster.tp_choices,
            max_num_seqs=cluster.max_num_seqs,
            history=tuple(history),
            model=cluster.model,
            gpu=cluster.gpu,
            num_gpus=cluster.num_gpus,
            gpu_memory_utilization=cluster.gpu_memory_utilization,
            truth=tuple(truth),
            predictor_seed=predictor_seed,
        )


@dataclass
class Policy:
    """A named combination of the answers; the simulator and the live system run it."""

    name: str
    order: Order
    placement: Placement
    split: Split
    description: str = ""
    extras: dict[str, object] = field(default_factory=dict)

    def decide(self, event: StepEvent, instances: Sequence[InstanceState], now: float) -> Decision:
        placed = self.placement.place(event, instances, now)
        priority = self.order.priority(event, now)
        return Decision(
            instance_id=placed.instance_id,
            priority=priority,
            reason=placed.reason,
            migrate=placed.migrate,
        )

    def on_step_done(self, event: StepEvent, instance_id: str, output_tokens: int) -> None:
        self.placement.on_step_done(event, instance_id, output_tokens)

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        self.placement.on_trajectory_done(trajectory_id, group_id, generated_tokens, num_turns)

    def on_batch_start(self, events: Sequence[StepEvent]) -> None:
        """Called with every trajectory's first step before any runs (and before the
        split is read: a planner may choose it from the batch)."""
        start = getattr(self.placement, "on_batch_start", None)
        if start is not None:
            start(events)

    @property
    def migrates(self) -> bool:
        """Whether the placement moves trajectories between instances (with their KV)."""
        return bool(getattr(self.placement, "migrate", False))

    @property
    def reviews(self) -> bool:
        return hasattr(self.placement, "review")

    @property
    def emptying(self) -> frozenset[str]:
        """Instances the placement is emptying: the review shows every step there,
        queued ones and short decodes included, so all can leave at once."""
        return frozenset(getattr(self.placement, "emptying", ()))

    def review(
        self, events: Sequence[StepEvent], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]:
        """Moves of steps in progress (`events` carry the tokens made so far), by
        trajectory id; none unless the placement is a `Reviewer`."""
        review = getattr(self.placement, "review", None)
        if review is None:
            return {}
        moves: dict[str, Decision] = review(events, instances, now)
        by_id = {e.trajectory_id: e for e in events}
        return {
            tid: Decision(
                d.instance_id, self.order.priority(by_id[tid], now), d.reason, migrate=True
            )
            for tid, d in moves.items()
        }

    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]:
        """Changes to the split during rollout; none unless the split is a `Reshaper`."""
        reshape = getattr(self.split, "reshape", None)
        return reshape(instances, now) if reshape is not None else []

    def on_instance_ready(self, spec: InstanceSpec) -> None:
        ready = getattr(self.split, "on_instance_ready", None)
        if ready is not None:
            ready(spec)
