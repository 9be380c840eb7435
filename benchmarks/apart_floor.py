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
them, and every token's share is paid somewhere (`engines.trajectory_costs.apart_floor_s`):

    makespan >= (fixed x the n longest's tokens + every token's share) / n

That is the floor for every schedule that keeps the n longest apart, as a balanced
placement does when nothing tells them from the rest; a schedule beats it only by
putting long trajectories together on few instances, so that the others run the bulk
in few, full iterations (what heddle-oracle's pins do with true lengths). Prints, per
trace, the batch's lower bound, this floor, and the policy's makespan over each; with
`--concentrate`, also the lowest floor over schedules that split the instances in two
and put one set of trajectories together on the first part: the longest prompts by
their samples' lengths in the earlier iteration (what is known before the first step),
or the longest trajectories themselves (the truth).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

from paper_setting import MODELS, WORKLOADS, paper_traces, run_cell  # this folder's sibling

from engines.costmodel import CostModel
from engines.trajectory_costs import apart_floor_s
from heddle.types import TrajectorySpec
from scheduler.libra import prompt_key

NUM_GPUS, WIDEST = 64, 8


def best_split_s(
    specs: list[TrajectorySpec], cost: CostModel, parts: list[list[TrajectorySpec]]
) -> float:
    """The lowest floor over splits of the instances in two: parts[:k] together on h
    instances, the rest on the others, each part keeping its own longest apart (a
    schedule that puts long trajectories together on purpose); keeping all apart
    included."""
    n = NUM_GPUS // WIDEST
    best = apart_floor_s(specs, cost, n)
    for k in sorted({round(len(parts) * q) for q in (0.005, 0.01, 0.02, 0.03, 0.05, 0.1,
                                                      0.15, 0.2, 0.3, 0.4)} - {0}):  # fmt: skip
        together = [s for part in parts[:k] for s in part]
        rest = [s for part in parts[k:] for s in part]
        for h in range(1, n):
            best = min(best, max(apart_floor_s(together, cost, h),
                                 apart_floor_s(rest, cost, n - h)))  # fmt: skip
    return best


def concentrations(
    trace: list[TrajectorySpec], history: list[TrajectorySpec], cost: CostModel
) -> tuple[float, float]:
    """`best_split_s` with what a scheduler knows before the first step, the prompts
    ranked by their samples' mean length in the earlier iteration (whole GRPO groups
    together), and with the truth, trajectories ranked by their length."""
    earlier: dict[str, list[int]] = defaultdict(list)
    for spec in history:
        earlier[prompt_key(spec.group_id)].append(spec.generated_tokens)
    groups: dict[str, list[TrajectorySpec]] = defaultdict(list)
    for spec in trace:
        groups[prompt_key(spec.group_id)].append(spec)
    by_prompt = sorted(groups.values(), key=lambda g: -statistics.fmean(
        earlier.get(prompt_key(g[0].group_id), [0])))  # fmt: skip
    by_length = [[s] for s in sorted(trace, key=lambda s: -s.generated_tokens)]
    return best_split_s(trace, cost, by_prompt), best_split_s(trace, cost, by_length)


def one(
    model: str, workload: str, seed: int, policy: str, concentrate: bool
) -> tuple[float, float, float, tuple[float, float] | None]:
    """The trace's lower bound, its apart floor, the policy's makespan on it and, with
    `concentrate`, the lowest floors by prompt and by truth (`concentrations`)."""
    cell = run_cell(model, workload, seed, 400, 16, NUM_GPUS, [policy])
    trace, history = paper_traces(workload, seed)
    cost = CostModel.for_names(model, "h100", WIDEST)
    floor = apart_floor_s(trace, cost, NUM_GPUS // WIDEST)
    made = float(cell["policies"][policy]["makespan_s"])
    lowest = concentrations(trace, history, cost) if concentrate else None
    return float(cell["lower_bound_s"]), floor, made, lowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="math")
    parser.add_argument("--model", choices=sorted(MODELS), action="append")
    parser.add_argument("--seeds", type=int, default=3, help="trace seeds 0..N-1")
    parser.add_argument("--policy", default="heddle")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--concentrate", action="store_true", help="also schedules that put long ones together"
    )
    args = parser.parse_args()
    runs = [(m, s) for m in args.model or sorted(MODELS) for s in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {r: pool.submit(one, r[0], args.workload, r[1], args.policy,
                                  args.concentrate) for r in runs}  # fmt: skip
        results = {r: f.result() for r, f in futures.items()}
    print(f"{args.workload}, {NUM_GPUS} H100 as {NUM_GPUS // WIDEST} TP-{WIDEST}s: "
          f"the lower bound, the floor for schedules that keep the longest apart, "
          f"and {args.policy}")  # fmt: skip
    print(f"{'trace':>16} {'bound s':>8} {'floor s':>8} {'floor/bound':>11} "
          f"{args.policy + ' s':>10} {'/floor':>7} {'/bound':>7}")  # fmt: skip
    for (model, seed), (bound, floor, made, _) in results.items():
        print(f"{model + ' s' + str(seed):>16} {bound:8.1f} {floor:8.1f} {floor / bound:11.3f} "
              f"{made:10.1f} {made / floor:7.3f} {made / bound:7.3f}")  # fmt: skip
    if not args.concentrate:
        return
    print(
        "the lowest floor, over the bound, when long ones are put together on some of the "
        "instances, chosen by their prompts' earlier lengths or by their own true lengths"
    )
    print(f"{'trace':>16} {'apart':>7} {'by prompt':>10} {'by truth':>9}")
    for (model, seed), (bound, floor, _, lowest) in results.items():
        assert lowest is not None
        prompt, truth = lowest
        print(f"{model + ' s' + str(seed):>16} {floor / bound:7.3f} {prompt / bound:10.3f} "
              f"{truth / bound:9.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
