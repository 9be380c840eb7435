"""`heddle bench`: every named policy on the same trace and cluster, side by side.

The JSON it writes:
`{"lower_bound_s", "trace", "cluster", "policies": {NAME: {"makespan_s",
"throughput_tok_s", "generated_tokens", "trajectories", "completion_s": {"p50", "p90",
"p99", "max"}, "migrations", "reconfigurations", "gpu_busy_frac", ...}}}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from heddle.config import ClusterConfig
from heddle.sim import SimResult, lower_bound, simulate
from heddle.types import TrajectorySpec
from scheduler.interface import PolicyContext
from scheduler.registry import create_policy


@dataclass
class BenchResult:
    lower_bound: dict[str, float]
    results: dict[str, SimResult] = field(default_factory=dict)

    def to_json(self, *, trace: str = "", cluster: ClusterConfig | None = None) -> dict[str, Any]:
        return {
            "lower_bound_s": self.lower_bound["lower_bound_s"],
            "lower_bound": self.lower_bound,
            "trace": trace,
            "cluster": cluster.model_dump(mode="json") if cluster else None,
            "policies": {name: r.summary() for name, r in self.results.items()},
        }


def run_bench(
    trace: Sequence[TrajectorySpec],
    cluster: ClusterConfig,
    policies: Sequence[str],
    *,
    history: Sequence[TrajectorySpec] = (),
    predictor_seed: int = 0,
) -> BenchResult:
    """Simulate each policy on the trace; unknown names fail before any run."""
    shape = cluster.shape()
    ctx = PolicyContext(shape.for_placement(), tuple(history), tuple(trace), predictor_seed)
    built = [create_policy(name, ctx) for name in policies]  # validates every name first
    bench = BenchResult(lower_bound(trace, shape))
    for policy in built:
        bench.results[policy.name] = simulate(trace, policy, shape)
    return bench
