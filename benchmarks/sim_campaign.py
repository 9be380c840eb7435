"""A training campaign at cluster scale, in the simulator: 64 H100s, Qwen3-14B, iterations
whose workload drifts (turns 3% longer and tool errors 5% rarer each iteration,
`heddle/workloads.py`). Each iteration is the rollout, a train step and the weight sync,
as the live `TrainingCampaignWorkflow` runs them:

- the rollout: every policy on the same trace; a policy that learns is built anew each
  iteration from the iteration before (its predictor retrained, its split re-planned),
  and the first iteration, with no history, runs `policy_without_history` as the live
  campaign does;
- the train step: 6 x parameters x tokens at 35% MFU on the rollout's 64 GPUs
  (`engines.costmodel.train_step_s`), the tokens being every trajectory's prompt, outputs
  and tool results; the same for every policy, since the trace is;
- the sync: the new weights into every instance at once over the GPUs' network links
  (`engines.costmodel.weight_sync_s`), so the smallest instance's TP sets it.

    python benchmarks/sim_campaign.py [--iterations 6] [--workload coding] [--seed 0]
                                      [--prompts 400] [--samples 16] [--jobs 2]

Prints per iteration each policy's rollout makespan and iteration time, heddle's ratio
to verl and to the best peer (the peer with the least total campaign time), and the
campaign's totals; writes sim_campaign.json and sim_campaign.md under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from engines.costmodel import train_step_s, weight_sync_s
from heddle.config import ClusterConfig
from heddle.hardware import GPUS, MODELS
from heddle.sim import simulate
from heddle.sim.reallocation import tail_training
from heddle.types import TrajectorySpec
from heddle.workloads import generate
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy, policy_without_history

PEERS = ("verl", "autellix", "libra")
HEDDLE = "heddle"
BASELINE = "verl"


def iteration_trace(
    workload: str, seed: int, iteration: int, prompts: int, samples: int
) -> list[TrajectorySpec]:
    return [r.spec for r in generate(workload, prompts=prompts, samples=samples, seed=seed,
                                     iteration=iteration)]  # fmt: skip


def run_cell(
    policy: str, iteration: int, workload: str, seed: int, prompts: int, samples: int,
    cluster: ClusterConfig,
) -> dict[str, Any]:  # fmt: skip
    """One policy's rollout of one iteration, then that iteration's train step and sync."""
    trace = iteration_trace(workload, seed, iteration, prompts, samples)
    history = iteration_trace(workload, seed, iteration - 1, prompts, samples) if iteration else []
    ran = policy if history else policy_without_history(policy)
    shape = cluster.shape()
    ctx = PolicyContext(shape, tuple(history), tuple(trace), 0)
    started = time.perf_counter()
    result = simulate(trace, create_policy(ran, ctx), shape)
    model = MODELS[shape.model]
    train = train_step_s(
        model, GPUS[shape.gpu], shape.num_gpus, sum(s.sequence_tokens for s in trace)
    )
    tps = [int(i["tp"]) for i in result.instances]  # type: ignore[call-overload]
    sync = max(weight_sync_s(model, tp) for tp in tps)
    tail = tail_training(result, trace, model, GPUS[shape.gpu], shape.num_gpus)
    return {
        "policy": policy,
        "ran": ran,
        "iteration": iteration,
        "makespan_s": result.makespan_s,
        "train_s": train,
        "sync_s": sync,
        "iteration_s": result.makespan_s + train + sync,
        # Libra's lever: the tail's idle engines train on what has finished.
        "libra_train_s": tail.train_after_rollout_s,
        "libra_iteration_s": result.makespan_s + tail.train_after_rollout_s + sync,
        "libra_gpus_moved": tail.gpus_moved,
        "libra_refilled": tail.refilled,
        "tps": sorted(tps),
        "reconfigurations": result.reconfigurations,
        "migrations": result.migrations,
        "generated_tokens": result.generated_tokens,
        "sim_wall_s": time.perf_counter() - started,
    }


def summarise(
    cells: list[dict[str, Any]], policies: list[str], iterations: int
) -> tuple[str, dict[str, Any]]:
    by = {(c["policy"], c["iteration"]): c for c in cells}
    totals = {p: sum(by[p, i]["iteration_s"] for i in range(iterations)) for p in policies}
    peers = [p for p in policies if p != HEDDLE]
    best = min(peers, key=lambda p: totals[p])
    lines = [
        f"| iteration | {' | '.join(f'{p} rollout' for p in policies)} | train | sync ({HEDDLE}) "
        f"| {HEDDLE} iteration | x {BASELINE} | x {best} |",
        "|---:|" + "---:|" * (len(policies) + 5),
    ]
    for i in range(iterations):
        h = by[HEDDLE, i]
        rollouts = " | ".join(
            f"{by[p, i]['makespan_s']:.0f}" + ("*" if by[p, i]["ran"] != p else "")
            for p in policies
        )
        lines.append(
            f"| {i} | {rollouts} | {h['train_s']:.0f} | {h['sync_s']:.1f} | {h['iteration_s']:.0f} "
            f"| {by[BASELINE, i]['iteration_s'] / h['iteration_s']:.2f} "
            f"| {by[best, i]['iteration_s'] / h['iteration_s']:.2f} |"
        )
    total_row = " | ".join(f"{totals[p]:.0f}" for p in policies)
    lines.append(
        f"| all (iteration time) | {total_row} | | | {totals[HEDDLE]:.0f} "
        f"| {totals[BASELINE] / totals[HEDDLE]:.2f} | {totals[best] / totals[HEDDLE]:.2f} |"
    )
    libra = {p: sum(by[p, i]["libra_iteration_s"] for i in range(iterations)) for p in policies}
    lines += [
        "",
        "With Libra's lever (the tail's idle engines train on the finished trajectories):",
        "",
        "| policy | campaign, fixed (s) | with the tail training (s) | fixed / with | "
        "train left after the rollout, mean (s) | GPUs moved, mean | instances refilled |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in policies:
        cells_p = [by[p, i] for i in range(iterations)]
        lines.append(
            f"| {p} | {totals[p]:.0f} | {libra[p]:.0f} | {totals[p] / libra[p]:.3f} | "
            f"{sum(c['libra_train_s'] for c in cells_p) / iterations:.0f} | "
            f"{sum(c['libra_gpus_moved'] for c in cells_p) / iterations:.0f} | "
            f"{sum(c['libra_refilled'] for c in cells_p)} |"
        )
    return "\n".join(lines), {"totals_s": totals, "best_peer": best, "libra_totals_s": libra}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--workload", default="coding")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    if args.iterations < 5:
        print("error: --iterations: a campaign here runs at least 5", file=sys.stderr)
        return 2
    # The peers at the paper's homogeneous TP (1 for 14B); heddle chooses its own split.
    cluster = ClusterConfig(model=args.model, gpu="h100", num_gpus=args.gpus, default_tp=1)
    policies = [*PEERS, HEDDLE]
    jobs = [(p, i) for i in range(args.iterations) for p in policies]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(
                run_cell, p, i, args.workload, args.seed, args.prompts, args.samples, cluster
            )
            for p, i in jobs
        ]
        cells = [f.result() for f in futures]
    table, totals = summarise(cells, policies, args.iterations)
    head = (
        f"{args.model}, {args.gpus} H100, {args.workload}, {args.prompts} prompts x "
        f"{args.samples} samples, seed {args.seed}, {args.iterations} iterations; seconds of "
        f"cluster time (* = the first iteration's no-history policy ran: "
        f"{policy_without_history(HEDDLE)})"
    )
    print(head)
    print(table)
    print(f"({time.perf_counter() - started:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim_campaign.json").write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "cells": cells, **totals}, indent=1
        )
    )
    (args.out / "sim_campaign.md").write_text(head + "\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
