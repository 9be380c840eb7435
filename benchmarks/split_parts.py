"""Where a batch's distance to the bound lives: its M longest trajectories alone on K
TP-8 instances, and the rest alone on the other GPUs, each part simulated and bounded
on its own.

    python benchmarks/split_parts.py [--model qwen3-14b] [--workload math] [--seed 0]
                                     [--top 64] [--top-instances 3] [--policy heddle-oracle]
                                     [--rest-degrees 4]

One trace of the paper setting (64 H100, 400 prompts x 16 samples, iteration 1; the
policy's history is iteration 0). Running the parts apart is one schedule of the whole
batch, so the slower part's makespan is what that partition achieves; each part's
lower bound (`heddle.sim.bound.lower_bound`, on its own GPUs and degrees) says whether
that part is close to what its GPUs allow. On 14B math seed 0 the long set is close
(1.10x) and the rest is not (1.33x; the partition is 1.42x the whole batch's bound):
the bulk's long trajectories drain slowly on full instances
(docs/notes/issue-4-heddle-policy.md, ninth session).
"""

from __future__ import annotations

import argparse
import time

from paper_setting import MODELS  # this folder's sibling script: the models and peers' TP

from heddle.bench import run_bench
from heddle.config import ClusterConfig
from heddle.hardware import ClusterShape
from heddle.sim.bound import lower_bound
from heddle.types import TrajectorySpec
from heddle.workloads import generate

NUM_GPUS = 64


def run_part(
    name: str, specs: list[TrajectorySpec], history: list[TrajectorySpec], model: str,
    gpus: int, degrees: tuple[int, ...], policy: str,
) -> float:  # fmt: skip
    """Simulate and bound one part; print both and return the makespan."""
    started = time.perf_counter()
    cluster = ClusterConfig(
        model=model, gpu="h100", num_gpus=gpus, default_tp=degrees[0], tp_choices=degrees
    )
    bench = run_bench(specs, cluster, [policy], history=history)
    bound, result = bench.lower_bound["lower_bound_s"], bench.results[policy]
    split = sorted((int(str(i["tp"])) for i in result.instances), reverse=True)
    print(f"  {name}: {len(specs):,} trajectories on {gpus} GPUs (split {split}): "
          f"makespan {result.makespan_s:.1f} s, bound {bound:.1f} s, "
          f"{result.makespan_s / bound:.2f}x ({time.perf_counter() - started:.0f} s)")  # fmt: skip
    return result.makespan_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-14b", choices=sorted(MODELS))
    parser.add_argument("--workload", default="math")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=int, default=64, help="trajectories in the long set")
    parser.add_argument("--top-instances", type=int, default=3, help="TP-8s for the long set")
    parser.add_argument("--policy", default="heddle-oracle")
    parser.add_argument("--rest-degrees", default="4", help="degrees the rest may use: 1,2,4")
    args = parser.parse_args()
    rest_degrees = tuple(int(d) for d in args.rest_degrees.split(","))
    top_gpus = 8 * args.top_instances
    if not 0 < top_gpus < NUM_GPUS:
        parser.error(f"--top-instances: {args.top_instances} TP-8s leave no GPU for the rest")
    trace, history = (
        [r.spec for r in generate(args.workload, prompts=400, seed=args.seed, iteration=it)]
        for it in (1, 0)
    )
    by_length = sorted(trace, key=lambda s: -s.generated_tokens)
    whole = lower_bound(
        trace,
        ClusterShape(
            model=args.model,
            gpu="h100",
            num_gpus=NUM_GPUS,
            tp_choices=(1, 2, 4, 8),
            max_num_seqs=256,
        ),
    )["lower_bound_s"]
    print(f"{args.model} {args.workload} seed {args.seed}: the whole batch's bound "
          f"{whole:.1f} s; {args.policy} on each part:")  # fmt: skip
    top = run_part("long set", by_length[: args.top], history, args.model, top_gpus, (8,),
                   args.policy)  # fmt: skip
    rest = run_part("the rest", by_length[args.top :], history, args.model,
                    NUM_GPUS - top_gpus, rest_degrees, args.policy)  # fmt: skip
    print(
        f"  the partition: {max(top, rest):.1f} s, {max(top, rest) / whole:.2f}x the "
        "whole batch's bound"
    )


if __name__ == "__main__":
    main()
