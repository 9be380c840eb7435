"""The `heddle` command: thin subcommands that build objects from the library and run them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from heddle.config import ClusterConfig, EngineConfig, load_cluster
from heddle.errors import InputError

app = typer.Typer(
    help="Heddle: trajectory-level scheduling for agentic RL rollout.", no_args_is_help=True
)
trajectories_app = typer.Typer(help="List and inspect trajectories.", no_args_is_help=True)
trace_app = typer.Typer(help="Make and check trace files.", no_args_is_help=True)
app.add_typer(trajectories_app, name="trajectories")
app.add_typer(trace_app, name="trace")
cluster_app = typer.Typer(
    help="The cluster's engine plan (a running stack's control workflow).", no_args_is_help=True
)
app.add_typer(cluster_app, name="cluster")
model_app = typer.Typer(help="Models for vLLM engines.", no_args_is_help=True)
app.add_typer(model_app, name="model")
console = Console()
err = Console(stderr=True)

StateDir = Annotated[Path, typer.Option(help="Where the embedded stack keeps its state.")]
Address = Annotated[str | None, typer.Option(help="HOST:PORT of a running Temporal server.")]
StoreOpt = Annotated[
    str | None, typer.Option("--store", help="Trajectory store URL (default: STATE_DIR/store.db).")
]
ClusterOpt = Annotated[Path | None, typer.Option(help="Cluster YAML (model, gpu, num_gpus, ...).")]


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


# Two vLLM instances with batches a CPU runs (examples/cluster-cpu.yaml says the same).
CPU_CLUSTER = ClusterConfig(num_gpus=2, max_num_seqs=32, max_num_batched_tokens=4096)
EngineOpt = Annotated[
    str | None,
    typer.Option("--engine", help="simulated or vllm (overrides the cluster file's engine.kind)."),
]
ModelOpt = Annotated[
    Path | None,
    typer.Option("--model", help="Model folder for vLLM engines (heddle model tiny --out DIR)."),
]


def _cluster(
    path: Path | None, engine: str | None = None, model: Path | None = None
) -> ClusterConfig:
    """The cluster file (or the default), with the engine the command line names. vLLM
    engines without a cluster file: two instances (`CPU_CLUSTER`), what a CPU holds."""
    if path is not None:
        cfg = load_cluster(path)
    else:
        cfg = CPU_CLUSTER if engine == "vllm" else ClusterConfig()
    if engine is None and model is None:
        return cfg
    where = "--engine/--model"
    update = cfg.engine.model_dump()
    if engine is not None:
        update["kind"] = engine
    if model is not None:
        update["model_path"] = str(model.resolve())
    try:
        return cfg.model_copy(update={"engine": EngineConfig.model_validate(update)})
    except ValidationError as exc:
        msg = str(exc.errors()[0].get("msg", "is invalid")).removeprefix("Value error, ")
        raise InputError(where, None, None, msg) from None


def _store_url(store: str | None, state_dir: Path) -> str:
    return (
        store
        or os.environ.get("HEDDLE_STORE_URL")
        or f"sqlite:///{(state_dir / 'store.db').resolve()}"
    )


@dataclasses.dataclass(frozen=True)
class _Target:
    address: str
    ui_url: str | None
    store_url: str
    owned: bool  # an embedded stack started for this command, stopped after it


def _embedded_stack(
    state_dir: Path,
    cluster: ClusterConfig,
    time_scale: float,
    headless: bool,
    port: int,
    ui_port: int,
    store_url: str,
    workers: int = 1,
) -> Any:
    """The embedded stack `heddle dev` runs, and `heddle rollout` when none runs."""
    from heddle.runtime.stack import EmbeddedStack

    return EmbeddedStack(
        state_dir=state_dir,
        port=port,
        ui_port=ui_port,
        cluster=cluster,
        time_scale=time_scale,
        headless=headless,
        num_workers=workers,
        store_url=store_url,
    )


@contextlib.asynccontextmanager
async def _stack_or_address(
    address: str | None, state_dir: Path, store_url: str, embedded: Callable[[], Any]
) -> AsyncIterator[_Target]:
    """Connect to `address`, or to the `heddle dev` running on `state_dir`, or run the
    embedded stack `embedded()` builds for the duration."""
    from heddle.runtime.stack import running_stack

    if address:
        yield _Target(address, None, store_url, owned=False)
        return
    if (info := running_stack(state_dir)) is not None:
        ui = info.get("ui_url")
        yield _Target(str(info["address"]), str(ui) if ui else None, str(info["store_url"]), False)
        return

    stack = embedded()
    with console.status("starting the embedded stack (Temporal dev server, worker, engines)"):
        await stack.start()
    try:
        yield _Target(stack.address, stack.ui_url, store_url, owned=True)
    finally:
        stack.stop()


# ---- heddle dev --------------------------------------------------------------------------
@app.command()
def dev(
    state_dir: StateDir = Path(".heddle"),
    cluster: ClusterOpt = None,
    port: int = 7233,
    ui_port: int = 8233,
    time_scale: Annotated[float, typer.Option(help="Wall seconds per simulated second.")] = 1.0,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    headless: bool = False,
    store: StoreOpt = None,
    detach: Annotated[
        bool, typer.Option(help="Run in the background; `heddle stop` ends it.")
    ] = False,
    engine: EngineOpt = None,
    model: ModelOpt = None,
) -> None:
    """Run the embedded stack until Ctrl-C: Temporal dev server, workers, engines."""
    from heddle.runtime.stack import (
        remove_stack_file,
        running_stack,
        write_stack_file,
    )

    try:
        cfg = _cluster(cluster, engine, model)
    except InputError as exc:
        raise _fail(str(exc)) from None
    if (info := running_stack(state_dir)) is not None:
        if detach:  # idempotent: the background stack the caller asked for is there
            console.print(f"a stack already runs on {state_dir}/ at {info['address']}")
            return
        raise _fail(f"a stack already runs on {state_dir}/ (`heddle stop --state-dir {state_dir}`)")
    if detach:
        argv = [a for a in sys.argv[1:] if a != "--detach"]
        _detach([sys.executable, "-m", "heddle.cli", *argv], state_dir)
        return
    url = _store_url(store, state_dir)
    stack = _embedded_stack(state_dir, cfg, time_scale, headless, port, ui_port, url, workers)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stack.start()
        write_stack_file(state_dir, stack)
        console.print(f"Temporal at [bold]{stack.address}[/]  (namespace default)")
        if stack.ui_url:
            console.print(f"Web UI at   [bold]{stack.ui_url}[/]")
        console.print(
            f"{len(cfg.instance_ids())} simulated {cfg.model} TP{cfg.default_tp} instances on "
            f"{cfg.gpu}; store {stack.store_url}; logs in {state_dir}/. Ctrl-C stops everything."
        )
        while not stop.is_set():
            stack.check_alive()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    try:
        asyncio.run(serve())
    except RuntimeError as exc:
        raise _fail(str(exc)) from None
    finally:
        stack.stop()
        remove_stack_file(state_dir)
        console.print("stack stopped")


def _detach(argv: list[str], state_dir: Path) -> None:
    """Start `heddle dev` in its own session and return once it is serving."""
    import subprocess

    from heddle.runtime.stack import running_stack

    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "dev.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while (info := running_stack(state_dir)) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:]
            raise _fail(f"the stack did not start; {log}:\n{tail}")
        time.sleep(0.3)
    console.print(f"Temporal at [bold]{info['address']}[/]  (namespace default)")
    if info.get("ui_url"):
        console.print(f"Web UI at   [bold]{info['ui_url']}[/]")
    console.print(f"running in the background (pid {proc.pid}, log {log}); `heddle stop` ends it")


@app.command()
def stop(state_dir: StateDir = Path(".heddle")) -> None:
    """Stop the background stack started by `heddle dev --detach`."""
    from heddle.runtime.stack import stop_running_stack

    if stop_running_stack(state_dir):
        console.print("stack stopped")
    else:
        console.print(f"no stack runs on {state_dir}/")


# ---- heddle worker -----------------------------------------------------------------------
@app.command()
def worker(
    address: Annotated[
        str, typer.Option(help="HOST:PORT of the Temporal server.")
    ] = "127.0.0.1:7233",
    store: StoreOpt = None,
    cluster: ClusterOpt = None,
    cluster_json: Annotated[str | None, typer.Option(hidden=True)] = None,
    time_scale: float = 1.0,
    queue_prefix: str = "",
    engine_policy: Annotated[str, typer.Option(help="fcfs or priority")] = "fcfs",
    engines: Annotated[
        bool, typer.Option(help="Host the simulated engines (one worker of a stack does).")
    ] = True,
    state_dir: StateDir = Path(".heddle"),
) -> None:
    """Run one worker process: workflows, activities, tools and simulated engines."""
    from heddle.runtime.worker import WorkerOptions, run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        cfg = ClusterConfig.model_validate_json(cluster_json) if cluster_json else _cluster(cluster)
    except InputError as exc:
        raise _fail(str(exc)) from None
    opts = WorkerOptions(
        address=address,
        store_url=_store_url(store, state_dir),
        cluster=cfg,
        time_scale=time_scale,
        queue_prefix=queue_prefix,
        engine_policy=engine_policy,
        host_engines=engines,
    )
    asyncio.run(run_worker(opts))


# ---- heddle rollout ----------------------------------------------------------------------
def _report_table(report: dict[str, Any], ui_url: str | None) -> Table:
    table = Table(title=f"rollout {report['batch_id']}", show_header=False)
    r = report
    rows = [
        ("policy", r["policy"]),
        (
            "trajectories",
            f"{r['trajectories']} ({r['completed']} completed, {r['failed']} failed)",
        ),
        ("generated tokens", f"{report['generated_tokens']:,}"),
        (
            "makespan",
            f"{r['makespan_s']:.1f} s (cluster time; wall {r['wall_s']:.1f} s "
            f"at time scale {r['time_scale']:g})",
        ),
        ("throughput", f"{report['throughput_tok_s']:,.0f} tokens/s"),
        (
            "completion p50/p90/p99/max",
            " / ".join(f"{report['completion_s'][k]:.1f}" for k in ("p50", "p90", "p99", "max"))
            + " s",
        ),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    if ui_url:
        table.add_row(
            "Temporal UI",
            f"{ui_url}/namespaces/default/workflows?query=HeddleBatch%3D%22{report['batch_id']}%22",
        )
    return table


@app.command()
def rollout(
    trace: Annotated[Path | None, typer.Option(help="Trace file (JSON Lines).")] = None,
    spec: Annotated[
        Path | None, typer.Option(help="Batch spec YAML (workload, prompts, samples, seed).")
    ] = None,
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
    from heddle.client import HeddleClient, validate_options
    from heddle.config import load_batch_spec
    from heddle.trace import load_trace
    from heddle.types import RolloutOptions
    from heddle.workloads import generate

    if (trace is None) == (spec is None):
        raise _fail("give exactly one of --trace FILE or --spec FILE")
    # Everything the user gave is checked before anything starts.
    try:
        if trace is not None:
            records = load_trace(trace)
        else:
            bs = load_batch_spec(spec)  # type: ignore[arg-type]
            records = generate(
                bs.workload,
                prompts=bs.prompts,
                samples=bs.samples,
                seed=bs.seed,
                iteration=bs.iteration,
            )
        cfg = _cluster(cluster, engine, model)
        options = RolloutOptions(
            policy=policy,
            tools=tools,
            max_turns=max_turns,
            max_tokens=max_tokens,
            max_in_flight=max_in_flight,
            central_scheduler=central_scheduler,
        )
        validate_options(options)
    except (InputError, ValueError) as exc:
        raise _fail(str(exc)) from None

    async def run() -> tuple[dict[str, Any], bool]:
        url = _store_url(store, state_dir)
        stack = _stack_or_address(
            address,
            state_dir,
            url,
            lambda: _embedded_stack(state_dir, cfg, time_scale, headless, port, ui_port, url),
        )
        async with stack as target:
            client = await HeddleClient.connect(
                target.address, store_url=target.store_url, queue_prefix=queue_prefix
            )
            async with client:
                handle = await client.start_rollout(records=records, options=options)
                report = await _follow(handle, len(records), quiet)
            out = dataclasses.asdict(report)
            console.print(_report_table(out, target.ui_url))
            return out, target.owned

    try:
        report, owned = asyncio.run(run())
    except ValueError as exc:  # refused before the batch was stored (e.g. nothing to learn from)
        raise _fail(str(exc)) from None
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_out}")
    if owned:
        console.print(
            f"The stack has stopped; its state is kept in {state_dir}/. `heddle dev "
            f"--state-dir {state_dir}` brings it back with the Web UI, and `temporal workflow "
            f"list` then shows every trajectory."
        )


async def _follow(handle: Any, total: int, quiet: bool) -> Any:
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
                bar.update(
                    task,
                    completed=p["completed"] + p["failed"],
                    running=p["running"],
                    rate=f"{rate:,.0f}",
                )
            await asyncio.wait([result], timeout=0.5)
        bar.update(task, completed=total, running=0)
    return await result


# ---- the cluster plan --------------------------------------------------------------------
def _running_address(address: str | None, state_dir: Path) -> str:
    from heddle.runtime.stack import running_stack

    if address:
        return address
    if (info := running_stack(state_dir)) is not None:
        return str(info["address"])
    raise _fail(f"no running stack in {state_dir}: start one (heddle dev) or give --address")


async def _running_client(address: str | None, state_dir: Path, queue_prefix: str) -> Any:
    from heddle.client import HeddleClient

    return await HeddleClient.connect(
        _running_address(address, state_dir),
        store_url=_store_url(None, state_dir),
        queue_prefix=queue_prefix,
    )


def _plan_table(plan: Any) -> Table:
    table = Table("instance", "TP", "GPUs", "state", title=f"cluster plan v{plan.version}")
    for i in plan.instances:
        table.add_row(i.instance_id, str(i.tp), f"{i.first_gpu}-{i.first_gpu + i.tp - 1}", i.state)
    return table


@cluster_app.command("plan")
def cluster_plan(
    address: Annotated[str | None, typer.Option(help="HOST:PORT of the Temporal server.")] = None,
    queue_prefix: str = "",
    state_dir: StateDir = Path(".heddle"),
) -> None:
    """Show the engine instances the cluster runs now."""

    async def run() -> None:
        client = await _running_client(address, state_dir, queue_prefix)
        async with client:
            console.print(_plan_table(await client.cluster_plan()))

    asyncio.run(run())


@cluster_app.command("reshape")
def cluster_reshape(
    retire: Annotated[list[str], typer.Option(help="Instance to retire (repeat).")],
    create: Annotated[list[str], typer.Option(help="New instance as ID:TP:FIRST_GPU (repeat).")],
    reason: str = "manual",
    address: Annotated[str | None, typer.Option(help="HOST:PORT of the Temporal server.")] = None,
    queue_prefix: str = "",
    state_dir: StateDir = Path(".heddle"),
) -> None:
    """Retire instances and start others on their GPUs; waits until it has run (the
    retired ones drained, the new ones up). A change that does not fit is refused."""
    from temporalio.client import WorkflowUpdateFailedError

    from heddle.types import InstancePlan, PlanChange

    try:
        created = [
            InstancePlan(iid, int(tp), int(first))
            for iid, tp, first in (c.split(":") for c in create)
        ]
    except ValueError:
        raise _fail(f"--create takes ID:TP:FIRST_GPU, got {create}") from None

    async def run() -> None:
        client = await _running_client(address, state_dir, queue_prefix)
        async with client:
            try:
                plan = await client.reshape(PlanChange(list(retire), created, reason))
            except WorkflowUpdateFailedError as exc:
                cause = exc.cause.message if hasattr(exc.cause, "message") else exc.cause
                raise _fail(f"reshape refused: {cause}") from None
            console.print(_plan_table(plan))

    asyncio.run(run())


# ---- trajectories and batches ------------------------------------------------------------
@app.command()
def batches(state_dir: StateDir = Path(".heddle"), store: StoreOpt = None) -> None:
    """List rollout batches in the store."""
    from heddle.store import TrajectoryStore

    st = TrajectoryStore.open(_store_url(store, state_dir))
    table = Table("batch", "status", "policy", "trajectories", "by status", "throughput tok/s")
    for b in st.list_batches():
        rep = b["report"] or {}
        table.add_row(
            b["batch_id"],
            b["status"],
            b["policy"],
            str(b["num_trajectories"]),
            json.dumps(b["trajectory_status"]),
            f"{rep.get('throughput_tok_s', 0):,.0f}",
        )
    console.print(table)


@trajectories_app.command("list")
def trajectories_list(
    batch: str,
    status: str | None = None,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
    limit: int = 1000,
) -> None:
    """List a batch's trajectories (status, turns, tokens, times)."""
    from heddle.store import TrajectoryStore

    st = TrajectoryStore.open(_store_url(store, state_dir))
    table = Table(
        "trajectory", "group", "status", "reason", "turns", "tokens", "tools", "reward", "seconds"
    )
    for t in st.list_trajectories(batch, status=status, limit=limit):
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
    console.print(table)


