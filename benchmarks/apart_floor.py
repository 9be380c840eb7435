"""How fast any schedule can be that keeps the longest trajectories apart: the floor
behind math's distance to the lower bound.

    python benchmarks/apart_floor.py [--workload math] [--model M] [--seeds 3]
                                     [--policy heddle] [--jobs 2]

On n instances of the widest degree (64 H100 as eight TP-8s, the split heddle runs on
math), an iteration costs at least a fixed part (the weights, the all-reduce latency,
the overhead) plus a share per token it makes (the KV it reads, its all-reduce bytes;
`engines.costmodel.IterationTerms`). An instance that runs a trajectory runs at least
as many iterations as that trajectory has tokens, so if the n longest never share an
instance, the instances run at least the n longest's tokens in iterations between
them, and every token's share is paid somewhere (`heddle.sim.bound.apart_floor_s`):

    makespan >= (fixed x the n longest's tokens + every token's share) / n

That is the floor for every schedule that keeps the n longest apart, as a balanced
placement does when nothing tells them from the rest; a schedule beats it only by
putting long trajectories together on few instances, so that the others run the bulk
in few, full iterations (what heddle-oracle's pins do with true lengths). Prints, per
trace, the batch's lower bound, this floor, and the policy's makespan over each.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

from paper_setting import MODELS, WORKLOADS, run_cell  # this folder's sibling

from engines.costmodel import CostModel
from heddle.sim.bound import apart_floor_s
from heddle.types import TrajectorySpec
from heddle.workloads import generate

NUM_GPUS, WIDEST = 64, 8


def floor_s(specs: list[TrajectorySpec], model: str) -> float:
    """The floor above for `NUM_GPUS` as instances of degree `WIDEST`."""
    cost = CostModel.for_names(model, "h100", WIDEST)
    return apart_floor_s(specs, cost, NUM_GPUS // WIDEST)


def one(model: str, workload: str, seed: int, policy: str) -> tuple[float, float, float]:
    """The trace's lower bound, its apart floor, and the policy's makespan on it."""
    cell = run_cell(model, workload, seed, 400, 16, NUM_GPUS, [policy])
    trace = [r.spec for r in generate(workload, prompts=400, seed=seed, iteration=1)]
    made = float(cell["policies"][policy]["makespan_s"])
    return float(cell["lower_bound_s"]), floor_s(trace, model), made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="math")
    parser.add_argument("--model", choices=sorted(MODELS), action="append")
    parser.add_argument("--seeds", type=int, default=3, help="trace seeds 0..N-1")
    parser.add_argument("--policy", default="heddle")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    runs = [(m, s) for m in args.model or sorted(MODELS) for s in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {r: pool.submit(one, r[0], args.workload, r[1], args.policy) for r in runs}
        results = {r: f.result() for r, f in futures.items()}
    print(f"{args.workload}, {NUM_GPUS} H100 as {NUM_GPUS // WIDEST} TP-{WIDEST}s: "
          f"the lower bound, the floor for schedules that keep the longest apart, "
          f"and {args.policy}")  # fmt: skip
    print(f"{'trace':>16} {'bound s':>8} {'floor s':>8} {'floor/bound':>11} "
          f"{args.policy + ' s':>10} {'/floor':>7} {'/bound':>7}")  # fmt: skip
    for (model, seed), (bound, floor, made) in results.items():
        print(f"{model + ' s' + str(seed):>16} {bound:8.1f} {floor:8.1f} {floor / bound:11.3f} "
              f"{made:10.1f} {made / floor:7.3f} {made / bound:7.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
