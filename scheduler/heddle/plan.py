"""The batch plan: the TP split, the DP's group sizes (how many of the ranked
trajectories each instance takes), and the instances the leading groups keep to
themselves (pins). Planned at batch start, re-solved as the batch drains and after each
reshape (Heddle paper, "Presorted DP placement" and "Resource manager")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

import numpy as np

from engines.trajectory_costs import allowed_costs, longest_alone_s, memory_reads_s
from heddle.hardware import ClusterShape
from heddle.types import TrajectorySpec, TrajectoryView
from scheduler.heddle.forecast import Forecast
from scheduler.heddle.shapes import InstanceShapes
from scheduler.placement_dp import KV_SHARE_CAP, InstanceModel, solve, solve_leading
from scheduler.reshape import GpuLayout

# Re-solve the group sizes on the active trajectories' forecast each time their number
# falls by this fraction: as the batch drains, the widest instances go to the longest
# few that are left (scaling the batch-start sizes would spread them over narrow ones).
REPLAN_FRACTION = 0.1
# The DP's leading groups get instances of their own (`BatchPlan.pins`) only while the
# other GPUs still read the batch's memory within this fraction of the longest
# trajectory's time alone (the margin: the memory time leaves out tools, prefill and
# queueing). Pinning the first 2 / 3 groups, heddle-oracle on 14B search seed 1:
# 152 / 143 s against 185 s balanced; 0.75 admits 3 there.
PIN_SLACK = 0.75


@dataclass
class BatchPlan:
    cluster: ClusterShape
    shapes: InstanceShapes
    # The earlier iteration the split's tail is planned on (`split_forecast`), and the
    # trajectories whose memory reads decide the pins (the history, or the batch itself
    # for the oracle).
    history: tuple[TrajectorySpec, ...] = ()
    reads_from: tuple[TrajectorySpec, ...] = ()
    # The forecasts are the batch's true lengths (the oracle): plan the split on them.
    exact: bool = False
    # Pin the DP's first this many groups whatever the memory reads (None: `pins`' rule).
    # A measure, not a policy (benchmarks/forecast_noise.py).
    pin_groups: int | None = None
    instance_ids: list[str] = field(default_factory=list)
    tps: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    # Instances that take only the ranks the DP maps to them.
    pinned: frozenset[str] = frozenset()
    planned_n: int = 0
    replan_below: float = 0.0

    def plan_batch(
        self, events: Sequence[TrajectoryView], forecast: Forecast, plan_tp: bool
    ) -> GpuLayout:
        """The split and groups before the first step, on the batch's first forecasts;
        returns where the instances lie on the GPUs."""
        lengths, contexts = forecast.longest_first()
        splitter = self.shapes.splitter()
        if plan_tp:
            self.tps = splitter.plan(*self.split_forecast(events, lengths, contexts, forecast)).tps
        else:
            self.tps = splitter.homogeneous(self.cluster.default_tp)
        models = self.shapes.models
        partition = solve(
            lengths, contexts, [models[tp] for tp in self.tps], max_kv_share=KV_SHARE_CAP
        )
        self.sizes = partition.sizes
        self.planned_n = max(1, len(lengths))
        self.instance_ids = [f"h{k}" for k in range(len(self.tps))]
        self.pinned = self.pins(contexts, models)
        self.replan_below = self.planned_n * (1 - REPLAN_FRACTION)
        return GpuLayout.pack(self.instance_ids, self.tps)

    def homogeneous(self, num_gpus: int) -> GpuLayout:
        """No batch plan (a step decided before any): the default width everywhere."""
        self.tps = self.shapes.splitter(num_gpus).homogeneous(self.cluster.default_tp)
        self.instance_ids = [f"h{k}" for k in range(len(self.tps))]
        return GpuLayout.pack(self.instance_ids, self.tps)

    def split_forecast(
        self,
        events: Sequence[TrajectoryView],
        lengths: list[float],
        contexts: list[float],
        forecast: Forecast,
    ) -> tuple[list[float], list[float]]:
        """What the split is planned on: the history's lengths, spread over this batch's
        size (quantiles, longest first), each with the batch's mean context now plus half
        its growth. Before the first step the forecasts regress to the mean (nothing yet
        tells the long trajectories apart), so their tail is far shorter than the one the
        batch will have, and a split planned on them is too narrow where the tail runs
        (14B math: all-TP-8 finished in 260 s, the split planned on the forecasts in
        289 s). Which trajectory is long is the placement's question, answered by the
        re-predictions; how long the tail is, the history knows. With true lengths (the
        oracle), or no history, the forecast itself."""
        if self.exact or not self.history or not lengths:
            return lengths, contexts
        totals = np.asarray([s.generated_tokens for s in self.history], dtype=np.float64)
        spread = np.quantile(totals, np.linspace(1.0, 0.0, len(lengths)))
        now = float(np.mean([e.context_tokens for e in events]))
        growth = forecast.context_growth
        return [float(v) for v in spread], [now + v * growth / 2 for v in spread]

    def target(self, rank: int, active: int) -> tuple[str, float]:
        """The instance a rank maps to, with group sizes scaled to the `active` count,
        and that instance's scaled share."""
        if not self.sizes:
            return self.instance_ids[rank % len(self.instance_ids)], 0.0
        scale = active / self.planned_n
        edge = 0.0
        for iid, size in zip(self.instance_ids, self.sizes, strict=True):
            edge += size * scale
            if rank < edge:
                return iid, size * scale
        return self.instance_ids[-1], self.sizes[-1] * scale

    def replan(self, layout: GpuLayout, taking: Sequence[str], forecast: Forecast) -> None:
        """Re-solve the group sizes over the instances `taking` steps, widest first."""
        ids = sorted(taking, key=lambda i: (-layout.tp[i], layout.first_gpu[i]))
        models = self.shapes.models
        lengths, contexts = forecast.longest_first()
        self.instance_ids = ids
        self.tps = tuple(layout.tp[i] for i in ids)
        models_up = [models[tp] for tp in self.tps]
        self.sizes = solve(lengths, contexts, models_up, max_kv_share=KV_SHARE_CAP).sizes
        self.planned_n = max(1, len(lengths))
        self.replan_below = len(lengths) * (1 - REPLAN_FRACTION)
        # As the forecasts sharpen, the leading groups shrink and more of them fit apart.
        self.pinned = self.pins(contexts, models)
        if not (
            self.pinned
            and self.pin_groups is None
            and self._pins_by_pool(layout, lengths, contexts, models)
        ):
            self._pool_open(layout, lengths, contexts, models)

    # ---- pins -------------------------------------------------------------------------
    def pins(self, contexts: list[float], models: dict[int, InstanceModel]) -> frozenset[str]:
        """The instances the DP's leading groups keep to themselves. Balancing booked work
        within a width (`HeddlePlacement._least_work_of_width`) seats the longest
        trajectories among hundreds, at a full batch's per-token time; where the batch's
        memory reads take well under its longest trajectory alone (search: 50 s against
        121 s on 14B), GPUs are to spare, and the first groups run apart while they fit
        at once. Where reads dominate (coding, math) nothing is pinned."""
        if self.pin_groups is not None:
            return frozenset(self.instance_ids[: self.pin_groups])
        pinned: set[str] = set()
        start, gpus = 0, 0
        for iid, tp, size in zip(self.instance_ids, self.tps, self.sizes, strict=True):
            gpus += tp
            if not (_fits(models[tp], contexts[start : start + size]) and self._spare(gpus)):
                break
            pinned.add(iid)
            start += size
        return frozenset(pinned)

    @cached_property
    def _reads_and_longest(self) -> tuple[float, float] | None:
        """The memory reads over every GPU and the longest trajectory alone (the lower
        bound's terms (c) and (a)) of `reads_from`: what `_spare` weighs."""
        if not self.reads_from:
            return None
        costs = allowed_costs(self.cluster)
        reads = memory_reads_s(self.reads_from, costs, num_gpus=self.cluster.num_gpus,
                               max_num_seqs=self.cluster.max_num_seqs)  # fmt: skip
        return reads, longest_alone_s(self.reads_from, costs)

    def _spare(self, pinned_gpus: int) -> bool:
        """Whether the GPUs left open still read the batch's memory within `PIN_SLACK` of
        its longest trajectory alone."""
        num_gpus = self.cluster.num_gpus
        terms, rest = self._reads_and_longest, num_gpus - pinned_gpus
        if terms is None or rest <= 0:
            return False
        reads, longest = terms
        return reads * num_gpus / rest <= PIN_SLACK * longest

    def _pins_by_pool(
        self,
        layout: GpuLayout,
        lengths: list[float],
        contexts: list[float],
        models: dict[int, InstanceModel],
    ) -> bool:
        """At a re-plan, how many instances to pin: each count k, while its groups fit
        and the open GPUs stay spare, solved with k instances of their own and the rest
        as one pool (`InstanceModel.pooled`, as the placement balances them), and the
        count with the shortest predicted makespan wins; on a tie (the longest trajectory
        alone is the slowest group), the one whose rest runs fastest (`solve_leading`).
        `pins` follows the plain DP's groups, which model each open instance as holding
        its group alone, and ends at the first that does not fit: on 32B search seed 0 a
        re-plan dropped two of three pins, the queued bulk flooded them, and the longest
        trajectory, just moved to one, decoded its step at 3.2x its time alone. False
        where the instances are not all one width (no pool)."""
        ids, tp = self.instance_ids, layout.tp
        if len({tp[i] for i in ids}) != 1:
            return False
        model = models[tp[ids[0]]]
        best: tuple[tuple[float, ...], int, tuple[int, ...]] | None = None
        for k in range(1, len(ids)):
            if not self._spare(k * model.tp):
                break
            plan = solve_leading(lengths, contexts, [model] * k + [model.pooled(len(ids) - k)],
                                 max_kv_share=KV_SHARE_CAP)  # fmt: skip
            edges = np.cumsum((0, *plan.sizes[:k]))
            if not all(_fits(model, contexts[a:b]) for a, b in pairwise(edges)):
                break
            if best is None or plan.key < best[0]:
                best = (plan.key, k, plan.sizes)
        if best is None:
            return False
        _, k, sizes_k = best
        self.pinned = frozenset(ids[:k])
        self.sizes = _spread_pool(sizes_k, len(ids) - k)
        return True

    def _pool_open(
        self,
        layout: GpuLayout,
        lengths: list[float],
        contexts: list[float],
        models: dict[int, InstanceModel],
    ) -> None:
        """Re-solve the group sizes with the open instances as one pool. The DP models an
        instance as holding its group alone, but open instances of one width are balanced
        as a pool (`HeddlePlacement._least_work_of_width`), so it mapped top ranks to an
        open instance it thought light, and an empty group there ended the pins. Pooled,
        the DP sees what the open instances run. At re-plans only: at batch start, before
        the first steps sharpen the forecasts, pooling lost (docs/notes)."""
        tp = layout.tp
        pinned = [i for i in self.instance_ids if i in self.pinned]
        open_ = [i for i in self.instance_ids if i not in self.pinned]
        if not pinned or not open_ or len({tp[i] for i in open_}) != 1:
            return
        pool = models[tp[open_[0]]].pooled(len(open_))
        sizes = solve(lengths, contexts, [models[tp[i]] for i in pinned] + [pool],
                      max_kv_share=KV_SHARE_CAP).sizes  # fmt: skip
        self.instance_ids = pinned + open_
        self.tps = tuple(tp[i] for i in self.instance_ids)
        self.sizes = _spread_pool(sizes, len(open_))


def _fits(model: InstanceModel, group_contexts: list[float]) -> bool:
    """A group runs apart only if it fits at once: seats and KV."""
    size = len(group_contexts)
    return 0 < size <= model.max_num_seqs and sum(group_contexts) <= model.kv_capacity_tokens


def _spread_pool(sizes: tuple[int, ...], open_count: int) -> tuple[int, ...]:
    """Sizes solved with the open instances as one pooled group, last: that group split
    evenly over the instances it stands for, as the placement balances them."""
    each, extra = divmod(sizes[-1], open_count)
    return sizes[:-1] + tuple(each + (k < extra) for k in range(open_count))
