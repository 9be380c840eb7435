"""Presorted dynamic-programming placement (Heddle paper, "Presorted DP placement").

Trajectories sorted by predicted remaining length, longest first, are cut into
contiguous groups, one per instance (instances ordered widest first), to minimise the
slowest group's predicted time. With the trajectories sorted, an optimal partition is
contiguous (an exchange argument), so

    dp[j][i] = min_k max(dp[j-1][k], T_j(k, i))

where `T_j(k, i)`, group k..i-1's time on instance j, is the longer of the longest
member's `L[k]` iterations and the group's tokens over the batch that fits at once, at
the iteration time of that batch: the interference of running it together, from the
cost model's linear terms, with the batch cut to what the KV cache and the seats hold.
(The paper's `L[k] * t_j(|g|)`, with a per-token time that grows as the group overflows
its cache, charges every member the longest's length: it rates a big group on a wide
instance slower than it runs, and steered the split search away from the all-TP-8 split
that ran fastest on 14B coding.) `dp[j-1][k]` grows with k and the group time shrinks
with k, so the best k is at their crossing, found by a binary search run for every i at
once (numpy): O(m n log n). Short trajectories beyond the first `exact` are aggregated
into equal-count chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from engines.costmodel import DRAFT_S_PER_SEQ, CostModel, IterationTerms
from heddle.hardware import Speculation

# Heddle's planners cap a group's KV at four times its instance's share (see `solve`).
KV_SHARE_CAP = 4.0
# How many leading groups `solve_leading` fixes one after another, each a further solve.
# On 64 TP-1 instances the top trajectories are each the slowest of what is left, and
# an uncapped chain made a 3,200-trajectory search batch's re-plans take 142 s in all
# (3 levels: 5.9 s, against 4.5 s for plain `solve`); on the paper setting's eight TP-8s
# three levels gave the same runs as no cap.
LEADING_DEPTH = 3


@dataclass(frozen=True)
class InstanceModel:
    """An instance's per-token time for a group: b requests whose KV totals ctx tokens.

    When the group's KV exceeds the cache (or b exceeds the seats), only a fitting
    fraction runs at a time and the group takes proportionally longer.
    """

    tp: int
    terms: IterationTerms
    kv_capacity_tokens: int
    max_num_seqs: int
    # Speculative decoding (the cluster's `speculation`), as the engine core runs it: a
    # batch of at most `spec_max_batch` verifies `spec_draft_tokens` drafts per request
    # in a pass that makes `spec_tokens_per_pass` tokens each (0: off).
    spec_max_batch: int = 0
    spec_draft_tokens: int = 0
    spec_tokens_per_pass: float = 1.0

    @classmethod
    def of(
        cls, cost: CostModel, max_num_seqs: int, speculation: Speculation | None = None
    ) -> InstanceModel:
        if speculation is None:
            return cls(cost.tp, cost.terms, cost.kv_capacity_tokens, max_num_seqs)
        return cls(
            cost.tp,
            cost.terms,
            cost.kv_capacity_tokens,
            max_num_seqs,
            cost.speculation_max_batch(speculation, max_num_seqs),
            speculation.draft_tokens,
            speculation.tokens_per_verify,
        )

    def pooled(self, count: int) -> InstanceModel:
        """`count` instances like this one, balanced as one: each runs 1/count of a group
        (its tokens, KV and attention), each reads the weights."""
        t = self.terms
        terms = replace(
            t,
            mem_per_kv_token_s=t.mem_per_kv_token_s / count,
            compute_per_token_s=t.compute_per_token_s / count,
            compute_per_attended_s=t.compute_per_attended_s / count,
            allreduce_per_token_s=t.allreduce_per_token_s / count,
        )
        return InstanceModel(
            self.tp,
            terms,
            self.kv_capacity_tokens * count,
            self.max_num_seqs * count,
            self.spec_max_batch * count,
            self.spec_draft_tokens,
            self.spec_tokens_per_pass,
        )

    def _fitting(
        self, batch: np.ndarray | float, context: np.ndarray | float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch that runs at a time (a fraction `fit` of the group: what the KV
        cache and the seats hold), and the time of one iteration of it."""
        b = np.asarray(batch, dtype=np.float64)
        c = np.asarray(context, dtype=np.float64)
        room = self.kv_capacity_tokens / np.maximum(c, 1.0)
        fit = np.minimum(1.0, np.minimum(room, self.max_num_seqs / np.maximum(b, 1.0)))
        eb, ec = b * fit, c * fit
        t = self.terms
        mem = t.mem_base_s + ec * t.mem_per_kv_token_s
        compute = eb * t.compute_per_token_s + ec * t.compute_per_attended_s
        allreduce = t.allreduce_base_s + eb * t.allreduce_per_token_s
        iteration = np.maximum(mem, compute) + allreduce + t.overhead_s
        if self.spec_max_batch > 0:
            # A verify pass: every drafted position computed, the reads once, each
            # request's drafts made on the host; its time shared by the tokens it makes.
            p = 1 + self.spec_draft_tokens
            verify = (
                np.maximum(mem, p * compute)
                + t.allreduce_base_s
                + p * eb * t.allreduce_per_token_s
                + t.overhead_s
                + eb * DRAFT_S_PER_SEQ
            )
            spec = verify / self.spec_tokens_per_pass
            iteration = np.where(eb <= self.spec_max_batch, spec, iteration)
        return fit, eb, iteration

    def per_token_s(self, batch: np.ndarray | float, context: np.ndarray | float) -> np.ndarray:
        b = np.asarray(batch, dtype=np.float64)
        fit, _, iteration = self._fitting(b, context)
        return np.where(b > 0, iteration / fit, 0.0)

    def group_time_s(
        self,
        longest: np.ndarray | float,
        tokens: np.ndarray | float,
        batch: np.ndarray | float,
        context: np.ndarray | float,
    ) -> np.ndarray:
        """Predicted time of a group: `batch` trajectories, `tokens` remaining in all,
        the longest `longest`, whose KV totals `context`. The longest takes `longest`
        iterations; when the group does not fit at once, the instance also needs
        `tokens` / (the fitting batch) iterations, as the short members finish and free
        their room. (`longest` times the per-token time, the paper's cost, would charge
        every member the longest's length and call a big group on a wide instance
        slower than it runs.)"""
        b = np.asarray(batch, dtype=np.float64)
        _, eb, iteration = self._fitting(b, context)
        waves = np.asarray(tokens, dtype=np.float64) / np.maximum(eb, 1e-9)
        return np.where(b > 0, np.maximum(longest, waves) * iteration, 0.0)


