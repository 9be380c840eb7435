"""What keys the engines' queues: heddle (and heddle-oracle) with the predicted total, as
it runs, against the predicted remaining, on the robustness benchmark's draws.

    python benchmarks/priority_key.py [--first 1000] [--draws 10] [--prompts 400] [--jobs 2]

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

from robustness import Draw  # this folder's sibling script: the draws

from heddle.families import generate_family
from heddle.sim import lower_bound, simulate
from scheduler.heddle import HeddleVariant, heddle_policy
from scheduler.interface import PolicyContext

POLICIES = {"heddle": HeddleVariant(), "heddle-oracle": HeddleVariant(oracle=True)}
KEYS = {"total": False, "remaining": True}  # the variant's `queue_by_remaining`


def run_draw(index: int, prompts: int, samples: int) -> dict[str, Any]:
    started = time.perf_counter()
    draw = Draw.of(index)
    trace, history = (
        [r.spec for r in generate_family("random", prompts=prompts, samples=samples,
                                         seed=draw.family_seed, iteration=it)]
        for it in (1, 0)
    )  # fmt: skip
    shape = draw.config().shape()
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
        "draw": index,
        "model": draw.model,
        "cluster": draw.cluster,
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
    args = parser.parse_args()
    started = time.perf_counter()
    indices = range(args.first, args.first + args.draws)
    print(f"command: python {' '.join(sys.argv)}")
    print("| draw | model | cluster | trajectories | policy | total key (s) | remaining key (s) "
          "| remaining / total | prefill / trace: total | remaining |")  # fmt: skip
    print("|---:|---|---|---:|---|---:|---:|---:|---:|---:|")
    ratios: dict[str, list[float]] = {name: [] for name in POLICIES}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_draw, i, args.prompts, args.samples) for i in indices]
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
