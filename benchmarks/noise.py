"""How far a policy's makespan moves when only its predictor's training seed changes
(LightGBM's feature sampling), beside how far it moves between traces: a change to a
policy is real only if it moves the mean over both by more than this spread.

    python benchmarks/noise.py [--model qwen3-14b] [--workload coding] [--seeds 3]
                               [--predictor-seeds 3] [--policy heddle] [--jobs 2]
    python benchmarks/noise.py --grid [--out runs.json] [--against older.json]
    python benchmarks/noise.py --made runs.json --against older.json

Prints each (trace seed, predictor seed) run's makespan, throughput over verl on the
same trace and distance to the lower bound, then per trace the spread over predictor
seeds (largest makespan over smallest), and over all runs the mean ratio to verl and to
the lower bound and how many runs are within 1.3x of it. The setting is
benchmarks/paper_setting.py's.

`--grid` runs the policy alone on every model, workload and trace seed under each
predictor seed and writes the makespans to `--out`; `--against` an earlier such file
(another commit's: run this script with PYTHONPATH at a worktree of it) prints each
cell's mean over predictor seeds beside the earlier mean, with the difference's
standard error, so "nothing got worse" is judged on the means and not on one draw of
the predictor's noise; then each model and workload summed over its trace seeds, since
a trace seed is itself one draw of the workload. `--made` compares two stored files
without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from paper_setting import BASELINE, MODELS, WORKLOADS, run_cell  # this folder's sibling

TARGET = 1.3  # issue 4's distance to the lower bound


def makespan(
    model: str, workload: str, seed: int, policy: str, predictor_seed: int
) -> tuple[float, float]:
    """One run, as benchmarks/paper_setting.py runs it (400 prompts x 16, 64 GPUs): the
    makespan and the trace's lower bound."""
    cell = run_cell(model, workload, seed, 400, 16, 64, [policy], predictor_seed)
    return float(cell["policies"][policy]["makespan_s"]), float(cell["lower_bound_s"])


def grid(args: argparse.Namespace) -> None:
    """Every paper cell under every predictor seed, the policy alone (no baseline)."""
    runs = [
        (m, w, s, p)
        for m in MODELS
        for w in WORKLOADS
        for s in range(args.seeds)
        for p in range(args.predictor_seeds)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {r: pool.submit(makespan, r[0], r[1], r[2], args.policy, r[3]) for r in runs}
        made: dict[str, dict[str, float]] = {}
        for (m, w, s, p), f in futures.items():
            made.setdefault(f"{m}/{w}/{s}", {})[str(p)] = round(f.result()[0], 3)
    if args.out:
        Path(args.out).write_text(json.dumps({"policy": args.policy, "makespan_s": made}))
    if args.against:
        compare(made, json.loads(Path(args.against).read_text())["makespan_s"])


def compare(made: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> None:
    """Per cell: both means over predictor seeds, their ratio, and the difference over
    its standard error (Welch's; past about 2 the cell moved beyond the seeds' noise)."""
    print("| cell | before: mean (s) | now: mean (s) | now / before | difference / s.e. |")
    print("|---|---:|---:|---:|---:|")
    ratios, worse, beyond = [], [], []
    sums: dict[str, list[float]] = {}  # model/workload -> [before, now], over trace seeds
    for cell in sorted(set(made) & set(before)):
        a, b = list(before[cell].values()), list(made[cell].values())
        mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
        pair = sums.setdefault(cell.rsplit("/", 1)[0], [0.0, 0.0])
        pair[0] += mean_a
        pair[1] += mean_b
        se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        ratio = mean_b / mean_a
        z = (mean_b - mean_a) / se if se > 0 else 0.0
        ratios.append(ratio)
        worse += [cell] if ratio > 1.005 else []
        beyond += [cell] if ratio > 1.005 and z > 2 else []
        print(f"| {cell} | {mean_a:.1f} | {mean_b:.1f} "
              f"| {ratio:.3f} | {z:+.1f} |")  # fmt: skip
    geomean = math.exp(statistics.fmean(math.log(r) for r in ratios))
    print(
        f"{len(ratios)} cells: now / before min {min(ratios):.3f}, median "
        f"{statistics.median(ratios):.3f}, geometric mean {geomean:.3f}, max "
        f"{max(ratios):.3f}; slower by over 0.5% on {len(worse)} ({', '.join(worse) or '-'}), "
        f"of which beyond 2 standard errors {len(beyond)} ({', '.join(beyond) or '-'})"
    )
    print()
    print("| model / workload | before: sum of means (s) | now: sum of means (s) | now / before |")
    print("|---|---:|---:|---:|")
    for model_workload, (sum_a, sum_b) in sums.items():
        print(f"| {model_workload} | {sum_a:.1f} | {sum_b:.1f} | {sum_b / sum_a:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-14b")
    parser.add_argument("--workload", choices=WORKLOADS, default="coding")
    parser.add_argument("--seeds", type=int, default=3, help="trace seeds 0..N-1")
    parser.add_argument("--predictor-seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--policy", default="heddle")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--grid", action="store_true", help="every model and workload")
    parser.add_argument("--out", help="--grid: write the makespans here (JSON)")
    parser.add_argument("--against", help="--grid, --made: an earlier --out to compare with")
    parser.add_argument("--made", help="a stored --out to compare --against, running nothing")
    args = parser.parse_args()
    if args.made:
        if not args.against:
            parser.error("--made needs --against")
        compare(*(json.loads(Path(f).read_text())["makespan_s"] for f in (args.made, args.against)))
        return
    if args.grid:
        grid(args)
        return
    seeds, pseeds = range(args.seeds), range(args.predictor_seeds)
    runs = [(s, p) for s in seeds for p in pseeds]
    common = (args.model, args.workload)
    with ProcessPoolExecutor(args.jobs) as pool:
        base = {s: pool.submit(makespan, *common, s, BASELINE, 0) for s in seeds}
        ours = {r: pool.submit(makespan, *common, r[0], args.policy, r[1]) for r in runs}
        verl = {s: f.result()[0] for s, f in base.items()}
        made = {r: f.result()[0] for r, f in ours.items()}
        bound = {s: base[s].result()[1] for s in seeds}
    print(f"{args.policy} on {args.model} {args.workload}: makespan (x {BASELINE}) by trace "
          f"seed and predictor seed")  # fmt: skip
    for s in seeds:
        cells = "  ".join(
            f"p{p}: {made[s, p]:6.0f} s (x{verl[s] / made[s, p]:.2f}, /bound "
            f"{made[s, p] / bound[s]:.3f})"
            for p in pseeds
        )
        spread = max(made[s, p] for p in pseeds) / min(made[s, p] for p in pseeds) - 1
        print(f"  trace {s} ({BASELINE} {verl[s]:.0f} s): {cells}  spread {spread:.1%}")
    ratios = [verl[s] / made[s, p] for s, p in runs]
    print(f"  mean x{statistics.fmean(ratios):.3f} over {len(runs)} runs "
          f"(lowest x{min(ratios):.2f}, highest x{max(ratios):.2f})")  # fmt: skip
    over = [made[s, p] / bound[s] for s, p in runs]
    print(f"  mean /bound {statistics.fmean(over):.3f} (lowest {min(over):.2f}, "
          f"highest {max(over):.2f}); {sum(x <= TARGET for x in over)} of {len(over)} runs "
          f"within {TARGET}x")  # fmt: skip


if __name__ == "__main__":
    main()
