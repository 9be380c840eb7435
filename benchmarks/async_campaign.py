"""Asynchronous campaigns against the synchronous one, in the simulator, on the campaign
benchmark's setting (`sim_campaign.py`: 64 H100, Qwen3-14B, coding, 400 prompts x 16
samples, the workload drifting each iteration).

- synchronous: each batch's rollout on all 64 GPUs, then its train step on the same GPUs,
  then the sync (`sim_campaign.run_cell`); a policy that learns is rebuilt each iteration
  from the one before;
- asynchronous (`heddle.sim.campaign`): `--splits` GPUs roll out and the rest train; the
  rollout runs up to `--staleness` versions ahead of the trainer (AReaL's rule); a stale
  trajectory continues under the new weights with its stale tokens out of the loss
  (`partial`) or is dropped with its group (`drop`); each sync pauses the engines and
  voids their KV. Its policy is built once, from the iteration before the first;
- with `--libra`, each split also with Libra's reallocation (`scheduler.reallocation`):
  every GPU runs an engine, a train step borrows at least the split's trainer GPUs and
  every engine block the rollout leaves idle while it trains, all given back at the sync.

Both run iterations 1..N (iteration 0 is the history), so neither pays a cold start.

    python benchmarks/async_campaign.py [--iterations 4] [--staleness 1]
                                        [--splits 40,48] [--modes partial,drop]
                                        [--policies verl,autellix,heddle] [--keep-kv]
                                        [--libra] [--jobs 2]

Prints per policy the time of N train steps, synchronous and each asynchronous setting,
their ratio (above 1: asynchronous is faster), the steady step interval (the mean
between commits after the first), the generated tokens trained per second and its ratio
to the synchronous campaign's (a step of B trajectories that finished first holds fewer
tokens than a whole batch: the shorter ones finish first), the tokens left out of the
loss and the trajectories dropped; writes async_campaign.{json,md} under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sim_campaign import iteration_trace, run_cell  # this folder's sibling

from heddle.config import ClusterConfig
from heddle.sim.campaign import simulate_async_campaign
from heddle.staleness import StalenessBound
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy, learns_from_history

MODEL = "qwen3-14b"
GPUS = 64


def run_async(
    policy: str, rollout_gpus: int, staleness: int, on_stale: str, workload: str, seed: int,
    prompts: int, samples: int, iterations: int, keep_kv: bool = False, libra: bool = False,
) -> dict[str, Any]:  # fmt: skip
    started = time.perf_counter()
    engines = GPUS if libra else rollout_gpus  # with Libra's lever every GPU runs an engine
    shape = ClusterConfig(model=MODEL, gpu="h100", num_gpus=engines, default_tp=1).shape()
    # The rollout runs ahead by up to `staleness` batches, and a dropped group is replaced:
    # enough batches that the data never runs out.
    batches = [
        iteration_trace(workload, seed, i, prompts, samples)
        for i in range(1, iterations + staleness + 4)
    ]
    history = iteration_trace(workload, seed, 0, prompts, samples)
    ctx = PolicyContext(shape, tuple(history) if learns_from_history(policy) else ())
    batch = prompts * samples
    result = simulate_async_campaign(
        batches, create_policy(policy, ctx), shape, trainer_gpus=GPUS - rollout_gpus,
        bound=StalenessBound(staleness, batch, batch, on_stale), iterations=iterations,
        keep_kv=keep_kv, reallocate=libra,
    )  # fmt: skip
    commits = [s.committed_s for s in result.steps]
    generated = sum(s.generated_tokens for s in result.steps)
    return {
        "policy": policy,
        "setting": f"async {rollout_gpus}+{GPUS - rollout_gpus} S={staleness} {on_stale}"
        + (" keep-kv" if keep_kv else "")
        + (" libra" if libra else ""),
        "borrowed_gpus": [s.borrowed_gpus for s in result.steps],
        "total_s": result.total_s,
        "steady_step_s": (commits[-1] - commits[0]) / (len(commits) - 1) if len(commits) > 1 else 0,
        "generated_tokens": generated,
        "untrained_frac": 1 - sum(s.trained_tokens for s in result.steps) / generated,
        "dropped": result.dropped_trajectories,
        "max_staleness": max(s.max_staleness for s in result.steps),
        "prefill_tokens": result.prefill_tokens,
        "steps": [
            {k: v for k, v in vars(s).items() if k != "trajectory_ids"} for s in result.steps
        ],
        "sim_wall_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--splits", default="40,48", help="GPUs that roll out (the rest train)")
    ap.add_argument("--modes", default="partial,drop")
    ap.add_argument("--policies", default="verl,autellix,heddle")
    ap.add_argument("--workload", default="coding")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument(
        "--keep-kv", action="store_true", help="a sync keeps the KV the old weights made"
    )
    ap.add_argument(
        "--libra", action="store_true", help="also each split with Libra's reallocation"
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    try:
        splits = [int(s) for s in args.splits.split(",")]
    except ValueError:
        print(f"error: --splits: comma-separated GPU counts, not {args.splits!r}", file=sys.stderr)
        return 2
    if any(not 0 < s < GPUS for s in splits):
        print(f"error: --splits: each between 1 and {GPUS - 1}", file=sys.stderr)
        return 2
    policies = args.policies.split(",")
    modes = args.modes.split(",")
    data = (args.workload, args.seed, args.prompts, args.samples)
    sync_cluster = ClusterConfig(model=MODEL, gpu="h100", num_gpus=GPUS, default_tp=1)
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        async_futures = [
            pool.submit(run_async, p, r, args.staleness, m, *data, args.iterations, args.keep_kv,
                        libra)
            for p in policies for r in splits for m in modes
            for libra in ((False, True) if args.libra else (False,))
        ]  # fmt: skip
        sync_futures = [
            pool.submit(run_cell, p, i, *data, sync_cluster)
            for p in policies for i in range(1, args.iterations + 1)
        ]  # fmt: skip
        runs = [f.result() for f in async_futures]
        cells = [f.result() for f in sync_futures]
    for p in policies:
        mine = [c for c in cells if c["policy"] == p]
        runs.append({
            "policy": p,
            "setting": f"sync {GPUS}",
            "total_s": sum(c["iteration_s"] for c in mine),
            "steady_step_s": sum(c["iteration_s"] for c in mine[1:]) / max(1, len(mine) - 1),
            "generated_tokens": sum(c["generated_tokens"] for c in mine),
            "untrained_frac": 0.0,
            "dropped": 0,
            "max_staleness": 0,
            "prefill_tokens": None,
        })  # fmt: skip
    command = " ".join(["python benchmarks/async_campaign.py", *(argv or sys.argv[1:])])
    head = (
        f"Command: {command}\n\n"
        f"{MODEL}, {GPUS} H100, {args.workload}, {args.prompts} prompts x {args.samples} "
        f"samples, seed {args.seed}, {args.iterations} train steps (iterations 1..N, "
        f"iteration 0 the history); seconds of cluster time"
    )
    lines = [
        "| policy | setting | N steps (s) | sync / this | steady step (s) | tokens trained "
        "per s | / sync | tokens out of the loss | dropped trajectories | max staleness |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in policies:
        sync = next(r for r in runs if r["policy"] == p and r["setting"].startswith("sync"))
        for r in sorted((r for r in runs if r["policy"] == p), key=lambda r: r["setting"]):
            rate = r["generated_tokens"] * (1 - r["untrained_frac"]) / r["total_s"]
            lines.append(
                f"| {p} | {r['setting']} | {r['total_s']:.0f} | "
                f"{sync['total_s'] / r['total_s']:.2f} | {r['steady_step_s']:.0f} | "
                f"{rate:,.0f} | {rate / (sync['generated_tokens'] / sync['total_s']):.2f} | "
                f"{r['untrained_frac']:.1%} | {r['dropped']} | {r['max_staleness']} |"
            )
    table = "\n".join(lines)
    print(head)
    print(table)
    print(f"({time.perf_counter() - started:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_campaign.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1)
    )
    (args.out / "async_campaign.md").write_text(head + "\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
