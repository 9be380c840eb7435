"""Suffix speculation (issue 31, WAR's lever) on the robustness benchmark's random draws
and on the paper setting: each policy's rollout with and without speculative decoding,
at several acceptance rates (the one thing the cost model must be told about a workload;
vLLM measures it live).

    python benchmarks/speculation.py [--first 1000] [--draws 10] [--prompts 50]
                                     [--policies verl,war,heddle] [--acceptance 0.3,0.5,0.7]
                                     [--paper] [--jobs 2]

Each instance speculates while it decodes at most the batch where the cost model says a
verify pass pays on its shape (`CostModel.speculation_max_batch`, 4 drafted tokens). Per
draw and policy it prints the plain makespan and, per acceptance, the plain over the
speculative makespan (above 1: speculation pays) and the share of tokens made by verify
passes; then each (policy, acceptance)'s spread, and each heddle variant over the best
peer (the policies not named heddle*) with speculation on both. A policy named
`NAME-blind` plans as if the engines did not speculate (they do). `--paper` runs the
paper setting's nine cells (64 H100, seed 0) instead of random draws.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from paper_setting import MODELS as PAPER_MODELS  # this folder's siblings
from paper_setting import WORKLOADS, paper_traces
from robustness import Draw
from variants import print_tables

from heddle.config import ClusterConfig, SpeculationConfig
from heddle.families import generate_family
from heddle.sim import simulate
from heddle.types import TrajectorySpec
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy


def traces_of(key: str, prompts: int, samples: int) -> tuple[list[TrajectorySpec], ...]:
    if key.startswith("draw"):
        seed = Draw.of(int(key[4:])).family_seed
        return tuple(
            [r.spec for r in generate_family("random", prompts=prompts, samples=samples,
                                             seed=seed, iteration=it)]
            for it in (1, 0)
        )  # fmt: skip
    _, workload = key.split("/")
    return paper_traces(workload, 0, prompts, samples)


def cluster_of(key: str) -> ClusterConfig:
    if key.startswith("draw"):
        return Draw.of(int(key[4:])).config()
    model, _ = key.split("/")
    return ClusterConfig(model=model, gpu="h100", num_gpus=64, default_tp=PAPER_MODELS[model])


def run_case(
    key: str, acceptance: float | None, policies: list[str], prompts: int, samples: int
) -> dict[str, Any]:
    """One draw (or paper cell) at one acceptance (None: no speculation)."""
    started = time.perf_counter()
    trace, history = traces_of(key, prompts, samples)
    cluster = cluster_of(key)
    if acceptance is not None:
        cluster = cluster.model_copy(
            update={"speculation": SpeculationConfig(acceptance=acceptance)}
        )
    shape = cluster.shape()
    results = {}
    for name in policies:
        # "NAME-blind": the policy plans for engines that do not speculate, while they do.
        policy, blind = name.removesuffix("-blind"), name.endswith("-blind")
        view = dataclasses.replace(shape, speculation=None) if blind else shape
        ctx = PolicyContext(view, tuple(history), tuple(trace), 0)
        results[name] = simulate(trace, create_policy(policy, ctx), shape)
    return {
        "key": key,
        "acceptance": acceptance,
        "makespan_s": {p: r.makespan_s for p, r in results.items()},
        "speculated": {p: r.speculated_tokens / r.generated_tokens for p, r in results.items()},
        "wall_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--first", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--policies", default="verl,war,heddle")
    ap.add_argument("--acceptance", default="0.3,0.5,0.7")
    ap.add_argument("--paper", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    rates = [float(a) for a in args.acceptance.split(",")]
    if args.paper:
        keys = [f"{m}/{w}" for m in PAPER_MODELS for w in WORKLOADS]
    else:
        keys = [f"draw{i}" for i in range(args.first, args.first + args.draws)]
    cases = [(k, a) for k in keys for a in (None, *rates)]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {
            case: pool.submit(run_case, *case, policies, args.prompts, args.samples)
            for case in cases
        }
        done = {case: f.result() for case, f in futures.items()}

    print_tables(
        keys, policies, rates, done, plain="plain", name=lambda a: f"a={a}",
        note=lambda run, p: f"{run['speculated'][p]:.0%}", note_head="share",
        kind="acceptance",
    )  # fmt: skip
    print(f"\n{len(cases)} runs in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
