"""`heddle batches`, `heddle trajectories list|show` and `heddle export`: what the store
holds."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from heddle.cli.common import (
    BatchArg,
    StateDir,
    StoreOpt,
    batch_or_fail,
    console,
    fail,
    store_url,
)

app = typer.Typer(help="List and inspect trajectories.", no_args_is_help=True)


def batches(state_dir: StateDir = Path(".heddle"), store: StoreOpt = None) -> None:
    """List rollout batches in the store."""
    from heddle.report import batches_table
    from heddle.store import TrajectoryStore

    console.print(batches_table(TrajectoryStore.open(store_url(store, state_dir)).list_batches()))


@app.command("list")
def trajectories_list(
    batch: BatchArg,
    status: str | None = None,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
    limit: int = 1000,
) -> None:
    """List a batch's trajectories (status, turns, tokens, times)."""
    from heddle.report import trajectories_table
    from heddle.store import TrajectoryStore

    st = TrajectoryStore.open(store_url(store, state_dir))
    batch = batch_or_fail(st, batch)
    console.print(trajectories_table(st.list_trajectories(batch, status=status, limit=limit)))


@app.command("show")
def trajectories_show(
    batch: BatchArg,
    trajectory: str,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
    as_json: bool = typer.Option(False, "--json", help="The stored record, as JSON."),
) -> None:
    """One trajectory: an agent trajectory as its conversation (tool calls, reward); a
    replayed one, or --json, as the stored record with its steps."""
    from heddle.conversation import conversation, render_text
    from heddle.store import TrajectoryStore

    st = TrajectoryStore.open(store_url(store, state_dir))
    batch = batch_or_fail(st, batch)
    record = st.get_trajectory(batch, trajectory)
    if record is None:
        raise fail(f"no trajectory {trajectory!r} in batch {batch!r}")
    if as_json or not record["task_id"]:
        console.print_json(json.dumps(record))
        return
    console.print(render_text(conversation(st, batch, trajectory)), markup=False, highlight=False)


def export(
    batch: BatchArg,
    out: Path,
    fmt: str = typer.Option("jsonl", "--format", help="jsonl or parquet"),
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
) -> None:
    """Write a batch's training data (token ids, log-probs, loss mask, reward, group,
    advantage: one row per completed agent trajectory) to OUT."""
    from heddle.store import TrajectoryStore
    from heddle.training import training_batch, write_export

    if fmt not in ("jsonl", "parquet"):
        raise fail(f"--format must be jsonl or parquet, got {fmt!r}")
    st = TrajectoryStore.open(store_url(store, state_dir))
    batch = batch_or_fail(st, batch)
    samples = training_batch(st, batch)
    try:
        write_export(samples, str(out), fmt)
    except (RuntimeError, OSError) as exc:
        raise fail(str(exc)) from None
    console.print(f"wrote {len(samples)} trajectories of {batch} to {out}")
