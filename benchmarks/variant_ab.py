"""One of Heddle's parts on and off, side by side: each Heddle policy with a
`HeddleVariant` flag as registered and flipped, on the robustness benchmark's draws or
on the paper setting.

    python benchmarks/variant_ab.py --flag reserve_kv [--first 1000] [--draws 10]
                                    [--prompts 400] [--jobs 2]
                                    [--policies heddle,heddle-oracle,heddle-cold]
    python benchmarks/variant_ab.py --flag reserve_kv --paper [--seeds 1]

The first form runs the robustness draws (history from other prompts; `heddle-cold` has
none); `--paper` the paper setting's nine cells (64 H100; 8B, 14B, 32B; coding, search,
math) on seeds 0..N-1. Per cell and policy it prints both makespans, the flipped one over
the registered one (above 1: the registered setting is faster), and the tokens the
engines prefilled over those the trace holds (its prompts and tool outputs, once each):
what the KV cache's evictions cost.

`--flag queue_by_remaining` is the queue key's measure (docs/benchmarks.md); `--flag
reserve_kv` the engines' KV reservations; `--flag kv_overcommit` an engine setting, not
the policy's: the simulated engines admitting past the reservations (the cluster file's
`kv_overcommit_per_s`, 0 or 0.0002); `--flag release_evicted` another (the cluster file's
`kv_release_evicted`).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from paper_setting import MODELS, WORKLOADS, paper_traces  # this folder's siblings
from robustness import Draw

from heddle.config import ClusterConfig
from heddle.families import generate_family
from heddle.sim import lower_bound, simulate
from heddle.types import TrajectorySpec
from scheduler.baselines import heddle_variant
from scheduler.heddle import HeddleVariant, heddle_policy
from scheduler.interface import PolicyContext
from scheduler.registry import learns_from_history

# The engines' settings flipped the same way: the cluster file's field and its value when
# on (off is 0).
ENGINE_FLAGS: dict[str, tuple[str, float | bool]] = {
    "kv_overcommit": ("kv_overcommit_per_s", 0.0002),
    "release_evicted": ("kv_release_evicted", True),
}
FLAGS = [f.name for f in dataclasses.fields(HeddleVariant) if f.type in (bool, "bool")]
FLAGS += list(ENGINE_FLAGS)


def run_draw(
    index: int, prompts: int, samples: int, flag: str, policies: list[str]
) -> dict[str, Any]:
    draw = Draw.of(index)
    trace, history = (
        [r.spec for r in generate_family("random", prompts=prompts, samples=samples,
                                         seed=draw.family_seed, iteration=it)]
        for it in (1, 0)
    )  # fmt: skip
    return run_cell(str(index), trace, history, draw.model, draw.config(), flag, policies)


def run_paper(
    model: str, workload: str, seed: int, prompts: int, samples: int, flag: str,
    policies: list[str],
) -> dict[str, Any]:  # fmt: skip
    trace, history = paper_traces(workload, seed, prompts, samples)
    cluster = ClusterConfig(model=model, gpu="h100", num_gpus=64, default_tp=MODELS[model])
    return run_cell(f"{workload} seed {seed}", trace, history, model, cluster, flag, policies)


def run_cell(
    label: str, trace: list[TrajectorySpec], history: list[TrajectorySpec], model: str,
    cluster: ClusterConfig, flag: str, policies: list[str],
) -> dict[str, Any]:  # fmt: skip
    started = time.perf_counter()
    shape = cluster.shape()
    flipped_shape = shape
    if flag in ENGINE_FLAGS:
        field, on = ENGINE_FLAGS[flag]
        off = type(on)()  # 0.0 or False
        flipped_shape = dataclasses.replace(shape, **{field: off if getattr(shape, field) else on})
    new_tokens = sum(s.prompt_tokens + sum(st.tool_output_tokens for st in s.steps)
                     for s in trace)  # fmt: skip
    runs = {}
    for name in policies:
        ctx = PolicyContext(shape, tuple(history) if learns_from_history(name) else (),
                            tuple(trace), 0)  # fmt: skip
        registered = heddle_variant(name)
        for setting in ("registered", "flipped"):
            variant, engines = registered, shape
            if setting == "flipped" and flag in ENGINE_FLAGS:
                engines = flipped_shape
            elif setting == "flipped":
                variant = dataclasses.replace(registered, **{flag: not getattr(registered, flag)})
            result = simulate(trace, heddle_policy(ctx, name, variant), engines)
            runs[f"{name}/{setting}"] = {
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
    parser.add_argument("--flag", required=True, choices=FLAGS)
    parser.add_argument("--policies", default="heddle,heddle-oracle",
                        help="comma-separated Heddle policies")  # fmt: skip
    parser.add_argument("--first", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--paper", action="store_true", help="the paper setting's cells")
    parser.add_argument("--seeds", type=int, default=1, help="--paper: seeds 0..N-1")
    args = parser.parse_args()
    policies = args.policies.split(",")
    for name in policies:
        heddle_variant(name)  # an unknown name fails before any run
    started = time.perf_counter()
    print(f"command: python {' '.join(sys.argv)}")
    print(f"| trace | model | cluster | trajectories | policy | registered (s) "
          f"| {args.flag} flipped (s) | flipped / registered | prefill / trace: registered "
          "| flipped |")  # fmt: skip
    print("|---:|---|---|---:|---|---:|---:|---:|---:|---:|")
    ratios: dict[str, list[float]] = {name: [] for name in policies}
    with ProcessPoolExecutor(args.jobs) as pool:
        if args.paper:
            cells = [(m, w, seed) for seed in range(args.seeds) for m in MODELS for w in WORKLOADS]
            futures = [pool.submit(run_paper, *c, args.prompts, args.samples, args.flag,
                                   policies) for c in cells]  # fmt: skip
        else:
            futures = [pool.submit(run_draw, i, args.prompts, args.samples, args.flag, policies)
                       for i in range(args.first, args.first + args.draws)]  # fmt: skip
        for future in futures:
            cell = future.result()
            for name in policies:
                registered, flipped = (cell["runs"][f"{name}/{k}"]
                                       for k in ("registered", "flipped"))  # fmt: skip
                ratio = flipped["makespan_s"] / registered["makespan_s"]
                ratios[name].append(ratio)
                print(f"| {cell['draw']} | {cell['model']} | {cell['cluster']} "
                      f"| {cell['trajectories']} | {name} | {registered['makespan_s']:.0f} "
                      f"| {flipped['makespan_s']:.0f} | {ratio:.3f} "
                      f"| {registered['prefill_ratio']:.2f} | {flipped['prefill_ratio']:.2f} |",
                      flush=True)  # fmt: skip
    for name, values in ratios.items():
        print(f"{name}: flipped / registered min {min(values):.3f}, median "
              f"{statistics.median(values):.3f}, max {max(values):.3f}")  # fmt: skip
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
