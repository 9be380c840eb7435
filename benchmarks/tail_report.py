"""Where a policy's makespan goes at the end of a batch: GPUs in use per tenth of the
makespan, by TP degree, and the last trajectories to finish with where each step ran.

    python benchmarks/tail_report.py [--policy heddle] [--model qwen3-14b]
                                     [--workload coding] [--seed 0] [--last 10]
                                     [--every 25]

One simulated run of the paper setting (64 H100, 400 prompts x 16 samples; iteration 1
the trace, iteration 0 the history). A tail where few GPUs are busy, and long
trajectories that ran early steps on narrow instances, are what the drain moves and the
predictor are measured against (docs/notes/issue-4-heddle-policy.md). With `--every`,
also each TP degree's instances, running and waiting steps, KV use and sessions at that
interval: where queues build while wider instances have KV to spare.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from paper_setting import MODELS  # this folder's sibling script: the models and peers' TP

from engines.costmodel import CostModel
from engines.trajectory_costs import trajectory_alone_s
from heddle.config import ClusterConfig
from heddle.sim.simulator import Simulator
from heddle.workloads import generate
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="heddle")
    parser.add_argument("--model", default="qwen3-14b", choices=sorted(MODELS))
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last", type=int, default=10, help="trajectories to list")
    parser.add_argument(
        "--every", type=float, default=0.0, help="seconds between occupancy samples (0: none)"
    )
    args = parser.parse_args()
    trace, history = (
        [r.spec for r in generate(args.workload, prompts=400, seed=args.seed, iteration=it)]
        for it in (1, 0)
    )
    cluster = ClusterConfig(
        model=args.model, gpu="h100", num_gpus=64, default_tp=MODELS[args.model]
    )
    shape = cluster.shape()
    # As `heddle.bench.run_bench` simulates, with the steps recorded.
    sim = Simulator(
        trace=trace,
        policy=create_policy(args.policy, PolicyContext(shape, tuple(history), tuple(trace))),
        record_steps=True,
        sample_every_s=args.every,
        cluster=shape,
    )
    result = sim.run()
    makespan = result.makespan_s
    print(f"{args.policy} on {args.model} {args.workload} seed {args.seed}: makespan "
          f"{makespan:,.0f} s, GPU busy {result.gpu_busy_frac:.1%}")  # fmt: skip
    tp_of = {str(i["instance_id"]): int(str(i["tp"])) for i in result.instances}
    print("GPUs busy per tenth of the makespan, by TP degree:")
    for tenth in range(10):
        lo, hi = makespan * tenth / 10, makespan * (tenth + 1) / 10
        busy: dict[int, float] = defaultdict(float)
        for iid, start, end in result.busy_intervals:
            busy[tp_of[iid]] += max(0.0, min(end, hi) - max(start, lo)) * tp_of[iid]
        by_tp = "  ".join(f"TP{tp}: {gpu_s / (hi - lo):5.1f}" for tp, gpu_s in sorted(busy.items()))
        print(f"  {lo:6.0f}-{hi:6.0f} s  {by_tp}  all: {sum(busy.values()) / (hi - lo):5.1f} / 64")
    if sim.occupancy:
        print("Per TP degree: instances, running, waiting, mean KV use, sessions")
        for t in sorted({o.time_s for o in sim.occupancy}):
            at = [o for o in sim.occupancy if o.time_s == t]
            print(f"  {t:6.0f} s  " + "  ".join(
                f"TP{o.tp}: n={o.num_instances} run={o.num_running} wait={o.num_waiting} "
                f"kv={o.kv_usage:.2f} sess={o.num_sessions}" for o in at))  # fmt: skip
    assert sim.step_log is not None
    steps = defaultdict(list)
    for tid, _, _, _, first, end, instance_id in sim.step_log:
        steps[tid].append((first, end, tp_of[instance_id]))
    widest = CostModel.for_names(cluster.model, cluster.gpu, max(tp_of.values()))
    print(f"The {args.last} last to finish: tokens, finish, alone on the widest instance; "
          "each step's (start, end, TP)")  # fmt: skip
    last = sorted(sim.trajectories.values(), key=lambda t: -t.finished_at)[: args.last]
    for traj in last:
        spec = traj.spec
        ran = ", ".join(f"({a:.0f}, {b:.0f}, {tp})" for a, b, tp in steps[spec.trajectory_id])
        print(f"  {spec.trajectory_id}: {spec.generated_tokens} tokens, finished "
              f"{traj.finished_at:.0f} s, alone {trajectory_alone_s(spec, widest):.0f} s: "
              f"{ran}")  # fmt: skip


if __name__ == "__main__":
    main()
