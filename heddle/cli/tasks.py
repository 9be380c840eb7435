"""`heddle tasks validate|stats`: check task sets before a rollout reads them."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from heddle.cli.common import console, fail
from heddle.errors import InputError
from heddle.tasks import Task, load_tasks, task_stats

app = typer.Typer(help="Check task sets (JSON Lines, one task a line).", no_args_is_help=True)


def _load_or_fail(path: Path) -> list[Task]:
    try:
        return load_tasks(path)
    except InputError as exc:
        raise fail(str(exc)) from None


@app.command("validate")
def tasks_validate(path: Path) -> None:
    """Check a task file; print the first error with its file, line and field."""
    tasks = _load_or_fail(path)
    console.print(f"{path}: {len(tasks)} tasks, valid")


@app.command("stats")
def tasks_stats(path: Path) -> None:
    """Counts by workload, verifier and tool, and prompt sizes, as JSON."""
    console.print_json(json.dumps(task_stats(_load_or_fail(path))))
