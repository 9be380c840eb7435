"""`heddle rollout`: a batch from a trace or a batch spec, checked before anything
starts, followed with a progress bar, reported as a table (and JSON)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from heddle.cli.common import (
    Address,
    ClusterOpt,
    EngineOpt,
    ModelOpt,
    StateDir,
    StoreOpt,
    cluster_config,
    console,
    fail,
    store_url,
)
from heddle.cli.stack import embedded_stack, stack_client
from heddle.errors import InputError
from heddle.types import BatchReport


def rollout(
    trace: Annotated[Path | None, typer.Option(help="Trace file (JSON Lines).")] = None,
    spec: Annotated[
        Path | None, typer.Option(help="Batch spec YAML (workload, prompts, samples, seed).")
    ] = None,
    tasks: Annotated[
        Path | None, typer.Option(help="Task file (JSON Lines): the model works on each.")
    ] = None,
    samples: Annotated[int, typer.Option(help="Agent trajectories per task (--tasks).")] = 1,
    history: Annotated[
        Path | None,
        typer.Option(
            help="An earlier iteration a learning policy starts from: a trace or a training "
            "export (heddle trace from-batch, heddle export); default: the store's latest batch."
        ),
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (--tasks).")] = 1.0,
    max_tokens_per_turn: Annotated[int, typer.Option(help="A model turn's cap (--tasks).")] = 512,
    seed: Annotated[
        int, typer.Option(help="Sampling seed (--tasks): a batch's samples are fixed by it.")
    ] = 0,
    cluster: ClusterOpt = None,
    address: Address = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
    policy: str = "least_loaded",
    tools: Annotated[
        str, typer.Option(help="replay the trace's tools, or run them for real")
    ] = "replay",
    time_scale: Annotated[
        float, typer.Option(help="Wall seconds per simulated second (embedded stack).")
    ] = 1.0,
    max_in_flight: int = 4096,
    max_turns: int = 64,
    max_tokens: int = 65536,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
    headless: Annotated[bool, typer.Option(help="Embedded stack without the Web UI.")] = False,
    port: Annotated[int, typer.Option(help="Embedded stack's Temporal port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Embedded stack's Web UI port.")] = 8233,
    queue_prefix: Annotated[str, typer.Option(help="Task-queue prefix of the workers.")] = "",
    quiet: bool = False,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    central_scheduler: Annotated[
        bool,
        typer.Option(
            hidden=True,
            help="Kept for old scripts: every step is now decided by the engine host's "
            "scheduler, whichever worker runs the trajectory.",
        ),
    ] = False,
) -> None:
    """Run a rollout batch from a trace (or a batch spec) and print its report."""
    from heddle.client import validate_options
    from heddle.config import load_batch_spec
    from heddle.history import load_history
    from heddle.report import rollout_table
    from heddle.tasks import load_tasks
    from heddle.trace import load_trace
    from heddle.types import RolloutOptions
    from heddle.workloads import generate

    if sum(x is not None for x in (trace, spec, tasks)) != 1:
        raise fail("give exactly one of --trace FILE, --spec FILE or --tasks FILE")
    # Everything the user gave is checked before anything starts.
    task_list = None
    earlier = None
    try:
        if history is not None:
            earlier = load_history(history)
        if samples < 1:
            raise ValueError(f"--samples must be >= 1, got {samples}")
        if tasks is not None:
            task_list = load_tasks(tasks)
            records = []  # the client makes the agent trajectories from the tasks
        elif trace is not None:
            records = load_trace(trace)
        else:
            bs = load_batch_spec(spec)  # type: ignore[arg-type]
            records = generate(bs.workload, prompts=bs.prompts, samples=bs.samples,
                               seed=bs.seed, iteration=bs.iteration)  # fmt: skip
        # A model named with tasks means vLLM engines: only a real model writes.
        wants_vllm = tasks is not None and model is not None and engine is None and cluster is None
        cfg = cluster_config(cluster, "vllm" if wants_vllm else engine, model)
        options = RolloutOptions(
            policy=policy,
            tools=tools,
            max_turns=max_turns,
            max_tokens=max_tokens,
            max_in_flight=max_in_flight,
            central_scheduler=central_scheduler,
            temperature=temperature,
            max_tokens_per_turn=max_tokens_per_turn,
            seed=seed,
        )
        validate_options(options)
        if task_list is not None:
            _check_engines_run_a_model(cfg.engine.kind, address, state_dir)

    except (InputError, ValueError) as exc:
        raise fail(str(exc)) from None

    async def run() -> tuple[BatchReport, bool]:
        url = store_url(store, state_dir)

        def embedded() -> Any:
            return embedded_stack(state_dir, cfg, time_scale, headless, port, ui_port, url)

        async with stack_client(address, state_dir, url, queue_prefix, embedded) as (
            target,
            client,
        ):
            if task_list is not None:
                handle = await client.start_rollout(
                    tasks=task_list, samples=samples, options=options, history=earlier
                )
            else:
                handle = await client.start_rollout(
                    records=records, options=options, history=earlier
                )
            total = len(task_list) * samples if task_list is not None else len(records)
            report = await _follow(handle, total, quiet)
            outcomes = await asyncio.to_thread(client.store.batch_outcomes, report.batch_id)
            console.print(rollout_table(report, target.ui_url, outcomes))
            return report, target.owned

    try:
        report, owned = asyncio.run(run())
    except ValueError as exc:  # refused before the batch was stored (e.g. nothing to learn from)
        raise fail(str(exc)) from None
    if json_out:
        json_out.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
        console.print(f"report written to {json_out}")
    if owned:
        console.print(
            f"The stack has stopped; its state is kept in {state_dir}/. `heddle dev "
            f"--state-dir {state_dir}` brings it back with the Web UI, and `temporal workflow "
            f"list` then shows every trajectory."
        )


def _check_engines_run_a_model(kind: str, address: str | None, state_dir: Path) -> None:
    """Agent rollouts need engines that run a model: those of the stack this command
    starts (`kind`), or of the `heddle dev` running on `state_dir`. A server at
    `--address` says nothing of its workers' engines: a worker without a model fails the
    batch's trajectories with `NoAgentModel`."""
    from heddle.runtime.stack import running_stack

    if address:
        return
    running = running_stack(state_dir)
    if running is not None:
        if running.get("engine", "vllm") != "vllm":
            raise ValueError(
                f"agent rollouts (--tasks) need a model, and the stack running on {state_dir} "
                "has simulated engines: start it with --engine vllm --model DIR"
            )
        return
    if kind != "vllm":
        raise ValueError(
            "agent rollouts (--tasks) need a model: give --model DIR (vLLM engines), "
            "or a --cluster whose engine is vllm"
        )


async def _follow(handle: Any, total: int, quiet: bool) -> BatchReport:
    """The batch's report once it ends, with a progress bar from the store meanwhile."""
    result = asyncio.ensure_future(handle.report())
    if quiet:
        return await result
    started = time.monotonic()
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[running]} running"),
        TextColumn("{task.fields[rate]} tok/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(handle.batch_id, total=total, running=0, rate=0)
        while not result.done():
            with contextlib.suppress(Exception):
                p = await handle.progress()
                rate = p["generated_tokens"] / max(time.monotonic() - started, 1e-9)
                bar.update(task, completed=p["completed"] + p["failed"], running=p["running"],
                           rate=f"{rate:,.0f}")  # fmt: skip
            await asyncio.wait([result], timeout=0.5)
        bar.update(task, completed=total, running=0)
    return await result
