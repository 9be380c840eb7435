"""Libra's lever in a synchronous campaign: the engines idle in the rollout's tail train
on the trajectories already finished, so less of the train step is left at its end."""

from __future__ import annotations

import dataclasses
import math

import pytest

from engines.costmodel import TRAIN_MFU, train_join_s, train_step_s, train_tokens_per_gpu_s
from heddle.hardware import GPUS, MODELS, ClusterShape
from heddle.sim import simulate
from heddle.sim.campaign import AsyncCampaignResult, simulate_async_campaign
from heddle.sim.metrics import SimResult
from heddle.sim.reallocation import tail_training
from heddle.sim.simulator import Simulator
from heddle.staleness import StalenessBound
from heddle.types import StepSpec, TrajectorySpec
from heddle.workloads import generate
from scheduler.interface import PolicyContext
from scheduler.reallocation import Block, blocks_for_trainer, blocks_to_keep
from scheduler.registry import create_policy

MODEL, GPU = MODELS["qwen3-8b"], GPUS["h100"]


def _spec(tid: str, output: int) -> TrajectorySpec:
    return TrajectorySpec(tid, tid, 100, [StepSpec(output_tokens=output)])


def _result(a_until: float, b_until: float, retired_b: bool = False) -> SimResult:
    return SimResult(
        policy="p", makespan_s=b_until, generated_tokens=0, trajectories=2, completion_s={},
        migrations=0, migration_s=0.0, reconfigurations=0, reconfiguration_s=0.0,
        gpu_busy_frac=0.0, tail_queueing_s=0.0,
        instances=[{"instance_id": "a", "tp": 1, "retired": False},
                   {"instance_id": "b", "tp": 1, "retired": retired_b}],
        completion_times=[a_until, b_until],
        busy_intervals=[("a", 0.0, a_until), ("b", 0.0, b_until)],
    )  # fmt: skip


def test_an_engine_idle_for_the_tail_trains_what_finished_before() -> None:
    trace = [_spec("t1", 400), _spec("t2", 500)]
    per_gpu = GPU.bf16_flops * TRAIN_MFU / (6 * MODEL.num_params)
    join = train_join_s(MODEL, 2)
    end = 10.0 + join + 30.0  # a trains for 30 s before the rollout ends
    tail = tail_training(_result(10.0, end), trace, MODEL, GPU, 2)
    trained = min(500, per_gpu * 30.0)  # t1's 500 tokens (prompt and output) at most
    assert tail.gpus_moved == 1
    assert tail.tokens_before_end == round(trained)
    assert tail.train_after_rollout_s == pytest.approx((1100 - trained) / (2 * per_gpu))
    # Nothing moves when the tail is shorter than joining the trainer takes, or when the
    # idle instance's GPUs went to a wider one.
    fixed = train_step_s(MODEL, GPU, 2, 1100)
    short = tail_training(_result(10.0, 10.0 + join / 2), trace, MODEL, GPU, 2)
    assert short.train_after_rollout_s == pytest.approx(fixed)
    assert short.gpus_moved == 0
    retired = tail_training(_result(end, 10.0, retired_b=True), trace, MODEL, GPU, 2)
    assert retired.gpus_moved == 0


def test_a_simulated_rollout_leaves_less_training_for_after() -> None:
    shape = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=8)
    trace = [r.spec for r in generate("coding", prompts=12, samples=4, seed=2)]
    result = simulate(trace, create_policy("verl", PolicyContext(shape)), shape)
    tail = tail_training(result, trace, MODEL, GPU, shape.num_gpus)
    fixed = train_step_s(MODEL, GPU, 8, sum(s.sequence_tokens for s in trace))
    assert 0 < tail.gpus_moved <= 8
    assert tail.tokens_before_end > 0
    assert tail.train_after_rollout_s < fixed
    # verl keeps each trajectory where it started: an engine empty in the tail stays so,
    # and moving it as it empties (an online rule) is the move measured here.
    assert tail.refilled == 0
    emptied = [i for i in result.instances if float(i["emptied_at"]) >= 0]  # type: ignore[arg-type]
    assert emptied


# ---- Libra's lever inside an asynchronous campaign (`scheduler.reallocation`) ----------
def _blocks(*loads: int, tp: int = 1) -> list[Block]:
    return [Block(f"e{k}", tp, load, training=False) for k, load in enumerate(loads)]


