"""Libra's lever in a synchronous campaign: the engines idle in the rollout's tail train
on the trajectories already finished, so less of the train step is left at its end."""

from __future__ import annotations

import pytest

from engines.costmodel import TRAIN_MFU, train_join_s, train_step_s
from heddle.hardware import GPUS, MODELS, ClusterShape
from heddle.sim import simulate
from heddle.sim.metrics import SimResult
from heddle.sim.reallocation import tail_training
from heddle.types import StepSpec, TrajectorySpec
from heddle.workloads import generate
from scheduler.interface import PolicyContext
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
