"""How much the lower bound's streams term (d) gives away by pricing each token on its
own: (d) beside the same model solved as a linear program over iteration types, term (e)
(`heddle/sim/bound.py`, `streams_lp_s`), at several sizes of the long set S and context
binnings (finer bins only tighten the LP; its variables grow with them).

    python benchmarks/bound_lp.py [--model qwen3-14b] [--workload math] [--seeds 0]
                                  [--bins 64] [--members 32,64,128]

Prints every term of the bound (the LP (e) there at (d)'s size of S on 64 bins), then
the LP per |S| at `--bins` with its solve time, and the best over (d).
"""

from __future__ import annotations

import argparse
import time

from engines.trajectory_costs import allowed_costs
from heddle.config import ClusterConfig
from heddle.sim.bound import lower_bound, streams_lp_s
from heddle.workloads import generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--workload", default="math")
    ap.add_argument("--seeds", default="0", help="comma-separated")
    ap.add_argument("--bins", type=int, default=64)
    ap.add_argument("--members", default="32,64,128", help="sizes of S, comma-separated")
    ap.add_argument("--gpus", type=int, default=64)
    args = ap.parse_args()
    cluster = ClusterConfig(model=args.model, gpu="h100", num_gpus=args.gpus, default_tp=1)
    costs = allowed_costs(cluster.shape())
    sizes = dict(num_gpus=args.gpus, max_num_seqs=cluster.max_num_seqs)
    for seed in (int(s) for s in args.seeds.split(",")):
        trace = [
            r.spec for r in generate(args.workload, prompts=400, samples=16, seed=seed, iteration=1)
        ]
        terms = lower_bound(trace, cluster.shape())
        d = terms["streams_s"]
        print(f"{args.model} {args.workload} seed {seed}: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in terms.items()), flush=True)  # fmt: skip
        best = 0.0
        for m in (int(v) for v in args.members.split(",")):
            started = time.perf_counter()
            lp = streams_lp_s(trace, costs, **sizes, members=[m], bins=args.bins)
            best = max(best, lp)
            took = time.perf_counter() - started
            print(f"  |S| = {m:4d}: LP {lp:.1f} s ({took:.1f} s to solve)", flush=True)
        print(f"  best LP {best:.1f} s = {best / d:.3f} x (d)", flush=True)


if __name__ == "__main__":
    main()
