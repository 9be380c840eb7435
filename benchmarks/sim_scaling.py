"""How the simulator's cost grows with the batch: 1,000 to 100,000 trajectories.

    python benchmarks/sim_scaling.py [--sizes 1000,6400,25600,100000] [--policy verl]

The cluster grows with the batch at the paper's ratio (100 trajectories per GPU: 64 GPUs
for 6,400, 1,024 for 100,000), one core. Prints seconds of wall time, steps simulated per
second and the ratio to the smallest size; the target is 6,400 trajectories on 64 GPUs
in under a minute. (Holding 64 GPUs fixed while the batch grows overloads every KV
cache: 25,600 trajectories on 64 GPUs took 447 s, nearly all of it preemption churn.)
"""

from __future__ import annotations

import argparse
import time

from heddle.hardware import ClusterShape
from heddle.sim import simulate
from heddle.workloads import generate
from scheduler.registry import create_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,6400,25600,100000")
    parser.add_argument("--policy", default="verl")
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--model", default="qwen3-8b")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    header = ("trajectories", "GPUs", "steps", "sim s", "x smallest", "steps/s")
    print("{:>12} {:>6} {:>8} {:>8} {:>10} {:>9}".format(*header))
    first = None
    for n in sizes:
        gpus = max(8, n // 100)
        trace = [r.spec for r in generate(args.workload, prompts=max(1, n // 16), seed=0)]
        steps = sum(len(s.steps) for s in trace)
        started = time.perf_counter()
        simulate(
            trace,
            create_policy(args.policy),
            ClusterShape(model=args.model, gpu="h100", num_gpus=gpus),
        )
        wall = time.perf_counter() - started
        first = first or wall
        print(
            f"{len(trace):>12,} {gpus:>6} {steps:>8,} {wall:>8.1f} {wall / first:>10.1f} "
            f"{steps / wall:>9,.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
