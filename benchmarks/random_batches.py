"""Every registered policy on random small batches: does any crash, does any run finish
under the lower bound, and how close does the closest come. The simulator's and the
bound's robustness check beside the paper setting's fixed traces; tests/test_bound.py
runs six of these seeds.

    python benchmarks/random_batches.py [--seeds 300] [--first 0] [--jobs 2]

A batch is 4-40 trajectories of 1-5 turns (outputs 30-20,000 tokens, log-uniform;
prompts up to 12,000; tools up to 8 s returning up to 3,000 tokens) on 1-16 H100 of
Qwen3-8B or -14B, or 2-16 of Qwen3-32B. Prints one line per crash or run under the bound, then the
counts and the closest run. Exits 1 if anything crashed or ran under the bound.
"""

from __future__ import annotations

import argparse
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from heddle.hardware import ClusterShape
from heddle.sim import lower_bound, simulate
from heddle.types import StepSpec, TrajectorySpec
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy, policy_names


@dataclass(frozen=True)
class RandomBatch:
    specs: list[TrajectorySpec]
    model: str
    num_gpus: int

    @property
    def tp_choices(self) -> tuple[int, ...]:
        return tuple(t for t in (1, 2, 4, 8) if t <= self.num_gpus)

    @property
    def cluster(self) -> ClusterShape:
        return ClusterShape(
            model=self.model,
            gpu="h100",
            num_gpus=self.num_gpus,
            default_tp=2 if self.model == "qwen3-32b" else 1,
            tp_choices=self.tp_choices,
        )

    def context(self) -> PolicyContext:
        """Every policy learns from the batch itself and knows its lengths (heddle-oracle)."""
        return PolicyContext(self.cluster, history=tuple(self.specs), truth=tuple(self.specs))


def random_batch(seed: int) -> RandomBatch:
    rng = random.Random(seed)
    specs = []
    for i in range(rng.randint(4, 40)):
        turns = rng.randint(1, 5)
        steps = []
        for j in range(turns):
            output = int(10 ** rng.uniform(1.5, 4.3))
            if j == turns - 1:
                steps.append(StepSpec(output))
            else:
                latency, returned = rng.uniform(0, 8), rng.randint(0, 3_000)
                steps.append(StepSpec(output, "t", latency, tool_output_tokens=returned))
        specs.append(TrajectorySpec(f"t{i}", f"g{i % 4}", rng.randint(50, 12_000), tuple(steps)))
    model = rng.choice(["qwen3-8b", "qwen3-14b", "qwen3-32b"])
    num_gpus = rng.choice([1, 2, 4, 8, 16])
    if model == "qwen3-32b":
        num_gpus = max(num_gpus, 2)  # its weights leave one GPU too little KV cache
    return RandomBatch(specs, model, num_gpus)


def run_batch(seed: int) -> tuple[list[str], float, str]:
    """Problems found on one batch, and its closest run over the bound with the policy."""
    batch = random_batch(seed)
    cluster = batch.cluster
    bound = lower_bound(batch.specs, cluster)["lower_bound_s"]
    problems, closest, closest_policy = [], float("inf"), ""
    for name in policy_names():
        where = f"seed {seed} {name} ({batch.model}, {batch.num_gpus} GPUs)"
        try:
            result = simulate(batch.specs, create_policy(name, batch.context()), cluster)
        except Exception as e:  # a crash of any kind is what this looks for
            problems.append(f"CRASH {where}: {type(e).__name__}: {e}")
            continue
        ratio = result.makespan_s / bound
        if ratio < 1:
            problems.append(f"UNDER THE BOUND {where}: {result.makespan_s:.4f} s < {bound:.4f} s")
        if ratio < closest:
            closest, closest_policy = ratio, name
    return problems, closest, f"seed {seed} {closest_policy}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    seeds = range(args.first, args.first + args.seeds)
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_batch, seeds))
    problems = [p for found, _, _ in results for p in found]
    for line in problems:
        print(line)
    closest, where = min((c, w) for _, c, w in results)
    runs = len(seeds) * len(policy_names())
    print(f"{len(seeds)} batches x {len(policy_names())} policies = {runs} runs: "
          f"{len(problems)} problems; the closest run is {closest:.5f}x the bound "
          f"({where})")  # fmt: skip
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
