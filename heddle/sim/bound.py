"""The batch's lower bound (DESIGN.md, "Measures"): no split, schedule, reshape or
migration finishes the trace sooner. Each term is a separate function so that a policy
can read one part (`scheduler/heddle.py` reads the memory reads and the longest)
without paying for the rest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sparse
from scipy.optimize import linprog

from engines.costmodel import CostModel
from engines.trajectory_costs import (
    allowed_costs,
    attended,
    decode_runs,
    longest_alone_s,
    memory_reads_s,
    one_gpu_terms,
)
from heddle.hardware import ClusterShape
from heddle.types import TrajectorySpec

# Context bins of the streams term: each bin's tokens are costed at its lower edge, so
# coarser bins only loosen the bound (by at most the ratio of neighbouring edges, ~4%).
_CONTEXT_BINS = 256
# The LP's variables grow with its bins. 64 solves 6,400 trajectories of 32B coding in
# 16 s at 892 s; 128 bins take 55 s for 898 s (`benchmarks/bound_lp.py --bins`).
_LP_CONTEXT_BINS = 64


def lower_bound(specs: Sequence[TrajectorySpec], cluster: ClusterShape) -> dict[str, float]:
    """The largest of (a) the longest trajectory alone, (b) the tokens over the cluster's
    peak decode throughput, (c) the memory reads no schedule avoids, (d) the iteration
    streams the long trajectories need to finish in time, and (e) the same streams as a
    linear program, at the size of the long set that gives (d) (see each term); with
    speculative decoding, over the tokens a verify pass makes."""
    costs = allowed_costs(cluster)
    num_gpus, max_num_seqs = cluster.num_gpus, cluster.max_num_seqs
    longest = longest_alone_s(specs, costs)
    tokens = sum(s.generated_tokens for s in specs)
    context = min(s.prompt_tokens for s in specs)
    peak = max(
        (num_gpus // c.tp) * max_num_seqs / c.decode_token_s(max_num_seqs, context) for c in costs
    )
    work = tokens / peak
    reads = memory_reads_s(specs, costs, num_gpus=num_gpus, max_num_seqs=max_num_seqs)
    streams, m = _streams_best(specs, costs, num_gpus=num_gpus, max_num_seqs=max_num_seqs)
    streams_lp = streams_lp_s(specs, costs, num_gpus=num_gpus, max_num_seqs=max_num_seqs,
                              members=[m])  # fmt: skip
    # Speculating engines make a token in no less than a plain iteration over the tokens a
    # verify pass makes (the pass costs at least the iteration): every term over that
    # stays a bound, a loose one, since prefill and tool waits do not speed up.
    spec = cluster.speculation
    speedup = 1.0
    if spec is not None and any(c.speculation_max_batch(spec, max_num_seqs) for c in costs):
        speedup = spec.tokens_per_verify
    return {
        "lower_bound_s": max(longest, work, reads, streams, streams_lp) / speedup,
        "speculation_speedup": speedup,
        "longest_alone_s": longest,
        "work_s": work,
        "memory_reads_s": reads,
        "streams_s": streams,
        "streams_lp_s": streams_lp,
    }


@dataclass(frozen=True)
class _Degree:
    """One TP degree's iteration, split as the streams term needs it."""

    gpu_s: float  # GPU time an iteration costs whatever it carries: t x (weights + fixed)
    gpu_s_per_token: float  # GPU time of each token's all-reduce
    wall_s: float  # wall time of an empty iteration: weights, all-reduce latency, overhead
    wall_s_per_token: float
    wall_s_per_kv: float

    @classmethod
    def of(cls, cost: CostModel) -> _Degree:
        t = cost.terms
        wall = t.mem_base_s + t.allreduce_base_s + t.overhead_s
        return cls(
            gpu_s=cost.tp * wall,
            gpu_s_per_token=cost.tp * t.allreduce_per_token_s,
            wall_s=wall,
            wall_s_per_token=t.allreduce_per_token_s,
            wall_s_per_kv=t.mem_per_kv_token_s,
        )


