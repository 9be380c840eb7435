"""The resource manager: how many instances of which TP degree (Heddle paper,
"Resource manager").

The GPU budget is split into instances with TP degrees from `tp_choices`; lengths sorted
longest first map to instances sorted widest first, so the long tail runs on wide,
low-latency instances and the many short trajectories on narrow, high-throughput ones.
The search is simulated annealing from the best homogeneous split, each candidate
costed by the presorted DP; moves split an instance in two or merge two equal ones; Metropolis
acceptance from a temperature equal to the initial makespan, cooled geometrically. A
hill-climb then polishes the annealing's best with moves that merge the narrowest
instances into one wide one at once (`SplitPlanner.polish`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engines.costmodel import CostModel
from heddle.hardware import ClusterShape
from scheduler.placement_dp import KV_SHARE_CAP, InstanceModel, Partition, solve

COOLING = 0.97
# A split of mixed widths is planned only where the DP finds it this much faster than
# the best homogeneous split. The DP leaves out what mixed widths are most sensitive
# to: forecasts that place a long trajectory on a narrow instance, prefill, tool waits.
# On the robustness benchmark's tuning draws (0-49, 800 trajectories) it found the
# mixed split 1-5% faster on 8 draws; simulated, it was 5-19% slower on 6 of them and
# faster (2%) on one (docs/notes/issue-30-robustness.md).
MIXED_SPLIT_MARGIN = 0.10


@dataclass(frozen=True)
class SplitPlan:
    tps: tuple[int, ...]  # widest first
    partition: Partition
    evaluated: int


@dataclass
class SplitPlanner:
    cluster: ClusterShape
    # An instance must hold one whole trajectory: the 40K-token budget plus its prompt
    # and tool outputs (Qwen3-32B on one H100 keeps only ~9K tokens of KV).
    min_kv_tokens: int = 48_000

    def _fits(self) -> list[int]:
        ok = []
        for tp in sorted(self.cluster.tp_choices):
            cost = CostModel.of(self.cluster, tp)
            if tp <= self.num_gpus and cost.kv_capacity_tokens >= self.min_kv_tokens:
                ok.append(tp)
        if not ok:
            raise ValueError(
                f"no allowed TP degree of {self.cluster.gpu} holds {self.min_kv_tokens} KV tokens "
                f"of {self.cluster.model}"
            )
        return ok

    def models(self) -> dict[int, InstanceModel]:
        return {
            tp: InstanceModel.of(
                CostModel.of(self.cluster, tp), self.cluster.max_num_seqs, self.cluster.speculation
            )
            for tp in self._fits()
        }

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    def homogeneous(self, tp: int) -> tuple[int, ...]:
        if self.num_gpus % tp:
            raise ValueError(f"{self.num_gpus} GPUs do not divide into TP-{tp} instances")
        fits = self._fits()
        if tp not in fits:
            raise ValueError(
                f"TP-{tp} is not among the allowed degrees {self.cluster.model} fits on with "
                f"{self.cluster.gpu}: {fits}"
            )
        return (tp,) * (self.num_gpus // tp)

    def plan(
        self,
        lengths_desc: Sequence[float],
        contexts: Sequence[float],
        *,
        iterations: int = 120,
        seed: int = 0,
    ) -> SplitPlan:
        fits = self._fits()
        models = self.models()
        cache: dict[tuple[int, ...], Partition] = {}

        def cost(tps: tuple[int, ...]) -> Partition:
            if tps not in cache:
                # The search compares splits on a coarser aggregation; the chosen split's
                # partition is solved at full precision below.
                cache[tps] = solve(
                    lengths_desc, contexts, [models[tp] for tp in tps], exact=96, max_items=256,
                    max_kv_share=KV_SHARE_CAP,
                )  # fmt: skip
            return cache[tps]

        # Start from the best homogeneous split (the DP orders by width): from the
        # narrowest everywhere, 120 steps of one split or merge each did not reach the
        # all-TP-4 split the DP itself rated 8% better on 14B coding.
        uniform = [self.homogeneous(tp) for tp in fits if self.num_gpus % tp == 0]
        start = min(uniform, key=lambda tps: cost(tps).makespan_s) if uniform else (fits[0],)
        best = current = start
        temperature = cost(start).makespan_s
        rng = np.random.default_rng(seed)
        for _ in range(iterations):
            candidate = self._neighbour(current, fits, rng)
            if candidate is None:
                continue
            delta = cost(candidate).makespan_s - cost(current).makespan_s
            if delta < 0 or rng.random() < math.exp(-delta / max(temperature, 1e-12)):
                current = candidate
                if cost(current).makespan_s < cost(best).makespan_s:
                    best = current
            temperature *= COOLING
        best = self.polish(best, fits, lambda tps: cost(tps).makespan_s)
        # Solved exactly, the start may still win over what the coarser search preferred.
        finals = {
            tps: solve(
                lengths_desc, contexts, [models[tp] for tp in tps], max_kv_share=KV_SHARE_CAP
            )
            for tps in {best, start}
        }
        if finals[best].makespan_s > (1 - MIXED_SPLIT_MARGIN) * finals[start].makespan_s:
            best = start
        return SplitPlan(best, finals[best], len(cache))

    @staticmethod
    def polish(
        tps: tuple[int, ...], fits: Sequence[int], makespan: Callable[[tuple[int, ...]], float]
    ) -> tuple[int, ...]:
        """Hill-climb from the annealing's best with moves it takes several steps to
        make: the narrowest instances merged into one of a wider allowed degree (eight
        TP-1s into a TP-8 is three pair merges, the first two of which may cost more than
        they gain). Each round takes the best such move while one pays."""
        current = tps
        for _ in range(len(fits) * 4):
            candidates = []
            for degree in fits:
                narrow = sorted(tp for tp in current if tp < degree)
                total, taken = 0, 0
                while total < degree and taken < len(narrow):
                    total += narrow[taken]
                    taken += 1
                if total == degree and taken >= 2:
                    rest = list(current)
                    for tp in narrow[:taken]:
                        rest.remove(tp)
                    candidates.append(tuple(sorted([*rest, degree], reverse=True)))
            better = [c for c in candidates if makespan(c) < makespan(current)]
            if not better:
                return current
            current = min(better, key=makespan)
        return current

    @staticmethod
    def _neighbour(
        tps: tuple[int, ...], fits: Sequence[int], rng: np.random.Generator
    ) -> tuple[int, ...] | None:
        items = list(tps)
        if rng.random() < 0.5:  # split one instance in two halves
            splittable = [i for i, tp in enumerate(items) if tp // 2 in fits]
            if not splittable:
                return None
            i = splittable[int(rng.integers(len(splittable)))]
            half = items.pop(i) // 2
            items += [half, half]
        else:  # merge two instances of one degree
            counts: dict[int, int] = {}
            for tp in items:
                counts[tp] = counts.get(tp, 0) + 1
            mergeable = [tp for tp, c in counts.items() if c >= 2 and 2 * tp in fits]
            if not mergeable:
                return None
            tp = mergeable[int(rng.integers(len(mergeable)))]
            items.remove(tp)
            items.remove(tp)
            items.append(2 * tp)
        return tuple(sorted(items, reverse=True))
