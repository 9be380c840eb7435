"""Tables and plots of Heddle's results, for the CLI and for anyone holding the client's
results (`BatchReport`, `ClusterPlan`, the store's listings) or a `BenchResult`: one
rendering of each, so the command line and a notebook show the same thing.

    from heddle.report import rollout_table
    rich.print(rollout_table(await handle.report(), ui_url))
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.table import Table

from heddle.bench import BenchResult
from heddle.types import BatchReport, ClusterPlan


def rollout_table(
    report: BatchReport, ui_url: str | None = None, outcomes: dict[str, Any] | None = None
) -> Table:
    """A finished batch: its counts, makespan (cluster time and wall), throughput and
    completion-time quantiles, its rewards and tool calls (`outcomes`: the store's
    `batch_outcomes`), and where the Temporal UI lists its trajectories."""
    r = dataclasses.asdict(report)
    table = Table(title=f"rollout {r['batch_id']}", show_header=False)
    quantiles = " / ".join(f"{r['completion_s'][k]:.1f}" for k in ("p50", "p90", "p99", "max"))
    rows = [
        ("policy", r["policy"]),
        ("trajectories", f"{r['trajectories']} ({r['completed']} completed, {r['failed']} failed)"),
        ("generated tokens", f"{r['generated_tokens']:,}"),
        ("makespan", f"{r['makespan_s']:.1f} s (cluster time; wall {r['wall_s']:.1f} s "
                     f"at time scale {r['time_scale']:g})"),
        ("throughput", f"{r['throughput_tok_s']:,.0f} tokens/s"),
        ("completion p50/p90/p99/max", quantiles + " s"),
    ]  # fmt: skip
    if outcomes is not None:
        o = outcomes
        if o["mean_reward"] is not None:
            rows.append(
                ("mean reward / pass rate", f"{o['mean_reward']:.3f} / {o['pass_rate']:.1%}")
            )
        rows.append(("tool calls", f"{o['tool_calls']:,}"))
        rows.append(
            ("finish reasons", ", ".join(f"{k} {v}" for k, v in o["finish_reasons"].items()))
        )
        if o["reward_errors"]:
            rows.append(("verifier errors", str(o["reward_errors"])))
    for k, v in rows:
        table.add_row(k, str(v))
    if ui_url:
        query = f"HeddleBatch%3D%22{r['batch_id']}%22"
        table.add_row("Temporal UI", f"{ui_url}/namespaces/default/workflows?query={query}")
    return table


def plan_table(plan: ClusterPlan) -> Table:
    table = Table("instance", "TP", "GPUs", "state", title=f"cluster plan v{plan.version}")
    for i in plan.instances:
        table.add_row(i.instance_id, str(i.tp), f"{i.first_gpu}-{i.first_gpu + i.tp - 1}", i.state)
    return table


def batches_table(batches: Iterable[dict[str, Any]]) -> Table:
    """The store's batches (`HeddleClient.list_batches`)."""
    table = Table("batch", "status", "policy", "trajectories", "by status", "throughput tok/s")
    for b in batches:
        rep = b["report"] or {}
        table.add_row(
            b["batch_id"],
            b["status"],
            b["policy"],
            str(b["num_trajectories"]),
            json.dumps(b["trajectory_status"]),
            f"{rep.get('throughput_tok_s', 0):,.0f}",
        )
    return table


def trajectories_table(trajectories: Iterable[dict[str, Any]]) -> Table:
    """A batch's trajectories (`HeddleClient.list_trajectories`)."""
    table = Table(
        "trajectory", "group", "status", "reason", "turns", "tokens", "tools", "reward", "seconds"
    )
    for t in trajectories:
        secs = (t["finished_at"] or 0) - (t["started_at"] or 0) if t["finished_at"] else 0
        table.add_row(
            t["trajectory_id"],
            t["group_id"],
            t["status"],
            t["finish_reason"] or "",
            str(t["turns"]),
            str(t["generated_tokens"]),
            str(t["tool_calls"]),
            "" if t["reward"] is None else f"{t['reward']:g}",
            f"{secs:.1f}",
        )
    return table


