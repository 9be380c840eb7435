"""Prefill/decode disaggregation (issue 31, Prorsa's lever) on the robustness benchmark's
random draws and on the paper setting: each policy's rollout with prefill and decode
co-located (every instance does both, as vLLM does by default), against a static prefill
pool and against roles switched from the forecast demand (`scheduler.roles`).

    python benchmarks/disaggregation.py [--first 1000] [--draws 10] [--prompts 50]
                                        [--policies verl,war,heddle] [--share 0.125]
                                        [--min-prefill 512] [--paper] [--jobs 2]

`--share S`: the static pool is the narrowest instances on that share of the GPUs; the
forecast's pool grows to at most twice that. A third mode, `free`, bounds what any
disaggregation could buy: co-located, with every iteration's prefill tokens costing
nothing (as if an unlimited pool prefilled them and the KV arrived at once). Per draw and
policy it prints the co-located makespan and, per mode, co-located over disaggregated
(above 1: disaggregation pays), with the share of prefill tokens that left their decode
instance; then each (policy, mode)'s spread, and heddle over the best peer in each mode.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from paper_setting import MODELS as PAPER_MODELS  # this folder's siblings
from paper_setting import WORKLOADS
from speculation import cluster_of, traces_of
from variants import print_tables

from engines.costmodel import CostModel
from heddle.config import DisaggregationConfig
from heddle.sim import simulate
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy

MODES = ("static", "forecast", "free")


@contextlib.contextmanager
def _prefill_for_free(on: bool) -> Iterator[None]:
    """While on, iterations cost only their decodes (in this process)."""
    plain = CostModel.iteration_s

    def decodes_only(self: CostModel, **kw: Any) -> float:
        kw.update(num_prefill_tokens=0, prefill_attended_tokens=0.0, prefill_cached_tokens=0)
        return plain(self, **kw) if kw["num_decode_seqs"] else 1e-6

    if on:
        CostModel.iteration_s = decodes_only  # type: ignore[method-assign]
    try:
        yield
    finally:
        CostModel.iteration_s = plain  # type: ignore[method-assign]


def run_case(
    key: str, mode: str | None, policies: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """One draw (or paper cell) in one mode (None: co-located)."""
    started = time.perf_counter()
    trace, history = traces_of(key, args.prompts, args.samples)
    cluster = cluster_of(key)
    if mode not in (None, "free"):
        share = args.share if mode == "static" else min(0.5, 2 * args.share)
        config = DisaggregationConfig(
            roles=mode, prefill_share=share, min_prefill_tokens=args.min_prefill
        )
        cluster = cluster.model_copy(update={"disaggregation": config})
    shape = cluster.shape()
    results = {}
    for name in policies:
        ctx = PolicyContext(shape.for_placement(), tuple(history), tuple(trace), 0)
        with _prefill_for_free(mode == "free"):
            results[name] = simulate(trace, create_policy(name, ctx), shape)
    return {
        "key": key,
        "mode": mode,
        "makespan_s": {p: r.makespan_s for p, r in results.items()},
        "offloaded": {
            p: r.offloaded_prefill_tokens / max(1, r.prefill_tokens) for p, r in results.items()
        },
        "switches": {p: r.role_switches for p, r in results.items()},
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
    ap.add_argument("--share", type=float, default=0.125)
    ap.add_argument("--min-prefill", type=int, default=512)
    ap.add_argument("--paper", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    if args.paper:
        keys = [f"{m}/{w}" for m in PAPER_MODELS for w in WORKLOADS]
    else:
        keys = [f"draw{i}" for i in range(args.first, args.first + args.draws)]
    cases = [(k, m) for k in keys for m in (None, *MODES)]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {case: pool.submit(run_case, *case, policies, args) for case in cases}
        done = {case: f.result() for case, f in futures.items()}

    print_tables(
        keys, policies, MODES, done, plain="co-located", name=str,
        note=lambda run, p: f"{run['offloaded'][p]:.0%}, {run['switches'][p]}",
        note_head="offloaded, switches", kind="mode",
    )  # fmt: skip
    print(f"\n{len(cases)} runs in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
