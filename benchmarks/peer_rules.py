"""How often each peer's distinguishing rule decides, on the paper setting.

    python benchmarks/peer_rules.py [--workload coding] [--cluster FILE]

Simulates verl, verl_star, sticky_least_loaded and war on one workload (400 prompts x 16
samples, iteration 1 of seed 0) on `examples/cluster-paper-14b.yaml`, counting each
placement's `Decision.reason` and the largest in-flight skew between instances any
placement saw. A peer whose own reasons never appear decides as verl does
(docs/policies.md, "When the peers coincide").
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from heddle.config import load_cluster  # noqa: E402
from heddle.sim.simulator import simulate  # noqa: E402
from heddle.workloads import generate  # noqa: E402
from scheduler.interface import PolicyContext  # noqa: E402
from scheduler.registry import create_policy  # noqa: E402

PEERS = ("verl", "verl_star", "sticky_least_loaded", "war")


@dataclass
class Counting:
    """A placement wrapped to count its decisions' reasons and the skew it saw."""

    place: Any
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    max_skew: int = 0

    def __call__(self, event: Any, instances: Any, now: float) -> Any:
        loads = [s.num_in_flight for s in instances]
        self.max_skew = max(self.max_skew, max(loads) - min(loads))
        decision = self.place(event, instances, now)
        self.reasons[decision.reason] += 1
        return decision


def count_reasons(workload: str, cluster: Path) -> list[dict[str, Any]]:
    shape = load_cluster(cluster).shape()
    trace = [r.spec for r in generate(workload, prompts=400, samples=16, seed=0, iteration=1)]
    rows = []
    for name in PEERS:
        began = time.monotonic()
        policy = create_policy(name, PolicyContext(shape))
        counting = Counting(policy.placement.place)
        policy.placement.place = counting  # type: ignore[method-assign]
        result = simulate(trace, policy, shape)
        rows.append({
            "policy": name, "makespan_s": round(result.makespan_s, 1),
            "reasons": dict(counting.reasons), "max_skew": counting.max_skew,
            "wall_s": round(time.monotonic() - began),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="coding")
    parser.add_argument(
        "--cluster", type=Path, default=ROOT / "examples" / "cluster-paper-14b.yaml"
    )
    args = parser.parse_args()
    count_reasons(args.workload, args.cluster)


if __name__ == "__main__":
    main()