@dataclass(frozen=True)
class Partition:
    """Group sizes (in trajectories), one per instance in the order given, and the
    predicted makespan. From `solve_leading`, `rest_s`: the makespan of the groups after
    the first, then, while the first is the slowest, of those after the next, and so on
    (what orders partitions that tie)."""

    sizes: tuple[int, ...]
    makespan_s: float
    rest_s: tuple[float, ...] = ()

    @property
    def key(self) -> tuple[float, ...]:
        """Makespan, then the rest's, each to the microsecond: smaller is better."""
        return tuple(round(t, 6) for t in (self.makespan_s, *self.rest_s))


def _aggregate(
    lengths: np.ndarray, contexts: np.ndarray, exact: int, max_items: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Keep the longest `exact` as they are; chunk the rest (a chunk's length is its
    longest member's, its weight its member count, its tokens and its context its
    members' sums)."""
    n = len(lengths)
    if n <= max_items:
        return lengths, np.ones(n, dtype=np.int64), lengths, contexts
    chunks = max_items - exact
    if chunks < 1:
        # No chunk would be left for the rest: they would silently drop out of the plan.
        raise ValueError(f"max_items ({max_items}) must exceed exact ({exact})")
    edges = np.unique(np.linspace(exact, n, chunks + 1).round().astype(np.int64))

    def chunk_sums(values: np.ndarray) -> np.ndarray:
        prefix = np.concatenate([[0.0], np.cumsum(values)])
        return np.concatenate([values[:exact], prefix[edges[1:]] - prefix[edges[:-1]]])

    return (
        np.concatenate([lengths[:exact], lengths[edges[:-1]]]),
        np.concatenate([np.ones(exact, dtype=np.int64), np.diff(edges)]),
        chunk_sums(lengths),
        chunk_sums(contexts),
    )


def solve(
    lengths_desc: Sequence[float],
    contexts: Sequence[float],
    instances: Sequence[InstanceModel],
    *,
    exact: int = 256,
    max_items: int = 768,
    max_kv_share: float | None = None,
) -> Partition:
    """Optimal contiguous partition of `lengths_desc` (remaining tokens, sorted longest
    first; `contexts` their mean KV while they run) over `instances` (widest first).

    With `max_kv_share`, no group holds more than that multiple of its instance's share
    (by KV capacity) of the batch's KV: the objective only sees the slowest group, and
    the model leaves out prefill, tool waits and preemption, so without a cap the groups
    off the critical path can grow far past what their instance serves in time."""
    lengths = np.asarray(lengths_desc, dtype=np.float64)
    if len(lengths) == 0:
        return Partition(tuple(0 for _ in instances), 0.0)
    if not instances:
        raise ValueError(f"no instance to place {len(lengths)} trajectories on")
    if np.any(np.diff(lengths) > 0):
        raise ValueError("lengths must be sorted longest first")
    items, weights, tokens, ctx = _aggregate(
        lengths, np.asarray(contexts, np.float64), exact, max_items
    )
    n = len(items)
    size_before = np.concatenate([[0], np.cumsum(weights)])  # trajectories before item k
    tokens_before = np.concatenate([[0.0], np.cumsum(tokens)])
    ctx_before = np.concatenate([[0.0], np.cumsum(ctx)])
    head = np.concatenate([items, [0.0]])  # L[k], the longest of a group starting at k
    idx = np.arange(n + 1)
    dp_prev = np.full(n + 1, np.inf)
    dp_prev[0] = 0.0
    choices = []
    total_capacity = sum(inst.kv_capacity_tokens for inst in instances)
    for inst in instances:
        cap = np.inf
        if max_kv_share is not None and total_capacity > 0:
            cap = max_kv_share * inst.kv_capacity_tokens / total_capacity * ctx_before[-1]

        def cost(
            k: np.ndarray, i: np.ndarray, inst: InstanceModel = inst, cap: float = cap
        ) -> np.ndarray:
            size = size_before[i] - size_before[k]
            group_ctx = ctx_before[i] - ctx_before[k]
            group_tokens = tokens_before[i] - tokens_before[k]
            t = inst.group_time_s(head[k], group_tokens, size, group_ctx)
            return np.where(group_ctx > cap, np.inf, t)

        lo = np.zeros(n + 1, dtype=np.int64)
        hi = idx.copy()
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            crossed = dp_prev[mid] >= cost(mid, idx)
            hi = np.where(crossed, mid, hi)
            lo = np.where(crossed, lo, mid + 1)
        best_k = lo
        val = np.maximum(dp_prev[best_k], cost(best_k, idx))
        left = np.maximum(best_k - 1, 0)
        val_left = np.maximum(dp_prev[left], cost(left, idx))
        use_left = (best_k > 0) & (val_left < val)
        best_k = np.where(use_left, left, best_k)
        dp_prev = np.minimum(val, np.where(use_left, val_left, np.inf))
        choices.append(best_k)
    if not np.isfinite(dp_prev[n]) and max_kv_share is not None:
        # A chunk larger than any cap (coarse aggregation): solve without the cap.
        return solve(lengths_desc, contexts, instances, exact=exact, max_items=max_items)
    # Backtrack from all items placed.
    sizes = []
    i = n
    for best_k in reversed(choices):
        k = int(best_k[i])
        sizes.append(int(size_before[i] - size_before[k]))
        i = k
    if i != 0:
        raise AssertionError("the partition does not cover every trajectory")
    return Partition(tuple(reversed(sizes)), float(dp_prev[n]))


def solve_leading(
    lengths_desc: Sequence[float],
    contexts: Sequence[float],
    instances: Sequence[InstanceModel],
    *,
    max_kv_share: float | None = None,
    depth: int = LEADING_DEPTH,
) -> Partition:
    """`solve`, with its ties ordered. When the first group is the slowest (late in a
    batch, the longest trajectory alone), the objective cannot see how the rest is
    split, and `solve` returns any split of it: over three pinned instances and an open
    pool, 32B search got (1, 0, 11, rest), whose empty pin lost to two pins on the tie,
    and the instance un-pinned filled with the queued bulk until the next re-plan. So,
    while the leading group is the slowest, it is kept and the rest solved again on the
    remaining instances (its own KV cap, from its own totals), at most `depth` times;
    `rest_s` holds each rest's makespan."""
    plan = solve(lengths_desc, contexts, instances, max_kv_share=max_kv_share)
    if len(instances) < 2 or depth < 1:
        return plan
    first = plan.sizes[0]
    if first >= len(lengths_desc):  # nothing after the first group
        return replace(plan, rest_s=(0.0,))
    slowest_in_rest = replace(plan, rest_s=(plan.makespan_s,))
    if first == 0:
        return slowest_in_rest
    head = instances[0].group_time_s(
        lengths_desc[0], sum(lengths_desc[:first]), first, sum(contexts[:first])
    )
    if float(head) < plan.makespan_s * (1 - 1e-9):
        return slowest_in_rest
    rest = solve_leading(
        lengths_desc[first:],
        contexts[first:],
        instances[1:],
        max_kv_share=max_kv_share,
        depth=depth - 1,
    )
    return Partition((first, *rest.sizes), plan.makespan_s, (rest.makespan_s, *rest.rest_s))


def brute_force(
    lengths_desc: Sequence[float], contexts: Sequence[float], instances: Sequence[InstanceModel]
) -> float:
    """Exhaustive optimum over all contiguous partitions (for tests on small cases)."""
    lengths = list(lengths_desc)
    n, m = len(lengths), len(instances)
    best = np.inf

    def rec(start: int, j: int, worst: float) -> None:
        nonlocal best
        if worst >= best:
            return
        if j == m:
            if start == n:
                best = worst
            return
        for end in range(start, n + 1):
            if end == start:
                c = 0.0
            else:
                group = instances[j].group_time_s(
                    lengths[start], sum(lengths[start:end]), end - start, sum(contexts[start:end])
                )
                c = float(group)
            rec(end, j + 1, max(worst, c))

    rec(0, 0, 0.0)
    return float(best)