@trajectories_app.command("show")
def trajectories_show(
    batch: str,
    trajectory: str,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
) -> None:
    """One trajectory with its steps, as JSON."""
    from heddle.store import TrajectoryStore

    st = TrajectoryStore.open(_store_url(store, state_dir))
    record = st.get_trajectory(batch, trajectory)
    if record is None:
        raise _fail(f"no trajectory {trajectory!r} in batch {batch!r}")
    console.print_json(json.dumps(record))


# ---- heddle bench -----------------------------------------------------------------------
@app.command()
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
    from heddle.bench import run_bench, write_plots
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
        raise _fail(str(exc)) from None
    try:
        result = run_bench(specs, cfg, policy, history=hist)
    except ValueError as exc:  # a policy that cannot be built from what was given
        raise _fail(str(exc)) from None
    bound = result.lower_bound["lower_bound_s"]
    first = result.results[policy[0]]
    table = Table(
        title=f"{trace.name}: {len(specs)} trajectories on {cfg.num_gpus} {cfg.gpu} ({cfg.model})"
    )
    for col in (
        "policy",
        "makespan s",
        "throughput tok/s",
        f"vs {policy[0]}",
        "vs bound",
        "p50 s",
        "p99 s",
        "migrations",
        "GPU busy",
        "sim s",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, r in result.results.items():
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
            f"{r.wall_s:.1f}",
        )
    console.print(table)
    lb = result.lower_bound
    console.print(
        f"lower bound {bound:,.1f} s, the largest of: longest alone "
        f"{lb['longest_alone_s']:,.1f} s, peak throughput {lb['work_s']:,.1f} s, memory reads "
        f"{lb['memory_reads_s']:,.1f} s, iteration streams {lb['streams_s']:,.1f} s, "
        f"streams LP {lb['streams_lp_s']:,.1f} s (docs/simulator.md)"
    )
    if json_out:
        json_out.write_text(
            json.dumps(result.to_json(trace=str(trace), cluster=cfg), indent=2) + "\n"
        )
        console.print(f"results written to {json_out}")
    if plot:
        for path in write_plots(result, plot):
            console.print(f"plot {path}")


