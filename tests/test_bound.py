"""The lower bound (heddle/sim/bound.py): above each simple count where its own term
binds, and below what every policy runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engines.costmodel import CostModel
from engines.trajectory_costs import allowed_costs, apart_floor_s, attended_tokens
from heddle.hardware import ClusterShape
from heddle.sim import lower_bound, simulate
from heddle.sim.bound import streams_lp_s, streams_s
from heddle.types import StepSpec, TrajectorySpec
from heddle.workloads import generate
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy, policy_names


def _long_decodes(model: str) -> tuple[list[TrajectorySpec], ClusterShape]:
    specs = [TrajectorySpec(f"t{i}", f"g{i % 8}", 2_000, (StepSpec(20_000),)) for i in range(64)]
    return specs, ClusterShape(model=model, gpu="h100", num_gpus=8)


def test_the_bound_counts_the_iterations_a_full_kv_cache_forces() -> None:
    """With long contexts an iteration carries as many sequences as the cache holds, not
    `max_num_seqs`: the bound charges the weights and fixed costs per cache-full of KV
    read, rises above the seats-only count, and stays below what every policy runs."""
    specs, cluster = _long_decodes("qwen3-32b")
    bound = lower_bound(specs, replace(cluster, tp_choices=(2, 4, 8), max_num_seqs=256))
    one_gpu = CostModel.for_names("qwen3-32b", "h100", 1).terms
    attended = sum(attended_tokens(s) for s in specs)
    tokens = sum(s.generated_tokens for s in specs)
    seats_only = (tokens / 256 * one_gpu.mem_base_s + attended * one_gpu.mem_per_kv_token_s) / 8
    assert bound["memory_reads_s"] > 1.1 * seats_only
    for name in ("verl", "autellix"):
        context = PolicyContext(ClusterShape(model="qwen3-32b", num_gpus=8, default_tp=8))
        result = simulate(specs, create_policy(name, context), cluster)
        assert result.makespan_s >= bound["lower_bound_s"]


def test_attended_tokens_are_the_decodes_kv_reads() -> None:
    """A turn's first token comes out of its prefill; the rest decode over the turn's
    context so far: prompt 10, turns of 3 and 2 tokens after a 5-token tool output."""
    spec = TrajectorySpec("t", "g", 10, (StepSpec(3, tool="x", tool_output_tokens=5), StepSpec(2)))
    # Turn 1 decodes tokens 2 and 3 over 10 and 11; turn 2 starts at 10 + 3 + 5 = 18.
    assert attended_tokens(spec) == 10 + 11 + 18


@pytest.mark.parametrize("name", policy_names())
def test_the_streams_term_binds_on_long_decodes_and_every_policy_runs_above_it(name: str) -> None:
    """64 decodes of 20,000 tokens on 8 GPUs of Qwen3-14B: one shared stream makes each
    token slow (64 contexts to read), separate streams each pay the weights again. The
    streams term sits 25% above the memory reads and the longest alone, within 10% of
    what the policies run, and below every one of them."""
    specs, cluster = _long_decodes("qwen3-14b")
    bound = lower_bound(specs, replace(cluster, tp_choices=(1, 2, 4, 8), max_num_seqs=256))
    others = max(bound["longest_alone_s"], bound["work_s"], bound["memory_reads_s"])
    assert bound["streams_s"] > 1.25 * others
    context = PolicyContext(
        ClusterShape(model="qwen3-14b", num_gpus=8, default_tp=8),
        history=tuple(specs),
        truth=tuple(specs),
    )
    result = simulate(specs, create_policy(name, context), cluster)
    assert result.makespan_s >= bound["lower_bound_s"]
    if name == "verl":  # one TP-8 stream for all 64: what the bound's tightness is measured on
        assert result.makespan_s <= 1.1 * bound["lower_bound_s"]


def _small_math() -> list[TrajectorySpec]:
    return [r.spec for r in generate("math", prompts=12, samples=16, seed=3)]


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_runs_above_the_bound_on_math(name: str) -> None:
    """Math's near-cap tail is where the streams terms bind: here the LP (e) at 96 s, the
    Lagrangian (d) at 84 s, the longest alone at 79 s."""
    trace = _small_math()
    history = tuple(r.spec for r in generate("math", prompts=12, samples=16, seed=3, iteration=1))
    cluster = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=8)
    bound = lower_bound(trace, replace(cluster, tp_choices=(1, 2, 4, 8), max_num_seqs=256))
    assert bound["lower_bound_s"] == bound["streams_lp_s"] > 1.1 * bound["streams_s"]
    context = PolicyContext(ClusterShape(num_gpus=8), history=history, truth=tuple(trace))
    result = simulate(trace, create_policy(name, context), cluster)
    assert result.makespan_s >= bound["lower_bound_s"]


def test_a_partition_of_the_batch_runs_above_the_whole_batchs_bound() -> None:
    """`benchmarks/split_parts.py`'s schedules: the longest trajectories on TP-8s of their
    own and the rest on the other GPUs is one schedule of the whole batch, so its slower
    part can be no faster than the whole batch's bound, and each part no faster than
    its own."""
    trace = sorted(_small_math(), key=lambda s: -s.generated_tokens)
    whole = lower_bound(
        trace,
        ClusterShape(
            model="qwen3-8b", gpu="h100", num_gpus=16, tp_choices=(1, 2, 4, 8), max_num_seqs=256
        ),
    )
    makespans = []
    for part, gpus, degrees in ((trace[:16], 8, (8,)), (trace[16:], 8, (1, 2, 4, 8))):
        own = lower_bound(
            part,
            ClusterShape(
                model="qwen3-8b", gpu="h100", num_gpus=gpus, tp_choices=degrees, max_num_seqs=256
            ),
        )
        context = PolicyContext(
            ClusterShape(num_gpus=gpus, tp_choices=degrees, default_tp=degrees[0]),
            truth=tuple(part),
        )
        result = simulate(
            part,
            create_policy("heddle-oracle", context),
            ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=gpus),
        )
        assert result.makespan_s >= own["lower_bound_s"]
        makespans.append(result.makespan_s)
    assert max(makespans) >= whole["lower_bound_s"]


def test_a_schedule_that_keeps_the_longest_apart_runs_above_the_apart_floor() -> None:
    """`benchmarks/apart_floor.py`'s floor: the batch split over two TP-8 instances, the
    two longest on different ones (each half simulated on its own instance), finishes
    no sooner than the floor for two instances; one instance running it all, no sooner
    than the floor for one. On math the floor is well above the batch's bound."""
    trace = sorted(_small_math(), key=lambda s: -s.generated_tokens)
    cost = CostModel.for_names("qwen3-8b", "h100", 8)
    context = PolicyContext(ClusterShape(num_gpus=8, tp_choices=(8,), default_tp=8))

    def run(part: list[TrajectorySpec]) -> float:
        return simulate(
            part,
            create_policy("verl", context),
            ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=8),
        ).makespan_s

    apart = max(run(trace[0::2]), run(trace[1::2]))
    assert apart >= apart_floor_s(trace, cost, 2)
    assert run(trace) >= apart_floor_s(trace, cost, 1)
    bound = lower_bound(
        trace,
        ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=16, tp_choices=(8,), max_num_seqs=256),
    )
    assert apart_floor_s(trace, cost, 2) > 1.1 * bound["lower_bound_s"]


