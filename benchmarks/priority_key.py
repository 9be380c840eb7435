"""What keys the engines' queues: heddle (and heddle-oracle) with the predicted total, as
it runs, against the predicted remaining, on the robustness benchmark's draws.

    python benchmarks/priority_key.py [--first 1000] [--draws 10] [--prompts 400] [--jobs 2]
    python benchmarks/priority_key.py --paper [--seeds 1]

The first form runs the robustness draws (history from other prompts); `--paper` the
paper setting's nine cells (64 H100; 8B, 14B, 32B; coding, search, math) on seeds 0..N-1.

Prints per draw each key's makespan, the remaining key's makespan over the total key's
(above 1: the total key is faster), and the tokens the engines prefilled over those the
trace holds (its prompts and tool outputs, once each): what the KV cache's evictions
cost. Keyed on what is left, every step lowers a trajectory below the next longest, and
at 6,400 trajectories the long ones' contexts together outgrow the cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from paper_setting import MODELS, WORKLOADS, paper_traces  # this folder's siblings
from robustness import Draw

from heddle.config import ClusterConfig
from heddle.families import generate_family
from heddle.sim import lower_bound, simulate
from heddle.types import TrajectorySpec
from scheduler.heddle import HeddleVariant, heddle_policy
from scheduler.interface import PolicyContext

POLICIES = {"heddle": HeddleVariant(), "heddle-oracle": HeddleVariant(oracle=True)}
KEYS = {"total": False, "remaining": True}  # the variant's `queue_by_remaining`


def run_draw(index: int, prompts: int, samples: int) -> dict[str, Any]:
    draw = Draw.of(index)
    trace, history = (
        [r.spec for r in generate_family("random", prompts=prompts, samples=samples,
                                         seed=draw.family_seed, iteration=it)]
        for it in (1, 0)
    )  # fmt: skip
    return run_cell(str(index), trace, history, draw.model, draw.config())


def run_paper(model: str, workload: str, seed: int, prompts: int, samples: int) -> dict[str, Any]:
    trace, history = paper_traces(workload, seed, prompts, samples)
    cluster = ClusterConfig(model=model, gpu="h100", num_gpus=64, default_tp=MODELS[model])
    return run_cell(f"{workload} seed {seed}", trace, history, model, cluster)


def run_cell(
    label: str, trace: list[TrajectorySpec], history: list[TrajectorySpec], model: str,
    cluster: ClusterConfig,
) -> dict[str, Any]:  # fmt: skip
    started = time.perf_counter()
    shape = cluster.shape()
    ctx = PolicyContext(shape, tuple(history), tuple(trace), 0)
    new_tokens = sum(s.prompt_tokens + sum(st.tool_output_tokens for st in s.steps)
                     for s in trace)  # fmt: skip
    runs = {}
    for name, variant in POLICIES.items():
        for key, by_remaining in KEYS.items():
            keyed = replace(variant, queue_by_remaining=by_remaining)
            result = simulate(trace, heddle_policy(ctx, name, keyed), shape)
            runs[f"{name}/{key}"] = {
                "makespan_s": result.makespan_s,
                "prefill_ratio": result.prefill_tokens / new_tokens,
            }
    return {
        "draw": label,
        "model": model,
        "cluster": f"{cluster.num_gpus}x{cluster.gpu}",
        "trajectories": len(trace),
        "lower_bound_s": lower_bound(trace, shape)["lower_bound_s"],
        "runs": runs,
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--paper", action="store_true", help="the paper setting's cells")
    parser.add_argument("--seeds", type=int, default=1, help="--paper: seeds 0..N-1")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"command: python {' '.join(sys.argv)}")
    print("| trace | model | cluster | trajectories | policy | total key (s) | remaining key (s) "
          "| remaining / total | prefill / trace: total | remaining |")  # fmt: skip
    print("|---:|---|---|---:|---|---:|---:|---:|---:|---:|")
    ratios: dict[str, list[float]] = {name: [] for name in POLICIES}
    with ProcessPoolExecutor(args.jobs) as pool:
        if args.paper:
            cells = [(m, w, seed) for seed in range(args.seeds) for m in MODELS for w in WORKLOADS]
            futures = [pool.submit(run_paper, *c, args.prompts, args.samples) for c in cells]
        else:
            futures = [pool.submit(run_draw, i, args.prompts, args.samples)
                       for i in range(args.first, args.first + args.draws)]  # fmt: skip
        for future in futures:
            cell = future.result()
            for name in POLICIES:
                total, remaining = (cell["runs"][f"{name}/{k}"] for k in KEYS)
                ratio = remaining["makespan_s"] / total["makespan_s"]
                ratios[name].append(ratio)
                print(f"| {cell['draw']} | {cell['model']} | {cell['cluster']} "
                      f"| {cell['trajectories']} | {name} | {total['makespan_s']:.0f} "
                      f"| {remaining['makespan_s']:.0f} | {ratio:.3f} "
                      f"| {total['prefill_ratio']:.2f} | {remaining['prefill_ratio']:.2f} |",
                      flush=True)  # fmt: skip
    for name, values in ratios.items():
        print(f"{name}: remaining / total min {min(values):.3f}, median "
              f"{statistics.median(values):.3f}, max {max(values):.3f}")  # fmt: skip
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
