"""What every command shares: the consoles, the one `error:` line a user's mistake gets,
the options several commands take, and how a cluster and a store are found."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from heddle.config import ClusterConfig, EngineConfig, load_cluster
from heddle.errors import InputError

if TYPE_CHECKING:
    from heddle.store import TrajectoryStore

console = Console()
err = Console(stderr=True)

BatchArg = Annotated[str, typer.Argument(help="A batch id, or 'latest'.")]
StateDir = Annotated[Path, typer.Option(help="Where the embedded stack keeps its state.")]
Address = Annotated[str | None, typer.Option(help="HOST:PORT of a running Temporal server.")]
StoreOpt = Annotated[
    str | None, typer.Option("--store", help="Trajectory store URL (default: STATE_DIR/store.db).")
]
ClusterOpt = Annotated[Path | None, typer.Option(help="Cluster YAML (model, gpu, num_gpus, ...).")]
EngineOpt = Annotated[
    str | None,
    typer.Option("--engine", help="simulated or vllm (overrides the cluster file's engine.kind)."),
]
ModelOpt = Annotated[
    Path | None,
    typer.Option("--model", help="Model folder for vLLM engines (heddle model tiny --out DIR)."),
]

# Two vLLM instances with batches a CPU runs (examples/cluster-cpu.yaml says the same), at
# TP 1 only: vLLM's CPU build runs TP 2 only with its OpenMP threads bound per rank, and
# slower than one worker on 2 cores (ENVIRONMENT.md), so heddle's split must not ask for it.
T = TypeVar("T")
CPU_CLUSTER = ClusterConfig(
    num_gpus=2, max_num_seqs=32, max_num_batched_tokens=4096, tp_choices=(1,)
)


def fail(message: str) -> typer.Exit:
    """A user's mistake: one `error:` line and exit status 2 (raise what this returns)."""
    # Unwrapped, and the message not read as markup: one line whatever the terminal.
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code=2)


def check_address(address: str, option: str) -> str:
    """A HOST:PORT option ("" for none), or a clean error naming the option."""
    if not address:
        return address
    _, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise fail(f"{option} {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return address


def load_or_fail(load: Callable[[Path], T], path: Path) -> T:
    """A user's file through its loader (a trace, a task set); a bad one is the loader's
    error, naming file, line and field, as one `error:` line."""
    try:
        return load(path)
    except InputError as exc:
        raise fail(str(exc)) from None


def cluster_config(
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
    update = cfg.engine.model_dump()
    if engine is not None:
        update["kind"] = engine
    if model is not None:
        update["model_path"] = str(model.resolve())
    try:
        return cfg.model_copy(update={"engine": EngineConfig.model_validate(update)})
    except ValidationError as exc:
        msg = str(exc.errors()[0].get("msg", "is invalid")).removeprefix("Value error, ")
        raise InputError("--engine/--model", None, None, msg) from None


def store_url(store: str | None, state_dir: Path) -> str:
    return (
        store
        or os.environ.get("HEDDLE_STORE_URL")
        or f"sqlite:///{(state_dir / 'store.db').resolve()}"
    )


def batch_or_fail(store: TrajectoryStore, batch: str) -> str:
    """The batch a command names ("latest": the store's newest), or one `error:` line."""
    found = store.batch_before() if batch == "latest" else batch
    if found is None:
        raise fail(f"the store {store.url} holds no batch")
    if store.get_batch(found) is None:
        raise fail(f"no batch {batch!r} in the store {store.url}")
    return found