def test_an_idle_block_trains_only_if_it_joins_before_the_step_ends() -> None:
    blocks = _blocks(3, 0, 0)
    kw = {"trainer_gpus": 2, "min_gpus": 2, "join_s": 20.0}
    assert blocks_for_trainer(blocks, train_left_s=60.0, **kw) == ["e1", "e2"]
    assert blocks_for_trainer(blocks, train_left_s=15.0, **kw) == []
    lent = [blocks[0], dataclasses.replace(blocks[1], training=True), blocks[2]]
    assert blocks_for_trainer(lent, train_left_s=60.0, **kw) == ["e2"]


def test_the_floor_takes_the_least_loaded_blocks_and_the_rollout_keeps_one() -> None:
    blocks = _blocks(5, 1, 2, 9)
    floor = {"trainer_gpus": 0, "train_left_s": math.inf, "join_s": 20.0}
    assert blocks_for_trainer(blocks, min_gpus=2, **floor) == ["e1", "e2"]
    # Asked for every GPU, the rollout still keeps one block, idle or not.
    assert blocks_for_trainer(blocks, min_gpus=8, **floor) == ["e1", "e2", "e0"]
    assert blocks_for_trainer(_blocks(0, 0), min_gpus=0, **floor) == ["e0"]


def test_the_trainer_keeps_its_floor_where_moving_it_would_not_pay() -> None:
    lent = [Block(f"e{k}", tp, 0, training=True, restart_s=20.0) for k, tp in enumerate((2, 1, 1))]
    kw = {"min_gpus": 2, "join_s": 20.0}
    # A long wait and a long step: everything goes back to the rollout.
    assert blocks_to_keep(lent, last_wait_s=60.0, last_step_s=300.0, **kw) == []
    # A short wait, or a short step: the floor stays, narrowest first.
    assert blocks_to_keep(lent, last_wait_s=30.0, last_step_s=300.0, **kw) == ["e1", "e2"]
    assert blocks_to_keep(lent, last_wait_s=60.0, last_step_s=10.0, **kw) == ["e1", "e2"]


def test_a_lent_instance_takes_no_step_until_it_is_given_back() -> None:
    """An instance lent mid-run sees no new step; its running one moves off it with its
    KV, and once given back it serves again (to a policy that is not sticky: verl's
    trajectories stay where they moved)."""
    shape = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=2)
    trace = [r.spec for r in generate("coding", prompts=4, samples=4, seed=1)]
    policy = create_policy("least_loaded", PolicyContext(shape))
    sim = Simulator(trace=trace, policy=policy, cluster=shape, record_steps=True)
    lent_at, back_at = 5.0, 40.0
    sim.call_at(lent_at, lambda: sim.lend("i0"))
    sim.call_at(back_at, lambda: sim.give_back("i0", back_at + 10.0))
    result = sim.run()
    assert result.trajectories == len(trace)
    assert sim.step_log is not None
    on_lent = [(start, end) for _, _, _, _, start, end, iid in sim.step_log if iid == "i0"]
    assert all(end <= lent_at or start >= back_at + 10.0 for start, end in on_lent)
    assert any(start >= back_at + 10.0 for start, _ in on_lent)  # it served again
    assert result.migrations > 0  # what ran on it at 5 s moved with its KV
    sim.instances["i0"].serving = "train"
    with pytest.raises(ValueError, match="last decode instance"):
        sim.lend("i1")


