"""`heddle cluster plan|reshape|give-back`: the running stack's control workflow."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from heddle.cli.common import StateDir, console, fail
from heddle.cli.stack import running_client

app = typer.Typer(
    help="The cluster's engine plan (a running stack's control workflow).", no_args_is_help=True
)
AddressOpt = Annotated[str | None, typer.Option(help="HOST:PORT of the Temporal server.")]


@app.command("plan")
def cluster_plan(
    address: AddressOpt = None,
    queue_prefix: str = "",
    state_dir: StateDir = Path(".heddle"),
) -> None:
    """Show the engine instances the cluster runs now."""
    from heddle.report import plan_table

    async def run() -> None:
        client = await running_client(address, state_dir, queue_prefix)
        async with client:
            console.print(plan_table(await client.cluster_plan()))

    asyncio.run(run())


@app.command("reshape")
def cluster_reshape(
    retire: Annotated[list[str], typer.Option(help="Instance to retire (repeat).")],
    create: Annotated[list[str], typer.Option(help="New instance as ID:TP:FIRST_GPU (repeat).")],
    reason: str = "manual",
    address: AddressOpt = None,
    queue_prefix: str = "",
    state_dir: StateDir = Path(".heddle"),
) -> None:
    """Retire instances and start others on their GPUs; waits until it has run (the
    retired ones drained, the new ones up). A change that does not fit is refused."""
    from temporalio.client import WorkflowUpdateFailedError

    from heddle.report import plan_table
    from heddle.types import InstancePlan, PlanChange

    try:
        created = [
            InstancePlan(iid, int(tp), int(first))
            for iid, tp, first in (c.split(":") for c in create)
        ]
    except ValueError:
        raise fail(f"--create takes ID:TP:FIRST_GPU, got {create}") from None

    async def run() -> None:
        client = await running_client(address, state_dir, queue_prefix)
        async with client:
            try:
                plan = await client.reshape(PlanChange(list(retire), created, reason))
            except WorkflowUpdateFailedError as exc:
                cause = exc.cause.message if hasattr(exc.cause, "message") else exc.cause
                raise fail(f"reshape refused: {cause}") from None
            console.print(plan_table(plan))

    asyncio.run(run())


@app.command("give-back")
def cluster_give_back(
    instance: Annotated[
        list[str] | None, typer.Option(help="Lent instance to give back (repeat); default all.")
    ] = None,
    address: AddressOpt = None,
    queue_prefix: str = "",
    state_dir: StateDir = Path(".heddle"),
) -> None:
    """Give instances lent to a campaign's trainer back to the rollout (a campaign does so
    at every sync; this is for one terminated mid-step, whose lent instances would hold
    off every reshape). Waits until their engines are up."""
    from temporalio.client import WorkflowUpdateFailedError

    from heddle.report import plan_table
    from heddle.types import BlockMove
    from scheduler.plan import lent_instances

    async def run() -> None:
        client = await running_client(address, state_dir, queue_prefix)
        async with client:
            plan = await client.cluster_plan()
            lent = [i.instance_id for i in lent_instances(plan)]
            back = list(instance) if instance else lent
            if not back:
                console.print("no instance is lent to a trainer")
                return
            try:
                plan = await client.move_blocks(BlockMove(to_rollout=back, reason="manual"))
            except WorkflowUpdateFailedError as exc:
                cause = exc.cause.message if hasattr(exc.cause, "message") else exc.cause
                raise fail(f"give-back refused: {cause}") from None
            console.print(plan_table(plan))

    asyncio.run(run())
