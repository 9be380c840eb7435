"""`heddle trace gen|stats|validate`: make and check trace files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from heddle.cli.common import (
    BatchArg,
    StateDir,
    StoreOpt,
    batch_or_fail,
    console,
    fail,
    load_or_fail,
    store_url,
)

if TYPE_CHECKING:
    from heddle.trace import TraceRecord

app = typer.Typer(help="Make and check trace files.", no_args_is_help=True)


def _write(records: list[TraceRecord], out: Path, tokens_are: str) -> None:
    """Write a trace whole, then say what it holds."""
    from heddle.trace import dump_record

    with out.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(dump_record(r), separators=(",", ":")) + "\n")
    tokens = sum(r.spec.generated_tokens for r in records)
    console.print(f"wrote {len(records)} trajectories, {tokens:,} {tokens_are}, to {out}")


@app.command("gen")
def trace_gen(
    workload: Annotated[str | None, typer.Option(help="coding, search or math")] = None,
    family: Annotated[
        str | None,
        typer.Option(help="random: a workload whose shape the seed draws (heddle.families)."),
    ] = None,
    epoch: Annotated[
        bool,
        typer.Option(help="With --family: the same prompts every iteration (else other ones)."),
    ] = False,
    prompts: int = 4,
    samples: int = 16,
    seed: int = 0,
    iteration: int = 0,
    out: Annotated[Path, typer.Option(help="Trace file to write.")] = Path("trace.jsonl"),
    token_scale: Annotated[
        float, typer.Option(help="Multiply every token count (a tiny model on CPU: 0.02).")
    ] = 1.0,
) -> None:
    """Write a synthetic trace of PROMPTS GRPO groups of SAMPLES trajectories: one of
    the fixed workloads, or a family whose shape the seed draws."""
    from heddle.families import generate_family
    from heddle.workloads import generate, scale_tokens

    if (workload is None) == (family is None):
        raise fail("give exactly one of --workload and --family")
    if epoch and family is None:
        raise fail("--epoch goes with --family (a --workload trace is always an epoch)")
    try:
        if family is not None:
            records = generate_family(
                family, prompts=prompts, samples=samples, seed=seed, iteration=iteration,
                epoch=epoch,
            )  # fmt: skip
        else:
            assert workload is not None
            records = generate(
                workload, prompts=prompts, samples=samples, seed=seed, iteration=iteration
            )
        if token_scale != 1.0:
            records = scale_tokens(records, token_scale)
    except ValueError as exc:
        raise fail(str(exc)) from None
    _write(records, out, "tokens to generate")


@app.command("stats")
def trace_stats_cmd(path: Path) -> None:
    """Token, turn, group-variance and tool statistics of a trace, as JSON."""
    from heddle.trace import load_trace
    from heddle.tracestats import trace_stats

    records = load_or_fail(load_trace, path)
    console.print_json(json.dumps(trace_stats([r.spec for r in records])))


@app.command("validate")
def trace_validate(path: Path) -> None:
    """Check a trace; print the first error with its file, line and field."""
    from heddle.trace import load_trace

    records = load_or_fail(load_trace, path)
    console.print(f"{path}: {len(records)} trajectories, valid")


@app.command("from-batch")
def trace_from_batch(
    batch: BatchArg,
    out: Annotated[Path, typer.Option(help="Trace file to write.")] = Path("trace.jsonl"),
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
) -> None:
    """Write a finished batch's completed trajectories as a trace of what they did (an
    agent batch's turns, tool calls and observations): replay it live or simulate it."""
    from heddle.store import TrajectoryStore

    st = TrajectoryStore.open(store_url(store, state_dir))
    batch = batch_or_fail(st, batch)
    records = st.batch_trace(batch)
    if not records:
        raise fail(f"batch {batch!r} has no completed trajectory")
    _write(records, out, "generated tokens")


@app.command("import")
def trace_import(
    path: Path,
    format: Annotated[
        str, typer.Option("--format", help="llmservingsim (agentic JSON Lines) or csv (per turn).")
    ],
    out: Annotated[Path, typer.Option(help="Trace file to write.")] = Path("trace.jsonl"),
) -> None:
    """Convert a trace from another tool's format (heddle.importers) into Heddle's."""
    from heddle.importers import import_trace

    try:
        records = import_trace(path, format)
    except ValueError as exc:  # an unknown format, or a TraceError naming file and line
        raise fail(str(exc)) from None
    _write(records, out, "tokens to generate")