# ---- traces ------------------------------------------------------------------------------
@trace_app.command("gen")
def trace_gen(
    workload: Annotated[str, typer.Option(help="coding, search or math")],
    prompts: int = 4,
    samples: int = 16,
    seed: int = 0,
    iteration: int = 0,
    out: Annotated[Path, typer.Option(help="Trace file to write.")] = Path("trace.jsonl"),
    token_scale: Annotated[
        float, typer.Option(help="Multiply every token count (a tiny model on CPU: 0.02).")
    ] = 1.0,
) -> None:
    """Write a synthetic trace of PROMPTS GRPO groups of SAMPLES trajectories."""
    from heddle.trace import dump_record
    from heddle.workloads import generate, scale_tokens

    try:
        records = generate(
            workload, prompts=prompts, samples=samples, seed=seed, iteration=iteration
        )
        if token_scale != 1.0:
            records = scale_tokens(records, token_scale)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    with out.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(dump_record(r), separators=(",", ":")) + "\n")
    tokens = sum(r.spec.generated_tokens for r in records)
    console.print(f"wrote {len(records)} trajectories, {tokens:,} tokens to generate, to {out}")


def _load_trace_or_fail(path: Path) -> list[Any]:
    from heddle.trace import load_trace

    try:
        return load_trace(path)
    except InputError as exc:
        raise _fail(str(exc)) from None


