"""Heddle's policy: progressive prediction, progressive priority, presorted-DP placement
with opportunistic migration, and a heterogeneous TP split (Heddle paper, Alg. 1 and
sections on placement and resources).

One `HeddlePlanner` holds the forecast and the plan; the order, the placement and the
split read it. Before the first step it predicts every trajectory, chooses the TP split
(resource manager) and the group sizes (DP). At each step it re-predicts the
trajectory's remaining tokens; the trajectory's rank among the active ones, against the
group sizes scaled to the active count, names its instance; if that is not where it ran,
it moves there during its tool call (KV transfer).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from heddle.types import Decision, TrajectorySpec
from scheduler.interface import InstanceSpec, InstanceState, PolicyContext, StepEvent
from scheduler.placement import least_loaded
from scheduler.placement_dp import solve
from scheduler.predictor import RemainingPredictor
from scheduler.resources import SplitPlanner

# Below this many predicted remaining tokens a move does not pay for itself.
MIN_MIGRATE_TOKENS = 512
# A target holding this many more steps than its share is busy: skip the move.
BUSY_SLACK = 8


@dataclass
class HeddlePlanner:
    ctx: PolicyContext
    predictor: RemainingPredictor | None = None
    truth: dict[str, TrajectorySpec] = field(default_factory=dict)
    plan_tp: bool = True
    remaining: dict[str, float] = field(default_factory=dict)
    _key: dict[str, float] = field(default_factory=dict)
    _active: list[tuple[float, str]] = field(default_factory=list)
    tps: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    planned_n: int = 0
    instance_ids: list[str] = field(default_factory=list)

    # ---- forecast ----------------------------------------------------------------------
    def predict(self, event: StepEvent) -> float:
        if self.truth:
            spec = self.truth[event.trajectory_id]
            return float(max(1, spec.generated_tokens - event.generated_tokens))
        if self.predictor is None:
            raise ValueError("Heddle needs a history to train its predictor (--history)")
        return self.predictor.predict(event)

    def update(self, event: StepEvent) -> float:
        """Re-predict a trajectory; its rank key is its predicted total length (made so
        far plus predicted remaining), so progress alone does not move it."""
        tid = event.trajectory_id
        old = self._key.get(tid)
        if old is not None:
            i = bisect.bisect_left(self._active, (-old, tid))
            if i < len(self._active) and self._active[i] == (-old, tid):
                self._active.pop(i)
        value = self.predict(event)
        self.remaining[tid] = value
        key = value + event.generated_tokens
        self._key[tid] = key
        bisect.insort(self._active, (-key, tid))
        return value

    def rank(self, tid: str) -> int:
        return bisect.bisect_left(self._active, (-self._key[tid], tid))

    def finished(self, tid: str, group_id: str, generated_tokens: int) -> None:
        self.remaining.pop(tid, None)
        old = self._key.pop(tid, None)
        if old is not None:
            i = bisect.bisect_left(self._active, (-old, tid))
            if i < len(self._active) and self._active[i] == (-old, tid):
                self._active.pop(i)
        if self.predictor is not None:
            self.predictor.memory.sibling_finished(group_id, generated_tokens)
            self.predictor.forget(tid)

    # ---- plan --------------------------------------------------------------------------
    def on_batch_start(self, events: Sequence[StepEvent]) -> None:
        # A trajectory's KV while it runs averages its context now plus half the rest.
        pairs = sorted(((self.update(e), e.context_tokens) for e in events), key=lambda p: -p[0])
        lengths = [r for r, _ in pairs]
        contexts = [c + r / 2 for r, c in pairs]
        ctx = self.ctx
        planner = SplitPlanner(
            ctx.model, ctx.gpu, ctx.num_gpus, ctx.tp_choices, ctx.max_num_seqs,
            ctx.gpu_memory_utilization,
        )  # fmt: skip
        if self.plan_tp:
            plan = planner.plan(lengths, contexts)
            self.tps, partition = plan.tps, plan.partition
        else:
            self.tps = planner.homogeneous(ctx.default_tp)
            models = planner.models()
            partition = solve(lengths, contexts, [models[tp] for tp in self.tps])
        self.sizes = partition.sizes
        self.planned_n = max(1, len(lengths))
        self.instance_ids = [f"h{k}" for k in range(len(self.tps))]

    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        """The split (the `Split` interface): planned at batch start."""
        if not self.tps:
            self.tps = SplitPlanner(
                self.ctx.model, self.ctx.gpu, num_gpus, self.ctx.tp_choices
            ).homogeneous(self.ctx.default_tp)
            self.instance_ids = [f"h{k}" for k in range(len(self.tps))]
        return [InstanceSpec(iid, tp) for iid, tp in zip(self.instance_ids, self.tps, strict=True)]

    def target(self, rank: int) -> tuple[str, float]:
        """The instance a rank maps to, with group sizes scaled to the active count,
        and that instance's scaled share."""
        if not self.sizes:
            return self.instance_ids[rank % len(self.instance_ids)], 0.0
        scale = len(self._active) / self.planned_n
        edge = 0.0
        for iid, size in zip(self.instance_ids, self.sizes, strict=True):
            edge += size * scale
            if rank < edge:
                return iid, size * scale
        return self.instance_ids[-1], self.sizes[-1] * scale


@dataclass(frozen=True)
class LongestPredictedFirst:
    """Progressive priority: the longest predicted remaining runs first, preemptively."""

    planner: HeddlePlanner
    queue: str = "priority"

    def priority(self, event: StepEvent, now: float) -> int:
        return -int(self.planner.remaining.get(event.trajectory_id, 0.0))


@dataclass
class HeddlePlacement:
    planner: HeddlePlanner
    use_dp: bool = True
    migrate: bool = True

    def on_batch_start(self, events: Sequence[StepEvent]) -> None:
        self.planner.on_batch_start(events)

    def place(self, event: StepEvent, instances: Sequence[InstanceState], now: float) -> Decision:
        planner = self.planner
        remaining = planner.update(event)
        prev = event.previous_instance
        if not self.use_dp:
            best = least_loaded(instances, prev)
            return Decision(best.instance_id, reason="least_loaded")
        target, share = planner.target(planner.rank(event.trajectory_id))
        if prev is None:
            return Decision(target, reason="dp_rank")
        if target == prev:
            return Decision(prev, reason="rank_kept")
        if not self.migrate or remaining < MIN_MIGRATE_TOKENS:
            return Decision(prev, reason="stay")
        by_id = {s.instance_id: s for s in instances}
        src, dst = by_id.get(prev), by_id.get(target)
        if (
            src is not None
            and dst is not None
            and src.tp == dst.tp
            and src.num_in_flight <= dst.num_in_flight + BUSY_SLACK
        ):
            # Same width and not overloaded: a move would buy little balance for its cost.
            return Decision(prev, reason="same_width")
        if dst is not None and dst.num_in_flight > share + BUSY_SLACK:
            return Decision(prev, reason="target_busy")
        return Decision(target, reason="rank_moved", migrate=True)

    def on_step_done(self, event: StepEvent, instance_id: str, output_tokens: int) -> None:
        return None

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        self.planner.finished(trajectory_id, group_id, generated_tokens)
