"""`heddle bench`: policies simulated side by side on one trace and cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from heddle.cli.common import console, fail
from heddle.config import load_cluster
from heddle.errors import InputError


def bench(
    trace: Annotated[Path, typer.Option(help="Trace file (JSON Lines).")],
    cluster: Annotated[Path, typer.Option(help="Cluster YAML.")],
    policy: Annotated[
        list[str],
        typer.Option(help="Policy to compare (repeat); the first is the baseline of the ratios."),
    ],
    history: Annotated[
        Path | None, typer.Option(help="An earlier iteration's trace, for policies that learn.")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the results here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write PNG plots into this directory.")] = None,
) -> None:
    """Simulate policies on one trace and cluster; print each one's ratio to the first."""
    from heddle.bench import run_bench
    from heddle.report import bench_table, bound_line, write_plots
    from heddle.trace import load_trace
    from scheduler.registry import policy_names

    try:
        specs = [r.spec for r in load_trace(trace)]
        hist = [r.spec for r in load_trace(history)] if history else []
        cfg = load_cluster(cluster)
        unknown = [p for p in policy if p not in policy_names()]
        if unknown:
            raise ValueError(f"unknown policy {unknown[0]!r}; valid policies: {policy_names()}")
    except (InputError, ValueError) as exc:
        raise fail(str(exc)) from None
    try:
        result = run_bench(specs, cfg, policy, history=hist)
    except ValueError as exc:  # a policy that cannot be built from what was given
        raise fail(str(exc)) from None
    title = f"{trace.name}: {len(specs)} trajectories on {cfg.num_gpus} {cfg.gpu} ({cfg.model})"
    console.print(bench_table(result, title))
    console.print(bound_line(result.lower_bound))
    if json_out:
        out = result.to_json(trace=str(trace), cluster=cfg)
        json_out.write_text(json.dumps(out, indent=2) + "\n")
        console.print(f"results written to {json_out}")
    if plot:
        for path in write_plots(result, plot):
            console.print(f"plot {path}")
