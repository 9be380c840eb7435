"""Issue 31's levers in one table: each alone and together, against the synchronous
campaign and the best peer, in the simulator.

    python benchmarks/levers.py [--paper qwen3-14b/coding,...] [--draws 1000,1001,...]
                                [--iterations 3] [--prompts 400|50] [--acceptance 0.5]
                                [--policies verl,autellix,heddle] [--jobs 2]

A campaign of `--iterations` train steps (iteration 0 is the history, so none pays a
cold start), per case and policy, with:

- `sync`: each batch's rollout on every GPU, its train step on the same GPUs, the sync
  (as `benchmarks/sim_campaign.py`);
- `libra`: the same, with the tail's idle engines training on the finished trajectories
  (`heddle.sim.reallocation`);
- `spec`: the same as sync, with suffix speculation on every engine at `--acceptance`;
- `pd`: the same as sync, with prefill/decode disaggregation, roles from the forecast
  (the cluster file's `disaggregation: {}`, `scheduler.roles`);
- `async`: three quarters of the GPUs roll out and the rest train, S = 1, stale tokens
  out of the loss (`heddle.sim.campaign`);
- `libra+async`: the same with Libra's reallocation (`scheduler.reallocation`): a train
  step borrows at least a quarter of the GPUs and every engine the rollout leaves idle,
  and gives them back at the sync;
- `spec+libra`, `spec+async`, `spec+libra+async`, `pd+async`, `spec+pd+libra` and
  `spec+pd+async`: the levers together.

Cases are the paper setting's cells (64 H100, seed 0, `--prompts` x 16) and robustness
draws (`benchmarks/robustness.py`'s draws: a random family, model and cluster). Prints
per case and policy the campaign's time with each lever, and its speed-up over the same
policy's synchronous campaign (above 1: the lever pays); then heddle's best over the best
peer's best.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from paper_setting import MODELS as PAPER_TP  # this folder's siblings
from robustness import Draw

from engines.costmodel import train_step_s, weight_sync_s
from heddle.config import ClusterConfig, DisaggregationConfig, SpeculationConfig
from heddle.families import generate_family
from heddle.hardware import GPUS, MODELS
from heddle.sim import simulate
from heddle.sim.campaign import simulate_async_campaign
from heddle.sim.reallocation import tail_training
from heddle.staleness import StalenessBound
from heddle.types import TrajectorySpec
from heddle.workloads import generate
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy, learns_from_history

LEVERS = (
    "sync", "libra", "spec", "pd", "async", "libra+async", "spec+libra", "spec+async",
    "spec+libra+async", "pd+async", "spec+pd+libra", "spec+pd+async",
)  # fmt: skip
STALENESS = 1


def _batch(case: str, iteration: int, prompts: int, samples: int) -> list[TrajectorySpec]:
    if case.startswith("draw"):
        seed = Draw.of(int(case[4:])).family_seed
        made = generate_family("random", prompts=prompts, samples=samples, seed=seed,
                               iteration=iteration)  # fmt: skip
    else:
        workload = case.split("/")[1]
        made = generate(workload, prompts=prompts, samples=samples, seed=0, iteration=iteration)
    return [r.spec for r in made]


def _cluster(case: str) -> ClusterConfig:
    if case.startswith("draw"):
        return Draw.of(int(case[4:])).config()
    model = case.split("/")[0]
    return ClusterConfig(model=model, gpu="h100", num_gpus=64, default_tp=PAPER_TP[model])


def run_campaign(
    case: str, policy: str, spec: bool, pd: bool, asynchronous: str, iterations: int,
    prompts: int, samples: int, acceptance: float,
) -> dict[str, Any]:  # fmt: skip
    """One policy's campaign of `iterations` train steps on one case: synchronous (with
    and without Libra's tail, from the same rollouts; `asynchronous` "") or asynchronous
    ("async" on a fixed split, "libra+async" with Libra's reallocation); with or without
    speculation and disaggregation. Returns each lever's campaign time."""
    started = time.perf_counter()
    cluster = _cluster(case)
    if spec:
        cluster = cluster.model_copy(
            update={"speculation": SpeculationConfig(acceptance=acceptance)}
        )
    if pd:
        cluster = cluster.model_copy(update={"disaggregation": DisaggregationConfig()})
    shape = cluster.shape()
    model, gpu = MODELS[shape.model], GPUS[shape.gpu]
    prefix = ("spec+" if spec else "") + ("pd+" if pd else "")
    if asynchronous:
        trainer_gpus = shape.num_gpus - shape.num_gpus * 3 // 4
        libra = asynchronous == "libra+async"  # every GPU runs an engine; steps borrow
        rollout = dataclasses.replace(
            shape, num_gpus=shape.num_gpus - (0 if libra else trainer_gpus)
        )
        batches = [_batch(case, i, prompts, samples)
                   for i in range(1, iterations + STALENESS + 4)]  # fmt: skip
        history = _batch(case, 0, prompts, samples) if learns_from_history(policy) else []
        ctx = PolicyContext(rollout, tuple(history))
        size = len(batches[0])
        result = simulate_async_campaign(
            batches, create_policy(policy, ctx), rollout, trainer_gpus=trainer_gpus,
            bound=StalenessBound(STALENESS, size, size, "partial"), iterations=iterations,
            reallocate=libra,
        )  # fmt: skip
        generated = sum(s.generated_tokens for s in result.steps)
        trained = sum(s.trained_tokens for s in result.steps)
        return {f"{prefix}{asynchronous}": result.total_s,
                f"{prefix}{asynchronous}_trained": trained / generated,
                "wall_s": time.perf_counter() - started}  # fmt: skip
    plain = libra = 0.0
    for i in range(1, iterations + 1):
        trace = _batch(case, i, prompts, samples)
        history = _batch(case, i - 1, prompts, samples)
        ctx = PolicyContext(shape, tuple(history), tuple(trace), 0)
        result = simulate(trace, create_policy(policy, ctx), shape)
        train = train_step_s(model, gpu, shape.num_gpus, sum(s.sequence_tokens for s in trace))
        tail = tail_training(result, trace, model, gpu, shape.num_gpus).train_after_rollout_s
        sync = max(weight_sync_s(model, int(inst["tp"])) for inst in result.instances)  # type: ignore[call-overload]
        plain += result.makespan_s + train + sync
        libra += result.makespan_s + tail + sync
    return {prefix.removesuffix("+") or "sync": plain, f"{prefix}libra": libra,
            "wall_s": time.perf_counter() - started}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--paper", default="", help="cells, e.g. qwen3-14b/coding")
    ap.add_argument("--draws", default="", help="robustness draws, e.g. 1000,1001")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--acceptance", type=float, default=0.5)
    ap.add_argument("--policies", default="verl,autellix,heddle")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    cases = [c for c in args.paper.split(",") if c]
    cases += [f"draw{d}" for d in args.draws.split(",") if d]
    if not cases:
        ap.error("name --paper cells or --draws")
    policies = args.policies.split(",")
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            ((c, p), pool.submit(run_campaign, c, p, spec, pd, asynchronous, args.iterations,
                                 args.prompts, args.samples, args.acceptance))
            for c in cases for p in policies for spec in (False, True) for pd in (False, True)
            for asynchronous in ("", "async", "libra+async")
            if not (pd and asynchronous == "libra+async")  # pd's pool never forms in a campaign
        ]  # fmt: skip
        times: dict[tuple[str, str], dict[str, float]] = {}
        for key, future in futures:
            times.setdefault(key, {}).update(future.result())
    runs = {(c, p, lv): {"total_s": t[lv]} for (c, p), t in times.items() for lv in LEVERS}

    print(f"{args.iterations} train steps; acceptance {args.acceptance}; async: 3/4 of the "
          f"GPUs roll out, S = {STALENESS}, partial; libra+async: a quarter at least "
          "train")  # fmt: skip
    print(f"| case | policy | sync (s) | {' | '.join(LEVERS[1:])} | trained (async) |")
    print("|---|---|---:|" + "---:|" * len(LEVERS))
    for c in cases:
        label = c
        if c.startswith("draw"):
            d = Draw.of(int(c[4:]))
            label = f"{d.index} {d.model} {d.cluster}"
        for p in policies:
            sync = runs[(c, p, "sync")]["total_s"]
            cols = [f"{sync / runs[(c, p, lv)]['total_s']:.3f}x" for lv in LEVERS[1:]]
            trained = times[(c, p)]["async_trained"]
            print(f"| {label} | {p} | {sync:.0f} | {' | '.join(cols)} | {trained:.0%} |")
    if "heddle" in policies and len(policies) > 1:
        print()
        print("| case | heddle's best lever | best peer's best lever | heddle / best peer "
              "(each with its best) | heddle with it / best peer synchronous |")  # fmt: skip
        print("|---|---|---|---:|---:|")
        for c in cases:
            best = {p: min(LEVERS, key=lambda lv: runs[(c, p, lv)]["total_s"]) for p in policies}
            peers = [p for p in policies if p != "heddle"]
            peer = min(peers, key=lambda p: runs[(c, p, best[p])]["total_s"])
            peer_sync = min(runs[(c, p, "sync")]["total_s"] for p in peers)
            h = runs[(c, "heddle", best["heddle"])]["total_s"]
            print(f"| {c} | {best['heddle']} | {peer} {best[peer]} "
                  f"| {runs[(c, peer, best[peer])]['total_s'] / h:.2f}x "
                  f"| {peer_sync / h:.2f}x |")  # fmt: skip
    print(f"\n{len(futures)} simulated campaigns in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