@pytest.mark.parametrize("policy", ["verl", "heddle"])
def test_an_async_campaign_borrows_engines_for_its_train_steps(policy: str) -> None:
    """With Libra's lever every GPU runs an engine between steps, and each step borrows
    at least the fixed split's trainer GPUs and the engines left idle; it trains at the
    rate of those that have joined, the bound still holds, and at 512 trajectories a
    batch (train steps of minutes, joins of 20 s) the campaign is faster than on the
    fixed split."""
    cluster = ClusterShape(model="qwen3-8b", gpu="h100", num_gpus=8)
    batches = [
        [r.spec for r in generate("coding", prompts=32, samples=16, seed=3, iteration=i)]
        for i in range(1, 7)
    ]
    history = tuple(r.spec for r in generate("coding", prompts=32, samples=16, seed=3))
    bound = StalenessBound(1, 512, 512, "partial")

    def run(shape: ClusterShape, libra: bool) -> AsyncCampaignResult:
        return simulate_async_campaign(
            batches, create_policy(policy, PolicyContext(shape, history)), shape,
            trainer_gpus=2, bound=bound, iterations=3, reallocate=libra,
        )  # fmt: skip

    fixed = run(dataclasses.replace(cluster, num_gpus=6), False)
    libra = run(cluster, True)
    assert all(s.borrowed_gpus == 0 for s in fixed.steps)
    per_gpu = train_tokens_per_gpu_s(MODEL, GPU)
    specs = {s.trajectory_id: s for b in batches for s in b}
    for step in libra.steps:
        assert 2 <= step.borrowed_gpus < 8  # the floor, and the rollout keeps an engine
        assert step.max_staleness <= 1
        tokens = sum(specs[t].sequence_tokens for t in step.trajectory_ids)
        took = step.committed_s - step.started_s  # joins, the step, then the sync
        # No faster than on every borrowed GPU throughout, no slower than on the floor
        # after a join (and the sync).
        assert tokens / (step.borrowed_gpus * per_gpu) < took
        assert took < train_join_s(MODEL, 2) + tokens / (2 * per_gpu) + 10.0
    assert libra.total_s < fixed.total_s


def test_a_step_in_slices_trains_on_the_gpus_joined_and_waits_for_those_joining() -> None:
    """The modelled trainer's slices (`activities.train.advance`): the joined GPUs train
    while lent ones join, a slice ends at its limit or when they have joined, and the
    slices add up to the step the fluid model gives in one piece."""
    from activities.train import advance
    from heddle.campaign import TrainProgress

    rate, join = 10.0, 5.0  # tokens per GPU-second; a join's seconds
    whole, s = advance(TrainProgress(gpus=4), 0.0, 1000, rate, join)
    assert (whole.tokens_done, s) == (1000, 25.0)
    # Lent at the start: nothing trains until they have joined, then the slice ends.
    p, s = advance(TrainProgress(joining_gpus=2), 0.0, 1000, rate, join)
    assert (p.gpus, p.joining_gpus, p.tokens_done, s) == (2, 0, 0.0, 5.0)
    p, s = advance(p, 0.0, 1000, rate, join)
    assert (p.tokens_done, s, p.elapsed_s) == (1000, 50.0, 55.0)
    # Two train while two more join; a limit cuts the slice mid-join.
    p, s = advance(TrainProgress(gpus=2, joining_gpus=2), 3.0, 1000, rate, join)
    assert (p.gpus, p.joining_gpus, p.join_left_s, p.tokens_done, s) == (2, 2, 2.0, 60.0, 3.0)
    p, s = advance(p, 3.0, 1000, rate, join)
    assert (p.gpus, p.joining_gpus, p.tokens_done, s) == (4, 0, 100.0, 2.0)
    p, s = advance(p, 10.0, 1000, rate, join)
    assert (p.tokens_done, s) == (500.0, 10.0)
    p, s = advance(p, 10.0, 1000, rate, join)
    assert (p.tokens_done, s) == (900.0, 10.0)
    p, s = advance(p, 10.0, 1000, rate, join)
    assert (p.tokens_done, s, p.elapsed_s) == (1000, 2.5, 27.5)
    # In one piece: to the join, then to the end.
    p, s = advance(TrainProgress(gpus=2, joining_gpus=2), 0.0, 1000, rate, join)
    assert advance(p, 0.0, 1000, rate, join)[0].elapsed_s == 27.5
    # Libra's tail: no further than the finished trajectories' tokens; then it waits,
    # and its lent GPUs join meanwhile.
    p, s = advance(TrainProgress(gpus=2, joining_gpus=2), 10.0, 1000, rate, join, ready=60)
    assert (p.gpus, p.tokens_done, s) == (4, 60.0, 5.0)
    p, s = advance(p, 10.0, 1000, rate, join, ready=100)
    assert (p.tokens_done, s, p.elapsed_s) == (100.0, 10.0, 15.0)
    with pytest.raises(ValueError, match="needs GPUs"):
        advance(TrainProgress(), 0.0, 1000, rate, join)
