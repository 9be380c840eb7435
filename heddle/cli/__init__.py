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

import logging
import os
import sys

import typer

# Typer carries its own copy of click (since 0.20); its usage errors are these classes.
from typer._click import exceptions as click_errors

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


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. A usage mistake (an unknown option, a missing argument, a bad
    value) is one `error:` line and exit status 2, as the commands' own errors are."""
    try:
        code = app(args=argv, prog_name="heddle", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:  # bare `heddle` or a bare group
        print(exc.ctx.get_help() if exc.ctx else exc.format_message(), file=sys.stderr)
        sys.exit(2)
    except click_errors.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "heddle"
        message = " ".join(exc.format_message().split())
        print(f"error: {where}: {message} (see '{where} --help')", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:  # Ctrl-C at a prompt (typer's own class since 0.29.2)
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def run() -> None:
    """The `heddle` process: `main`, then an exit that skips the interpreter's teardown.
    The Temporal client's Rust threads can outlive it, and a short-lived client process
    then aborts while finalizing ("PyGILState_Release: thread state ... must be
    current", temporalio/sdk-python#300), turning a finished command into SIGABRT. What
    teardown would have done that matters is done here first."""
    try:
        main()
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
