"""Heddle's policy: progressive prediction, progressive priority, presorted-DP placement
with opportunistic migration, and a heterogeneous TP split (Heddle paper, Alg. 1 and
sections on placement and resources).

One `HeddlePlanner` holds the forecast and the plan; the order, the placement and the
split read it. Before the first step it predicts every trajectory, chooses the TP split
(resource manager) and the group sizes (DP). At each step it re-predicts the
trajectory's remaining tokens; the trajectory's rank among the active ones, against the
group sizes scaled to the active count, names its instance; if that is not where it ran,
it moves there during its tool call (KV transfer). During rollout, idle narrow instances
merge into wide ones when the DP says the tail gains more than the restart costs, or a
crowded long decode would run faster there; a block of busy narrow instances is emptied
first when the DP wants it wide (`scheduler/reshape.py`). The plan is then re-solved
over the instances that are up.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

import numpy as np

from engines.costmodel import CostModel
from engines.trajectory_costs import allowed_costs, longest_alone_s, memory_reads_s
from heddle.types import Decision, TrajectorySpec
from scheduler.interface import InstanceSpec, InstanceState, PolicyContext, Reshape, StepEvent
from scheduler.placement import least_loaded
from scheduler.placement_dp import KV_SHARE_CAP, InstanceModel, solve, solve_leading
from scheduler.predictor import RemainingPredictor
from scheduler.reshape import GpuLayout, merges_that_pay
from scheduler.resources import SplitPlanner

# Below this many predicted remaining tokens a move does not pay for itself.
MIN_MIGRATE_TOKENS = 512
# A target holding this many more steps than its share is busy: skip the move.
BUSY_SLACK = 8
# Re-solve the group sizes on the active trajectories' forecast each time their number
# falls by this fraction: as the batch drains, the widest instances go to the longest
# few that are left (scaling the batch-start sizes would spread them over narrow ones).
REPLAN_FRACTION = 0.1
# While the batch drains, a decode moves where it runs this much faster per token: a
# wider instance, or one as wide (less loaded). Measured on 3 seeds x 14B coding, 8B
# math, 14B search: 1.25 / 1.5 / 2 all gain; below 1.5 the moves buy no more.
DRAIN_WIDER_GAIN = 1.5
DRAIN_SAME_GAIN = 1.1
# The DP's leading groups get instances of their own (`HeddlePlanner._pins`) only while
# the other GPUs still read the batch's memory within this fraction of the longest
# trajectory's time alone (the margin: the memory time leaves out tools, prefill and
# queueing). Pinning the first 2 / 3 groups, heddle-oracle on 14B search seed 1:
# 152 / 143 s against 185 s balanced; 0.75 admits 3 there.
PIN_SLACK = 0.75


@dataclass
class HeddlePlanner:
    ctx: PolicyContext
    predictor: RemainingPredictor | None = None
    truth: dict[str, TrajectorySpec] = field(default_factory=dict)
    plan_tp: bool = True
    reshape_during: bool = True
    vacate: bool = True  # may empty a busy block to merge it (`_start_vacating`)
    remaining: dict[str, float] = field(default_factory=dict)
    _key: dict[str, float] = field(default_factory=dict)
    _context: dict[str, float] = field(default_factory=dict)
    # Predicted remaining work booked per instance, and where each trajectory is booked.
    _work: dict[str, float] = field(default_factory=dict)
    _where: dict[str, str] = field(default_factory=dict)
    _booked: dict[str, float] = field(default_factory=dict)
    _active: list[tuple[float, str]] = field(default_factory=list)
    tps: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    # Instances that take only the ranks the DP maps to them (`_pins`).
    pinned: frozenset[str] = frozenset()
    # Pin the DP's first this many groups whatever the memory reads (None: `_pins`'
    # rule). A measure, not a policy (benchmarks/forecast_noise.py): with true lengths
    # four pins run math at 1.2x the bound, with forecasts pinning math lost every time.
    pin_groups: int | None = None
    planned_n: int = 0
    instance_ids: list[str] = field(default_factory=list)
    layout: GpuLayout | None = None
    starting: set[str] = field(default_factory=set)
    _instances_made: int = 0  # instance ids are never reused
    _replan_below: float = 0.0
    _recheck_below: float = float("inf")
    _shapes: tuple[dict[int, InstanceModel], dict[int, float]] | None = None
    # A block of narrow instances being emptied to merge into one wide instance: no step
    # is sent there, and what runs there leaves at its next step or review.
    vacating: tuple[str, ...] = ()
    # The long decodes the last review saw: where each runs, and its context.
    decoding: dict[str, tuple[str, int]] = field(default_factory=dict)

    # ---- forecast ----------------------------------------------------------------------
    @cached_property
    def context_growth(self) -> float:
        """Context tokens added per generated token (tool outputs included), from the
        history: search observations can outweigh what the model writes."""
        specs = self.ctx.history or self.ctx.truth
        generated = sum(s.generated_tokens for s in specs)
        observed = sum(st.tool_output_tokens for s in specs for st in s.steps)
        return 1.0 + observed / generated if generated else 1.0

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
        # Its mean KV while the rest runs: the context now plus half of what is still to
        # come, generated tokens and the tool outputs that come with them.
        self._context[tid] = event.context_tokens + value * self.context_growth / 2
        key = value + event.generated_tokens
        self._key[tid] = key
        bisect.insort(self._active, (-key, tid))
        return value

    def work_on(self, instance_id: str, excluding: str = "") -> float:
        """Predicted remaining tokens of the trajectories placed on an instance."""
        work = self._work.get(instance_id, 0.0)
        if self._where.get(excluding) == instance_id:
            work -= self.remaining.get(excluding, 0.0)
        return work

    def book(self, tid: str, instance_id: str) -> None:
        """Book a trajectory's predicted remaining work on the instance it runs on."""
        old = self._where.get(tid)
        if old is not None:
            self._work[old] -= self._booked.pop(tid, 0.0)
        self._where[tid] = instance_id
        self._booked[tid] = self.remaining.get(tid, 0.0)
        self._work[instance_id] = self._work.get(instance_id, 0.0) + self._booked[tid]

    def rank(self, tid: str) -> int:
        return bisect.bisect_left(self._active, (-self._key[tid], tid))

    def finished(self, tid: str, group_id: str, generated_tokens: int) -> None:
        self.decoding.pop(tid, None)
        booked_on = self._where.pop(tid, None)
        if booked_on is not None:
            self._work[booked_on] -= self._booked.pop(tid, 0.0)
        self.remaining.pop(tid, None)
        self._context.pop(tid, None)
        old = self._key.pop(tid, None)
        if old is not None:
            i = bisect.bisect_left(self._active, (-old, tid))
            if i < len(self._active) and self._active[i] == (-old, tid):
                self._active.pop(i)
        if self.predictor is not None:
            self.predictor.memory.sibling_finished(group_id, generated_tokens)
        if self.layout is not None and self._active and len(self._active) < self._replan_below:
            self._replan()

    # ---- plan --------------------------------------------------------------------------
    def on_batch_start(self, events: Sequence[StepEvent]) -> None:
        # A trajectory's KV while it runs averages its context now plus half the rest.
        for e in events:
            self.update(e)
        lengths, contexts = self._forecast()
        planner = self._split_planner()
        if self.plan_tp:
            self.tps = planner.plan(*self._split_forecast(events, lengths, contexts)).tps
        else:
            self.tps = planner.homogeneous(self.ctx.default_tp)
        models = planner.models()
        partition = solve(
            lengths, contexts, [models[tp] for tp in self.tps], max_kv_share=KV_SHARE_CAP
        )
        self.sizes = partition.sizes
        self.planned_n = max(1, len(lengths))
        self.instance_ids = [f"h{k}" for k in range(len(self.tps))]
        self.layout = GpuLayout.pack(self.instance_ids, self.tps)
        self.pinned = self._pins(contexts, models)
        self._instances_made = len(self.tps)
        self._replan_below = self.planned_n * (1 - REPLAN_FRACTION)

    def _pins(self, contexts: list[float], models: dict[int, InstanceModel]) -> frozenset[str]:
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
            if not (self._fits(models[tp], contexts[start : start + size]) and self._spare(gpus)):
                break
            pinned.add(iid)
            start += size
        return frozenset(pinned)

    @cached_property
    def _reads_and_longest(self) -> tuple[float, float] | None:
        """The history's memory reads over every GPU and its longest trajectory alone
        (the lower bound's terms (c) and (a)): what `_spare` weighs."""
        ctx = self.ctx
        history = ctx.history or tuple(self.truth.values())
        if not history:
            return None
        costs = allowed_costs(
            ctx.model, ctx.gpu, ctx.num_gpus, ctx.tp_choices, ctx.gpu_memory_utilization
        )
        reads = memory_reads_s(history, costs, num_gpus=ctx.num_gpus, max_num_seqs=ctx.max_num_seqs)
        return reads, longest_alone_s(history, costs)

    def _spare(self, pinned_gpus: int) -> bool:
        """Whether the GPUs left open still read the batch's memory within `PIN_SLACK` of
        its longest trajectory alone."""
        terms, rest = self._reads_and_longest, self.ctx.num_gpus - pinned_gpus
        if terms is None or rest <= 0:
            return False
        reads, longest = terms
        return reads * self.ctx.num_gpus / rest <= PIN_SLACK * longest

    @staticmethod
    def _fits(model: InstanceModel, group_contexts: list[float]) -> bool:
        """A group runs apart only if it fits at once: seats and KV."""
        size = len(group_contexts)
        return 0 < size <= model.max_num_seqs and sum(group_contexts) <= model.kv_capacity_tokens

    def _pins_by_pool(
        self, lengths: list[float], contexts: list[float], models: dict[int, InstanceModel]
    ) -> bool:
        """At a re-plan, how many instances to pin: each count k, while its groups fit
        and the open GPUs stay spare, solved with k instances of their own and the rest
        as one pool (`InstanceModel.pooled`, as the placement balances them), and the
        count with the shortest predicted makespan wins; on a tie (the longest trajectory
        alone is the slowest group), the one whose rest runs fastest (`solve_leading`).
        `_pins` follows the plain DP's groups, which model each open instance as holding
        its group alone, and ends at the first that does not fit: on 32B search seed 0 a
        re-plan at 88 s dropped two of three pins, the queued bulk flooded them (7-11
        running to 234-259 in 10 s), and the longest trajectory, just moved to one,
        decoded its step at 3.2x its time alone. False where the instances are not all
        one width (no pool)."""
        assert self.layout is not None
        ids, tp = self.instance_ids, self.layout.tp
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
            if not all(self._fits(model, contexts[a:b]) for a, b in pairwise(edges)):
                break
            if best is None or plan.key < best[0]:
                best = (plan.key, k, plan.sizes)
        if best is None:
            return False
        _, k, sizes_k = best
        self.pinned = frozenset(ids[:k])
        self.sizes = _spread_pool(sizes_k, len(ids) - k)
        return True

    def _split_planner(self) -> SplitPlanner:
        ctx = self.ctx
        return SplitPlanner(
            ctx.model, ctx.gpu, ctx.num_gpus, ctx.tp_choices, ctx.max_num_seqs,
            ctx.gpu_memory_utilization,
        )  # fmt: skip

    def _forecast(self) -> tuple[list[float], list[float]]:
        """The active trajectories' predicted remaining tokens, longest first, and their
        mean KV while they run: the DP's input."""
        pairs = sorted(((self.remaining[t], self._context[t]) for _, t in self._active),
                       key=lambda p: -p[0])  # fmt: skip
        return [r for r, _ in pairs], [c for _, c in pairs]

    def _split_forecast(
        self, events: Sequence[StepEvent], lengths: list[float], contexts: list[float]
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
        history = self.ctx.history
        if self.truth or not history or not lengths:
            return lengths, contexts
        totals = np.asarray([s.generated_tokens for s in history], dtype=np.float64)
        spread = np.quantile(totals, np.linspace(1.0, 0.0, len(lengths)))
        now = float(np.mean([e.context_tokens for e in events]))
        return [float(v) for v in spread], [now + v * self.context_growth / 2 for v in spread]

    def instances(self, num_gpus: int) -> list[InstanceSpec]:
        """The split (the `Split` interface): planned at batch start."""
        if not self.tps:
            self.tps = SplitPlanner(
                self.ctx.model, self.ctx.gpu, num_gpus, self.ctx.tp_choices
            ).homogeneous(self.ctx.default_tp)
            self.instance_ids = [f"h{k}" for k in range(len(self.tps))]
            self.layout = GpuLayout.pack(self.instance_ids, self.tps)
            self._instances_made = len(self.tps)
        return [InstanceSpec(iid, tp) for iid, tp in zip(self.instance_ids, self.tps, strict=True)]

    # ---- reshaping during rollout (the `Reshaper` interface) ---------------------------
    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]:
        """Merge the idle instances of an aligned block, widest first, when the DP
        predicts the tail finishes sooner on the merged split, restart included, or when
        a long decode in flight would run enough faster there (`_merges_for_decodes`);
        failing both, start emptying a block of narrow instances when the DP says the
        widest degree there pays (`_start_vacating`), and merge it once empty.
        Re-checked as the active count falls by 2%."""
        if not self.reshape_during or self.layout is None or not self._active:
            return []
        if self.vacating:
            return self._merge_vacated(instances)
        active = len(self._active)
        if active >= self._recheck_below:
            return []
        models, restart_s = self.instance_shapes()
        idle = [s.instance_id for s in instances if s.num_in_flight == 0 and s.num_sessions == 0]
        blocks = self.layout.blocks_within(idle, models)
        layout = self.layout
        current = [s.instance_id for s in instances] + sorted(self.starting)
        where = {iid: k for k, iid in enumerate(current)}
        lengths, contexts = self._forecast()
        kept = []
        if blocks:
            kept = merges_that_pay(
                lengths, contexts, [layout.tp[i] for i in current],
                [[where[i] for i in members] for members, _ in blocks], models, restart_s,
                idle=[where[i] for i in idle],
            )  # fmt: skip
            taken = {i for k in kept for i in blocks[k][0]}
            kept += self._merges_for_decodes(
                InstanceSpeeds.of(instances, models), blocks, taken, restart_s
            )
        if not kept:
            self._recheck_below = active - max(1, active // 50)
            if self.vacate:
                self._start_vacating(instances, current, where)
            return []
        self._recheck_below = float("inf")
        changes = [self._merge(*blocks[k], "merge_idle_for_tail") for k in kept]
        self._replan()
        return changes

    def _merge(self, members: tuple[str, ...], tp: int, reason: str) -> Reshape:
        assert self.layout is not None
        new_id = f"h{self._instances_made}"
        self._instances_made += 1
        self.layout.merge(members, new_id)
        self.starting.add(new_id)
        restart_s = self.instance_shapes()[1][tp]
        return Reshape(members, InstanceSpec(new_id, tp), restart_s, reason)

    def _start_vacating(
        self, instances: Sequence[InstanceState], current: list[str], where: dict[str, int]
    ) -> None:
        """Beyond the paper: while every narrow instance still holds long trajectories
        none goes idle, yet the DP, re-run on the re-predicted forecast, can want more
        wide instances than the batch-start plan (14B coding: once the first steps have
        re-ranked the batch). The block of the widest degree whose
        instances hold the least predicted work, of those whose merge pays by the DP's
        rule, stops taking steps; its trajectories leave at their next step or review."""
        assert self.layout is not None
        layout = self.layout
        models, restart_s = self.instance_shapes()
        widest = max(models)
        # The aligned blocks of the widest degree made of narrower instances that are up.
        up = {s.instance_id for s in instances}
        taking = up - self.starting
        # A block that holds every instance taking steps has nowhere to send its work.
        blocks = [(members, tp) for members, tp in layout.blocks_within(up, {widest})
                  if all(layout.tp[i] < widest for i in members)
                  and not taking <= set(members)]  # fmt: skip
        if not blocks:
            return
        lengths, contexts = self._forecast()
        tps = [layout.tp[i] for i in current]
        groups = [[where[i] for i in members] for members, _ in blocks]
        kept = merges_that_pay(lengths, contexts, tps, groups, models, restart_s, alone=True)
        paying = [blocks[k][0] for k in kept]
        if paying:
            members = min(paying, key=lambda b: sum(self.work_on(i) for i in b))
            self.vacating = members
            self._replan()

    def _merge_vacated(self, instances: Sequence[InstanceState]) -> list[Reshape]:
        by_id = {s.instance_id: s for s in instances}
        if not all(
            i in by_id and by_id[i].num_in_flight == 0 and by_id[i].num_sessions == 0
            for i in self.vacating
        ):
            return []
        assert self.layout is not None
        tp = sum(self.layout.tp[i] for i in self.vacating)
        change = self._merge(self.vacating, tp, "merge_vacated_for_tail")
        self.vacating = ()
        self._replan()
        return [change]

    def _merges_for_decodes(
        self,
        speeds: InstanceSpeeds,
        blocks: Sequence[tuple[tuple[str, ...], int]],
        taken: set[str],
        restart_s: dict[int, float],
    ) -> list[int]:
        """Beyond the paper: which `blocks` to merge (none of whose instances are
        `taken`, merged already; it grows with each merge kept) for the decodes the last
        review saw. A block is merged when the longest decode not yet served would run
        faster on it by the drain moves' gain, saving more than its restart on its
        predicted remaining tokens; the drain moves then send it there. The DP rule
        misses this: it re-spreads the whole tail at will, narrower instances included,
        on predicted remaining lengths that in the tail fall short of the truth."""
        waiting = sorted((t for t in self.decoding if t in self._key), key=self.rank)
        kept = []
        for k, (members, tp) in enumerate(blocks):
            if taken.intersection(members):
                continue
            new_id = "+".join(members)
            speeds.add(new_id, tp)
            for tid in waiting:
                src, context = self.decoding[tid]
                there = speeds.faster(src, new_id, context)
                here = speeds.per_token_s(src) if src in speeds.width else 0.0
                if there is not None and self.remaining[tid] * (here - there) > restart_s[tp]:
                    kept.append(k)
                    taken.update(members)
                    waiting.remove(tid)
                    speeds.move(src, new_id, context)
                    break
        return kept

    def on_instance_ready(self, spec: InstanceSpec) -> None:
        self.starting.discard(spec.instance_id)
        self._replan()

    def instance_shapes(self) -> tuple[dict[int, InstanceModel], dict[int, float]]:
        """Per allowed degree: the DP's instance model and the restart cost."""
        if self._shapes is None:
            ctx = self.ctx
            models = self._split_planner().models()
            restart = {
                tp: CostModel.for_names(
                    ctx.model, ctx.gpu, tp, ctx.gpu_memory_utilization
                ).reconfiguration_s()
                for tp in models
            }
            self._shapes = (models, restart)
        return self._shapes

    def _replan(self) -> None:
        """Re-solve the group sizes over the instances that are up, widest first."""
        assert self.layout is not None
        layout = self.layout
        taking = [i for i in layout.tp if i not in self.starting and i not in self.vacating]
        if not taking:
            # Every instance is restarting after a merge: plan on those, which queue the
            # steps until they are up.
            taking = [i for i in layout.tp if i not in self.vacating]
        ids = sorted(taking, key=lambda i: (-layout.tp[i], layout.first_gpu[i]))
        models, _ = self.instance_shapes()
        lengths, contexts = self._forecast()
        self.instance_ids = ids
        self.tps = tuple(layout.tp[i] for i in ids)
        models_up = [models[tp] for tp in self.tps]
        self.sizes = solve(lengths, contexts, models_up, max_kv_share=KV_SHARE_CAP).sizes
        self.planned_n = max(1, len(lengths))
        self._replan_below = len(lengths) * (1 - REPLAN_FRACTION)
        # As the forecasts sharpen, the leading groups shrink and more of them fit apart.
        self.pinned = self._pins(contexts, models)
        if not (
            self.pinned
            and self.pin_groups is None
            and self._pins_by_pool(lengths, contexts, models)
        ):
            self._pool_open(lengths, contexts, models)

    def _pool_open(
        self, lengths: list[float], contexts: list[float], models: dict[int, InstanceModel]
    ) -> None:
        """Re-solve the group sizes with the open instances as one pool. The DP models an
        instance as holding its group alone, but open instances of one width are balanced
        as a pool (`HeddlePlacement._least_work_of_width`), so it mapped top ranks to an
        open instance it thought light (32B search: ranks 2-16 to one of five open
        TP-8s, each running 260), and an empty group there ended the pins. Pooled, the
        DP sees what the open instances run. At re-plans only: at batch start, before the
        first steps sharpen the forecasts, pooling lost (notes, ninth session)."""
        assert self.layout is not None
        tp = self.layout.tp
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


def _spread_pool(sizes: tuple[int, ...], open_count: int) -> tuple[int, ...]:
    """Sizes solved with the open instances as one pooled group, last: that group split
    evenly over the instances it stands for, as the placement balances them."""
    each, extra = divmod(sizes[-1], open_count)
    return sizes[:-1] + tuple(each + (k < extra) for k in range(open_count))


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

    @property
    def emptying(self) -> tuple[str, ...]:
        """The block being emptied to merge (`HeddlePlanner._start_vacating`)."""
        return self.planner.vacating

    def place(self, event: StepEvent, instances: Sequence[InstanceState], now: float) -> Decision:
        self.planner.decoding.pop(event.trajectory_id, None)
        remaining = self.planner.update(event)
        decision = self._decide(event, instances, remaining)
        self.planner.book(event.trajectory_id, decision.instance_id)
        return decision

    def _least_work_of_width(
        self, target: str, instances: Sequence[InstanceState], event: StepEvent, remaining: float
    ) -> str:
        """Instances of one width are interchangeable: the rank names the width, the
        predicted work already booked picks the instance (pull-style balance, as per-step
        least-loaded gets). The trajectory stays where it is (its KV is there) unless
        moving evens out the work."""
        planner, tid, prev = self.planner, event.trajectory_id, event.previous_instance
        pinned = planner.pinned
        if target in pinned:
            return target
        by_id = {s.instance_id: s for s in instances}
        width = by_id[target].tp
        closed = pinned | set(planner.vacating)
        taking = [s.instance_id for s in instances
                  if s.tp == width and s.instance_id not in closed]  # fmt: skip
        best = min(taking, key=lambda i: (planner.work_on(i, excluding=tid), i != prev))
        if (
            prev in by_id
            and prev not in planner.vacating
            and prev not in pinned
            and by_id[prev].tp == width
            and planner.work_on(prev, excluding=tid)
            <= planner.work_on(best, excluding=tid) + remaining
        ):
            return prev
        return best

    def _decide(
        self, event: StepEvent, instances: Sequence[InstanceState], remaining: float
    ) -> Decision:
        planner = self.planner
        prev = event.previous_instance
        if not self.use_dp:
            best = least_loaded(instances, prev)
            return Decision(best.instance_id, reason="least_loaded")
        target, share = planner.target(planner.rank(event.trajectory_id))
        by_id = {s.instance_id: s for s in instances}
        if target in by_id:
            target = self._least_work_of_width(target, instances, event, remaining)
        if prev is None:
            return Decision(target, reason="dp_rank")
        if prev in planner.vacating:
            return Decision(target, reason="vacating", migrate=True)
        if target == prev:
            return Decision(prev, reason="rank_kept")
        if not self.migrate or remaining < MIN_MIGRATE_TOKENS:
            return Decision(prev, reason="stay")
        src, dst = by_id.get(prev), by_id.get(target)
        if src is not None and dst is not None and dst.tp < src.tp and draining(instances):
            # GPUs are spare, and narrowing would undo what `_drain_moves` bought.
            return Decision(prev, reason="draining_keeps_width")
        leaving_pin = prev in planner.pinned and target not in planner.pinned
        if (
            src is not None
            and dst is not None
            and src.tp == dst.tp
            and src.num_in_flight <= dst.num_in_flight + BUSY_SLACK
            and not leaving_pin
        ):
            # Same width and not overloaded: a move would buy little balance for its cost.
            return Decision(prev, reason="same_width")
        if dst is not None and dst.num_in_flight > share + BUSY_SLACK:
            return Decision(prev, reason="target_busy")
        return Decision(target, reason="left_pinned" if leaving_pin else "rank_moved", migrate=True)

    def review(
        self, events: Sequence[StepEvent], instances: Sequence[InstanceState], now: float
    ) -> dict[str, Decision]:
        """Beyond the paper: a decode that outlives its prediction climbs the ranking
        (its predicted total is at least what it has made); when its rank names a wider
        instance it moves there mid-step rather than wait for a tool call it may never
        make (a final answer has none)."""
        if not (self.use_dp and self.migrate):
            return {}
        planner = self.planner
        by_id = {s.instance_id: s for s in instances}
        moves = {}
        # Every decode re-predicted first, then moved longest first (the paper's order):
        # a move books its work where it lands, which the next choice of instance reads.
        remaining_of = {e.trajectory_id: planner.update(e) for e in events}
        for event in sorted(events, key=lambda e: planner.rank(e.trajectory_id)):
            tid = event.trajectory_id
            remaining = remaining_of[tid]
            target, share = planner.target(planner.rank(tid))
            if event.previous_instance in planner.vacating:
                if target in by_id:
                    target = self._least_work_of_width(target, instances, event, remaining)
                moves[tid] = Decision(target, reason="vacating", migrate=True)
                planner.book(tid, target)
                continue
            if remaining < MIN_MIGRATE_TOKENS:
                continue
            src = by_id.get(event.previous_instance or "")
            dst = by_id.get(target)
            if src is None or dst is None:
                continue
            leaving_pin = src.instance_id in planner.pinned and target not in planner.pinned
            if leaving_pin and dst.tp == src.tp:  # its rank left the pinned tier: make room
                target = self._least_work_of_width(target, instances, event, remaining)
                moves[tid] = Decision(target, reason="left_pinned", migrate=True)
                planner.book(tid, target)
                continue
            # Stopping a decode pays for a wider instance, or, at the same width, for a
            # pinned one its rank entered: the mirror of leaving one (32B search seed 2:
            # a 12,709-token first turn ranked just below the pins decoded for 176 s on
            # a full open TP-8 beside idle pinned ones).
            entering_pin = target in planner.pinned and src.instance_id not in planner.pinned
            if dst.tp < src.tp or (dst.tp == src.tp and not entering_pin):
                continue
            if dst.num_in_flight > share + BUSY_SLACK:
                continue
            reason = "outgrew_instance" if dst.tp > src.tp else "entered_pinned"
            moves[tid] = Decision(target, reason=reason, migrate=True)
            planner.book(tid, target)
        moves |= self._drain_moves(events, instances, moves)
        planner.decoding = {
            e.trajectory_id: (moves[tid].instance_id if (tid := e.trajectory_id) in moves
                              else e.previous_instance or "", e.context_tokens)
            for e in events
        }  # fmt: skip
        return moves

    def _drain_moves(
        self,
        events: Sequence[StepEvent],
        instances: Sequence[InstanceState],
        decided: dict[str, Decision],
    ) -> dict[str, Decision]:
        """Beyond the paper: once an instance is idle the batch is draining and GPUs are
        spare, so a decode's own speed is what counts. Longest predicted first, each
        moves to the instance where it would run fastest (its batch and KV as the
        engines last reported them, plus it) if that is `DRAIN_WIDER_GAIN` times faster
        on a wider instance or `DRAIN_SAME_GAIN` on one as wide. The rank-to-instance
        map cannot do this: in the tail its predictions are all alike, and it left a
        TP-8 instance with five decodes beside two idle ones."""
        if not draining(instances):
            return {}
        planner = self.planner
        speeds = InstanceSpeeds.of(instances, planner.instance_shapes()[0])
        moves = {}
        for event in sorted(
            (e for e in events if e.trajectory_id not in decided),
            key=lambda e: planner.rank(e.trajectory_id),
        ):
            tid, src = event.trajectory_id, event.previous_instance or ""
            if planner.remaining.get(tid, 0.0) < MIN_MIGRATE_TOKENS:
                continue
            context = event.context_tokens
            options = {iid: there for iid in speeds.width if iid not in planner.vacating
                       and (there := speeds.faster(src, iid, context)) is not None}  # fmt: skip
            if not options:
                continue
            best = min(options, key=options.__getitem__)
            moves[tid] = Decision(best, reason="drain_faster", migrate=True)
            planner.book(tid, best)
            speeds.move(src, best, context)
        return moves

    def on_step_done(self, event: StepEvent, instance_id: str, output_tokens: int) -> None:
        return None

    def on_trajectory_done(
        self, trajectory_id: str, group_id: str, generated_tokens: int, num_turns: int
    ) -> None:
        self.planner.finished(trajectory_id, group_id, generated_tokens)
