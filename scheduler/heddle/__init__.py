"""Heddle's policy: progressive prediction, progressive priority, presorted-DP placement
with opportunistic migration, and a heterogeneous TP split (Heddle paper, Alg. 1 and
sections on placement and resources), in the parts its questions name:

- `forecast`: each trajectory's predicted remaining tokens, re-predicted at every step,
  and its rank among the active ones;
- `plan`: the TP split and the DP's group sizes planned before the first step, the pins,
  and the re-plans as the batch drains;
- `reshaping`: idle or emptied narrow instances merged into wide ones during rollout;
- `placement`: the rank's instance for each step, the moves during tool calls and
  mid-decode, and the order in the engines' queues.

`HeddlePlanner` is the split the policy runs (it owns the parts); `HeddlePlacement` reads
the same parts. A `HeddleVariant` names an ablation, and `heddle_policy` builds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heddle.types import TrajectoryView
from scheduler.heddle.bookings import Bookings
from scheduler.heddle.forecast import (
    BatchLengths,
    Forecast,
    LearnedLengths,
    Lengths,
    TrueLengths,
)
from scheduler.heddle.placement import HeddlePlacement, LongestPredictedFirst
from scheduler.heddle.plan import BatchPlan
from scheduler.heddle.reshaping import Reshaping
from scheduler.heddle.shapes import InstanceShapes
from scheduler.interface import (
    InstanceSpec,
    InstanceState,
    Order,
    Policy,
    PolicyContext,
    Reshape,
)
from scheduler.order import FirstComeFirstServed
from scheduler.predictor import RemainingPredictor

__all__ = [
    "HeddlePlacement",
    "HeddlePlanner",
    "HeddleVariant",
    "LongestPredictedFirst",
    "heddle_policy",
]


@dataclass(frozen=True)
class HeddleVariant:
    """Which of Heddle's parts run (the ablations of the paper, and the oracle)."""

    pps: bool = True  # longest predicted total first in the engines' queues
    dp: bool = True  # the DP's rank-to-instance map (else least loaded each step)
    migrate: bool = True  # moves between instances (during tool calls, mid-decode)
    plan_tp: bool = True  # a heterogeneous split planned from the batch (else the default)
    reshape: bool = True  # the split reshaped during rollout
    # Reshaping may empty a block of busy narrow instances to merge it (else it merges
    # only blocks that fall idle).
    vacate: bool = True
    oracle: bool = False  # the batch's true lengths instead of the predictor's
    # No history: forecasts learned from the batch as it runs (`BatchLengths`).
    online: bool = False
    # Pin the DP's first this many groups whatever the memory reads: a measure
    # (benchmarks/forecast_noise.py), not a policy.
    pin_groups: int | None = None
    # Key the engines' queues on the predicted remaining rather than the total: a
    # measure (`benchmarks/variant_ab.py --flag queue_by_remaining`), not a policy.
    queue_by_remaining: bool = False
    # Key them on the remaining until a trajectory finds its context evicted, then on
    # the total (`LongestPredictedFirst`); off, on the total throughout.
    queue_adapts: bool = True
    # Engines admit a trajectory only while the forecast KV of those they hold fits
    # (`LongestPredictedFirst.reserve_kv_tokens`); off, they admit as vLLM does.
    reserve_kv: bool = True
    # Reserve each trajectory's mean KV over its whole life rather than over what is
    # left of it (`LongestPredictedFirst.reserve_kv_tokens`): a measure (`benchmarks/
    # variant_ab.py --flag reserve_life_mean`), not a policy.
    reserve_life_mean: bool = False
    # Rank by the predictor's upper quantile of the remaining tokens, not the expected
    # count (`LearnedLengths.rank_upper`): a measure of ranking by what the uncertainty
    # allows (`benchmarks/variant_ab.py --flag rank_upper`).
    rank_upper: bool = False


