"""Summary statistics of a trace: what `heddle trace stats` prints and the workload
calibration tests check."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from heddle.stats import percentile
from heddle.types import TrajectorySpec


def trace_stats(specs: Sequence[TrajectorySpec]) -> dict[str, Any]:
    tokens = sorted(s.generated_tokens for s in specs)
    steps = [len(s.steps) for s in specs]
    groups: dict[str, list[int]] = defaultdict(list)
    for s in specs:
        groups[s.group_id].append(s.generated_tokens)
    cvs = [
        statistics.pstdev(v) / statistics.mean(v)
        for v in groups.values()
        if len(v) > 1 and statistics.mean(v) > 0
    ]
    spreads = [max(v) / max(1, min(v)) for v in groups.values() if len(v) > 1]
    latency: dict[str, list[float]] = defaultdict(list)
    status: dict[str, int] = defaultdict(int)
    calls = 0
    for s in specs:
        for st in s.steps:
            if st.tool is not None:
                calls += 1
                latency[st.tool].append(st.tool_latency_s)
                status[st.tool_status] += 1
    median = percentile(tokens, 50)
    return {
        "trajectories": len(specs),
        "groups": len(groups),
        "workloads": sorted({s.workload for s in specs}),
        "generated_tokens": {
            "total": sum(tokens),
            "mean": statistics.mean(tokens) if tokens else 0.0,
            "p50": median,
            "p90": percentile(tokens, 90),
            "p99": percentile(tokens, 99),
            "max": tokens[-1] if tokens else 0,
            "max_over_median": tokens[-1] / median if median else 0.0,
        },
        "prompt_tokens_mean": statistics.mean(s.prompt_tokens for s in specs) if specs else 0.0,
        "steps": {"mean": statistics.mean(steps) if steps else 0.0, "max": max(steps, default=0)},
        "group_cv_mean": statistics.mean(cvs) if cvs else 0.0,
        "group_max_over_min_median": statistics.median(spreads) if spreads else 0.0,
        "tool_calls": calls,
        "tool_latency_mean_s": {t: statistics.mean(v) for t, v in sorted(latency.items())},
        "tool_status": {k: v / calls for k, v in sorted(status.items())} if calls else {},
    }
