"""`heddle dev`, `heddle stop`, `heddle worker`, and how the other commands find a stack:
the address given, the `heddle dev` running on the state directory, or an embedded stack
run for the one command."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from heddle.cli.common import (
    ClusterOpt,
    EngineOpt,
    ModelOpt,
    StateDir,
    StoreOpt,
    check_address,
    cluster_config,
    console,
    fail,
    store_url,
)
from heddle.config import ClusterConfig
from heddle.errors import InputError


@dataclasses.dataclass(frozen=True)
class Target:
    address: str
    ui_url: str | None
    store_url: str
    owned: bool  # an embedded stack started for this command, stopped after it


def embedded_stack(
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
async def stack_or_address(
    address: str | None, state_dir: Path, store_url: str, embedded: Callable[[], Any]
) -> AsyncIterator[Target]:
    """Connect to `address`, or to the `heddle dev` running on `state_dir`, or run the
    embedded stack `embedded()` builds for the duration."""
    from heddle.runtime.stack import running_stack

    if address:
        yield Target(address, None, store_url, owned=False)
        return
    if (info := running_stack(state_dir)) is not None:
        ui = info.get("ui_url")
        yield Target(str(info["address"]), str(ui) if ui else None, str(info["store_url"]), False)
        return

    stack = embedded()
    with console.status("starting the embedded stack (Temporal dev server, worker, engines)"):
        await stack.start()
    try:
        yield Target(stack.address, stack.ui_url, store_url, owned=True)
    finally:
        stack.stop()


@contextlib.asynccontextmanager
async def stack_client(
    address: str | None,
    state_dir: Path,
    store_url: str,
    queue_prefix: str,
    embedded: Callable[[], Any],
) -> AsyncIterator[tuple[Target, Any]]:
    """`stack_or_address`, and a client connected to it for the duration."""
    from heddle.client import HeddleClient

    async with stack_or_address(address, state_dir, store_url, embedded) as target:
        client = await HeddleClient.connect(
            target.address, store_url=target.store_url, queue_prefix=queue_prefix
        )
        async with client:
            yield target, client


def running_address(address: str | None, state_dir: Path) -> str:
    from heddle.runtime.stack import running_stack

    if address:
        return address
    if (info := running_stack(state_dir)) is not None:
        return str(info["address"])
    raise fail(f"no running stack in {state_dir}: start one (heddle dev) or give --address")


async def running_client(address: str | None, state_dir: Path, queue_prefix: str) -> Any:
    from heddle.client import HeddleClient

    return await HeddleClient.connect(
        running_address(address, state_dir),
        store_url=store_url(None, state_dir),
        queue_prefix=queue_prefix,
    )


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
    from heddle.runtime.stack import remove_stack_file, running_stack, write_stack_file

    try:
        cfg = cluster_config(cluster, engine, model)
    except InputError as exc:
        raise fail(str(exc)) from None
    if (info := running_stack(state_dir)) is not None:
        if detach:  # idempotent: the background stack the caller asked for is there
            console.print(f"a stack already runs on {state_dir}/ at {info['address']}")
            return
        raise fail(f"a stack already runs on {state_dir}/ (`heddle stop --state-dir {state_dir}`)")
    if detach:
        argv = [a for a in sys.argv[1:] if a != "--detach"]
        _detach([sys.executable, "-m", "heddle.cli", *argv], state_dir)
        return
    url = store_url(store, state_dir)
    stack = embedded_stack(state_dir, cfg, time_scale, headless, port, ui_port, url, workers)

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
        _print_metrics(stack.metrics_targets, state_dir)
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
        raise fail(str(exc)) from None
    finally:
        stack.stop()
        remove_stack_file(state_dir)
        console.print("stack stopped")


def _custom_tools(specs: list[str]) -> dict[str, str]:
    """`--tool NAME=module:function` options, each checked to import."""
    from activities.toolkit import custom_tool

    tools = {}
    for spec in specs:
        name, sep, import_path = spec.partition("=")
        if not sep or not name:
            raise fail(f"--tool {spec!r}: expected NAME=module:function")
        try:
            custom_tool(import_path)
        except (ValueError, ImportError, AttributeError) as exc:
            raise fail(f"--tool {spec!r}: {exc}") from None
        tools[name] = import_path
    return tools


def _print_metrics(targets: dict[str, list[str]], state_dir: Path) -> None:
    heddle = targets.get("heddle") or []
    if heddle:
        console.print(
            f"Metrics at  [bold]http://{heddle[0]}/metrics[/] (engine host); every endpoint "
            f"in {state_dir}/prometheus-targets.json (docker/prometheus-dev.yml scrapes it)"
        )


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
            raise fail(f"the stack did not start; {log}:\n{tail}")
        time.sleep(0.3)
    console.print(f"Temporal at [bold]{info['address']}[/]  (namespace default)")
    if info.get("ui_url"):
        console.print(f"Web UI at   [bold]{info['ui_url']}[/]")
    _print_metrics(info.get("metrics") or {}, state_dir)
    console.print(f"running in the background (pid {proc.pid}, log {log}); `heddle stop` ends it")


def stop(state_dir: StateDir = Path(".heddle")) -> None:
    """Stop the background stack started by `heddle dev --detach`."""
    from heddle.runtime.stack import stop_running_stack

    if stop_running_stack(state_dir):
        console.print("stack stopped")
    else:
        console.print(f"no stack runs on {state_dir}/")


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
    metrics: Annotated[
        str, typer.Option(help="HOST:PORT to serve Heddle's Prometheus metrics at (/metrics).")
    ] = "",
    sdk_metrics: Annotated[
        str, typer.Option(help="HOST:PORT to serve the Temporal SDK's Prometheus metrics at.")
    ] = "",
    traces: Annotated[
        str,
        typer.Option(
            help="Export OpenTelemetry traces: 'otlp' (OTEL_EXPORTER_OTLP_* settings) or a "
            "file for JSON lines; needs the otel extra."
        ),
    ] = "",
    tool: Annotated[
        list[str] | None,
        typer.Option(help="Your own tool, NAME=module:function (repeatable)."),
    ] = None,
    scheduler_host: Annotated[
        str,
        typer.Option(
            help="Where the engine host's scheduler listens for other workers' decides: "
            "an address of this machine they reach (it is announced in the cluster plan)."
        ),
    ] = "127.0.0.1",
    scheduler_port: Annotated[int, typer.Option(help="Its port (0: any free one).")] = 0,
) -> None:
    """Run one worker process: workflows, activities, tools and simulated engines."""
    from heddle.runtime.worker import WorkerOptions, run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        cfg = (
            ClusterConfig.model_validate_json(cluster_json)
            if cluster_json
            else cluster_config(cluster)
        )
    except InputError as exc:
        raise fail(str(exc)) from None
    opts = WorkerOptions(
        address=address,
        store_url=store_url(store, state_dir),
        cluster=cfg,
        time_scale=time_scale,
        queue_prefix=queue_prefix,
        engine_policy=engine_policy,
        host_engines=engines,
        host_trainer=engines,  # one trainer a stack: the engine host's process
        metrics_address=check_address(metrics, "--metrics"),
        sdk_metrics_address=check_address(sdk_metrics, "--sdk-metrics"),
        traces=traces,
        tools=_custom_tools(tool or []),
        scheduler_host=scheduler_host,
        scheduler_port=scheduler_port,
    )
    from heddle.metrics import MetricsAddressError
    from heddle.runtime.tracing import TracingUnavailable, require_sdk

    if traces:
        try:
            require_sdk()
        except TracingUnavailable as exc:
            raise fail(str(exc)) from None

    try:
        asyncio.run(run_worker(opts))
    except MetricsAddressError as exc:
        raise fail(str(exc)) from None