def test_the_streams_lp_is_at_least_the_lagrangian_on_the_same_bins() -> None:
    """(e) solves (d)'s model exactly, with integer batches, seats shared with the riders
    and the cache: on the same context bins it can only be higher, for every size of S."""
    trace = _small_math()
    costs = allowed_costs(
        ClusterShape(
            model="qwen3-8b",
            gpu="h100",
            num_gpus=8,
            tp_choices=(1, 2, 4, 8),
            gpu_memory_utilization=0.9,
        )
    )
    d = streams_s(trace, costs, num_gpus=8, max_num_seqs=256)
    sizes = [2**k for k in range(8)] + [len(trace)]
    e = streams_lp_s(trace, costs, num_gpus=8, max_num_seqs=256, members=sizes, bins=256)
    assert e >= d


# Seeds 5, 10, 12 and 48 once crashed heddle: a reshape left no instance taking steps and
# the re-plan solved the DP over none. In 46 and 55 heddle-oracle ran 0.01% under the
# longest trajectory "alone", which had counted a turn's decodes at a context rounded up
# and its prompt's prefill though a sibling may have cached it.
@pytest.mark.parametrize("seed", [5, 10, 12, 46, 48, 55])
def test_every_policy_finishes_random_batches_above_the_bound(seed: int) -> None:
    """`benchmarks/random_batches.py`'s batches: every policy finishes every token and
    runs above the bound."""
    from benchmarks.random_batches import random_batch

    batch = random_batch(seed)
    cluster = batch.cluster
    bound = lower_bound(batch.specs, cluster)
    for name in policy_names():
        result = simulate(batch.specs, create_policy(name, batch.context()), cluster)
        assert result.generated_tokens == sum(s.generated_tokens for s in batch.specs), name
        assert result.makespan_s >= bound["lower_bound_s"], name


def test_a_default_degree_the_model_does_not_fit_on_is_refused() -> None:
    specs = [TrajectorySpec("t", "g", 100, (StepSpec(100),))]
    context = PolicyContext(
        ClusterShape(model="qwen3-32b", num_gpus=8, default_tp=1), history=tuple(specs)
    )
    with pytest.raises(ValueError, match="TP-1 is not among the allowed degrees qwen3-32b"):
        simulate(
            specs,
            create_policy("heddle-fixed-tp", context),
            ClusterShape(model="qwen3-32b", gpu="h100", num_gpus=8),
        )
