"""What a simulated rollout reports, and the batch's lower bound (DESIGN.md, "Measures")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engines.costmodel import CostModel
from heddle.types import TrajectorySpec


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    generated_tokens: int
    trajectories: int
    completion_s: dict[str, float]
    migrations: int
    migration_s: float
    reconfigurations: int
    reconfiguration_s: float
    gpu_busy_frac: float
    # Mean queueing time (submit to first scheduled, summed over steps) of the longest 10%.
    tail_queueing_s: float
    instances: list[dict[str, object]] = field(default_factory=list)
    completion_times: list[float] = field(default_factory=list)
    # (instance_id, start, end) busy intervals, merged when contiguous.
    busy_intervals: list[tuple[str, float, float]] = field(default_factory=list)
    # (time, tokens) at each finished step: throughput over time.
    token_events: list[tuple[float, int]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def throughput_tok_s(self) -> float:
        return self.generated_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "makespan_s": self.makespan_s,
            "throughput_tok_s": self.throughput_tok_s,
            "generated_tokens": self.generated_tokens,
            "trajectories": self.trajectories,
            "completion_s": self.completion_s,
            "migrations": self.migrations,
            "migration_s": self.migration_s,
            "reconfigurations": self.reconfigurations,
            "reconfiguration_s": self.reconfiguration_s,
            "gpu_busy_frac": self.gpu_busy_frac,
            "tail_queueing_s": self.tail_queueing_s,
            "instances": self.instances,
            "sim_wall_s": self.wall_s,
        }


def trajectory_alone_s(spec: TrajectorySpec, cost: CostModel) -> float:
    """One trajectory with an instance to itself: each turn prefills what is new (its
    earlier context stays cached), decodes at batch 1, then waits for its tool."""
    total = 0.0
    context = 0
    new = spec.prompt_tokens
    for step in spec.steps:
        total += cost.prefill_s(new, cached_tokens=context)
        context += new
        per_token = cost.decode_token_s(1, context + step.output_tokens // 2)
        total += step.output_tokens * per_token
        context += step.output_tokens
        total += step.tool_latency_s
        new = step.tool_output_tokens
    return total


def lower_bound(
    specs: Sequence[TrajectorySpec],
    *,
    model: str,
    gpu: str,
    num_gpus: int,
    tp_choices: Sequence[int],
    max_num_seqs: int,
    gpu_memory_utilization: float = 0.9,
) -> dict[str, float]:
    """The largest of (a) the longest trajectory run alone at the best TP, (b) all
    generated tokens over the cluster's peak decode throughput (optimistic: at the
    smallest prompt as context, so the bound stays a bound), and (c) the memory reads
    no schedule avoids, spread over every GPU: each decode token reads its whole
    context's KV, and each iteration the weights. An iteration takes at least its
    memory time on any TP degree (a TP-t instance has t times the bandwidth and t
    GPUs), so (c) holds for every split. The iterations are at least the tokens over
    `max_num_seqs`, and, since an iteration reads at most its instance's KV cache, at
    least the KV read over the cache: on TP t each costs at least the weights and t
    times its all-reduce latency and overhead in GPU time per `kv_capacity_tokens` of
    KV read, and the cheapest degree per KV token bounds any mix of them."""
    costs = [
        CostModel.for_names(model, gpu, tp, gpu_memory_utilization)
        for tp in tp_choices
        if tp <= num_gpus and CostModel.for_names(model, gpu, tp).kv_capacity_tokens > 0
    ]
    if not costs:
        raise ValueError(f"{model} fits on no allowed TP degree of {num_gpus} {gpu} GPUs")
    longest = max(min(trajectory_alone_s(s, c) for c in costs) for s in specs)
    tokens = sum(s.generated_tokens for s in specs)
    context = min(s.prompt_tokens for s in specs)
    peak = max(
        (num_gpus // c.tp) * max_num_seqs / c.decode_token_s(max_num_seqs, context) for c in costs
    )
    work = tokens / peak
    # GPU-seconds per weight read and per KV token read, at one GPU's bandwidth.
    terms = CostModel.for_names(model, gpu, 1, gpu_memory_utilization).terms
    attended = sum(_attended_tokens(s) for s in specs)
    per_iteration = min(
        c.tp
        * (c.terms.mem_base_s + c.terms.allreduce_base_s + c.terms.overhead_s)
        / c.kv_capacity_tokens
        for c in costs
    )
    iterations_s = max(tokens / max_num_seqs * terms.mem_base_s, attended * per_iteration)
    reads = (iterations_s + attended * terms.mem_per_kv_token_s) / num_gpus
    return {
        "lower_bound_s": max(longest, work, reads),
        "longest_alone_s": longest,
        "work_s": work,
        "memory_reads_s": reads,
    }


def _attended_tokens(spec: TrajectorySpec) -> int:
    """KV tokens the trajectory's decode tokens read in all: the j-th token of a turn
    that starts at context c reads c + j."""
    total = 0
    context = spec.prompt_tokens
    for step in spec.steps:
        n = step.output_tokens
        total += n * context + n * (n - 1) // 2
        context += n + step.tool_output_tokens
    return total
