"""Closed-form cost terms of whole trajectories on the cost model's instances: what the
policy core plans with (how long the longest runs alone, the memory reads no schedule
avoids) and what the simulator's lower bound adds up. Below the policy, so `scheduler/`
never reaches into the simulator; the bound's LP terms stay in `heddle/sim/bound.py`."""

from __future__ import annotations

from collections.abc import Sequence

from engines.costmodel import CostModel, IterationTerms
from heddle.hardware import ClusterShape
from heddle.types import TrajectorySpec


def allowed_costs(cluster: ClusterShape) -> list[CostModel]:
    """The instance shapes a schedule may use: the allowed degrees the model fits on."""
    costs = [
        CostModel.of(cluster, tp)
        for tp in cluster.tp_choices
        if tp <= cluster.num_gpus
        and CostModel.for_names(cluster.model, cluster.gpu, tp).kv_capacity_tokens > 0
    ]
    if not costs:
        raise ValueError(
            f"{cluster.model} fits on no allowed TP degree of {cluster.num_gpus} {cluster.gpu} GPUs"
        )
    return costs


def trajectory_alone_s(spec: TrajectorySpec, cost: CostModel) -> float:
    """A lower bound on one trajectory's time with an instance to itself: per turn, the
    iteration that makes its first token, its other tokens decoded at batch 1 (the
    iteration time is convex in the context, so they take at least as long as at their
    mean context), then its tool."""
    total = 0.0
    context = spec.prompt_tokens
    previous_output = 0  # the tokens the last tool returned
    for step in spec.steps:
        n = step.output_tokens
        if n > 0:
            total += _first_token_s(cost, previous_output, context)
        if n > 1:
            total += (n - 1) * cost.decode_token_s(1, context + (n - 2) / 2)  # type: ignore[arg-type]
        context += n + step.tool_output_tokens
        total += step.tool_latency_s
        previous_output = step.tool_output_tokens
    return total


def _first_token_s(cost: CostModel, new_tokens: int, context: int) -> float:
    """At least: an iteration that prefills the turn's new tokens (at least one; the
    first turn's prompt may be cached by a sibling, so none of it is counted) over the
    most of the context that can be cached. Less cached means more to compute but less
    KV to read, so the memory side is counted at the weights alone."""
    t = cost.terms
    n = max(new_tokens, 1)
    attended = context - n + n / 2
    compute = n * t.compute_per_token_s + n * attended * t.compute_per_attended_s
    return (
        max(t.mem_base_s, compute) + t.allreduce_base_s + n * t.allreduce_per_token_s + t.overhead_s
    )


def apart_floor_s(specs: Sequence[TrajectorySpec], cost: CostModel, instances: int) -> float:
    """Not a bound on every schedule: the floor of those that run the batch on
    `instances` instances shaped as `cost` and never put two of its `instances` longest
    trajectories on one instance at once (as a balanced placement does when nothing
    tells them from the rest; `benchmarks/apart_floor.py`). An iteration costs at least
    the weights, the all-reduce latency and the overhead, plus each decode token's KV
    reads (the first token of a turn excepted: it may be recomputed instead) and every
    token's all-reduce share. An instance runs at least as many iterations as a
    trajectory it runs has tokens there, so the instances run at least the longest's
    tokens in iterations between them, and every token's share is paid somewhere."""
    t = cost.terms
    fixed = t.mem_base_s + t.allreduce_base_s + t.overhead_s
    longest = sorted((s.generated_tokens for s in specs), reverse=True)[:instances]
    shares = sum(
        attended_tokens(s) * t.mem_per_kv_token_s + s.generated_tokens * t.allreduce_per_token_s
        for s in specs
    )
    return (fixed * sum(longest) + shares) / instances


def longest_alone_s(specs: Sequence[TrajectorySpec], costs: Sequence[CostModel]) -> float:
    """(a): the longest trajectory alone at the degree that runs it fastest."""
    return max(min(trajectory_alone_s(s, c) for c in costs) for s in specs)


def memory_reads_s(
    specs: Sequence[TrajectorySpec],
    costs: Sequence[CostModel],
    *,
    num_gpus: int,
    max_num_seqs: int,
) -> float:
    """(c): the memory reads no schedule avoids, spread over every GPU: each decode token
    reads its whole context's KV, and each iteration the weights. An iteration takes at
    least its memory time on any TP degree (a TP-t instance has t times the bandwidth and
    t GPUs), so this holds for every split. The iterations are at least the tokens over
    `max_num_seqs`, and, since an iteration reads at most its instance's KV cache, at
    least the KV read over the cache: on TP t each costs at least the weights and t
    times its all-reduce latency and overhead in GPU time per `kv_capacity_tokens` of
    KV read, and the cheapest degree per KV token bounds any mix of them."""
    one_gpu = one_gpu_terms(costs)
    tokens = sum(s.generated_tokens for s in specs)
    attended = sum(attended_tokens(s) for s in specs)
    per_iteration = min(
        c.tp
        * (c.terms.mem_base_s + c.terms.allreduce_base_s + c.terms.overhead_s)
        / c.kv_capacity_tokens
        for c in costs
    )
    iterations_s = max(tokens / max_num_seqs * one_gpu.mem_base_s, attended * per_iteration)
    return (iterations_s + attended * one_gpu.mem_per_kv_token_s) / num_gpus


def attended_tokens(spec: TrajectorySpec) -> int:
    """KV tokens the trajectory's decode iterations read in all. A turn's first token
    comes out of its prefill; its j-th (j >= 1) is decoded over the turn's starting
    context c plus the j - 1 tokens before it, as the engine core counts them."""
    return attended(decode_runs(spec))


def attended(runs: list[tuple[int, int]]) -> int:
    return sum(n * c + n * (n - 1) // 2 for c, n in runs)


def one_gpu_terms(costs: Sequence[CostModel]) -> IterationTerms:
    """The model's iteration terms on one GPU: GPU time per weight read and per KV token
    read, the same on any degree (t times the bandwidth on t GPUs)."""
    c = costs[0]
    return CostModel(c.model, c.gpu, 1, c.gpu_memory_utilization).terms


def decode_runs(spec: TrajectorySpec) -> list[tuple[int, int]]:
    """(context of the first decode, decodes) per turn: the turn's tokens after its first."""
    runs = []
    context = spec.prompt_tokens
    for step in spec.steps:
        if step.output_tokens > 1:
            runs.append((context, step.output_tokens - 1))
        context += step.output_tokens + step.tool_output_tokens
    return runs