@dataclass(frozen=True)
class _Binned:
    """The batch as the streams terms see it: trajectories by tokens, most first, and
    their decode contexts as runs (owner's rank, first context, count) over context bins
    whose lower edges cost each bin's tokens (coarser bins only loosen the bound)."""

    edges: np.ndarray
    owner: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    firsts: np.ndarray  # turns per trajectory: a turn's first token comes with no KV read
    tools: np.ndarray  # tool seconds per trajectory
    attended: np.ndarray  # KV tokens read per trajectory
    every_at: np.ndarray  # every trajectory's tokens per bin

    @classmethod
    def of(cls, specs: Sequence[TrajectorySpec], bins: int) -> _Binned:
        order = sorted(specs, key=lambda s: s.generated_tokens, reverse=True)
        runs = [decode_runs(s) for s in order]
        longest_context = max((c + n for r in runs for c, n in r), default=1)
        edges = np.unique(
            np.concatenate(([0], np.geomspace(1, longest_context + 1, bins).astype(np.int64)))
        ).astype(float)
        starts = np.array([c for r in runs for c, _ in r], dtype=float)
        counts = np.array([n for r in runs for _, n in r], dtype=float)
        firsts = np.array([sum(1 for st in s.steps if st.output_tokens > 0) for s in order])
        every_at = _tokens_per_bin(edges, starts, counts)
        every_at[0] += firsts.sum()
        return cls(
            edges=edges,
            owner=np.array([i for i, r in enumerate(runs) for _ in r], dtype=np.int64),
            starts=starts,
            counts=counts,
            firsts=firsts,
            tools=np.array([sum(st.tool_latency_s for st in s.steps if st.tool) for s in order]),
            attended=np.array([attended(r) for r in runs], dtype=float),
            every_at=every_at,
        )

    def members_at(self, m: int) -> np.ndarray:
        """The tokens per bin of the m trajectories with most tokens."""
        taken = self.owner < m
        tokens_at = _tokens_per_bin(self.edges, self.starts[taken], self.counts[taken])
        tokens_at[0] += self.firsts[:m].sum()
        return tokens_at


def streams_s(
    specs: Sequence[TrajectorySpec],
    costs: Sequence[CostModel],
    *,
    num_gpus: int,
    max_num_seqs: int,
) -> float:
    """(d): a long trajectory makes one token per iteration it is in, and those
    iterations plus its tool calls fit in the makespan T. Many long ones either share
    iterations, which the KV they read makes slower, or run in separate ones, each
    paying the weights and fixed costs again in GPU time. For a set S of trajectories:
    an iteration I on TP t with p_I members of S lasts D_I >= alpha_t + a_t p_I +
    beta_t K_I (K_I: the KV of every sequence in it) and costs t D_I GPU-seconds. Every
    member i has sum over its iterations of D_I <= T - tools_i, so for any lambda >= 0

        num_gpus T >= sum_I t D_I + lambda (sum_I p_I D_I - sum_i (T - tools_i)),

    and the right side splits into a term per token: for a token of S, g_t / p + t a_t
    + m k + lambda (alpha_t + a_t p + beta_t p k), at least its minimum over t and over
    real p in [1, max_num_seqs]; for a token outside S, t a_t + m k and either lambda
    beta_t k (it rides an iteration of S, whose weights S's tokens paid, and its KV
    slows p >= 1 members) or g_t / max_num_seqs (its iteration has no member of S, so
    its own tokens pay the weights), the smaller. T is then at least (H(lambda) +
    lambda sum tools) / (num_gpus + lambda |S|) for every lambda, a quasi-concave
    function of lambda that a ternary search maximises. S is taken as the m
    trajectories with the most tokens, for m = 1, 2, 4, ..., all; each gives a bound
    and the largest is kept. Migrations, reshapes and preemptions only add iterations
    or time, so this holds for them too."""
    return _streams_best(specs, costs, num_gpus=num_gpus, max_num_seqs=max_num_seqs)[0]


def _streams_best(
    specs: Sequence[TrajectorySpec],
    costs: Sequence[CostModel],
    *,
    num_gpus: int,
    max_num_seqs: int,
) -> tuple[float, int]:
    """(d) and the size of the set S that gives it."""
    degrees = [_Degree.of(c) for c in costs]
    kv_s = one_gpu_terms(costs).mem_per_kv_token_s
    binned = _Binned.of(specs, _CONTEXT_BINS)
    best, best_m = 0.0, 1
    size = 1
    while True:
        m = min(size, len(specs))
        tokens_at = binned.members_at(m)
        value = _streams_for(
            tokens_at, binned.every_at - tokens_at, binned.edges, degrees, kv_s, num_gpus,
            max_num_seqs, m, float(binned.tools[:m].sum()),
            kv_s * float(binned.attended[m:].sum()),
        )  # fmt: skip
        if value > best:
            best, best_m = value, m
        if m == len(specs):
            return best, best_m
        size *= 2