@dataclass
class HeddlePlanner:
    """The split Heddle runs (`Split`, `Reshaper`, `BatchAware`): it plans the batch
    before the first step, reshapes during rollout, and forgets a trajectory that ends."""

    forecast: Forecast
    bookings: Bookings
    plan: BatchPlan
    reshaping: Reshaping
    plan_tp: bool = True

    @classmethod
    def for_context(
        cls,
        ctx: PolicyContext,
        variant: HeddleVariant = HeddleVariant(),
        name: str = "heddle",
        lengths: Lengths | None = None,
    ) -> HeddlePlanner:
        """The planner of `variant` on the context's cluster; its forecasts from
        `lengths` when given (a measure: forecasts of known noise), else the batch's
        true lengths (the oracle) or a predictor trained on the history."""
        if lengths is None:
            lengths = _lengths(ctx, variant, name)
        shapes = InstanceShapes(ctx.cluster)
        # The context's growth per generated token: from the history, or the batch's
        # truth for the oracle; a policy without either starts from none.
        grown = ctx.history or (ctx.truth if lengths.exact else ())
        forecast = Forecast(lengths, Forecast.growth_of(grown))
        bookings = Bookings()
        plan = BatchPlan(
            ctx.cluster,
            shapes,
            history=ctx.history,
            reads_from=ctx.history or (ctx.truth if lengths.exact else ()),
            exact=lengths.exact,
            pin_groups=variant.pin_groups,
        )
        reshaping = Reshaping(
            shapes,
            forecast,
            bookings,
            plan,
            # Emptying a busy block needs a placement that moves its trajectories off.
            enabled=variant.reshape,
            vacate=variant.dp and variant.migrate and variant.vacate,
        )
        return cls(forecast, bookings, plan, reshaping, plan_tp=variant.plan_tp)

    def on_batch_start(self, events: Sequence[TrajectoryView]) -> None:
        for e in events:
            self.forecast.update(e)
        self.reshaping.layout = self.plan.plan_batch(events, self.forecast, self.plan_tp)
        self.reshaping.instances_made = len(self.plan.tps)

    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        """The split (the `Split` interface): planned at batch start."""
        plan = self.plan
        if not plan.tps:
            self.reshaping.layout = plan.homogeneous(num_gpus)
            self.reshaping.instances_made = len(plan.tps)
        return [InstanceSpec(iid, tp) for iid, tp in zip(plan.instance_ids, plan.tps, strict=True)]

    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]:
        return self.reshaping.reshape(instances, now)

    def on_instance_ready(self, spec: InstanceSpec) -> None:
        self.reshaping.on_instance_ready(spec)

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        self.reshaping.decoding.pop(trajectory_id, None)
        self.bookings.release(trajectory_id)
        self.forecast.finished(trajectory_id, group_id, generated_tokens)
        active = len(self.forecast)
        if self.reshaping.layout is not None and active and active < self.plan.replan_below:
            self.reshaping.replan()

    def placement(self, variant: HeddleVariant = HeddleVariant()) -> HeddlePlacement:
        """The placement that reads this planner's parts."""
        return HeddlePlacement(
            self.forecast, self.bookings, self.plan, self.reshaping,
            use_dp=variant.dp, migrate=variant.migrate,
        )  # fmt: skip


def _lengths(ctx: PolicyContext, variant: HeddleVariant, name: str) -> Lengths:
    if variant.oracle:
        return TrueLengths({s.trajectory_id: s for s in ctx.truth})
    if variant.online:
        return BatchLengths()
    if not ctx.history:
        raise ValueError(
            f"policy {name!r} learns from an earlier iteration: give it a history "
            "(heddle bench --history FILE)"
        )
    predictor = RemainingPredictor.train(
        ctx.history, seed=ctx.predictor_seed, upper=variant.rank_upper
    )
    return LearnedLengths(predictor, rank_upper=variant.rank_upper)


def heddle_policy(
    ctx: PolicyContext, name: str, variant: HeddleVariant, lengths: Lengths | None = None
) -> Policy:
    planner = HeddlePlanner.for_context(ctx, variant, name, lengths)
    order: Order = (
        LongestPredictedFirst(
            planner.forecast,
            by_remaining=variant.queue_by_remaining,
            reserve_kv=variant.reserve_kv,
            reserve_life_mean=variant.reserve_life_mean,
            adapts=variant.queue_adapts,
        )
        if variant.pps
        else FirstComeFirstServed()
    )
    description = "Heddle" + ("" if name == "heddle" else f" ({name})")
    return Policy(name, order, planner.placement(variant), planner, description)
