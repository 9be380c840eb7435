"""`heddle campaign start|status|list|stop|resume|plot`: training campaigns, each a
durable workflow; the commands start, follow and steer them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from heddle.cli.common import (
    Address,
    ClusterOpt,
    ModelOpt,
    StateDir,
    StoreOpt,
    cluster_config,
    console,
    fail,
    store_url,
)
from heddle.cli.stack import embedded_stack, running_client, stack_client
from heddle.errors import InputError

app = typer.Typer(help="Training campaigns: rollout, train, sync, repeat.", no_args_is_help=True)

NameArg = Annotated[str, typer.Argument(help="The campaign's name (its workflow id).")]
QueuePrefix = Annotated[str, typer.Option(help="Task-queue prefix of the workers.")]
POLL_S = 1.0
# The phases of an iteration in flight (`workflows/campaign.py`).
PHASES = ("rollout", "train", "sync")


async def follow(client: Any, name: str) -> Any:
    """A progress bar per iteration (its rollout's trajectories, then its phase) and a
    line as each is recorded, until the campaign's workflow ends; then the table."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from activities.campaign import iteration_batch_id
    from heddle.report import campaign_table

    handle = client.campaign(name)
    shown = 0
    bars: dict[int, Any] = {}
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[phase]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:

        def bar(iteration: int) -> Any:
            if iteration not in bars:
                bars[iteration] = progress.add_task(f"iteration {iteration}", total=None, phase="")
            return bars[iteration]

        while True:
            rows = await client.campaign_iterations(name)
            for r in rows[shown:]:
                done = r["trajectories"]
                progress.update(bar(r["iteration"]), total=done, completed=done, phase="done")
                progress.console.print(
                    f"iteration {r['iteration']}: reward {r['reward_mean']:.3f}, pass rate "
                    f"{r['pass_rate']:.3f}, rollout {r['makespan_s']:.1f} s, train "
                    f"{r['train_s']:.2f} s, sync {r['sync_s']:.2f} s"
                )
            shown = len(rows)
            try:
                state = await client.campaign_state(name)
            except Exception:  # between runs of continue-as-new, or the server restarting
                state = None
            if state is not None and state.iteration >= shown and state.phase in PHASES:
                batch = await asyncio.to_thread(
                    client.store.get_batch, iteration_batch_id(name, state.iteration)
                )
                if batch is not None:
                    counts = batch["trajectory_status"]
                    ended = counts.get("completed", 0) + counts.get("failed", 0)
                    progress.update(
                        bar(state.iteration), total=batch["num_trajectories"], completed=ended,
                        phase=state.phase,
                    )  # fmt: skip
            desc = await handle.describe()
            if desc.status is not None and desc.status.name != "RUNNING":
                break
            await asyncio.sleep(POLL_S)
    state = await client.campaign_state(name)
    console.print(campaign_table(name, await client.campaign_iterations(name), state))
    return state


@app.command()
def start(
    name: NameArg,
    iterations: Annotated[int, typer.Option(help="Iterations to run.")] = 5,
    tasks: Annotated[
        Path | None, typer.Option(help="Task file (JSON Lines): an agent campaign on a model.")
    ] = None,
    model: ModelOpt = None,
    workload: Annotated[
        str, typer.Option(help="Simulated campaign (no --tasks): the generated workload.")
    ] = "math",
    tasks_per_iteration: Annotated[
        int, typer.Option(help="Tasks (agent: 0 = all) or prompts (simulated) an iteration.")
    ] = 8,
    samples: Annotated[int, typer.Option(help="Trajectories per task: a GRPO group.")] = 4,
    policy: str = "verl",
    sync: Annotated[bool, typer.Option(help="Sync the new weights to the engines.")] = True,
    lr: Annotated[float, typer.Option(help="The trainer's AdamW learning rate.")] = 2e-4,
    max_staleness: Annotated[
        int,
        typer.Option(
            help="Asynchronous: batches that roll out ahead of the one training; a step "
            "learns only from tokens at most this many versions old. 0: synchronous."
        ),
    ] = 0,
    on_stale: Annotated[
        str,
        typer.Option(
            help="Tokens older than --max-staleness: 'partial' keeps them as context out "
            "of the loss, 'drop' leaves their group out of the step."
        ),
    ] = "partial",
    trainer_gpus: Annotated[
        int,
        typer.Option(
            help="Asynchronous, Libra's reallocation: each train step borrows the engine "
            "instances that hold no trajectory and the least loaded up to this many GPUs, "
            "and gives them back before the sync. 0: off."
        ),
    ] = 0,
    libra_tail: Annotated[
        bool,
        typer.Option(
            help="Synchronous and simulated, Libra's tail: once a batch's trajectories "
            "have all started, the engine instances its rollout leaves idle train on the "
            "finished ones; the step after the rollout trains what is left."
        ),
    ] = False,
    max_turns: Annotated[int, typer.Option(help="An agent trajectory's model turns.")] = 64,
    max_tokens_per_turn: Annotated[int, typer.Option(help="A model turn's cap (agent).")] = 512,
    seed: int = 0,
    cluster: ClusterOpt = None,
    address: Address = None,
    state_dir: StateDir = Path(".heddle"),
    store: StoreOpt = None,
    time_scale: Annotated[
        float | None,
        typer.Option(
            help="Wall seconds per simulated second (embedded stack); default 0.05 for a "
            "simulated campaign, 1 for an agent one (real engines run in wall time)."
        ),
    ] = None,
    port: int = 7233,
    ui_port: int = 8233,
    headless: bool = False,
    queue_prefix: QueuePrefix = "",
    detach: Annotated[bool, typer.Option(help="Start it and return; follow with status.")] = False,
) -> None:
    """Start a campaign and follow it; it runs on in its workflow if this command stops."""
    from heddle.campaign import CampaignSpec, check_spec
    from heddle.tasks import load_tasks
    from heddle.types import RolloutOptions

    try:
        task_list = load_tasks(tasks) if tasks is not None else None
        if task_list is not None and model is None:
            raise ValueError("an agent campaign (--tasks) needs --model DIR")
        cfg = cluster_config(cluster, "vllm" if task_list is not None else None, model)
        spec = CampaignSpec(
            name=name,
            mode="agent" if task_list is not None else "simulated",
            iterations=iterations,
            samples=samples,
            tasks_per_iteration=tasks_per_iteration,
            seed=seed,
            options=RolloutOptions(
                policy=policy,
                tools="real" if task_list else "replay",
                max_turns=max_turns,
                max_tokens_per_turn=max_tokens_per_turn,
            ),
            checkpoint_root=str((state_dir / "campaigns" / name).resolve()),
            model_path=str(Path(model).resolve()) if model else "",
            sync_weights=sync,
            lr=lr,
            workload=workload,
            max_staleness=max_staleness,
            on_stale=on_stale,
            trainer_gpus=trainer_gpus,
            libra_tail=libra_tail,
        )
        check_spec(spec)
    except (InputError, ValueError) as exc:
        raise fail(str(exc)) from None

    async def run() -> None:
        url = store_url(store, state_dir)

        def embedded() -> Any:
            scale = time_scale if time_scale is not None else (1.0 if task_list else 0.05)
            return embedded_stack(state_dir, cfg, scale, headless, port, ui_port, url)

        async with stack_client(address, state_dir, url, queue_prefix, embedded) as (
            target,
            client,
        ):
            await client.start_campaign(spec, tasks=task_list)
            console.print(f"campaign {name} started ({spec.mode}, {iterations} iterations)")
            if target.ui_url:
                console.print(f"Temporal UI: {target.ui_url}")
            if not detach:
                await follow(client, name)

    try:
        asyncio.run(run())
    except ValueError as exc:
        raise fail(str(exc)) from None


def _with_client(address: str | None, state_dir: Path, prefix: str, action: Any) -> Any:
    async def run() -> Any:
        client = await running_client(address, state_dir, prefix)
        async with client:
            return await action(client)

    try:
        return asyncio.run(run())
    except ValueError as exc:
        raise fail(str(exc)) from None


@app.command()
def status(
    name: NameArg,
    address: Address = None,
    state_dir: StateDir = Path(".heddle"),
    queue_prefix: QueuePrefix = "",
) -> None:
    """The campaign's state and a row per finished iteration."""
    from heddle.report import campaign_table

    async def show(client: Any) -> None:
        if await asyncio.to_thread(client.store.get_campaign, name) is None:
            raise ValueError(f"no campaign {name!r} in the store")
        state = await client.campaign_state(name)
        console.print(campaign_table(name, await client.campaign_iterations(name), state))

    _with_client(address, state_dir, queue_prefix, show)


@app.command("list")
def list_(
    address: Address = None, state_dir: StateDir = Path(".heddle"), queue_prefix: QueuePrefix = ""
) -> None:
    """Every campaign in the store, with where it stands."""

    async def show(client: Any) -> None:
        for name in await client.list_campaigns():
            state = await client.campaign_state(name)
            console.print(
                f"{name}: {state.phase}, iteration {state.iteration}, "
                f"policy version {state.policy_version}"
            )

    _with_client(address, state_dir, queue_prefix, show)


@app.command()
def stop(
    name: NameArg,
    address: Address = None,
    state_dir: StateDir = Path(".heddle"),
    queue_prefix: QueuePrefix = "",
) -> None:
    """Stop after the iteration in flight (its checkpoint committed and synced)."""

    async def signal(client: Any) -> None:
        await client.stop_campaign(name)
        console.print(f"campaign {name} stops after its current iteration")

    _with_client(address, state_dir, queue_prefix, signal)


@app.command()
def resume(
    name: NameArg,
    address: Address = None,
    state_dir: StateDir = Path(".heddle"),
    queue_prefix: QueuePrefix = "",
    detach: bool = False,
) -> None:
    """Start a stopped, failed or terminated campaign again from its last state."""

    async def go(client: Any) -> None:
        await client.resume_campaign(name)
        state = await client.campaign_state(name)
        console.print(f"campaign {name} runs from iteration {state.iteration}")
        if not detach:
            await follow(client, name)

    _with_client(address, state_dir, queue_prefix, go)


@app.command()
def plot(
    name: NameArg,
    out: Annotated[Path, typer.Option(help="The PNG to write.")] = Path("campaign.png"),
    store: StoreOpt = None,
    state_dir: StateDir = Path(".heddle"),
) -> None:
    """Draw mean reward and iteration time over iterations (from the store)."""
    from heddle.report import campaign_plot
    from heddle.store import TrajectoryStore

    s = TrajectoryStore.open(store_url(store, state_dir))
    try:
        if s.get_campaign(name) is None:
            raise fail(f"no campaign {name!r} in the store")
        rows = s.campaign_iterations(name)
    finally:
        s.close()
    if not rows:
        raise fail(f"campaign {name!r} has no finished iteration yet")
    console.print(f"wrote {campaign_plot(name, rows, out)}")