def streams_lp_s(
    specs: Sequence[TrajectorySpec],
    costs: Sequence[CostModel],
    *,
    num_gpus: int,
    max_num_seqs: int,
    members: Sequence[int],
    bins: int = _LP_CONTEXT_BINS,
) -> float:
    """(e): (d)'s model solved as a linear program, the best over the sizes of S in
    `members`. (d) prices each token on its own, so a token outside S rides an iteration
    of S as if that iteration held one member while S's tokens sit in iterations of many
    (benchmarks/bound_lp.py measures what that gives away: 2-6% on math). Here an
    iteration type is a degree t and an exact count p of members of S (every integer up
    to max_num_seqs, no grid): n_tp such iterations carry p n_tp tokens of S and at most
    (max_num_seqs - p) n_tp others, whose KV (at the bins' lower edges) fits the cache.
    T is the least value with every iteration's GPU time (t D per iteration, every KV
    read included) within num_gpus T and the members' time (p D per iteration) within
    |S| T less their tools; iteration times are sums over the types, so both are linear.
    Any schedule gives a feasible point, so the optimum is a lower bound."""
    binned = _Binned.of(specs, bins)
    kv_s = one_gpu_terms(costs).mem_per_kv_token_s
    return max(
        _streams_lp_for(binned, costs, kv_s, num_gpus, max_num_seqs, min(m, len(specs)))
        for m in members
    )


def _streams_lp_for(
    binned: _Binned,
    costs: Sequence[CostModel],
    kv_s: float,
    num_gpus: int,
    max_num_seqs: int,
    m: int,
) -> float:
    used = binned.every_at > 0  # bins nothing falls in add only variables fixed at zero
    edges, every_at = binned.edges[used], binned.every_at[used]
    ours = binned.members_at(m)[used]
    others = every_at - ours
    nb = len(edges)
    batch = np.tile(np.arange(min(max_num_seqs, m) + 1), len(costs))  # type j's p
    degree = np.repeat(np.arange(len(costs)), min(max_num_seqs, m) + 1)
    nt = len(batch)
    terms = [c.terms for c in costs]
    tp = np.array([c.tp for c in costs], dtype=float)[degree]
    wall = np.array([t.mem_base_s + t.allreduce_base_s + t.overhead_s for t in terms])[degree]
    per_seq = np.array([t.allreduce_per_token_s for t in terms])[degree]
    per_kv = np.array([t.mem_per_kv_token_s for t in terms])[degree]
    cache = np.array([c.kv_capacity_tokens for c in costs], dtype=float)[degree]

    # Variables: T | n[j] iterations of type j | x[j, b] tokens of S | y[j, b] others'.
    types = np.arange(nt)
    cell_type, cell_bin = np.repeat(types, nb), np.tile(np.arange(nb), nt)
    n_of = 1 + types
    x_of = 1 + nt + cell_type * nb + cell_bin
    y_of = x_of + nt * nb
    count = 1 + nt + 2 * nt * nb
    ones, k = np.ones(nt * nb), edges[cell_bin]
    seat_s = batch[cell_type] * (per_seq[cell_type] + per_kv[cell_type] * k)
    gpu, mine = 2 * nt, 2 * nt + 1
    t_col = np.zeros(1, dtype=np.int64)
    upper = _sparse_rows(
        count,
        # Seats: the others fill at most max_num_seqs - p of each iteration.
        (cell_type, y_of, ones), (types, n_of, batch - float(max_num_seqs)),
        # Cache: the KV an iteration reads fits its instance's.
        (nt + cell_type, x_of, k), (nt + cell_type, y_of, k), (nt + types, n_of, -cache),
        # GPU time within num_gpus T (every KV read is the constant on the right).
        (np.full(nt, gpu), n_of, tp * wall),
        (np.full(nt * nb, gpu), x_of, (tp * per_seq)[cell_type]),
        (np.full(nt * nb, gpu), y_of, (tp * per_seq)[cell_type]),
        (np.full(1, gpu), t_col, np.array([-float(num_gpus)])),
        # Members' time within |S| T less their tools.
        (np.full(nt, mine), n_of, batch * wall),
        (np.full(nt * nb, mine), x_of, seat_s), (np.full(nt * nb, mine), y_of, seat_s),
        (np.full(1, mine), t_col, np.array([-float(m)])),
    )  # fmt: skip
    upper_rhs = np.concatenate(
        (np.zeros(2 * nt), [-kv_s * binned.attended.sum(), -binned.tools[:m].sum()])
    )
    equal = _sparse_rows(
        count,
        # Every token is in some iteration, and each type has exactly p members of S.
        (cell_bin, x_of, ones), (nb + cell_bin, y_of, ones),
        (2 * nb + cell_type, x_of, ones), (2 * nb + types, n_of, -batch.astype(float)),
    )  # fmt: skip
    equal_rhs = np.concatenate((ours, others, np.zeros(nt)))
    bounds = np.zeros((count, 2))
    bounds[:, 1] = np.inf
    bounds[x_of[batch[cell_type] == 0], 1] = 0.0
    objective = np.zeros(count)
    objective[0] = 1.0
    result = linprog(objective, A_ub=upper, b_ub=upper_rhs, A_eq=equal, b_eq=equal_rhs,
                     bounds=bounds, method="highs")  # fmt: skip
    if result.status != 0:
        raise RuntimeError(f"the streams LP (|S| = {m}) failed: {result.message}")
    return float(result.fun)