@trace_app.command("stats")
def trace_stats_cmd(path: Path) -> None:
    """Token, turn, group-variance and tool statistics of a trace, as JSON."""
    from heddle.tracestats import trace_stats

    records = _load_trace_or_fail(path)
    console.print_json(json.dumps(trace_stats([r.spec for r in records])))


@trace_app.command("validate")
def trace_validate(path: Path) -> None:
    """Check a trace; print the first error with its file, line and field."""
    records = _load_trace_or_fail(path)
    console.print(f"{path}: {len(records)} trajectories, valid")


def main() -> None:
    app()


# ---- models ------------------------------------------------------------------------------
@model_app.command("tiny")
def model_tiny(
    out: Annotated[Path, typer.Option(help="Folder to write the model into.")],
    seed: int = 0,
) -> None:
    """Build a tiny Qwen2 (random weights, a locally trained tokenizer) for CPU vLLM."""
    try:
        from engines.tiny_model import build_tiny_model
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise _fail(f"needs the vllm extra (torch, transformers): {exc}") from None
    try:
        build_tiny_model(out, seed=seed)
    except ModuleNotFoundError as exc:
        raise _fail(f"needs the vllm extra (torch, transformers, tokenizers): {exc}") from None
    console.print(f"tiny model written to {out}")


if __name__ == "__main__":
    sys.exit(main())