def bench_table(result: BenchResult, title: str) -> Table:
    """Each simulated policy beside the first (the baseline of the ratios) and the bound."""
    bound = result.lower_bound["lower_bound_s"]
    names = list(result.results)
    first = result.results[names[0]]
    table = Table(title=title)
    columns = ("policy", "makespan s", "throughput tok/s", f"vs {names[0]}", "vs bound",
               "p50 s", "p99 s", "migrations", "GPU busy", "sim s")  # fmt: skip
    # With a prefill pool (the cluster's `disaggregation`): the share of prefill it took.
    pooled = any(r.kv_handoffs for r in result.results.values())
    if pooled:
        columns = (*columns[:-1], "prefill pooled", columns[-1])
    for col in columns:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, r in result.results.items():
        pool = [f"{r.offloaded_prefill_tokens / max(1, r.prefill_tokens):.0%}"] if pooled else []
        table.add_row(
            name,
            f"{r.makespan_s:,.1f}",
            f"{r.throughput_tok_s:,.0f}",
            f"{r.throughput_tok_s / first.throughput_tok_s:.2f}x",
            f"{r.makespan_s / bound:.2f}x",
            f"{r.completion_s['p50']:,.1f}",
            f"{r.completion_s['p99']:,.1f}",
            str(r.migrations),
            f"{r.gpu_busy_frac:.0%}",
            *pool,
            f"{r.wall_s:.1f}",
        )
    return table


def bound_line(lower_bound: dict[str, float]) -> str:
    """The lower bound and the terms it is the largest of (docs/simulator.md)."""
    lb = lower_bound
    speedup = lb.get("speculation_speedup", 1.0)
    over = f", over speculation's {speedup:.2f} tokens a pass" if speedup > 1.0 else ""
    return (
        f"lower bound {lb['lower_bound_s']:,.1f} s, the largest of: longest alone "
        f"{lb['longest_alone_s']:,.1f} s, peak throughput {lb['work_s']:,.1f} s, memory reads "
        f"{lb['memory_reads_s']:,.1f} s, iteration streams {lb['streams_s']:,.1f} s, "
        f"streams LP {lb['streams_lp_s']:,.1f} s{over} (docs/simulator.md)"
    )


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


def campaign_table(name: str, rows: Iterable[dict[str, Any]], state: Any = None) -> Table:
    """One row per finished iteration of a campaign (`heddle campaign status`)."""
    title = f"campaign {name}"
    if state is not None:
        title += f": {state.phase}, iteration {state.iteration}"
        title += f", policy version {state.policy_version}"
    t = Table(title=title)
    for col in ("iter", "version", "done", "reward", "pass rate", "makespan s", "train s",
                "sync s", "log-prob gap"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r["iteration"]),
            str(r["policy_version"]),
            f"{r['completed']}/{r['trajectories']}",
            f"{r['reward_mean']:.3f}",
            f"{r['pass_rate']:.3f}",
            f"{r['makespan_s']:.1f}",
            f"{r['train_s']:.2f}",
            f"{r['sync_s']:.2f}",
            f"{r['logprob_gap']:.4f}",
        )
    return t


def campaign_plot(name: str, rows: list[dict[str, Any]], path: Path) -> Path:
    """Mean reward and iteration time (rollout makespan + train + sync) by iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iterations = [r["iteration"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(iterations, [r["reward_mean"] for r in rows], marker="o", label="mean reward")
    top.plot(iterations, [r["pass_rate"] for r in rows], marker=".", label="pass rate")
    top.set_ylabel("reward")
    top.legend(fontsize=8)
    top.set_title(f"campaign {name}")
    parts = [("makespan_s", "rollout"), ("train_s", "train"), ("sync_s", "sync")]
    base = [0.0] * len(rows)
    for key, label in parts:
        values = [float(r[key]) for r in rows]
        bottom.bar(iterations, values, bottom=base, label=label)
        base = [b + v for b, v in zip(base, values, strict=True)]
    bottom.set_xlabel("iteration")
    bottom.set_ylabel("seconds")
    bottom.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)
