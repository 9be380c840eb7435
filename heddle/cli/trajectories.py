"""`heddle batches` and `heddle trajectories list|show`: what the store holds."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from heddle.cli.common import StateDir, StoreOpt, console, fail, store_url

app = typer.Typer(help="List and inspect trajectories.", no_args_is_help=True)


def batches(state_dir: StateDir = Path(".heddle"), store: StoreOpt = None) -> None:
    """List rollout batches in the store."""
    from heddle.report import batches_table
    from heddle.store import TrajectoryStore

    console.print(batches_table(TrajectoryStore.open(store_url(store, state_dir)).list_batches()))


@app.command("list")
def trajectories_list(
    batch: str,
    status: str | None = None,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
    limit: int = 1000,
) -> None:
    """List a batch's trajectories (status, turns, tokens, times)."""
    from heddle.report import trajectories_table
    from heddle.store import TrajectoryStore

    st = TrajectoryStore.open(store_url(store, state_dir))
    console.print(trajectories_table(st.list_trajectories(batch, status=status, limit=limit)))


@app.command("show")
def trajectories_show(
    batch: str,
    trajectory: str,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
) -> None:
    """One trajectory with its steps, as JSON."""
    from heddle.store import TrajectoryStore

    record = TrajectoryStore.open(store_url(store, state_dir)).get_trajectory(batch, trajectory)
    if record is None:
        raise fail(f"no trajectory {trajectory!r} in batch {batch!r}")
    console.print_json(json.dumps(record))
