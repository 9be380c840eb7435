"""Reshaping during rollout (beyond the paper, which reshapes between iterations): idle
narrow instances merge into wide ones when the DP says the tail gains more than the
restart costs, or a crowded long decode would run faster there; a block of busy narrow
instances is emptied first when the DP wants it wide. After each change the batch plan is
re-solved over the instances that are up (`scheduler/reshape.py` holds the GPU layout and
the DP's rule)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.heddle.bookings import Bookings
from scheduler.heddle.forecast import Forecast
from scheduler.heddle.plan import BatchPlan
from scheduler.heddle.shapes import InstanceShapes
from scheduler.heddle.speeds import InstanceSpeeds
from scheduler.interface import InstanceSpec, InstanceState, Reshape
from scheduler.reshape import GpuLayout, merges_that_pay


@dataclass
class Reshaping:
    shapes: InstanceShapes
    forecast: Forecast
    bookings: Bookings
    plan: BatchPlan
    # Reshape during rollout at all; and may empty a busy block to merge it (needs a
    # placement that moves trajectories off).
    enabled: bool = True
    vacate: bool = True
    layout: GpuLayout | None = None
    starting: set[str] = field(default_factory=set)
    # A block of narrow instances being emptied to merge into one wide instance: no step
    # is sent there, and what runs there leaves at its next step or review.
    vacating: tuple[str, ...] = ()
    # The long decodes the last review saw: where each runs, and its context.
    decoding: dict[str, tuple[str, int]] = field(default_factory=dict)
    instances_made: int = 0  # instance ids are never reused
    _recheck_below: float = float("inf")

    def replan(self) -> None:
        """Re-solve the plan over the instances that take steps (every one restarting
        after a merge: those, which queue the steps until they are up)."""
        assert self.layout is not None
        tp = self.layout.tp
        taking = [i for i in tp if i not in self.starting and i not in self.vacating]
        if not taking:
            taking = [i for i in tp if i not in self.vacating]
        self.plan.replan(self.layout, taking, self.forecast)

    def reshape(self, instances: Sequence[InstanceState], now: float) -> list[Reshape]:
        """Merge the idle instances of an aligned block, widest first, when the DP
        predicts the tail finishes sooner on the merged split, restart included, or when
        a long decode in flight would run enough faster there (`_merges_for_decodes`);
        failing both, start emptying a block of narrow instances when the DP says the
        widest degree there pays (`_start_vacating`), and merge it once empty.
        Re-checked as the active count falls by 2%."""
        if not self.enabled or self.layout is None or not len(self.forecast):
            return []
        if self.vacating:
            return self._merge_vacated(instances)
        active = len(self.forecast)
        if active >= self._recheck_below:
            return []
        models, restart_s = self.shapes.models, self.shapes.restart_s
        idle = [s.instance_id for s in instances if s.num_in_flight == 0 and s.num_sessions == 0]
        blocks = self.layout.blocks_within(idle, models)
        layout = self.layout
        current = [s.instance_id for s in instances] + sorted(self.starting)
        where = {iid: k for k, iid in enumerate(current)}
        lengths, contexts = self.forecast.longest_first()
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
        self.replan()
        return changes

    def on_instance_ready(self, spec: InstanceSpec) -> None:
        self.starting.discard(spec.instance_id)
        self.replan()

    def _merge(self, members: tuple[str, ...], tp: int, reason: str) -> Reshape:
        assert self.layout is not None
        new_id = f"h{self.instances_made}"
        self.instances_made += 1
        self.layout.merge(members, new_id)
        self.starting.add(new_id)
        return Reshape(members, InstanceSpec(new_id, tp), self.shapes.restart_s[tp], reason)

    def _start_vacating(
        self, instances: Sequence[InstanceState], current: list[str], where: dict[str, int]
    ) -> None:
        """While every narrow instance still holds long trajectories none goes idle, yet
        the DP, re-run on the re-predicted forecast, can want more wide instances than
        the batch-start plan (14B coding: once the first steps have re-ranked the batch).
        The block of the widest degree whose instances hold the least predicted work, of
        those whose merge pays by the DP's rule, stops taking steps; its trajectories
        leave at their next step or review."""
        assert self.layout is not None
        layout = self.layout
        models, restart_s = self.shapes.models, self.shapes.restart_s
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
        lengths, contexts = self.forecast.longest_first()
        tps = [layout.tp[i] for i in current]
        groups = [[where[i] for i in members] for members, _ in blocks]
        kept = merges_that_pay(lengths, contexts, tps, groups, models, restart_s, alone=True)
        paying = [blocks[k][0] for k in kept]
        if paying:
            members = min(paying, key=lambda b: sum(self.bookings.work_on(i) for i in b))
            self.vacating = members
            self.replan()

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
        self.replan()
        return [change]

    def _merges_for_decodes(
        self,
        speeds: InstanceSpeeds,
        blocks: Sequence[tuple[tuple[str, ...], int]],
        taken: set[str],
        restart_s: dict[int, float],
    ) -> list[int]:
        """Which `blocks` to merge (none of whose instances are `taken`, merged already;
        it grows with each merge kept) for the decodes the last review saw. A block is
        merged when the longest decode not yet served would run faster on it by the
        drain moves' gain, saving more than its restart on its predicted remaining
        tokens; the drain moves then send it there. The DP rule misses this: it
        re-spreads the whole tail at will, narrower instances included, on predicted
        remaining lengths that in the tail fall short of the truth."""
        forecast = self.forecast
        waiting = sorted((t for t in self.decoding if t in forecast), key=forecast.rank)
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
                if there is not None and forecast.remaining[tid] * (here - there) > restart_s[tp]:
                    kept.append(k)
                    taken.update(members)
                    waiting.remove(tid)
                    speeds.move(src, new_id, context)
                    break
        return kept
