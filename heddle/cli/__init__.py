"""The `heddle` command: a small module per command group, each building objects from
the library and running them; tables and plots come from `heddle.report`, which the
client's users share.

| command | module |
|---|---|
| `dev`, `stop`, `worker` | `stack` (and how the others find a stack) |
| `rollout` | `rollout` |
| `cluster plan|reshape` | `cluster` |
| `batches`, `trajectories list|show`, `export` | `trajectories` |
| `bench` | `bench` |
| `trace gen|stats|validate` | `traces` |
| `tasks validate|stats` | `tasks` |
| `model tiny` | `models` |
| `campaign start|status|list|stop|resume|plot` | `campaign` |
"""

from __future__ import annotations

import typer

from heddle.cli import (
    bench,
    campaign,
    cluster,
    models,
    rollout,
    stack,
    tasks,
    traces,
    trajectories,
)

app = typer.Typer(
    help="Heddle: trajectory-level scheduling for agentic RL rollout.", no_args_is_help=True
)
app.command()(stack.dev)
app.command()(stack.stop)
app.command()(stack.worker)
app.command()(rollout.rollout)
app.command()(trajectories.batches)
app.command()(trajectories.export)
app.command()(bench.bench)
app.add_typer(trajectories.app, name="trajectories")
app.add_typer(traces.app, name="trace")
app.add_typer(tasks.app, name="tasks")
app.add_typer(cluster.app, name="cluster")
app.add_typer(models.app, name="model")
app.add_typer(campaign.app, name="campaign")


def main() -> None:
    app()
