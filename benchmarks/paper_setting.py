"""The Heddle paper's setting in the simulator: 64 H100s; Qwen3-8B, 14B and 32B; coding,
search and math; 400 prompts x 16 samples; every registered policy on the same trace.

    python benchmarks/paper_setting.py [--prompts 400] [--out benchmarks/results]

Prints one table per (model, workload) with each policy's throughput ratio to verl and
distance to the lower bound, and writes paper_setting.json and paper_setting.md. The
peers run at the paper's homogeneous TP: 1 for 8B and 14B, 2 for 32B.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from heddle.bench import run_bench
from heddle.config import ClusterConfig
from heddle.workloads import generate
from scheduler.registry import policy_names

MODELS = {"qwen3-8b": 1, "qwen3-14b": 1, "qwen3-32b": 2}
WORKLOADS = ("coding", "search", "math")
BASELINE = "verl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--policy", action="append", help="default: every registered policy")
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="default: all")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    policies = args.policy or [BASELINE] + [p for p in policy_names() if p != BASELINE]
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    lines = [
        f"# Paper setting: {args.gpus} H100, {args.prompts} prompts x {args.samples} samples",
        "",
        f"Command: `python {' '.join(sys.argv)}`. Throughput "
        f"is generated tokens / makespan (modelled); `x {BASELINE}` is the ratio to {BASELINE}; "
        "`/bound` is makespan over the lower bound (1.00 is perfect).",
        "",
    ]
    for model, tp in MODELS.items():
        if args.model and model not in args.model:
            continue
        cluster = ClusterConfig(model=model, gpu="h100", num_gpus=args.gpus, default_tp=tp)
        for workload in WORKLOADS:
            trace = [
                r.spec
                for r in generate(
                    workload, prompts=args.prompts, samples=args.samples, seed=0, iteration=1
                )
            ]
            history = [
                r.spec
                for r in generate(
                    workload, prompts=args.prompts, samples=args.samples, seed=0, iteration=0
                )
            ]
            started = time.perf_counter()
            bench = run_bench(trace, cluster, policies, history=history)
            key = f"{model}/{workload}"
            results[key] = bench.to_json(trace=f"{workload} seed 0 iteration 1", cluster=cluster)
            base = bench.results[BASELINE].throughput_tok_s
            bound = bench.lower_bound["lower_bound_s"]
            lines += [
                f"## {model} (peers at TP{tp}), {workload}",
                "",
                f"lower bound {bound:,.0f} s; simulated in {time.perf_counter() - started:.0f} s",
                "",
                f"| policy | makespan s | tok/s | x {BASELINE} | /bound | p50 s | p99 s "
                "| migrations | GPU busy |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for name, r in bench.results.items():
                lines.append(
                    f"| {name} | {r.makespan_s:,.0f} | {r.throughput_tok_s:,.0f} | "
                    f"{r.throughput_tok_s / base:.2f} | {r.makespan_s / bound:.2f} | "
                    f"{r.completion_s['p50']:,.0f} | {r.completion_s['p99']:,.0f} | "
                    f"{r.migrations} | {r.gpu_busy_frac:.0%} |"
                )
            lines.append("")
            print("\n".join(lines[-len(bench.results) - 6 :]), flush=True)
    (args.out / "paper_setting.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "paper_setting.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'paper_setting.json'} and {args.out / 'paper_setting.md'}")


if __name__ == "__main__":
    main()
