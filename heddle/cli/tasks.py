"""`heddle tasks validate|stats`: check task sets before a rollout reads them."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from heddle.cli.common import console, load_or_fail
from heddle.tasks import load_tasks, task_stats

app = typer.Typer(help="Check task sets (JSON Lines, one task a line).", no_args_is_help=True)


@app.command("validate")
def tasks_validate(path: Path) -> None:
    """Check a task file; print the first error with its file, line and field."""
    tasks = load_or_fail(load_tasks, path)
    console.print(f"{path}: {len(tasks)} tasks, valid")


@app.command("stats")
def tasks_stats(path: Path) -> None:
    """Counts by workload, verifier and tool, and prompt sizes, as JSON."""
    console.print_json(json.dumps(task_stats(load_or_fail(load_tasks, path))))
