"""`heddle bench`: every named policy on the same trace and cluster, side by side.

The JSON it writes:
`{"lower_bound_s", "trace", "cluster", "policies": {NAME: {"makespan_s",
"throughput_tok_s", "generated_tokens", "trajectories", "completion_s": {"p50", "p90",
"p99", "max"}, "migrations", "reconfigurations", "gpu_busy_frac", ...}}}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    ctx = PolicyContext(shape, tuple(history), tuple(trace), predictor_seed)
    built = [create_policy(name, ctx) for name in policies]  # validates every name first
    bench = BenchResult(lower_bound(trace, shape))
    for policy in built:
        bench.results[policy.name] = simulate(trace, policy, shape)
    return bench


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(bench: BenchResult, out_dir: Path) -> list[Path]:
    """Completion-time CDF per policy, per-instance Gantt per policy, throughput over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in bench.results.items():
        times = sorted(r.completion_times)
        n = len(times)
        ax.step(times, [(i + 1) / n for i in range(n)], where="post", label=name)
    ax.axvline(bench.lower_bound["lower_bound_s"], color="grey", ls="--", label="lower bound")
    ax.set_xlabel("completion time (s)")
    ax.set_ylabel("fraction of trajectories")
    ax.set_title("Trajectory completion time CDF")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / "completion_cdf.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in bench.results.items():
        if not r.token_events or r.makespan_s <= 0:
            continue
        bins = 60
        width = r.makespan_s / bins
        counts = [0.0] * bins
        for t, tokens in r.token_events:
            counts[min(int(t / width), bins - 1)] += tokens
        ax.plot([(i + 0.5) * width for i in range(bins)], [c / width for c in counts], label=name)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("Rollout throughput over time")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / "throughput.png"))

    for name, r in bench.results.items():
        ids = sorted({iid for iid, _, _ in r.busy_intervals}, key=lambda s: (len(s), s))
        row = {iid: k for k, iid in enumerate(ids)}
        fig, ax = plt.subplots(figsize=(8, max(2.5, 0.12 * len(ids) + 1)))
        for iid, a, b in r.busy_intervals:
            ax.broken_barh([(a, b - a)], (row[iid] - 0.4, 0.8), color="tab:blue")
        ax.set_yticks(range(len(ids)), ids, fontsize=5)
        ax.set_xlabel("time (s)")
        ax.set_title(f"{name}: instance busy time (makespan {r.makespan_s:.0f} s)")
        paths.append(_save(fig, out_dir / f"gantt_{name}.png"))
    return paths
