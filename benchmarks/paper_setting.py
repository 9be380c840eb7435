"""The Heddle paper's setting in the simulator: 64 H100s; Qwen3-8B, 14B and 32B; coding,
search and math; 400 prompts x 16 samples; every registered policy on the same traces,
over several seeds (one trace per seed and setting).

    python benchmarks/paper_setting.py [--seeds 3] [--jobs 2] [--prompts 400] [--model M]
                                       [--workload W] [--policy P] [--out benchmarks/results]

Prints, per (model, workload), each policy's throughput ratio to verl and makespan over
the lower bound, as the mean over seeds with the lowest and highest; writes
paper_setting.json (every seed's full result) and paper_setting.md (the summary, then
one full table per setting and seed). One trace moves a policy by up to about 10% when
only a tie order changes, so a claim is made on the seeds' mean and range. The peers run
at the paper's homogeneous TP: 1 for 8B and 14B, 2 for 32B.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from heddle.bench import run_bench
from heddle.config import ClusterConfig
from heddle.types import TrajectorySpec
from heddle.workloads import generate
from scheduler.registry import policy_names

MODELS = {"qwen3-8b": 1, "qwen3-14b": 1, "qwen3-32b": 2}
WORKLOADS = ("coding", "search", "math")
BASELINE = "verl"


def paper_traces(
    workload: str, seed: int, prompts: int = 400, samples: int = 16
) -> tuple[list[TrajectorySpec], list[TrajectorySpec]]:
    """One seed's trace (iteration 1) and the history the policies that learn get
    (iteration 0): the same prompts, a prompt keeping its length and difficulty."""
    trace, history = (
        [r.spec for r in generate(workload, prompts=prompts, samples=samples, seed=seed,
                                  iteration=it)]
        for it in (1, 0)
    )  # fmt: skip
    return trace, history


def run_cell(
    model: str, workload: str, seed: int, prompts: int, samples: int, gpus: int,
    policies: list[str], predictor_seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """One setting on one seed: iteration 1 is the trace, iteration 0 the history."""
    cluster = ClusterConfig(model=model, gpu="h100", num_gpus=gpus, default_tp=MODELS[model])
    trace, history = paper_traces(workload, seed, prompts, samples)
    started = time.perf_counter()
    bench = run_bench(trace, cluster, policies, history=history, predictor_seed=predictor_seed)
    out = bench.to_json(trace=f"{workload} seed {seed} iteration 1", cluster=cluster)
    out["sim_wall_s"] = time.perf_counter() - started
    return out


def _ratios(cell: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per policy: throughput over the baseline's, and makespan over the lower bound."""
    pols = cell["policies"]
    base = pols[BASELINE]["throughput_tok_s"]
    bound = cell["lower_bound_s"]
    return {n: (p["throughput_tok_s"] / base, p["makespan_s"] / bound) for n, p in pols.items()}


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def summary_table(cells: dict[str, dict[str, Any]], model: str, workload: str) -> list[str]:
    keyed = sorted(k for k in cells if k.startswith(f"{model}/{workload}/"))
    ratios = [_ratios(cells[k]) for k in keyed]
    lines = [
        f"### {model} (peers at TP{MODELS[model]}), {workload}: {len(keyed)} seed(s)",
        "",
        f"| policy | x {BASELINE}: mean (min-max) | /bound: mean (min-max) |",
        "|---|---:|---:|",
    ]
    for name in ratios[0]:
        lines.append(
            f"| {name} | {_spread([r[name][0] for r in ratios])} "
            f"| {_spread([r[name][1] for r in ratios])} |"
        )
    return [*lines, ""]


def full_table(key: str, cell: dict[str, Any]) -> list[str]:
    base = cell["policies"][BASELINE]["throughput_tok_s"]
    bound = cell["lower_bound_s"]
    lines = [
        f"#### {key}",
        "",
        f"lower bound {bound:,.0f} s; simulated in {cell['sim_wall_s']:.0f} s",
        "",
        f"| policy | makespan s | tok/s | x {BASELINE} | /bound | p50 s | p99 s "
        "| migrations | GPU busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in cell["policies"].items():
        lines.append(
            f"| {name} | {r['makespan_s']:,.0f} | {r['throughput_tok_s']:,.0f} | "
            f"{r['throughput_tok_s'] / base:.2f} | {r['makespan_s'] / bound:.2f} | "
            f"{r['completion_s']['p50']:,.0f} | {r['completion_s']['p99']:,.0f} | "
            f"{r['migrations']} | {r['gpu_busy_frac']:.0%} |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--jobs", type=int, default=2, help="settings simulated at once")
    parser.add_argument("--policy", action="append", help="default: every registered policy")
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="default: all")
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="default: all")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    policies = args.policy or [BASELINE] + [p for p in policy_names() if p != BASELINE]
    if BASELINE not in policies:
        policies.insert(0, BASELINE)
    unknown = sorted(set(policies) - set(policy_names()))
    if unknown:
        parser.error(f"unknown policies {unknown}; valid: {policy_names()}")
    models = [m for m in MODELS if not args.model or m in args.model]
    workloads = [w for w in WORKLOADS if not args.workload or w in args.workload]
    cells_to_run = [(m, w, s) for m in models for w in workloads for s in range(args.seeds)]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cells: dict[str, dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            f"{m}/{w}/{s}": pool.submit(
                run_cell, m, w, s, args.prompts, args.samples, args.gpus, policies
            )
            for m, w, s in cells_to_run
        }
        for key, future in futures.items():
            cells[key] = future.result()
            print(f"{key}: done ({cells[key]['sim_wall_s']:.0f} s)", flush=True)
    lines = [
        f"# Paper setting: {args.gpus} H100, {args.prompts} prompts x {args.samples} samples, "
        f"seeds 0-{args.seeds - 1}",
        "",
        f"Command: `python {' '.join(sys.argv)}` ({time.perf_counter() - started:.0f} s). "
        f"Throughput is generated tokens / makespan (modelled); `x {BASELINE}` is the ratio "
        f"to {BASELINE} on the same trace; `/bound` is makespan over the lower bound (1.00 "
        "is perfect). Each figure is the mean over seeds, with the lowest and highest.",
        "",
        "## Summary",
        "",
    ]
    for m in models:
        for w in workloads:
            table = summary_table(cells, m, w)
            lines += table
            print("\n".join(table), flush=True)
    lines += ["## Every seed", ""]
    for key, cell in cells.items():
        lines += full_table(key, cell)
    (args.out / "paper_setting.json").write_text(json.dumps(cells, indent=1) + "\n")
    (args.out / "paper_setting.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'paper_setting.json'} and {args.out / 'paper_setting.md'}")


if __name__ == "__main__":
    main()
