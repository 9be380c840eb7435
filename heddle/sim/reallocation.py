"""Libra's lever in a synchronous campaign: the engines the rollout's tail leaves idle
move to training, and train on the trajectories already finished while the rest roll out.

A GPU moves once its instance has run its last iteration of the batch (the schedule as it
ran, so no step loses a GPU it would have used), plus the time to join the trainer
(`engines.costmodel.train_join_s`). An online rule moves an engine when it first holds no
trajectory after every trajectory has started; that is the same moment unless a
trajectory comes to it again later, which `refilled` counts. From then on the trainer
works through the finished trajectories' tokens at its GPUs' rate, gradients
accumulating; when the rollout ends every GPU joins for what is left, and the optimizer
step and sync follow as before. The step is the same, on the same data: only when its
work is done moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engines.costmodel import train_join_s, train_tokens_per_gpu_s
from heddle.hardware import GPUSpec, ModelShape
from heddle.sim.metrics import SimResult
from heddle.types import TrajectorySpec


@dataclass(frozen=True)
class TailTraining:
    train_after_rollout_s: float  # the train step's time left when the rollout ends
    tokens_before_end: int  # tokens trained on the tail's GPUs during the rollout
    gpus_moved: int
    # Instances that held no trajectory in the tail and later got one again (a migration
    # in): a rule moving an engine as it empties would have moved these too early.
    refilled: int


def tail_training(
    result: SimResult,
    trace: Sequence[TrajectorySpec],
    model: ModelShape,
    gpu: GPUSpec,
    num_gpus: int,
) -> TailTraining:
    """What is left of the train step at the rollout's end when idle engines train."""
    if len(result.completion_times) != len(trace):
        raise ValueError("the result is not of this trace: its trajectories differ")
    end = result.makespan_s
    per_gpu = train_tokens_per_gpu_s(model, gpu)
    last_busy: dict[str, float] = {}
    for iid, _, until in result.busy_intervals:
        last_busy[iid] = max(last_busy.get(iid, 0.0), until)
    join = train_join_s(model, num_gpus)
    releases = sorted(
        (last_busy.get(str(i["instance_id"]), 0.0) + join, int(i["tp"]))  # type: ignore[call-overload]
        for i in result.instances
        if not i.get("retired")
    )
    releases = [(t, tp) for t, tp in releases if t < end]
    arrivals = sorted(zip(result.completion_times, (s.sequence_tokens for s in trace), strict=True))
    events = sorted([(t, 0, tp) for t, tp in releases] + [(t, 1, n) for t, n in arrivals])
    now, gpus, ready, trained = 0.0, 0, 0, 0.0
    for t, kind, value in events:
        t = min(t, end)
        trained = min(float(ready), trained + gpus * per_gpu * (t - now))
        now = t
        if kind == 0:
            gpus += value
        else:
            ready += value
    trained = min(float(ready), trained + gpus * per_gpu * (end - now))
    total = sum(s.sequence_tokens for s in trace)
    return TailTraining(
        train_after_rollout_s=(total - trained) / (num_gpus * per_gpu),
        tokens_before_end=round(trained),
        gpus_moved=sum(tp for _, tp in releases),
        refilled=sum(1 for i in result.instances if not i.get("retired") and i.get("refilled")),
    )
