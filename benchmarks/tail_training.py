"""Libra's lever on the robustness benchmark's random draws: one iteration of a
synchronous campaign (the rollout, then the train step on the same GPUs) against the
same with the tail's idle engines training on the finished trajectories
(`heddle.sim.reallocation`).

    python benchmarks/tail_training.py [--first 1000] [--draws 10] [--prompts 50]
                                       [--policies verl,heddle]

Prints per draw and policy the iteration time both ways, their ratio (above 1: the lever
pays) and the instances that emptied in the tail and got a step again (for which the
lever assumes an exact guess of the idle engines), then each policy's spread.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from robustness import Draw  # this folder's sibling

from engines.costmodel import train_step_s
from heddle.families import generate_family
from heddle.hardware import GPUS, MODELS
from heddle.sim import simulate
from heddle.sim.reallocation import tail_training
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy, learns_from_history


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--policies", default="verl,heddle")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    ratios: dict[str, list[float]] = {p: [] for p in policies}
    print("| draw | model | cluster | policy | iteration, fixed (s) | with the tail training (s) "
          "| fixed / with | instances refilled |")  # fmt: skip
    print("|---:|---|---|---|---:|---:|---:|---:|")
    for index in range(args.first, args.first + args.draws):
        draw = Draw.of(index)
        trace, history = (
            [r.spec for r in generate_family("random", prompts=args.prompts,
                                             samples=args.samples, seed=draw.family_seed,
                                             iteration=it)]
            for it in (1, 0)
        )  # fmt: skip
        shape = draw.config().shape()
        model, gpu = MODELS[shape.model], GPUS[shape.gpu]
        train = train_step_s(model, gpu, shape.num_gpus, sum(s.sequence_tokens for s in trace))
        for name in policies:
            ctx = PolicyContext(shape, tuple(history) if learns_from_history(name) else (),
                                tuple(trace), 0)  # fmt: skip
            result = simulate(trace, create_policy(name, ctx), shape)
            tail = tail_training(result, trace, model, gpu, shape.num_gpus)
            fixed = result.makespan_s + train
            lever = result.makespan_s + tail.train_after_rollout_s
            ratios[name].append(fixed / lever)
            print(
                f"| {index} | {shape.model} | {shape.num_gpus}x{shape.gpu} | {name} | "
                f"{fixed:.0f} | {lever:.0f} | {fixed / lever:.3f} | {tail.refilled} |",
                flush=True,
            )
    for name, rs in ratios.items():
        print(f"{name}: fixed / with min {min(rs):.3f}, median {statistics.median(rs):.3f}, "
              f"max {max(rs):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