def _sparse_rows(columns: int, *blocks: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Any:
    """A CSR matrix from (rows, columns, values) blocks; the row count is the largest
    row named plus one."""
    rows = np.concatenate([b[0] for b in blocks])
    return sparse.csr_matrix(
        (np.concatenate([b[2] for b in blocks]), (rows, np.concatenate([b[1] for b in blocks]))),
        shape=(int(rows.max()) + 1, columns),
    )


def _tokens_per_bin(edges: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Tokens whose context lies in [edges[b], edges[b + 1]), the runs' contexts being
    start, start + 1, ..., start + count - 1: below(e) = sum of clip(e - start, 0, count),
    a sum of two ramps per run, evaluated at every edge from sorted cumulative sums."""

    def ramps(points: np.ndarray) -> np.ndarray:  # sum over points x of max(e - x, 0)
        points = np.sort(points)
        cumulative = np.concatenate(([0.0], np.cumsum(points)))
        below = np.searchsorted(points, edges, side="left")
        return below * edges - cumulative[below]

    below = ramps(starts) - ramps(starts + counts)
    return np.diff(np.append(below, counts.sum()))


def _streams_for(
    tokens_at: np.ndarray,
    others_at: np.ndarray,
    contexts: np.ndarray,
    degrees: Sequence[_Degree],
    kv_s: float,
    num_gpus: int,
    max_num_seqs: int,
    members: int,
    tools_s: float,
    rest_s: float,
) -> float:
    """max over lambda of (H(lambda) + lambda tools + rest) / (num_gpus + lambda members)."""

    def bound(lam: float) -> float:
        cheapest = np.full(len(contexts), np.inf)
        for d in degrees:
            q = lam * (d.wall_s_per_token + d.wall_s_per_kv * contexts)
            p = np.clip(np.sqrt(d.gpu_s / np.maximum(q, 1e-300)), 1.0, max_num_seqs)
            per_token = d.gpu_s / p + q * p + d.gpu_s_per_token + lam * d.wall_s
            cheapest = np.minimum(cheapest, per_token)
        # A token outside S either rides an iteration of S, where its KV slows the
        # members (lambda p beta k, p >= 1), or runs in one without S, a share of whose
        # weights and fixed costs it pays (at least g / max_num_seqs).
        riding = np.full(len(contexts), np.inf)
        for d in degrees:
            own = d.gpu_s_per_token + np.minimum(
                lam * d.wall_s_per_kv * contexts, d.gpu_s / max_num_seqs
            )
            riding = np.minimum(riding, own)
        h = float(tokens_at @ (cheapest + kv_s * contexts) + others_at @ riding)
        return (h + lam * tools_s + rest_s) / (num_gpus + lam * members)

    lo, hi = -6.0, 6.0  # log10 lambda, lambda in GPUs per trajectory
    for _ in range(80):
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if bound(10**a) < bound(10**b):
            lo = a
        else:
            hi = b
    return max(bound(0.0), bound(10**lo))
